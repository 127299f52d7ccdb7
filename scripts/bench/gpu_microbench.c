/*
 * gpu_microbench.c - what gpuguard adds to one allocation + free on a real GPU.
 *
 * Built and run by scripts/bench/run_gpu.sh (with and without
 * LD_PRELOAD=libgpuguard.so). Links libcuda and the shared CUDA runtime, so both the
 * driver's and the runtime's exports can be interposed, as in PyTorch.
 *
 * Paths timed (one alloc+free pair each):
 *   drv4k    cuMemAlloc_v2 + cuMemFree_v2, 4 KiB, linked symbols
 *   drv64m   the same, 64 MiB
 *   pool     cuMemAllocFromPoolAsync (default pool, 4 KiB) + cuMemFreeAsync on the
 *            thread's own stream, through the cuGetProcAddress table as the runtime
 *            gets it (dlsym cuGetProcAddress_v2, ask for "cuGetProcAddress"@12000...)
 *   vmm      cuMemCreate (one granule, 2 MiB) + cuMemRelease, same table
 *   rt       cudaMalloc + cudaFree, 4 KiB, through the shared runtime
 *   rtasync  cudaMallocAsync + cudaFreeAsync, 4 KiB, the thread's stream (what PyTorch's
 *            backend:cudaMallocAsync calls for every tensor)
 * For the four driver paths each block is paired (alternating order) with a block of
 * the same pairs through the driver's own functions, found in libcuda.so.1's ELF
 * symbol table, which no interposer sees ("raw"): hooked - raw in one process is the
 * shim's added cost under the same conditions. The runtime paths have no raw twin
 * (the runtime reaches the driver through pointers the shim handed it).
 *
 * Each path's block size is calibrated per process to about --block-ms of wall time.
 * With T threads every thread runs the block at once; ns_per_pair is wall time over
 * the pairs of one thread, mpairs_s the pairs of all threads per microsecond.
 *
 * Output: the same records as scripts/bench/microbench.c (INFO, BLOCK, PATH), plus
 *   GG allocs=.. frees=.. unknown_frees=..   gpuguard's counters at the end, if loaded
 *
 * Usage: gpu_microbench [--threads T] [--reps R] [--block-ms M] [--paths a,b] [--pad D]
 * MICROBENCH_PAUSE=1 pauses gpuguard's books first (see pause_books).
 * Compile-checks against the simulated driver too: -DGG_SIM -I tests/sim.
 */
#define _GNU_SOURCE
#ifdef GG_SIM
#include "cuda_sim.h"
#include "cudart_sim.h"
#else
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_pause.h"

#ifndef CU_STREAM_NON_BLOCKING
#define CU_STREAM_NON_BLOCKING 0x1
#endif

static void die_cu(const char *what, int rc, const char *file, int line)
{
    fflush(stdout);
    fprintf(stderr, "gpu_microbench: %s:%d: %s failed with %d\n", file, line, what, rc);
    _exit(3);
}

#define CHECK(call)                                                      \
    do {                                                                 \
        int rc_ = (int)(call);                                           \
        if (rc_ != 0) die_cu(#call, rc_, __FILE__, __LINE__);            \
    } while (0)

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*palloc_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*pfree_fn)(CUdeviceptr, CUstream);
typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, void *);

enum path { P_DRV4K, P_DRV64M, P_POOL, P_VMM, P_RT, P_RTASYNC, NPATHS };
static const char *path_names[NPATHS] = {"drv4k", "drv64m", "pool", "vmm", "rt", "rtasync"};
static const int has_raw[NPATHS] = {1, 1, 1, 1, 0, 0};

struct fns {
    alloc_fn alloc;
    free_fn free;
    create_fn create;
    release_fn release;
    palloc_fn palloc;
    pfree_fn pfree;
};

static struct fns g_hooked, g_raw;
static CUcontext g_ctx;
static CUmemoryPool g_pool;
static size_t g_granule = (size_t)2 << 20;
static int g_pad = 24;
static int g_threads = 1;

/* ---- the driver's own functions, from its ELF dynamic symbol table --------------- */

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
    if (strncmp(base_name, "libcuda.so", 10) != 0) return 0;
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
        if (ELF64_ST_TYPE(symtab[i].st_info) != STT_FUNC) continue;
        const char *name = strtab + symtab[i].st_name;
        for (int k = 0; k < w->n; k++)
            if (!w->out[k] && strcmp(name, w->names[k]) == 0)
                w->out[k] = (void *)(base + symtab[i].st_value);
    }
    return 1;
}

static int find_raw(void)
{
    static const char *const names[] = {"cuMemAlloc_v2", "cuMemFree_v2", "cuMemCreate",
                                        "cuMemRelease", "cuMemAllocFromPoolAsync",
                                        "cuMemFreeAsync"};
    void *out[6] = {0};
    struct elf_want w = {names, out, 6, 0};
    dl_iterate_phdr(elf_cb, &w);
    for (int k = 0; k < 6; k++)
        if (!out[k]) {
            printf("INFO raw=unavailable missing=%s lib=%s\n", names[k],
                   w.found_lib ? "found" : "not_found");
            return 0;
        }
    g_raw.alloc = (alloc_fn)out[0];
    g_raw.free = (free_fn)out[1];
    g_raw.create = (create_fn)out[2];
    g_raw.release = (release_fn)out[3];
    g_raw.palloc = (palloc_fn)out[4];
    g_raw.pfree = (pfree_fn)out[5];
    return 1;
}

static void find_hooked(void)
{
    g_hooked.alloc = cuMemAlloc_v2;
    g_hooked.free = cuMemFree_v2;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) {
        fprintf(stderr, "gpu_microbench: libcuda.so.1 not loaded\n");
        _exit(3);
    }
    gpa_fn boot = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
    if (!boot) {
        fprintf(stderr, "gpu_microbench: no cuGetProcAddress_v2\n");
        _exit(3);
    }
    void *p = NULL;
    int st = 0;
    CHECK(boot("cuGetProcAddress", &p, 12000, 0, &st));
    gpa_fn gpa = (gpa_fn)p;
    struct {
        const char *base;
        int ver;
        void **slot;
    } want[] = {
        {"cuMemCreate", 10020, (void **)&g_hooked.create},
        {"cuMemRelease", 10020, (void **)&g_hooked.release},
        {"cuMemAllocFromPoolAsync", 11020, (void **)&g_hooked.palloc},
        {"cuMemFreeAsync", 11020, (void **)&g_hooked.pfree},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK(gpa(want[i].base, want[i].slot, want[i].ver, 0, &st));
        if (!*want[i].slot) {
            fprintf(stderr, "gpu_microbench: cuGetProcAddress(%s) gave NULL\n", want[i].base);
            _exit(3);
        }
    }
    dlclose(h);
}

/* ---- one block of pairs on one thread -------------------------------------------------- */

struct job {
    int path;
    int raw;
    long n;
};

static __thread CUstream t_stream;

static void __attribute__((noinline)) loop_drv(const struct fns *f, long n, size_t size, int link)
{
    for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        if (link) {
            CHECK(cuMemAlloc_v2(&p, size));
            CHECK(cuMemFree_v2(p));
        } else {
            CHECK(f->alloc(&p, size));
            CHECK(f->free(p));
        }
    }
}

static void __attribute__((noinline)) loop_pool(const struct fns *f, long n)
{
    for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        CHECK(f->palloc(&p, 4096, g_pool, t_stream));
        CHECK(f->pfree(p, t_stream));
    }
}

static void __attribute__((noinline)) loop_vmm(const struct fns *f, long n)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    for (long i = 0; i < n; i++) {
        CUmemGenericAllocationHandle h;
        CHECK(f->create(&h, g_granule, &prop, 0));
        CHECK(f->release(h));
    }
}

static void __attribute__((noinline)) loop_rt(long n)
{
    for (long i = 0; i < n; i++) {
        void *p;
        CHECK(cudaMalloc(&p, 4096));
        CHECK(cudaFree(p));
    }
}

static void __attribute__((noinline)) loop_rtasync(long n)
{
    for (long i = 0; i < n; i++) {
        void *p;
        CHECK(cudaMallocAsync(&p, 4096, (cudaStream_t)t_stream));
        CHECK(cudaFreeAsync(p, (cudaStream_t)t_stream));
    }
}

static void run_job(const struct job *j)
{
    const struct fns *f = j->raw ? &g_raw : &g_hooked;
    switch (j->path) {
    case P_DRV4K: loop_drv(f, j->n, 4096, !j->raw); break;
    case P_DRV64M: loop_drv(f, j->n, (size_t)64 << 20, !j->raw); break;
    case P_POOL: loop_pool(f, j->n); break;
    case P_VMM: loop_vmm(f, j->n); break;
    case P_RT: loop_rt(j->n); break;
    case P_RTASYNC: loop_rtasync(j->n); break;
    }
    /* stream-ordered frees: finish them inside the block */
    if (j->path == P_POOL || j->path == P_RTASYNC) CHECK(cuStreamSynchronize(t_stream));
}

static volatile int g_sink;
static void __attribute__((noinline)) padded(int d, const struct job *j)
{
    if (d <= 0) run_job(j);
    else padded(d - 1, j);
    g_sink += d;
}

/* ---- threads --------------------------------------------------------------------------- */

static pthread_barrier_t g_start, g_end;
static struct job g_job;
static int g_quit;

static void thread_setup(void)
{
    CHECK(cuCtxSetCurrent(g_ctx));
    CHECK(cudaSetDevice(0));
    CHECK(cuStreamCreate(&t_stream, CU_STREAM_NON_BLOCKING));
}

static void *worker(void *arg)
{
    (void)arg;
    thread_setup();
    pthread_barrier_wait(&g_end); /* set up */
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

static double run_block(int path, int raw, long n)
{
    struct job j = {path, raw, n};
    double t0 = now_ns();
    if (g_threads == 1) {
        padded(g_pad, &j);
    } else {
        g_job = j;
        pthread_barrier_wait(&g_start);
        pthread_barrier_wait(&g_end);
    }
    return (now_ns() - t0) / (double)n;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n)
{
    double c[256];
    if (n > 256) n = 256;
    memcpy(c, v, sizeof(double) * (size_t)n);
    qsort(c, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
}

static double minimum(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++)
        if (v[i] < m) m = v[i];
    return m;
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

typedef struct {
    int32_t device;
    uint32_t reserved0;
    uint64_t total_bytes, cap_bytes, current_bytes, peak_bytes, allocs, frees, failed, denied,
        unknown_frees;
} gg_counters;

int main(int argc, char **argv)
{
    int reps = 4;
    double block_ms = 50;
    const char *paths = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--threads") && v) g_threads = atoi(v), i++;
        else if (!strcmp(a, "--reps") && v) reps = atoi(v), i++;
        else if (!strcmp(a, "--block-ms") && v) block_ms = atof(v), i++;
        else if (!strcmp(a, "--paths") && v) paths = v, i++;
        else if (!strcmp(a, "--pad") && v) g_pad = atoi(v), i++;
        else {
            fprintf(stderr,
                    "usage: %s [--threads T] [--reps R] [--block-ms M] [--paths a,b] [--pad D]\n",
                    argv[0]);
            return 2;
        }
    }
    if (g_threads < 1 || reps < 1 || reps > 256) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);

    double t_init = now_ns();
    CHECK(cuInit(0));
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&g_ctx, dev));
    CHECK(cuCtxSetCurrent(g_ctx));
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(0)); /* runtime initialised on the primary context */
    find_hooked();
    int raw_ok = find_raw();
    CHECK(cuDeviceGetDefaultMemPool(&g_pool, dev));
    {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        size_t g = 0;
        if (cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == 0 && g)
            g_granule = g;
    }
    char name[128] = "?";
    cuDeviceGetName(name, sizeof name, dev);
    for (char *c = name; *c; c++)
        if (*c == ' ') *c = '_';
    printf("INFO paused=%d\n", pause_books());
    int shim = dlsym(RTLD_DEFAULT, "gpuguard_version") != NULL;
    const char *depth = getenv("GPUGUARD_STACK_DEPTH");
    printf("INFO shim=%d stack_depth=%s threads=%d reps=%d block_ms=%.0f pad=%d device=%s "
           "granule=%zu raw=%d init_ms=%.0f\n",
           shim, shim ? (depth ? depth : "default") : "-", g_threads, reps, block_ms, g_pad, name,
           g_granule, raw_ok, (now_ns() - t_init) / 1e6);

    CHECK(cuStreamCreate(&t_stream, CU_STREAM_NON_BLOCKING));
    pthread_t *tids = NULL;
    if (g_threads > 1) {
        pthread_barrier_init(&g_start, NULL, (unsigned)g_threads + 1);
        pthread_barrier_init(&g_end, NULL, (unsigned)g_threads + 1);
        tids = calloc((size_t)g_threads, sizeof *tids);
        for (int t = 0; t < g_threads; t++) pthread_create(&tids[t], NULL, worker, NULL);
        pthread_barrier_wait(&g_end);
    }

    long n_of[NPATHS];
    for (int p = 0; p < NPATHS; p++) {
        n_of[p] = 0;
        if (!want_path(paths, path_names[p])) continue;
        /* warm-up, then calibrate the block to about block_ms of wall time */
        run_block(p, 0, 4);
        if (raw_ok && has_raw[p]) run_block(p, 1, 4);
        long n = 16;
        double ns;
        for (;;) {
            ns = run_block(p, 0, n);
            if (n * ns >= block_ms * 1e6 / 8 || n >= 500000) break;
            n *= 4;
        }
        n = (long)(block_ms * 1e6 / (ns > 1 ? ns : 1));
        if (n < 4) n = 4;
        if (n > 500000) n = 500000;
        n_of[p] = n;
    }

    double hooked[NPATHS][256], raw[NPATHS][256], delta[NPATHS][256];
    for (int r = 0; r < reps; r++) {
        for (int p = 0; p < NPATHS; p++) {
            if (!n_of[p]) continue;
            int with_raw = raw_ok && has_raw[p];
            int first_raw = r % 2;
            for (int k = 0; k < 2; k++) {
                int is_raw = k == 0 ? first_raw : !first_raw;
                if (is_raw && !with_raw) continue;
                double ns = run_block(p, is_raw, n_of[p]);
                if (is_raw) raw[p][r] = ns;
                else hooked[p][r] = ns;
                printf("BLOCK path=%s kind=%s rep=%d threads=%d iters=%ld ns_per_pair=%.1f\n",
                       path_names[p], is_raw ? "raw" : "hooked", r, g_threads, n_of[p], ns);
            }
            delta[p][r] = with_raw ? hooked[p][r] - raw[p][r] : 0;
        }
    }
    for (int p = 0; p < NPATHS; p++) {
        if (!n_of[p]) continue;
        int with_raw = raw_ok && has_raw[p];
        double hm = median(hooked[p], reps);
        char rawbuf[160] = "raw_med=- raw_min=- delta_med=-";
        if (with_raw)
            snprintf(rawbuf, sizeof rawbuf, "raw_med=%.1f raw_min=%.1f delta_med=%.1f",
                     median(raw[p], reps), minimum(raw[p], reps), median(delta[p], reps));
        printf("PATH path=%s threads=%d live=0 iters=%ld hooked_med=%.1f hooked_min=%.1f %s "
               "mpairs_s=%.5f\n",
               path_names[p], g_threads, n_of[p], hm, minimum(hooked[p], reps), rawbuf,
               g_threads * 1e3 / hm);
    }

    int (*counters)(int, gg_counters *) =
        (int (*)(int, gg_counters *))dlsym(RTLD_DEFAULT, "gpuguard_device_counters");
    if (counters) {
        gg_counters c;
        memset(&c, 0, sizeof c);
        if (counters(0, &c) == 0)
            printf("GG allocs=%llu frees=%llu unknown_frees=%llu current=%llu\n",
                   (unsigned long long)c.allocs, (unsigned long long)c.frees,
                   (unsigned long long)c.unknown_frees, (unsigned long long)c.current_bytes);
    }
    if (g_threads > 1) {
        g_quit = 1;
        pthread_barrier_wait(&g_start);
        for (int t = 0; t < g_threads; t++) pthread_join(tids[t], NULL);
    }
    fflush(stdout);
    _exit(0);
}
