/*
 * gg_nvml.c - a monitoring tool in the manner of nvidia-smi: it links only NVML
 * (-lnvidia-ml) and never calls CUDA. Usage: gg_nvml MODE; see gg_common.h and
 * gg_cap.c for the line protocol (NVML1, NVML2, THREADS).
 */
#include "gg_common.h"
#include "nvml_sim.h"

static void lines(const char *path, __typeof__(&nvmlDeviceGetMemoryInfo) mem,
                  __typeof__(&nvmlDeviceGetMemoryInfo_v2) mem2)
{
    unsigned n = 0;
    MUST(nvmlDeviceGetCount_v2(&n));
    for (unsigned i = 0; i < n; i++) {
        nvmlDevice_t d;
        MUST(nvmlDeviceGetHandleByIndex_v2(i, &d));
        char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        MUST(nvmlDeviceGetUUID(d, uuid, sizeof uuid));
        nvmlMemory_t m;
        memset(&m, 0, sizeof m);
        int rc = mem(d, &m);
        printf("NVML1 path=%s idx=%u uuid=%s rc=%d total=%llu free=%llu used=%llu\n", path, i,
               uuid, rc, m.total, m.free, m.used);
        nvmlMemory_v2_t m2;
        memset(&m2, 0, sizeof m2);
        m2.version = nvmlMemory_v2;
        rc = mem2(d, &m2);
        printf("NVML2 path=%s idx=%u uuid=%s rc=%d total=%llu reserved=%llu free=%llu used=%llu\n",
               path, i, uuid, rc, m2.total, m2.reserved, m2.free, m2.used);
    }
}

/* ---- smi: every device's memory, by linked symbol and by dlopen + dlsym ---- */
static int mode_smi(int argc, char **argv)
{
    (void)argc; (void)argv;
    MUST(nvmlInit_v2());
    lines("link", nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo_v2);
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    __typeof__(&nvmlDeviceGetMemoryInfo) mem =
        h ? (__typeof__(mem))dlsym(h, "nvmlDeviceGetMemoryInfo") : NULL;
    __typeof__(&nvmlDeviceGetMemoryInfo_v2) mem2 =
        h ? (__typeof__(mem2))dlsym(h, "nvmlDeviceGetMemoryInfo_v2") : NULL;
    if (!mem || !mem2) {
        fprintf(stderr, "dlopen/dlsym of libnvidia-ml.so.1 failed\n");
        return 3;
    }
    lines("dl", mem, mem2);
    MUST(nvmlShutdown());
    printf("THREADS %d\n", thread_count());
    puts("OK");
    return 0;
}

static const struct gg_mode g_modes[] = {
    {"smi", mode_smi},
    {NULL, NULL},
};

int main(int argc, char **argv) { return gg_dispatch(g_modes, argc, argv); }
