/*
 * nvml_sim.c - a simulated NVML (libnvidia-ml.so.1) over the simulated driver.
 *
 * Like the real NVML it sees every device of the machine, whatever the process
 * does with CUDA: its numbers come from the sim driver's books (simcuda_*,
 * reached with dlopen("libcuda.so.1") on the first nvmlInit, so a process using
 * only NVML, like nvidia-smi, never links the driver).
 *
 *   NVML index order is the reverse of the physical devices (NVML index i is
 *   physical device n-1-i), so a tool must match devices by UUID, as on machines
 *   where CUDA_DEVICE_ORDER=FASTEST_FIRST differs from NVML's PCI order. Like the
 *   real NVML it ignores CUDA_VISIBLE_DEVICES: it lists every physical device,
 *   and a device the process's CUDA cannot see shows no allocations. UUIDs are
 *   the driver's cuDeviceGetUuid bytes as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
 *   SIMNVML_EXTRA=n (at most 4) adds n devices after those, which CUDA does not
 *   show (as under CUDA_VISIBLE_DEVICES): their UUIDs match no CUDA device.
 *   Memory: total is SIMCUDA_MEM; the driver keeps SIMNVML_RESERVED bytes of each
 *   device for itself; nvmlMemory_t.used counts that reserve plus the device's
 *   live allocations, nvmlMemory_v2_t.used the allocations only; free is what is
 *   left after both.
 *   Processes (nvmlDeviceGetComputeRunningProcesses_v3): on a device this process's
 *   CUDA sees, this process with its live bytes there (when it has some), then the
 *   entries of SIMNVML_PROCS="PID:BYTES,..." (at most 8): processes the sim pretends
 *   use every device, as other processes on a shared GPU.
 *   SIMNVML_INIT_HOLD=1: nvmlInit_v2 waits (60 s at most) until simnvml_init_release()
 *   is called, as a slow initialization on a real machine, so a test can act while
 *   one is under way (simnvml_init_waiting() counts the calls waiting).
 */
#define _GNU_SOURCE
#include "nvml_sim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define MAX_EXTRA 4
#define MAX_NVML 68
#define SIMNVML_RESERVED (1ULL << 20)
#define DEV_MAGIC 0x4c4d564eu

struct nvmlDevice_st {
    unsigned magic;
    unsigned index;
};

static struct nvmlDevice_st g_devs[MAX_NVML];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_loaded;
static int g_refs;
static unsigned g_nphys, g_nextra;

static int (*p_device_count)(void);
static unsigned long long (*p_live_bytes)(int);
static unsigned long long (*p_mem)(void);
static int (*p_uuid)(int, unsigned char *);      /* by physical index */
static int (*p_ordinal_of)(int);                 /* physical -> CUDA ordinal or -1 */

static void load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    p_device_count = (int (*)(void))dlsym(h, "simcuda_physical_count");
    p_ordinal_of = (int (*)(int))dlsym(h, "simcuda_ordinal_of");
    p_live_bytes = (unsigned long long (*)(int))dlsym(h, "simcuda_live_bytes");
    p_mem = (unsigned long long (*)(void))dlsym(h, "simcuda_mem");
    p_uuid = (int (*)(int, unsigned char *))dlsym(h, "simcuda_physical_uuid");
    if (!p_device_count || !p_ordinal_of || !p_live_bytes || !p_mem || !p_uuid) return;
    int n = p_device_count();
    const char *e = getenv("SIMNVML_EXTRA");
    int extra = e ? atoi(e) : 0;
    if (extra < 0) extra = 0;
    if (extra > MAX_EXTRA) extra = MAX_EXTRA;
    if (n < 0) n = 0;
    if (n + extra > MAX_NVML) n = MAX_NVML - extra;
    g_nphys = (unsigned)n;
    g_nextra = (unsigned)extra;
    for (unsigned i = 0; i < MAX_NVML; i++) g_devs[i] = (struct nvmlDevice_st){DEV_MAGIC, i};
    g_loaded = 1;
}

static int loaded(void)
{
    pthread_once(&g_once, load);
    return g_loaded;
}

static int initialized(void)
{
    pthread_mutex_lock(&g_lock);
    int r = g_refs > 0;
    pthread_mutex_unlock(&g_lock);
    return r;
}

static unsigned count(void) { return g_nphys + g_nextra; }

/* The physical device of NVML index i, -1 for an extra device. */
static int physical(unsigned i) { return i < g_nphys ? (int)(g_nphys - 1 - i) : -1; }

/* The CUDA ordinal of NVML index i, -1 for a device CUDA does not show. */
static int ordinal(unsigned i)
{
    int p = physical(i);
    return p >= 0 ? p_ordinal_of(p) : -1;
}

static struct nvmlDevice_st *dev_of(nvmlDevice_t d)
{
    if (!d || d < &g_devs[0] || d >= &g_devs[MAX_NVML] || d->magic != DEV_MAGIC ||
        d->index >= count())
        return NULL;
    return d;
}

/* ---- init ---- */
static int g_init_waiting, g_init_released;

int simnvml_init_waiting(void) { return __atomic_load_n(&g_init_waiting, __ATOMIC_SEQ_CST); }

void simnvml_init_release(void) { __atomic_store_n(&g_init_released, 1, __ATOMIC_SEQ_CST); }

nvmlReturn_t nvmlInit_v2(void)
{
    if (!loaded()) return NVML_ERROR_LIBRARY_NOT_FOUND;
    const char *hold = getenv("SIMNVML_INIT_HOLD");
    if (hold && strcmp(hold, "1") == 0) {
        __atomic_add_fetch(&g_init_waiting, 1, __ATOMIC_SEQ_CST);
        struct timespec ms = {0, 1000000};
        for (int i = 0; i < 60000 && !__atomic_load_n(&g_init_released, __ATOMIC_SEQ_CST); i++)
            nanosleep(&ms, NULL);
        __atomic_sub_fetch(&g_init_waiting, 1, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_lock(&g_lock);
    g_refs++;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t rc = NVML_ERROR_UNINITIALIZED;
    if (g_refs > 0) {
        g_refs--;
        rc = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* ---- devices ---- */
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n)
{
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = count();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= count()) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_devs[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    struct nvmlDevice_st *d = dev_of(device);
    if (!d || !uuid) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned char u[16];
    int phys = physical(d->index);
    if (phys >= 0) {
        if (p_uuid(phys, u) != 0) return NVML_ERROR_UNKNOWN;
    } else {
        memcpy(u, "SIMNVML-EXTRA-00", 16);
        u[15] = (unsigned char)(d->index - g_nphys);
    }
    char text[64];
    int n = snprintf(text, sizeof text,
                     "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                     u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
                     u[12], u[13], u[14], u[15]);
    if ((unsigned)n + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(uuid, text, (size_t)n + 1);
    return NVML_SUCCESS;
}

/* total, the driver reserve and the allocations of NVML index i */
static void books(unsigned i, unsigned long long *total, unsigned long long *reserved,
                  unsigned long long *used)
{
    int ord = ordinal(i);
    *total = p_mem();
    *reserved = SIMNVML_RESERVED;
    *used = ord >= 0 ? p_live_bytes(ord) : 0;
}

static unsigned long long left(unsigned long long total, unsigned long long taken)
{
    return taken >= total ? 0 : total - taken;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    struct nvmlDevice_st *d = dev_of(device);
    if (!d || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long total, reserved, used;
    books(d->index, &total, &reserved, &used);
    memory->total = total;
    memory->used = reserved + used;
    memory->free = left(total, reserved + used);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    struct nvmlDevice_st *d = dev_of(device);
    if (!d || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total, reserved, used;
    books(d->index, &total, &reserved, &used);
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = left(total, reserved + used);
    return NVML_SUCCESS;
}

/* Handles by UUID, as nvmlDeviceGetUUID writes it. */
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < count(); i++) {
        char text[96];
        if (nvmlDeviceGetUUID(&g_devs[i], text, sizeof text) == NVML_SUCCESS &&
            strcasecmp(text, uuid) == 0) {
            *device = &g_devs[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

#define MAX_FAKE_PROCS 8

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *n,
                                                     nvmlProcessInfo_t *infos)
{
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    struct nvmlDevice_st *d = dev_of(device);
    if (!d || !n || (*n > 0 && !infos)) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlProcessInfo_t list[MAX_FAKE_PROCS + 1];
    unsigned k = 0;
    unsigned long long total, reserved, used;
    books(d->index, &total, &reserved, &used);
    if (used > 0) list[k++] = (nvmlProcessInfo_t){(unsigned)getpid(), used, ~0u, ~0u};
    const char *e = getenv("SIMNVML_PROCS");
    while (e && *e && k < MAX_FAKE_PROCS + 1) {
        char *q;
        unsigned long pid = strtoul(e, &q, 10);
        if (*q != ':') break;
        unsigned long long bytes = strtoull(q + 1, &q, 10);
        list[k++] = (nvmlProcessInfo_t){(unsigned)pid, bytes, ~0u, ~0u};
        if (*q != ',') break;
        e = q + 1;
    }
    unsigned room = *n;
    *n = k;
    if (room < k) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(infos, list, k * sizeof *list);
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "Library Not Found";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

/* ---- the sim's own view ---- */
int simnvml_memory(unsigned int index, unsigned long long *total, unsigned long long *reserved,
                   unsigned long long *used, int *cuda_ordinal)
{
    if (!loaded()) return NVML_ERROR_LIBRARY_NOT_FOUND;
    if (index >= count() || !total || !reserved || !used || !cuda_ordinal)
        return NVML_ERROR_INVALID_ARGUMENT;
    books(index, total, reserved, used);
    *cuda_ordinal = ordinal(index);
    return NVML_SUCCESS;
}
