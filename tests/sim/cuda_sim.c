/*
 * cuda_sim.c - a simulated CUDA driver (libcuda.so.1) for GPU-free tests.
 *
 * Device memory is host memory: every device allocation is an anonymous
 * MAP_NORESERVE mapping (lazy, so "8 GiB devices" cost nothing until touched)
 * and the device address is the host address, so memcpy-style calls and
 * cudarc work unchanged. The sim keeps its own books of what is held per
 * device; tests compare an interposer's counters against them.
 *
 * Configuration (read once, at first use):
 *   SIMCUDA_DEVICES    number of physical devices (default 2, max 64)
 *   CUDA_VISIBLE_DEVICES  as the real driver reads it: a comma list of physical
 *                      indices or UUIDs ("GPU-..." or a unique prefix of one); the
 *                      process's ordinal i is the i-th device named. The list ends
 *                      at the first entry that names no device or one named
 *                      already; an empty value hides every device. Unset: all of
 *                      them, in physical order. UUIDs and the PCI bus id follow the
 *                      physical device; the books are kept per ordinal.
 *   SIMCUDA_MEM        bytes per device (default 8 GiB)
 *   SIMCUDA_FAIL_NEXT  the next n allocation calls fail with OUT_OF_MEMORY
 *   SIMCUDA_FREE_DELAY_MS  every device-pointer free (cuMemFree*, cuMemFreeAsync*)
 *                      sleeps this long before it gives the memory back, as a
 *                      slow free in a real driver: the memory is still held
 *                      meanwhile (default 0)
 *   SIMCUDA_SIGSAFE    1: every section under the sim's global lock runs with all
 *                      signals blocked, so a signal handler may call the sim (a
 *                      handler interrupting a thread that holds the lock would
 *                      otherwise deadlock on it, or on calloc). For tests of
 *                      allocations made from signal handlers (default 0)
 *   SIMCUDA_REENTER    1: cuMemAllocManaged allocates by calling the exported
 *                      cuMemAlloc_v2 (as a driver calling its own export, so an
 *                      interposer sees a nested call from inside the driver), then
 *                      marks the memory managed (default 0)
 *   SIMCUDA_FAULTS     fault injection: comma-separated rules NAME=CODE@WHEN, where
 *                      NAME is an export (cuMemAlloc_v2, cuMemFree_v2, cuMemCreate,
 *                      cuMemAllocAsync_ptsz, ...) or * for every call that needs
 *                      cuInit (counted together), CODE the CUresult to return, and
 *                      WHEN one of
 *                        N     the N-th call of NAME (from 1) fails
 *                        N+    the N-th and every later call fail (a lost context)
 *                        NxK   K calls from the N-th fail
 *                        %P    each call fails with probability P percent, drawn from
 *                              SIMCUDA_FAULT_SEED (default 1) and the call's number,
 *                              so a run is reproducible whatever the thread timing
 *                      CODE may also be sigN: the call sends signal N to this
 *                      process (kill(2), as Ctrl-C would arrive while the program is
 *                      inside CUDA) and then goes on as usual.
 *                      A failing call changes nothing: no memory is taken or given
 *                      back. Calls are counted after the cuInit check, before the
 *                      arguments are checked. simcuda_set_faults() replaces the rules
 *                      at run time (counting from then); simcuda_faults_injected()
 *                      says how many calls failed so far.
 *
 * Accounting rules (what the books count, per device):
 *   cuMemAlloc, _v2, Pitch, Managed the requested bytes (pitch: pitch * height)
 *   arrays                      width * max(h,1) * max(d,1) * element size * channels
 *   mipmapped arrays            sum over levels of the same, each dimension halved
 *                               per level (never below 1)
 *   VMM                         cuMemCreate size (physical memory), until the handle
 *                               is released AND no longer mapped; reservations and
 *                               mappings themselves are free
 *   pools                       reserved chunks (each allocation gets its own chunk of
 *                               size rounded up to 2 MiB); freed chunks stay reserved
 *                               until cuMemPoolTrimTo, or a synchronisation while the
 *                               pool reserves more than its release threshold
 *   pinned host memory          separate host books, not device capacity
 * Destroying a context (cuCtxDestroy_v2, last cuDevicePrimaryCtxRelease_v2,
 * cuDevicePrimaryCtxReset_v2) frees everything allocated while it was current
 * and trims that device's pools.
 *
 * Stream capture (CUDA graphs), as the real driver restricts it:
 *   cuStreamBeginCapture (CUDA 10.0, global mode), cuStreamBeginCapture_v2 (mode
 *   argument), cuStreamBeginCaptureToGraph (12.3) and their _ptsz forms put a stream
 *   into capture; cuStreamEndCapture(_ptsz) ends it and hands out a graph token. The
 *   legacy stream (NULL outside the _ptsz forms, CU_STREAM_LEGACY) cannot capture
 *   (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); a stream already capturing cannot begin
 *   again, and one not capturing cannot end (CUDA_ERROR_ILLEGAL_STATE); a global or
 *   thread-local capture must end on the thread that began it
 *   (CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, the capture goes on); a capturing stream
 *   cannot be destroyed (CUDA_ERROR_ILLEGAL_STATE).
 *   While a capture is under way, a potentially unsafe call fails with
 *   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates it, whichever thread makes
 *   it for a global-mode capture, the capturing thread for a thread-local one, never
 *   for a relaxed one; cuStreamEndCapture then returns
 *   CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (no graph). Unsafe here: the
 *   synchronizations (cuCtxSynchronize, cuStreamSynchronize, cuEventSynchronize), the
 *   synchronous allocations and frees (cuMemAlloc*, cuMemAllocPitch_v2,
 *   cuMemAllocManaged, cuMemFree*, cuMemHostAlloc, cuMemAllocHost_v2, cuMemFreeHost),
 *   the synchronous copies and sets (cuMemcpyHtoD/DtoH/DtoD/Peer, cuMemsetD8_v2) and
 *   cuMemPoolTrimTo. Stream-ordered calls (cuMemAllocAsync, cuMemFreeAsync, the Async
 *   copies) and queries (devices, contexts, pool attributes, cuStreamIsCapturing)
 *   stay legal. A thread's own capture mode (cuThreadExchangeStreamCaptureMode) is
 *   not modelled: every thread counts as in global mode.
 *
 * Everything runs synchronously: streams and events are tokens. One global
 * mutex guards all state; that is plenty for a test double.
 */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_DEVICES 64
#define GRANULARITY ((size_t)2 << 20) /* VMM granularity and pool chunk size */
#define PITCH_ALIGN 512               /* texture pitch alignment of real GPUs */
#define CTX_STACK_MAX 64
#define NBUCKETS 65536
#define DRIVER_VERSION 13000

/* --------------------------------------------------------------------------
 * Exported function table. One line per export: name, base name used by
 * cuGetProcAddress, the CUDA version that introduced this variant, and
 * whether it is the per-thread-default-stream (_ptsz) variant. The same list
 * gives each function a call counter (simcuda_calls).
 * ------------------------------------------------------------------------ */
#define SIM_FUNCS(X)                                                         \
    X(cuInit, "cuInit", 2000, 0)                                             \
    X(cuDriverGetVersion, "cuDriverGetVersion", 2020, 0)                     \
    X(cuDeviceGetCount, "cuDeviceGetCount", 2000, 0)                         \
    X(cuDeviceGet, "cuDeviceGet", 2000, 0)                                   \
    X(cuDeviceGetName, "cuDeviceGetName", 2000, 0)                           \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0)                      \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute", 2000, 0)                 \
    X(cuDeviceGetUuid, "cuDeviceGetUuid", 9020, 0)                           \
    X(cuDeviceGetUuid_v2, "cuDeviceGetUuid", 11040, 0)                       \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0)         \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0)   \
    X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, 0)       \
    X(cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState", 7000, 0)     \
    X(cuDevicePrimaryCtxSetFlags_v2, "cuDevicePrimaryCtxSetFlags", 11000, 0) \
    X(cuCtxCreate_v2, "cuCtxCreate", 3020, 0)                                \
    X(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0)                              \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", 4000, 0)                           \
    X(cuCtxGetCurrent, "cuCtxGetCurrent", 4000, 0)                           \
    X(cuCtxPushCurrent_v2, "cuCtxPushCurrent", 4000, 0)                      \
    X(cuCtxPopCurrent_v2, "cuCtxPopCurrent", 4000, 0)                        \
    X(cuCtxGetDevice, "cuCtxGetDevice", 2000, 0)                             \
    X(cuCtxSynchronize, "cuCtxSynchronize", 2000, 0)                         \
    X(cuStreamCreate, "cuStreamCreate", 2000, 0)                             \
    X(cuStreamDestroy_v2, "cuStreamDestroy", 4000, 0)                        \
    X(cuStreamSynchronize, "cuStreamSynchronize", 2000, 0)                   \
    X(cuStreamQuery, "cuStreamQuery", 2000, 0)                               \
    X(cuStreamWaitEvent, "cuStreamWaitEvent", 3020, 0)                       \
    X(cuStreamBeginCapture, "cuStreamBeginCapture", 10000, 0)               \
    X(cuStreamBeginCapture_ptsz, "cuStreamBeginCapture", 10000, 1)          \
    X(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010, 0)            \
    X(cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 10010, 1)       \
    X(cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph", 12030, 0) \
    X(cuStreamBeginCaptureToGraph_ptsz, "cuStreamBeginCaptureToGraph", 12030, 1) \
    X(cuStreamEndCapture, "cuStreamEndCapture", 10000, 0)                   \
    X(cuStreamEndCapture_ptsz, "cuStreamEndCapture", 10000, 1)              \
    X(cuStreamIsCapturing, "cuStreamIsCapturing", 10000, 0)                 \
    X(cuStreamIsCapturing_ptsz, "cuStreamIsCapturing", 10000, 1)            \
    X(cuGraphCreate, "cuGraphCreate", 10000, 0)                             \
    X(cuGraphDestroy, "cuGraphDestroy", 10000, 0)                           \
    X(cuEventCreate, "cuEventCreate", 2000, 0)                               \
    X(cuEventRecord, "cuEventRecord", 2000, 0)                               \
    X(cuEventDestroy_v2, "cuEventDestroy", 4000, 0)                          \
    X(cuEventSynchronize, "cuEventSynchronize", 2000, 0)                     \
    X(cuEventQuery, "cuEventQuery", 2000, 0)                                 \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0)                              \
    X(cuMemAlloc, "cuMemAlloc", 2000, 0)                                     \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020, 0)                                  \
    X(cuMemFree, "cuMemFree", 2000, 0)                                       \
    X(cuMemFree_v2, "cuMemFree", 3020, 0)                                    \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0)                        \
    X(cuMemAllocManaged, "cuMemAllocManaged", 6000, 0)                       \
    X(cuMemsetD8_v2, "cuMemsetD8", 3020, 0)                                  \
    X(cuMemsetD8Async, "cuMemsetD8Async", 3020, 0)                           \
    X(cuMemcpyHtoD_v2, "cuMemcpyHtoD", 3020, 0)                              \
    X(cuMemcpyDtoH_v2, "cuMemcpyDtoH", 3020, 0)                              \
    X(cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync", 3020, 0)                    \
    X(cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync", 3020, 0)                    \
    X(cuMemcpyDtoD_v2, "cuMemcpyDtoD", 3020, 0)                              \
    X(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", 4000, 0)               \
    X(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", 4000, 0)               \
    X(cuCtxDisablePeerAccess, "cuCtxDisablePeerAccess", 4000, 0)             \
    X(cuMemcpyPeer, "cuMemcpyPeer", 4000, 0)                                 \
    X(cuMemcpyPeerAsync, "cuMemcpyPeerAsync", 4000, 0)                       \
    X(cuMemHostAlloc, "cuMemHostAlloc", 2020, 0)                             \
    X(cuMemAllocHost_v2, "cuMemAllocHost", 3020, 0)                          \
    X(cuMemFreeHost, "cuMemFreeHost", 2000, 0)                               \
    X(cuArrayCreate_v2, "cuArrayCreate", 3020, 0)                            \
    X(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0)                        \
    X(cuArrayDestroy, "cuArrayDestroy", 2000, 0)                             \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, 0)             \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, 0)           \
    X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", 10020, 0) \
    X(cuMemCreate, "cuMemCreate", 10020, 0)                                  \
    X(cuMemRelease, "cuMemRelease", 10020, 0)                                \
    X(cuMemAddressReserve, "cuMemAddressReserve", 10020, 0)                  \
    X(cuMemAddressFree, "cuMemAddressFree", 10020, 0)                        \
    X(cuMemMap, "cuMemMap", 10020, 0)                                        \
    X(cuMemUnmap, "cuMemUnmap", 10020, 0)                                    \
    X(cuMemSetAccess, "cuMemSetAccess", 10020, 0)                            \
    X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020, 0)      \
    X(cuDeviceGetMemPool, "cuDeviceGetMemPool", 11020, 0)                    \
    X(cuDeviceSetMemPool, "cuDeviceSetMemPool", 11020, 0)                    \
    X(cuMemPoolCreate, "cuMemPoolCreate", 11020, 0)                          \
    X(cuMemPoolDestroy, "cuMemPoolDestroy", 11020, 0)                        \
    X(cuMemAllocAsync, "cuMemAllocAsync", 11020, 0)                          \
    X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1)                     \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0)          \
    X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, 1)     \
    X(cuMemFreeAsync, "cuMemFreeAsync", 11020, 0)                            \
    X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, 1)                       \
    X(cuMemPoolTrimTo, "cuMemPoolTrimTo", 11020, 0)                          \
    X(cuMemPoolGetAttribute, "cuMemPoolGetAttribute", 11020, 0)              \
    X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", 11020, 0)              \
    X(cuGetErrorString, "cuGetErrorString", 6000, 0)                         \
    X(cuGetErrorName, "cuGetErrorName", 6000, 0)                             \
    X(cuGetProcAddress, "cuGetProcAddress", 11030, 0)                        \
    X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0)

enum {
#define X(fn, base, ver, ptsz) ID_##fn,
    SIM_FUNCS(X)
#undef X
    ID_COUNT
};

static unsigned long long g_calls[ID_COUNT];
/* The export being entered on this thread, for the fault check in REQUIRE_INIT. */
static __thread int t_entered = -1;
#define CALLED(fn) \
    (t_entered = ID_##fn, __atomic_fetch_add(&g_calls[ID_##fn], 1, __ATOMIC_RELAXED))

/* --------------------------------------------------------------------------
 * State
 * ------------------------------------------------------------------------ */
#define CTX_MAGIC 0x43545853u    /* "SXTC": guards against bogus handles */
#define STREAM_MAGIC 0x4d525453u
#define EVENT_MAGIC 0x544e5645u
#define POOL_MAGIC 0x4c4f4f50u
#define GRAPH_MAGIC 0x48505247u

struct CUctx_st {
    unsigned magic;
    int dev;
    int primary;
    int alive;   /* primary: retained (refcount > 0); others: not destroyed */
    unsigned flags;
    unsigned long long peers; /* devices whose memory this context may access */
};

struct CUstream_st {
    unsigned magic;
    CUcontext ctx;
    /* capture (under the lock) */
    int capturing;
    int invalid;              /* an unsafe call invalidated it */
    CUstreamCaptureMode mode;
    pid_t owner;              /* the thread that began it */
};
struct CUgraph_st { unsigned magic; };
struct CUevent_st { unsigned magic; };

enum kind {
    K_DEVICE, K_LEGACY, K_PITCH, K_MANAGED, K_HOST, K_ARRAY, K_MIPMAP, K_POOL, K_VMM
};
#define KM(k) (1u << (k))
/* kinds a device pointer free (cuMemFree*, cuMemFreeAsync) accepts */
#define KM_DEVPTR (KM(K_DEVICE) | KM(K_LEGACY) | KM(K_PITCH) | KM(K_MANAGED) | KM(K_POOL))

struct mempool;

/* One record per held allocation (or VMM handle, or pool chunk). */
struct rec {
    struct rec *next;        /* hash chain */
    unsigned long long key;  /* address, array handle, or VMM handle id */
    enum kind kind;
    int dev;
    size_t bytes;            /* what the books count */
    void *base;              /* backing memory */
    size_t maplen;           /* mmap length of base (0: malloc'd) */
    CUcontext ctx;           /* context current at allocation */
    /* pools */
    struct mempool *pool;
    struct rec *pool_next;
    int in_use;
    size_t used;
    /* VMM */
    int fd;
    int released;
    int maps;
};

struct mapping {             /* one cuMemMap */
    struct mapping *next;
    CUdeviceptr va;
    size_t size;
    struct rec *h;
};

struct reservation {         /* one cuMemAddressReserve */
    struct reservation *next;
    CUdeviceptr va;
    size_t size;
};

struct CUmemPoolHandle_st { unsigned magic; };
struct mempool {
    struct CUmemPoolHandle_st hdr; /* first, so the handle is the pool */
    int dev;
    int is_default;
    int destroyed;
    cuuint64_t threshold;
    size_t reserved, reserved_high, used, used_high;
    int reuse[3];
    struct rec *blocks;
    struct mempool *next;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_ndev = 2;              /* devices this process sees (ordinals) */
static int g_nphys = 2;             /* devices of the machine */
static int g_phys[MAX_DEVICES];     /* ordinal -> physical index */
static size_t g_mem = (size_t)8 << 30;
static int g_initialized;
static int g_fail_next;
static unsigned g_free_delay_ms;
static int g_frees_delayed; /* frees inside their SIMCUDA_FREE_DELAY_MS wait now */

static unsigned long long g_live_bytes[MAX_DEVICES];
static unsigned long long g_live_peak[MAX_DEVICES]; /* high-water mark of g_live_bytes */
static int g_live_count[MAX_DEVICES];
static unsigned long long g_host_bytes;
static int g_host_count;

static struct CUctx_st g_primary[MAX_DEVICES];
static int g_primary_refs[MAX_DEVICES];

static struct mempool g_default_pool[MAX_DEVICES];
static struct mempool *g_current_pool[MAX_DEVICES];
static struct mempool *g_pools; /* every pool, default ones included */

static struct rec *g_buckets[NBUCKETS];
static struct mapping *g_mappings;
static struct reservation *g_reservations;
static unsigned long long g_next_vmm_id = 0x5100;

/* Per-thread context stack, as in the real driver. */
static __thread CUcontext t_stack[CTX_STACK_MAX];
static __thread int t_depth;

/* Streams capturing now (under the lock), how many (read without it first), and
 * captures invalidated so far. */
#define MAX_CAPTURES 64
static CUstream g_captures[MAX_CAPTURES];
static int g_ncaptures;
static int g_capturing;
static unsigned long long g_invalidated;
/* Each thread's per-thread default stream, as a stream object for capture. */
static __thread struct CUstream_st t_ptds;

static int g_sigsafe;
static int g_reenter;
static __thread sigset_t t_saved_mask;

static void lock(void)
{
    if (g_sigsafe) {
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &t_saved_mask);
    }
    pthread_mutex_lock(&g_lock);
}

static void unlock(void)
{
    pthread_mutex_unlock(&g_lock);
    if (g_sigsafe) pthread_sigmask(SIG_SETMASK, &t_saved_mask, NULL);
}

/* A fork while another thread holds the lock must not leave the child's
 * copy locked forever. */
static pthread_mutex_t g_fault_lock;
static void atfork_prepare(void) { lock(); pthread_mutex_lock(&g_fault_lock); }
static void atfork_release(void) { pthread_mutex_unlock(&g_fault_lock); unlock(); }

static unsigned long long env_ull(const char *name, unsigned long long dflt)
{
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    return *end ? dflt : v;
}

/* ---- fault injection (SIMCUDA_FAULTS) ---- */
#define MAX_FAULT_RULES 32
#define FAULT_ANY (-2) /* rule NAME "*" */
enum fault_when { F_AT, F_FROM, F_RANGE, F_PERCENT };
struct fault_rule {
    int id;                 /* export id, or FAULT_ANY */
    CUresult code;          /* 0 with sig: the call goes on */
    int sig;                /* the signal the call sends this process first, or 0 */
    enum fault_when when;
    unsigned long long n, k; /* F_AT/F_FROM/F_RANGE: N (and K); F_PERCENT: P */
    unsigned long long base; /* calls of the target counted before the rule was set */
};
static pthread_mutex_t g_fault_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fault_rule g_fault_rules[MAX_FAULT_RULES];
static int g_nfault_rules;             /* read without the lock as a fast path */
static unsigned long long g_fault_seed = 1;
static unsigned long long g_fault_seen[ID_COUNT]; /* calls that reached the check */
static unsigned long long g_fault_seen_any;
static unsigned long long g_faults_injected;

static int export_id(const char *name, size_t len); /* defined with the proc table */

static unsigned long long splitmix64(unsigned long long x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Parses SPEC into the rule table (replacing it). 0 on success. */
static int faults_parse(const char *spec)
{
    struct fault_rule rules[MAX_FAULT_RULES];
    int n = 0;
    const char *p = spec;
    while (*p) {
        const char *end = p + strcspn(p, ",");
        const char *eq = memchr(p, '=', (size_t)(end - p));
        if (end == p) { p++; continue; }
        if (!eq || n == MAX_FAULT_RULES) return -1;
        struct fault_rule r = {0};
        if (eq - p == 1 && *p == '*') r.id = FAULT_ANY;
        else if ((r.id = export_id(p, (size_t)(eq - p))) < 0) return -1;
        char *q;
        if (strncmp(eq + 1, "sig", 3) == 0) {
            long sig = strtol(eq + 4, &q, 10);
            if (q == eq + 4 || sig <= 0 || sig >= 65) return -1;
            r.sig = (int)sig;
        } else {
            long code = strtol(eq + 1, &q, 10);
            if (q == eq + 1 || code <= 0) return -1;
            r.code = (CUresult)code;
        }
        if (*q == '%') {
            r.when = F_PERCENT;
            r.n = strtoull(q + 1, &q, 10);
            if (r.n > 100) return -1;
        } else if (*q == '@') {
            r.n = strtoull(q + 1, &q, 10);
            if (r.n == 0) return -1;
            r.when = F_AT;
            if (*q == '+') { r.when = F_FROM; q++; }
            else if (*q == 'x') { r.when = F_RANGE; r.k = strtoull(q + 1, &q, 10); }
        } else {
            return -1;
        }
        if (q != end) return -1;
        r.base = r.id == FAULT_ANY ? __atomic_load_n(&g_fault_seen_any, __ATOMIC_RELAXED)
                                   : __atomic_load_n(&g_fault_seen[r.id], __ATOMIC_RELAXED);
        rules[n++] = r;
        p = *end ? end + 1 : end;
    }
    pthread_mutex_lock(&g_fault_lock);
    memcpy(g_fault_rules, rules, sizeof rules[0] * (size_t)n);
    __atomic_store_n(&g_nfault_rules, n, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_fault_lock);
    return 0;
}

static int rule_strikes(const struct fault_rule *r, unsigned long long call_no)
{
    if (call_no <= r->base) return 0;
    unsigned long long i = call_no - r->base; /* from 1 */
    switch (r->when) {
    case F_AT: return i == r->n;
    case F_FROM: return i >= r->n;
    case F_RANGE: return i >= r->n && i - r->n < r->k;
    case F_PERCENT:
        return splitmix64(g_fault_seed ^ splitmix64((unsigned long long)r->id * 1000003ULL + i)) %
                   100 < r->n;
    }
    return 0;
}

/* The code the entered export `id` must fail with now, or CUDA_SUCCESS. */
/* ---- a gate on one export (simcuda_gate_*), a handshake for tests ----
 * The first call of the export made by a thread other than the one that armed the
 * gate waits, before it does anything, until the gate is opened: a test can hold an
 * interposer's helper thread inside a driver call while the program moves on. */
static pthread_mutex_t g_gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_gate_cond = PTHREAD_COND_INITIALIZER;
static int g_gate_id = -1;   /* the export the gate holds; -1: no gate */
static pid_t g_gate_owner;   /* the arming thread: its calls pass */
static int g_gate_state;     /* 0 armed, 1 a call waits there, 2 open */

static void gate_check(int id)
{
    if (__atomic_load_n(&g_gate_id, __ATOMIC_ACQUIRE) != id) return;
    pthread_mutex_lock(&g_gate_lock);
    if (g_gate_id == id && g_gate_state == 0 && gettid() != g_gate_owner) {
        g_gate_state = 1;
        pthread_cond_broadcast(&g_gate_cond);
        while (g_gate_state != 2) pthread_cond_wait(&g_gate_cond, &g_gate_lock);
    }
    pthread_mutex_unlock(&g_gate_lock);
}

static CUresult fault_check(int id)
{
    if (id < 0) return CUDA_SUCCESS;
    gate_check(id);
    unsigned long long mine = __atomic_add_fetch(&g_fault_seen[id], 1, __ATOMIC_RELAXED);
    unsigned long long any = __atomic_add_fetch(&g_fault_seen_any, 1, __ATOMIC_RELAXED);
    if (__atomic_load_n(&g_nfault_rules, __ATOMIC_ACQUIRE) == 0) return CUDA_SUCCESS;
    CUresult rc = CUDA_SUCCESS;
    int sig = 0;
    pthread_mutex_lock(&g_fault_lock);
    for (int i = 0; i < g_nfault_rules && rc == CUDA_SUCCESS; i++) {
        const struct fault_rule *r = &g_fault_rules[i];
        int strikes = (r->id == id && rule_strikes(r, mine)) ||
                      (r->id == FAULT_ANY && rule_strikes(r, any));
        if (strikes && r->sig) sig = r->sig;
        else if (strikes) rc = r->code;
    }
    pthread_mutex_unlock(&g_fault_lock);
    if (sig) kill(getpid(), sig);
    if (rc != CUDA_SUCCESS) __atomic_fetch_add(&g_faults_injected, 1, __ATOMIC_RELAXED);
    return rc;
}

/* The UUID of physical device `phys` (what cuDeviceGetUuid, simcuda_uuid and the
 * simulated NVML report for it). */
static void uuid_bytes(int phys, char out[16])
{
    memcpy(out, "SIMCUDA-UUID-00", 16);
    out[14] = (char)('0' + phys % 10);
    out[15] = (char)phys;
}

/* The same in NVML's text form, GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx. */
static void uuid_text(int phys, char out[48])
{
    unsigned char u[16];
    uuid_bytes(phys, (char *)u);
    snprintf(out, 48, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
             u[13], u[14], u[15]);
}

/* One entry of CUDA_VISIBLE_DEVICES: the physical device it names, or -1. */
static int visible_entry(const char *tok, size_t len)
{
    while (len && (*tok == ' ' || *tok == '\t')) { tok++; len--; }
    while (len && (tok[len - 1] == ' ' || tok[len - 1] == '\t')) len--;
    if (len == 0) return -1;
    if (len > 4 && strncmp(tok, "GPU-", 4) == 0) {
        int found = -1;
        for (int p = 0; p < g_nphys; p++) {
            char text[48];
            uuid_text(p, text);
            if (len <= strlen(text) && strncasecmp(text, tok, len) == 0) {
                if (found >= 0) return -1; /* an ambiguous prefix names nothing */
                found = p;
            }
        }
        return found;
    }
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        if (tok[i] < '0' || tok[i] > '9' || v > MAX_DEVICES) return -1;
        v = v * 10 + (tok[i] - '0');
    }
    return v < g_nphys ? v : -1;
}

static void load_visible(void)
{
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (!cvd) {
        g_ndev = g_nphys;
        for (int i = 0; i < g_nphys; i++) g_phys[i] = i;
        return;
    }
    g_ndev = 0;
    for (const char *s = cvd; *s && g_ndev < g_nphys;) {
        const char *end = strchr(s, ',');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        int p = visible_entry(s, len);
        for (int i = 0; p >= 0 && i < g_ndev; i++)
            if (g_phys[i] == p) p = -1; /* named twice: the list ends */
        if (p < 0) break;
        g_phys[g_ndev++] = p;
        if (!end) break;
        s = end + 1;
    }
}

static void load_config(void)
{
    g_nphys = (int)env_ull("SIMCUDA_DEVICES", 2);
    if (g_nphys < 0) g_nphys = 0;
    if (g_nphys > MAX_DEVICES) g_nphys = MAX_DEVICES;
    load_visible();
    g_mem = (size_t)env_ull("SIMCUDA_MEM", (size_t)8 << 30);
    g_fail_next = (int)env_ull("SIMCUDA_FAIL_NEXT", 0);
    g_free_delay_ms = (unsigned)env_ull("SIMCUDA_FREE_DELAY_MS", 0);
    g_sigsafe = env_ull("SIMCUDA_SIGSAFE", 0) != 0;
    g_reenter = env_ull("SIMCUDA_REENTER", 0) != 0;
    g_fault_seed = env_ull("SIMCUDA_FAULT_SEED", 1);
    const char *faults = getenv("SIMCUDA_FAULTS");
    if (faults && *faults && faults_parse(faults) != 0) {
        fprintf(stderr, "simcuda: bad SIMCUDA_FAULTS %s\n", faults);
        abort(); /* a test that meant to inject faults must not run without them */
    }
    for (int d = 0; d < MAX_DEVICES; d++) {
        g_primary[d] = (struct CUctx_st){CTX_MAGIC, d, 1, 0, 0, 0};
        struct mempool *p = &g_default_pool[d];
        p->hdr.magic = POOL_MAGIC;
        p->dev = d;
        p->is_default = 1;
        p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
        if (d < g_ndev) { p->next = g_pools; g_pools = p; }
        g_current_pool[d] = p;
    }
    pthread_atfork(atfork_prepare, atfork_release, atfork_release);
}

static void config(void) { pthread_once(&g_once, load_config); }

static int initialized(void) { return __atomic_load_n(&g_initialized, __ATOMIC_ACQUIRE); }

static CUresult fault_check(int id);

/* Every call except a few (cuInit, versions, lookups, error strings) needs cuInit.
 * The injected faults (SIMCUDA_FAULTS) strike here, before anything is changed. */
#define REQUIRE_INIT()                                   \
    do {                                                 \
        config();                                        \
        if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED; \
        CUresult fault_ = fault_check(t_entered);        \
        t_entered = -1;                                  \
        if (fault_ != CUDA_SUCCESS) return fault_;       \
    } while (0)

/* A potentially unsafe call while captures are under way: every capture it conflicts
 * with (any global-mode one, a thread-local one of this thread) is invalidated, and
 * the call fails without doing anything. */
static CUresult capture_conflict(void)
{
    if (!__atomic_load_n(&g_capturing, __ATOMIC_ACQUIRE)) return CUDA_SUCCESS;
    pid_t me = gettid();
    int hit = 0;
    lock();
    for (int i = 0; i < g_ncaptures; i++) {
        CUstream c = g_captures[i];
        if (c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
            (c->mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && c->owner == me)) {
            if (!c->invalid) g_invalidated++;
            c->invalid = 1;
            hit = 1;
        }
    }
    unlock();
    return hit ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

#define CAPTURE_UNSAFE()                              \
    do {                                              \
        CUresult cap_ = capture_conflict();           \
        if (cap_ != CUDA_SUCCESS) return cap_;        \
    } while (0)

static int valid_dev(CUdevice d) { return d >= 0 && d < g_ndev; }

/* Consumes one injected failure, if any are pending. */
static int take_fail(void)
{
    int n = __atomic_load_n(&g_fail_next, __ATOMIC_RELAXED);
    while (n > 0) {
        if (__atomic_compare_exchange_n(&g_fail_next, &n, n - 1, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            return 1;
    }
    return 0;
}

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* The calling thread's current context, checked for use. */
static CUresult cur_ctx(CUcontext *out)
{
    if (t_depth == 0 || !t_stack[t_depth - 1]) return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = t_stack[t_depth - 1];
    if (!c->alive)
        return c->primary ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = c;
    return CUDA_SUCCESS;
}

/* ---- hash of records ---- */
static size_t bucket_of(unsigned long long key)
{
    return (size_t)(((key >> 4) * 0x9E3779B97F4A7C15ull) >> 48) & (NBUCKETS - 1);
}

static void rec_insert(struct rec *r)
{
    size_t b = bucket_of(r->key);
    r->next = g_buckets[b];
    g_buckets[b] = r;
}

static struct rec *rec_find(unsigned long long key, unsigned kinds)
{
    for (struct rec *r = g_buckets[bucket_of(key)]; r; r = r->next)
        if (r->key == key && (kinds & KM(r->kind))) return r;
    return NULL;
}

static void rec_unlink(struct rec *r)
{
    for (struct rec **pp = &g_buckets[bucket_of(r->key)]; *pp; pp = &(*pp)->next)
        if (*pp == r) { *pp = r->next; return; }
}

/* ---- backing memory ---- */
static void *map_anon(size_t bytes, int low32)
{
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
#ifdef MAP_32BIT
    if (low32) flags |= MAP_32BIT;
#endif
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) return NULL;
    if (low32 && (uintptr_t)p + bytes > (uintptr_t)UINT_MAX) { /* no MAP_32BIT here */
        munmap(p, bytes);
        return NULL;
    }
    return p;
}

static int fits(int dev, size_t bytes)
{
    return bytes <= g_mem && g_live_bytes[dev] <= g_mem - bytes;
}

static void book_add(int dev, size_t bytes)
{
    g_live_bytes[dev] += bytes;
    if (g_live_bytes[dev] > g_live_peak[dev]) g_live_peak[dev] = g_live_bytes[dev];
    g_live_count[dev]++;
}

static void book_sub(int dev, size_t bytes)
{
    g_live_bytes[dev] -= bytes;
    g_live_count[dev]--;
}

/* Records a new device allocation backed by a fresh mapping (lock held). */
/* Records of linear allocations (lock held). With SIMCUDA_SIGSAFE they come from a
 * fixed store instead of calloc, so a signal handler that interrupted malloc may
 * still allocate through the sim. */
#define SIGSAFE_RECS 65536
static struct rec g_rec_store[SIGSAFE_RECS];
static int g_rec_store_used;
static struct rec *g_rec_spare; /* freed store records, chained by next */

static struct rec *rec_new(void)
{
    if (!g_sigsafe) return calloc(1, sizeof(struct rec));
    struct rec *r = g_rec_spare;
    if (r) g_rec_spare = r->next;
    else if (g_rec_store_used < SIGSAFE_RECS) r = &g_rec_store[g_rec_store_used++];
    else return NULL;
    memset(r, 0, sizeof *r);
    return r;
}

static void rec_delete(struct rec *r)
{
    if (r >= g_rec_store && r < g_rec_store + SIGSAFE_RECS) {
        r->next = g_rec_spare;
        g_rec_spare = r;
    } else {
        free(r);
    }
}

static CUresult dev_alloc_locked(enum kind kind, int dev, size_t bytes, CUcontext ctx,
                                 unsigned long long *key_out)
{
    if (!fits(dev, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = map_anon(bytes, kind == K_LEGACY);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    struct rec *r = rec_new();
    if (!r) { munmap(p, bytes); return CUDA_ERROR_OUT_OF_MEMORY; }
    r->key = (uintptr_t)p;
    r->kind = kind;
    r->dev = dev;
    r->bytes = bytes;
    r->base = p;
    r->maplen = bytes;
    r->ctx = ctx;
    r->fd = -1;
    rec_insert(r);
    book_add(dev, bytes);
    *key_out = r->key;
    return CUDA_SUCCESS;
}

/* Drops a record and its backing memory from the books (lock held). */
static void rec_destroy_locked(struct rec *r)
{
    rec_unlink(r);
    if (r->kind == K_HOST) {
        free(r->base);
        g_host_bytes -= r->bytes;
        g_host_count--;
    } else {
        if (r->base && r->maplen) munmap(r->base, r->maplen);
        if (r->fd >= 0) close(r->fd);
        book_sub(r->dev, r->bytes);
    }
    rec_delete(r);
}

/* ---- pools (lock held throughout) ---- */
static void pool_note_highs(struct mempool *p)
{
    if (p->reserved > p->reserved_high) p->reserved_high = p->reserved;
    if (p->used > p->used_high) p->used_high = p->used;
}

static void pool_release_block(struct mempool *p, struct rec *b)
{
    for (struct rec **pp = &p->blocks; *pp; pp = &(*pp)->pool_next)
        if (*pp == b) { *pp = b->pool_next; break; }
    p->reserved -= b->bytes;
    rec_destroy_locked(b);
}

/* Gives unused chunks back until the pool reserves at most `keep` bytes. */
static void pool_trim(struct mempool *p, size_t keep)
{
    struct rec *b = p->blocks;
    while (b && p->reserved > keep) {
        struct rec *next = b->pool_next;
        if (!b->in_use) pool_release_block(p, b);
        b = next;
    }
}

/* What a synchronisation does in the real driver: pools holding more than
 * their release threshold shrink back to it. */
static void pools_sync_release(void)
{
    for (struct mempool *p = g_pools; p; p = p->next)
        if (p->reserved > p->threshold) pool_trim(p, (size_t)p->threshold);
}

static CUresult pool_alloc(struct mempool *p, size_t bytes, CUcontext ctx, CUdeviceptr *dptr)
{
    size_t chunk = round_up(bytes, GRANULARITY);
    struct rec *best = NULL;
    for (struct rec *b = p->blocks; b; b = b->pool_next)
        if (!b->in_use && b->bytes >= chunk && (!best || b->bytes < best->bytes)) best = b;
    if (!best) {
        if (!fits(p->dev, chunk)) pool_trim(p, 0); /* reuse our own slack first */
        unsigned long long key;
        CUresult rc = dev_alloc_locked(K_POOL, p->dev, chunk, ctx, &key);
        if (rc != CUDA_SUCCESS) return rc;
        best = rec_find(key, KM(K_POOL));
        best->pool = p;
        best->pool_next = p->blocks;
        p->blocks = best;
        p->reserved += chunk;
    }
    best->in_use = 1;
    best->used = bytes;
    best->ctx = ctx;
    p->used += bytes;
    pool_note_highs(p);
    *dptr = best->key;
    return CUDA_SUCCESS;
}

static void pool_free_block(struct rec *b)
{
    struct mempool *p = b->pool;
    b->in_use = 0;
    p->used -= b->used;
    b->used = 0;
    if (p->destroyed) pool_release_block(p, b);
}

static struct mempool *pool_from_handle(CUmemoryPool h)
{
    for (struct mempool *p = g_pools; p; p = p->next)
        if ((CUmemoryPool)&p->hdr == h && !p->destroyed) return p;
    return NULL;
}

/* ---- VMM helpers (lock held) ---- */
static void unmap_mapping(struct mapping *m)
{
    /* Keep the address range reserved: replace the mapping by inaccessible
     * anonymous memory at the same place. */
    mmap((void *)(uintptr_t)m->va, m->size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    m->h->maps--;
}

static void vmm_maybe_free(struct rec *h)
{
    if (h->released && h->maps == 0) rec_destroy_locked(h);
}

/* Removes every mapping that satisfies `pred` and frees handles left unheld. */
static int unmap_where(int (*pred)(struct mapping *, const void *), const void *arg)
{
    int n = 0;
    struct mapping **pp = &g_mappings;
    while (*pp) {
        struct mapping *m = *pp;
        if (pred(m, arg)) {
            *pp = m->next;
            unmap_mapping(m);
            vmm_maybe_free(m->h);
            free(m);
            n++;
        } else {
            pp = &m->next;
        }
    }
    return n;
}

struct range { CUdeviceptr va; size_t size; };
static int in_range(struct mapping *m, const void *arg)
{
    const struct range *r = arg;
    return m->va >= r->va && m->va + m->size <= r->va + r->size;
}
static int of_handle(struct mapping *m, const void *arg) { return m->h == arg; }

static struct reservation *reservation_holding(CUdeviceptr va, size_t size)
{
    for (struct reservation *r = g_reservations; r; r = r->next)
        if (va >= r->va && size <= r->size && va - r->va <= r->size - size) return r;
    return NULL;
}

/* ---- context teardown (lock held) ---- */
static void free_ctx_allocations(CUcontext ctx)
{
    for (size_t b = 0; b < NBUCKETS; b++) {
        struct rec *r = g_buckets[b];
        while (r) {
            struct rec *next = r->next;
            if (r->ctx == ctx) {
                if (r->kind == K_POOL) {
                    if (r->in_use) pool_free_block(r);
                } else if (r->kind == K_VMM) {
                    if (!r->released) {
                        r->released = 1;
                        /* may free r itself; `next` was read before */
                        if (r->maps) unmap_where(of_handle, r);
                        else vmm_maybe_free(r);
                    }
                } else {
                    rec_destroy_locked(r);
                }
            }
            r = next;
        }
    }
    for (struct mempool *p = g_pools; p; p = p->next)
        if (p->dev == ctx->dev) pool_trim(p, 0);
}

/* ==========================================================================
 * Initialisation, devices
 * ======================================================================== */
CUresult cuInit(unsigned int flags)
{
    CALLED(cuInit);
    config();
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (g_ndev == 0) return CUDA_ERROR_NO_DEVICE;
    __atomic_store_n(&g_initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version)
{
    CALLED(cuDriverGetVersion);
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = DRIVER_VERSION;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
    CALLED(cuDeviceGetCount);
    REQUIRE_INIT();
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = g_ndev;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    CALLED(cuDeviceGet);
    REQUIRE_INIT();
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CALLED(cuDeviceGetName);
    REQUIRE_INIT();
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "SimCUDA Device %d", dev);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CALLED(cuDeviceTotalMem_v2);
    REQUIRE_INIT();
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = g_mem;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    CALLED(cuDeviceGetAttribute);
    REQUIRE_INIT();
    if (!pi || attrib <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    int v;
    /* Plausible values of a Hopper-class part; anything else reads as 0 so
     * that callers probing unknown attributes keep going. */
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case 2: case 3: v = 1024; break;                 /* max block dim x, y */
    case 4: v = 64; break;                           /* max block dim z */
    case 5: v = INT_MAX; break;                      /* max grid dim x */
    case 6: case 7: v = 65535; break;                /* max grid dim y, z */
    case 8: v = 49152; break;                        /* shared mem per block */
    case 9: v = 65536; break;                        /* constant memory */
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case 13: v = 1980000; break;                     /* clock rate, kHz */
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 132; break;
    case 31: v = 1; break;                           /* concurrent kernels */
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = g_phys[dev] + 1; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; break;
    default: v = 0; break;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

static CUresult fill_uuid(CUuuid *uuid, CUdevice dev)
{
    REQUIRE_INIT();
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    uuid_bytes(g_phys[dev], uuid->bytes);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { CALLED(cuDeviceGetUuid); return fill_uuid(uuid, dev); }
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { CALLED(cuDeviceGetUuid_v2); return fill_uuid(uuid, dev); }

/* ==========================================================================
 * Contexts
 * ======================================================================== */
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CALLED(cuDevicePrimaryCtxRetain);
    REQUIRE_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    lock();
    g_primary_refs[dev]++;
    g_primary[dev].alive = 1;
    unlock();
    *pctx = &g_primary[dev];
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CALLED(cuDevicePrimaryCtxRelease_v2);
    REQUIRE_INIT();
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    lock();
    if (g_primary_refs[dev] == 0) { unlock(); return CUDA_ERROR_INVALID_CONTEXT; }
    if (--g_primary_refs[dev] == 0) {
        /* the last release destroys the primary context and its memory */
        free_ctx_allocations(&g_primary[dev]);
        g_primary[dev].alive = 0;
    }
    unlock();
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CALLED(cuDevicePrimaryCtxReset_v2);
    REQUIRE_INIT();
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    lock();
    /* Destroys every allocation of the primary context; retains stay valid
     * and the context is usable again at once. */
    free_ctx_allocations(&g_primary[dev]);
    unlock();
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CALLED(cuDevicePrimaryCtxGetState);
    REQUIRE_INIT();
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    lock();
    *flags = g_primary[dev].flags;
    *active = g_primary[dev].alive;
    unlock();
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    CALLED(cuDevicePrimaryCtxSetFlags_v2);
    REQUIRE_INIT();
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    lock();
    g_primary[dev].flags = flags;
    unlock();
    return CUDA_SUCCESS;
}

static CUresult push_ctx(CUcontext ctx)
{
    if (t_depth >= CTX_STACK_MAX) return CUDA_ERROR_INVALID_VALUE;
    t_stack[t_depth++] = ctx;
    return CUDA_SUCCESS;
}

static int ctx_valid(CUcontext ctx) { return ctx && ctx->magic == CTX_MAGIC; }

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CALLED(cuCtxCreate_v2);
    REQUIRE_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    /* Never freed: a destroyed context stays recognisable as destroyed. */
    CUcontext c = calloc(1, sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    *c = (struct CUctx_st){CTX_MAGIC, dev, 0, 1, flags, 0};
    CUresult rc = push_ctx(c); /* a new context becomes current */
    if (rc != CUDA_SUCCESS) { free(c); return rc; }
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CALLED(cuCtxDestroy_v2);
    REQUIRE_INIT();
    if (!ctx_valid(ctx)) return CUDA_ERROR_INVALID_VALUE;
    if (ctx->primary || !ctx->alive) return CUDA_ERROR_INVALID_CONTEXT;
    lock();
    free_ctx_allocations(ctx);
    ctx->alive = 0;
    unlock();
    /* drop it from this thread's stack, wherever it sits */
    int j = 0;
    for (int i = 0; i < t_depth; i++)
        if (t_stack[i] != ctx) t_stack[j++] = t_stack[i];
    t_depth = j;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CALLED(cuCtxSetCurrent);
    REQUIRE_INIT();
    if (!ctx) { /* NULL pops, per the documentation */
        if (t_depth > 0) t_depth--;
        return CUDA_SUCCESS;
    }
    if (!ctx_valid(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == 0) return push_ctx(ctx);
    t_stack[t_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CALLED(cuCtxGetCurrent);
    REQUIRE_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = t_depth ? t_stack[t_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    CALLED(cuCtxPushCurrent_v2);
    REQUIRE_INIT();
    if (!ctx_valid(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    return push_ctx(ctx);
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CALLED(cuCtxPopCurrent_v2);
    REQUIRE_INIT();
    if (t_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = t_stack[--t_depth];
    if (pctx) *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device)
{
    CALLED(cuCtxGetDevice);
    REQUIRE_INIT();
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c;
    CUresult rc = cur_ctx(&c);
    if (rc != CUDA_SUCCESS) return rc;
    *device = c->dev;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void)
{
    CALLED(cuCtxSynchronize);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    CUcontext c;
    CUresult rc = cur_ctx(&c);
    if (rc != CUDA_SUCCESS) return rc;
    lock();
    pools_sync_release();
    unlock();
    return CUDA_SUCCESS;
}

/* ==========================================================================
 * Streams and events (tokens: all work is synchronous)
 * ======================================================================== */

/* The context a stream belongs to: NULL and the two special handles mean the
 * calling thread's current context. */
static CUresult stream_ctx(CUstream s, CUcontext *out)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return cur_ctx(out);
    if (s->magic != STREAM_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if (!s->ctx->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = s->ctx;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int flags)
{
    CALLED(cuStreamCreate);
    REQUIRE_INIT();
    (void)flags;
    if (!phStream) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c;
    CUresult rc = cur_ctx(&c);
    if (rc != CUDA_SUCCESS) return rc;
    CUstream s = calloc(1, sizeof *s);
    if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = STREAM_MAGIC;
    s->ctx = c;
    *phStream = s;
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream hStream)
{
    CALLED(cuStreamDestroy_v2);
    REQUIRE_INIT();
    if (!hStream || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD ||
        hStream->magic != STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    lock();
    int capturing = hStream->capturing;
    unlock();
    if (capturing) return CUDA_ERROR_ILLEGAL_STATE;
    hStream->magic = 0;
    free(hStream);
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    CALLED(cuStreamSynchronize);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    CUcontext c;
    CUresult rc = stream_ctx(hStream, &c);
    if (rc != CUDA_SUCCESS) return rc;
    lock();
    pools_sync_release();
    unlock();
    return CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream hStream)
{
    CALLED(cuStreamQuery);
    REQUIRE_INIT();
    CUcontext c;
    return stream_ctx(hStream, &c);
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int flags)
{
    CALLED(cuStreamWaitEvent);
    REQUIRE_INIT();
    (void)flags;
    if (!hEvent || hEvent->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    CUcontext c;
    return stream_ctx(hStream, &c);
}

/* ---- capture ---- */

/* The stream object a capture call names: the per-thread stream for
 * CU_STREAM_PER_THREAD and, in the _ptsz forms, NULL; the legacy stream cannot
 * capture. */
static CUresult capture_stream(CUstream s, int ptsz, CUstream *out)
{
    if (s == CU_STREAM_PER_THREAD || (s == NULL && ptsz)) {
        CUcontext c;
        CUresult rc = cur_ctx(&c);
        if (rc != CUDA_SUCCESS) return rc;
        t_ptds.magic = STREAM_MAGIC;
        t_ptds.ctx = c;
        *out = &t_ptds;
        return CUDA_SUCCESS;
    }
    if (s == NULL || s == CU_STREAM_LEGACY) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (s->magic != STREAM_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if (!s->ctx->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = s;
    return CUDA_SUCCESS;
}

static CUresult begin_capture(CUstream hStream, int ptsz, CUstreamCaptureMode mode)
{
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    CUstream s;
    CUresult rc = capture_stream(hStream, ptsz, &s);
    if (rc != CUDA_SUCCESS) return rc;
    lock();
    if (s->capturing) rc = CUDA_ERROR_ILLEGAL_STATE;
    else if (g_ncaptures == MAX_CAPTURES) rc = CUDA_ERROR_OUT_OF_MEMORY;
    else {
        s->capturing = 1;
        s->invalid = 0;
        s->mode = mode;
        s->owner = gettid();
        g_captures[g_ncaptures++] = s;
        __atomic_store_n(&g_capturing, g_ncaptures, __ATOMIC_RELEASE);
    }
    unlock();
    return rc;
}

static CUresult end_capture(CUstream hStream, int ptsz, CUgraph *phGraph)
{
    if (!phGraph) return CUDA_ERROR_INVALID_VALUE;
    CUstream s;
    CUresult rc = capture_stream(hStream, ptsz, &s);
    if (rc != CUDA_SUCCESS) return rc;
    CUgraph g = calloc(1, sizeof *g);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    g->magic = GRAPH_MAGIC;
    lock();
    if (!s->capturing) rc = CUDA_ERROR_ILLEGAL_STATE;
    else if (s->mode != CU_STREAM_CAPTURE_MODE_RELAXED && s->owner != gettid())
        rc = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    else {
        for (int i = 0; i < g_ncaptures; i++)
            if (g_captures[i] == s) { g_captures[i] = g_captures[--g_ncaptures]; break; }
        __atomic_store_n(&g_capturing, g_ncaptures, __ATOMIC_RELEASE);
        s->capturing = 0;
        rc = s->invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
        s->invalid = 0;
    }
    unlock();
    if (rc == CUDA_SUCCESS) {
        *phGraph = g;
    } else {
        free(g);
        if (rc == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) *phGraph = NULL;
    }
    return rc;
}

static CUresult is_capturing(CUstream hStream, int ptsz, CUstreamCaptureStatus *status)
{
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    CUstream s;
    CUresult rc = capture_stream(hStream, ptsz, &s);
    if (rc == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) {
        *status = CU_STREAM_CAPTURE_STATUS_NONE; /* the legacy stream never captures */
        return CUDA_SUCCESS;
    }
    if (rc != CUDA_SUCCESS) return rc;
    lock();
    *status = !s->capturing ? CU_STREAM_CAPTURE_STATUS_NONE
              : s->invalid  ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                            : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    unlock();
    return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture(CUstream hStream)
{
    CALLED(cuStreamBeginCapture);
    REQUIRE_INIT();
    return begin_capture(hStream, 0, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
    CALLED(cuStreamBeginCapture_ptsz);
    REQUIRE_INIT();
    return begin_capture(hStream, 1, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    CALLED(cuStreamBeginCapture_v2);
    REQUIRE_INIT();
    return begin_capture(hStream, 0, mode);
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    CALLED(cuStreamBeginCapture_v2_ptsz);
    REQUIRE_INIT();
    return begin_capture(hStream, 1, mode);
}

static CUresult begin_to_graph(CUstream hStream, int ptsz, CUgraph hGraph, size_t n,
                               const CUgraphNode *deps, CUstreamCaptureMode mode)
{
    if (!hGraph || hGraph->magic != GRAPH_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    if (n && !deps) return CUDA_ERROR_INVALID_VALUE;
    return begin_capture(hStream, ptsz, mode);
}

CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                     const CUgraphNode *dependencies, const void *dependencyData,
                                     size_t numDependencies, CUstreamCaptureMode mode)
{
    CALLED(cuStreamBeginCaptureToGraph);
    REQUIRE_INIT();
    (void)dependencyData;
    return begin_to_graph(hStream, 0, hGraph, numDependencies, dependencies, mode);
}

CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                          const CUgraphNode *dependencies,
                                          const void *dependencyData, size_t numDependencies,
                                          CUstreamCaptureMode mode)
{
    CALLED(cuStreamBeginCaptureToGraph_ptsz);
    REQUIRE_INIT();
    (void)dependencyData;
    return begin_to_graph(hStream, 1, hGraph, numDependencies, dependencies, mode);
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    CALLED(cuStreamEndCapture);
    REQUIRE_INIT();
    return end_capture(hStream, 0, phGraph);
}

CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    CALLED(cuStreamEndCapture_ptsz);
    REQUIRE_INIT();
    return end_capture(hStream, 1, phGraph);
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    CALLED(cuStreamIsCapturing);
    REQUIRE_INIT();
    return is_capturing(hStream, 0, captureStatus);
}

CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    CALLED(cuStreamIsCapturing_ptsz);
    REQUIRE_INIT();
    return is_capturing(hStream, 1, captureStatus);
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    CALLED(cuGraphCreate);
    REQUIRE_INIT();
    if (!phGraph || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    CUgraph g = calloc(1, sizeof *g);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    g->magic = GRAPH_MAGIC;
    *phGraph = g;
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph hGraph)
{
    CALLED(cuGraphDestroy);
    REQUIRE_INIT();
    if (!hGraph || hGraph->magic != GRAPH_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    hGraph->magic = 0;
    free(hGraph);
    return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int flags)
{
    CALLED(cuEventCreate);
    REQUIRE_INIT();
    (void)flags;
    if (!phEvent) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c;
    CUresult rc = cur_ctx(&c);
    if (rc != CUDA_SUCCESS) return rc;
    CUevent e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = EVENT_MAGIC;
    *phEvent = e;
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    CALLED(cuEventRecord);
    REQUIRE_INIT();
    if (!hEvent || hEvent->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    CUcontext c;
    return stream_ctx(hStream, &c);
}

CUresult cuEventDestroy_v2(CUevent hEvent)
{
    CALLED(cuEventDestroy_v2);
    REQUIRE_INIT();
    if (!hEvent || hEvent->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    hEvent->magic = 0;
    free(hEvent);
    return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(CUevent hEvent)
{
    CALLED(cuEventSynchronize);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    if (!hEvent || hEvent->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    lock();
    pools_sync_release();
    unlock();
    return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent hEvent)
{
    CALLED(cuEventQuery);
    REQUIRE_INIT();
    if (!hEvent || hEvent->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    return CUDA_SUCCESS;
}

/* ==========================================================================
 * Linear device memory
 * ======================================================================== */
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    CALLED(cuMemGetInfo_v2);
    REQUIRE_INIT();
    if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c;
    CUresult rc = cur_ctx(&c);
    if (rc != CUDA_SUCCESS) return rc;
    lock();
    unsigned long long live = g_live_bytes[c->dev];
    unlock();
    *free_bytes = live >= g_mem ? 0 : g_mem - live;
    *total = g_mem;
    return CUDA_SUCCESS;
}

/* Shared body of the linear allocators: checks, fault injection, books. */
static CUresult alloc_linear(enum kind kind, size_t bytes, unsigned long long *out)
{
    CUcontext c;
    CUresult rc = cur_ctx(&c);
    if (rc != CUDA_SUCCESS) return rc;
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if (take_fail()) return CUDA_ERROR_OUT_OF_MEMORY;
    lock();
    rc = dev_alloc_locked(kind, c->dev, bytes, c, out);
    unlock();
    return rc;
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    CALLED(cuMemAlloc);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long p;
    /* The legacy ABI returns a 32-bit device pointer, so this one is placed
     * below 4 GiB. */
    CUresult rc = alloc_linear(K_LEGACY, bytesize, &p);
    if (rc == CUDA_SUCCESS) *dptr = (CUdeviceptr_v1)p;
    return rc;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    CALLED(cuMemAlloc_v2);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long p;
    CUresult rc = alloc_linear(K_DEVICE, bytesize, &p);
    if (rc == CUDA_SUCCESS) *dptr = p;
    return rc;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                            size_t Height, unsigned int ElementSizeBytes)
{
    CALLED(cuMemAllocPitch_v2);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0) return CUDA_ERROR_INVALID_VALUE;
    if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = round_up(WidthInBytes, PITCH_ALIGN);
    if (Height > SIZE_MAX / pitch) return CUDA_ERROR_OUT_OF_MEMORY;
    unsigned long long p;
    CUresult rc = alloc_linear(K_PITCH, pitch * Height, &p);
    if (rc == CUDA_SUCCESS) { *dptr = p; *pPitch = pitch; }
    return rc;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    CALLED(cuMemAllocManaged);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
    if (g_reenter) {
        /* through the exported symbol (the PLT): interposable, as a real driver's */
        CUresult (*volatile own)(CUdeviceptr *, size_t) = cuMemAlloc_v2;
        CUdeviceptr d;
        CUresult rc = own(&d, bytesize);
        if (rc != CUDA_SUCCESS) return rc;
        lock();
        struct rec *r = rec_find(d, KM_DEVPTR);
        if (r) r->kind = K_MANAGED;
        unlock();
        *dptr = d;
        return CUDA_SUCCESS;
    }
    unsigned long long p;
    CUresult rc = alloc_linear(K_MANAGED, bytesize, &p);
    if (rc == CUDA_SUCCESS) *dptr = p;
    return rc;
}

/* Frees any device pointer: plain, legacy, pitch, managed or stream-ordered
 * (cuMemFree may free cuMemAllocAsync memory and vice versa, as in CUDA). */
static CUresult free_devptr(CUdeviceptr dptr)
{
    if (dptr == 0) return CUDA_ERROR_INVALID_VALUE;
    if (g_free_delay_ms) {
        /* still held meanwhile; counted so a test can see the free under way */
        __atomic_add_fetch(&g_frees_delayed, 1, __ATOMIC_SEQ_CST);
        usleep(g_free_delay_ms * 1000u);
        __atomic_sub_fetch(&g_frees_delayed, 1, __ATOMIC_SEQ_CST);
    }
    lock();
    struct rec *r = rec_find(dptr, KM_DEVPTR);
    CUresult rc = CUDA_SUCCESS;
    if (!r || (r->kind == K_POOL && !r->in_use)) rc = CUDA_ERROR_INVALID_VALUE;
    else if (r->kind == K_POOL) pool_free_block(r);
    else rec_destroy_locked(r);
    unlock();
    return rc;
}

CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    CALLED(cuMemFree);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    return free_devptr(dptr);
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    CALLED(cuMemFree_v2);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    return free_devptr(dptr);
}

CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    CALLED(cuMemsetD8_v2);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    if (!dstDevice) return CUDA_ERROR_INVALID_VALUE;
    memset((void *)(uintptr_t)dstDevice, uc, N);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
    CALLED(cuMemsetD8Async);
    REQUIRE_INIT();
    (void)hStream;
    if (!dstDevice) return CUDA_ERROR_INVALID_VALUE;
    memset((void *)(uintptr_t)dstDevice, uc, N);
    return CUDA_SUCCESS;
}

static CUresult copy(void *dst, const void *src, size_t n)
{
    if (n && (!dst || !src)) return CUDA_ERROR_INVALID_VALUE;
    memmove(dst, src, n);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    CALLED(cuMemcpyHtoD_v2);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    return copy((void *)(uintptr_t)dstDevice, srcHost, ByteCount);
}

CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    CALLED(cuMemcpyDtoH_v2);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    return copy(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                              CUstream hStream)
{
    CALLED(cuMemcpyHtoDAsync_v2);
    REQUIRE_INIT();
    (void)hStream;
    return copy((void *)(uintptr_t)dstDevice, srcHost, ByteCount);
}

CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                              CUstream hStream)
{
    CALLED(cuMemcpyDtoHAsync_v2);
    REQUIRE_INIT();
    (void)hStream;
    return copy(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    CALLED(cuMemcpyDtoD_v2);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    return copy((void *)(uintptr_t)dstDevice, (const void *)(uintptr_t)srcDevice, ByteCount);
}

/* ==========================================================================
 * Peers: every pair of distinct devices can reach each other. Enabling access
 * is per context and direction; copies between devices need no access enabled
 * (the driver stages them, as the real one does). Nothing here allocates.
 * ======================================================================== */
CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    CALLED(cuDeviceCanAccessPeer);
    REQUIRE_INIT();
    if (!canAccessPeer) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev) || !valid_dev(peerDev)) return CUDA_ERROR_INVALID_DEVICE;
    *canAccessPeer = dev != peerDev;
    return CUDA_SUCCESS;
}

CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    CALLED(cuCtxEnablePeerAccess);
    REQUIRE_INIT();
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c;
    CUresult rc = cur_ctx(&c);
    if (rc != CUDA_SUCCESS) return rc;
    if (!ctx_valid(peerContext) || !peerContext->alive) return CUDA_ERROR_INVALID_CONTEXT;
    if (peerContext->dev == c->dev) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    lock();
    unsigned long long bit = 1ULL << peerContext->dev;
    rc = (c->peers & bit) ? CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED : CUDA_SUCCESS;
    c->peers |= bit;
    unlock();
    return rc;
}

CUresult cuCtxDisablePeerAccess(CUcontext peerContext)
{
    CALLED(cuCtxDisablePeerAccess);
    REQUIRE_INIT();
    CUcontext c;
    CUresult rc = cur_ctx(&c);
    if (rc != CUDA_SUCCESS) return rc;
    if (!ctx_valid(peerContext)) return CUDA_ERROR_INVALID_CONTEXT;
    lock();
    unsigned long long bit = 1ULL << peerContext->dev;
    rc = (c->peers & bit) ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    c->peers &= ~bit;
    unlock();
    return rc;
}

/* The device holding [addr, addr + n) in one allocation or mapping; -1 if none
 * (lock held). */
static int device_holding(CUdeviceptr addr, size_t n)
{
    for (struct mapping *m = g_mappings; m; m = m->next)
        if (addr >= m->va && n <= m->size && addr - m->va <= m->size - n) return m->h->dev;
    for (size_t b = 0; b < NBUCKETS; b++)
        for (struct rec *r = g_buckets[b]; r; r = r->next)
            if ((KM(r->kind) & KM_DEVPTR) && addr >= r->key && n <= r->bytes &&
                addr - r->key <= r->bytes - n)
                return r->dev;
    return -1;
}

static CUresult copy_peer(CUdeviceptr dst, CUcontext dstCtx, CUdeviceptr src, CUcontext srcCtx,
                          size_t n)
{
    if (!ctx_valid(dstCtx) || !ctx_valid(srcCtx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (!dstCtx->alive || !srcCtx->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (n == 0) return CUDA_SUCCESS;
    lock();
    int ok = device_holding(dst, n) == dstCtx->dev && device_holding(src, n) == srcCtx->dev;
    unlock();
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    return copy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
}

CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                      CUcontext srcContext, size_t ByteCount)
{
    CALLED(cuMemcpyPeer);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    return copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount);
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                           CUcontext srcContext, size_t ByteCount, CUstream hStream)
{
    CALLED(cuMemcpyPeerAsync);
    REQUIRE_INIT();
    CUcontext c;
    CUresult rc = stream_ctx(hStream, &c);
    if (rc != CUDA_SUCCESS) return rc;
    return copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount);
}

/* ==========================================================================
 * Pinned host memory (malloc-backed; host books, not device capacity)
 * ======================================================================== */
static CUresult host_alloc(void **pp, size_t bytesize)
{
    CUcontext c;
    CUresult rc = cur_ctx(&c);
    if (rc != CUDA_SUCCESS) return rc;
    if (bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    if (take_fail()) return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytesize) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    struct rec *r = calloc(1, sizeof *r);
    if (!r) { free(p); return CUDA_ERROR_OUT_OF_MEMORY; }
    r->key = (uintptr_t)p;
    r->kind = K_HOST;
    r->dev = -1;
    r->bytes = bytesize;
    r->base = p;
    r->ctx = c;
    r->fd = -1;
    lock();
    rec_insert(r);
    g_host_bytes += bytesize;
    g_host_count++;
    unlock();
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    CALLED(cuMemHostAlloc);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    if (Flags & ~0x7u) return CUDA_ERROR_INVALID_VALUE; /* PORTABLE|DEVICEMAP|WRITECOMBINED */
    return host_alloc(pp, bytesize);
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    CALLED(cuMemAllocHost_v2);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    return host_alloc(pp, bytesize);
}

CUresult cuMemFreeHost(void *p)
{
    CALLED(cuMemFreeHost);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    lock();
    struct rec *r = p ? rec_find((uintptr_t)p, KM(K_HOST)) : NULL;
    if (r) rec_destroy_locked(r);
    unlock();
    return r ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ==========================================================================
 * Arrays (the handle is the backing memory's address)
 * ======================================================================== */
static size_t format_size(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

static size_t dim(size_t v) { return v ? v : 1; }

/* Bytes of one w x h x d level; 0 when the descriptor is invalid. */
static size_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch)
{
    size_t es = format_size(f);
    if (!es || w == 0 || (ch != 1 && ch != 2 && ch != 4)) return 0;
    return w * dim(h) * dim(d) * es * ch;
}

static CUresult array_alloc(enum kind kind, size_t bytes, unsigned long long *handle)
{
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    return alloc_linear(kind, bytes, handle);
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    CALLED(cuArrayCreate_v2);
    REQUIRE_INIT();
    if (!pHandle || !d) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long h;
    CUresult rc = array_alloc(K_ARRAY, array_bytes(d->Width, d->Height, 0, d->Format,
                                                   d->NumChannels), &h);
    if (rc == CUDA_SUCCESS) *pHandle = (CUarray)(uintptr_t)h;
    return rc;
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    CALLED(cuArray3DCreate_v2);
    REQUIRE_INIT();
    if (!pHandle || !d) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long h;
    CUresult rc = array_alloc(K_ARRAY, array_bytes(d->Width, d->Height, d->Depth, d->Format,
                                                   d->NumChannels), &h);
    if (rc == CUDA_SUCCESS) *pHandle = (CUarray)(uintptr_t)h;
    return rc;
}

static CUresult destroy_handle(void *h, enum kind kind)
{
    if (!h) return CUDA_ERROR_INVALID_HANDLE;
    lock();
    struct rec *r = rec_find((uintptr_t)h, KM(kind));
    if (r) rec_destroy_locked(r);
    unlock();
    return r ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuArrayDestroy(CUarray hArray)
{
    CALLED(cuArrayDestroy);
    REQUIRE_INIT();
    return destroy_handle(hArray, K_ARRAY);
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                unsigned int numMipmapLevels)
{
    CALLED(cuMipmappedArrayCreate);
    REQUIRE_INIT();
    if (!pHandle || !d || numMipmapLevels == 0 || numMipmapLevels > 32)
        return CUDA_ERROR_INVALID_VALUE;
    size_t total = 0;
    for (unsigned l = 0; l < numMipmapLevels; l++) {
        /* each present dimension halves per level, never below 1 */
        size_t w = dim(d->Width >> l), h = d->Height ? dim(d->Height >> l) : 0,
               z = d->Depth ? dim(d->Depth >> l) : 0;
        size_t b = array_bytes(d->Width ? w : 0, h, z, d->Format, d->NumChannels);
        if (!b) return CUDA_ERROR_INVALID_VALUE;
        total += b;
    }
    unsigned long long h;
    CUresult rc = array_alloc(K_MIPMAP, total, &h);
    if (rc == CUDA_SUCCESS) *pHandle = (CUmipmappedArray)(uintptr_t)h;
    return rc;
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    CALLED(cuMipmappedArrayDestroy);
    REQUIRE_INIT();
    return destroy_handle(hMipmappedArray, K_MIPMAP);
}

/* ==========================================================================
 * Virtual memory management. Physical memory is a memfd, so mappings of one
 * handle share data like the real thing.
 * ======================================================================== */
static int prop_ok(const CUmemAllocationProp *prop)
{
    return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && valid_dev(prop->location.id);
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option)
{
    CALLED(cuMemGetAllocationGranularity);
    REQUIRE_INIT();
    if (!granularity || !prop_ok(prop)) return CUDA_ERROR_INVALID_VALUE;
    if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = GRANULARITY;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags)
{
    CALLED(cuMemCreate);
    REQUIRE_INIT();
    if (!handle || !prop_ok(prop) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (size == 0 || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    if (take_fail()) return CUDA_ERROR_OUT_OF_MEMORY;
    int dev = prop->location.id;
    CUcontext c = NULL;
    cur_ctx(&c); /* not required; when present, the handle belongs to it */
    lock();
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    struct rec *r = NULL;
    int fd = -1;
    if (!fits(dev, size)) goto out;
    fd = memfd_create("simcuda-vmm", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) goto out;
    r = calloc(1, sizeof *r);
    if (!r) goto out;
    r->key = g_next_vmm_id++;
    r->kind = K_VMM;
    r->dev = dev;
    r->bytes = size;
    r->ctx = c;
    r->fd = fd;
    rec_insert(r);
    book_add(dev, size);
    *handle = r->key;
    fd = -1;
    rc = CUDA_SUCCESS;
out:
    if (fd >= 0) close(fd);
    unlock();
    return rc;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CALLED(cuMemRelease);
    REQUIRE_INIT();
    lock();
    struct rec *h = rec_find(handle, KM(K_VMM));
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (h && !h->released) {
        /* freed now, or at its last unmap */
        h->released = 1;
        vmm_maybe_free(h);
        rc = CUDA_SUCCESS;
    }
    unlock();
    return rc;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    CALLED(cuMemAddressReserve);
    REQUIRE_INIT();
    (void)addr; /* a hint only */
    if (!ptr || flags != 0 || size == 0 || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    if (alignment == 0) alignment = GRANULARITY;
    if (alignment & (alignment - 1)) return CUDA_ERROR_INVALID_VALUE;
    /* Over-reserve, then cut the ends so the range is aligned and exact. */
    size_t len = size + alignment;
    char *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t start = round_up((uintptr_t)p, alignment);
    if (start > (uintptr_t)p) munmap(p, start - (uintptr_t)p);
    uintptr_t end = start + size;
    if ((uintptr_t)p + len > end) munmap((void *)end, (uintptr_t)p + len - end);
    struct reservation *r = calloc(1, sizeof *r);
    if (!r) { munmap((void *)start, size); return CUDA_ERROR_OUT_OF_MEMORY; }
    r->va = start;
    r->size = size;
    lock();
    r->next = g_reservations;
    g_reservations = r;
    unlock();
    *ptr = start;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CALLED(cuMemAddressFree);
    REQUIRE_INIT();
    lock();
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    for (struct reservation **pp = &g_reservations; *pp; pp = &(*pp)->next) {
        struct reservation *r = *pp;
        if (r->va == ptr && r->size == size) {
            struct range rg = {ptr, size};
            unmap_where(in_range, &rg); /* leftover mappings go with the range */
            munmap((void *)(uintptr_t)ptr, size);
            *pp = r->next;
            free(r);
            rc = CUDA_SUCCESS;
            break;
        }
    }
    unlock();
    return rc;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    CALLED(cuMemMap);
    REQUIRE_INIT();
    if (flags != 0 || size == 0 || size % GRANULARITY || offset % GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    struct rec *h = rec_find(handle, KM(K_VMM));
    if (!h || h->released || offset > h->bytes || size > h->bytes - offset) goto out;
    if (!reservation_holding(ptr, size)) goto out;
    for (struct mapping *m = g_mappings; m; m = m->next)
        if (ptr < m->va + m->size && m->va < ptr + size) goto out; /* overlap */
    /* Inaccessible until cuMemSetAccess, as on a GPU. */
    if (mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd,
             (off_t)offset) == MAP_FAILED) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    struct mapping *m = calloc(1, sizeof *m);
    if (!m) { rc = CUDA_ERROR_OUT_OF_MEMORY; goto out; }
    m->va = ptr;
    m->size = size;
    m->h = h;
    m->next = g_mappings;
    g_mappings = m;
    h->maps++;
    rc = CUDA_SUCCESS;
out:
    unlock();
    return rc;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CALLED(cuMemUnmap);
    REQUIRE_INIT();
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct range rg = {ptr, size};
    int n = unmap_where(in_range, &rg);
    unlock();
    return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    CALLED(cuMemSetAccess);
    REQUIRE_INIT();
    if (!desc || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    int prot = PROT_NONE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_dev(desc[i].location.id))
            return CUDA_ERROR_INVALID_VALUE;
        if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) prot = PROT_READ | PROT_WRITE;
        else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ && prot == PROT_NONE) prot = PROT_READ;
        else if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
                 desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ)
            return CUDA_ERROR_INVALID_VALUE;
    }
    lock();
    /* the whole range must be mapped */
    size_t covered = 0;
    for (struct mapping *m = g_mappings; m; m = m->next) {
        CUdeviceptr lo = m->va > ptr ? m->va : ptr;
        CUdeviceptr hi = m->va + m->size < ptr + size ? m->va + m->size : ptr + size;
        if (hi > lo) covered += hi - lo;
    }
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (covered == size && mprotect((void *)(uintptr_t)ptr, size, prot) == 0) rc = CUDA_SUCCESS;
    unlock();
    return rc;
}

/* ==========================================================================
 * Stream-ordered allocator
 * ======================================================================== */
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    CALLED(cuDeviceGetDefaultMemPool);
    REQUIRE_INIT();
    if (!pool_out) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *pool_out = (CUmemoryPool)&g_default_pool[dev].hdr;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CALLED(cuDeviceGetMemPool);
    REQUIRE_INIT();
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    lock();
    *pool = (CUmemoryPool)&g_current_pool[dev]->hdr;
    unlock();
    return CUDA_SUCCESS;
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    CALLED(cuDeviceSetMemPool);
    REQUIRE_INIT();
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    lock();
    struct mempool *p = pool_from_handle(pool);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (p && p->dev == dev) { g_current_pool[dev] = p; rc = CUDA_SUCCESS; }
    unlock();
    return rc;
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    CALLED(cuMemPoolCreate);
    REQUIRE_INIT();
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(props->location.id)) return CUDA_ERROR_INVALID_DEVICE;
    struct mempool *p = calloc(1, sizeof *p);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    p->hdr.magic = POOL_MAGIC;
    p->dev = props->location.id;
    p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
    lock();
    p->next = g_pools;
    g_pools = p;
    unlock();
    *pool = (CUmemoryPool)&p->hdr;
    return CUDA_SUCCESS;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    CALLED(cuMemPoolDestroy);
    REQUIRE_INIT();
    lock();
    struct mempool *p = pool_from_handle(pool);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (p && !p->is_default) {
        /* Unused memory goes now; blocks still allocated go when freed. The
         * struct stays (marked destroyed) so those frees still find it. */
        p->destroyed = 1;
        pool_trim(p, 0);
        if (g_current_pool[p->dev] == p) g_current_pool[p->dev] = &g_default_pool[p->dev];
        rc = CUDA_SUCCESS;
    }
    unlock();
    return rc;
}

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, int use_pool,
                            CUstream hStream)
{
    if (!dptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c;
    CUresult rc = stream_ctx(hStream, &c);
    if (rc != CUDA_SUCCESS) return rc;
    lock();
    struct mempool *p = use_pool ? pool_from_handle(pool) : g_current_pool[c->dev];
    if (!p) rc = CUDA_ERROR_INVALID_VALUE;
    else if (take_fail()) rc = CUDA_ERROR_OUT_OF_MEMORY;
    else rc = pool_alloc(p, bytesize, c, dptr);
    unlock();
    return rc;
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    CALLED(cuMemAllocAsync);
    REQUIRE_INIT();
    return alloc_async(dptr, bytesize, NULL, 0, hStream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    CALLED(cuMemAllocAsync_ptsz);
    REQUIRE_INIT();
    return alloc_async(dptr, bytesize, NULL, 0, hStream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream)
{
    CALLED(cuMemAllocFromPoolAsync);
    REQUIRE_INIT();
    return alloc_async(dptr, bytesize, pool, 1, hStream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream)
{
    CALLED(cuMemAllocFromPoolAsync_ptsz);
    REQUIRE_INIT();
    return alloc_async(dptr, bytesize, pool, 1, hStream);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    CALLED(cuMemFreeAsync);
    REQUIRE_INIT();
    (void)hStream;
    return free_devptr(dptr);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    CALLED(cuMemFreeAsync_ptsz);
    REQUIRE_INIT();
    (void)hStream;
    return free_devptr(dptr);
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    CALLED(cuMemPoolTrimTo);
    REQUIRE_INIT();
    CAPTURE_UNSAFE();
    lock();
    struct mempool *p = pool_from_handle(pool);
    if (p) pool_trim(p, minBytesToKeep);
    unlock();
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    CALLED(cuMemPoolGetAttribute);
    REQUIRE_INIT();
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct mempool *p = pool_from_handle(pool);
    CUresult rc = p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (p) {
        switch (attr) {
        case 1: case 2: case 3: *(int *)value = p->reuse[attr - 1]; break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = p->threshold; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = p->reserved; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = p->reserved_high; break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = p->used; break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = p->used_high; break;
        default: rc = CUDA_ERROR_INVALID_VALUE;
        }
    }
    unlock();
    return rc;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    CALLED(cuMemPoolSetAttribute);
    REQUIRE_INIT();
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct mempool *p = pool_from_handle(pool);
    CUresult rc = p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (p) {
        cuuint64_t v = (attr >= 4) ? *(cuuint64_t *)value : 0;
        switch (attr) {
        case 1: case 2: case 3: p->reuse[attr - 1] = *(int *)value; break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->threshold = v; break;
        /* high-water marks may only be reset, to 0 */
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
            if (v) rc = CUDA_ERROR_INVALID_VALUE; else p->reserved_high = p->reserved;
            break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
            if (v) rc = CUDA_ERROR_INVALID_VALUE; else p->used_high = p->used;
            break;
        default: rc = CUDA_ERROR_INVALID_VALUE;
        }
    }
    unlock();
    return rc;
}

/* ==========================================================================
 * Errors
 * ======================================================================== */
static const struct { CUresult code; const char *name, *text; } g_errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access is not supported between these two devices"},
    {704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
    {705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_lookup(CUresult error, const char **pStr, int want_name)
{
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].code == error) {
            *pStr = want_name ? g_errors[i].name : g_errors[i].text;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    CALLED(cuGetErrorString);
    return error_lookup(error, pStr, 0);
}

CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    CALLED(cuGetErrorName);
    return error_lookup(error, pStr, 1);
}

/* ==========================================================================
 * cuGetProcAddress: base name + version (+ stream flavour) -> function
 * ======================================================================== */
static const struct proc {
    const char *export_name, *base;
    int version;
    int ptsz;
    void *fn;
} g_procs[] = {
#define X(fn, base, ver, ptsz) {#fn, base, ver, ptsz, (void *)fn},
    SIM_FUNCS(X)
#undef X
};
#define NPROCS (sizeof g_procs / sizeof g_procs[0])

static CUresult proc_lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    int any = 0, has_ptsz = 0;
    for (size_t i = 0; i < NPROCS; i++)
        if (strcmp(g_procs[i].base, symbol) == 0) { any = 1; has_ptsz |= g_procs[i].ptsz; }
    if (!any) {
        if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    /* The per-thread flag selects the _ptsz flavour where one exists. */
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && has_ptsz;
    const struct proc *best = NULL;
    for (size_t i = 0; i < NPROCS; i++) {
        const struct proc *p = &g_procs[i];
        if (strcmp(p->base, symbol) || p->ptsz != want_ptsz || p->version > cudaVersion) continue;
        if (!best || p->version > best->version) best = p;
    }
    if (!best) {
        if (status) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = best->fn;
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    CALLED(cuGetProcAddress);
    return proc_lookup(symbol, pfn, cudaVersion, flags, NULL);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    CALLED(cuGetProcAddress_v2);
    return proc_lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/* ==========================================================================
 * The sim's own API
 * ======================================================================== */
int simcuda_frees_delayed(void) { return __atomic_load_n(&g_frees_delayed, __ATOMIC_SEQ_CST); }

unsigned long long simcuda_live_bytes(int dev)
{
    config();
    if (dev < 0 || dev >= MAX_DEVICES) return 0;
    lock();
    unsigned long long v = g_live_bytes[dev];
    unlock();
    return v;
}

unsigned long long simcuda_live_peak(int dev)
{
    config();
    if (dev < 0 || dev >= MAX_DEVICES) return 0;
    lock();
    unsigned long long v = g_live_peak[dev];
    unlock();
    return v;
}

unsigned long long simcuda_mem(void)
{
    config();
    return g_mem;
}

int simcuda_uuid(int dev, unsigned char out[16])
{
    config();
    if (!out || dev < 0 || dev >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
    uuid_bytes(g_phys[dev], (char *)out);
    return CUDA_SUCCESS;
}

int simcuda_physical_count(void)
{
    config();
    return g_nphys;
}

int simcuda_physical_of(int ordinal)
{
    config();
    return valid_dev(ordinal) ? g_phys[ordinal] : -1;
}

int simcuda_ordinal_of(int phys)
{
    config();
    for (int i = 0; i < g_ndev; i++)
        if (g_phys[i] == phys) return i;
    return -1;
}

int simcuda_physical_uuid(int phys, unsigned char out[16])
{
    config();
    if (!out || phys < 0 || phys >= g_nphys) return CUDA_ERROR_INVALID_DEVICE;
    uuid_bytes(phys, (char *)out);
    return CUDA_SUCCESS;
}

int simcuda_live_count(int dev)
{
    config();
    if (dev < 0 || dev >= MAX_DEVICES) return 0;
    lock();
    int v = g_live_count[dev];
    unlock();
    return v;
}

unsigned long long simcuda_host_live_bytes(void)
{
    config();
    lock();
    unsigned long long v = g_host_bytes;
    unlock();
    return v;
}

int simcuda_host_live_count(void)
{
    config();
    lock();
    int v = g_host_count;
    unlock();
    return v;
}

unsigned long long simcuda_pool_reserved(int dev)
{
    config();
    unsigned long long v = 0;
    lock();
    for (struct mempool *p = g_pools; p; p = p->next)
        if (p->dev == dev) v += p->reserved;
    unlock();
    return v;
}

void simcuda_fail_next(int n)
{
    config();
    __atomic_store_n(&g_fail_next, n < 0 ? 0 : n, __ATOMIC_RELAXED);
}

int simcuda_device_count(void)
{
    config();
    return g_ndev;
}

static int export_id(const char *name, size_t len)
{
    for (size_t i = 0; i < NPROCS; i++)
        if (strlen(g_procs[i].export_name) == len && memcmp(g_procs[i].export_name, name, len) == 0)
            return (int)i;
    return -1;
}

int simcuda_set_faults(const char *spec)
{
    config();
    return faults_parse(spec ? spec : "") == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

unsigned long long simcuda_faults_injected(void)
{
    return __atomic_load_n(&g_faults_injected, __ATOMIC_RELAXED);
}

int simcuda_captures(void) { return __atomic_load_n(&g_capturing, __ATOMIC_ACQUIRE); }

unsigned long long simcuda_captures_invalidated(void)
{
    lock();
    unsigned long long n = g_invalidated;
    unlock();
    return n;
}

unsigned long long simcuda_calls(const char *name)
{
    for (size_t i = 0; name && i < NPROCS; i++)
        if (strcmp(g_procs[i].export_name, name) == 0)
            return __atomic_load_n(&g_calls[i], __ATOMIC_RELAXED);
    return 0;
}

int simcuda_untracked_alloc(int dev, size_t bytes, CUdeviceptr *dptr)
{
    config();
    if (!dptr || !valid_dev(dev) || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    lock();
    unsigned long long p;
    CUresult rc = dev_alloc_locked(K_DEVICE, dev, bytes, NULL, &p);
    unlock();
    if (rc == CUDA_SUCCESS) *dptr = p;
    return rc;
}

int simcuda_gate_arm(const char *name)
{
    int id = name ? export_id(name, strlen(name)) : -1;
    if (id < 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_gate_lock);
    g_gate_owner = gettid();
    g_gate_state = 0;
    __atomic_store_n(&g_gate_id, id, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_gate_lock);
    return CUDA_SUCCESS;
}

int simcuda_gate_wait(unsigned long long timeout_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)(timeout_ms / 1000);
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&g_gate_lock);
    int rc = 0;
    while (g_gate_state == 0 && rc == 0)
        rc = pthread_cond_timedwait(&g_gate_cond, &g_gate_lock, &until);
    int held = g_gate_state == 1;
    pthread_mutex_unlock(&g_gate_lock);
    return held;
}

void simcuda_gate_open(void)
{
    pthread_mutex_lock(&g_gate_lock);
    g_gate_state = 2;
    __atomic_store_n(&g_gate_id, -1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&g_gate_cond);
    pthread_mutex_unlock(&g_gate_lock);
}
