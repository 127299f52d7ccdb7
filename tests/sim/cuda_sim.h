/*
 * cuda_sim.h - the subset of the CUDA driver API (cuda.h, CUDA 12/13) that the
 * simulated driver implements, plus the sim's own inspection API (simcuda_*).
 *
 * Types, enum values and struct layouts follow the real cuda.h so that code
 * written against the real header (gpuguard, cudarc) sees the same ABI.
 * Structs declare every field up to the last one we need, so sizes and
 * offsets match; trailing reserved space is kept where the real struct has it.
 */
#ifndef CUDA_SIM_H
#define CUDA_SIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- scalar types ---- */
typedef int CUresult;                      /* enum cudaError_enum */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;    /* CUdeviceptr_v2 */
typedef unsigned int CUdeviceptr_v1;       /* legacy 32-bit device pointer */
typedef unsigned long long cuuint64_t;
typedef unsigned long long CUmemGenericAllocationHandle;

/* Opaque handles: pointers to structs the caller never sees. */
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;

typedef struct CUuuid_st { char bytes[16]; } CUuuid;

/* ---- CUresult values (identical to cuda.h) ---- */
#define CUDA_SUCCESS                     0
#define CUDA_ERROR_INVALID_VALUE         1
#define CUDA_ERROR_OUT_OF_MEMORY         2
#define CUDA_ERROR_NOT_INITIALIZED       3
#define CUDA_ERROR_DEINITIALIZED         4
#define CUDA_ERROR_NO_DEVICE             100
#define CUDA_ERROR_INVALID_DEVICE        101
#define CUDA_ERROR_INVALID_CONTEXT       201
#define CUDA_ERROR_PEER_ACCESS_UNSUPPORTED 217
#define CUDA_ERROR_CONTEXT_ALREADY_CURRENT 202
#define CUDA_ERROR_INVALID_HANDLE        400
#define CUDA_ERROR_ILLEGAL_STATE         401
#define CUDA_ERROR_NOT_FOUND             500
#define CUDA_ERROR_NOT_READY             600
#define CUDA_ERROR_ILLEGAL_ADDRESS       700
#define CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED 704
#define CUDA_ERROR_PEER_ACCESS_NOT_ENABLED 705
#define CUDA_ERROR_CONTEXT_IS_DESTROYED  709
#define CUDA_ERROR_NOT_SUPPORTED         801
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED  900
#define CUDA_ERROR_STREAM_CAPTURE_INVALIDATED  901
#define CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD 908
#define CUDA_ERROR_UNKNOWN               999

/* ---- misc constants ---- */
#define CU_MEM_ATTACH_GLOBAL 0x1
#define CU_MEM_ATTACH_HOST   0x2
#define CU_STREAM_LEGACY     ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

/* ---- stream capture ---- */
typedef int CUstreamCaptureMode;
#define CU_STREAM_CAPTURE_MODE_GLOBAL       0
#define CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define CU_STREAM_CAPTURE_MODE_RELAXED      2
typedef int CUstreamCaptureStatus;
#define CU_STREAM_CAPTURE_STATUS_NONE        0
#define CU_STREAM_CAPTURE_STATUS_ACTIVE      1
#define CU_STREAM_CAPTURE_STATUS_INVALIDATED 2

/* cuGetProcAddress flags and query results */
#define CU_GET_PROC_ADDRESS_DEFAULT                    0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM              (1ULL << 0)
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM  (1ULL << 1)
typedef int CUdriverProcAddressQueryResult;
#define CU_GET_PROC_ADDRESS_SUCCESS                0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND       1
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2

/* CUdevice_attribute: only the values the sim answers specially. */
typedef int CUdevice_attribute;
#define CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK            1
#define CU_DEVICE_ATTRIBUTE_WARP_SIZE                        10
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT             16
#define CU_DEVICE_ATTRIBUTE_PCI_BUS_ID                       33
#define CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING               41
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR         75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR         76
#define CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY                   83
#define CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS        89
#define CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102
#define CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED           115

/* ---- arrays ---- */
typedef int CUarray_format;
#define CU_AD_FORMAT_UNSIGNED_INT8  0x01
#define CU_AD_FORMAT_UNSIGNED_INT16 0x02
#define CU_AD_FORMAT_UNSIGNED_INT32 0x03
#define CU_AD_FORMAT_SIGNED_INT8    0x08
#define CU_AD_FORMAT_SIGNED_INT16   0x09
#define CU_AD_FORMAT_SIGNED_INT32   0x0a
#define CU_AD_FORMAT_HALF           0x10
#define CU_AD_FORMAT_FLOAT          0x20

typedef struct CUDA_ARRAY_DESCRIPTOR_st {   /* CUDA_ARRAY_DESCRIPTOR_v2 */
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_st { /* CUDA_ARRAY3D_DESCRIPTOR_v2 */
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* ---- virtual memory management ---- */
typedef int CUmemAllocationType;
#define CU_MEM_ALLOCATION_TYPE_INVALID 0
#define CU_MEM_ALLOCATION_TYPE_PINNED  1
typedef int CUmemAllocationHandleType;
#define CU_MEM_HANDLE_TYPE_NONE 0
typedef int CUmemLocationType;
#define CU_MEM_LOCATION_TYPE_INVALID 0
#define CU_MEM_LOCATION_TYPE_DEVICE  1
typedef int CUmemAllocationGranularity_flags;
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM     0
#define CU_MEM_ALLOC_GRANULARITY_RECOMMENDED 1
typedef int CUmemAccess_flags;
#define CU_MEM_ACCESS_FLAGS_PROT_NONE      0
#define CU_MEM_ACCESS_FLAGS_PROT_READ      1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 3

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {     /* 32 bytes, as in cuda.h */
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;

/* ---- stream-ordered memory pools ---- */
typedef struct CUmemPoolProps_st {          /* 88 bytes, as in cuda.h 12.x/13.x */
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

typedef int CUmemPool_attribute;
#define CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES   1
#define CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC         2
#define CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES 3
#define CU_MEMPOOL_ATTR_RELEASE_THRESHOLD                 4
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT              5
#define CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH                 6
#define CU_MEMPOOL_ATTR_USED_MEM_CURRENT                  7
#define CU_MEMPOOL_ATTR_USED_MEM_HIGH                     8

/* ---- driver API implemented by libcuda.so.1 (the sim) ---- */
CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active);
CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxPushCurrent_v2(CUcontext ctx);
CUresult cuCtxPopCurrent_v2(CUcontext *pctx);
CUresult cuCtxGetDevice(CUdevice *device);
CUresult cuCtxSynchronize(void);
CUresult cuStreamCreate(CUstream *phStream, unsigned int flags);
CUresult cuStreamDestroy_v2(CUstream hStream);
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuStreamQuery(CUstream hStream);
CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int flags);
/* Stream capture (see the capture rules at the top of cuda_sim.c). The CUDA 10.0
 * form without a mode captures in global mode; NULL is the legacy stream, which
 * cannot capture, except in the _ptsz forms, where it is the per-thread stream. */
CUresult cuStreamBeginCapture(CUstream hStream);
CUresult cuStreamBeginCapture_ptsz(CUstream hStream);
CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                     const CUgraphNode *dependencies, const void *dependencyData,
                                     size_t numDependencies, CUstreamCaptureMode mode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                          const CUgraphNode *dependencies,
                                          const void *dependencyData, size_t numDependencies,
                                          CUstreamCaptureMode mode);
CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus);
CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus);
CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
CUresult cuGraphDestroy(CUgraph hGraph);
CUresult cuEventCreate(CUevent *phEvent, unsigned int flags);
CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
CUresult cuEventDestroy_v2(CUevent hEvent);
CUresult cuEventSynchronize(CUevent hEvent);
CUresult cuEventQuery(CUevent hEvent);
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree(CUdeviceptr_v1 dptr);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                            size_t Height, unsigned int ElementSizeBytes);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N);
CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                              CUstream hStream);
CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                              CUstream hStream);
CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev);
CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags);
CUresult cuCtxDisablePeerAccess(CUcontext peerContext);
CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                      CUcontext srcContext, size_t ByteCount);
CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                           CUcontext srcContext, size_t ByteCount, CUstream hStream);
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
CUresult cuMemFreeHost(void *p);
CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray);
CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray);
CUresult cuArrayDestroy(CUarray hArray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pDesc,
                                unsigned int numMipmapLevels);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray);
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev);
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);
CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep);
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
CUresult cuGetErrorString(CUresult error, const char **pStr);
CUresult cuGetErrorName(CUresult error, const char **pStr);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus);

/* Function-pointer types for the lookup functions (what dlsym hands out). */
typedef CUresult (*PFN_cuGetProcAddress_v1)(const char *, void **, int, cuuint64_t);
typedef CUresult (*PFN_cuGetProcAddress_v2)(const char *, void **, int, cuuint64_t,
                                             CUdriverProcAddressQueryResult *);

/* ---- the sim's own books (truth for the tests); no cuInit needed ---- */
unsigned long long simcuda_live_bytes(int dev);   /* device bytes held now, all kinds */
int simcuda_live_count(int dev);                  /* device allocations held now */
unsigned long long simcuda_live_peak(int dev);    /* highest simcuda_live_bytes(dev) so far */
int simcuda_frees_delayed(void); /* frees now inside their SIMCUDA_FREE_DELAY_MS wait (still held) */
unsigned long long simcuda_mem(void);             /* memory per device (SIMCUDA_MEM) */
int simcuda_uuid(int dev, unsigned char out[16]); /* cuDeviceGetUuid's bytes, without cuInit */
/* CUDA_VISIBLE_DEVICES: the sim functions above take ordinals (devices as this
 * process sees them); these map them to the machine's physical devices. */
int simcuda_physical_count(void);                 /* SIMCUDA_DEVICES */
int simcuda_physical_of(int ordinal);             /* -1 for an ordinal that does not exist */
int simcuda_ordinal_of(int phys);                 /* -1 for a device the process cannot see */
int simcuda_physical_uuid(int phys, unsigned char out[16]);
unsigned long long simcuda_host_live_bytes(void); /* pinned host bytes held now */
int simcuda_host_live_count(void);
unsigned long long simcuda_pool_reserved(int dev);/* bytes reserved by this device's pools */
void simcuda_fail_next(int n);                    /* next n allocation calls fail OOM */
int simcuda_device_count(void);                   /* devices visible, without cuInit */
/* How often the exported function `name` (exact export name) was called. */
unsigned long long simcuda_calls(const char *name);
/* Allocates device memory on the sim's books without any cu* entry point, so an
 * interposer never sees it; freeing it with cuMemFree_v2 is an "unknown free". */
int simcuda_untracked_alloc(int dev, size_t bytes, CUdeviceptr *dptr);
/* Replaces the injected faults with SPEC (SIMCUDA_FAULTS syntax; "" clears them);
 * rules count calls from now. CUDA_ERROR_INVALID_VALUE for a bad SPEC. */
int simcuda_set_faults(const char *spec);
/* Calls failed by injected faults so far. */
unsigned long long simcuda_faults_injected(void);
/* Captures under way now, and captures invalidated by an unsafe call so far. */
int simcuda_captures(void);
unsigned long long simcuda_captures_invalidated(void);
/* A gate on the export `name`, for handshakes: the first call of it made by a thread
 * other than the caller waits, before it does anything, until simcuda_gate_open().
 * simcuda_gate_wait() returns 1 once such a call waits there, 0 after timeout_ms. */
int simcuda_gate_arm(const char *name);
int simcuda_gate_wait(unsigned long long timeout_ms);
void simcuda_gate_open(void);

#ifdef __cplusplus
}
#endif
#endif /* CUDA_SIM_H */
