//! Finding the real functions: the real `dlsym`, the per-path slots that hold the
//! real pointer each lookup path returned, and gpuguard's private driver calls.
//!
//! The lowest layer of the shim: it knows nothing of the hooks above it (the `dlsym`
//! override that uses it is in `hooks`).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};

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
    (p != 0).then(|| unsafe { std::mem::transmute::<usize, DlsymFn>(p) })
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

/// gpuguard's own calls into the driver, through pointers it resolved itself, so they
/// never re-enter a hook.
pub(crate) struct Driver {
    ctx_get_current: AtomicUsize,
    ctx_get_device: AtomicUsize,
    device_total_mem: AtomicUsize,
    device_get_count: AtomicUsize,
    primary_ctx_get_state: AtomicUsize,
    mem_free: AtomicUsize,
    device_get_mem_pool: AtomicUsize,
    pool_get_attribute: AtomicUsize,
    pool_trim_to: AtomicUsize,
    device_get_uuid: AtomicUsize,
    device_get_uuid_v1: AtomicUsize,
}

pub(crate) static DRIVER: Driver = Driver {
    ctx_get_current: AtomicUsize::new(0),
    ctx_get_device: AtomicUsize::new(0),
    device_total_mem: AtomicUsize::new(0),
    device_get_count: AtomicUsize::new(0),
    primary_ctx_get_state: AtomicUsize::new(0),
    mem_free: AtomicUsize::new(0),
    device_get_mem_pool: AtomicUsize::new(0),
    pool_get_attribute: AtomicUsize::new(0),
    pool_trim_to: AtomicUsize::new(0),
    device_get_uuid: AtomicUsize::new(0),
    device_get_uuid_v1: AtomicUsize::new(0),
};

/// Marks a slot whose lookup failed, so it is not retried on every call.
const MISSING: usize = 1;

fn driver_fn(slot: &AtomicUsize, name: &CStr) -> Option<usize> {
    let p = slot.load(Acquire);
    if p > MISSING {
        return Some(p);
    }
    if p == MISSING {
        return None;
    }
    let found = resolve_next(name, c"libcuda.so.1").map(|p| p as usize);
    slot.store(found.unwrap_or(MISSING), Release);
    found
}

impl Driver {
    /// The calling thread's current context, 0 when none or unknown.
    pub fn current_ctx(&self) -> u64 {
        type F = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
        let Some(p) = driver_fn(&self.ctx_get_current, c"cuCtxGetCurrent") else {
            return 0;
        };
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: p is the driver's cuCtxGetCurrent.
        let rc = unsafe { std::mem::transmute::<usize, F>(p)(&mut ctx) };
        if rc == 0 { ctx as u64 } else { 0 }
    }

    /// The device of the current context.
    pub fn current_device(&self) -> Option<i32> {
        type F = unsafe extern "C" fn(*mut c_int) -> c_int;
        let p = driver_fn(&self.ctx_get_device, c"cuCtxGetDevice")?;
        let mut dev: c_int = -1;
        // SAFETY: p is the driver's cuCtxGetDevice.
        let rc = unsafe { std::mem::transmute::<usize, F>(p)(&mut dev) };
        (rc == 0 && dev >= 0).then_some(dev)
    }

    /// Frees device memory gpuguard must take back (an allocation past the cap).
    pub fn free(&self, addr: u64) {
        type F = unsafe extern "C" fn(u64) -> c_int;
        if let Some(p) = driver_fn(&self.mem_free, c"cuMemFree_v2") {
            // SAFETY: p is the driver's cuMemFree_v2; addr came from the driver.
            unsafe { std::mem::transmute::<usize, F>(p)(addr) };
        }
    }

    /// The device's current stream-ordered memory pool.
    pub fn device_mem_pool(&self, device: i32) -> Option<u64> {
        type F = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
        let p = driver_fn(&self.device_get_mem_pool, c"cuDeviceGetMemPool")?;
        let mut pool: *mut c_void = std::ptr::null_mut();
        // SAFETY: p is the driver's cuDeviceGetMemPool.
        let rc = unsafe { std::mem::transmute::<usize, F>(p)(&mut pool, device) };
        (rc == 0 && !pool.is_null()).then_some(pool as u64)
    }

    /// What a pool holds from the driver (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub fn pool_reserved(&self, pool: u64) -> Option<u64> {
        type F = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> c_int;
        const RESERVED_MEM_CURRENT: c_int = 5;
        let p = driver_fn(&self.pool_get_attribute, c"cuMemPoolGetAttribute")?;
        let mut v: u64 = 0;
        // SAFETY: p is the driver's cuMemPoolGetAttribute; the attribute is a u64.
        let rc = unsafe {
            std::mem::transmute::<usize, F>(p)(
                pool as *mut c_void,
                RESERVED_MEM_CURRENT,
                &mut v as *mut u64 as *mut c_void,
            )
        };
        (rc == 0).then_some(v)
    }

    /// Releases what a pool holds unused (`cuMemPoolTrimTo(pool, 0)`).
    pub fn pool_trim(&self, pool: u64) {
        type F = unsafe extern "C" fn(*mut c_void, usize) -> c_int;
        if let Some(p) = driver_fn(&self.pool_trim_to, c"cuMemPoolTrimTo") {
            // SAFETY: p is the driver's cuMemPoolTrimTo.
            unsafe { std::mem::transmute::<usize, F>(p)(pool as *mut c_void, 0) };
        }
    }

    /// A device's UUID, formatted as NVML formats it (`GPU-xxxxxxxx-xxxx-...`).
    pub fn device_uuid(&self, device: i32) -> Option<String> {
        type F = unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int;
        let p = driver_fn(&self.device_get_uuid, c"cuDeviceGetUuid_v2")
            .or_else(|| driver_fn(&self.device_get_uuid_v1, c"cuDeviceGetUuid"))?;
        let mut u = [0u8; 16];
        // SAFETY: p is the driver's cuDeviceGetUuid(_v2), which writes 16 bytes.
        let rc = unsafe { std::mem::transmute::<usize, F>(p)(&mut u, device) };
        (rc == 0).then(|| gpuguard_core::cap::uuid_string(&u))
    }

    /// How many devices the process sees; `None` before cuInit or without a driver.
    pub fn device_count(&self) -> Option<i32> {
        type F = unsafe extern "C" fn(*mut c_int) -> c_int;
        let p = driver_fn(&self.device_get_count, c"cuDeviceGetCount")?;
        let mut n: c_int = 0;
        // SAFETY: p is the driver's cuDeviceGetCount.
        let rc = unsafe { std::mem::transmute::<usize, F>(p)(&mut n) };
        (rc == 0).then_some(n)
    }

    /// Whether the primary context of `device` still exists.
    pub fn primary_ctx_active(&self, device: i32) -> Option<bool> {
        type F = unsafe extern "C" fn(c_int, *mut u32, *mut c_int) -> c_int;
        let p = driver_fn(&self.primary_ctx_get_state, c"cuDevicePrimaryCtxGetState")?;
        let (mut flags, mut active): (u32, c_int) = (0, 0);
        // SAFETY: p is the driver's cuDevicePrimaryCtxGetState.
        let rc = unsafe { std::mem::transmute::<usize, F>(p)(device, &mut flags, &mut active) };
        (rc == 0).then_some(active != 0)
    }

    /// Device memory size as the driver states it.
    pub fn total_mem(&self, device: i32) -> Option<u64> {
        type F = unsafe extern "C" fn(*mut usize, c_int) -> c_int;
        let p = driver_fn(&self.device_total_mem, c"cuDeviceTotalMem_v2")?;
        let mut bytes: usize = 0;
        // SAFETY: p is the driver's cuDeviceTotalMem_v2.
        let rc = unsafe { std::mem::transmute::<usize, F>(p)(&mut bytes, device) };
        (rc == 0).then_some(bytes as u64)
    }
}

/// The address range of gpuguard's own code, so stack capture can skip its frames.
pub(crate) static OWN_LO: AtomicUsize = AtomicUsize::new(0);
pub(crate) static OWN_HI: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn find_own_range() {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: glibc passes a valid dl_phdr_info; data is our base address.
        unsafe {
            let base = *(data as *const usize);
            let info = &*info;
            if info.dlpi_addr as usize != base {
                return 0;
            }
            let mut hi = 0usize;
            for i in 0..info.dlpi_phnum as usize {
                let ph = &*info.dlpi_phdr.add(i);
                if ph.p_type == libc::PT_LOAD {
                    hi = hi.max(base + (ph.p_vaddr + ph.p_memsz) as usize);
                }
            }
            OWN_LO.store(base, Relaxed);
            OWN_HI.store(hi, Relaxed);
            1
        }
    }
    // SAFETY: dladdr on one of our own functions; dl_iterate_phdr with a callback that
    // only reads what glibc passes.
    unsafe {
        let mut dl: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(find_own_range as *const c_void, &mut dl) == 0 {
            return;
        }
        let mut base = dl.dli_fbase as usize;
        libc::dl_iterate_phdr(Some(each), &mut base as *mut usize as *mut c_void);
    }
}

#[inline]
pub(crate) fn is_own_code(pc: usize) -> bool {
    pc >= OWN_LO.load(Relaxed) && pc < OWN_HI.load(Relaxed)
}

/// gpuguard's own NVML call: the UUID of an NVML device, to match it with its CUDA
/// ordinal.
pub(crate) fn nvml_uuid(handle: u64) -> Option<String> {
    type F = unsafe extern "C" fn(*mut c_void, *mut c_char, u32) -> c_int;
    static SLOT: AtomicUsize = AtomicUsize::new(0);
    let p = {
        let p = SLOT.load(Acquire);
        if p > MISSING {
            p
        } else if p == MISSING {
            return None;
        } else {
            let found =
                resolve_next(c"nvmlDeviceGetUUID", c"libnvidia-ml.so.1").map(|p| p as usize);
            SLOT.store(found.unwrap_or(MISSING), Release);
            found?
        }
    };
    let mut buf = [0 as c_char; 96];
    // SAFETY: p is NVML's nvmlDeviceGetUUID, writing at most 96 bytes.
    let rc =
        unsafe { std::mem::transmute::<usize, F>(p)(handle as *mut c_void, buf.as_mut_ptr(), 96) };
    if rc != 0 {
        return None;
    }
    // SAFETY: NVML wrote a NUL-terminated string.
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}
