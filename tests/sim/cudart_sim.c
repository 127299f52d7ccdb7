/*
 * cudart_sim.c - a simulated CUDA runtime (libcudart.so.13).
 *
 * Reaches the driver the way the real runtime does (see
 * shared/docs/cuda-paths.md): it does not link libcuda. On first use it
 * dlopen()s "libcuda.so.1", dlsym()s "cuGetProcAddress_v2", asks that for
 * "cuGetProcAddress" itself at version 12000 and then fetches its whole
 * driver table through the answer, by base name and the version each entry
 * point was introduced with. An interposer therefore sees this runtime only
 * through its dlsym and cuGetProcAddress hooks.
 *
 * SIMCUDART_PTDS=1 makes every lookup pass the per-thread default stream
 * flag, as a runtime built with --default-stream per-thread would, so the
 * driver hands out its _ptsz variants where they exist.
 *
 * Each thread has a current device (default 0); the device's primary context
 * is retained lazily on first use and made current on the calling thread.
 */
#define _GNU_SOURCE
#include "cudart_sim.h"
#include "cuda_sim.h" /* driver types only: nothing here links against libcuda */

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 64
#define RUNTIME_VERSION 13000

/* Driver entry points the runtime uses: field name, base name, version. */
#define DRV_FUNCS(X)                                               \
    X(cuInit, "cuInit", 2000)                                      \
    X(cuDriverGetVersion, "cuDriverGetVersion", 2020)              \
    X(cuDeviceGetCount, "cuDeviceGetCount", 2000)                  \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000)  \
    X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000) \
    X(cuCtxGetCurrent, "cuCtxGetCurrent", 4000)                    \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", 4000)                    \
    X(cuCtxSynchronize, "cuCtxSynchronize", 2000)                  \
    X(cuStreamCreate, "cuStreamCreate", 2000)                      \
    X(cuStreamSynchronize, "cuStreamSynchronize", 2000)            \
    X(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010)     \
    X(cuStreamEndCapture, "cuStreamEndCapture", 10000)             \
    X(cuStreamIsCapturing, "cuStreamIsCapturing", 10000)           \
    X(cuGraphDestroy, "cuGraphDestroy", 10000)                     \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 3020)                       \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020)                           \
    X(cuMemFree_v2, "cuMemFree", 3020)                             \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020)                 \
    X(cuMemAllocManaged, "cuMemAllocManaged", 6000)                \
    X(cuMemAllocAsync, "cuMemAllocAsync", 11020)                   \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020)   \
    X(cuMemFreeAsync, "cuMemFreeAsync", 11020)                     \
    X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020) \
    X(cuMemPoolTrimTo, "cuMemPoolTrimTo", 11020)                   \
    X(cuMemAllocHost_v2, "cuMemAllocHost", 3020)                   \
    X(cuMemHostAlloc, "cuMemHostAlloc", 2020)                      \
    X(cuMemFreeHost, "cuMemFreeHost", 2000)                        \
    X(cuMemcpyHtoD_v2, "cuMemcpyHtoD", 3020)                       \
    X(cuMemcpyDtoH_v2, "cuMemcpyDtoH", 3020)                       \
    X(cuMemcpyDtoD_v2, "cuMemcpyDtoD", 3020)                       \
    X(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", 4000)        \
    X(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", 4000)        \
    X(cuMemcpyPeer, "cuMemcpyPeer", 4000)                          \
    X(cuMemcpyPeerAsync, "cuMemcpyPeerAsync", 4000)

/* Function-pointer fields typed after the driver prototypes in cuda_sim.h
 * (__typeof__ only reads the declaration; nothing is linked). */
static struct {
#define X(fn, base, ver) __typeof__(&fn) fn;
    DRV_FUNCS(X)
#undef X
} drv;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static cudaError_t g_init_err;
static int g_ndev;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext g_primary[MAX_DEVICES];

static __thread int t_dev;

/* CUresult -> cudaError_t, as the real runtime maps these codes. */
static cudaError_t map_err(CUresult rc)
{
    switch (rc) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
    case CUDA_ERROR_DEINITIALIZED: return cudaErrorCudartUnloading;
    case CUDA_ERROR_NO_DEVICE: return cudaErrorNoDevice;
    case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
    case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
    case CUDA_ERROR_NOT_READY: return cudaErrorNotReady;
    case CUDA_ERROR_ILLEGAL_ADDRESS: return cudaErrorIllegalAddress;
    case CUDA_ERROR_CONTEXT_IS_DESTROYED: return cudaErrorContextIsDestroyed;
    case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
    case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: return cudaErrorPeerAccessUnsupported;
    case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: return cudaErrorPeerAccessAlreadyEnabled;
    case CUDA_ERROR_ILLEGAL_STATE: return cudaErrorIllegalState;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return cudaErrorStreamCaptureUnsupported;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return cudaErrorStreamCaptureInvalidated;
    case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: return cudaErrorStreamCaptureWrongThread;
    default: return cudaErrorUnknown;
    }
}

static void load_driver(void)
{
    g_init_err = cudaErrorInsufficientDriver;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    PFN_cuGetProcAddress_v2 bootstrap = (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2");
    if (!bootstrap) return;
    /* Ask the lookup function for itself and use the answer from now on:
     * the real runtime does the same, so an interposer's answer sticks. */
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (bootstrap("cuGetProcAddress", &p, 12000, 0, &st) != CUDA_SUCCESS || !p) return;
    PFN_cuGetProcAddress_v2 gpa = (PFN_cuGetProcAddress_v2)p;

    const char *ptds = getenv("SIMCUDART_PTDS");
    cuuint64_t flags = (ptds && strcmp(ptds, "1") == 0)
                           ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                           : CU_GET_PROC_ADDRESS_DEFAULT;
#define X(fn, base, ver)                                                   \
    if (gpa(base, &p, ver, flags, &st) != CUDA_SUCCESS || !p) return;      \
    drv.fn = (__typeof__(drv.fn))p;
    DRV_FUNCS(X)
#undef X

    CUresult rc = drv.cuInit(0);
    if (rc == CUDA_SUCCESS) rc = drv.cuDeviceGetCount(&g_ndev);
    g_init_err = map_err(rc);
    if (g_ndev > MAX_DEVICES) g_ndev = MAX_DEVICES;
}

static cudaError_t lazy_init(void)
{
    pthread_once(&g_once, load_driver);
    return g_init_err;
}

/* Device d's primary context, retained on first use. */
static cudaError_t primary_of(int d, CUcontext *out)
{
    cudaError_t e = lazy_init();
    if (e != cudaSuccess) return e;
    if (d < 0 || d >= g_ndev) return cudaErrorInvalidDevice;
    pthread_mutex_lock(&g_lock);
    CUresult rc = CUDA_SUCCESS;
    if (!g_primary[d]) rc = drv.cuDevicePrimaryCtxRetain(&g_primary[d], d);
    *out = g_primary[d];
    pthread_mutex_unlock(&g_lock);
    return map_err(rc);
}

/* Makes the current device's primary context current on this thread. */
static cudaError_t ensure_ctx(void)
{
    cudaError_t e = lazy_init();
    if (e != cudaSuccess) return e;
    int d = t_dev;
    pthread_mutex_lock(&g_lock);
    CUresult rc = CUDA_SUCCESS;
    if (!g_primary[d]) rc = drv.cuDevicePrimaryCtxRetain(&g_primary[d], d);
    CUcontext want = g_primary[d];
    pthread_mutex_unlock(&g_lock);
    if (rc != CUDA_SUCCESS) return map_err(rc);
    CUcontext cur = NULL;
    rc = drv.cuCtxGetCurrent(&cur);
    if (rc == CUDA_SUCCESS && cur != want) rc = drv.cuCtxSetCurrent(want);
    return map_err(rc);
}

/* Runs a driver call after making sure a context is current. */
#define WITH_CTX(call)                                 \
    do {                                               \
        cudaError_t e_ = ensure_ctx();                 \
        if (e_ != cudaSuccess) return e_;              \
        return map_err(call);                          \
    } while (0)

/* ---- devices ---- */
cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count) return cudaErrorInvalidValue;
    cudaError_t e = lazy_init();
    if (e != cudaSuccess) return e;
    *count = g_ndev;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    cudaError_t e = lazy_init();
    if (e != cudaSuccess) return e;
    if (device < 0 || device >= g_ndev) return cudaErrorInvalidDevice;
    t_dev = device;
    return ensure_ctx(); /* since CUDA 12, cudaSetDevice initialises the device */
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device) return cudaErrorInvalidValue;
    cudaError_t e = lazy_init();
    if (e != cudaSuccess) return e;
    *device = t_dev;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { WITH_CTX(drv.cuCtxSynchronize()); }

cudaError_t cudaDeviceReset(void)
{
    /* Destroys every allocation of the current device's primary context. */
    WITH_CTX(drv.cuDevicePrimaryCtxReset_v2(t_dev));
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    WITH_CTX(drv.cuMemGetInfo_v2(free_bytes, total));
}

/* ---- linear memory ---- */
cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    if (!devPtr) return cudaErrorInvalidValue;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess) return e;
    if (size == 0) { *devPtr = NULL; return cudaSuccess; } /* as the real one */
    CUdeviceptr p;
    CUresult rc = drv.cuMemAlloc_v2(&p, size);
    if (rc == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
    return map_err(rc);
}

cudaError_t cudaFree(void *devPtr)
{
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess) return e;
    if (!devPtr) return cudaSuccess;
    return map_err(drv.cuMemFree_v2((CUdeviceptr)(uintptr_t)devPtr));
}

cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    if (!devPtr || size == 0) return cudaErrorInvalidValue;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess) return e;
    CUdeviceptr p;
    CUresult rc = drv.cuMemAllocManaged(&p, size, flags);
    if (rc == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
    return map_err(rc);
}

cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    if (!devPtr || !pitch) return cudaErrorInvalidValue;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess) return e;
    CUdeviceptr p;
    CUresult rc = drv.cuMemAllocPitch_v2(&p, pitch, width, height, 4);
    if (rc == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
    return map_err(rc);
}

cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent)
{
    if (!pitchedDevPtr) return cudaErrorInvalidValue;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess) return e;
    /* a 3D allocation is a pitched 2D one with height * depth rows */
    CUdeviceptr p;
    size_t pitch;
    size_t rows = (extent.height ? extent.height : 1) * (extent.depth ? extent.depth : 1);
    CUresult rc = drv.cuMemAllocPitch_v2(&p, &pitch, extent.width, rows, 4);
    if (rc == CUDA_SUCCESS) {
        pitchedDevPtr->ptr = (void *)(uintptr_t)p;
        pitchedDevPtr->pitch = pitch;
        pitchedDevPtr->xsize = extent.width;
        pitchedDevPtr->ysize = extent.height;
    }
    return map_err(rc);
}

/* ---- stream-ordered ---- */
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    if (!devPtr) return cudaErrorInvalidValue;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess) return e;
    CUdeviceptr p;
    CUresult rc = drv.cuMemAllocAsync(&p, size, hStream);
    if (rc == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
    return map_err(rc);
}

cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                    cudaStream_t stream)
{
    if (!ptr) return cudaErrorInvalidValue;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess) return e;
    CUdeviceptr p;
    CUresult rc = drv.cuMemAllocFromPoolAsync(&p, size, memPool, stream);
    if (rc == CUDA_SUCCESS) *ptr = (void *)(uintptr_t)p;
    return map_err(rc);
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    WITH_CTX(drv.cuMemFreeAsync((CUdeviceptr)(uintptr_t)devPtr, hStream));
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device)
{
    WITH_CTX(drv.cuDeviceGetDefaultMemPool(memPool, device));
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep)
{
    WITH_CTX(drv.cuMemPoolTrimTo(memPool, minBytesToKeep));
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) { WITH_CTX(drv.cuStreamCreate(pStream, 0)); }

cudaError_t cudaStreamSynchronize(cudaStream_t stream) { WITH_CTX(drv.cuStreamSynchronize(stream)); }

/* ---- stream capture (the driver's rules; see cuda_sim.c) ---- */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    WITH_CTX(drv.cuStreamBeginCapture_v2(stream, (CUstreamCaptureMode)mode));
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    WITH_CTX(drv.cuStreamEndCapture(stream, pGraph));
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pStatus)
{
    WITH_CTX(drv.cuStreamIsCapturing(stream, (CUstreamCaptureStatus *)pStatus));
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) { WITH_CTX(drv.cuGraphDestroy(graph)); }

/* ---- pinned host memory ---- */
cudaError_t cudaMallocHost(void **ptr, size_t size) { WITH_CTX(drv.cuMemAllocHost_v2(ptr, size)); }

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    WITH_CTX(drv.cuMemHostAlloc(pHost, size, flags));
}

cudaError_t cudaFreeHost(void *ptr)
{
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess) return e;
    if (!ptr) return cudaSuccess;
    return map_err(drv.cuMemFreeHost(ptr));
}

/* ---- copies (unified addressing: device pointers are plain addresses) ---- */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess) return e;
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, s = (CUdeviceptr)(uintptr_t)src;
    switch (kind) {
    case cudaMemcpyHostToHost: memmove(dst, src, count); return cudaSuccess;
    case cudaMemcpyHostToDevice: return map_err(drv.cuMemcpyHtoD_v2(d, src, count));
    case cudaMemcpyDeviceToHost: return map_err(drv.cuMemcpyDtoH_v2(dst, s, count));
    case cudaMemcpyDeviceToDevice:
    case cudaMemcpyDefault: return map_err(drv.cuMemcpyDtoD_v2(d, s, count));
    }
    return cudaErrorInvalidValue;
}

/* ---- peers ---- */
cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice)
{
    cudaError_t e = lazy_init();
    if (e != cudaSuccess) return e;
    return map_err(drv.cuDeviceCanAccessPeer(canAccessPeer, device, peerDevice));
}

cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags)
{
    CUcontext peer;
    cudaError_t e = primary_of(peerDevice, &peer);
    if (e != cudaSuccess) return e;
    WITH_CTX(drv.cuCtxEnablePeerAccess(peer, flags));
}

static cudaError_t memcpy_peer(void *dst, int dstDevice, const void *src, int srcDevice,
                               size_t count, cudaStream_t stream, int async)
{
    CUcontext dc, sc;
    cudaError_t e = primary_of(dstDevice, &dc);
    if (e == cudaSuccess) e = primary_of(srcDevice, &sc);
    if (e == cudaSuccess) e = ensure_ctx();
    if (e != cudaSuccess) return e;
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, s = (CUdeviceptr)(uintptr_t)src;
    return map_err(async ? drv.cuMemcpyPeerAsync(d, dc, s, sc, count, stream)
                         : drv.cuMemcpyPeer(d, dc, s, sc, count));
}

cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count)
{
    return memcpy_peer(dst, dstDevice, src, srcDevice, count, NULL, 0);
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice,
                                size_t count, cudaStream_t stream)
{
    return memcpy_peer(dst, dstDevice, src, srcDevice, count, stream, 1);
}

/* ---- versions, errors ---- */
cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
    if (!runtimeVersion) return cudaErrorInvalidValue;
    *runtimeVersion = RUNTIME_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *driverVersion)
{
    if (!driverVersion) return cudaErrorInvalidValue;
    cudaError_t e = lazy_init();
    if (e != cudaSuccess) { *driverVersion = 0; return cudaSuccess; }
    return map_err(drv.cuDriverGetVersion(driverVersion));
}

static const struct { cudaError_t code; const char *name, *text; } g_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorContextIsDestroyed, "cudaErrorContextIsDestroyed", "context is destroyed"},
    {cudaErrorPeerAccessUnsupported, "cudaErrorPeerAccessUnsupported",
     "peer access is not supported between these two devices"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorIllegalState, "cudaErrorIllegalState",
     "the operation cannot be performed in the present state"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

static int error_index(cudaError_t error)
{
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].code == error) return (int)i;
    return -1;
}

const char *cudaGetErrorString(cudaError_t error)
{
    int i = error_index(error);
    return i < 0 ? "unrecognized error code" : g_errors[i].text;
}

const char *cudaGetErrorName(cudaError_t error)
{
    int i = error_index(error);
    return i < 0 ? "cudaErrorUnknown" : g_errors[i].name;
}
