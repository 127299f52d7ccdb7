//! The one list of hooked CUDA functions: each row declares a function once (library,
//! signature, `cuGetProcAddress` base name and version, handler). `hooks` expands it
//! into the exports, wrappers and real-pointer slots; this module expands it into the
//! API names reports use. The list names handlers and types only as tokens: they
//! are resolved where `hooks` expands it, so this module depends on nothing above.

/// Hands every row of the list to the macro `$then` (defined where it is called).
macro_rules! hooked_functions {
    ($then:ident) => {
        $then! {
        // Device memory.
        Driver fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) ["cuMemAlloc", 3020, false] => mem_alloc;
        Driver fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) ["cuMemAllocPitch", 3020, false] => mem_alloc_pitch;
        Driver fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) ["cuMemAllocManaged", 6000, false] => mem_alloc_managed;
        Driver fn cuMemFree_v2(dptr: CUdeviceptr) ["cuMemFree", 3020, false] => mem_free;
        // The legacy 32-bit forms, still exported for old binaries.
        Driver fn cuMemAlloc(dptr: *mut u32, bytes: c_uint) ["cuMemAlloc", 2000, false] => mem_alloc_v1;
        Driver fn cuMemFree(dptr: u32) ["cuMemFree", 2000, false] => mem_free_v1;
        // Stream-ordered allocations.
        Driver fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: Stream) ["cuMemAllocAsync", 11020, false] => mem_alloc_async;
        Driver fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, stream: Stream) ["cuMemAllocAsync", 11020, true] => mem_alloc_async;
        Driver fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytes: usize, pool: *mut c_void, stream: Stream) ["cuMemAllocFromPoolAsync", 11020, false] => mem_alloc_from_pool;
        Driver fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, pool: *mut c_void, stream: Stream) ["cuMemAllocFromPoolAsync", 11020, true] => mem_alloc_from_pool;
        Driver fn cuMemFreeAsync(dptr: CUdeviceptr, stream: Stream) ["cuMemFreeAsync", 11020, false] => mem_free_async;
        Driver fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: Stream) ["cuMemFreeAsync", 11020, true] => mem_free_async;
        // Pools: noted so allocations from them are charged to the pool's device.
        Driver fn cuMemPoolCreate(pool: *mut *mut c_void, props: *const MemPoolProps) ["cuMemPoolCreate", 11020, false] => pool_create;
        Driver fn cuMemPoolDestroy(pool: *mut c_void) ["cuMemPoolDestroy", 11020, false] => pool_destroy;
        Driver fn cuDeviceGetDefaultMemPool(pool: *mut *mut c_void, dev: c_int) ["cuDeviceGetDefaultMemPool", 11020, false] => device_pool;
        Driver fn cuDeviceGetMemPool(pool: *mut *mut c_void, dev: c_int) ["cuDeviceGetMemPool", 11020, false] => device_pool;
        Driver fn cuMemPoolTrimTo(pool: *mut c_void, keep: usize) ["cuMemPoolTrimTo", 11020, false] => pool_trim_to;
        Driver fn cuDeviceSetMemPool(dev: c_int, pool: *mut c_void) ["cuDeviceSetMemPool", 11020, false] => device_set_pool;
        // Virtual memory management: the handle is the physical memory.
        Driver fn cuMemCreate(handle: *mut MemHandle, bytes: usize, prop: *const MemAllocationProp, flags: u64) ["cuMemCreate", 10020, false] => mem_create;
        Driver fn cuMemRelease(handle: MemHandle) ["cuMemRelease", 10020, false] => mem_release;
        // Mappings: a released handle's memory lives until its last mapping is unmapped.
        Driver fn cuMemMap(va: CUdeviceptr, size: usize, offset: usize, handle: MemHandle, flags: u64) ["cuMemMap", 10020, false] => mem_map;
        Driver fn cuMemUnmap(va: CUdeviceptr, size: usize) ["cuMemUnmap", 10020, false] => mem_unmap;
        // Pinned host memory.
        Driver fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, flags: c_uint) ["cuMemHostAlloc", 2020, false] => mem_host_alloc;
        Driver fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) ["cuMemAllocHost", 3020, false] => mem_alloc_host;
        Driver fn cuMemFreeHost(p: *mut c_void) ["cuMemFreeHost", 2000, false] => mem_free_host;
        // Arrays.
        Driver fn cuArrayCreate_v2(arr: *mut *mut c_void, desc: *const ArrayDescriptor) ["cuArrayCreate", 3020, false] => array_create;
        Driver fn cuArray3DCreate_v2(arr: *mut *mut c_void, desc: *const Array3dDescriptor) ["cuArray3DCreate", 3020, false] => array3d_create;
        Driver fn cuMipmappedArrayCreate(arr: *mut *mut c_void, desc: *const Array3dDescriptor, levels: c_uint) ["cuMipmappedArrayCreate", 5000, false] => mipmapped_create;
        Driver fn cuArrayDestroy(arr: *mut c_void) ["cuArrayDestroy", 2000, false] => array_destroy;
        Driver fn cuMipmappedArrayDestroy(arr: *mut c_void) ["cuMipmappedArrayDestroy", 5000, false] => array_destroy;
        // Contexts: created ones are told apart from primary ones; teardowns free
        // everything in a context at once.
        Driver fn cuCtxCreate_v2(ctx: *mut Ctx, flags: c_uint, dev: c_int) ["cuCtxCreate", 3020, false] => ctx_create_v2;
        Driver fn cuCtxCreate_v3(ctx: *mut Ctx, params: *mut c_void, n: c_int, flags: c_uint, dev: c_int) ["cuCtxCreate", 11040, false] => ctx_create_v3;
        Driver fn cuCtxCreate_v4(ctx: *mut Ctx, params: *mut c_void, flags: c_uint, dev: c_int) ["cuCtxCreate", 12050, false] => ctx_create_v4;
        Driver fn cuCtxDestroy_v2(ctx: Ctx) ["cuCtxDestroy", 4000, false] => ctx_destroy;
        Driver fn cuDevicePrimaryCtxReset_v2(dev: c_int) ["cuDevicePrimaryCtxReset", 11000, false] => primary_ctx_reset;
        Driver fn cuDevicePrimaryCtxRelease_v2(dev: c_int) ["cuDevicePrimaryCtxRelease", 11000, false] => primary_ctx_release;
        // What the process is told about memory: the cap, where there is one.
        Driver fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) ["cuMemGetInfo", 3020, false] => mem_get_info;
        Driver fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) ["cuDeviceTotalMem", 3020, false] => device_total_mem;
        Nvml fn nvmlDeviceGetMemoryInfo(dev: *mut c_void, mem: *mut NvmlMemory) ["", 0, false] => nvml_memory;
        Nvml fn nvmlDeviceGetMemoryInfo_v2(dev: *mut c_void, mem: *mut NvmlMemoryV2) ["", 0, false] => nvml_memory_v2;
        // The lookup that hands out every other driver function.
        Driver fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) ["cuGetProcAddress", 11030, false] => get_proc_address;
        Driver fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) ["cuGetProcAddress", 12000, false] => get_proc_address_v2;
        // Runtime calls: they label the driver record beneath them.
        Runtime fn cudaMalloc(p: *mut *mut c_void, bytes: usize) ["", 0, false] => rt_malloc;
        Runtime fn cudaMallocManaged(p: *mut *mut c_void, bytes: usize, flags: c_uint) ["", 0, false] => rt_malloc_managed;
        Runtime fn cudaMallocPitch(p: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) ["", 0, false] => rt_malloc_pitch;
        Runtime fn cudaMalloc3D(pitched: *mut PitchedPtr, extent: Extent) ["", 0, false] => rt_malloc_3d;
        Runtime fn cudaMallocAsync(p: *mut *mut c_void, bytes: usize, stream: Stream) ["", 0, false] => rt_malloc_async;
        Runtime fn cudaMallocAsync_ptsz(p: *mut *mut c_void, bytes: usize, stream: Stream) ["", 0, false] => rt_malloc_async;
        Runtime fn cudaMallocFromPoolAsync(p: *mut *mut c_void, bytes: usize, pool: *mut c_void, stream: Stream) ["", 0, false] => rt_malloc_from_pool;
        Runtime fn cudaMallocFromPoolAsync_ptsz(p: *mut *mut c_void, bytes: usize, pool: *mut c_void, stream: Stream) ["", 0, false] => rt_malloc_from_pool;
        Runtime fn cudaFree(p: *mut c_void) ["", 0, false] => rt_free;
        Runtime fn cudaFreeAsync(p: *mut c_void, stream: Stream) ["", 0, false] => rt_free_async;
        Runtime fn cudaFreeAsync_ptsz(p: *mut c_void, stream: Stream) ["", 0, false] => rt_free_async;
        Runtime fn cudaMallocHost(p: *mut *mut c_void, bytes: usize) ["", 0, false] => rt_malloc_host;
        Runtime fn cudaHostAlloc(p: *mut *mut c_void, bytes: usize, flags: c_uint) ["", 0, false] => rt_host_alloc;
        Runtime fn cudaFreeHost(p: *mut c_void) ["", 0, false] => rt_free_host;
        Runtime fn cudaDeviceReset() ["", 0, false] => rt_device_reset;
        }
    };
}
pub(crate) use hooked_functions;

macro_rules! api_names {
    ($(
        $lib:ident fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? )
            [$base:literal, $since:literal, $ptds:literal] => $handler:path;
    )*) => {
        /// Every hooked function's name, in list order (a record's `api` is its row).
        static NAMES: &[&str] = &[$(stringify!($name)),*];
    };
}
hooked_functions!(api_names);

/// The name of a row of the list, for reports.
pub fn api_name(api: u8) -> &'static str {
    NAMES.get(api as usize).copied().unwrap_or("unknown")
}
