/*
 * gg_multi.c - test program for two devices in one process: per-device caps,
 * device attribution (context, pool owner, VMM location, runtime device), peer
 * access and copies, and what CUDA and NVML show under CUDA_VISIBLE_DEVICES.
 * Links the driver, the runtime and NVML. Usage: gg_multi MODE [args]; see
 * gg_common.h for the output protocol. Extra lines:
 *   DEV ord= phys= uuid=                    a CUDA ordinal, the physical device the
 *                                           sim gives it, cuDeviceGetUuid_v2's UUID
 *   MEMINFO dev= rc= free= total=           cuMemGetInfo_v2 under dev's context
 *   TOTALMEM dev= rc= bytes=                cuDeviceTotalMem_v2
 *   RTMEMINFO dev= rc= free= total=         cudaMemGetInfo after cudaSetDevice(dev)
 *   NVML idx= uuid= rc= total= free= used=  nvmlDeviceGetMemoryInfo of NVML index idx
 *   NVML2 idx= uuid= rc= total= free= used= nvmlDeviceGetMemoryInfo_v2
 *   TRY label= dev= bytes= rc=              one allocation attempt of mode caps
 *   PEER label= rc=                         a peer call's return code
 *   DATA label= ok=                         whether a copy's bytes arrived
 */
#include "gg_common.h"
#include "cudart_sim.h"
#include "nvml_sim.h"

#include <dirent.h>
#include <unistd.h>

static CUcontext g_ctx[64];

static int ndev(void)
{
    int n = 0;
    MUST(cuDeviceGetCount(&n));
    return n;
}

/* cuInit and every device's primary context retained; device 0's made current. */
static void setup_all(void)
{
    MUST(cuInit(0));
    for (int d = 0; d < ndev() && d < 64; d++) MUST(cuDevicePrimaryCtxRetain(&g_ctx[d], d));
    MUST(cuCtxSetCurrent(g_ctx[0]));
}

static void use(int dev) { MUST(cuCtxSetCurrent(g_ctx[dev])); }

static void finish(void)
{
    print_gg();
    print_sim();
    puts("OK");
}

static void uuid_text(const CUuuid *u, char out[48])
{
    const unsigned char *x = (const unsigned char *)u->bytes;
    snprintf(out, 48, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9], x[10], x[11], x[12],
             x[13], x[14], x[15]);
}

/* DEV, MEMINFO, TOTALMEM and RTMEMINFO of every ordinal, then NVML and NVML2 of
 * every NVML index. */
static void views(void)
{
    for (int d = 0; d < ndev(); d++) {
        CUuuid u;
        char text[48];
        MUST(cuDeviceGetUuid_v2(&u, d));
        uuid_text(&u, text);
        printf("DEV ord=%d phys=%d uuid=%s\n", d, simcuda_physical_of(d), text);
        use(d);
        size_t f = 0, t = 0;
        int rc = cuMemGetInfo_v2(&f, &t);
        printf("MEMINFO dev=%d rc=%d free=%zu total=%zu\n", d, rc, f, t);
        size_t b = 0;
        rc = cuDeviceTotalMem_v2(&b, d);
        printf("TOTALMEM dev=%d rc=%d bytes=%zu\n", d, rc, b);
        f = t = 0;
        rc = cudaSetDevice(d);
        if (rc == 0) rc = cudaMemGetInfo(&f, &t);
        printf("RTMEMINFO dev=%d rc=%d free=%zu total=%zu\n", d, rc, f, t);
    }
    use(0);
    MUST(nvmlInit_v2());
    unsigned n = 0;
    MUST(nvmlDeviceGetCount_v2(&n));
    for (unsigned i = 0; i < n; i++) {
        nvmlDevice_t h;
        char uuid[96] = "";
        MUST(nvmlDeviceGetHandleByIndex_v2(i, &h));
        MUST(nvmlDeviceGetUUID(h, uuid, sizeof uuid));
        nvmlMemory_t m;
        memset(&m, 0, sizeof m);
        int rc = nvmlDeviceGetMemoryInfo(h, &m);
        printf("NVML idx=%u uuid=%s rc=%d total=%llu free=%llu used=%llu\n", i, uuid, rc,
               m.total, m.free, m.used);
        nvmlMemory_v2_t m2;
        memset(&m2, 0, sizeof m2);
        m2.version = nvmlMemory_v2;
        rc = nvmlDeviceGetMemoryInfo_v2(h, &m2);
        printf("NVML2 idx=%u uuid=%s rc=%d total=%llu free=%llu used=%llu\n", i, uuid, rc,
               m2.total, m2.free, m2.used);
    }
    MUST(nvmlShutdown());
}

/* ---- view: what each ordinal and each NVML device shows ---- */
static int mode_view(int argc, char **argv)
{
    (void)argc; (void)argv;
    setup_all();
    views();
    finish();
    return 0;
}

/* ---- caps [r|p|v]DEV:MiB...: allocations attempted in order, kept when they
 * succeed. No prefix: cuMemAlloc_v2 under DEV's context; r: the runtime
 * (cudaSetDevice + cudaMalloc); p: cuMemAllocFromPoolAsync from a pool created on DEV,
 * with device 0's context current; v: cuMemCreate with location DEV, device 0's
 * context current (MiB even: the VMM granularity is 2 MiB) ---- */
static CUmemoryPool g_pools[64];
static CUstream g_stream0;

static int try_alloc(char how, int dev, unsigned long long bytes, unsigned long long *p)
{
    if (how == 'r') {
        void *q = NULL;
        int rc = cudaSetDevice(dev);
        if (rc == 0) rc = cudaMalloc(&q, bytes);
        *p = (uintptr_t)q;
        return rc;
    }
    if (how == 'p' || how == 'v') {
        use(0);
        if (how == 'p') {
            if (!g_pools[dev]) {
                CUmemPoolProps props;
                memset(&props, 0, sizeof props);
                props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
                props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
                props.location.id = dev;
                MUST(cuMemPoolCreate(&g_pools[dev], &props));
            }
            if (!g_stream0) MUST(cuStreamCreate(&g_stream0, 0));
            CUdeviceptr q = 0;
            int rc = cuMemAllocFromPoolAsync(&q, bytes, g_pools[dev], g_stream0);
            *p = q;
            return rc;
        }
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        CUmemGenericAllocationHandle h = 0;
        int rc = cuMemCreate(&h, bytes, &prop, 0);
        *p = h;
        return rc;
    }
    use(dev);
    CUdeviceptr q = 0;
    int rc = cuMemAlloc_v2(&q, bytes);
    *p = q;
    return rc;
}

static int mode_caps(int argc, char **argv)
{
    setup_all();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char how = (a[0] == 'r' || a[0] == 'p' || a[0] == 'v') ? *a++ : 'd';
        int dev = atoi(a);
        const char *colon = strchr(a, ':');
        unsigned long long bytes = colon ? strtoull(colon + 1, NULL, 10) * MiB : 0;
        unsigned long long p = 0;
        int rc = try_alloc(how, dev, bytes, &p);
        printf("TRY label=%s dev=%d bytes=%llu rc=%d\n", argv[i], dev, bytes, rc);
        if (rc == 0) {
            alloc_line(p, bytes, dev, how == 'p' ? "pool" : how == 'v' ? "vmm" : "device");
            leak_line(p, bytes);
        }
    }
    if (g_stream0) MUST(cuStreamSynchronize(g_stream0));
    views();
    finish();
    return 0;
}

/* ---- books: allocations on both devices by every way a device is chosen, then
 * peer access and copies between them (which must not move the books) ---- */
static int mode_books(int argc, char **argv)
{
    (void)argc; (void)argv;
    setup_all();
    if (ndev() < 2) {
        fprintf(stderr, "books needs two devices\n");
        return 4;
    }
    /* by context */
    use(0);
    CUdeviceptr a0, a1, tmp;
    MUST(cuMemAlloc_v2(&a0, 6 * MiB));
    alloc_line(a0, 6 * MiB, 0, "device");
    MUST(cuMemAlloc_v2(&tmp, 1 * MiB));
    alloc_line(tmp, 1 * MiB, 0, "device");
    use(1);
    MUST(cuMemAlloc_v2(&a1, 10 * MiB));
    alloc_line(a1, 10 * MiB, 1, "device");
    MUST(cuMemFree_v2(tmp)); /* freed under the other device's context */
    free_line(tmp);

    /* by pool owner: pools on each device, allocated from with device 0 current */
    use(0);
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemoryPool pool[2];
    for (int d = 0; d < 2; d++) {
        props.location.id = d;
        MUST(cuMemPoolCreate(&pool[d], &props));
    }
    CUstream s0;
    MUST(cuStreamCreate(&s0, 0));
    CUdeviceptr q0, q1, q1b;
    MUST(cuMemAllocFromPoolAsync(&q0, 3 * MiB, pool[0], s0));
    alloc_line(q0, 3 * MiB, 0, "pool");
    MUST(cuMemAllocFromPoolAsync(&q1, 5 * MiB, pool[1], s0));
    alloc_line(q1, 5 * MiB, 1, "pool");
    MUST(cuMemAllocFromPoolAsync(&q1b, 1 * MiB, pool[1], s0));
    alloc_line(q1b, 1 * MiB, 1, "pool");
    MUST(cuMemFreeAsync(q1b, s0));
    free_line(q1b);
    MUST(cuStreamSynchronize(s0));

    /* by VMM location: device 1's physical memory, made with device 0 current */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 1;
    size_t g;
    MUST(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle h;
    MUST(cuMemCreate(&h, 2 * g, &prop, 0));
    alloc_line(h, 2 * g, 1, "vmm");
    CUdeviceptr va;
    MUST(cuMemAddressReserve(&va, 2 * g, 0, 0, 0));
    MUST(cuMemMap(va, 2 * g, 0, h, 0));
    CUmemAccessDesc acc[2] = {{{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
                              {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE}};
    MUST(cuMemSetAccess(va, 2 * g, acc, 2));

    /* by the runtime's current device */
    void *r1 = NULL;
    MUST(cudaSetDevice(1));
    MUST(cudaMalloc(&r1, 7 * MiB));
    alloc_line((uintptr_t)r1, 7 * MiB, 1, "device");
    MUST(cudaSetDevice(0));

    step("before_peer");
    print_gg();
    print_sim();

    /* peers: access enabled both ways, copies each way by every entry point */
    int can = -1;
    MUST(cuDeviceCanAccessPeer(&can, 0, 1));
    printf("PEER label=can01 rc=%d\n", can);
    use(0);
    printf("PEER label=enable01 rc=%d\n", cuCtxEnablePeerAccess(g_ctx[1], 0));
    printf("PEER label=enable01_again rc=%d\n", cuCtxEnablePeerAccess(g_ctx[1], 0));
    MUST(cudaSetDevice(1)); /* the runtime enables 1 -> 0 */
    printf("PEER label=rt_enable10 rc=%d\n", cudaDeviceEnablePeerAccess(0, 0));
    MUST(cudaSetDevice(0));
    use(0);
    MUST(cuMemsetD8_v2(a0, 0x5a, 6 * MiB));
    printf("PEER label=copy01 rc=%d\n", cuMemcpyPeer(a1, g_ctx[1], a0, g_ctx[0], 6 * MiB));
    printf("DATA label=copy01 ok=%d\n", ((volatile unsigned char *)(uintptr_t)a1)[6 * MiB - 1] == 0x5a);
    MUST(cuMemsetD8_v2(q1, 0x33, 5 * MiB));
    printf("PEER label=copy10_async rc=%d\n",
           cuMemcpyPeerAsync(q0, g_ctx[0], q1, g_ctx[1], 3 * MiB, s0));
    MUST(cuStreamSynchronize(s0));
    printf("DATA label=copy10_async ok=%d\n", ((volatile unsigned char *)(uintptr_t)q0)[0] == 0x33);
    printf("PEER label=copy_vmm rc=%d\n", cuMemcpyPeer(va, g_ctx[1], a0, g_ctx[0], 2 * MiB));
    printf("DATA label=copy_vmm ok=%d\n", ((volatile unsigned char *)(uintptr_t)va)[1] == 0x5a);
    printf("PEER label=rt_copy rc=%d\n", cudaMemcpyPeer(r1, 1, (void *)(uintptr_t)a0, 0, 6 * MiB));
    printf("PEER label=rt_copy_async rc=%d\n",
           cudaMemcpyPeerAsync((void *)(uintptr_t)a0, 0, r1, 1, 6 * MiB, NULL));
    /* a copy naming the wrong context for its memory is refused */
    printf("PEER label=wrong_ctx rc=%d\n", cuMemcpyPeer(a1, g_ctx[0], a0, g_ctx[0], MiB));
    MUST(cuCtxDisablePeerAccess(g_ctx[1]));

    mid_report("peer");
    step("end");
    leak_line(a0, 6 * MiB);
    leak_line(a1, 10 * MiB);
    leak_line(q0, 3 * MiB);
    leak_line(q1, 5 * MiB);
    leak_line(h, 2 * g);
    leak_line((uintptr_t)r1, 7 * MiB);
    finish();
    return 0;
}

/* ---- steps N MS LEAK_MiB: a training loop on device LOCAL_RANK (default 0): fixed
 * weights, then N steps that each allocate and free their activations and, when
 * LEAK_MiB > 0, keep LEAK_MiB more (in leaky_step); MS milliseconds per step. With
 * GG_WAIT_STDIN=1 it then prints WAITING and waits for its stdin to close before it
 * ends (a handshake: the test acts on the process meanwhile). With GG_STEP_SYNC=1 each
 * step waits for gpuguard's next periodic snapshot of this process to appear in
 * GPUGUARD_DIR (a handshake: one step between each two snapshots, however slow the
 * machine). ---- */

/* Snapshot reports of this process in GPUGUARD_DIR (gpuguard.*.<pid>.<seq>.snapshot.json). */
static int snapshots(void)
{
    const char *dir = getenv("GPUGUARD_DIR");
    DIR *d = opendir(dir ? dir : ".");
    if (!d) return 0;
    char pid[32];
    snprintf(pid, sizeof pid, ".%d.", (int)getpid());
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t len = strlen(e->d_name);
        const char *tail = ".snapshot.json";
        if (strncmp(e->d_name, "gpuguard.", 9) == 0 && strstr(e->d_name, pid) &&
            len > strlen(tail) && strcmp(e->d_name + len - strlen(tail), tail) == 0)
            n++;
    }
    closedir(d);
    return n;
}

/* Waits (60 s at most) until a snapshot newer than the `seen` ones was written. */
static int next_snapshot(int seen)
{
    for (int i = 0; i < 30000; i++) {
        int n = snapshots();
        if (n > seen) return n;
        sleep_ms(2);
    }
    fprintf(stderr, "gg_multi: no snapshot came\n");
    exit(1);
}
__attribute__((noinline, noclone)) static void *leaky_step(size_t bytes)
{
    void *p = NULL;
    MUST(cudaMalloc(&p, bytes));
    __asm__ volatile("" ::: "memory");
    return p;
}

static int mode_steps(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 5;
    int ms = argc > 2 ? atoi(argv[2]) : 100;
    unsigned long long leak = argc > 3 ? strtoull(argv[3], NULL, 10) * MiB : 0;
    const char *lr = getenv("LOCAL_RANK");
    int dev = lr ? atoi(lr) : 0;
    MUST(cudaSetDevice(dev));
    const char *sync = getenv("GG_STEP_SYNC");
    int synced = sync && strcmp(sync, "1") == 0, seen = 0;
    void *weights = NULL;
    MUST(cudaMalloc(&weights, 32 * MiB));
    alloc_line((uintptr_t)weights, 32 * MiB, dev, "device");
    if (synced) seen = next_snapshot(snapshots());
    for (int s = 0; s < n; s++) {
        void *act = NULL;
        MUST(cudaMalloc(&act, 16 * MiB));
        MUST(cudaFree(act));
        if (leak) {
            void *p = leaky_step(leak);
            alloc_line((uintptr_t)p, leak, dev, "device");
        }
        if (synced)
            seen = next_snapshot(seen);
        else
            sleep_ms(ms);
    }
    const char *w = getenv("GG_WAIT_STDIN");
    if (w && strcmp(w, "1") == 0) {
        puts("WAITING");
        fflush(stdout);
        while (getchar() != EOF) {
        }
    }
    finish();
    return 0;
}

static int mode_nocuda_(int argc, char **argv) { (void)argc; (void)argv; return mode_nocuda(); }

int main(int argc, char **argv)
{
    static const struct gg_mode modes[] = {
        {"view", mode_view},
        {"caps", mode_caps},
        {"books", mode_books},
        {"steps", mode_steps},
        {"nocuda", mode_nocuda_},
        {NULL, NULL},
    };
    return gg_dispatch(modes, argc, argv);
}
