/*
 * microbench.c - what gpuguard adds to one allocation + free, on the simulated driver.
 *
 * Built and run by scripts/bench/run_cpu.sh; see docs/performance.md for the method.
 * Links the simulated libcuda.so.1 (tests/sim/) and runs with or without
 * LD_PRELOAD=libgpuguard.so. Without the shim every call goes to the sim.
 *
 * Paths timed (one alloc+free pair each):
 *   link   cuMemAlloc_v2 / cuMemFree_v2 called as linked symbols (PLT)
 *   dlsym  the same two through dlsym(dlopen("libcuda.so.1"), name) pointers
 *   proc   the same two the way the CUDA runtime gets them: dlsym cuGetProcAddress_v2,
 *          ask it for "cuGetProcAddress"@12000, ask that for "cuMemAlloc"@3020 and
 *          "cuMemFree"@3020
 *   vmm    cuMemCreate (2 MiB) / cuMemRelease, through the cuGetProcAddress table
 *   pool   cuMemAllocFromPoolAsync (default pool) / cuMemFreeAsync, through the
 *          cuGetProcAddress table (what PyTorch's backend:cudaMallocAsync reaches)
 *
 * Each path's block of pairs is preceded or followed (alternating) by a block of the
 * same pairs through the sim's own functions, found in libcuda.so.1's ELF symbol
 * table so no interposer sees them ("raw"). With the shim loaded, hooked - raw in one
 * process is the shim's added cost under identical conditions; without it, the two
 * call the same code and the difference is the method's noise floor.
 *
 * Output (stdout, one record per line, key=value):
 *   INFO ...                              set-up facts
 *   PREFILL live=N ns_per_alloc=X         time to fill the ledger before timing
 *   RSS before_kb=A after_kb=B live=N     VmRSS before / after the prefill
 *   BLOCK path=P kind=hooked|raw rep=R threads=T iters=N ns_per_pair=X
 *   PATH path=P threads=T live=L iters=N hooked_med=X hooked_min=X raw_med=X raw_min=X
 *        delta_med=X mpairs_s=X           medians over the reps (delta: per-rep
 *                                         hooked - raw, then the median)
 *   REPORT ms=X bytes=N live=N            gpuguard_write_report timed (--report)
 *   CG path=P kind=K iters=N              under callgrind: one stats dump per block
 *                                         (and one named "report" around the report)
 *
 * Usage: microbench [--threads T] [--iters N] [--reps R] [--live L] [--paths a,b,..]
 *                   [--pad D] [--report] [--no-raw] [--size B] [--devices D]
 * --devices D spreads the threads over D simulated devices (SIMCUDA_DEVICES >= D), each
 * with its own context and default pool: a diagnostic that separates cross-thread
 * contention on per-device state from contention on the sim's single lock.
 * --iters is the pairs per thread per block of the link/dlsym/proc paths; vmm runs
 * iters/2, pool iters*4 (their costs in the sim differ). --pad D calls the timed loop
 * under D extra frames so a stack of default depth (16) is really walked, as in a
 * framework. The program ends with _exit(), so gpuguard writes no exit report.
 * MICROBENCH_PAUSE=1 pauses the books after the prefill (see pause_books).
 */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_pause.h"

#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define HAVE_CALLGRIND 1
#endif
#endif
#ifndef HAVE_CALLGRIND
#define RUNNING_ON_VALGRIND 0
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS_AT(s) ((void)(s))
#endif

#define CHECK(call)                                                                   \
    do {                                                                              \
        CUresult rc_ = (call);                                                        \
        if (rc_ != CUDA_SUCCESS) {                                                    \
            fflush(stdout);                                                           \
            fprintf(stderr, "microbench: %s:%d: %s failed with %d\n", __FILE__,       \
                    __LINE__, #call, (int)rc_);                                       \
            _exit(3);                                                                 \
        }                                                                             \
    } while (0)

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*palloc_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*pfree_fn)(CUdeviceptr, CUstream);

enum path { P_LINK, P_DLSYM, P_PROC, P_VMM, P_POOL, NPATHS };
static const char *path_names[NPATHS] = {"link", "dlsym", "proc", "vmm", "pool"};

/* The functions one block calls. */
struct fns {
    alloc_fn alloc;
    free_fn free;
    create_fn create;
    release_fn release;
    palloc_fn palloc;
    pfree_fn pfree;
};

static struct fns g_hooked[NPATHS], g_raw[NPATHS];
static CUcontext g_ctx[64];
static CUmemoryPool g_pool[64];
static int g_devices = 1;
/* the calling thread's device (threads are spread over --devices devices) */
static __thread int t_dev;
static size_t g_size = 4096;
static int g_pad = 24;
static int g_threads = 1;
static long g_iters = 20000;

#define VMM_BYTES ((size_t)2 << 20)

/* ---- the sim's own functions, from its ELF dynamic symbol table ------------------ */

struct elf_want {
    const char *const *names;
    void **out;
    int n;
    int found_lib;
};

static uintptr_t dyn_addr(uintptr_t v, uintptr_t base) { return v < base ? v + base : v; }

static int elf_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct elf_want *w = data;
    const char *slash = strrchr(info->dlpi_name, '/');
    const char *base_name = slash ? slash + 1 : info->dlpi_name;
    if (strcmp(base_name, "libcuda.so.1") != 0) return 0;
    w->found_lib = 1;
    uintptr_t base = info->dlpi_addr;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(base + info->dlpi_phdr[i].p_vaddr);
    if (!dyn) return 1;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *hash = NULL, *gnu = NULL;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        uintptr_t v = dyn_addr(dyn->d_un.d_ptr, base);
        if (dyn->d_tag == DT_SYMTAB) symtab = (const ElfW(Sym) *)v;
        else if (dyn->d_tag == DT_STRTAB) strtab = (const char *)v;
        else if (dyn->d_tag == DT_HASH) hash = (const uint32_t *)v;
        else if (dyn->d_tag == DT_GNU_HASH) gnu = (const uint32_t *)v;
    }
    if (!symtab || !strtab) return 1;
    size_t nsyms = 0;
    if (hash) {
        nsyms = hash[1];
    } else if (gnu) {
        uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom = gnu[2];
        const uint32_t *buckets = gnu + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
        const uint32_t *chain = buckets + nbuckets;
        uint32_t last = 0;
        for (uint32_t b = 0; b < nbuckets; b++)
            if (buckets[b] > last) last = buckets[b];
        if (last < symoffset) {
            nsyms = symoffset;
        } else {
            while (!(chain[last - symoffset] & 1)) last++;
            nsyms = last + 1;
        }
    }
    for (size_t i = 0; i < nsyms; i++) {
        if (symtab[i].st_shndx == SHN_UNDEF || symtab[i].st_value == 0) continue;
        const char *name = strtab + symtab[i].st_name;
        for (int k = 0; k < w->n; k++)
            if (strcmp(name, w->names[k]) == 0) w->out[k] = (void *)(base + symtab[i].st_value);
    }
    return 1;
}

static void find_raw(void)
{
    static const char *const names[] = {"cuMemAlloc_v2", "cuMemFree_v2", "cuMemCreate",
                                        "cuMemRelease", "cuMemAllocFromPoolAsync",
                                        "cuMemFreeAsync"};
    void *out[6] = {0};
    struct elf_want w = {names, out, 6, 0};
    dl_iterate_phdr(elf_cb, &w);
    for (int k = 0; k < 6; k++)
        if (!out[k]) {
            fprintf(stderr, "microbench: %s not found in libcuda.so.1's symbol table (lib %s)\n",
                    names[k], w.found_lib ? "found" : "not found");
            _exit(3);
        }
    for (int p = 0; p < NPATHS; p++) {
        g_raw[p].alloc = (alloc_fn)out[0];
        g_raw[p].free = (free_fn)out[1];
        g_raw[p].create = (create_fn)out[2];
        g_raw[p].release = (release_fn)out[3];
        g_raw[p].palloc = (palloc_fn)out[4];
        g_raw[p].pfree = (pfree_fn)out[5];
    }
}

/* ---- the hooked pointers, per path ------------------------------------------------- */

static void find_hooked(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) {
        fprintf(stderr, "microbench: libcuda.so.1 not loaded\n");
        _exit(3);
    }
    /* link: the linked symbols themselves (gpuguard's exports when preloaded) */
    g_hooked[P_LINK].alloc = cuMemAlloc_v2;
    g_hooked[P_LINK].free = cuMemFree_v2;
    /* dlsym */
    g_hooked[P_DLSYM].alloc = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
    g_hooked[P_DLSYM].free = (free_fn)dlsym(h, "cuMemFree_v2");
    /* proc: as the runtime does it */
    PFN_cuGetProcAddress_v2 boot = (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2");
    if (!boot || !g_hooked[P_DLSYM].alloc || !g_hooked[P_DLSYM].free) {
        fprintf(stderr, "microbench: dlsym failed\n");
        _exit(3);
    }
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    CHECK(boot("cuGetProcAddress", &p, 12000, 0, &st));
    PFN_cuGetProcAddress_v2 gpa = (PFN_cuGetProcAddress_v2)p;
    struct {
        const char *base;
        int ver;
        void **slot;
    } want[] = {
        {"cuMemAlloc", 3020, (void **)&g_hooked[P_PROC].alloc},
        {"cuMemFree", 3020, (void **)&g_hooked[P_PROC].free},
        {"cuMemCreate", 10020, (void **)&g_hooked[P_VMM].create},
        {"cuMemRelease", 10020, (void **)&g_hooked[P_VMM].release},
        {"cuMemAllocFromPoolAsync", 11020, (void **)&g_hooked[P_POOL].palloc},
        {"cuMemFreeAsync", 11020, (void **)&g_hooked[P_POOL].pfree},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK(gpa(want[i].base, want[i].slot, want[i].ver, 0, &st));
        if (!*want[i].slot) {
            fprintf(stderr, "microbench: cuGetProcAddress(%s) gave NULL\n", want[i].base);
            _exit(3);
        }
    }
    dlclose(h);
}

/* ---- one block of pairs ---------------------------------------------------------------- */

static long iters_of(int path)
{
    if (path == P_VMM) return g_iters / 2 > 0 ? g_iters / 2 : 1;
    if (path == P_POOL) return g_iters * 4;
    return g_iters;
}

static void __attribute__((noinline)) loop_link(long n)
{
    for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        CHECK(cuMemAlloc_v2(&p, g_size));
        CHECK(cuMemFree_v2(p));
    }
}

static void __attribute__((noinline)) loop_ptr(const struct fns *f, long n)
{
    for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        CHECK(f->alloc(&p, g_size));
        CHECK(f->free(p));
    }
}

static void __attribute__((noinline)) loop_vmm(const struct fns *f, long n)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = t_dev;
    for (long i = 0; i < n; i++) {
        CUmemGenericAllocationHandle h;
        CHECK(f->create(&h, VMM_BYTES, &prop, 0));
        CHECK(f->release(h));
    }
}

static void __attribute__((noinline)) loop_pool(const struct fns *f, long n)
{
    for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        CHECK(f->palloc(&p, g_size, g_pool[t_dev], NULL));
        CHECK(f->pfree(p, NULL));
    }
}

struct job {
    int path;
    int raw;
    long n;
};

static void run_job(const struct job *j)
{
    const struct fns *f = j->raw ? &g_raw[j->path] : &g_hooked[j->path];
    switch (j->path) {
    case P_LINK:
        if (j->raw) loop_ptr(f, j->n);
        else loop_link(j->n);
        break;
    case P_DLSYM:
    case P_PROC: loop_ptr(f, j->n); break;
    case P_VMM: loop_vmm(f, j->n); break;
    case P_POOL: loop_pool(f, j->n); break;
    }
}

/* D extra frames under the loop, so a default-depth stack capture walks 16 user
 * frames as it would in a framework. Not a tail call (the volatile add after it). */
static volatile int g_sink;
static void __attribute__((noinline)) padded(int d, const struct job *j)
{
    if (d <= 0) run_job(j);
    else padded(d - 1, j);
    g_sink += d;
}

/* ---- threads ----------------------------------------------------------------------------- */

static pthread_barrier_t g_start, g_end;
static struct job g_job;
static int g_quit;

static void *worker(void *arg)
{
    t_dev = (int)(intptr_t)arg % g_devices;
    CHECK(cuCtxSetCurrent(g_ctx[t_dev]));
    for (;;) {
        pthread_barrier_wait(&g_start);
        if (g_quit) break;
        struct job j = g_job;
        padded(g_pad, &j);
        pthread_barrier_wait(&g_end);
    }
    return NULL;
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* Runs one block on every thread; returns wall ns per pair (per thread). */
static double run_block(int path, int raw, long n)
{
    struct job j = {path, raw, n};
    char label[64];
    snprintf(label, sizeof label, "%s-%s", path_names[path], raw ? "raw" : "hooked");
    if (RUNNING_ON_VALGRIND) CALLGRIND_ZERO_STATS;
    double t0 = now_ns();
    if (g_threads == 1) {
        padded(g_pad, &j);
    } else {
        g_job = j;
        pthread_barrier_wait(&g_start);
        pthread_barrier_wait(&g_end);
    }
    double t1 = now_ns();
    if (RUNNING_ON_VALGRIND) {
        CALLGRIND_DUMP_STATS_AT(label);
        printf("CG path=%s kind=%s iters=%ld\n", path_names[path], raw ? "raw" : "hooked", n);
    }
    return (t1 - t0) / (double)n;
}

/* ---- helpers ------------------------------------------------------------------------------ */

/* A "VmXXX:" line of /proc/self/status, in KiB. */
static long status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0) {
            kb = strtol(line + n, NULL, 10);
            break;
        }
    fclose(f);
    return kb;
}

static long vmrss_kb(void) { return status_kb("VmRSS:"); }

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    double *c = malloc(sizeof(double) * (size_t)n);
    memcpy(c, v, sizeof(double) * (size_t)n);
    qsort(c, (size_t)n, sizeof(double), cmp_d);
    double m = n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
    free(c);
    return m;
}

static double minimum(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++)
        if (v[i] < m) m = v[i];
    return m;
}

static CUdeviceptr *g_prefill;

static void __attribute__((noinline)) prefill(long live)
{
    if (live <= 0) return;
    g_prefill = malloc(sizeof(CUdeviceptr) * (size_t)live);
    if (!g_prefill) _exit(3);
    double t0 = now_ns();
    for (long i = 0; i < live; i++) CHECK(cuMemAlloc_v2(&g_prefill[i], 256 + 64 * (size_t)(i % 16)));
    double t1 = now_ns();
    printf("PREFILL live=%ld ns_per_alloc=%.1f\n", live, (t1 - t0) / (double)live);
}

typedef int (*report_fn)(const char *, char *, size_t);

static void timed_report(long live)
{
    report_fn wr = (report_fn)dlsym(RTLD_DEFAULT, "gpuguard_write_report");
    if (!wr) {
        printf("REPORT absent\n");
        return;
    }
    char path[4096] = "";
    long rss0 = vmrss_kb();
    if (RUNNING_ON_VALGRIND) CALLGRIND_ZERO_STATS;
    double t0 = now_ns();
    int rc = wr("bench", path, sizeof path);
    double t1 = now_ns();
    if (RUNNING_ON_VALGRIND) CALLGRIND_DUMP_STATS_AT("report");
    struct stat sb;
    long long bytes = (rc == 0 && stat(path, &sb) == 0) ? (long long)sb.st_size : -1;
    /* VmHWM is the process's peak so far: the report's transient memory shows as
     * hwm_kb above rss_before_kb (the prefill itself stays resident). */
    printf("REPORT ms=%.1f bytes=%lld live=%ld rc=%d rss_before_kb=%ld hwm_kb=%ld path=%s\n",
           (t1 - t0) / 1e6, bytes, live, rc, rss0, status_kb("VmHWM:"), path);
    if (rc == 0 && getenv("MICROBENCH_KEEP_REPORT") == NULL) unlink(path);
}

static int want_path(const char *list, const char *name)
{
    if (!list) return 1;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int reps = 10, do_report = 0, no_raw = 0;
    long live = 0;
    const char *paths = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--threads") && v) g_threads = atoi(v), i++;
        else if (!strcmp(a, "--iters") && v) g_iters = atol(v), i++;
        else if (!strcmp(a, "--reps") && v) reps = atoi(v), i++;
        else if (!strcmp(a, "--live") && v) live = atol(v), i++;
        else if (!strcmp(a, "--paths") && v) paths = v, i++;
        else if (!strcmp(a, "--pad") && v) g_pad = atoi(v), i++;
        else if (!strcmp(a, "--size") && v) g_size = (size_t)atol(v), i++;
        else if (!strcmp(a, "--devices") && v) g_devices = atoi(v), i++;
        else if (!strcmp(a, "--report")) do_report = 1;
        else if (!strcmp(a, "--no-raw")) no_raw = 1;
        else {
            fprintf(stderr,
                    "usage: %s [--threads T] [--iters N] [--reps R] [--live L] [--paths a,b]"
                    " [--pad D] [--size B] [--devices D] [--report] [--no-raw]\n",
                    argv[0]);
            return 2;
        }
    }
    if (g_threads < 1 || g_iters < 1 || reps < 1) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);

    CHECK(cuInit(0));
    int ndev = 0;
    CHECK(cuDeviceGetCount(&ndev));
    if (g_devices < 1 || g_devices > ndev || g_devices > 64) {
        fprintf(stderr, "microbench: --devices %d but the driver has %d\n", g_devices, ndev);
        return 2;
    }
    for (int d = 0; d < g_devices; d++) {
        CHECK(cuDevicePrimaryCtxRetain(&g_ctx[d], d));
        CHECK(cuCtxSetCurrent(g_ctx[d]));
        CHECK(cuDeviceGetDefaultMemPool(&g_pool[d], d));
    }
    CHECK(cuCtxSetCurrent(g_ctx[0]));
    find_hooked();
    find_raw();
    int shim = dlsym(RTLD_DEFAULT, "gpuguard_version") != NULL;
    const char *depth = getenv("GPUGUARD_STACK_DEPTH");
    printf("INFO shim=%d stack_depth=%s threads=%d devices=%d iters=%ld reps=%d live=%ld pad=%d "
           "size=%zu valgrind=%d\n",
           shim, shim ? (depth ? depth : "default") : "-", g_threads, g_devices, g_iters, reps,
           live, g_pad, g_size, (int)RUNNING_ON_VALGRIND);

    /* The shim's books exist from the first call on; the per-allocation memory is what
     * the prefill adds after that. */
    {
        CUdeviceptr p;
        CHECK(cuMemAlloc_v2(&p, 4096));
        CHECK(cuMemFree_v2(p));
    }
    long rss0 = vmrss_kb();
    prefill(live);
    long rss1 = vmrss_kb();
    printf("RSS before_kb=%ld after_kb=%ld live=%ld\n", rss0, rss1, live);
    printf("INFO paused=%d\n", pause_books());

    if (do_report) {
        timed_report(live);
        fflush(stdout);
        _exit(0);
    }

    pthread_t *tids = NULL;
    if (g_threads > 1) {
        pthread_barrier_init(&g_start, NULL, (unsigned)g_threads + 1);
        pthread_barrier_init(&g_end, NULL, (unsigned)g_threads + 1);
        tids = calloc((size_t)g_threads, sizeof *tids);
        for (int t = 0; t < g_threads; t++)
            pthread_create(&tids[t], NULL, worker, (void *)(intptr_t)t);
    }

    /* warm-up: every path, both kinds, a tenth of a block */
    for (int p = 0; p < NPATHS; p++) {
        if (!want_path(paths, path_names[p])) continue;
        long n = iters_of(p) / 10 + 1;
        run_block(p, 0, n);
        if (!no_raw) run_block(p, 1, n);
    }

    double hooked[NPATHS][reps], raw[NPATHS][reps], delta[NPATHS][reps];
    for (int r = 0; r < reps; r++) {
        for (int p = 0; p < NPATHS; p++) {
            if (!want_path(paths, path_names[p])) continue;
            long n = iters_of(p);
            /* alternate which kind runs first, so drift within a rep cancels */
            int first_raw = r % 2;
            for (int k = 0; k < 2; k++) {
                int is_raw = k == 0 ? first_raw : !first_raw;
                if (is_raw && no_raw) continue;
                double ns = run_block(p, is_raw, n);
                if (is_raw) raw[p][r] = ns;
                else hooked[p][r] = ns;
                printf("BLOCK path=%s kind=%s rep=%d threads=%d iters=%ld ns_per_pair=%.2f\n",
                       path_names[p], is_raw ? "raw" : "hooked", r, g_threads, n, ns);
            }
            delta[p][r] = no_raw ? 0 : hooked[p][r] - raw[p][r];
        }
    }
    for (int p = 0; p < NPATHS; p++) {
        if (!want_path(paths, path_names[p])) continue;
        double hm = median(hooked[p], reps);
        printf("PATH path=%s threads=%d live=%ld iters=%ld hooked_med=%.2f hooked_min=%.2f "
               "raw_med=%.2f raw_min=%.2f delta_med=%.2f mpairs_s=%.4f\n",
               path_names[p], g_threads, live, iters_of(p), hm, minimum(hooked[p], reps),
               no_raw ? 0 : median(raw[p], reps), no_raw ? 0 : minimum(raw[p], reps),
               no_raw ? 0 : median(delta[p], reps), g_threads * 1e3 / hm);
    }

    if (g_threads > 1) {
        g_quit = 1;
        pthread_barrier_wait(&g_start);
        for (int t = 0; t < g_threads; t++) pthread_join(tids[t], NULL);
    }
    fflush(stdout);
    _exit(0); /* no exit report: the timing is done, and 1M live would make a big one */
}
