/*
 * nvml_sim.h - the subset of NVML (nvml.h) that the simulated
 * libnvidia-ml.so.1 implements, plus its own inspection API (simnvml_*).
 * Types, return codes and struct layouts follow the real nvml.h.
 */
#ifndef NVML_SIM_H
#define NVML_SIM_H

#ifdef __cplusplus
extern "C" {
#endif

typedef int nvmlReturn_t;
#define NVML_SUCCESS                        0
#define NVML_ERROR_UNINITIALIZED            1
#define NVML_ERROR_INVALID_ARGUMENT         2
#define NVML_ERROR_NOT_FOUND                6
#define NVML_ERROR_INSUFFICIENT_SIZE        7
#define NVML_ERROR_LIBRARY_NOT_FOUND        12
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN                  999

#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used; /* includes what the driver reserves */
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
    unsigned int version;    /* nvmlMemory_v2 */
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used; /* allocations only */
} nvmlMemory_v2_t;

#define NVML_STRUCT_VERSION(data, ver) (unsigned int)(sizeof(nvml##data##_v##ver##_t) | ((ver) << 24U))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(Memory, 2)

/* nvmlProcessInfo_v2_t, what nvmlDeviceGetComputeRunningProcesses_v3 fills. */
typedef struct nvmlProcessInfo_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlInit(void);
nvmlReturn_t nvmlShutdown(void);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count);
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos);
const char *nvmlErrorString(nvmlReturn_t result);

/* ---- the sim's own view (never hooked: not an nvml* name) ---- */
/* What NVML device `index` has, straight from the sim driver's books: total, the
 * fixed driver reserve, and the bytes allocated on it. The CUDA ordinal it stands
 * for (-1: a device CUDA does not show: hidden by CUDA_VISIBLE_DEVICES, or
 * one of SIMNVML_EXTRA). Returns 0 or an NVML
 * error. Needs no nvmlInit. */
int simnvml_memory(unsigned int index, unsigned long long *total, unsigned long long *reserved,
                   unsigned long long *used, int *cuda_ordinal);
/* With SIMNVML_INIT_HOLD=1: how many nvmlInit_v2 calls wait now, and the release of
 * every one waiting or to come. */
int simnvml_init_waiting(void);
void simnvml_init_release(void);

#ifdef __cplusplus
}
#endif
#endif /* NVML_SIM_H */
