/*
 * gg_rt.c - test program that links only the runtime (-lcudart), like most
 * CUDA applications; the runtime reaches the driver via cuGetProcAddress.
 * Usage: gg_rt MODE [args]; see gg_common.h for the output protocol.
 */
#include "gg_common.h"
#include "cudart_sim.h"

#define RT(call) MUST(call)

static void rt_alloc_line(void *p, unsigned long long bytes, int dev, const char *kind)
{
    alloc_line((uintptr_t)p, bytes, dev, kind);
}

/* ---- runtime: every runtime allocator, a known set leaked ---- */
static int mode_runtime(int argc, char **argv)
{
    (void)argc; (void)argv;
    int n;
    RT(cudaGetDeviceCount(&n));
    RT(cudaSetDevice(0));

    void *a, *b, *p, *m, *s1, *s2, *s3, *h1, *h2;
    size_t pitch;
    RT(cudaMalloc(&a, 1 * MiB));
    rt_alloc_line(a, 1 * MiB, 0, "device");
    RT(cudaMalloc(&b, 6 * MiB + 1));
    rt_alloc_line(b, 6 * MiB + 1, 0, "device");
    RT(cudaMallocPitch(&p, &pitch, 1000, 50));
    rt_alloc_line(p, pitch * 50, 0, "pitch");
    struct cudaPitchedPtr pp;
    struct cudaExtent ext = {100, 20, 10};
    RT(cudaMalloc3D(&pp, ext));
    rt_alloc_line(pp.ptr, pp.pitch * 20 * 10, 0, "pitch");
    RT(cudaMallocManaged(&m, 2 * MiB, cudaMemAttachGlobal));
    rt_alloc_line(m, 2 * MiB, 0, "managed");

    /* the copies work on the simulated memory */
    char buf[64] = "gpuguard", back[64] = "";
    RT(cudaMemcpy(a, buf, sizeof buf, cudaMemcpyHostToDevice));
    RT(cudaMemcpy(b, a, sizeof buf, cudaMemcpyDeviceToDevice));
    RT(cudaMemcpy(back, b, sizeof back, cudaMemcpyDeviceToHost));
    printf("COPY %s\n", strcmp(back, "gpuguard") == 0 ? "ok" : "bad");

    cudaStream_t st;
    RT(cudaStreamCreate(&st));
    RT(cudaMallocAsync(&s1, 1 * MiB, st));
    rt_alloc_line(s1, 1 * MiB, 0, "pool");
    RT(cudaMallocAsync(&s2, 2 * MiB, st));
    rt_alloc_line(s2, 2 * MiB, 0, "pool");
    cudaMemPool_t pool;
    RT(cudaDeviceGetDefaultMemPool(&pool, 0));
    RT(cudaMallocFromPoolAsync(&s3, 3 * MiB, pool, st));
    rt_alloc_line(s3, 3 * MiB, 0, "pool");
    RT(cudaFreeAsync(s1, st));
    free_line((uintptr_t)s1);
    RT(cudaStreamSynchronize(st));

    RT(cudaMallocHost(&h1, 1 * MiB));
    rt_alloc_line(h1, 1 * MiB, -1, "host");
    RT(cudaHostAlloc(&h2, 12345, cudaHostAllocDefault));
    rt_alloc_line(h2, 12345, -1, "host");

    void *d1 = NULL;
    int other = n > 1 ? 1 : 0;
    RT(cudaSetDevice(other));
    RT(cudaMalloc(&d1, 4 * MiB));
    rt_alloc_line(d1, 4 * MiB, other, "device");
    RT(cudaSetDevice(0));
    mid_report("all_live");

    size_t fr, tot;
    RT(cudaMemGetInfo(&fr, &tot));
    printf("MEMINFO free=%zu total=%zu\n", fr, tot);

    RT(cudaFree(a));
    free_line((uintptr_t)a);
    RT(cudaFree(pp.ptr));
    free_line((uintptr_t)pp.ptr);
    RT(cudaFreeHost(h1));
    free_line((uintptr_t)h1);
    RT(cudaFree(NULL));
    RT(cudaMemPoolTrimTo(pool, 0));
    RT(cudaDeviceSynchronize());

    leak_line((uintptr_t)b, 6 * MiB + 1);
    leak_line((uintptr_t)p, pitch * 50);
    leak_line((uintptr_t)m, 2 * MiB);
    leak_line((uintptr_t)s2, 2 * MiB);
    leak_line((uintptr_t)s3, 3 * MiB);
    leak_line((uintptr_t)h2, 12345);
    leak_line((uintptr_t)d1, 4 * MiB);
    /* which driver variants the runtime's lookups picked (SIMCUDART_PTDS) */
    print_calls("cuMemAllocAsync");
    print_calls("cuMemAllocAsync_ptsz");
    print_calls("cuMemAllocFromPoolAsync");
    print_calls("cuMemAllocFromPoolAsync_ptsz");
    print_calls("cuMemFreeAsync");
    print_calls("cuMemFreeAsync_ptsz");
    print_gg();
    print_sim();
    puts("OK");
    return 0;
}

/* ---- rt_errors: error codes as the runtime maps them ---- */
static int mode_rt_errors(int argc, char **argv)
{
    (void)argc; (void)argv;
    void *p = NULL;
    rc_line("cudaSetDevice.bad", cudaSetDevice(999));
    rc_line("cudaMalloc.null", cudaMalloc(NULL, 16));
    rc_line("cudaMalloc.zero", cudaMalloc(&p, 0));
    rc_line("cudaFree.bogus", cudaFree((void *)0xdead0000000ULL));
    rc_line("cudaMalloc.huge", cudaMalloc(&p, 1ULL << 60));
    printf("ERRSTR %s\n", cudaGetErrorString(cudaErrorMemoryAllocation));
    print_gg();
    print_sim();
    puts("OK");
    return 0;
}

static int mode_nocuda_(int argc, char **argv) { (void)argc; (void)argv; return mode_nocuda(); }

static const struct gg_mode g_modes[] = {
    {"runtime", mode_runtime},
    {"rt_errors", mode_rt_errors},
    {"nocuda", mode_nocuda_},
    {NULL, NULL},
};

int main(int argc, char **argv) { return gg_dispatch(g_modes, argc, argv); }
