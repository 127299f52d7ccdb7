/*
 * gg.c - test program that links the driver (-lcuda) and the runtime
 * (-lcudart), like an application using both APIs. One mode per scenario;
 * see gg_common.h for the output protocol. Usage: gg MODE [args].
 */
#include "gg_common.h"
#include "gg_burst.h"
#include "cudart_sim.h"

#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>

static int ndev(void)
{
    int n = 0;
    MUST(cuDeviceGetCount(&n));
    return n;
}

/* cuInit plus the device's primary context made current on this thread. */
static CUdeviceptr dev_alloc(size_t bytes, int dev)
{
    CUdeviceptr p;
    MUST(cuMemAlloc_v2(&p, bytes));
    alloc_line(p, bytes, dev, "device");
    return p;
}

static void dev_free(CUdeviceptr p)
{
    MUST(cuMemFree_v2(p));
    free_line(p);
}

static void finish(void)
{
    print_gg();
    print_sim();
    puts("OK");
}

/* ---- link: direct calls to the linked driver ---- */
static int mode_link(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    CUdeviceptr a = dev_alloc(1 * MiB, 0);
    CUdeviceptr b = dev_alloc(3 * MiB + 5, 0);
    CUdeviceptr c = dev_alloc(65536, 0);
    MUST(cuMemsetD8_v2(a, 0xab, 1 * MiB)); /* the memory is really usable */

    CUdeviceptr p;
    size_t pitch;
    MUST(cuMemAllocPitch_v2(&p, &pitch, 1000, 100, 4));
    alloc_line(p, pitch * 100, 0, "pitch");

    CUdeviceptr m;
    MUST(cuMemAllocManaged(&m, 2 * MiB, CU_MEM_ATTACH_GLOBAL));
    alloc_line(m, 2 * MiB, 0, "managed");

    /* the legacy 32-bit entry point, a distinct function */
    CUdeviceptr_v1 v1;
    MUST(cuMemAlloc(&v1, 8192));
    alloc_line(v1, 8192, 0, "device");

    int other = ndev() > 1 ? 1 : 0;
    CUcontext c1;
    MUST(cuDevicePrimaryCtxRetain(&c1, other));
    MUST(cuCtxPushCurrent_v2(c1));
    CUdeviceptr d1 = dev_alloc(5 * MiB, other);
    MUST(cuCtxPopCurrent_v2(NULL));
    mid_report("all_live");

    dev_free(a);
    MUST(cuMemFree_v2(p));
    free_line(p);
    MUST(cuMemFree(v1));
    free_line(v1);
    leak_line(b, 3 * MiB + 5);
    leak_line(c, 65536);
    leak_line(m, 2 * MiB);
    leak_line(d1, 5 * MiB);
    finish();
    return 0;
}

/* ---- vmm: physical handles, reserve, map, access, unmap, release ---- */
static int mode_vmm(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g;
    MUST(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));

    CUmemGenericAllocationHandle h1, h2, h3;
    MUST(cuMemCreate(&h1, 2 * g, &prop, 0));
    alloc_line(h1, 2 * g, 0, "vmm");
    MUST(cuMemCreate(&h2, g, &prop, 0));
    alloc_line(h2, g, 0, "vmm");
    int other = ndev() > 1 ? 1 : 0;
    prop.location.id = other;
    MUST(cuMemCreate(&h3, g, &prop, 0)); /* never mapped, leaked */
    alloc_line(h3, g, other, "vmm");

    CUdeviceptr va;
    MUST(cuMemAddressReserve(&va, 4 * g, 0, 0, 0));
    MUST(cuMemMap(va, 2 * g, 0, h1, 0));
    MUST(cuMemMap(va + 2 * g, g, 0, h2, 0));
    printf("MAP 0x%llx 0x%llx\nMAP 0x%llx 0x%llx\n", va, h1, va + 2 * g, h2);
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    MUST(cuMemSetAccess(va, 3 * g, &acc, 1));
    ((volatile char *)(uintptr_t)va)[0] = 1;
    ((volatile char *)(uintptr_t)va)[2 * g] = 2;

    /* Released while mapped: the memory lives until the unmap. */
    MUST(cuMemRelease(h1));
    step("released_while_mapped");
    print_sim();
    MUST(cuMemUnmap(va, 2 * g));
    free_line(h1);
    step("unmapped");
    print_sim();

    MUST(cuMemUnmap(va + 2 * g, g));
    MUST(cuMemRelease(h2));
    free_line(h2);
    MUST(cuMemAddressFree(va, 4 * g));
    leak_line(h3, g);
    step("end");
    finish();
    return 0;
}

/* ---- pool: stream-ordered allocation, default and created pools ---- */
static void pool_line(const char *name, CUmemoryPool p)
{
    cuuint64_t res = 0, used = 0;
    MUST(cuMemPoolGetAttribute(p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res));
    MUST(cuMemPoolGetAttribute(p, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
    printf("POOL %s reserved=%llu used=%llu\n", name, res, used);
}

static int mode_pool(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    CUmemoryPool dp;
    MUST(cuDeviceGetDefaultMemPool(&dp, 0));
    /* keep freed blocks reserved across synchronisations */
    cuuint64_t keep = ~0ULL;
    MUST(cuMemPoolSetAttribute(dp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
    CUstream s;
    MUST(cuStreamCreate(&s, 0));

    CUdeviceptr a, b, c;
    MUST(cuMemAllocAsync(&a, 1 * MiB, s));
    alloc_line(a, 1 * MiB, 0, "pool");
    MUST(cuMemAllocAsync(&b, 3 * MiB, s));
    alloc_line(b, 3 * MiB, 0, "pool");
    MUST(cuMemAllocAsync_ptsz(&c, 100000, CU_STREAM_PER_THREAD));
    alloc_line(c, 100000, 0, "pool");
    MUST(cuMemFreeAsync(a, s));
    free_line(a);
    MUST(cuMemFreeAsync_ptsz(c, CU_STREAM_PER_THREAD));
    free_line(c);
    MUST(cuStreamSynchronize(s));
    step("after_free");
    pool_line("default0", dp);
    print_sim();

    int other = ndev() > 1 ? 1 : 0;
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = other;
    CUmemoryPool mp;
    MUST(cuMemPoolCreate(&mp, &props));
    CUdeviceptr d, e;
    MUST(cuMemAllocFromPoolAsync(&d, 5 * MiB, mp, s));
    alloc_line(d, 5 * MiB, other, "pool");
    MUST(cuMemAllocFromPoolAsync_ptsz(&e, 1 * MiB, mp, CU_STREAM_PER_THREAD));
    alloc_line(e, 1 * MiB, other, "pool");
    MUST(cuMemFreeAsync(e, s));
    free_line(e);

    /* trimming hands the unused reserve back to the devices */
    MUST(cuMemPoolTrimTo(dp, 0));
    MUST(cuMemPoolTrimTo(mp, 0));
    step("after_trim");
    pool_line("default0", dp);
    pool_line("created", mp);
    leak_line(b, 3 * MiB);
    leak_line(d, 5 * MiB);
    step("end");
    finish();
    return 0;
}

/* ---- host: pinned host memory ---- */
static int mode_host(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    void *h1, *h2, *h3;
    MUST(cuMemHostAlloc(&h1, 1 * MiB, 0));
    alloc_line((uintptr_t)h1, 1 * MiB, -1, "host");
    MUST(cuMemAllocHost_v2(&h2, 300000));
    alloc_line((uintptr_t)h2, 300000, -1, "host");
    MUST(cuMemHostAlloc(&h3, 4096, 0x1 /* portable */));
    alloc_line((uintptr_t)h3, 4096, -1, "host");
    memset(h1, 7, 1 * MiB);
    MUST(cuMemFreeHost(h1));
    free_line((uintptr_t)h1);
    leak_line((uintptr_t)h2, 300000);
    leak_line((uintptr_t)h3, 4096);
    finish();
    return 0;
}

/* ---- array: 2D, 1D, 3D and mipmapped arrays ---- */
static int mode_array(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    CUarray a2, a1, a3;
    CUDA_ARRAY_DESCRIPTOR d2 = {256, 256, CU_AD_FORMAT_FLOAT, 4};
    MUST(cuArrayCreate_v2(&a2, &d2));
    alloc_line((uintptr_t)a2, 256ULL * 256 * 4 * 4, 0, "array");
    CUDA_ARRAY_DESCRIPTOR d1 = {1000, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1};
    MUST(cuArrayCreate_v2(&a1, &d1));
    alloc_line((uintptr_t)a1, 1000, 0, "array");
    CUDA_ARRAY3D_DESCRIPTOR d3 = {64, 64, 64, CU_AD_FORMAT_UNSIGNED_INT16, 2, 0};
    MUST(cuArray3DCreate_v2(&a3, &d3));
    alloc_line((uintptr_t)a3, 64ULL * 64 * 64 * 2 * 2, 0, "array");
    /* 4 levels of 256x256 floats: (256^2 + 128^2 + 64^2 + 32^2) * 4 bytes */
    CUmipmappedArray mm;
    CUDA_ARRAY3D_DESCRIPTOR dm = {256, 256, 0, CU_AD_FORMAT_FLOAT, 1, 0};
    MUST(cuMipmappedArrayCreate(&mm, &dm, 4));
    alloc_line((uintptr_t)mm, (65536ULL + 16384 + 4096 + 1024) * 4, 0, "array");

    MUST(cuArrayDestroy(a2));
    free_line((uintptr_t)a2);
    MUST(cuMipmappedArrayDestroy(mm));
    free_line((uintptr_t)mm);
    leak_line((uintptr_t)a1, 1000);
    leak_line((uintptr_t)a3, 64ULL * 64 * 64 * 2 * 2);
    finish();
    return 0;
}

/* ---- teardown: context destruction frees what was allocated in it ---- */
static void alloc_some(int dev, const char *tag)
{
    CUdeviceptr a, m, q;
    size_t pitch;
    MUST(cuMemAlloc_v2(&a, 2 * MiB));
    alloc_line(a, 2 * MiB, dev, "device");
    MUST(cuMemAllocPitch_v2(&a, &pitch, 4000, 10, 4));
    alloc_line(a, pitch * 10, dev, "pitch");
    MUST(cuMemAllocManaged(&m, 1 * MiB, CU_MEM_ATTACH_GLOBAL));
    alloc_line(m, 1 * MiB, dev, "managed");
    MUST(cuMemAllocAsync(&q, 1 * MiB, NULL));
    alloc_line(q, 1 * MiB, dev, "pool");
    void *h;
    MUST(cuMemAllocHost_v2(&h, 65536));
    alloc_line((uintptr_t)h, 65536, -1, "host");
    fprintf(stderr, "allocated the %s set\n", tag);
}

static int mode_teardown(int argc, char **argv)
{
    (void)argc; (void)argv;
    MUST(cuInit(0));
    CUcontext c;
    MUST(cuCtxCreate_v2(&c, 0, 0));
    alloc_some(0, "created context");
    MUST(cuCtxDestroy_v2(c));
    step("ctx_destroy");
    print_gg();
    print_sim();

    CUcontext p;
    MUST(cuDevicePrimaryCtxRetain(&p, 0));
    MUST(cuCtxSetCurrent(p));
    alloc_some(0, "primary context");
    MUST(cuDevicePrimaryCtxReset_v2(0));
    step("primary_reset");
    print_gg();
    print_sim();

    alloc_some(0, "primary context, again");
    MUST(cuDevicePrimaryCtxRelease_v2(0)); /* the last reference: destroys it */
    step("primary_release");
    print_gg();
    print_sim();

    int d = ndev() - 1;
    void *x, *y, *z;
    MUST(cudaSetDevice(d));
    MUST(cudaMalloc(&x, 3 * MiB));
    alloc_line((uintptr_t)x, 3 * MiB, d, "device");
    MUST(cudaMallocManaged(&y, 1 * MiB, cudaMemAttachGlobal));
    alloc_line((uintptr_t)y, 1 * MiB, d, "managed");
    MUST(cudaMallocAsync(&z, 1 * MiB, NULL));
    alloc_line((uintptr_t)z, 1 * MiB, d, "pool");
    MUST(cudaDeviceReset());
    step("device_reset");
    print_gg();
    print_sim();
    puts("OK");
    return 0;
}

/* ---- unknown_free: frees the driver rejects, and one it accepts that an
 * interposer never saw allocated ---- */
static int mode_unknown_free(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    CUdeviceptr a;
    MUST(cuMemAlloc_v2(&a, 1 * MiB));
    rc_line("cuMemFree_v2", cuMemFree_v2(a));
    rc_line("cuMemFree_v2.double", cuMemFree_v2(a));
    rc_line("cuMemFree_v2.bogus", cuMemFree_v2(0xdead0000000ULL));
    rc_line("cuMemFree_v2.null", cuMemFree_v2(0));
    rc_line("cuMemFreeHost.bogus", cuMemFreeHost((void *)0xdead0000000ULL));
    rc_line("cuMemRelease.bogus", cuMemRelease(0xbad));
    rc_line("cuMemFreeAsync.bogus", cuMemFreeAsync(0xdead0000000ULL, NULL));
    rc_line("cuArrayDestroy.bogus", cuArrayDestroy((CUarray)0xdead0000000ULL));
    rc_line("cudaFree.bogus", cudaFree((void *)0xdead0000000ULL));
    int (*untracked)(int, size_t, CUdeviceptr *) =
        (int (*)(int, size_t, CUdeviceptr *))sim_sym("simcuda_untracked_alloc");
    CUdeviceptr u;
    MUST(untracked(0, 1 * MiB, &u));
    rc_line("cuMemFree_v2.untracked", cuMemFree_v2(u));
    finish();
    return 0;
}

/* ---- nullout: NULL out-pointers must come back as INVALID_VALUE ---- */
static int mode_nullout(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    size_t x, pitch;
    rc_line("cuMemAlloc_v2", cuMemAlloc_v2(NULL, 1 * MiB));
    rc_line("cuMemAlloc", cuMemAlloc(NULL, 4096));
    rc_line("cuMemAllocPitch_v2", cuMemAllocPitch_v2(NULL, &pitch, 100, 100, 4));
    rc_line("cuMemAllocManaged", cuMemAllocManaged(NULL, 4096, CU_MEM_ATTACH_GLOBAL));
    rc_line("cuMemCreate", cuMemCreate(NULL, 2 * MiB, &prop, 0));
    rc_line("cuMemAllocAsync", cuMemAllocAsync(NULL, 4096, NULL));
    rc_line("cuMemHostAlloc", cuMemHostAlloc(NULL, 4096, 0));
    rc_line("cuMemGetInfo_v2", cuMemGetInfo_v2(NULL, NULL));
    rc_line("cuMemGetInfo_v2.free_null", cuMemGetInfo_v2(NULL, &x));
    rc_line("cuMemGetInfo_v2.total_null", cuMemGetInfo_v2(&x, NULL));
    rc_line("cudaMalloc", cudaMalloc(NULL, 4096));
    finish();
    return 0;
}

/* ---- fail: injected OUT_OF_MEMORY; nothing must be recorded ---- */
static int mode_fail(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    /* SIMCUDA_FAIL_NEXT in the environment does the same at init */
    if (!getenv("SIMCUDA_FAIL_NEXT")) simcuda_fail_next(4);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUdeviceptr p = 0x5e5e5e5eULL; /* must stay untouched */
    CUmemGenericAllocationHandle h = 0x5e5e5e5eULL;
    void *v = (void *)0x5e5e5e5eULL;
    rc_line("cuMemAlloc_v2", cuMemAlloc_v2(&p, 1 * MiB));
    rc_line("cuMemCreate", cuMemCreate(&h, 2 * MiB, &prop, 0));
    rc_line("cuMemAllocAsync", cuMemAllocAsync(&p, 1 * MiB, NULL));
    rc_line("cudaMalloc", cudaMalloc(&v, 1 * MiB));
    printf("UNTOUCHED %d\n", p == 0x5e5e5e5eULL && h == 0x5e5e5e5eULL && v == (void *)0x5e5e5e5eULL);
    CUdeviceptr ok = dev_alloc(1 * MiB, 0); /* the fifth works again */
    dev_free(ok);
    finish();
    return 0;
}

/* ---- oom [chunk]: allocate until the device is full ---- */
static int mode_oom(int argc, char **argv)
{
    size_t chunk = argc > 1 ? strtoull(argv[1], NULL, 0) : 64 * MiB;
    gg_setup(0);
    size_t cap = 4096, n = 0;
    CUdeviceptr *ps = malloc(cap * sizeof *ps);
    int rc;
    for (;;) {
        if (n == cap) ps = realloc(ps, (cap *= 2) * sizeof *ps);
        rc = cuMemAlloc_v2(&ps[n], chunk);
        if (rc != CUDA_SUCCESS) break;
        n++;
    }
    printf("OOMAT %zu %llu\n", n, (unsigned long long)n * chunk);
    rc_line("cuMemAlloc_v2", rc);
    step("full");
    print_gg();
    print_sim();
    for (size_t i = 0; i < n; i++) MUST(cuMemFree_v2(ps[i]));
    free(ps);
    step("end");
    finish();
    return 0;
}

/* ---- leak K: K allocations leaked from a recognisable function ---- */
__attribute__((noinline, noclone)) void leaky_function(int k)
{
    for (int i = 0; i < k; i++) {
        CUdeviceptr p;
        size_t bytes = (size_t)(i + 1) * MiB;
        MUST(cuMemAlloc_v2(&p, bytes));
        alloc_line(p, bytes, 0, "device");
        leak_line(p, bytes);
    }
    __asm__ volatile("" ::: "memory"); /* keeps the frame a real call */
}

static int mode_leak(int argc, char **argv)
{
    int k = argc > 1 ? atoi(argv[1]) : 3;
    gg_setup(0);
    leaky_function(k);
    finish();
    return 0;
}

/* ---- snapshots K [N]: K steps of a training loop (run with GPUGUARD_SNAPSHOT_EVERY),
 * on 256 MiB of weights kept throughout. Each step makes temporaries, forgets an 8 MiB
 * cache (remember_batch_stats), frees the temporaries, then waits until N (default 2)
 * more snapshot reports are in the folder: the second was begun after the first was
 * in place, so after the step's leak, and before the next step. So for each step k
 * there is a snapshot holding the weights and exactly k caches, whatever the timing,
 * and the leak steps once every N snapshots or more; snapshots taken during a step
 * may also hold its temporaries. ---- */
__attribute__((noinline, noclone)) CUdeviceptr remember_batch_stats(size_t bytes)
{
    CUdeviceptr p;
    MUST(cuMemAlloc_v2(&p, bytes));
    __asm__ volatile("" ::: "memory");
    return p;
}

static int mode_snapshots(int argc, char **argv)
{
    int k = argc > 1 ? atoi(argv[1]) : 3;
    int per = argc > 2 ? atoi(argv[2]) : 2;
    if (per < 2) per = 2;
    gg_setup(0);
    CUdeviceptr weights = dev_alloc(256 * MiB, 0);
    for (int s = 1; s <= k; s++) {
        CUdeviceptr grads = dev_alloc(192 * MiB, 0);
        CUdeviceptr acts = dev_alloc(64 * MiB, 0);
        CUdeviceptr cache = remember_batch_stats(8 * MiB);
        alloc_line(cache, 8 * MiB, 0, "device");
        leak_line(cache, 8 * MiB);
        dev_free(acts);
        dev_free(grads);
        int have = count_reports(".snapshot.json");
        printf("STEP_DONE step=%d waited=%d\n", s, wait_reports(".snapshot.json", have + per));
    }
    dev_free(weights);
    finish();
    return 0;
}

/* ---- burst MS: 4 KiB allocations kept, as fast as the program can for MS
 * milliseconds, from one function (`burst_for`): past GPUGUARD_STACK_RATE only some
 * get a stack ---- */
static int mode_burst(int argc, char **argv)
{
    long ms = argc > 1 ? atol(argv[1]) : 300;
    gg_setup(0);
    int n = burst_for(ms);
    if (n < 0) return 1;
    printf("BURST n=%d\n", n);
    finish();
    return 0;
}

/* ---- kept_among N K: N allocations of 64 KiB as fast as the program can, each
 * freed at once (a temporary) except every K-th, which `keep_step` keeps (a tensor
 * kept per step); half-way, one of 64 MiB kept by `keep_once`. Prints how many were
 * kept: KEPT n=<count>. Past GPUGUARD_STACK_RATE only some get a stack. ---- */
__attribute__((noinline, noclone)) CUdeviceptr keep_step(size_t bytes)
{
    CUdeviceptr p;
    MUST(cuMemAlloc_v2(&p, bytes));
    __asm__ volatile("" ::: "memory");
    return p;
}

__attribute__((noinline, noclone)) CUdeviceptr keep_once(size_t bytes)
{
    CUdeviceptr p;
    MUST(cuMemAlloc_v2(&p, bytes));
    __asm__ volatile("" ::: "memory");
    return p;
}

__attribute__((noinline, noclone)) void temporary(size_t bytes)
{
    CUdeviceptr p;
    MUST(cuMemAlloc_v2(&p, bytes));
    MUST(cuMemFree_v2(p));
}

static int mode_kept_among(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100000;
    long k = argc > 2 ? atol(argv[2]) : 100;
    gg_setup(0);
    long kept = 0;
    for (long i = 1; i <= n; i++) {
        if (i == n / 2) keep_once(64 * MiB);
        if (i % k == 0) {
            keep_step(64 << 10);
            kept++;
        } else {
            temporary(64 << 10);
        }
    }
    printf("KEPT n=%ld\n", kept);
    finish();
    return 0;
}

/* ---- twins N: N allocations each from two functions alike, called in turn from one
 * loop, so the runtime hook finds the same stack depth for both (one capture hint's
 * key): each keeps its own site ---- */
__attribute__((noinline, noclone)) void *twin_a(size_t bytes)
{
    void *p = NULL;
    MUST(cudaMalloc(&p, bytes));
    __asm__ volatile("" ::: "memory");
    return p;
}

__attribute__((noinline, noclone)) void *twin_b(size_t bytes)
{
    void *p = NULL;
    MUST(cudaMalloc(&p, bytes));
    __asm__ volatile("" ::: "memory");
    return p;
}

static int mode_twins(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 4;
    gg_setup(0);
    for (int i = 0; i < 2 * n; i++) {
        void *p = (i & 1) ? twin_b(MiB) : twin_a(2 * MiB);
        alloc_line((uintptr_t)p, (i & 1) ? MiB : 2 * MiB, 0, "device");
    }
    finish();
    return 0;
}

/* ---- threads N ITERS: concurrent allocation through every path ---- */
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
static alloc_fn g_dl_alloc, g_gpa_alloc;
static free_fn g_dl_free, g_gpa_free;
static int g_iters;

enum { P_LINK, P_DLSYM, P_PROCADDR, P_RUNTIME, P_POOL, P_MANAGED, P_COUNT };

struct slot { CUdeviceptr p; int path; };

static void path_alloc(struct slot *s, size_t bytes)
{
    void *v;
    switch (s->path) {
    case P_LINK: MUST(cuMemAlloc_v2(&s->p, bytes)); break;
    case P_DLSYM: MUST(g_dl_alloc(&s->p, bytes)); break;
    case P_PROCADDR: MUST(g_gpa_alloc(&s->p, bytes)); break;
    case P_RUNTIME: MUST(cudaMalloc(&v, bytes)); s->p = (uintptr_t)v; break;
    case P_POOL: MUST(cuMemAllocAsync(&s->p, bytes, NULL)); break;
    case P_MANAGED: MUST(cuMemAllocManaged(&s->p, bytes, CU_MEM_ATTACH_GLOBAL)); break;
    }
}

static void path_free(struct slot *s)
{
    switch (s->path) {
    case P_LINK: case P_MANAGED: MUST(cuMemFree_v2(s->p)); break;
    case P_DLSYM: MUST(g_dl_free(s->p)); break;
    case P_PROCADDR: MUST(g_gpa_free(s->p)); break;
    case P_RUNTIME: MUST(cudaFree((void *)(uintptr_t)s->p)); break;
    case P_POOL: MUST(cuMemFreeAsync(s->p, NULL)); break;
    }
    s->p = 0;
}

static void *thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    MUST(cudaSetDevice(t % ndev())); /* primary context of that device, current here */
    struct slot ring[8] = {{0, 0}};
    unsigned x = 2463534242u + (unsigned)t * 7919u;
    for (int i = 0; i < g_iters; i++) {
        struct slot *s = &ring[i % 8];
        if (s->p) path_free(s);
        x ^= x << 13; x ^= x >> 17; x ^= x << 5; /* xorshift: cheap, reproducible */
        s->path = (int)((t + i) % P_COUNT);
        path_alloc(s, ((size_t)(x % 64) + 1) * 4096 + x % 100);
    }
    for (int i = 0; i < 8; i++)
        if (ring[i].p) path_free(&ring[i]);
    return NULL;
}

static int mode_threads(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 8;
    g_iters = argc > 2 ? atoi(argv[2]) : 1000;
    gg_setup(0);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    g_dl_alloc = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
    g_dl_free = (free_fn)dlsym(h, "cuMemFree_v2");
    PFN_cuGetProcAddress_v2 gpa = (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2");
    MUST(gpa("cuMemAlloc", (void **)&g_gpa_alloc, 12000, 0, NULL));
    MUST(gpa("cuMemFree", (void **)&g_gpa_free, 12000, 0, NULL));
    pthread_t *th = calloc((size_t)n, sizeof *th);
    for (int t = 0; t < n; t++) MUST(pthread_create(&th[t], NULL, thread_main, (void *)(intptr_t)t));
    for (int t = 0; t < n; t++) pthread_join(th[t], NULL);
    free(th);
    /* pools keep freed blocks reserved: give them back before comparing */
    for (int d = 0; d < ndev(); d++) {
        CUmemoryPool p;
        MUST(cuDeviceGetDefaultMemPool(&p, d));
        MUST(cuMemPoolTrimTo(p, 0));
    }
    printf("THREADS n=%d iters=%d allocs=%lld\n", n, g_iters, (long long)n * g_iters);
    finish();
    return 0;
}

/* ---- short [n]: n threads one after another, each keeping one allocation and
 * freeing another before it ends, then one more allocation on the main thread: what
 * a thread recorded must outlive it (its journal, applied after it ended; the next
 * thread takes the journal over) ---- */
static void *short_main(void *arg)
{
    (void)arg;
    MUST(cudaSetDevice(0));
    CUdeviceptr tmp = dev_alloc(4096, 0);
    dev_alloc(65536 + 512 * (size_t)(intptr_t)arg, 0);
    dev_free(tmp);
    return NULL;
}

static int mode_short(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 50;
    gg_setup(0);
    for (int t = 0; t < n; t++) {
        pthread_t th;
        MUST(pthread_create(&th, NULL, short_main, (void *)(intptr_t)t));
        pthread_join(th, NULL);
    }
    dev_alloc(3 * MiB, 0);
    printf("SHORT n=%d\n", n);
    finish();
    return 0;
}

/* ---- fork [leak]: children with and without CUDA; with "leak" the parent
 * also leaks one allocation made before the forks and one made after ---- */
static int mode_fork(int argc, char **argv)
{
    int leak = argc > 1 && strcmp(argv[1], "leak") == 0;
    gg_setup(0);
    CUdeviceptr a = dev_alloc(2 * MiB, 0);
    CUdeviceptr before = leak ? dev_alloc(3 * MiB, 0) : 0;
    fflush(stdout); /* nothing buffered may be written twice */
    pid_t nocuda = fork();
    if (nocuda == 0) exit(0);
    pid_t cuda = fork();
    if (cuda == 0) {
        CUdeviceptr p;
        MUST(cuMemAlloc_v2(&p, 1 * MiB)); /* leaked when the child exits */
        printf("CHILD_ALLOC 0x%llx %llu\n", p, 1 * MiB);
        fflush(stdout);
        exit(0);
    }
    int st;
    waitpid(nocuda, &st, 0);
    waitpid(cuda, &st, 0);
    printf("CHILD %d nocuda\nCHILD %d cuda\n", (int)nocuda, (int)cuda);
    dev_free(a);
    if (leak) {
        CUdeviceptr after = dev_alloc(512 * 1024, 0);
        leak_line(before, 3 * MiB);
        leak_line(after, 512 * 1024);
    }
    finish();
    return 0;
}

/* pool_trim [SIGNUM]: a pool keeps 8 MiB of freed blocks; SIGNUM (default SIGUSR2)
 * asks gpuguard to trim; the pool is read before and after. No Python here. */
static int mode_pool_trim(int argc, char **argv)
{
    int sig = argc > 1 ? atoi(argv[1]) : SIGUSR2;
    gg_setup(0);
    CUmemoryPool dp;
    MUST(cuDeviceGetDefaultMemPool(&dp, 0));
    cuuint64_t keep = ~0ULL;
    MUST(cuMemPoolSetAttribute(dp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
    CUstream s;
    MUST(cuStreamCreate(&s, 0));
    CUdeviceptr a, b;
    MUST(cuMemAllocAsync(&a, 8 * MiB, s));
    MUST(cuMemAllocAsync(&b, 1 * MiB, s));
    alloc_line(b, 1 * MiB, 0, "pool");
    MUST(cuMemFreeAsync(a, s));
    MUST(cuStreamSynchronize(s));
    step("before");
    pool_line("default", dp);
    int trims = count_reports(".trim.json");
    raise(sig);
    wait_reports(".trim.json", trims + 1); /* the trim is done when its report is there */
    step("after");
    pool_line("default", dp);
    leak_line(b, 1 * MiB);
    finish();
    return 0;
}

/* ---- signals ---- */
/* signal_after [SIGNUM]: raises SIGNUM (default SIGUSR1) after CUDA started */
static int mode_signal_after(int argc, char **argv)
{
    int sig = argc > 1 ? atoi(argv[1]) : SIGUSR1;
    gg_setup(0);
    CUdeviceptr a = dev_alloc(1 * MiB, 0);
    leak_line(a, 1 * MiB);
    int reports = count_reports(".signal.json");
    raise(sig);
    wait_reports(".signal.json", reports + 1); /* the report the signal asked for */
    puts("OK");
    return 0;
}

static volatile sig_atomic_t g_handled;

static void own_handler(int sig)
{
    (void)sig;
    static const char msg[] = "HANDLER\n";
    g_handled++;
    ssize_t r = write(2, msg, sizeof msg - 1); /* async-signal-safe */
    (void)r;
}

static void install_own_handler(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = own_handler;
    sigemptyset(&sa.sa_mask);
    MUST(sigaction(SIGUSR1, &sa, NULL));
}

/* The program's handler, installed before any CUDA call, must keep getting
 * SIGUSR1 after CUDA starts. */
static int mode_own_handler(int argc, char **argv)
{
    (void)argc; (void)argv;
    install_own_handler();
    raise(SIGUSR1);
    gg_setup(0);
    CUdeviceptr a = dev_alloc(1 * MiB, 0);
    int reports = count_reports(".signal.json");
    raise(SIGUSR1);
    wait_reports(".signal.json", reports + 1); /* as in signal_after */
    dev_free(a);
    printf("RAISED 2\nHANDLED %d\n", (int)g_handled);
    puts("OK");
    return 0;
}

static int mode_own_handler_after(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    CUdeviceptr a = dev_alloc(1 * MiB, 0);
    install_own_handler();
    raise(SIGUSR1);
    raise(SIGUSR1);
    dev_free(a);
    printf("RAISED 2\nHANDLED %d\n", (int)g_handled);
    puts("OK");
    return 0;
}

/* storm: 2000 SIGUSR1 while another thread allocates and frees */
static volatile int g_stop;
static long g_storm_allocs;

static void *storm_worker(void *arg)
{
    CUcontext c = arg;
    MUST(cuCtxSetCurrent(c));
    while (!__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) {
        CUdeviceptr p;
        MUST(cuMemAlloc_v2(&p, 65536));
        MUST(cuMemFree_v2(p));
        __atomic_add_fetch(&g_storm_allocs, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static int mode_storm(int argc, char **argv)
{
    (void)argc; (void)argv;
    CUcontext c = gg_setup(0);
    pthread_t th;
    MUST(pthread_create(&th, NULL, storm_worker, c));
    /* The worker's first allocation activates gpuguard: report signals before any
     * CUDA call gpuguard tracks ask for nothing, by design. */
    while (__atomic_load_n(&g_storm_allocs, __ATOMIC_RELAXED) == 0) sched_yield();
    for (int i = 0; i < 2000; i++) kill(getpid(), SIGUSR1);
    /* The worker goes on allocating while the reports the storm asked for are written. */
    wait_reports(".signal.json", 1);
    __atomic_store_n(&g_stop, 1, __ATOMIC_RELAXED);
    pthread_join(th, NULL);
    printf("STORM sent=2000 allocs=%ld\n", __atomic_load_n(&g_storm_allocs, __ATOMIC_RELAXED));
    finish();
    return 0;
}

/* ---- report_request: asks gpuguard for a report file ---- */
static int mode_report_request(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    CUdeviceptr a = dev_alloc(1 * MiB, 0);
    leak_line(a, 1 * MiB);
    gg_report_fn wr = (gg_report_fn)dlsym(RTLD_DEFAULT, "gpuguard_write_report");
    if (!wr) {
        puts("GG absent");
    } else {
        char path[4096] = "";
        int rc = wr("request", path, sizeof path);
        rc_line("gpuguard_write_report", rc);
        if (rc == 0) printf("REPORT %s\n", path);
    }
    puts("OK");
    return 0;
}

/* Raises the report signal and waits for the signal report it asks for. */
static void signal_report(void)
{
    int reports = count_reports(".signal.json");
    raise(SIGUSR1);
    wait_reports(".signal.json", reports + 1);
}

/* ---- quiet [ask]: CUDA initialized and asked about memory, nothing allocated (a
 * framework's compile worker). ask: "signal": three report signals, each report
 * waited for; the second one at least 2 ms after the first report (a helper thread
 * that answered it has run past a 1 ms GPUGUARD_SNAPSHOT_EVERY once it answers
 * the third). "request": gpuguard_write_report. "refused": one allocation, of
 * 2 GiB (run with a smaller cap) ---- */
static int mode_quiet(int argc, char **argv)
{
    const char *ask = argc > 1 ? argv[1] : "";
    gg_setup(0);
    size_t free_b = 0, total_b = 0;
    MUST(cuMemGetInfo_v2(&free_b, &total_b));
    printf("MEMINFO %zu %zu\n", free_b, total_b);
    if (strcmp(ask, "signal") == 0) {
        signal_report();
        /* Not a handshake and not replaceable by one: what the test needs here is
         * time itself, a 1 ms GPUGUARD_SNAPSHOT_EVERY interval past for certain, so
         * that the rounds answering the next two signals find a snapshot due (and
         * must not write it: nothing was allocated). The loop reads the clock until
         * 2 ms have passed; it guesses nothing about another thread. */
        long long first = mono_ms();
        while (mono_ms() < first + 2) sleep_ms(1);
        signal_report();
        signal_report();
    } else if (strcmp(ask, "request") == 0) {
        gg_report_fn wr = (gg_report_fn)dlsym(RTLD_DEFAULT, "gpuguard_write_report");
        char path[4096] = "";
        int rc = wr ? wr(NULL, path, sizeof path) : -2;
        rc_line("gpuguard_write_report", rc);
        printf("REPORT %s\n", path);
    } else if (strcmp(ask, "refused") == 0) {
        CUdeviceptr p;
        rc_line("refused", cuMemAlloc_v2(&p, 2048 * MiB));
    }
    puts("OK");
    return 0;
}

/* ---- capi: gpuguard_device_counters around the device count ----
 * CAPI <phase> <device> <rc> for devices -1, 0, n-1, n, n+1 and 63, before any
 * CUDA call and after cuInit and one allocation; n = the sim's device count. */
static void capi_lines(const char *phase, gg_counters_fn counters)
{
    int n = sim_devices();
    int devs[] = {-1, 0, n - 1, n, n + 1, 63};
    for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++) {
        gpuguard_device_counters c;
        memset(&c, 0, sizeof c);
        printf("CAPI %s %d %d\n", phase, devs[i], counters(devs[i], &c));
    }
}

static int mode_capi(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_counters_fn counters = (gg_counters_fn)dlsym(RTLD_DEFAULT, "gpuguard_device_counters");
    if (!counters) {
        puts("GG absent");
        puts("OK");
        return 0;
    }
    capi_lines("before", counters);
    gg_setup(0);
    CUdeviceptr a = dev_alloc(1 * MiB, 0);
    capi_lines("after", counters);
    dev_free(a);
    finish();
    return 0;
}

static int mode_nocuda_(int argc, char **argv) { (void)argc; (void)argv; return mode_nocuda(); }
static int mode_signal_before_(int argc, char **argv) { (void)argc; (void)argv; return mode_signal_before(); }

/* ---- sigalloc N: allocations made by a signal handler that interrupts hooks ----
 * The main thread loops cuMemAlloc_v2 + cuMemFree_v2 (run with SIMCUDA_FREE_DELAY_MS
 * so it spends its time inside the free hook's real call, and SIMCUDA_SIGSAFE so the
 * sim may be called from a handler); a second thread sends SIGALRM to it in a loop.
 * The handler allocates (and every fourth time frees the newest of its own), keeping
 * N allocations in the end: those are the program's LEAK lines. */
#define SIG_KEEP_MAX 4096
static CUdeviceptr g_sig_kept[SIG_KEEP_MAX];
static size_t g_sig_kept_bytes[SIG_KEEP_MAX];
static volatile sig_atomic_t g_sig_nkept, g_sig_runs, g_sig_fails, g_sig_stop;
static int g_sig_target;
static pthread_t g_sig_main;

static void sig_alloc_handler(int sig)
{
    (void)sig;
    int saved = errno;
    int n = g_sig_runs++;
    if (g_sig_nkept < g_sig_target) {
        if (n % 4 == 3 && g_sig_nkept > 0) {
            int i = g_sig_nkept - 1;
            if (cuMemFree_v2(g_sig_kept[i]) == CUDA_SUCCESS) g_sig_nkept = i;
            else g_sig_fails++;
        } else {
            size_t bytes = 4096 * (size_t)(1 + n % 7) + (size_t)(n % 13);
            CUdeviceptr p;
            if (cuMemAlloc_v2(&p, bytes) == CUDA_SUCCESS) {
                g_sig_kept[g_sig_nkept] = p;
                g_sig_kept_bytes[g_sig_nkept] = bytes;
                g_sig_nkept++;
            } else {
                g_sig_fails++;
            }
        }
    }
    errno = saved;
}

static void *sig_sender(void *arg)
{
    (void)arg;
    while (!g_sig_stop) {
        pthread_kill(g_sig_main, SIGALRM);
        usleep(200); /* the storm's pace, not a wait for anything */
    }
    return NULL;
}

static int mode_sigalloc(int argc, char **argv)
{
    g_sig_target = argc > 1 ? atoi(argv[1]) : 200;
    if (g_sig_target < 1 || g_sig_target > SIG_KEEP_MAX) g_sig_target = 200;
    gg_setup(0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = sig_alloc_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    g_sig_main = pthread_self();
    pthread_t th;
    if (pthread_create(&th, NULL, sig_sender, NULL) != 0) return 2;
    long iters = 0;
    while (g_sig_nkept < g_sig_target && g_sig_fails == 0) {
        CUdeviceptr p;
        MUST(cuMemAlloc_v2(&p, 65536));
        MUST(cuMemFree_v2(p));
        iters++;
    }
    g_sig_stop = 1;
    pthread_join(th, NULL);
    signal(SIGALRM, SIG_IGN);
    printf("SIGALLOC runs=%d kept=%d fails=%d iters=%ld\n", (int)g_sig_runs,
           (int)g_sig_nkept, (int)g_sig_fails, iters);
    for (int i = 0; i < g_sig_nkept; i++) leak_line(g_sig_kept[i], g_sig_kept_bytes[i]);
    finish();
    return 0;
}

static const struct gg_mode g_modes[] = {
    {"link", mode_link},
    {"vmm", mode_vmm},
    {"pool", mode_pool},
    {"pool_trim", mode_pool_trim},
    {"host", mode_host},
    {"array", mode_array},
    {"teardown", mode_teardown},
    {"unknown_free", mode_unknown_free},
    {"nullout", mode_nullout},
    {"fail", mode_fail},
    {"oom", mode_oom},
    {"leak", mode_leak},
    {"twins", mode_twins},
    {"burst", mode_burst},
    {"kept_among", mode_kept_among},
    {"snapshots", mode_snapshots},
    {"threads", mode_threads},
    {"short", mode_short},
    {"fork", mode_fork},
    {"signal_before", mode_signal_before_},
    {"signal_after", mode_signal_after},
    {"own_handler", mode_own_handler},
    {"own_handler_after", mode_own_handler_after},
    {"storm", mode_storm},
    {"report_request", mode_report_request},
    {"quiet", mode_quiet},
    {"capi", mode_capi},
    {"sigalloc", mode_sigalloc},
    {"nocuda", mode_nocuda_},
    {NULL, NULL},
};

int main(int argc, char **argv) { return gg_dispatch(g_modes, argc, argv); }
