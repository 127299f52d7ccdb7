/*
 * gg_group.c - test program for group budgets (GPUGUARD_GROUP, GPUGUARD_GROUP_CAP):
 * several processes of one group share a per-device budget. One mode per scenario;
 * everything on device 0. Usage: gg_group MODE [args]; see gg_common.h for the output
 * protocol. Extra lines:
 *   READY                              race: set up, waiting for the line "go"
 *   RACE held= blocks= refused=        race: every thread was refused once; what this
 *                                      process holds (bytes), in how many blocks, and
 *                                      how many refusals the threads saw
 *   AGAIN held= blocks= refused=       race: the same after the "again" round (held and
 *                                      blocks count both rounds)
 *   SIMPEAK dev= peak=                 the sim's high-water mark of live bytes
 *   HELD rc= bytes=                    hold: the one allocation's code, bytes held
 *   FILL held= blocks= rc=             fill: blocks taken before the first refusal, and
 *                                      the refusal's code
 *   MEMINFO dev= rc= free= total=      cuMemGetInfo_v2
 *   RTMEMINFO dev= rc= free= total=    cudaMemGetInfo
 *   PAUSED seq= held= blocks= sim= pool= charged= share= refused= allocs= frees=
 *          forks= kids_killed= kids_hung= kids_bad=
 *                                      chaos: every thread stopped (see mode_chaos)
 * Refusals that are not out-of-memory codes stop the program with status 3.
 * Modes wait on stdin (the test's handshakes): `race` for the lines "go" and
 * "again", then for stdin to end; `hold` and `fill ... hold` for stdin to end;
 * `chaos` for "go" and "pause", until stdin ends.
 */
#include "gg_common.h"
#include "cudart_sim.h"

#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>

static CUcontext g_ctx;

static void simpeak_line(int dev)
{
    printf("SIMPEAK dev=%d peak=%llu\n", dev, simcuda_live_peak(dev));
}

static void finish(void)
{
    print_gg();
    print_sim();
    simpeak_line(0);
    puts("OK");
}

/* Reads one line of stdin into buf (without the newline); 0 at the end of stdin. */
static int read_line(char *buf, size_t n)
{
    if (!fgets(buf, (int)n, stdin)) return 0;
    buf[strcspn(buf, "\n")] = 0;
    return 1;
}

static void wait_for_line(const char *want)
{
    char buf[128];
    for (;;) {
        if (!read_line(buf, sizeof buf)) {
            fflush(stdout);
            fprintf(stderr, "stdin ended while waiting for %s\n", want);
            exit(3);
        }
        if (strcmp(buf, want) == 0) return;
    }
}

static void wait_for_eof(void)
{
    char buf[128];
    while (read_line(buf, sizeof buf)) {
    }
}

/* ---- race THREADS BLOCK_MIB [warm]: THREADS threads allocate BLOCK_MIB blocks with
 * cuMemAlloc_v2 until each is refused; RACE; "again": the same once more; AGAIN;
 * stdin's end: everything freed. `warm`: one block allocated and freed by the main
 * thread first (the device's first use is not raced). With GG_START_FILE set, the
 * round starts once that file exists (after "go") ---- */
#define RACE_MAX 65536
static int g_threads;
static size_t g_block;
static CUdeviceptr *g_blocks; /* every block held, in no order */
static int g_nblocks;
static unsigned long long g_refused;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static void *race_thread(void *arg)
{
    (void)arg;
    MUST(cuCtxSetCurrent(g_ctx));
    for (;;) {
        CUdeviceptr p = 0;
        int rc = cuMemAlloc_v2(&p, g_block);
        if (rc != 0) {
            if (rc != CUDA_ERROR_OUT_OF_MEMORY) {
                fflush(stdout);
                fprintf(stderr, "race: cuMemAlloc_v2 failed with %d\n", rc);
                exit(3);
            }
            __atomic_fetch_add(&g_refused, 1, __ATOMIC_RELAXED);
            return NULL;
        }
        pthread_mutex_lock(&g_lock);
        if (g_nblocks >= RACE_MAX) {
            pthread_mutex_unlock(&g_lock);
            fflush(stdout);
            fprintf(stderr, "race: more than %d blocks\n", RACE_MAX);
            exit(3);
        }
        g_blocks[g_nblocks++] = p;
        pthread_mutex_unlock(&g_lock);
    }
}

static void race_round(const char *tag)
{
    pthread_t *th = calloc((size_t)g_threads, sizeof *th);
    for (int t = 0; t < g_threads; t++) MUST(pthread_create(&th[t], NULL, race_thread, NULL));
    for (int t = 0; t < g_threads; t++) pthread_join(th[t], NULL);
    free(th);
    step(tag[0] == 'R' ? "race" : "again");
    printf("%s held=%llu blocks=%d refused=%llu\n", tag,
           (unsigned long long)g_nblocks * g_block, g_nblocks,
           __atomic_load_n(&g_refused, __ATOMIC_RELAXED));
    print_gg();
    print_sim();
    simpeak_line(0);
    fflush(stdout);
}

static int mode_race(int argc, char **argv)
{
    g_threads = argc > 1 ? atoi(argv[1]) : 8;
    g_block = (size_t)(argc > 2 ? atoi(argv[2]) : 1) * MiB;
    g_blocks = calloc(RACE_MAX, sizeof *g_blocks);
    g_ctx = gg_setup(0);
    if (argc > 3 && strcmp(argv[3], "warm") == 0) {
        /* the device's first use by one thread, before the race */
        CUdeviceptr p = 0;
        MUST(cuMemAlloc_v2(&p, g_block));
        MUST(cuMemFree_v2(p));
    }
    puts("READY");
    fflush(stdout);
    wait_for_line("go");
    /* GG_START_FILE: the test creates it once every process has its "go", so that
     * the processes start together, not in the order they read their lines */
    const char *start = getenv("GG_START_FILE");
    if (start)
        while (access(start, F_OK) != 0) sched_yield();
    race_round("RACE");
    wait_for_line("again");
    race_round("AGAIN");
    wait_for_eof();
    for (int i = 0; i < g_nblocks; i++) MUST(cuMemFree_v2(g_blocks[i]));
    step("end");
    finish();
    return 0;
}

/* ---- hold MIB: one cuMemAlloc_v2 of MIB, HELD, held until stdin ends ---- */
static int mode_hold(int argc, char **argv)
{
    size_t bytes = (size_t)(argc > 1 ? atoi(argv[1]) : 64) * MiB;
    gg_setup(0);
    CUdeviceptr p = 0;
    int rc = cuMemAlloc_v2(&p, bytes);
    printf("HELD rc=%d bytes=%llu\n", rc, rc == 0 ? (unsigned long long)bytes : 0ULL);
    print_sim();
    fflush(stdout);
    wait_for_eof();
    if (rc == 0) MUST(cuMemFree_v2(p));
    step("end");
    finish();
    return 0;
}

/* ---- fill BLOCK_MIB [rt] [hold] [waitcap]: BLOCK_MIB blocks (cuMemAlloc_v2, or
 * cudaMalloc with `rt`) until the first refusal; FILL; with `waitcap` until a cap
 * report is in GPUGUARD_DIR; with `hold` until stdin ends; then everything freed ---- */
static int mode_fill(int argc, char **argv)
{
    size_t block = (size_t)(argc > 1 ? atoi(argv[1]) : 1) * MiB;
    int rt = 0, hold = 0, waitcap = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "rt") == 0) rt = 1;
        else if (strcmp(argv[i], "hold") == 0) hold = 1;
        else if (strcmp(argv[i], "waitcap") == 0) waitcap = 1;
        else {
            fprintf(stderr, "fill: unknown flag %s\n", argv[i]);
            return 3;
        }
    }
    if (rt)
        MUST(cudaSetDevice(0));
    else
        gg_setup(0);
    static unsigned long long held[RACE_MAX];
    int n = 0, rc = 0;
    while (n < RACE_MAX) {
        if (rt) {
            void *p = NULL;
            rc = cudaMalloc(&p, block);
            held[n] = (uintptr_t)p;
        } else {
            CUdeviceptr p = 0;
            rc = cuMemAlloc_v2(&p, block);
            held[n] = p;
        }
        if (rc != 0) break;
        n++;
    }
    step("full");
    printf("FILL held=%llu blocks=%d rc=%d\n", (unsigned long long)n * block, n, rc);
    print_gg();
    print_sim();
    fflush(stdout);
    if (waitcap) wait_reports(".cap.json", 1);
    if (hold) wait_for_eof();
    for (int i = 0; i < n; i++) {
        if (rt)
            MUST(cudaFree((void *)(uintptr_t)held[i]));
        else
            MUST(cuMemFree_v2(held[i]));
    }
    step("end");
    finish();
    return 0;
}

/* ---- meminfo [MIB]: cuMemGetInfo_v2 and cudaMemGetInfo fresh, then (MIB > 0) with
 * MIB held ---- */
static void meminfo(void)
{
    size_t f = 0, t = 0;
    int rc = cuMemGetInfo_v2(&f, &t);
    printf("MEMINFO dev=0 rc=%d free=%zu total=%zu\n", rc, f, t);
    f = t = 0;
    rc = cudaMemGetInfo(&f, &t);
    printf("RTMEMINFO dev=0 rc=%d free=%zu total=%zu\n", rc, f, t);
}

static int mode_meminfo(int argc, char **argv)
{
    size_t bytes = (size_t)(argc > 1 ? atoi(argv[1]) : 0) * MiB;
    gg_setup(0);
    MUST(cudaSetDevice(0));
    step("fresh");
    meminfo();
    if (bytes) {
        CUdeviceptr p = 0;
        int rc = cuMemAlloc_v2(&p, bytes);
        rc_line("alloc", rc);
        step("used");
        meminfo();
        if (rc == 0) MUST(cuMemFree_v2(p));
    }
    step("end");
    finish();
    return 0;
}

/* ---- chaos THREADS SEED [fork] [pool]: THREADS threads allocate and free blocks of
 * 2 to 64 MiB at random (seeded by SEED) on device 0, forever: an allocation refused
 * for lack of memory frees one of the thread's blocks; a thread holds at most
 * CHAOS_BLOCKS blocks. `pool`: half the blocks are stream-ordered (cuMemAllocAsync
 * from the device's default pool, freed with cuMemFreeAsync: the pool keeps what was
 * freed until a trim), sizes a multiple of the sim's 2 MiB pool chunk. `fork`: one
 * more thread forks children one after another; a child (SIGKILLed if this process
 * dies: PR_SET_PDEATHSIG) allocates 1 to 4 blocks of 2 to 16 MiB (joining the group
 * on its own), then either frees them and exits (exit: gpuguard's at-exit runs) or
 * ends holding them (_exit); a third of the children are SIGKILLed by this process
 * 0 to 4 ms after the fork instead, at whatever they are doing. A child that has not
 * ended 8 s after the fork is counted as hung (and killed): past gpuguard's own 5 s
 * bound on waiting for its helper thread at exit; one that ends any other
 * way than those (a status other than 0, a signal this process did not send) as bad;
 * with GG_CHAOS_GDB set, gdb prints a hung child's threads' stacks on stderr first.
 * Set up (one block allocated and freed: the process is a member), it prints READY.
 * Then stdin: "go" starts (or resumes) the threads; "pause" stops them between two
 * operations, the forking thread once its child has ended, trims the default pool
 * (cuMemPoolTrimTo: what the program holds is what it uses) and prints PAUSED:
 *   seq      which pause (1, 2, ...)
 *   held     the bytes of the blocks the threads hold, blocks how many
 *   sim      the sim's live bytes of device 0 (pool chunks included), pool the
 *            pool's reserved bytes
 *   charged  what gpuguard charges this process, from cuMemGetInfo_v2: total - free
 *            (share: the total)
 *   refused  refusals so far; allocs, frees: successful calls so far
 *   forks, kids_killed, kids_hung, kids_bad: children so far
 * and a GG line. The end of stdin: the threads stop, every block is freed, OK. ---- */
#define CHAOS_BLOCKS 12
#define CHAOS_HANG_MS 8000L
struct chaos_block {
    CUdeviceptr p;
    size_t bytes;
    int pool;
};
struct chaos_thread {
    pthread_t th;
    unsigned long long rng;
    CUstream stream;
    struct chaos_block b[CHAOS_BLOCKS];
    int n;
};
static struct chaos_thread *g_ct;
static int g_chaos_pool;
static pthread_mutex_t g_cl = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_ccv = PTHREAD_COND_INITIALIZER;
static int g_crun;   /* 0 paused, 1 running, 2 stopping (under g_cl) */
static int g_cidle;  /* threads waiting in chaos_gate (under g_cl) */
static unsigned long long g_c_refused, g_c_allocs, g_c_frees;
static unsigned long long g_forks, g_kids_killed, g_kids_hung, g_kids_bad;
static pid_t g_chaos_parent;

static unsigned long long chaos_next(unsigned long long *s)
{
    /* splitmix64 */
    unsigned long long z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Between two operations: waits while paused; 0 once stopping. */
static int chaos_gate(void)
{
    if (__atomic_load_n(&g_crun, __ATOMIC_ACQUIRE) == 1) return 1;
    pthread_mutex_lock(&g_cl);
    while (g_crun == 0) {
        g_cidle++;
        pthread_cond_broadcast(&g_ccv);
        pthread_cond_wait(&g_ccv, &g_cl);
        g_cidle--;
    }
    int go = g_crun == 1;
    pthread_mutex_unlock(&g_cl);
    return go;
}

static void chaos_free(struct chaos_thread *t, int i)
{
    struct chaos_block b = t->b[i];
    t->b[i] = t->b[--t->n];
    if (b.pool)
        MUST(cuMemFreeAsync(b.p, t->stream));
    else
        MUST(cuMemFree_v2(b.p));
    __atomic_fetch_add(&g_c_frees, 1, __ATOMIC_RELAXED);
}

static void *chaos_thread(void *arg)
{
    struct chaos_thread *t = arg;
    MUST(cuCtxSetCurrent(g_ctx));
    while (chaos_gate()) {
        unsigned long long r = chaos_next(&t->rng);
        if (t->n < CHAOS_BLOCKS && (t->n == 0 || r % 8 < 5)) {
            size_t bytes = (size_t)(1 + (r >> 8) % 32) * 2 * MiB;
            int pool = g_chaos_pool && ((r >> 16) & 1);
            CUdeviceptr p = 0;
            int rc = pool ? cuMemAllocAsync(&p, bytes, t->stream) : cuMemAlloc_v2(&p, bytes);
            if (rc == 0) {
                t->b[t->n++] = (struct chaos_block){p, bytes, pool};
                __atomic_fetch_add(&g_c_allocs, 1, __ATOMIC_RELAXED);
            } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
                __atomic_fetch_add(&g_c_refused, 1, __ATOMIC_RELAXED);
                if (t->n > 0) chaos_free(t, (int)((r >> 24) % (unsigned)t->n));
            } else {
                fflush(stdout);
                fprintf(stderr, "chaos: %s failed with %d\n",
                        pool ? "cuMemAllocAsync" : "cuMemAlloc_v2", rc);
                exit(3);
            }
        } else if (t->n > 0) {
            chaos_free(t, (int)((r >> 24) % (unsigned)t->n));
        }
        struct timespec ts = {0, (long)(50 + (r >> 40) % 300) * 1000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* A forked child: see mode_chaos. Never returns. */
static void chaos_child(unsigned long long rng)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != g_chaos_parent) _exit(0); /* the parent died before prctl */
    if (cuCtxSetCurrent(g_ctx) != 0) _exit(4);
    unsigned long long r = chaos_next(&rng);
    int n = 1 + (int)(r % 4);
    CUdeviceptr p[4] = {0, 0, 0, 0};
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)(1 + (chaos_next(&rng) % 8)) * 2 * MiB;
        int rc = cuMemAlloc_v2(&p[i], bytes);
        if (rc == CUDA_ERROR_OUT_OF_MEMORY)
            p[i] = 0;
        else if (rc != 0)
            _exit(5);
    }
    struct timespec ts = {0, (long)((r >> 8) % 3000) * 1000L};
    nanosleep(&ts, NULL);
    if ((r >> 20) & 1) _exit(0); /* ends holding them */
    for (int i = 0; i < n; i++)
        if (p[i] && cuMemFree_v2(p[i]) != 0) _exit(6);
    exit(0);
}

static void *chaos_forker(void *arg)
{
    unsigned long long rng = *(unsigned long long *)arg;
    while (chaos_gate()) {
        unsigned long long r = chaos_next(&rng);
        unsigned long long kid_rng = chaos_next(&rng);
        pid_t pid = fork();
        if (pid == 0) chaos_child(kid_rng);
        if (pid < 0) {
            sleep_ms(1);
            continue;
        }
        __atomic_fetch_add(&g_forks, 1, __ATOMIC_RELAXED);
        int killed = 0;
        if (r % 3 == 0) {
            struct timespec ts = {0, (long)((r >> 8) % 4000) * 1000L};
            nanosleep(&ts, NULL);
            kill(pid, SIGKILL);
            killed = 1;
            __atomic_fetch_add(&g_kids_killed, 1, __ATOMIC_RELAXED);
        }
        int st = 0;
        struct timespec t0, now;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            pid_t w = waitpid(pid, &st, WNOHANG);
            if (w == pid) break;
            if (w < 0 && errno != EINTR) {
                fflush(stdout);
                fprintf(stderr, "chaos: waitpid %d: %s\n", (int)pid, strerror(errno));
                __atomic_fetch_add(&g_kids_bad, 1, __ATOMIC_RELAXED);
                break;
            }
            clock_gettime(CLOCK_MONOTONIC, &now);
            long ms = (now.tv_sec - t0.tv_sec) * 1000L + (now.tv_nsec - t0.tv_nsec) / 1000000L;
            if (ms >= CHAOS_HANG_MS) {
                fflush(stdout);
                fprintf(stderr, "chaos: child %d did not end %ld ms after its fork\n", (int)pid,
                        ms);
                __atomic_fetch_add(&g_kids_hung, 1, __ATOMIC_RELAXED);
                if (getenv("GG_CHAOS_GDB")) {
                    char cmd[256];
                    snprintf(cmd, sizeof cmd, "gdb -p %d -batch -ex 'thread apply all bt' 1>&2 2>/dev/null", (int)pid);
                    if (system(cmd) != 0) fprintf(stderr, "gdb failed\n");
                }
                kill(pid, SIGKILL);
                waitpid(pid, &st, 0);
                killed = 1; /* counted as hung, not also as bad */
                break;
            }
            struct timespec ts = {0, 200000L};
            nanosleep(&ts, NULL);
        }
        int fine = (WIFEXITED(st) && WEXITSTATUS(st) == 0) ||
                   (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && killed);
        if (!fine) {
            fflush(stdout);
            fprintf(stderr, "chaos: child %d ended with status 0x%x\n", (int)pid, st);
            __atomic_fetch_add(&g_kids_bad, 1, __ATOMIC_RELAXED);
        }
    }
    return NULL;
}

static void chaos_set(int run)
{
    pthread_mutex_lock(&g_cl);
    g_crun = run;
    pthread_cond_broadcast(&g_ccv);
    pthread_mutex_unlock(&g_cl);
}

static int mode_chaos(int argc, char **argv)
{
    g_threads = argc > 1 ? atoi(argv[1]) : 3;
    unsigned long long seed = argc > 2 ? strtoull(argv[2], NULL, 0) : 1;
    int forks = 0;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "fork") == 0) forks = 1;
        else if (strcmp(argv[i], "pool") == 0) g_chaos_pool = 1;
        else {
            fprintf(stderr, "chaos: unknown flag %s\n", argv[i]);
            return 3;
        }
    }
    g_chaos_parent = getpid();
    g_ctx = gg_setup(0);
    /* a member from here on (a refusal is fine: the group is joined either way) */
    CUdeviceptr p0 = 0;
    if (cuMemAlloc_v2(&p0, 2 * MiB) == 0) MUST(cuMemFree_v2(p0));
    CUmemoryPool dp = 0;
    if (g_chaos_pool) MUST(cuDeviceGetDefaultMemPool(&dp, 0));
    g_ct = calloc((size_t)g_threads, sizeof *g_ct);
    for (int i = 0; i < g_threads; i++) {
        unsigned long long s = seed * 1000003ULL + (unsigned long long)i;
        g_ct[i].rng = chaos_next(&s);
        if (g_chaos_pool) MUST(cuStreamCreate(&g_ct[i].stream, 0));
        MUST(pthread_create(&g_ct[i].th, NULL, chaos_thread, &g_ct[i]));
    }
    int all = g_threads + forks;
    unsigned long long fork_seed = seed * 7919ULL + 17;
    pthread_t forker;
    if (forks) MUST(pthread_create(&forker, NULL, chaos_forker, &fork_seed));
    puts("READY");
    fflush(stdout);
    int seq = 0;
    char buf[128];
    while (read_line(buf, sizeof buf)) {
        if (strcmp(buf, "go") == 0) {
            chaos_set(1);
        } else if (strcmp(buf, "pause") == 0) {
            pthread_mutex_lock(&g_cl);
            g_crun = 0;
            while (g_cidle < all) pthread_cond_wait(&g_ccv, &g_cl);
            pthread_mutex_unlock(&g_cl);
            if (g_chaos_pool) MUST(cuMemPoolTrimTo(dp, 0));
            unsigned long long held = 0;
            int blocks = 0;
            for (int i = 0; i < g_threads; i++) {
                blocks += g_ct[i].n;
                for (int j = 0; j < g_ct[i].n; j++) held += g_ct[i].b[j].bytes;
            }
            unsigned long long sim = simcuda_live_bytes(0), pool = simcuda_pool_reserved(0);
            size_t f = 0, t = 0;
            MUST(cuMemGetInfo_v2(&f, &t));
            printf("PAUSED seq=%d held=%llu blocks=%d sim=%llu pool=%llu charged=%llu share=%llu "
                   "refused=%llu allocs=%llu frees=%llu forks=%llu kids_killed=%llu "
                   "kids_hung=%llu kids_bad=%llu\n",
                   ++seq, held, blocks, sim, pool, (unsigned long long)(t - f),
                   (unsigned long long)t, g_c_refused, g_c_allocs, g_c_frees, g_forks,
                   g_kids_killed, g_kids_hung, g_kids_bad);
            print_gg();
            fflush(stdout);
        } else {
            fprintf(stderr, "chaos: unknown command %s\n", buf);
            exit(3);
        }
    }
    chaos_set(2);
    for (int i = 0; i < g_threads; i++) pthread_join(g_ct[i].th, NULL);
    if (forks) pthread_join(forker, NULL);
    for (int i = 0; i < g_threads; i++)
        while (g_ct[i].n > 0) chaos_free(&g_ct[i], g_ct[i].n - 1);
    if (g_chaos_pool) {
        for (int i = 0; i < g_threads; i++) MUST(cuStreamSynchronize(g_ct[i].stream));
        MUST(cuMemPoolTrimTo(dp, 0));
    }
    printf("CHAOS forks=%llu kids_killed=%llu kids_hung=%llu kids_bad=%llu\n", g_forks,
           g_kids_killed, g_kids_hung, g_kids_bad);
    step("end");
    finish();
    return 0;
}

static int mode_nocuda_(int argc, char **argv) { (void)argc; (void)argv; return mode_nocuda(); }

static const struct gg_mode g_modes[] = {
    {"race", mode_race},
    {"hold", mode_hold},
    {"fill", mode_fill},
    {"meminfo", mode_meminfo},
    {"chaos", mode_chaos},
    {"nocuda", mode_nocuda_},
    {NULL, NULL},
};

int main(int argc, char **argv) { return gg_dispatch(g_modes, argc, argv); }
