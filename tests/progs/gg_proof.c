/*
 * gg_proof.c - the reliability proofs of tests/faults.rs, tests/stress.rs and the
 * thread-checker run: injected driver faults on every path, and the oracle stress
 * (threads x paths x devices x report/trim signals x forks). Links the driver and
 * the runtime; output protocol as in gg_common.h, plus:
 *   WANT <label> <code>     the code the driver was told to fail <label> with
 *   TRUTH dev=<d> allocs= frees= current=   the program's own books per device
 *   FORKED pid=<p> addr=<hex> bytes=<n>      a child that used CUDA and left that
 *   STRESS threads= ops= signals= forks= faults=
 * Usage: gg_proof faults | stress THREADS OPS SEED FORKS [STORM] | helgrind
 */
#include "gg_common.h"
#include "cudart_sim.h"

#include <pthread.h>
#include <sys/wait.h>

#define MAX_DEV 2

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*async_alloc_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*async_free_fn)(CUdeviceptr, CUstream);
typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);

static alloc_fn dl_alloc, gpa_alloc;
static free_fn dl_free, gpa_free;
static async_alloc_fn gpa_alloc_async;
static async_free_fn gpa_free_async;
static create_fn gpa_create;
static release_fn gpa_release;

static int (*set_faults)(const char *);
static unsigned long long (*faults_injected)(void);

/* The dlsym and cuGetProcAddress answers, as a program that loads the driver
 * itself (or a framework) would get them. */
static void lookups(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror()); exit(3); }
    dl_alloc = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
    dl_free = (free_fn)dlsym(h, "cuMemFree_v2");
    PFN_cuGetProcAddress_v2 gpa = (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2");
    MUST(gpa("cuMemAlloc", (void **)&gpa_alloc, 12000, 0, NULL));
    MUST(gpa("cuMemFree", (void **)&gpa_free, 12000, 0, NULL));
    MUST(gpa("cuMemAllocAsync", (void **)&gpa_alloc_async, 12000, 0, NULL));
    MUST(gpa("cuMemFreeAsync", (void **)&gpa_free_async, 12000, 0, NULL));
    MUST(gpa("cuMemCreate", (void **)&gpa_create, 12000, 0, NULL));
    MUST(gpa("cuMemRelease", (void **)&gpa_release, 12000, 0, NULL));
    set_faults = (int (*)(const char *))sim_sym("simcuda_set_faults");
    faults_injected = (unsigned long long (*)(void))sim_sym("simcuda_faults_injected");
    if (!set_faults || !faults_injected) { fputs("sim without fault injection\n", stderr); exit(3); }
}

static void faults(const char *spec)
{
    if (set_faults(spec) != 0) { fprintf(stderr, "bad fault spec %s\n", spec); exit(3); }
}

static CUmemAllocationProp vmm_prop(int dev)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    return p;
}

/* ---- faults: every path gets the driver's code unchanged ----------------------
 * For each path and each code: an allocation told to fail, then a successful one
 * whose free is told to fail (still live afterwards), then freed for real. A lost
 * context (every call failing from some point on) ends each path. */
enum path { P_SYMBOL, P_DLSYM, P_PROC, P_RUNTIME, P_POOL, P_POOL_PROC, P_VMM, P_VMM_PROC,
            P_MANAGED, P_HOST, P_COUNT };
static const char *path_name[P_COUNT] = {"symbol", "dlsym", "proc", "runtime", "pool",
                                         "pool_proc", "vmm", "vmm_proc", "managed", "host"};
/* the driver export each path's allocation and free reach */
static const char *path_alloc_export[P_COUNT] = {
    "cuMemAlloc_v2", "cuMemAlloc_v2", "cuMemAlloc_v2", "cuMemAlloc_v2", "cuMemAllocAsync",
    "cuMemAllocAsync", "cuMemCreate", "cuMemCreate", "cuMemAllocManaged", "cuMemAllocHost_v2"};
static const char *path_free_export[P_COUNT] = {
    "cuMemFree_v2", "cuMemFree_v2", "cuMemFree_v2", "cuMemFree_v2", "cuMemFreeAsync",
    "cuMemFreeAsync", "cuMemRelease", "cuMemRelease", "cuMemFree_v2", "cuMemFreeHost"};
static const char *path_kind[P_COUNT] = {"device", "device", "device", "device", "pool",
                                         "pool", "vmm", "vmm", "managed", "host"};

/* cudaError_t equals CUresult for every code used here. */
static int do_alloc(int path, unsigned long long *out, size_t bytes, int dev)
{
    void *v = NULL;
    CUdeviceptr p = 0;
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp prop = vmm_prop(dev);
    int rc = 0;
    switch (path) {
    case P_SYMBOL: rc = cuMemAlloc_v2(&p, bytes); break;
    case P_DLSYM: rc = dl_alloc(&p, bytes); break;
    case P_PROC: rc = gpa_alloc(&p, bytes); break;
    case P_RUNTIME: rc = cudaMalloc(&v, bytes); p = (uintptr_t)v; break;
    case P_POOL: rc = cuMemAllocAsync(&p, bytes, NULL); break;
    case P_POOL_PROC: rc = gpa_alloc_async(&p, bytes, NULL); break;
    case P_VMM: rc = cuMemCreate(&h, bytes, &prop, 0); p = h; break;
    case P_VMM_PROC: rc = gpa_create(&h, bytes, &prop, 0); p = h; break;
    case P_MANAGED: rc = cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL); break;
    case P_HOST: rc = cuMemAllocHost_v2(&v, bytes); p = (uintptr_t)v; break;
    }
    *out = p;
    return rc;
}

static int do_free(int path, unsigned long long p)
{
    switch (path) {
    case P_SYMBOL: case P_MANAGED: return cuMemFree_v2(p);
    case P_DLSYM: return dl_free(p);
    case P_PROC: return gpa_free(p);
    case P_RUNTIME: return cudaFree((void *)(uintptr_t)p);
    case P_POOL: return cuMemFreeAsync(p, NULL);
    case P_POOL_PROC: return gpa_free_async(p, NULL);
    case P_VMM: return cuMemRelease(p);
    case P_VMM_PROC: return gpa_release(p);
    case P_HOST: return cuMemFreeHost((void *)(uintptr_t)p);
    }
    return -1;
}

static void want(const char *label, int code, int got)
{
    printf("WANT %s %d\n", label, code);
    rc_line(label, got);
}

static int mode_faults(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    MUST(cudaSetDevice(0));
    lookups();
    static const int codes[] = {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_INVALID_VALUE,
                                CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_CONTEXT_IS_DESTROYED};
    char spec[128], label[96];
    for (int path = 0; path < P_COUNT; path++) {
        const char *name = path_name[path];
        size_t bytes = 2 * MiB; /* VMM granularity; a whole pool chunk */
        for (size_t c = 0; c < sizeof codes / sizeof codes[0]; c++) {
            int code = codes[c];
            unsigned long long p;
            /* the allocation fails: the program sees the code, nothing is live */
            snprintf(spec, sizeof spec, "%s=%d@1", path_alloc_export[path], code);
            faults(spec);
            snprintf(label, sizeof label, "%s_alloc_%d", name, code);
            want(label, code, do_alloc(path, &p, bytes, 0));
            faults("");
            /* a real allocation whose free fails: still live afterwards */
            MUST(do_alloc(path, &p, bytes, 0));
            alloc_line(p, bytes, path == P_HOST ? -1 : 0, path_kind[path]);
            snprintf(spec, sizeof spec, "%s=%d@1", path_free_export[path], code);
            faults(spec);
            snprintf(label, sizeof label, "%s_free_%d", name, code);
            want(label, code, do_free(path, p));
            faults("");
            step(label);
            print_gg();
            print_sim();
            /* then freed for real */
            MUST(do_free(path, p));
            free_line(p);
        }
        /* lost context mid-run: a real allocation, then every call fails from the
         * next one on (its free included), then the context "comes back" */
        unsigned long long keep, p;
        MUST(do_alloc(path, &keep, bytes, 0));
        alloc_line(keep, bytes, path == P_HOST ? -1 : 0, path_kind[path]);
        faults("*=709@1+");
        snprintf(label, sizeof label, "%s_lost_alloc", name);
        want(label, CUDA_ERROR_CONTEXT_IS_DESTROYED, do_alloc(path, &p, bytes, 0));
        snprintf(label, sizeof label, "%s_lost_free", name);
        want(label, CUDA_ERROR_CONTEXT_IS_DESTROYED, do_free(path, keep));
        faults("");
        step(label);
        print_gg();
        print_sim();
        leak_line(keep, bytes);
    }
    /* a seeded probability: about half of 200 allocations fail */
    faults("cuMemAlloc_v2=2%50");
    int ok = 0, failed = 0;
    unsigned long long held[200];
    for (int i = 0; i < 200; i++) {
        unsigned long long p;
        int rc = do_alloc(i % 4, &p, 4096, 0); /* symbol, dlsym, proc, runtime */
        if (rc == 0) held[ok++] = p;
        else if (rc == CUDA_ERROR_OUT_OF_MEMORY) failed++;
        else { fprintf(stderr, "unexpected code %d\n", rc); exit(3); }
    }
    faults("");
    for (int i = 0; i < ok; i++) MUST(cuMemFree_v2(held[i]));
    printf("RANDOM ok=%d failed=%d\n", ok, failed);
    /* pools keep freed chunks reserved: give them back before comparing */
    CUmemoryPool dp;
    MUST(cuDeviceGetDefaultMemPool(&dp, 0));
    MUST(cuMemPoolTrimTo(dp, 0));
    printf("INJECTED %llu\n", faults_injected());
    step("end");
    print_gg();
    print_sim();
    puts("OK");
    return 0;
}

/* ---- stress THREADS OPS SEED FORKS [STORM] -------------------------------------
 * THREADS workers (thread t on device t % 2) each run OPS/THREADS random operations
 * over six paths (symbol, dlsym, proc, runtime, pool, VMM with mapping) into a ring
 * of 16 slots, while a storm thread sends report (SIGUSR1) and trim (SIGUSR2)
 * signals to the process (unless STORM is 0: without gpuguard they would end it),
 * and worker 0 forks FORKS children that use CUDA and exit.
 * What the ring still holds at the end is left live (LEAK lines); the program's
 * own books per device are printed as TRUTH. */
enum { S_SYMBOL, S_DLSYM, S_PROC, S_RUNTIME, S_POOL, S_VMM, S_COUNT };
#define RING 16

struct slot {
    unsigned long long key; /* address, or VMM handle */
    unsigned long long va;  /* VMM: the mapped reservation, 0 if unmapped */
    size_t bytes;
    int path;
};

struct worker {
    pthread_t th;
    int id, dev;
    long ops;
    unsigned long long rng;
    struct slot ring[RING];
    unsigned long long allocs, frees, current;
};

static int g_forks_wanted;
static int g_forks_done;
static volatile int g_workers_done;
static long g_signals_sent;

static unsigned long long next_rand(unsigned long long *s)
{
    unsigned long long x = (*s += 0x9e3779b97f4a7c15ULL);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static void stress_alloc(struct worker *w, struct slot *s)
{
    unsigned long long r = next_rand(&w->rng);
    s->path = (int)(r % S_COUNT);
    s->va = 0;
    void *v;
    CUdeviceptr p;
    switch (s->path) {
    case S_SYMBOL: s->bytes = 4096 + (r >> 8) % 65536; MUST(cuMemAlloc_v2(&p, s->bytes)); break;
    case S_DLSYM: s->bytes = 4096 + (r >> 8) % 65536; MUST(dl_alloc(&p, s->bytes)); break;
    case S_PROC: s->bytes = 4096 + (r >> 8) % 65536; MUST(gpa_alloc(&p, s->bytes)); break;
    case S_RUNTIME:
        s->bytes = 4096 + (r >> 8) % 65536;
        MUST(cudaMalloc(&v, s->bytes));
        p = (uintptr_t)v;
        break;
    case S_POOL: s->bytes = 512 + (r >> 8) % 8192; MUST(cuMemAllocAsync(&p, s->bytes, NULL)); break;
    case S_VMM: {
        CUmemAllocationProp prop = vmm_prop(w->dev);
        CUmemGenericAllocationHandle h;
        s->bytes = 2 * MiB;
        MUST(cuMemCreate(&h, s->bytes, &prop, 0));
        p = h;
        if ((r >> 20) & 1) { /* mapped: the memory outlives its release until the unmap */
            MUST(cuMemAddressReserve(&s->va, s->bytes, 0, 0, 0));
            MUST(cuMemMap(s->va, s->bytes, 0, h, 0));
        }
        break;
    }
    }
    s->key = p;
    w->allocs++;
    w->current += s->bytes;
}

static void stress_free(struct worker *w, struct slot *s)
{
    switch (s->path) {
    case S_SYMBOL: MUST(cuMemFree_v2(s->key)); break;
    case S_DLSYM: MUST(dl_free(s->key)); break;
    case S_PROC: MUST(gpa_free(s->key)); break;
    case S_RUNTIME: MUST(cudaFree((void *)(uintptr_t)s->key)); break;
    case S_POOL: MUST(cuMemFreeAsync(s->key, NULL)); break;
    case S_VMM:
        MUST(cuMemRelease(s->key));
        if (s->va) {
            MUST(cuMemUnmap(s->va, s->bytes));
            MUST(cuMemAddressFree(s->va, s->bytes));
        }
        break;
    }
    w->frees++;
    w->current -= s->bytes;
    s->key = 0;
}

/* A child that uses CUDA (on this thread's device) and exits: one allocation
 * freed, one left behind; the parent's books must not change. */
static void fork_child(struct worker *w)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); exit(3); }
    if (pid == 0) {
        CUdeviceptr a, b;
        MUST(cuMemAlloc_v2(&a, 1 * MiB));
        MUST(cuMemFree_v2(a));
        MUST(cuMemAlloc_v2(&b, 3 * MiB));
        printf("FORKED pid=%d addr=0x%llx bytes=%llu dev=%d\n", (int)getpid(), b, 3 * MiB, w->dev);
        fflush(stdout);
        exit(0);
    }
    /* bounded: a child stuck (say on a lock held at the fork) is killed, so it
     * cannot hold the test's pipes open forever */
    int st = 0;
    pid_t got = 0;
    for (int waited = 0; waited < 30000 && (got = waitpid(pid, &st, WNOHANG)) == 0; waited += 5)
        sleep_ms(5);
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        printf("CHILD_HUNG pid=%d\n", (int)pid);
        fflush(stdout);
        fprintf(stderr, "child %d did not end within 30 s: killed\n", (int)pid);
        exit(3);
    }
    if (got != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "child %d ended badly (status %d)\n", (int)pid, st);
        exit(3);
    }
    g_forks_done++;
}

static void *stress_worker(void *arg)
{
    struct worker *w = arg;
    MUST(cudaSetDevice(w->dev)); /* primary context current here, for every path */
    long next_fork = g_forks_wanted ? w->ops / (g_forks_wanted + 1) : -1;
    for (long i = 0; i < w->ops; i++) {
        struct slot *s = &w->ring[next_rand(&w->rng) % RING];
        if (s->key) stress_free(w, s);
        else stress_alloc(w, s);
        if (w->id == 0 && i == next_fork && g_forks_done < g_forks_wanted) {
            fork_child(w);
            next_fork += w->ops / (g_forks_wanted + 1);
        }
    }
    return NULL;
}

static void *storm(void *arg)
{
    (void)arg;
    /* every 2 ms a report or a trim signal, alternating, until the workers end */
    while (!__atomic_load_n(&g_workers_done, __ATOMIC_ACQUIRE)) {
        kill(getpid(), (g_signals_sent & 1) ? SIGUSR2 : SIGUSR1);
        g_signals_sent++;
        sleep_ms(2);
    }
    return NULL;
}

static int mode_stress(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 6;
    long ops = argc > 2 ? atol(argv[2]) : 60000;
    unsigned long long seed = argc > 3 ? strtoull(argv[3], NULL, 0) : 1;
    g_forks_wanted = argc > 4 ? atoi(argv[4]) : 2;
    int with_storm = argc > 5 ? atoi(argv[5]) : 1;
    if (n < 1 || n > 64) n = 6;
    gg_setup(0);
    lookups();
    int nd = sim_devices() < MAX_DEV ? sim_devices() : MAX_DEV;
    struct worker *w = calloc((size_t)n, sizeof *w);
    for (int t = 0; t < n; t++) {
        w[t].id = t;
        w[t].dev = t % nd;
        w[t].ops = ops / n;
        w[t].rng = seed * 1000003ULL + (unsigned long long)t;
    }
    pthread_t st;
    if (with_storm) MUST(pthread_create(&st, NULL, storm, NULL));
    for (int t = 0; t < n; t++) MUST(pthread_create(&w[t].th, NULL, stress_worker, &w[t]));
    for (int t = 0; t < n; t++) pthread_join(w[t].th, NULL);
    __atomic_store_n(&g_workers_done, 1, __ATOMIC_RELEASE);
    if (with_storm) pthread_join(st, NULL);
    /* The storm is over (joined): no signal is sent any more, but one sent by kill()
     * may still be pending, not yet handled by a thread. Wait until none is (a bound
     * only against a broken build): every signal sent has then been counted. */
    for (long waited = 0;; waited++) {
        sigset_t pending;
        sigemptyset(&pending);
        MUST(sigpending(&pending));
        if (!sigismember(&pending, SIGUSR1) && !sigismember(&pending, SIGUSR2)) break;
        if (waited >= GG_WAIT_BOUND_MS) {
            fprintf(stderr, "gave up waiting for the report and trim signals to land\n");
            break;
        }
        sleep_ms(1);
    }
    unsigned long long allocs[MAX_DEV] = {0}, frees[MAX_DEV] = {0}, cur[MAX_DEV] = {0};
    long total_ops = 0;
    for (int t = 0; t < n; t++) {
        allocs[w[t].dev] += w[t].allocs;
        frees[w[t].dev] += w[t].frees;
        cur[w[t].dev] += w[t].current;
        total_ops += w[t].ops;
        for (int i = 0; i < RING; i++) {
            struct slot *s = &w[t].ring[i];
            if (!s->key) continue;
            alloc_line(s->key, s->bytes, w[t].dev,
                       s->path == S_POOL ? "pool" : s->path == S_VMM ? "vmm" : "device");
            leak_line(s->key, s->bytes);
        }
    }
    for (int d = 0; d < nd; d++)
        printf("TRUTH dev=%d allocs=%llu frees=%llu current=%llu\n", d, allocs[d], frees[d],
               cur[d]);
    printf("STRESS threads=%d ops=%ld signals=%ld forks=%d\n", n, total_ops, g_signals_sent,
           g_forks_done);
    print_gg();
    print_sim();
    puts("OK");
    free(w);
    return 0;
}

/* ---- helgrind: a small multi-threaded run for a thread checker -----------------
 * 3 threads allocate and free through the linked symbol and the dlsym answer, on
 * both devices, while the main thread asks for a report by SIGUSR1 and waits for
 * it to be written. With GG_PROOF_RACE=1 the threads also bump a plain global
 * without a lock: a planted race the checker must report. */
static long g_racy;
static int g_plant_race;

static void *hg_worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    MUST(cudaSetDevice(t % 2));
    for (int i = 0; i < 40; i++) {
        CUdeviceptr a, b;
        MUST(cuMemAlloc_v2(&a, 4096 + (size_t)i));
        MUST(dl_alloc(&b, 8192));
        MUST(dl_free(a));
        MUST(cuMemFree_v2(b));
        if (g_plant_race) g_racy++;
    }
    return NULL;
}

/* Whether GPUGUARD_DIR holds a report written for a signal. */
static int signal_report_written(void)
{
    const char *dir = getenv("GPUGUARD_DIR");
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) return 0;
    int found = 0;
    for (struct dirent *e; !found && (e = readdir(d)) != NULL;)
        found = strstr(e->d_name, ".signal.json") != NULL;
    closedir(d);
    return found;
}

static int mode_helgrind(int argc, char **argv)
{
    (void)argc; (void)argv;
    const char *plant = getenv("GG_PROOF_RACE");
    g_plant_race = plant && strcmp(plant, "1") == 0;
    gg_setup(0);
    lookups();
    MUST(cudaSetDevice(0)); /* the runtime initialised before any thread exists */
    CUdeviceptr keep; /* the first tracked call: gpuguard is active from here on */
    MUST(cuMemAlloc_v2(&keep, 1 * MiB));
    leak_line(keep, 1 * MiB);
    pthread_t th[3];
    for (int t = 0; t < 3; t++) MUST(pthread_create(&th[t], NULL, hg_worker, (void *)(intptr_t)t));
    kill(getpid(), SIGUSR1);
    for (int t = 0; t < 3; t++) pthread_join(th[t], NULL);
    /* handshake: the report the signal asked for is on disk (bounded: 60 s) */
    int waited = 0;
    while (!signal_report_written() && waited < 60000) { sleep_ms(10); waited += 10; }
    printf("SIGNAL_REPORT %s\n", signal_report_written() ? "yes" : "no");
    printf("RACY %ld\n", g_racy);
    print_gg();
    print_sim();
    puts("OK");
    return 0;
}

static const struct gg_mode modes[] = {
    {"faults", mode_faults},
    {"stress", mode_stress},
    {"helgrind", mode_helgrind},
    {NULL, NULL},
};

int main(int argc, char **argv) { return gg_dispatch(modes, argc, argv); }
