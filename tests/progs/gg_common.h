/*
 * gg_common.h - helpers shared by the gpuguard test programs.
 *
 * Output protocol (stdout, one record per line, parsed by tests/common/mod.rs):
 *   ALLOC <hexaddr> <bytes> <dev> <kind>   an allocation the program made
 *   FREE <hexaddr>                         an allocation it freed
 *   LEAK <hexaddr> <bytes>                 an allocation it leaves behind on purpose
 *   RC <label> <int>                       the return code of a call under test
 *   GG dev=<d> current= peak= allocs= frees= failed= denied= unknown_frees= cap= total=
 *   GGHOST current=<n> peak=<n>            gpuguard's pinned-host counters
 *   GG absent                              gpuguard is not loaded
 *   SIM dev=<d> live=<n> count=<n> pool_reserved=<n>   the sim's books
 *   SIMHOST live=<n> count=<n>
 *   STEP <name>                            marks a phase; lines after it belong to it
 *   MIDREPORT <path>                       a report written on request mid-run (only
 *                                          with GG_MIDREPORT=1 and gpuguard loaded)
 *   THREADS <n>                            threads in the process (modes nocuda,
 *                                          signal_before)
 *   OK                                     the program reached its end
 * For VMM the "address" of ALLOC/FREE/LEAK is the allocation handle; for arrays
 * it is the array handle; host allocations use device -1.
 * Diagnostics go to stderr.
 */
#ifndef GG_COMMON_H
#define GG_COMMON_H

#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_sim.h"

/* gpuguard's C API, resolved at run time so the programs also run without it. */
typedef struct gpuguard_device_counters {
    int32_t device;
    uint32_t reserved0;
    uint64_t total_bytes, cap_bytes, current_bytes, peak_bytes, allocs, frees, failed, denied,
        unknown_frees;
} gpuguard_device_counters;

typedef int (*gg_counters_fn)(int, gpuguard_device_counters *);
typedef int (*gg_host_fn)(uint64_t *, uint64_t *);
typedef int (*gg_report_fn)(const char *, char *, size_t);

/* Stops the program when a call that must succeed does not. */
#define MUST(call)                                                                   \
    do {                                                                             \
        int rc_ = (int)(call);                                                       \
        if (rc_ != 0) {                                                              \
            fflush(stdout);                                                          \
            fprintf(stderr, "%s:%d: %s failed with %d\n", __FILE__, __LINE__, #call, rc_); \
            exit(3);                                                                 \
        }                                                                            \
    } while (0)

#define MiB (1ULL << 20)

/* Makes device `dev`'s primary context current (initializing the driver first). */
static inline CUcontext gg_setup(int dev)
{
    CUcontext c;
    MUST(cuInit(0));
    MUST(cuDevicePrimaryCtxRetain(&c, dev));
    MUST(cuCtxSetCurrent(c));
    return c;
}

static inline void rc_line(const char *label, int rc) { printf("RC %s %d\n", label, rc); }

static inline void alloc_line(unsigned long long addr, unsigned long long bytes, int dev,
                              const char *kind)
{
    printf("ALLOC 0x%llx %llu %d %s\n", addr, bytes, dev, kind);
}

static inline void free_line(unsigned long long addr) { printf("FREE 0x%llx\n", addr); }

static inline void leak_line(unsigned long long addr, unsigned long long bytes)
{
    printf("LEAK 0x%llx %llu\n", addr, bytes);
}

static inline void step(const char *name) { printf("STEP %s\n", name); }

/* A symbol of the sim driver, whether the program linked it or dlopen()ed it
 * privately (RTLD_NOLOAD finds the loaded copy without loading one). */
static inline void *sim_sym(const char *name)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) return NULL;
    void *p = dlsym(h, name);
    dlclose(h);
    return p;
}

static inline int sim_devices(void);

static inline void print_gg(void)
{
    gg_counters_fn counters = (gg_counters_fn)dlsym(RTLD_DEFAULT, "gpuguard_device_counters");
    if (!counters) {
        puts("GG absent");
        return;
    }
    /* one line per device the sim has (64 at most without the sim) */
    for (int d = 0; d < sim_devices(); d++) {
        gpuguard_device_counters c;
        memset(&c, 0, sizeof c);
        if (counters(d, &c) != 0) break;
        printf("GG dev=%d current=%llu peak=%llu allocs=%llu frees=%llu failed=%llu denied=%llu "
               "unknown_frees=%llu cap=%llu total=%llu\n",
               d, (unsigned long long)c.current_bytes, (unsigned long long)c.peak_bytes,
               (unsigned long long)c.allocs, (unsigned long long)c.frees,
               (unsigned long long)c.failed, (unsigned long long)c.denied,
               (unsigned long long)c.unknown_frees, (unsigned long long)c.cap_bytes,
               (unsigned long long)c.total_bytes);
    }
    gg_host_fn host = (gg_host_fn)dlsym(RTLD_DEFAULT, "gpuguard_host_pinned");
    uint64_t cur = 0, peak = 0;
    if (host && host(&cur, &peak) == 0)
        printf("GGHOST current=%llu peak=%llu\n", (unsigned long long)cur,
               (unsigned long long)peak);
}

static inline void print_sim(void)
{
    int (*ndev)(void) = (int (*)(void))sim_sym("simcuda_device_count");
    unsigned long long (*live)(int) = (unsigned long long (*)(int))sim_sym("simcuda_live_bytes");
    int (*count)(int) = (int (*)(int))sim_sym("simcuda_live_count");
    unsigned long long (*pool)(int) = (unsigned long long (*)(int))sim_sym("simcuda_pool_reserved");
    unsigned long long (*hlive)(void) =
        (unsigned long long (*)(void))sim_sym("simcuda_host_live_bytes");
    int (*hcount)(void) = (int (*)(void))sim_sym("simcuda_host_live_count");
    if (!ndev || !live || !count || !pool || !hlive || !hcount) {
        puts("SIM absent");
        return;
    }
    for (int d = 0; d < ndev(); d++)
        printf("SIM dev=%d live=%llu count=%d pool_reserved=%llu\n", d, live(d), count(d), pool(d));
    printf("SIMHOST live=%llu count=%d\n", hlive(), hcount());
}

/* CALLS <export> <n>: how often the sim's export `name` ran. */
static inline void print_calls(const char *name)
{
    unsigned long long (*calls)(const char *) =
        (unsigned long long (*)(const char *))sim_sym("simcuda_calls");
    printf("CALLS %s %llu\n", name, calls ? calls(name) : 0ULL);
}

static inline int sim_devices(void)
{
    int (*ndev)(void) = (int (*)(void))sim_sym("simcuda_device_count");
    return ndev ? ndev() : 64;
}

/* Sleeps the whole interval even when signals interrupt it. */
static inline void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- handshakes with gpuguard's helper thread ----
 * What that thread does (a report a signal asked for, a trim, a snapshot) shows as a
 * file renamed into place in the report folder, $GPUGUARD_DIR. A program that must
 * not go on before it is done waits for the file, not for a guessed time. */

/* Report files in $GPUGUARD_DIR whose names end in `suffix` (e.g. ".signal.json");
 * -1 without a folder. Temporaries (".gpuguard-*.tmp") never match. */
static inline int count_reports(const char *suffix)
{
    const char *dir = getenv("GPUGUARD_DIR");
    if (!dir || !*dir) return -1;
    DIR *d = opendir(dir);
    if (!d) return -1;
    size_t ls = strlen(suffix);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t l = strlen(e->d_name);
        if (e->d_name[0] != '.' && l >= ls && strcmp(e->d_name + l - ls, suffix) == 0) n++;
    }
    closedir(d);
    return n;
}

/* The bound on a handshake: far past any wait a loaded machine causes, it only keeps
 * a broken build from hanging its test. */
#define GG_WAIT_BOUND_MS 60000L

/* Waits until $GPUGUARD_DIR holds at least `want` files ending in `suffix`. Returns
 * 1 when they are there; 0 at once when gpuguard is not loaded or there is no
 * folder; 0 after GG_WAIT_BOUND_MS, saying so on stderr (the test then fails on
 * what is missing). */
static inline int wait_reports(const char *suffix, int want)
{
    if (!dlsym(RTLD_DEFAULT, "gpuguard_device_counters") || count_reports(suffix) < 0) return 0;
    for (long waited = 0; waited < GG_WAIT_BOUND_MS; waited++) {
        if (count_reports(suffix) >= want) return 1;
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "gave up waiting for %d file(s) *%s in GPUGUARD_DIR\n", want, suffix);
    return 0;
}

/* ---- modes every program offers ---- */

/* Entries of /proc/self/task: the threads of this process. */
static inline int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* With GG_MIDREPORT=1 and gpuguard loaded: asks for a report now, with `reason`,
 * and prints MIDREPORT <path>. Otherwise does nothing. */
static inline void mid_report(const char *reason)
{
    const char *want = getenv("GG_MIDREPORT");
    if (!want || strcmp(want, "1") != 0) return;
    gg_report_fn wr = (gg_report_fn)dlsym(RTLD_DEFAULT, "gpuguard_write_report");
    if (!wr) return;
    char path[4096] = "";
    if (wr(reason, path, sizeof path) == 0)
        printf("MIDREPORT %s\n", path);
    else
        puts("MIDREPORT failed");
}

/* Does nothing CUDA: checks that the shim stays inert. */
static inline int mode_nocuda(void)
{
    printf("THREADS %d\n", thread_count());
    puts("OK");
    return 0;
}

/* SIGUSR1 before any CUDA call: the shim's handler must not kill the process.
 * raise() sends it to this thread, so it is handled before raise() returns: a
 * handler that killed the process has done so by then. THREADS after it: with no
 * thread of gpuguard's running, nothing can answer the signal later (no waiting
 * for something that must not come). */
static inline int mode_signal_before(void)
{
    fflush(stdout);
    raise(SIGUSR1);
    printf("THREADS %d\n", thread_count());
    puts("OK");
    return 0;
}

struct gg_mode {
    const char *name;
    int (*fn)(int argc, char **argv); /* argv[0] is the mode name */
};

/* Runs the mode named by argv[1]; prints the list when it is unknown. */
static inline int gg_dispatch(const struct gg_mode *modes, int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines survive a crash or a kill */
    if (argc >= 2)
        for (const struct gg_mode *m = modes; m->name; m++)
            if (strcmp(m->name, argv[1]) == 0) {
                int rc = m->fn(argc - 1, argv + 1);
                fflush(stdout);
                return rc;
            }
    fprintf(stderr, "usage: %s MODE [args]\nmodes:", argv[0]);
    for (const struct gg_mode *m = modes; m->name; m++) fprintf(stderr, " %s", m->name);
    fputc('\n', stderr);
    return 2;
}

#endif /* GG_COMMON_H */
