/*
 * gg_rel.c - test program for how gpuguard behaves at the edges of a process:
 * endings by signal, work asked for just before exit, a safety net. Links the
 * driver and the runtime. Usage: gg_rel MODE [args]; see gg_common.h for the
 * output protocol.
 */
#include "gg_common.h"
#include "cudart_sim.h"

#include <pthread.h>
#include <sys/wait.h>

static CUdeviceptr leak(size_t bytes)
{
    CUdeviceptr p;
    MUST(cuMemAlloc_v2(&p, bytes));
    alloc_line(p, bytes, 0, "device");
    leak_line(p, bytes);
    return p;
}

/* Whether GPUGUARD_DIR holds a report file whose name ends ".<reason>.json". */
static int has_report(const char *reason)
{
    const char *dir = getenv("GPUGUARD_DIR");
    DIR *d = opendir(dir ? dir : ".");
    if (!d) return 0;
    char tail[64];
    snprintf(tail, sizeof tail, ".%s.json", reason);
    size_t tl = strlen(tail);
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "gpuguard.", 9) == 0 && n > tl &&
            strcmp(e->d_name + n - tl, tail) == 0)
            found = 1;
    }
    closedir(d);
    return found;
}

/* Waits (at most 20 s) until a report for `reason` is in GPUGUARD_DIR. */
static int wait_report(const char *reason)
{
    for (int i = 0; i < 20000; i++) {
        if (has_report(reason)) return 1;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* ending SIGNUM: leaks 1 MiB, then raises SIGNUM (whose default ends the process). */
static int mode_ending(int argc, char **argv)
{
    int sig = argc > 1 ? atoi(argv[1]) : SIGTERM;
    gg_setup(0);
    leak(1 * MiB);
    fflush(stdout);
    raise(sig);
    puts("SURVIVED");
    return 0;
}

/* wait: leaks 1 MiB, prints READY, then waits for a signal to end it. */
static int mode_wait(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    leak(1 * MiB);
    puts("READY");
    fflush(stdout);
    for (;;) pause();
}

static volatile sig_atomic_t g_term;

static void on_term(int sig)
{
    (void)sig;
    g_term++;
}

static void own_term_handler(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    MUST(sigaction(SIGTERM, &sa, NULL));
}

/* own_term before|after: the program handles SIGTERM itself (its handler set
 * before or after the first CUDA call), and ends normally after it. */
static int mode_own_term(int argc, char **argv)
{
    int before = argc > 1 && strcmp(argv[1], "before") == 0;
    if (before) own_term_handler();
    gg_setup(0);
    leak(1 * MiB);
    if (!before) own_term_handler();
    raise(SIGTERM);
    printf("HANDLED %d\n", (int)g_term);
    puts("OK");
    return 0;
}

/* ask_then_exit SIGNUM: asks gpuguard for work with SIGNUM (report or trim signal)
 * and exits at once, before the helper thread could have done it. A pool keeps
 * 8 MiB of freed blocks so a trim has something to give back. */
static int mode_ask_then_exit(int argc, char **argv)
{
    int sig = argc > 1 ? atoi(argv[1]) : SIGUSR2;
    gg_setup(0);
    CUdeviceptr a;
    MUST(cuMemAllocAsync(&a, 8 * MiB, NULL));
    MUST(cuMemFreeAsync(a, NULL));
    leak(1 * MiB);
    raise(sig);
    puts("OK");
    return 0;
}

/* cap_then_exit: an allocation past GPUGUARD_CAP is refused, then the program
 * exits at once. */
static int mode_cap_then_exit(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    leak(1 * MiB);
    CUdeviceptr p;
    rc_line("big", cuMemAlloc_v2(&p, 64 * MiB));
    puts("OK");
    return 0;
}

/* snapshots_then_exit MS: runs MS milliseconds (snapshots may be due), exits. */
static int mode_snapshots_then_exit(int argc, char **argv)
{
    int ms = argc > 1 ? atoi(argv[1]) : 50;
    gg_setup(0);
    leak(1 * MiB);
    wait_report("snapshot");
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    puts("OK");
    return 0;
}

/* pool_trim_unasked: 16 MiB freed into the device's default pool, which the program
 * never looked up (no cuDeviceGetDefaultMemPool); the trim signal; the trim report
 * waited for. */
static int mode_pool_trim_unasked(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    CUdeviceptr a;
    MUST(cuMemAllocAsync(&a, 16 * MiB, NULL));
    MUST(cuMemFreeAsync(a, NULL));
    printf("SIM dev=0 pool_reserved=%llu\n", simcuda_pool_reserved(0));
    raise(SIGUSR2);
    printf("TRIMREPORT %d\n", wait_report("trim"));
    printf("SIMAFTER dev=0 pool_reserved=%llu\n", simcuda_pool_reserved(0));
    puts("OK");
    return 0;
}

/* allocs N: N allocations of 1 MiB through the driver, each printed, freed at the
 * end; then the books. */
static int mode_allocs(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 4;
    gg_setup(0);
    CUdeviceptr *ps = calloc((size_t)n, sizeof *ps);
    for (int i = 0; i < n; i++) {
        int rc = cuMemAlloc_v2(&ps[i], 1 * MiB);
        rc_line("alloc", rc);
        if (rc == 0) alloc_line(ps[i], 1 * MiB, 0, "device");
    }
    void *rt = NULL;
    rc_line("cudaMalloc", cudaMalloc(&rt, 1 * MiB));
    rc_line("cudaFree", cudaFree(rt));
    for (int i = 0; i < n; i++) {
        rc_line("free", cuMemFree_v2(ps[i]));
        free_line(ps[i]);
    }
    free(ps);
    print_gg();
    print_sim();
    puts("OK");
    return 0;
}

/* dlsym_probe: no CUDA; one dlsym of a libc name. */
static int mode_dlsym_probe(int argc, char **argv)
{
    (void)argc; (void)argv;
    void *p = dlsym(RTLD_DEFAULT, "printf");
    printf("DLSYM %s\n", p ? "found" : "null");
    puts("OK");
    return 0;
}

/* retry_helper: a report signal after the first CUDA call, then allocations (each
 * a CUDA call gpuguard sees) until the signal's report is there (at most 20 s). */
static int mode_retry_helper(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    leak(1 * MiB);
    raise(SIGUSR1);
    int got = 0;
    for (int i = 0; i < 20000 && !got; i++) {
        CUdeviceptr p;
        MUST(cuMemAlloc_v2(&p, 65536));
        MUST(cuMemFree_v2(p));
        got = has_report("signal");
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    printf("SIGREPORT %d\n", got);
    puts("OK");
    return 0;
}

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

/* second_driver PATH: cuMemAlloc_v2 looked up with dlsym in the loaded driver and in
 * a second copy of it (PATH): two different real pointers for one function. One
 * allocation through each, both leaked. */
static int mode_second_driver(int argc, char **argv)
{
    if (argc < 2) return 2;
    gg_setup(0);
    void *h1 = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *h2 = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h1 || !h2) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 3;
    }
    alloc_fn a1 = (alloc_fn)dlsym(h1, "cuMemAlloc_v2");
    alloc_fn a2 = (alloc_fn)dlsym(h2, "cuMemAlloc_v2");
    CUresult (*init2)(unsigned) = (CUresult(*)(unsigned))dlsym(h2, "cuInit");
    CUresult (*retain2)(CUcontext *, CUdevice) =
        (CUresult(*)(CUcontext *, CUdevice))dlsym(h2, "cuDevicePrimaryCtxRetain");
    CUresult (*set2)(CUcontext) = (CUresult(*)(CUcontext))dlsym(h2, "cuCtxSetCurrent");
    CUcontext c2;
    MUST(init2(0));
    MUST(retain2(&c2, 0));
    MUST(set2(c2));
    printf("POINTERS %s\n", a1 == a2 ? "same" : "different");
    CUdeviceptr p, q;
    MUST(a1(&p, 1 * MiB));
    leak_line(p, 1 * MiB);
    MUST(a2(&q, 2 * MiB));
    leak_line(q, 2 * MiB);
    print_gg();
    puts("OK");
    return 0;
}

static const struct gg_mode g_modes[] = {
    {"second_driver", mode_second_driver},
    {"dlsym_probe", mode_dlsym_probe},
    {"retry_helper", mode_retry_helper},
    {"ending", mode_ending},
    {"wait", mode_wait},
    {"own_term", mode_own_term},
    {"ask_then_exit", mode_ask_then_exit},
    {"cap_then_exit", mode_cap_then_exit},
    {"snapshots_then_exit", mode_snapshots_then_exit},
    {"pool_trim_unasked", mode_pool_trim_unasked},
    {"allocs", mode_allocs},
    {NULL, NULL},
};

int main(int argc, char **argv) { return gg_dispatch(g_modes, argc, argv); }
