//! Finding the real functions: the real `dlsym`, the per-path slots that hold the
//! real pointer each lookup path returned, gpuguard's own driver and NVML calls (one
//! typed slot each, `own_functions!`), and `fn_at`, where an address found for a CUDA,
//! NVML or glibc function becomes a typed function pointer.
//!
//! The lowest layer of the shim with `cuda`: it knows nothing of the hooks above it
//! (the `dlsym` override that uses it is in `hooks`).

use super::cuda::{
    CUcontext, CUdevice, CUdeviceptr, CUmemPool_attribute, CUmemoryPool, CUuuid,
    NVML_ERROR_INSUFFICIENT_SIZE, NVML_SUCCESS, NvmlDevice, NvmlProcessInfo, SUCCESS,
};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering::*};

unsafe extern "C" {
    fn dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void;
}

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's own `dlsym`. Read by the `dlsym` override (`hooks::dlsym`) as a plain word.
pub(crate) static GPUGUARD_REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// Resolves glibc's `dlsym` by version, since `dlsym(RTLD_NEXT, "dlsym")` would go
/// through ourselves.
pub(crate) fn real_dlsym() -> Option<DlsymFn> {
    if super::fault::hit("no-dlsym") {
        return None;
    }
    let mut p = GPUGUARD_REAL_DLSYM.load(Acquire);
    if p == 0 {
        for v in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: dlvsym with constant, NUL-terminated strings.
            let f = unsafe { dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), v.as_ptr()) };
            if !f.is_null() {
                p = f as usize;
                break;
            }
        }
        GPUGUARD_REAL_DLSYM.store(p, Release);
    }
    // SAFETY: p is glibc's dlsym, whose signature DlsymFn matches.
    (p != 0).then(|| unsafe { fn_at::<DlsymFn>(p) })
}

/// `dlsym(handle, name)` through glibc, never through our override.
pub(crate) unsafe fn lookup(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match real_dlsym() {
        // SAFETY: forwarding a valid C string to glibc.
        Some(f) => unsafe { f(handle, name.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}

/// Which lookup path a wrapper serves. Each path keeps its own real pointer, because
/// a pointer handed out for one request must call exactly what that request returned.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Path {
    Symbol = 0,
    Dlsym = 1,
    Proc = 2,
}

/// Wrappers (and real-pointer slots) each lookup path has per hooked function: a
/// path may offer different real pointers for one function (two copies of a driver,
/// a lookup answering per request), and each must still get a wrapper of its own.
pub const PER_PATH: usize = 4;
/// Slots per function: the symbol's, then `PER_PATH` for `dlsym`, then for
/// `cuGetProcAddress`.
pub const SLOTS_PER_ROW: usize = 1 + 2 * PER_PATH;

/// The first slot of a path.
pub const fn path_base(path: Path) -> usize {
    match path {
        Path::Symbol => 0,
        Path::Dlsym => 1,
        Path::Proc => 1 + PER_PATH,
    }
}

/// The real pointers of one hooked function: the symbol's, and up to `PER_PATH` per
/// lookup path.
pub struct Slots {
    real: [AtomicPtr<c_void>; SLOTS_PER_ROW],
}

impl Slots {
    pub const fn new() -> Slots {
        Slots {
            real: [const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS_PER_ROW],
        }
    }

    /// The real function for `path`'s first slot (see `get_at`).
    #[inline]
    pub fn get(&self, path: Path, name: &CStr, soname: &CStr) -> Option<*mut c_void> {
        self.get_at(path_base(path), name, soname)
    }

    /// The real function of slot `i`. The symbol's slot (0) resolves itself on first
    /// use (the next definition after gpuguard, or the loaded library's own); the
    /// others were filled when their pointer was handed out.
    #[inline]
    pub fn get_at(&self, i: usize, name: &CStr, soname: &CStr) -> Option<*mut c_void> {
        let p = self.real.get(i)?.load(Acquire);
        if !p.is_null() {
            return Some(p);
        }
        if i != 0 {
            return None;
        }
        let p = resolve_next(name, soname)?;
        self.real[0].store(p, Release);
        Some(p)
    }

    /// Keeps `real` in a slot of `path` (one already holding it, or a free one):
    /// which one, counted from the path's first. `None` when every slot of the path
    /// holds another pointer: then the caller gets `real` unhooked.
    pub fn offer(&self, path: Path, real: *mut c_void) -> Option<usize> {
        let base = path_base(path);
        let n = if path == Path::Symbol { 1 } else { PER_PATH };
        (0..n).find(|&i| {
            match self.real[base + i].compare_exchange(std::ptr::null_mut(), real, AcqRel, Acquire)
            {
                Ok(_) => true,
                Err(cur) => cur == real,
            }
        })
    }

    /// Forget every pointer (a child after fork keeps them: same mappings).
    #[cfg(test)]
    pub fn clear(&self) {
        for s in &self.real {
            s.store(std::ptr::null_mut(), Release);
        }
    }
}

/// The definition of `name` after gpuguard in the search order, or, when the library
/// was loaded privately (RTLD_LOCAL), its own definition.
fn resolve_next(name: &CStr, soname: &CStr) -> Option<*mut c_void> {
    // SAFETY: glibc lookups with valid C strings.
    unsafe {
        let p = lookup(libc::RTLD_NEXT, name);
        if !p.is_null() && !in_own_object(p) {
            return Some(p);
        }
        let h = libc::dlopen(soname.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if h.is_null() {
            return None;
        }
        let p = lookup(h, name);
        libc::dlclose(h);
        (!p.is_null() && !in_own_object(p)).then_some(p)
    }
}

/// Whether `p` lies in gpuguard's own object. A lookup of a CUDA name that lands
/// there has found gpuguard's own export of that name (its only symbols with CUDA
/// names are the hook wrappers), never the real function. Asked of the loader each
/// time (only when a real pointer is first resolved), so it holds before gpuguard's
/// constructor has run too.
fn in_own_object(p: *mut c_void) -> bool {
    // SAFETY: dladdr only reads the loader's tables; a zeroed Dl_info is valid.
    unsafe {
        let mut theirs: libc::Dl_info = std::mem::zeroed();
        let mut ours: libc::Dl_info = std::mem::zeroed();
        libc::dladdr(p, &mut theirs) != 0
            && libc::dladdr(in_own_object as *const c_void, &mut ours) != 0
            && theirs.dli_fbase == ours.dli_fbase
    }
}

/// Turns the address of a C function into a typed function pointer: the shim's one
/// transmute from an address to a function.
///
/// # Safety
/// `p` is the address of a function whose C signature and calling convention are
/// exactly `F`'s (an `unsafe extern "C" fn` type): the address was looked up by the
/// function's own name, and `F` is the signature declared for that name (the hooked
/// functions' in `table`, gpuguard's own calls' in `own_functions!` below).
#[inline(always)]
pub(crate) unsafe fn fn_at<F: Copy>(p: usize) -> F {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<usize>()) };
    // SAFETY: F is a function pointer type of the same size (asserted above), and by
    // the caller's promise `p` is a function of that type.
    unsafe { std::mem::transmute_copy::<usize, F>(&p) }
}

/// Marks a slot whose lookup failed, so it is not retried on every call.
const MISSING: usize = 1;

/// One function gpuguard calls itself: its name, its library, and the address found
/// on first use (the next definition after gpuguard, so never one of our hooks).
pub(crate) struct OwnFn<F> {
    name: &'static CStr,
    soname: &'static CStr,
    slot: AtomicUsize,
    signature: PhantomData<F>,
}

impl<F: Copy> OwnFn<F> {
    const fn new(name: &'static CStr, soname: &'static CStr) -> OwnFn<F> {
        OwnFn {
            name,
            soname,
            slot: AtomicUsize::new(0),
            signature: PhantomData,
        }
    }

    /// The function, or `None` when the library or the symbol is missing (asked once).
    pub fn get(&self) -> Option<F> {
        let mut p = self.slot.load(Acquire);
        if p == 0 {
            p = resolve_next(self.name, self.soname).map_or(MISSING, |p| p as usize);
            self.slot.store(p, Release);
        }
        // SAFETY: `p` was looked up by `self.name`, whose signature is `F` (the list
        // in `own_functions!` pairs each name with its signature).
        (p > MISSING).then(|| unsafe { fn_at::<F>(p) })
    }
}

// SAFETY: PhantomData of a function pointer type; the slot is atomic.
unsafe impl<F> Sync for OwnFn<F> {}

/// Declares gpuguard's own driver and NVML calls: one typed slot per function. Each
/// returns the library's status as a plain `c_int`: a Rust enum (`CUresult`) would be
/// undefined for a code the bindings do not list. cudarc 0.19's `sys` modules have no
/// function pointer types (its functions are loaded by its own loader, which panics
/// when the library is missing), so each signature is declared here, once.
macro_rules! own_functions {
    ($( $field:ident: $lib:literal $name:literal fn($($ty:ty),* $(,)?); )*) => {
        /// gpuguard's own calls into the driver and NVML, through pointers it resolved
        /// itself, so they never re-enter a hook.
        pub(crate) struct OwnFns {
            $(pub $field: OwnFn<unsafe extern "C" fn($($ty),*) -> c_int>,)*
        }

        pub(crate) static OWN: OwnFns = OwnFns {
            $($field: OwnFn::new($name, $lib),)*
        };
    };
}

own_functions! {
    ctx_get_current: c"libcuda.so.1" c"cuCtxGetCurrent" fn(*mut CUcontext);
    ctx_get_device: c"libcuda.so.1" c"cuCtxGetDevice" fn(*mut CUdevice);
    device_total_mem: c"libcuda.so.1" c"cuDeviceTotalMem_v2" fn(*mut usize, CUdevice);
    device_get_count: c"libcuda.so.1" c"cuDeviceGetCount" fn(*mut c_int);
    primary_ctx_get_state: c"libcuda.so.1" c"cuDevicePrimaryCtxGetState" fn(CUdevice, *mut c_uint, *mut c_int);
    mem_free: c"libcuda.so.1" c"cuMemFree_v2" fn(CUdeviceptr);
    device_get_mem_pool: c"libcuda.so.1" c"cuDeviceGetMemPool" fn(*mut CUmemoryPool, CUdevice);
    pool_get_attribute: c"libcuda.so.1" c"cuMemPoolGetAttribute" fn(CUmemoryPool, CUmemPool_attribute, *mut c_void);
    pool_trim_to: c"libcuda.so.1" c"cuMemPoolTrimTo" fn(CUmemoryPool, usize);
    device_get_uuid: c"libcuda.so.1" c"cuDeviceGetUuid_v2" fn(*mut CUuuid, CUdevice);
    device_get_uuid_v1: c"libcuda.so.1" c"cuDeviceGetUuid" fn(*mut CUuuid, CUdevice);
    nvml_device_get_uuid: c"libnvidia-ml.so.1" c"nvmlDeviceGetUUID" fn(NvmlDevice, *mut c_char, c_uint);
    nvml_init: c"libnvidia-ml.so.1" c"nvmlInit_v2" fn();
    nvml_by_uuid: c"libnvidia-ml.so.1" c"nvmlDeviceGetHandleByUUID" fn(*const c_char, *mut NvmlDevice);
    nvml_processes: c"libnvidia-ml.so.1" c"nvmlDeviceGetComputeRunningProcesses_v3" fn(NvmlDevice, *mut c_uint, *mut NvmlProcessInfo);
}

/// gpuguard's own driver calls, as answers.
pub(crate) struct Driver;

pub(crate) static DRIVER: Driver = Driver;

impl Driver {
    /// The calling thread's current context, 0 when none or unknown.
    pub fn current_ctx(&self) -> u64 {
        let Some(f) = OWN.ctx_get_current.get() else {
            return 0;
        };
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: cuCtxGetCurrent writes one context handle.
        let rc = unsafe { f(&mut ctx) };
        if rc == SUCCESS { ctx as u64 } else { 0 }
    }

    /// The device of the current context.
    pub fn current_device(&self) -> Option<i32> {
        let f = OWN.ctx_get_device.get()?;
        let mut dev: CUdevice = -1;
        // SAFETY: cuCtxGetDevice writes one device ordinal.
        let rc = unsafe { f(&mut dev) };
        (rc == SUCCESS && dev >= 0).then_some(dev)
    }

    /// Frees device memory gpuguard must take back (an allocation past the cap).
    pub fn free(&self, addr: u64) {
        if let Some(f) = OWN.mem_free.get() {
            // SAFETY: addr came from the driver.
            unsafe { f(addr) };
        }
    }

    /// The device's current stream-ordered memory pool.
    pub fn device_mem_pool(&self, device: i32) -> Option<u64> {
        let f = OWN.device_get_mem_pool.get()?;
        let mut pool: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: cuDeviceGetMemPool writes one pool handle.
        let rc = unsafe { f(&mut pool, device) };
        (rc == SUCCESS && !pool.is_null()).then_some(pool as u64)
    }

    /// What a pool holds from the driver (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub fn pool_reserved(&self, pool: u64) -> Option<u64> {
        let f = OWN.pool_get_attribute.get()?;
        let mut v: u64 = 0;
        // SAFETY: this attribute's value is a cuuint64_t, written to `v`.
        let rc = unsafe {
            f(
                pool as CUmemoryPool,
                CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                &mut v as *mut u64 as *mut c_void,
            )
        };
        (rc == SUCCESS).then_some(v)
    }

    /// Releases what a pool holds unused (`cuMemPoolTrimTo(pool, 0)`).
    pub fn pool_trim(&self, pool: u64) {
        if let Some(f) = OWN.pool_trim_to.get() {
            // SAFETY: a pool handle the driver handed out.
            unsafe { f(pool as CUmemoryPool, 0) };
        }
    }

    /// A device's UUID as the driver gives it: 16 bytes, no allocation.
    pub fn device_uuid_bytes(&self, device: i32) -> Option<[u8; 16]> {
        let f = OWN
            .device_get_uuid
            .get()
            .or_else(|| OWN.device_get_uuid_v1.get())?;
        let mut u = CUuuid { bytes: [0; 16] };
        // SAFETY: cuDeviceGetUuid(_v2) writes one 16-byte CUuuid.
        let rc = unsafe { f(&mut u, device) };
        (rc == SUCCESS).then(|| u.bytes.map(|b| b as u8))
    }

    /// A device's UUID, formatted as NVML formats it (`GPU-xxxxxxxx-xxxx-...`).
    pub fn device_uuid(&self, device: i32) -> Option<String> {
        self.device_uuid_bytes(device)
            .map(|u| gpuguard_core::cap::uuid_string(&u))
    }

    /// How many devices the process sees; `None` before cuInit or without a driver.
    pub fn device_count(&self) -> Option<i32> {
        let f = OWN.device_get_count.get()?;
        let mut n: c_int = 0;
        // SAFETY: cuDeviceGetCount writes one int.
        let rc = unsafe { f(&mut n) };
        (rc == SUCCESS).then_some(n)
    }

    /// Whether the primary context of `device` still exists.
    pub fn primary_ctx_active(&self, device: i32) -> Option<bool> {
        let f = OWN.primary_ctx_get_state.get()?;
        let (mut flags, mut active): (c_uint, c_int) = (0, 0);
        // SAFETY: cuDevicePrimaryCtxGetState writes the flags and the state.
        let rc = unsafe { f(device, &mut flags, &mut active) };
        (rc == SUCCESS).then_some(active != 0)
    }

    /// Device memory size as the driver states it.
    pub fn total_mem(&self, device: i32) -> Option<u64> {
        let f = OWN.device_total_mem.get()?;
        let mut bytes: usize = 0;
        // SAFETY: cuDeviceTotalMem_v2 writes one size.
        let rc = unsafe { f(&mut bytes, device) };
        (rc == SUCCESS).then_some(bytes as u64)
    }
}

/// The address range of gpuguard's own code, so stack capture can skip its frames.
pub(crate) static OWN_LO: AtomicUsize = AtomicUsize::new(0);
pub(crate) static OWN_HI: AtomicUsize = AtomicUsize::new(0);

/// The address range of the driver library (libcuda), so a hook entered again on a
/// thread already inside one can tell the driver calling its own exports from a
/// signal handler. Both 0 until known.
static DRIVER_LO: AtomicUsize = AtomicUsize::new(0);
static DRIVER_HI: AtomicUsize = AtomicUsize::new(0);

/// The loaded object holding `addr`: [its base, the end of its last segment).
fn object_range(addr: *const c_void) -> Option<(usize, usize)> {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: glibc passes a valid dl_phdr_info; data is our (base, hi) pair.
        unsafe {
            let range = &mut *(data as *mut (usize, usize));
            let info = &*info;
            if info.dlpi_addr as usize != range.0 {
                return 0;
            }
            let mut hi = 0usize;
            for i in 0..info.dlpi_phnum as usize {
                let ph = &*info.dlpi_phdr.add(i);
                if ph.p_type == libc::PT_LOAD {
                    hi = hi.max(range.0 + (ph.p_vaddr + ph.p_memsz) as usize);
                }
            }
            range.1 = hi;
            1
        }
    }
    // SAFETY: dladdr on a code address; dl_iterate_phdr with a callback that only
    // reads what glibc passes.
    unsafe {
        let mut dl: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr, &mut dl) == 0 {
            return None;
        }
        let mut range = (dl.dli_fbase as usize, 0usize);
        libc::dl_iterate_phdr(Some(each), &mut range as *mut (usize, usize) as *mut c_void);
        (range.1 > range.0).then_some(range)
    }
}

pub(crate) fn find_own_range() {
    if let Some((lo, hi)) = object_range(find_own_range as *const c_void) {
        OWN_LO.store(lo, Relaxed);
        OWN_HI.store(hi, Relaxed);
    }
}

/// Finds the driver library's range (at activation: the driver is loaded by then).
pub(crate) fn find_driver_range() {
    let Some(f) = OWN.mem_free.get() else {
        return;
    };
    if let Some((lo, hi)) = object_range(f as *const c_void) {
        DRIVER_HI.store(hi, Relaxed);
        DRIVER_LO.store(lo, Relaxed);
    }
}

/// Whether `pc` lies in the driver library; `None` while its range is unknown.
#[inline]
pub(crate) fn is_driver_code(pc: usize) -> Option<bool> {
    let lo = DRIVER_LO.load(Relaxed);
    let hi = DRIVER_HI.load(Relaxed);
    (lo < hi).then_some(pc >= lo && pc < hi)
}

#[inline]
pub(crate) fn is_own_code(pc: usize) -> bool {
    pc >= OWN_LO.load(Relaxed) && pc < OWN_HI.load(Relaxed)
}

/// `is_own_code` with the range read once for a whole stack capture (it is set
/// once, at load).
#[inline]
pub(crate) fn own_code() -> impl Fn(usize) -> bool + Copy {
    let (lo, hi) = (OWN_LO.load(Relaxed), OWN_HI.load(Relaxed));
    move |pc| pc >= lo && pc < hi
}

/// Where gpuguard's own use of NVML stands: not tried; being loaded and initialized
/// (by one thread, which may take seconds); ready; not usable. Not a `OnceLock`: a
/// fork while another thread initializes would leave the child's copy waiting for
/// a thread it does not have, and its helper thread blocked at its first report.
static NVML_STATE: AtomicU8 = AtomicU8::new(NVML_UNTRIED);
const NVML_UNTRIED: u8 = 0;
const NVML_STARTING: u8 = 1;
const NVML_READY: u8 = 2;
const NVML_UNUSABLE: u8 = 3;

/// Loads NVML if the program has not, and initializes it, once; never waits for
/// another thread doing so (its report goes without NVML's figures).
fn nvml_ready() -> Result<(), &'static str> {
    match NVML_STATE.compare_exchange(NVML_UNTRIED, NVML_STARTING, AcqRel, Acquire) {
        Ok(_) => {
            // SAFETY: dlopen with a constant name; the handle is kept (never closed).
            unsafe { libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_LAZY) };
            // SAFETY: nvmlInit_v2 takes no argument; NVML counts its initializations.
            let ok = OWN
                .nvml_init
                .get()
                .is_some_and(|f| unsafe { f() } == NVML_SUCCESS);
            let to = if ok { NVML_READY } else { NVML_UNUSABLE };
            // A child forked meanwhile has its own copy, marked unusable at the fork.
            NVML_STATE.store(to, Release);
            if ok {
                Ok(())
            } else {
                Err("NVML could not be loaded or initialized")
            }
        }
        Err(NVML_READY) => Ok(()),
        Err(NVML_STARTING) => Err("NVML is being initialized by another thread"),
        Err(_) => Err("NVML could not be loaded or initialized"),
    }
}

/// In a forked child: an initialization the parent had under way when it forked
/// is left unfinished in NVML's own state too, so NVML is not used here.
pub(crate) fn after_fork_in_child() {
    let _ = NVML_STATE.compare_exchange(NVML_STARTING, NVML_UNUSABLE, AcqRel, Acquire);
}

/// NVML's list of the processes using a device (pid, bytes), found by the device's
/// UUID; `Err` says why there is none. NVML is made ready at the first call (at an
/// `oom` or cap report).
pub(crate) fn nvml_processes(uuid: &str) -> Result<Vec<(u32, u64)>, &'static str> {
    nvml_ready()?;
    let (Some(by_uuid), Some(list)) = (OWN.nvml_by_uuid.get(), OWN.nvml_processes.get()) else {
        return Err("this NVML has no per-process list");
    };
    let name = std::ffi::CString::new(uuid).map_err(|_| "the device's UUID is not text")?;
    let mut dev: NvmlDevice = std::ptr::null_mut();
    // SAFETY: a NUL-terminated UUID; NVML writes one handle.
    if unsafe { by_uuid(name.as_ptr(), &mut dev) } != NVML_SUCCESS {
        return Err("NVML does not know the device");
    }
    let mut room: c_uint = 16;
    for _ in 0..4 {
        let mut buf = vec![NvmlProcessInfo::default(); room as usize];
        let mut n = room;
        // SAFETY: `buf` holds `n` entries; NVML writes at most that many and the count.
        let rc = unsafe { list(dev, &mut n, buf.as_mut_ptr()) };
        if rc == NVML_SUCCESS {
            buf.truncate((n as usize).min(buf.len()));
            return Ok(buf.iter().map(|p| (p.pid, p.used_gpu_memory)).collect());
        }
        if rc != NVML_ERROR_INSUFFICIENT_SIZE {
            return Err("NVML's per-process list failed");
        }
        room = n.max(room.saturating_mul(2));
    }
    Err("NVML's per-process list kept growing")
}

/// gpuguard's own NVML call: the UUID of an NVML device, to match it with its CUDA
/// ordinal.
pub(crate) fn nvml_uuid(handle: u64) -> Option<String> {
    let f = OWN.nvml_device_get_uuid.get()?;
    let mut buf = [0 as c_char; 96];
    // SAFETY: nvmlDeviceGetUUID writes at most 96 bytes, NUL-terminated.
    let rc = unsafe { f(handle as NvmlDevice, buf.as_mut_ptr(), 96) };
    if rc != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML wrote a NUL-terminated string.
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}
