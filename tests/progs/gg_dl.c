/*
 * gg_dl.c - test program that does NOT link libcuda: it reaches the driver
 * the way JAX (dlopen + dlsym) and the CUDA runtime (cuGetProcAddress) do.
 * Usage: gg_dl MODE [args]; see gg_common.h for the output protocol.
 */
#include "gg_common.h"

static void *g_lib;

/* dlsym on the private handle; a missing entry point ends the program. */
static void *sym(const char *name)
{
    void *p = dlsym(g_lib, name);
    if (!p) {
        fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());
        exit(3);
    }
    return p;
}

static void open_driver(void)
{
    g_lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!g_lib) {
        fprintf(stderr, "dlopen(libcuda.so.1): %s\n", dlerror());
        exit(3);
    }
}

/* A typed pointer named p_<fn>, looked up by the exact export name. */
#define DL(fn) __typeof__(&fn) p_##fn = (__typeof__(&fn))sym(#fn)

/* ---- dlsym: every call through dlsym(handle), JAX style ---- */
static int mode_dlsym(int argc, char **argv)
{
    (void)argc; (void)argv;
    /* A program that never linked libcuda can only find cu* names in the
     * global scope if something preloaded exports them. */
    void *def = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    void *next = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    printf("SYM RTLD_DEFAULT cuMemAlloc_v2 %s\n", def ? "found" : "null");
    printf("SYM RTLD_NEXT cuMemAlloc_v2 %s\n", next ? "found" : "null");

    open_driver();
    DL(cuInit);
    DL(cuDevicePrimaryCtxRetain);
    DL(cuCtxSetCurrent);
    DL(cuMemAlloc_v2);
    DL(cuMemAllocPitch_v2);
    DL(cuMemAllocManaged);
    DL(cuMemFree_v2);
    DL(cuMemGetInfo_v2);
    DL(cuDeviceTotalMem_v2);
    DL(cuMemHostAlloc);
    DL(cuMemFreeHost);
    DL(cuMemGetAllocationGranularity);
    DL(cuMemCreate);
    DL(cuMemRelease);
    DL(cuMemAddressReserve);
    DL(cuMemMap);
    DL(cuMemUnmap);
    DL(cuMemSetAccess);

    MUST(p_cuInit(0));
    CUcontext c;
    MUST(p_cuDevicePrimaryCtxRetain(&c, 0));
    MUST(p_cuCtxSetCurrent(c));
    size_t free_b, total_b, dev_total;
    MUST(p_cuMemGetInfo_v2(&free_b, &total_b));
    MUST(p_cuDeviceTotalMem_v2(&dev_total, 0));
    printf("MEMINFO free=%zu total=%zu device_total=%zu\n", free_b, total_b, dev_total);

    CUdeviceptr a, b, p, m;
    size_t pitch;
    MUST(p_cuMemAlloc_v2(&a, 1 * MiB));
    alloc_line(a, 1 * MiB, 0, "device");
    MUST(p_cuMemAlloc_v2(&b, 7 * MiB));
    alloc_line(b, 7 * MiB, 0, "device");
    MUST(p_cuMemAllocPitch_v2(&p, &pitch, 3000, 20, 8));
    alloc_line(p, pitch * 20, 0, "pitch");
    MUST(p_cuMemAllocManaged(&m, 4 * MiB, CU_MEM_ATTACH_GLOBAL));
    alloc_line(m, 4 * MiB, 0, "managed");
    void *h;
    MUST(p_cuMemHostAlloc(&h, 1 * MiB, 0));
    alloc_line((uintptr_t)h, 1 * MiB, -1, "host");

    /* JAX's arena: VMM through dlsym */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    size_t g;
    MUST(p_cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle v1, v2;
    MUST(p_cuMemCreate(&v1, 2 * g, &prop, 0));
    alloc_line(v1, 2 * g, 0, "vmm");
    MUST(p_cuMemCreate(&v2, g, &prop, 0));
    alloc_line(v2, g, 0, "vmm");
    CUdeviceptr va;
    MUST(p_cuMemAddressReserve(&va, 3 * g, 0, 0, 0));
    MUST(p_cuMemMap(va, 2 * g, 0, v1, 0));
    MUST(p_cuMemMap(va + 2 * g, g, 0, v2, 0));
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    MUST(p_cuMemSetAccess(va, 3 * g, &acc, 1));
    ((volatile char *)(uintptr_t)va)[3 * g - 1] = 1;
    mid_report("all_live");
    MUST(p_cuMemUnmap(va, 2 * g));
    MUST(p_cuMemRelease(v1));
    free_line(v1);
    /* v2 stays mapped and leaked, as an arena that is never torn down */

    if (def) { /* the preloaded definition must work like the driver's */
        CUdeviceptr x;
        MUST(((__typeof__(&cuMemAlloc_v2))def)(&x, 1 * MiB));
        alloc_line(x, 1 * MiB, 0, "device");
        MUST(p_cuMemFree_v2(x));
        free_line(x);
    }

    MUST(p_cuMemFree_v2(a));
    free_line(a);
    MUST(p_cuMemFree_v2(p));
    free_line(p);
    MUST(p_cuMemFreeHost(h));
    free_line((uintptr_t)h);
    leak_line(b, 7 * MiB);
    leak_line(m, 4 * MiB);
    leak_line(v2, g);
    print_gg();
    print_sim();
    puts("OK");
    return 0;
}

/* ---- procaddr: lookups by base name + version, like the runtime ---- */
static PFN_cuGetProcAddress_v2 g_gpa2;

/* One lookup, reported as PROC <symbol> <version> <flags> rc= status= fn= */
static void *proc(const char *name, int ver, cuuint64_t flags)
{
    void *fn = (void *)0x1; /* must come back NULL on failure */
    CUdriverProcAddressQueryResult st = -1;
    int rc = g_gpa2(name, &fn, ver, flags, &st);
    printf("PROC %s %d %llu rc=%d status=%d fn=%s\n", name, ver, flags, rc, (int)st,
           fn ? "set" : "null");
    return rc == CUDA_SUCCESS ? fn : NULL;
}

static int mode_procaddr(int argc, char **argv)
{
    (void)argc; (void)argv;
    open_driver();
    PFN_cuGetProcAddress_v2 boot = (PFN_cuGetProcAddress_v2)sym("cuGetProcAddress_v2");
    /* ask the lookup for itself, then use only the answer (the runtime's way) */
    void *self = NULL;
    MUST(boot("cuGetProcAddress", &self, 12000, 0, NULL));
    g_gpa2 = (PFN_cuGetProcAddress_v2)self;
    PFN_cuGetProcAddress_v1 gpa1 = (PFN_cuGetProcAddress_v1)proc("cuGetProcAddress", 11030, 0);

    __typeof__(&cuInit) init = proc("cuInit", 2000, 0);
    __typeof__(&cuDevicePrimaryCtxRetain) retain = proc("cuDevicePrimaryCtxRetain", 7000, 0);
    __typeof__(&cuCtxSetCurrent) setcur = proc("cuCtxSetCurrent", 4000, 0);
    MUST(init(0));
    CUcontext c;
    MUST(retain(&c, 0));
    MUST(setcur(c));

    /* version honouring: @3020 is cuMemAlloc_v2, below it the 32-bit v1 */
    __typeof__(&cuMemAlloc_v2) alloc2 = proc("cuMemAlloc", 3020, 0);
    __typeof__(&cuMemFree_v2) free2 = proc("cuMemFree", 3020, 0);
    __typeof__(&cuMemAlloc) alloc1 = proc("cuMemAlloc", 2000, 0);
    __typeof__(&cuMemFree) free1 = proc("cuMemFree", 2000, 0);
    __typeof__(&cuMemAllocManaged) managed = proc("cuMemAllocManaged", 6000, 0);
    __typeof__(&cuMemFreeHost) freehost = proc("cuMemFreeHost", 2000, 0);
    __typeof__(&cuMemAllocHost_v2) allochost = proc("cuMemAllocHost", 3020, 0);

    CUdeviceptr a, m;
    MUST(alloc2(&a, 2 * MiB));
    alloc_line(a, 2 * MiB, 0, "device");
    CUdeviceptr_v1 l;
    MUST(alloc1(&l, 12288));
    alloc_line(l, 12288, 0, "device");
    MUST(managed(&m, 1 * MiB, CU_MEM_ATTACH_GLOBAL));
    alloc_line(m, 1 * MiB, 0, "managed");
    void *h;
    MUST(allochost(&h, 8192));
    alloc_line((uintptr_t)h, 8192, -1, "host");

    /* the v1 lookup (11.3 signature) */
    void *pitch_fn = NULL;
    MUST(gpa1("cuMemAllocPitch", &pitch_fn, 3020, 0));
    CUdeviceptr p;
    size_t pitch;
    MUST(((__typeof__(&cuMemAllocPitch_v2))pitch_fn)(&p, &pitch, 600, 10, 4));
    alloc_line(p, pitch * 10, 0, "pitch");

    /* per-thread default stream: the _ptsz variants */
    __typeof__(&cuMemAllocAsync) aasync = proc("cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    __typeof__(&cuMemFreeAsync) fasync = proc("cuMemFreeAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    __typeof__(&cuMemAllocFromPoolAsync) pasync = proc("cuMemAllocFromPoolAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    __typeof__(&cuMemAllocAsync) aasync_legacy = proc("cuMemAllocAsync", 11020, 0);
    __typeof__(&cuDeviceGetDefaultMemPool) defpool = proc("cuDeviceGetDefaultMemPool", 11020, 0);
    __typeof__(&cuMemPoolTrimTo) trim = proc("cuMemPoolTrimTo", 11020, 0);
    CUdeviceptr q1, q2, q3;
    MUST(aasync(&q1, 1 * MiB, CU_STREAM_PER_THREAD));
    alloc_line(q1, 1 * MiB, 0, "pool");
    CUmemoryPool pool;
    MUST(defpool(&pool, 0));
    MUST(pasync(&q2, 3 * MiB, pool, CU_STREAM_PER_THREAD));
    alloc_line(q2, 3 * MiB, 0, "pool");
    MUST(aasync_legacy(&q3, 2 * MiB, NULL));
    alloc_line(q3, 2 * MiB, 0, "pool");
    mid_report("all_live");
    MUST(fasync(q1, CU_STREAM_PER_THREAD));
    free_line(q1);
    MUST(fasync(q3, CU_STREAM_PER_THREAD));
    free_line(q3);
    MUST(trim(pool, 0));

    /* lookups that must fail */
    proc("cuNoSuchFunction", 13000, 0);
    proc("cuMemAllocAsync", 11000, 0);
    proc("cuMemAlloc_v2", 13000, 0); /* suffixed names are not base names */

    MUST(free1(l));
    free_line(l);
    MUST(free2(a));
    free_line(a);
    MUST(freehost(h));
    free_line((uintptr_t)h);
    MUST(free2(p));
    free_line(p);
    leak_line(m, 1 * MiB);
    leak_line(q2, 3 * MiB);

    static const char *const counted[] = {
        "cuMemAlloc", "cuMemAlloc_v2", "cuMemFree", "cuMemFree_v2", "cuMemAllocAsync",
        "cuMemAllocAsync_ptsz", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz",
        "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuMemAllocPitch_v2", "cuGetProcAddress",
        "cuGetProcAddress_v2", NULL};
    for (int i = 0; counted[i]; i++) print_calls(counted[i]);
    print_gg();
    print_sim();
    puts("OK");
    return 0;
}

static int mode_nocuda_(int argc, char **argv) { (void)argc; (void)argv; return mode_nocuda(); }
static int mode_signal_before_(int argc, char **argv) { (void)argc; (void)argv; return mode_signal_before(); }

static const struct gg_mode g_modes[] = {
    {"dlsym", mode_dlsym},
    {"procaddr", mode_procaddr},
    {"nocuda", mode_nocuda_},
    {"signal_before", mode_signal_before_},
    {NULL, NULL},
};

int main(int argc, char **argv) { return gg_dispatch(g_modes, argc, argv); }
