/*
 * gg_cap.c - test program for memory caps (GPUGUARD_CAP and friends). Links the
 * driver, the runtime and NVML, like a framework process; one mode per scenario.
 * Usage: gg_cap MODE [args]; see gg_common.h for the output protocol. Extra lines:
 *   DENY path=<p> rc= kept= live0= live1= count0= count1= pool0= pool1=
 *        denied0= denied1= allocs0= allocs1= current0= current1=
 *                        a call asked for more than the cap leaves: its code, whether
 *                        its out-pointer kept the sentinel, the sim's books (live,
 *                        count, pool reserve on device 0) and gpuguard's counters
 *                        before (0) and after (1)
 *   FIT path=<p> rc= live0= live1=          the same call asking for what fits
 *   HOST api=<a> rc= denied0= denied1=      pinned host memory past the cap
 *   MEMINFO / RTMEMINFO dev= rc= free= total=   cuMemGetInfo_v2 / cudaMemGetInfo
 *   SIMREAL dev= free= total=               the sim's own free and total
 *   TOTALMEM dev= rc= bytes=                cuDeviceTotalMem_v2
 *   SIMMEM bytes=                           the sim's memory per device
 *   SIMPEAK dev= peak=                      the sim's high-water mark of live bytes
 *   CUUUID dev= uuid=                       cuDeviceGetUuid_v2, in NVML's text form
 *   NVMLREAL idx= total= reserved= used=    the sim NVML's books for index idx
 *   NVML1 path= idx= uuid= rc= total= free= used=            nvmlDeviceGetMemoryInfo
 *   NVML2 path= idx= uuid= rc= total= reserved= free= used=  ..._v2
 *   GATE held=<0|1>                         whether gpuguard's helper thread was held
 *                                           in the sim's gate (refuse_then_free, oom_fill)
 *   OOM path= blocks= rc= storm_other= reports_while_held=
 *                                           oom_fill: blocks taken before the driver
 *                                           refused, its code, storm refusals that
 *                                           were not OUT_OF_MEMORY, and oom reports
 *                                           written while the helper was held
 *   HELD                                    oom_hold holds its memory
 *   RETRY rc=                               oom_retry: the refused call's code, after
 *                                           gpuguard's retry under GPUGUARD_OOM_TRIM
 * MARK <name> lines go to stderr, so gpuguard's own lines can be placed among them.
 */
#include "gg_common.h"
#include "cudart_sim.h"
#include "nvml_sim.h"

#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>

#define SENTINEL 0x5e5e5e5e5e5e5e5eULL
#define SENTINEL32 0x5e5e5e5eu

static int ndev(void)
{
    int n = 0;
    MUST(cuDeviceGetCount(&n));
    return n;
}

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

/* gpuguard's counters of `dev`, zeros without gpuguard. */
static gpuguard_device_counters gg_of(int dev)
{
    gpuguard_device_counters c;
    memset(&c, 0, sizeof c);
    gg_counters_fn f = (gg_counters_fn)dlsym(RTLD_DEFAULT, "gpuguard_device_counters");
    if (f) f(dev, &c);
    return c;
}

static void simpeak_line(int dev)
{
    printf("SIMPEAK dev=%d peak=%llu\n", dev, simcuda_live_peak(dev));
}

static void finish(void)
{
    print_gg();
    print_sim();
    puts("OK");
}

static void mark(const char *name)
{
    fflush(stdout);
    fprintf(stderr, "MARK %s\n", name);
}

/* ---- probe DEV...: cuDeviceTotalMem_v2 of each device, then the counters ---- */
static int mode_probe(int argc, char **argv)
{
    MUST(cuInit(0));
    for (int i = 1; i < argc; i++) {
        int d = atoi(argv[i]);
        size_t b = 0;
        int rc = cuDeviceTotalMem_v2(&b, d);
        printf("TOTALMEM dev=%d rc=%d bytes=%zu\n", d, rc, b);
    }
    printf("SIMMEM bytes=%llu\n", simcuda_mem());
    finish();
    return 0;
}

/* ---- paths CAP_MIB: every allocation path against a cap on device 0 ---- */
static CUstream g_stream;
static CUmemoryPool g_pool; /* a created pool on device 0 */
static CUresult (*g_dl_alloc)(CUdeviceptr *, size_t);
static CUresult (*g_gpa_alloc)(CUdeviceptr *, size_t);

typedef int (*try_fn)(size_t bytes, unsigned long long *h, int *kept);
typedef int (*release_fn)(unsigned long long h);

static int t_alloc_v2(size_t b, unsigned long long *h, int *kept)
{
    CUdeviceptr p = SENTINEL;
    int rc = cuMemAlloc_v2(&p, b);
    *kept = p == SENTINEL;
    *h = p;
    return rc;
}

static int t_alloc_v1(size_t b, unsigned long long *h, int *kept)
{
    CUdeviceptr_v1 p = SENTINEL32;
    int rc = cuMemAlloc(&p, (unsigned)b);
    *kept = p == SENTINEL32;
    *h = p;
    return rc;
}

static int t_dlsym(size_t b, unsigned long long *h, int *kept)
{
    CUdeviceptr p = SENTINEL;
    int rc = g_dl_alloc(&p, b);
    *kept = p == SENTINEL;
    *h = p;
    return rc;
}

static int t_procaddr(size_t b, unsigned long long *h, int *kept)
{
    CUdeviceptr p = SENTINEL;
    int rc = g_gpa_alloc(&p, b);
    *kept = p == SENTINEL;
    *h = p;
    return rc;
}

static int t_pitch(size_t b, unsigned long long *h, int *kept)
{
    CUdeviceptr p = SENTINEL;
    size_t pitch = SENTINEL;
    int rc = cuMemAllocPitch_v2(&p, &pitch, MiB, b / MiB, 4);
    *kept = p == SENTINEL && pitch == SENTINEL;
    *h = p;
    return rc;
}

static int t_managed(size_t b, unsigned long long *h, int *kept)
{
    CUdeviceptr p = SENTINEL;
    int rc = cuMemAllocManaged(&p, b, CU_MEM_ATTACH_GLOBAL);
    *kept = p == SENTINEL;
    *h = p;
    return rc;
}

static int t_vmm(size_t b, unsigned long long *h, int *kept)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle m = SENTINEL;
    int rc = cuMemCreate(&m, b, &prop, 0);
    *kept = m == SENTINEL;
    *h = m;
    return rc;
}

static int t_async(size_t b, unsigned long long *h, int *kept)
{
    CUdeviceptr p = SENTINEL;
    int rc = cuMemAllocAsync(&p, b, g_stream);
    *kept = p == SENTINEL;
    *h = p;
    return rc;
}

static int t_async_ptsz(size_t b, unsigned long long *h, int *kept)
{
    CUdeviceptr p = SENTINEL;
    int rc = cuMemAllocAsync_ptsz(&p, b, CU_STREAM_PER_THREAD);
    *kept = p == SENTINEL;
    *h = p;
    return rc;
}

static int t_from_pool(size_t b, unsigned long long *h, int *kept)
{
    CUdeviceptr p = SENTINEL;
    int rc = cuMemAllocFromPoolAsync(&p, b, g_pool, g_stream);
    *kept = p == SENTINEL;
    *h = p;
    return rc;
}

static int t_from_pool_ptsz(size_t b, unsigned long long *h, int *kept)
{
    CUdeviceptr p = SENTINEL;
    int rc = cuMemAllocFromPoolAsync_ptsz(&p, b, g_pool, CU_STREAM_PER_THREAD);
    *kept = p == SENTINEL;
    *h = p;
    return rc;
}

/* arrays of 4-channel bytes: 4 KiB per row of 1024 */
static int t_array(size_t b, unsigned long long *h, int *kept)
{
    CUDA_ARRAY_DESCRIPTOR d = {1024, b / 4096, CU_AD_FORMAT_UNSIGNED_INT8, 4};
    CUarray a = (CUarray)(uintptr_t)SENTINEL;
    int rc = cuArrayCreate_v2(&a, &d);
    *kept = (uintptr_t)a == SENTINEL;
    *h = (uintptr_t)a;
    return rc;
}

static int t_array3d(size_t b, unsigned long long *h, int *kept)
{
    CUDA_ARRAY3D_DESCRIPTOR d = {1024, b / 8192, 2, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0};
    CUarray a = (CUarray)(uintptr_t)SENTINEL;
    int rc = cuArray3DCreate_v2(&a, &d);
    *kept = (uintptr_t)a == SENTINEL;
    *h = (uintptr_t)a;
    return rc;
}

static int t_mipmap(size_t b, unsigned long long *h, int *kept)
{
    CUDA_ARRAY3D_DESCRIPTOR d = {1024, b / 4096, 0, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0};
    CUmipmappedArray a = (CUmipmappedArray)(uintptr_t)SENTINEL;
    int rc = cuMipmappedArrayCreate(&a, &d, 1);
    *kept = (uintptr_t)a == SENTINEL;
    *h = (uintptr_t)a;
    return rc;
}

static int t_rt_malloc(size_t b, unsigned long long *h, int *kept)
{
    void *p = (void *)(uintptr_t)SENTINEL;
    int rc = cudaMalloc(&p, b);
    *kept = (uintptr_t)p == SENTINEL;
    *h = (uintptr_t)p;
    return rc;
}

static int t_rt_managed(size_t b, unsigned long long *h, int *kept)
{
    void *p = (void *)(uintptr_t)SENTINEL;
    int rc = cudaMallocManaged(&p, b, cudaMemAttachGlobal);
    *kept = (uintptr_t)p == SENTINEL;
    *h = (uintptr_t)p;
    return rc;
}

static int t_rt_pitch(size_t b, unsigned long long *h, int *kept)
{
    void *p = (void *)(uintptr_t)SENTINEL;
    size_t pitch = SENTINEL;
    int rc = cudaMallocPitch(&p, &pitch, MiB, b / MiB);
    *kept = (uintptr_t)p == SENTINEL && pitch == SENTINEL;
    *h = (uintptr_t)p;
    return rc;
}

static int t_rt_3d(size_t b, unsigned long long *h, int *kept)
{
    struct cudaPitchedPtr pp = {(void *)(uintptr_t)SENTINEL, SENTINEL, SENTINEL, SENTINEL};
    struct cudaExtent ext = {MiB, b / (2 * MiB), 2};
    int rc = cudaMalloc3D(&pp, ext);
    *kept = (uintptr_t)pp.ptr == SENTINEL && pp.pitch == SENTINEL;
    *h = (uintptr_t)pp.ptr;
    return rc;
}

static int t_rt_async(size_t b, unsigned long long *h, int *kept)
{
    void *p = (void *)(uintptr_t)SENTINEL;
    int rc = cudaMallocAsync(&p, b, g_stream);
    *kept = (uintptr_t)p == SENTINEL;
    *h = (uintptr_t)p;
    return rc;
}

static int t_rt_from_pool(size_t b, unsigned long long *h, int *kept)
{
    void *p = (void *)(uintptr_t)SENTINEL;
    int rc = cudaMallocFromPoolAsync(&p, b, g_pool, g_stream);
    *kept = (uintptr_t)p == SENTINEL;
    *h = (uintptr_t)p;
    return rc;
}

static int r_free(unsigned long long h) { return cuMemFree_v2(h); }
static int r_free_v1(unsigned long long h) { return cuMemFree((CUdeviceptr_v1)h); }
static int r_vmm(unsigned long long h) { return cuMemRelease(h); }
static int r_async(unsigned long long h) { return cuMemFreeAsync(h, g_stream); }
static int r_array(unsigned long long h) { return cuArrayDestroy((CUarray)(uintptr_t)h); }
static int r_mipmap(unsigned long long h)
{
    return cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)h);
}
static int r_rt_free(unsigned long long h) { return cudaFree((void *)(uintptr_t)h); }
static int r_rt_async(unsigned long long h) { return cudaFreeAsync((void *)(uintptr_t)h, g_stream); }

struct path {
    const char *name;
    try_fn try_alloc;
    release_fn release;
    int pool; /* synchronize after freeing, so the pool gives its chunk back */
};

static const struct path g_paths[] = {
    {"cuMemAlloc_v2", t_alloc_v2, r_free, 0},
    {"cuMemAlloc", t_alloc_v1, r_free_v1, 0},
    {"dlsym.cuMemAlloc_v2", t_dlsym, r_free, 0},
    {"procaddr.cuMemAlloc_v2", t_procaddr, r_free, 0},
    {"cuMemAllocPitch_v2", t_pitch, r_free, 0},
    {"cuMemAllocManaged", t_managed, r_free, 0},
    {"cuMemCreate", t_vmm, r_vmm, 0},
    {"cuMemAllocAsync", t_async, r_async, 1},
    {"cuMemAllocAsync_ptsz", t_async_ptsz, r_async, 1},
    {"cuMemAllocFromPoolAsync", t_from_pool, r_async, 1},
    {"cuMemAllocFromPoolAsync_ptsz", t_from_pool_ptsz, r_async, 1},
    {"cuArrayCreate_v2", t_array, r_array, 0},
    {"cuArray3DCreate_v2", t_array3d, r_array, 0},
    {"cuMipmappedArrayCreate", t_mipmap, r_mipmap, 0},
    {"cudaMalloc", t_rt_malloc, r_rt_free, 0},
    {"cudaMallocManaged", t_rt_managed, r_rt_free, 0},
    {"cudaMallocPitch", t_rt_pitch, r_rt_free, 0},
    {"cudaMalloc3D", t_rt_3d, r_rt_free, 0},
    {"cudaMallocAsync", t_rt_async, r_rt_async, 1},
    {"cudaMallocFromPoolAsync", t_rt_from_pool, r_rt_async, 1},
    {NULL, NULL, NULL, 0},
};

/* Asks for `over` (more than the cap leaves), then for `fit` (what it leaves). */
static void check_path(const struct path *p, size_t over, size_t fit)
{
    unsigned long long h;
    int kept;
    unsigned long long live0 = simcuda_live_bytes(0), pool0 = simcuda_pool_reserved(0);
    int count0 = simcuda_live_count(0);
    gpuguard_device_counters g0 = gg_of(0);
    int rc = p->try_alloc(over, &h, &kept);
    gpuguard_device_counters g1 = gg_of(0);
    printf("DENY path=%s rc=%d kept=%d live0=%llu live1=%llu count0=%d count1=%d pool0=%llu "
           "pool1=%llu denied0=%llu denied1=%llu allocs0=%llu allocs1=%llu current0=%llu "
           "current1=%llu\n",
           p->name, rc, kept, live0, simcuda_live_bytes(0), count0, simcuda_live_count(0), pool0,
           simcuda_pool_reserved(0), (unsigned long long)g0.denied, (unsigned long long)g1.denied,
           (unsigned long long)g0.allocs, (unsigned long long)g1.allocs,
           (unsigned long long)g0.current_bytes, (unsigned long long)g1.current_bytes);
    if (rc == 0) MUST(p->release(h));
    if (p->pool) MUST(cuStreamSynchronize(g_stream));

    live0 = simcuda_live_bytes(0);
    rc = p->try_alloc(fit, &h, &kept);
    printf("FIT path=%s rc=%d live0=%llu live1=%llu\n", p->name, rc, live0,
           simcuda_live_bytes(0));
    if (rc == 0) MUST(p->release(h));
    if (p->pool) MUST(cuStreamSynchronize(g_stream));
}

static void check_host(const char *api, int which, size_t bytes)
{
    void *p = NULL;
    gpuguard_device_counters g0 = gg_of(0);
    int rc = which == 0   ? cuMemHostAlloc(&p, bytes, 0)
             : which == 1 ? cuMemAllocHost_v2(&p, bytes)
                          : cudaMallocHost(&p, bytes);
    gpuguard_device_counters g1 = gg_of(0);
    printf("HOST api=%s rc=%d denied0=%llu denied1=%llu\n", api, rc,
           (unsigned long long)g0.denied, (unsigned long long)g1.denied);
    if (rc == 0) MUST(cuMemFreeHost(p));
}

static int mode_paths(int argc, char **argv)
{
    size_t cap = (size_t)(argc > 1 ? atoi(argv[1]) : 32) * MiB;
    gg_setup(0);
    MUST(cuStreamCreate(&g_stream, 0));
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    MUST(cuMemPoolCreate(&g_pool, &props));
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    g_dl_alloc = (CUresult(*)(CUdeviceptr *, size_t))dlsym(lib, "cuMemAlloc_v2");
    PFN_cuGetProcAddress_v2 gpa = (PFN_cuGetProcAddress_v2)dlsym(lib, "cuGetProcAddress_v2");
    if (!g_dl_alloc || !gpa) {
        fprintf(stderr, "dlsym failed\n");
        return 3;
    }
    MUST(gpa("cuMemAlloc", (void **)&g_gpa_alloc, 12000, 0, NULL));

    /* 4 MiB left under the cap: 6 MiB never fits, 2 MiB always does */
    CUdeviceptr filler = dev_alloc(cap - 4 * MiB, 0);
    for (const struct path *p = g_paths; p->name; p++) check_path(p, 6 * MiB, 2 * MiB);

    check_host("cuMemHostAlloc", 0, 2 * cap);
    check_host("cuMemAllocHost_v2", 1, 2 * cap);
    check_host("cudaMallocHost", 2, 2 * cap);

    /* a device the cap does not name */
    int other = ndev() > 1 ? 1 : 0;
    CUcontext c1;
    MUST(cuDevicePrimaryCtxRetain(&c1, other));
    MUST(cuCtxPushCurrent_v2(c1));
    CUdeviceptr big = SENTINEL;
    int rc = cuMemAlloc_v2(&big, 2 * cap);
    printf("OTHER dev=%d rc=%d\n", other, rc);
    if (rc == 0) MUST(cuMemFree_v2(big));
    MUST(cuCtxPopCurrent_v2(NULL));

    dev_free(filler);
    finish();
    return 0;
}

/* ---- race THREADS ITERS: threads allocating at the cap at once ---- */
static int g_threads, g_iters;
static CUcontext g_ctx0;
static pthread_barrier_t g_bar;
static unsigned long long g_refused;

static size_t race_size(int t) { return (size_t)(t % 4 + 1) * 768 * 1024 + (size_t)t * 4096; }

/* 0: cuMemAlloc_v2, 1: cuMemAllocManaged, 2: cudaMalloc, 3: cuMemCreate (2 MiB) */
static int race_alloc(int path, size_t bytes, unsigned long long *h)
{
    int kept;
    switch (path) {
    case 0: return t_alloc_v2(bytes, h, &kept);
    case 1: return t_managed(bytes, h, &kept);
    case 2: return t_rt_malloc(bytes, h, &kept);
    default: return t_vmm(2 * MiB, h, &kept);
    }
}

static void race_free(int path, unsigned long long h)
{
    switch (path) {
    case 0: case 1: MUST(cuMemFree_v2(h)); break;
    case 2: MUST(cudaFree((void *)(uintptr_t)h)); break;
    default: MUST(cuMemRelease(h)); break;
    }
}

static void count_refusal(int rc)
{
    if (rc != CUDA_ERROR_OUT_OF_MEMORY) {
        fflush(stdout);
        fprintf(stderr, "race: allocation failed with %d\n", rc);
        exit(3);
    }
    __atomic_fetch_add(&g_refused, 1, __ATOMIC_RELAXED);
}

static void *race_thread(void *arg)
{
    int t = (int)(intptr_t)arg, path = t % 4;
    size_t bytes = race_size(t);
    MUST(cuCtxSetCurrent(g_ctx0));
    enum { RING = 6, HOLD = 4096 };
    unsigned long long ring[RING] = {0};
    for (int i = 0; i < g_iters; i++) {
        unsigned long long *s = &ring[i % RING];
        if (*s) {
            race_free(path, *s);
            *s = 0;
        }
        int rc = race_alloc(path, bytes, s);
        if (rc != 0) {
            *s = 0;
            count_refusal(rc);
        }
    }
    /* fill: take what is left, hold it until every thread is done */
    unsigned long long *held = calloc(HOLD, sizeof *held);
    int n = 0;
    for (; n < HOLD; n++) {
        int rc = race_alloc(path, bytes, &held[n]);
        if (rc != 0) {
            count_refusal(rc);
            break;
        }
    }
    pthread_barrier_wait(&g_bar); /* everyone is full */
    pthread_barrier_wait(&g_bar); /* main has looked */
    for (int i = 0; i < n; i++) race_free(path, held[i]);
    for (int i = 0; i < RING; i++)
        if (ring[i]) race_free(path, ring[i]);
    free(held);
    return NULL;
}

static int mode_race(int argc, char **argv)
{
    g_threads = argc > 1 ? atoi(argv[1]) : 16;
    g_iters = argc > 2 ? atoi(argv[2]) : 300;
    g_ctx0 = gg_setup(0);
    size_t largest = 2 * MiB; /* the VMM threads' size */
    for (int t = 0; t < g_threads; t++)
        if (race_size(t) > largest) largest = race_size(t);
    printf("RACE threads=%d iters=%d largest=%zu\n", g_threads, g_iters, largest);
    pthread_barrier_init(&g_bar, NULL, (unsigned)g_threads + 1);
    pthread_t *th = calloc((size_t)g_threads, sizeof *th);
    for (int t = 0; t < g_threads; t++)
        MUST(pthread_create(&th[t], NULL, race_thread, (void *)(intptr_t)t));
    pthread_barrier_wait(&g_bar);
    step("full");
    print_gg();
    print_sim();
    simpeak_line(0);
    pthread_barrier_wait(&g_bar);
    for (int t = 0; t < g_threads; t++) pthread_join(th[t], NULL);
    free(th);
    step("end");
    printf("REFUSED n=%llu\n", __atomic_load_n(&g_refused, __ATOMIC_RELAXED));
    simpeak_line(0);
    finish();
    return 0;
}

/* ---- free_race: one thread frees 8 MiB while another asks for 8 MiB (run with
 * a cap of 10 MiB on device 0 and SIMCUDA_FREE_DELAY_MS, so the free is slow) ---- */
static CUdeviceptr g_slow;

static void *slow_free_thread(void *arg)
{
    (void)arg;
    MUST(cuCtxSetCurrent(g_ctx0));
    MUST(cuMemFree_v2(g_slow)); /* the sim holds the memory until this returns */
    return NULL;
}

static int mode_free_race(int argc, char **argv)
{
    (void)argc; (void)argv;
    g_ctx0 = gg_setup(0);
    g_slow = dev_alloc(8 * MiB, 0);
    pthread_t th;
    MUST(pthread_create(&th, NULL, slow_free_thread, NULL));
    /* Until the free is under way in the driver (inside the sim's delay, the memory
     * still held): the other thread asks only then. */
    while (simcuda_frees_delayed() == 0) sched_yield();
    printf("DURING live=%llu\n", simcuda_live_bytes(0));
    CUdeviceptr b = SENTINEL;
    int rc = cuMemAlloc_v2(&b, 8 * MiB);
    rc_line("alloc_during_free", rc);
    pthread_join(th, NULL);
    free_line(g_slow);
    if (rc == 0) dev_free(b);
    simpeak_line(0);
    finish();
    return 0;
}

/* ---- pool_fill BYTES MAX: stream-ordered allocations until the cap refuses ---- */
static int mode_pool_fill(int argc, char **argv)
{
    size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : MiB;
    int max = argc > 2 ? atoi(argv[2]) : 64;
    if (max > 256) max = 256;
    gg_setup(0);
    CUstream s;
    MUST(cuStreamCreate(&s, 0));
    CUdeviceptr ps[256];
    int n = 0, rc = 0;
    for (; n < max; n++) {
        rc = cuMemAllocAsync(&ps[n], bytes, s);
        if (rc != 0) break;
        alloc_line(ps[n], bytes, 0, "pool");
    }
    printf("POOLFILL ok=%d rc=%d\n", n, rc);
    step("full");
    print_gg();
    print_sim();
    simpeak_line(0);
    mid_report("pool_full");
    for (int i = 0; i < n; i++) {
        MUST(cuMemFreeAsync(ps[i], s));
        free_line(ps[i]);
    }
    step("freed");
    print_sim();
    mid_report("pool_freed");
    MUST(cuStreamSynchronize(s)); /* release threshold 0: the pool gives it all back */
    step("synced");
    print_sim();
    mid_report("pool_synced");
    step("end");
    finish();
    return 0;
}

/* ---- pool_trim: freed-but-reserved pool memory must not block an allocation
 * (run with a cap of 10 MiB on device 0) ---- */
static int mode_pool_trim(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    CUstream s;
    MUST(cuStreamCreate(&s, 0));
    CUmemoryPool dp;
    MUST(cuDeviceGetDefaultMemPool(&dp, 0));
    cuuint64_t keep = ~0ULL; /* synchronisations keep what the pool reserved */
    MUST(cuMemPoolSetAttribute(dp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
    CUdeviceptr ps[4];
    for (int i = 0; i < 4; i++) {
        MUST(cuMemAllocAsync(&ps[i], MiB, s));
        alloc_line(ps[i], MiB, 0, "pool");
    }
    for (int i = 0; i < 4; i++) {
        MUST(cuMemFreeAsync(ps[i], s));
        free_line(ps[i]);
    }
    MUST(cuStreamSynchronize(s));
    step("freed");
    print_sim();
    print_gg();
    print_calls("cuMemPoolTrimTo");

    CUdeviceptr big = 0;
    int rc = cuMemAlloc_v2(&big, 6 * MiB);
    rc_line("fits_after_trim", rc);
    if (rc == 0) alloc_line(big, 6 * MiB, 0, "device");
    step("after");
    print_sim();
    print_gg();
    print_calls("cuMemPoolTrimTo");

    CUdeviceptr more = SENTINEL;
    rc = cuMemAlloc_v2(&more, 6 * MiB);
    rc_line("too_big", rc);
    if (rc == 0) dev_free(more);
    if (big) dev_free(big);
    step("end");
    finish();
    return 0;
}

/* ---- meminfo CAP_MIB: what cuMemGetInfo/cudaMemGetInfo/cuDeviceTotalMem say ---- */
static void meminfo(const char *tag, int dev)
{
    size_t f = SENTINEL, t = SENTINEL;
    int rc = cuMemGetInfo_v2(&f, &t);
    printf("%s dev=%d rc=%d free=%zu total=%zu\n", tag, dev, rc, f, t);
    unsigned long long mem = simcuda_mem(), live = simcuda_live_bytes(dev);
    printf("SIMREAL dev=%d free=%llu total=%llu\n", dev, live >= mem ? 0 : mem - live, mem);
}

static int mode_meminfo(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    step("fresh");
    meminfo("MEMINFO", 0);
    print_gg();

    CUdeviceptr a = dev_alloc(40 * MiB, 0);
    step("used");
    meminfo("MEMINFO", 0);
    size_t f = SENTINEL, t = SENTINEL;
    int rc = cudaMemGetInfo(&f, &t);
    printf("RTMEMINFO dev=0 rc=%d free=%zu total=%zu\n", rc, f, t);
    for (int d = 0; d < ndev(); d++) {
        size_t b = 0;
        rc = cuDeviceTotalMem_v2(&b, d);
        printf("TOTALMEM dev=%d rc=%d bytes=%zu\n", d, rc, b);
    }
    printf("SIMMEM bytes=%llu\n", simcuda_mem());
    print_gg();

    int other = ndev() > 1 ? 1 : 0;
    CUcontext c1;
    MUST(cuDevicePrimaryCtxRetain(&c1, other));
    MUST(cuCtxPushCurrent_v2(c1));
    CUdeviceptr b1 = dev_alloc(5 * MiB, other);
    step("other");
    meminfo("MEMINFO", other);
    MUST(cuCtxPopCurrent_v2(NULL));

    /* memory gpuguard never sees: the device really has 10 MiB left */
    unsigned long long mem = simcuda_mem(), live = simcuda_live_bytes(0);
    CUdeviceptr u = 0;
    MUST(simcuda_untracked_alloc(0, mem - live - 10 * MiB, &u));
    step("squeezed");
    meminfo("MEMINFO", 0);
    print_gg();
    MUST(cuMemFree_v2(u));

    step("null");
    size_t x = SENTINEL;
    rc_line("null_free", cuMemGetInfo_v2(NULL, &x));
    printf("NULLOUT total=%zu\n", x);
    x = SENTINEL;
    rc_line("null_total", cuMemGetInfo_v2(&x, NULL));
    printf("NULLOUT free=%zu\n", x);
    rc_line("null_both", cuMemGetInfo_v2(NULL, NULL));

    dev_free(a);
    MUST(cuCtxPushCurrent_v2(c1));
    dev_free(b1);
    MUST(cuCtxPopCurrent_v2(NULL));
    step("end");
    finish();
    return 0;
}

/* ---- nvml: NVML's memory numbers in a process that uses CUDA ---- */
struct nvml_fns {
    __typeof__(&nvmlDeviceGetCount_v2) count;
    __typeof__(&nvmlDeviceGetHandleByIndex_v2) handle;
    __typeof__(&nvmlDeviceGetUUID) uuid;
    __typeof__(&nvmlDeviceGetMemoryInfo) mem;
    __typeof__(&nvmlDeviceGetMemoryInfo_v2) mem2;
};

static void nvml_lines(const char *path, const struct nvml_fns *f)
{
    unsigned n = 0;
    MUST(f->count(&n));
    for (unsigned i = 0; i < n; i++) {
        nvmlDevice_t d;
        MUST(f->handle(i, &d));
        char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        MUST(f->uuid(d, uuid, sizeof uuid));
        unsigned long long total, reserved, used;
        int ord;
        MUST(simnvml_memory(i, &total, &reserved, &used, &ord));
        printf("NVMLREAL idx=%u total=%llu reserved=%llu used=%llu\n", i, total, reserved, used);
        nvmlMemory_t m = {SENTINEL, SENTINEL, SENTINEL};
        int rc = f->mem(d, &m);
        printf("NVML1 path=%s idx=%u uuid=%s rc=%d total=%llu free=%llu used=%llu\n", path, i,
               uuid, rc, m.total, m.free, m.used);
        nvmlMemory_v2_t m2 = {nvmlMemory_v2, SENTINEL, SENTINEL, SENTINEL, SENTINEL};
        rc = f->mem2(d, &m2);
        printf("NVML2 path=%s idx=%u uuid=%s rc=%d total=%llu reserved=%llu free=%llu used=%llu\n",
               path, i, uuid, rc, m2.total, m2.reserved, m2.free, m2.used);
    }
}

static void nvml_both_paths(void)
{
    MUST(nvmlInit_v2());
    struct nvml_fns linked = {nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2,
                              nvmlDeviceGetUUID, nvmlDeviceGetMemoryInfo,
                              nvmlDeviceGetMemoryInfo_v2};
    nvml_lines("link", &linked);
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen(libnvidia-ml.so.1): %s\n", dlerror());
        exit(3);
    }
    struct nvml_fns dl = {
        (__typeof__(dl.count))dlsym(h, "nvmlDeviceGetCount_v2"),
        (__typeof__(dl.handle))dlsym(h, "nvmlDeviceGetHandleByIndex_v2"),
        (__typeof__(dl.uuid))dlsym(h, "nvmlDeviceGetUUID"),
        (__typeof__(dl.mem))dlsym(h, "nvmlDeviceGetMemoryInfo"),
        (__typeof__(dl.mem2))dlsym(h, "nvmlDeviceGetMemoryInfo_v2"),
    };
    if (!dl.count || !dl.handle || !dl.uuid || !dl.mem || !dl.mem2) {
        fprintf(stderr, "dlsym on libnvidia-ml.so.1 failed\n");
        exit(3);
    }
    nvml_lines("dl", &dl);
    MUST(nvmlShutdown());
}

static int mode_nvml(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    CUdeviceptr a = dev_alloc(10 * MiB, 0);
    int other = ndev() > 1 ? 1 : 0;
    CUcontext c1;
    MUST(cuDevicePrimaryCtxRetain(&c1, other));
    MUST(cuCtxPushCurrent_v2(c1));
    CUdeviceptr b = dev_alloc(3 * MiB, other);
    MUST(cuCtxPopCurrent_v2(NULL));
    for (int d = 0; d < ndev(); d++) {
        CUuuid u;
        MUST(cuDeviceGetUuid_v2(&u, d));
        const unsigned char *x = (const unsigned char *)u.bytes;
        printf("CUUUID dev=%d uuid=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
               "%02x%02x%02x%02x%02x%02x\n",
               d, x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9], x[10], x[11],
               x[12], x[13], x[14], x[15]);
    }
    nvml_both_paths();
    leak_line(a, 10 * MiB);
    leak_line(b, 3 * MiB);
    finish();
    return 0;
}

/* The refused calls of deny_loop, each from a function of its own (the cap report's
 * stack starts there). */
__attribute__((noinline, noclone)) int refuse_here(size_t bytes)
{
    CUdeviceptr p = SENTINEL;
    int rc = cuMemAlloc_v2(&p, bytes);
    if (rc == 0) MUST(cuMemFree_v2(p));
    __asm__ volatile("" ::: "memory"); /* keeps the frame a real call */
    return rc;
}

__attribute__((noinline, noclone)) int refuse_rt_here(size_t bytes)
{
    void *p = NULL;
    int rc = cudaMalloc(&p, bytes);
    if (rc == 0) MUST(cudaFree(p));
    __asm__ volatile("" ::: "memory");
    return rc;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- deny_loop N [wait|nowait] [rt]: device 0 holds 10 MiB (device 1, or device 0
 * again with one device, 1 MiB), then N calls of 10 MiB in a tight loop, which a
 * 16 MiB cap on device 0 refuses (by the runtime with `rt`). `wait`: after the first refusal,
 * until gpuguard's helper thread has written its cap report (a handshake on the
 * file), so the refusals after it come while the one-report-a-second limit holds;
 * `nowait`: no waiting, the exit may be what writes the report. Lines:
 *   LOOP n= refused= ms=      (ms: the loop's time, any wait included)
 *   CAPWAIT written=<0|1>     (wait) whether the cap report came ---- */
static int mode_deny_loop(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    const char *how = argc > 2 ? argv[2] : "nowait";
    int wait = strcmp(how, "wait") == 0;
    if (!wait && strcmp(how, "nowait") != 0) {
        fprintf(stderr, "deny_loop: wait or nowait, not %s\n", how);
        return 2;
    }
    int rt = argc > 3 && strcmp(argv[3], "rt") == 0;
    gg_setup(0);
    CUdeviceptr a = dev_alloc(10 * MiB, 0);
    int other = ndev() > 1 ? 1 : 0;
    CUcontext c1;
    MUST(cuDevicePrimaryCtxRetain(&c1, other));
    MUST(cuCtxPushCurrent_v2(c1));
    CUdeviceptr b = dev_alloc(1 * MiB, other);
    MUST(cuCtxPopCurrent_v2(NULL));
    step("before");
    print_sim();
    long long t0 = now_ms();
    int refused = 0;
    int written = -1;
    for (int i = 0; i < n; i++) {
        int rc = rt ? refuse_rt_here(10 * MiB) : refuse_here(10 * MiB);
        if (rc == CUDA_ERROR_OUT_OF_MEMORY) refused++;
        else if (rc != 0) {
            fprintf(stderr, "unexpected %d\n", rc);
            return 3;
        }
        if (i == 0 && wait) written = wait_reports(".cap.json", 1);
    }
    printf("LOOP n=%d refused=%d ms=%lld\n", n, refused, now_ms() - t0);
    if (wait) printf("CAPWAIT written=%d\n", written);
    step("end");
    leak_line(a, 10 * MiB);
    leak_line(b, 1 * MiB);
    finish();
    return 0;
}

/* ---- refuse_then_free: 10 MiB refused while device 0 holds 12 MiB (cap 16 MiB),
 * then everything freed before the cap report is written: the helper thread is held
 * inside a driver call the report makes (the sim's gate) until the free is done ---- */
static int mode_refuse_then_free(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    gg_setup(0);
    CUdeviceptr a = dev_alloc(12 * MiB, 0);
    /* gpuguard measures the device's pools for every report: its helper thread waits
     * there. This thread's own calls pass. */
    MUST(simcuda_gate_arm("cuMemPoolGetAttribute"));
    step("refusal");
    print_sim();
    CUdeviceptr p = SENTINEL;
    rc_line("refused", cuMemAlloc_v2(&p, 10 * MiB));
    printf("GATE held=%d\n", simcuda_gate_wait(GG_WAIT_BOUND_MS));
    dev_free(a);
    simcuda_gate_open();
    wait_reports(".cap.json", 1);
    step("end");
    finish();
    return 0;
}

/* ---- oom_fill PATH [BLOCK_MIB] [STORM]: blocks of BLOCK_MIB (default 1024) through
 * allocation path PATH (a name of g_paths) until the driver refuses one (no cap: the
 * sim's memory is full), then STORM more refusals (default 0); the helper thread is
 * held in the sim's gate (inside the oom report it writes) meanwhile. Then
 * everything is freed, the gate opened, and the oom report waited for. Lines:
 *   OOM path= blocks= rc= storm_rcs= reports_while_held=
 * with the SIM books printed at the refusal ("refusal" step). ---- */
#define MAX_BLOCKS 4096
static int mode_oom_fill(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "cuMemAlloc_v2";
    size_t block = (size_t)(argc > 2 ? atoi(argv[2]) : 1024) * MiB;
    int storm = argc > 3 ? atoi(argv[3]) : 0;
    const struct path *p = g_paths;
    while (p->name && strcmp(p->name, name) != 0) p++;
    if (!p->name) {
        fprintf(stderr, "no path %s\n", name);
        return 3;
    }
    gg_setup(0);
    MUST(cuStreamCreate(&g_stream, 0));
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    MUST(cuMemPoolCreate(&g_pool, &props));
    /* gpuguard measures the device's pools for every report: its helper thread waits
     * there. This thread's own calls pass. */
    MUST(simcuda_gate_arm("cuMemPoolGetAttribute"));
    static unsigned long long held[MAX_BLOCKS];
    int n = 0, rc = 0, kept;
    while (n < MAX_BLOCKS) {
        rc = p->try_alloc(block, &held[n], &kept);
        if (rc != 0) break;
        n++;
    }
    step("refusal");
    print_sim();
    int other = 0;
    for (int i = 0; i < storm; i++) {
        unsigned long long h;
        if (p->try_alloc(block, &h, &kept) != CUDA_ERROR_OUT_OF_MEMORY) other++;
    }
    int held_gate = simcuda_gate_wait(GG_WAIT_BOUND_MS);
    int before = count_reports(".oom.json");
    printf("OOM path=%s blocks=%d rc=%d storm_other=%d reports_while_held=%d\n", p->name, n,
           rc, other, before);
    printf("GATE held=%d\n", held_gate);
    for (int i = 0; i < n; i++) MUST(p->release(held[i]));
    if (p->pool) MUST(cuStreamSynchronize(g_stream));
    simcuda_gate_open();
    wait_reports(".oom.json", 1);
    step("end");
    finish();
    return 0;
}

/* ---- oom_abort: 1 GiB blocks by cuMemAlloc_v2 until the driver refuses, then
 * abort() at once, as XLA does when its memory pool cannot be allocated. Line:
 * OOM_ABORT blocks= (stdout flushed before the abort) ---- */
static int mode_oom_abort(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    gg_setup(0);
    static CUdeviceptr held[MAX_BLOCKS];
    int n = 0;
    while (n < MAX_BLOCKS && cuMemAlloc_v2(&held[n], 1024 * MiB) == CUDA_SUCCESS) n++;
    printf("OOM_ABORT blocks=%d\n", n);
    fflush(stdout);
    abort();
}

/* ---- oom_retry: device 0 filled exactly with 4 MiB stream-ordered blocks, half of
 * them freed without a synchronization (their chunks stay in the pool), then
 * cuMemAlloc_v2 of 4 MiB, which the driver refuses unless the pool is trimmed
 * (GPUGUARD_OOM_TRIM). Lines: RETRY rc= ---- */
static int mode_oom_retry(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    gg_setup(0);
    MUST(cuStreamCreate(&g_stream, 0));
    static CUdeviceptr blocks[MAX_BLOCKS];
    int n = (int)(simcuda_mem() / (4 * MiB));
    if (n > MAX_BLOCKS) n = MAX_BLOCKS;
    for (int i = 0; i < n; i++) MUST(cuMemAllocAsync(&blocks[i], 4 * MiB, g_stream));
    for (int i = 0; i < n / 2; i++) MUST(cuMemFreeAsync(blocks[i], g_stream));
    CUdeviceptr p = SENTINEL;
    int rc = cuMemAlloc_v2(&p, 4 * MiB);
    printf("RETRY rc=%d\n", rc);
    if (rc == 0) MUST(cuMemFree_v2(p));
    for (int i = n / 2; i < n; i++) MUST(cuMemFreeAsync(blocks[i], g_stream));
    MUST(cuStreamSynchronize(g_stream));
    wait_reports(".oom.json", 1);
    finish();
    return 0;
}

/* ---- oom_hold MIB: holds MIB on device 0 until stdin ends (another process on the
 * same GPU for an oom report), after one allocation the driver refuses (the whole
 * device); HELD on stdout once it holds it ---- */
static int mode_oom_hold(int argc, char **argv)
{
    size_t bytes = (size_t)(argc > 1 ? atoi(argv[1]) : 64) * MiB;
    gg_setup(0);
    CUdeviceptr a = dev_alloc(bytes, 0);
    CUdeviceptr big = SENTINEL;
    rc_line("whole", cuMemAlloc_v2(&big, simcuda_mem()));
    puts("HELD");
    fflush(stdout);
    char buf[64];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {
    }
    dev_free(a);
    finish();
    return 0;
}

/* ---- warn: 20 MiB, 36 MiB, 40 MiB, 20 MiB, 36 MiB on device 0, a MARK after each
 * step. No waiting: the GPUGUARD_WARN_AT line is written by the thread that crosses
 * the threshold, inside the allocation call, so it is on stderr before that call
 * returns (and before the MARK after it) ---- */
static int mode_warn(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    gg_setup(0);
    CUdeviceptr a = dev_alloc(20 * MiB, 0);
    step("below1");
    print_sim();
    mark("below1");
    CUdeviceptr b = dev_alloc(16 * MiB, 0);
    step("cross1");
    print_sim();
    mark("cross1");
    CUdeviceptr c = dev_alloc(4 * MiB, 0);
    step("above");
    print_sim();
    mark("above");
    dev_free(b);
    dev_free(c);
    step("below2");
    print_sim();
    mark("below2");
    CUdeviceptr d = dev_alloc(16 * MiB, 0);
    step("cross2");
    print_sim();
    mark("cross2");
    dev_free(a);
    dev_free(d);
    step("end");
    finish();
    return 0;
}

/* Two report signals, each report waited for (GG_WAIT_BOUND_MS at most): once the
 * second is written, gpuguard's helper thread has finished a whole round of its loop
 * begun after this was called, so whatever an earlier call left pending (a crossed
 * GPUGUARD_TRIM_AT: the trim runs in the round that answers the first signal, after
 * the report) is done. Returns 1, or 0 when a report did not come (no gpuguard, no
 * folder, or past the bound). */
static int helper_settled(void)
{
    /* Without gpuguard SIGUSR1 would end the program. */
    if (!dlsym(RTLD_DEFAULT, "gpuguard_device_counters") || count_reports(".signal.json") < 0)
        return 0;
    for (int i = 0; i < 2; i++) {
        int n = count_reports(".signal.json");
        raise(SIGUSR1);
        if (n < 0 || !wait_reports(".signal.json", n + 1)) return 0;
    }
    return 1;
}

/* ---- trim_at wait|settle: pools holding freed chunks, then a plain allocation;
 * then, with `wait`, until the trim's report is in the folder (a run that must trim),
 * with `settle`, until the helper thread is done with what the allocation left it
 * (`helper_settled`: a run that must not trim, with nothing of its own to wait
 * for). Line: SETTLED ok=<0|1> (settle) ---- */
static int mode_trim_at(int argc, char **argv)
{
    const char *how = argc > 1 ? argv[1] : "";
    int wait = strcmp(how, "wait") == 0;
    if (!wait && strcmp(how, "settle") != 0) {
        fprintf(stderr, "trim_at: wait or settle, not %s\n", how);
        return 2;
    }
    gg_setup(0);
    CUstream s;
    MUST(cuStreamCreate(&s, 0));
    CUmemoryPool dp;
    MUST(cuDeviceGetDefaultMemPool(&dp, 0));
    cuuint64_t keep = ~0ULL;
    MUST(cuMemPoolSetAttribute(dp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
    CUdeviceptr ps[8];
    for (int i = 0; i < 8; i++) {
        MUST(cuMemAllocAsync(&ps[i], 2 * MiB, s));
        alloc_line(ps[i], 2 * MiB, 0, "pool");
    }
    for (int i = 2; i < 8; i++) {
        MUST(cuMemFreeAsync(ps[i], s));
        free_line(ps[i]);
    }
    MUST(cuStreamSynchronize(s));
    step("before");
    print_sim();
    int trims = count_reports(".trim.json");
    CUdeviceptr big = dev_alloc(20 * MiB, 0);
    if (wait)
        wait_reports(".trim.json", trims + 1);
    else
        printf("SETTLED ok=%d\n", helper_settled());
    step("after");
    print_sim();
    print_gg();
    dev_free(big);
    for (int i = 0; i < 2; i++) {
        MUST(cuMemFreeAsync(ps[i], s));
        free_line(ps[i]);
    }
    MUST(cuMemPoolTrimTo(dp, 0));
    step("end");
    finish();
    return 0;
}

/* ---- retry: a framework that gets OOM at the cap, frees cached blocks, retries ---- */
static int mode_retry(int argc, char **argv)
{
    (void)argc; (void)argv;
    MUST(cudaSetDevice(0));
    void *ps[256];
    int n = 0, rc = 0;
    for (; n < 255; n++) {
        rc = cudaMalloc(&ps[n], 4 * MiB);
        if (rc != 0) break;
        alloc_line((uintptr_t)ps[n], 4 * MiB, 0, "device");
    }
    printf("FILL ok=%d rc=%d\n", n, rc);
    step("full");
    print_sim();
    print_gg();
    for (int i = 0; i < 2 && n > 0; i++) {
        n--;
        MUST(cudaFree(ps[n]));
        free_line((uintptr_t)ps[n]);
    }
    rc = cudaMalloc(&ps[n], 4 * MiB);
    rc_line("retry", rc);
    if (rc == 0) alloc_line((uintptr_t)ps[n++], 4 * MiB, 0, "device");
    step("retried");
    print_sim();
    print_gg();
    while (n > 0) {
        n--;
        MUST(cudaFree(ps[n]));
        free_line((uintptr_t)ps[n]);
    }
    step("end");
    finish();
    return 0;
}

/* ---- fork_in_nvml_init: a fork while gpuguard's helper thread initializes NVML for
 * the first cap report (run with SIMNVML_INIT_HOLD=1 and a cap below 64 MiB): the
 * child is refused once and exits; its own reports are then the test's to find.
 * Lines: NVMLWAIT waiting=<calls waiting when it forked>, CHILD pid=P status=S ---- */
static int mode_fork_in_nvml_init(int argc, char **argv)
{
    (void)argc; (void)argv;
    gg_setup(0);
    CUdeviceptr p;
    rc_line("parent_refused", cuMemAlloc_v2(&p, 64 * MiB));
    for (long i = 0; simnvml_init_waiting() == 0 && i < GG_WAIT_BOUND_MS; i++) sleep_ms(1);
    printf("NVMLWAIT waiting=%d\n", simnvml_init_waiting());
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) return 3;
    if (child == 0) {
        CUdeviceptr q;
        rc_line("child_refused", cuMemAlloc_v2(&q, 64 * MiB));
        fflush(stdout);
        exit(0);
    }
    int st = 0;
    waitpid(child, &st, 0);
    simnvml_init_release();
    printf("CHILD pid=%d status=%d\n", (int)child, st);
    puts("OK");
    return 0;
}

static int mode_nocuda_(int argc, char **argv) { (void)argc; (void)argv; return mode_nocuda(); }

static const struct gg_mode g_modes[] = {
    {"probe", mode_probe},
    {"paths", mode_paths},
    {"race", mode_race},
    {"free_race", mode_free_race},
    {"pool_fill", mode_pool_fill},
    {"pool_trim", mode_pool_trim},
    {"meminfo", mode_meminfo},
    {"nvml", mode_nvml},
    {"fork_in_nvml_init", mode_fork_in_nvml_init},
    {"deny_loop", mode_deny_loop},
    {"refuse_then_free", mode_refuse_then_free},
    {"oom_fill", mode_oom_fill},
    {"oom_hold", mode_oom_hold},
    {"oom_retry", mode_oom_retry},
    {"oom_abort", mode_oom_abort},
    {"warn", mode_warn},
    {"trim_at", mode_trim_at},
    {"retry", mode_retry},
    {"nocuda", mode_nocuda_},
    {NULL, NULL},
};

int main(int argc, char **argv) { return gg_dispatch(g_modes, argc, argv); }
