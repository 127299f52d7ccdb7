//! The one list of hooked CUDA functions. Each row declares a function once: library,
//! signature, `cuGetProcAddress` base name and version (and whether it is the `_ptsz`
//! variant), and the rule that says what its handler does. `hooks` expands the list
//! into the exports, the wrappers `dlsym` and `cuGetProcAddress` hand out, the
//! real-pointer slots and one handler per row; this module expands it into the API
//! names reports use. The list names types, functions and rules only as tokens,
//! resolved where `hooks` expands it, so this module depends on nothing above.
//!
//! The rules (`hooks::handle!` expands them; `track` does the work):
//! - `alloc { kind, out, key, size }`: a driver allocation whose size is known before
//!   the call: reserve `size` against the cap, call, record the value the call wrote
//!   to `out` as a `key` (`Key::device`, `Key::host`, ...) of `kind`. With `device:`
//!   and `pool:` the call names its device (a pool's, a VMM location) and pool.
//! - `alloc_measured { kind, out, key, estimate, size }`: the same when the driver
//!   decides the size (pitch, arrays): reserve the estimate, record `size` (an
//!   `Option<u64>` read after the call).
//! - `free { key, arg }`: a driver free of the record `Key::key(arg)`.
//! - `rt_alloc { kind, out, key, size }`, `rt_free { key, arg }`: runtime calls; the
//!   driver call beneath them does the counting, they label its record (and record
//!   it themselves only when no driver hook saw it).
//! - `observe { before, note }`: allocates nothing; `note` (a closure over the books)
//!   runs after a successful call, `before` (optional) before it.
//! - `capture_begin { stream }`, `capture_end { stream }`: a stream enters or leaves
//!   CUDA graph capture; the process-wide gauge of capturing streams (`capture`)
//!   follows it, so the helper thread never makes a call that would break a capture.
//! - `custom(handler)`: the odd ones, each a function in `hooks`: teardowns, what the
//!   process is told about memory, NVML, `cuGetProcAddress`, VMM release.
//!
//! In the rules' expressions the row's arguments are in scope, `out(p)` reads an
//! out-pointer the call wrote (`None` for NULL), and the whole is `unsafe`.

/// Hands every row of the list to the macro `$then` (defined where it is called).
macro_rules! hooked_functions {
    ($then:ident) => {
        $then! {
        // Device memory.
        Driver fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) ["cuMemAlloc", 3020, false]
            => alloc { kind: Device, out: dptr, key: device, size: bytes };
        Driver fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) ["cuMemAllocPitch", 3020, false]
            => alloc_measured { kind: Pitch, out: dptr, key: device, estimate: pitch_estimate(width, height),
                                size: Some(out(pitch).unwrap_or(width) as u64 * height as u64) };
        Driver fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) ["cuMemAllocManaged", 6000, false]
            => alloc { kind: Managed, out: dptr, key: device, size: bytes };
        Driver fn cuMemFree_v2(dptr: CUdeviceptr) ["cuMemFree", 3020, false]
            => free { key: device, arg: dptr };
        // The legacy 32-bit forms, still exported for old binaries.
        Driver fn cuMemAlloc(dptr: *mut u32, bytes: c_uint) ["cuMemAlloc", 2000, false]
            => alloc { kind: Device, out: dptr, key: device, size: bytes };
        Driver fn cuMemFree(dptr: u32) ["cuMemFree", 2000, false]
            => free { key: device, arg: dptr };
        // Stream-ordered allocations.
        Driver fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) ["cuMemAllocAsync", 11020, false]
            => alloc { kind: Pool, out: dptr, key: device, size: bytes };
        Driver fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) ["cuMemAllocAsync", 11020, true]
            => alloc { kind: Pool, out: dptr, key: device, size: bytes };
        Driver fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) ["cuMemAllocFromPoolAsync", 11020, false]
            => alloc { kind: Pool, out: dptr, key: device, size: bytes, device: track::pool_device(pool.cast()), pool: Some(pool as u64) };
        Driver fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) ["cuMemAllocFromPoolAsync", 11020, true]
            => alloc { kind: Pool, out: dptr, key: device, size: bytes, device: track::pool_device(pool.cast()), pool: Some(pool as u64) };
        Driver fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) ["cuMemFreeAsync", 11020, false]
            => free { key: device, arg: dptr };
        Driver fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) ["cuMemFreeAsync", 11020, true]
            => free { key: device, arg: dptr };
        // Pools: noted so allocations from them are charged to the pool's device.
        Driver fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) ["cuMemPoolCreate", 11020, false]
            => observe { note: |books| {
                if let Some(dev) = pool_props_device(props) {
                    books.add_pool(out(pool)? as u64, dev);
                }
                Some(())
            } };
        Driver fn cuMemPoolDestroy(pool: CUmemoryPool) ["cuMemPoolDestroy", 11020, false]
            => observe { note: |books| Some(books.remove_pool(pool as u64)) };
        Driver fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) ["cuDeviceGetDefaultMemPool", 11020, false]
            => observe { note: |books| Some(books.add_pool(out(pool)? as u64, dev)) };
        Driver fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) ["cuDeviceGetMemPool", 11020, false]
            => observe { note: |books| Some(books.add_pool(out(pool)? as u64, dev)) };
        Driver fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) ["cuMemPoolTrimTo", 11020, false]
            => observe { note: |books| Some(books.pool_trimmed(pool as u64)) };
        Driver fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) ["cuDeviceSetMemPool", 11020, false]
            => observe { note: |books| {
                books.add_pool(pool as u64, dev);
                books.current_pool.get(usize::try_from(dev).ok()?)?.store(pool as u64, Relaxed);
                Some(())
            } };
        // Virtual memory management: the handle is the physical memory.
        Driver fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, bytes: usize, prop: *const CUmemAllocationProp, flags: u64) ["cuMemCreate", 10020, false]
            => alloc { kind: Vmm, out: handle, key: vmm, size: bytes, device: alloc_prop_device(prop), pool: None };
        Driver fn cuMemRelease(handle: CUmemGenericAllocationHandle) ["cuMemRelease", 10020, false]
            => custom(mem_release);
        // Mappings: a released handle's memory lives until its last mapping is unmapped.
        Driver fn cuMemMap(va: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) ["cuMemMap", 10020, false]
            => observe { note: |books| Some(books.vmm.mapped(va, size as u64, handle)) };
        Driver fn cuMemUnmap(va: CUdeviceptr, size: usize) ["cuMemUnmap", 10020, false]
            => observe { note: |books| {
                for handle in books.vmm.unmapped(va, size as u64) {
                    if let Some(rec) = books.ledger.take(Key::vmm(handle)) {
                        books.ledger.confirm_free(&rec);
                    }
                }
                Some(())
            } };
        // Pinned host memory.
        Driver fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, flags: c_uint) ["cuMemHostAlloc", 2020, false]
            => alloc { kind: Host, out: pp, key: host, size: bytes };
        Driver fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) ["cuMemAllocHost", 3020, false]
            => alloc { kind: Host, out: pp, key: host, size: bytes };
        Driver fn cuMemFreeHost(p: *mut c_void) ["cuMemFreeHost", 2000, false]
            => free { key: host, arg: p };
        // Arrays.
        Driver fn cuArrayCreate_v2(arr: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) ["cuArrayCreate", 3020, false]
            => alloc_measured { kind: Array, out: arr, key: array,
                                estimate: ArrayShape::of_2d(desc).map_or(0, |s| s.bytes()),
                                size: ArrayShape::of_2d(desc).map(|s| s.bytes()) };
        Driver fn cuArray3DCreate_v2(arr: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) ["cuArray3DCreate", 3020, false]
            => alloc_measured { kind: Array, out: arr, key: array,
                                estimate: ArrayShape::of_3d(desc).map_or(0, |s| s.bytes()),
                                size: ArrayShape::of_3d(desc).map(|s| s.bytes()) };
        Driver fn cuMipmappedArrayCreate(arr: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) ["cuMipmappedArrayCreate", 5000, false]
            => alloc_measured { kind: Array, out: arr, key: array,
                                estimate: ArrayShape::of_3d(desc).map_or(0, |s| s.mipmapped_bytes(levels)),
                                size: ArrayShape::of_3d(desc).map(|s| s.mipmapped_bytes(levels)) };
        Driver fn cuArrayDestroy(arr: CUarray) ["cuArrayDestroy", 2000, false]
            => free { key: array, arg: arr };
        Driver fn cuMipmappedArrayDestroy(arr: CUmipmappedArray) ["cuMipmappedArrayDestroy", 5000, false]
            => free { key: array, arg: arr };
        // Contexts: created ones are told apart from primary ones; teardowns free
        // everything in a context at once.
        Driver fn cuCtxCreate_v2(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) ["cuCtxCreate", 3020, false]
            => observe { before: track::creating_context(), note: |books| note_created(books, out(ctx)?) };
        Driver fn cuCtxCreate_v3(ctx: *mut CUcontext, params: *mut c_void, n: c_int, flags: c_uint, dev: CUdevice) ["cuCtxCreate", 11040, false]
            => observe { before: track::creating_context(), note: |books| note_created(books, out(ctx)?) };
        Driver fn cuCtxCreate_v4(ctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) ["cuCtxCreate", 12050, false]
            => observe { before: track::creating_context(), note: |books| note_created(books, out(ctx)?) };
        Driver fn cuCtxDestroy_v2(ctx: CUcontext) ["cuCtxDestroy", 4000, false]
            => custom(ctx_destroy);
        Driver fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) ["cuDevicePrimaryCtxReset", 11000, false]
            => custom(primary_ctx_reset);
        Driver fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) ["cuDevicePrimaryCtxRelease", 11000, false]
            => custom(primary_ctx_release);
        // What the process is told about memory: the cap, where there is one.
        Driver fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) ["cuMemGetInfo", 3020, false]
            => custom(mem_get_info);
        Driver fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) ["cuDeviceTotalMem", 3020, false]
            => custom(device_total_mem);
        Nvml fn nvmlDeviceGetMemoryInfo(dev: NvmlDevice, mem: *mut NvmlMemory) ["", 0, false]
            => custom(nvml_memory);
        Nvml fn nvmlDeviceGetMemoryInfo_v2(dev: NvmlDevice, mem: *mut NvmlMemoryV2) ["", 0, false]
            => custom(nvml_memory_v2);
        // Stream capture (CUDA graphs): while a stream captures, a synchronizing call
        // from any thread breaks the capture, so gpuguard keeps count. Modes travel as
        // plain integers (a C enum; a value cudarc's enum lacks would be undefined).
        Driver fn cuStreamBeginCapture(stream: CUstream) ["cuStreamBeginCapture", 10000, false]
            => capture_begin { stream: stream };
        Driver fn cuStreamBeginCapture_ptsz(stream: CUstream) ["cuStreamBeginCapture", 10000, true]
            => capture_begin { stream: stream };
        Driver fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_uint) ["cuStreamBeginCapture", 10010, false]
            => capture_begin { stream: stream };
        Driver fn cuStreamBeginCapture_v2_ptsz(stream: CUstream, mode: c_uint) ["cuStreamBeginCapture", 10010, true]
            => capture_begin { stream: stream };
        Driver fn cuStreamBeginCaptureToGraph(stream: CUstream, graph: CUgraph, deps: *const CUgraphNode, edges: *const c_void, n: usize, mode: c_uint) ["cuStreamBeginCaptureToGraph", 12030, false]
            => capture_begin { stream: stream };
        Driver fn cuStreamBeginCaptureToGraph_ptsz(stream: CUstream, graph: CUgraph, deps: *const CUgraphNode, edges: *const c_void, n: usize, mode: c_uint) ["cuStreamBeginCaptureToGraph", 12030, true]
            => capture_begin { stream: stream };
        Driver fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) ["cuStreamEndCapture", 10000, false]
            => capture_end { stream: stream };
        Driver fn cuStreamEndCapture_ptsz(stream: CUstream, graph: *mut CUgraph) ["cuStreamEndCapture", 10000, true]
            => capture_end { stream: stream };
        // The lookup that hands out every other driver function.
        Driver fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) ["cuGetProcAddress", 11030, false]
            => custom(get_proc_address);
        Driver fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) ["cuGetProcAddress", 12000, false]
            => custom(get_proc_address_v2);
        // Runtime calls: they label the driver record beneath them.
        Runtime fn cudaMalloc(p: *mut *mut c_void, bytes: usize) ["", 0, false]
            => rt_alloc { kind: Device, out: p, key: device, size: bytes };
        Runtime fn cudaMallocManaged(p: *mut *mut c_void, bytes: usize, flags: c_uint) ["", 0, false]
            => rt_alloc { kind: Managed, out: p, key: device, size: bytes };
        Runtime fn cudaMallocPitch(p: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) ["", 0, false]
            => rt_alloc { kind: Pitch, out: p, key: device, size: out(pitch).unwrap_or(width).saturating_mul(height.max(1)) };
        Runtime fn cudaMalloc3D(pitched: *mut cudaPitchedPtr, extent: cudaExtent) ["", 0, false]
            => custom(rt_malloc_3d);
        Runtime fn cudaMallocAsync(p: *mut *mut c_void, bytes: usize, stream: cudaStream_t) ["", 0, false]
            => rt_alloc { kind: Pool, out: p, key: device, size: bytes };
        Runtime fn cudaMallocAsync_ptsz(p: *mut *mut c_void, bytes: usize, stream: cudaStream_t) ["", 0, false]
            => rt_alloc { kind: Pool, out: p, key: device, size: bytes };
        Runtime fn cudaMallocFromPoolAsync(p: *mut *mut c_void, bytes: usize, pool: *mut c_void, stream: cudaStream_t) ["", 0, false]
            => rt_alloc { kind: Pool, out: p, key: device, size: bytes };
        Runtime fn cudaMallocFromPoolAsync_ptsz(p: *mut *mut c_void, bytes: usize, pool: *mut c_void, stream: cudaStream_t) ["", 0, false]
            => rt_alloc { kind: Pool, out: p, key: device, size: bytes };
        Runtime fn cudaFree(p: *mut c_void) ["", 0, false]
            => rt_free { key: device, arg: p };
        Runtime fn cudaFreeAsync(p: *mut c_void, stream: cudaStream_t) ["", 0, false]
            => rt_free { key: device, arg: p };
        Runtime fn cudaFreeAsync_ptsz(p: *mut c_void, stream: cudaStream_t) ["", 0, false]
            => rt_free { key: device, arg: p };
        Runtime fn cudaMallocHost(p: *mut *mut c_void, bytes: usize) ["", 0, false]
            => rt_alloc { kind: Host, out: p, key: host, size: bytes };
        Runtime fn cudaHostAlloc(p: *mut *mut c_void, bytes: usize, flags: c_uint) ["", 0, false]
            => rt_alloc { kind: Host, out: p, key: host, size: bytes };
        Runtime fn cudaFreeHost(p: *mut c_void) ["", 0, false]
            => rt_free { key: host, arg: p };
        Runtime fn cudaDeviceReset() ["", 0, false]
            => custom(rt_device_reset);
        }
    };
}
pub(crate) use hooked_functions;

macro_rules! api_names {
    ($(
        $lib:ident fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? )
            [$base:literal, $since:literal, $ptds:literal] => $rule:ident $how:tt;
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
