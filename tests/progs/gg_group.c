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
 * Refusals that are not out-of-memory codes stop the program with status 3.
 * Modes wait on stdin (the test's handshakes): `race` for the lines "go" and
 * "again", then for stdin to end; `hold` and `fill ... hold` for stdin to end.
 */
#include "gg_common.h"
#include "cudart_sim.h"

#include <pthread.h>
#include <sched.h>

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

static int mode_nocuda_(int argc, char **argv) { (void)argc; (void)argv; return mode_nocuda(); }

static const struct gg_mode g_modes[] = {
    {"race", mode_race},
    {"hold", mode_hold},
    {"fill", mode_fill},
    {"meminfo", mode_meminfo},
    {"nocuda", mode_nocuda_},
    {NULL, NULL},
};

int main(int argc, char **argv) { return gg_dispatch(g_modes, argc, argv); }
