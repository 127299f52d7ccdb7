//! The FFI surface towards CUDA callers, the shim's top layer: the list of hooked
//! functions (`table`) expanded row by row into the exported symbol, the wrapper the
//! `dlsym` override hands out, the wrapper `cuGetProcAddress` hands out (by base name
//! and version) and the real-pointer slots; the `dlsym` override itself; and the
//! handlers. Every wrapper is thin: find the real pointer, call the row's handler
//! with it.

use super::books::Books;
use super::lifecycle::books;
use super::real::{PER_PATH, Path, SLOTS_PER_ROW, Slots, path_base};
use super::settings::config_ptds_default;
use super::state::{active_books, shielded};
use super::track::{self, Made, Plan, SUCCESS};
use gpuguard_core::ledger::{Key, Kind};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

pub type CUdeviceptr = cudarc::driver::sys::CUdeviceptr;
type Stream = *mut c_void;
type Ctx = *mut c_void;
type MemHandle = u64;

/// Which library a hooked function belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lib {
    Driver,
    Runtime,
    Nvml,
}

impl Lib {
    fn soname(self) -> &'static CStr {
        match self {
            Lib::Driver => c"libcuda.so.1",
            Lib::Runtime => c"libcudart.so",
            Lib::Nvml => c"libnvidia-ml.so.1",
        }
    }

    /// What a wrapper answers when the real function cannot be found at all: the
    /// library's own "not initialized" code, a valid value of its error enum.
    fn missing(self) -> c_int {
        match self {
            Lib::Driver => cudarc::driver::sys::cudaError_enum::CUDA_ERROR_NOT_INITIALIZED as c_int,
            Lib::Runtime => cudarc::runtime::sys::cudaError::cudaErrorInitializationError as c_int,
            Lib::Nvml => NVML_ERROR_UNINITIALIZED,
        }
    }
}

/// One row of the table, as the lookup paths see it.
pub struct Entry {
    pub name: &'static str,
    pub lib: Lib,
    /// `cuGetProcAddress` base name and the CUDA version that introduced this variant.
    pub base: &'static str,
    pub since: c_int,
    /// The per-thread-default-stream (`_ptsz`) variant of its base name.
    pub ptds: bool,
    pub slots: &'static Slots,
    /// Wrappers by slot (`real::path_base`): the exported symbol, then `PER_PATH` for
    /// `dlsym` and as many for `cuGetProcAddress`, each calling its slot's pointer.
    pub wrappers: [Wrapper; SLOTS_PER_ROW],
}

impl Entry {
    /// The wrapper of slot `i` of `path`.
    fn wrapper(&self, path: Path, i: usize) -> *const c_void {
        self.wrappers[path_base(path) + i].0
    }
}

/// Real pointers handed out unhooked because every slot of their path was taken.
static UNHOOKED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Counts a real pointer handed out unhooked (said once, at debug level).
fn unhooked(name: &str) {
    if UNHOOKED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
        super::settings::log(
            super::settings::LogLevel::Debug,
            format_args!(
                "{name}: a lookup returned a real pointer past the {PER_PATH} this path keeps; handed out unhooked"
            ),
        );
    }
}

#[derive(Clone, Copy)]
pub struct Wrapper(pub *const c_void);
// SAFETY: a code address, never written through.
unsafe impl Sync for Wrapper {}

macro_rules! hooks {
    ($(
        $lib:ident fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? )
            [$base:literal, $since:literal, $ptds:literal] => $handler:path;
    )*) => {
        /// Every hooked function, in table order; `Api::X as u8` is its row.
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u8)]
        pub enum Api { $($name),* }

        #[allow(non_snake_case, clippy::missing_safety_doc)]
        pub mod row {
            $(
            pub mod $name {
                #[allow(unused_imports)]
                use super::super::*;
                pub type Real = unsafe extern "C" fn($($ty),*) -> c_int;
                pub static SLOTS: Slots = Slots::new();
                const NAME: &CStr = match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(c) => c,
                    Err(_) => panic!("bad name"),
                };

                #[inline(always)]
                pub unsafe fn call(slot: usize, $($arg: $ty),*) -> c_int {
                    match SLOTS.get_at(slot, NAME, Lib::$lib.soname()) {
                        // SAFETY: the slot holds the real function of this row's signature.
                        Some(p) => unsafe {
                            let real = std::mem::transmute::<*mut c_void, Real>(p);
                            $handler(Api::$name as u8, real, $($arg),*)
                        },
                        None => Lib::$lib.missing(),
                    }
                }

                pub unsafe extern "C" fn via_dlsym<const I: usize>($($arg: $ty),*) -> c_int {
                    unsafe { call(path_base(Path::Dlsym) + I, $($arg),*) }
                }

                pub unsafe extern "C" fn via_proc<const I: usize>($($arg: $ty),*) -> c_int {
                    unsafe { call(path_base(Path::Proc) + I, $($arg),*) }
                }
            }
            )*
        }

        $(
            #[allow(non_snake_case, clippy::missing_safety_doc)]
            #[cfg_attr(not(test), unsafe(no_mangle))]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
                unsafe { row::$name::call(0, $($arg),*) }
            }
        )*

        pub static TABLE: &[Entry] = &[$(
            Entry {
                name: stringify!($name),
                lib: Lib::$lib,
                base: $base,
                since: $since,
                ptds: $ptds,
                slots: &row::$name::SLOTS,
                wrappers: [
                    Wrapper($name as *const c_void),
                    Wrapper(row::$name::via_dlsym::<0> as *const c_void),
                    Wrapper(row::$name::via_dlsym::<1> as *const c_void),
                    Wrapper(row::$name::via_dlsym::<2> as *const c_void),
                    Wrapper(row::$name::via_dlsym::<3> as *const c_void),
                    Wrapper(row::$name::via_proc::<0> as *const c_void),
                    Wrapper(row::$name::via_proc::<1> as *const c_void),
                    Wrapper(row::$name::via_proc::<2> as *const c_void),
                    Wrapper(row::$name::via_proc::<3> as *const c_void),
                ],
            }
        ),*];
    };
}

super::table::hooked_functions!(hooks);

/// True when `p` is one of gpuguard's own wrappers (a lookup found our export).
pub fn is_wrapper(p: *mut c_void) -> bool {
    TABLE
        .iter()
        .any(|e| e.wrappers.iter().any(|w| std::ptr::eq(w.0, p)))
}

fn by_name(name: &[u8]) -> Option<&'static Entry> {
    TABLE.iter().find(|e| e.name.as_bytes() == name)
}

// ---- the dlsym and cuGetProcAddress answers --------------------------------------------

/// The `dlsym` every library in the process calls. It asks `dlsym_answer` whether the
/// name is one of ours; if not, it jumps (not calls) to glibc's `dlsym` with the
/// original arguments and return address, so `dlsym(RTLD_NEXT, ...)` keeps resolving
/// relative to the real caller instead of to gpuguard.
///
/// # Safety
/// As for glibc's `dlsym`: `name` is NULL or a C string.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {answer}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "cmp rax, 1",
        "ja 2f",
        "je 3f",
        "jmp qword ptr [rip + {real}]",
        "3:",
        "xor eax, eax",
        "2:",
        "ret",
        answer = sym dlsym_answer,
        real = sym super::real::GPUGUARD_REAL_DLSYM,
    )
}

/// 0: not ours, forward to glibc (every name not starting `cu` or `nv` at once). 1: answer NULL. Otherwise the pointer to return.
unsafe extern "C" fn dlsym_answer(handle: *mut c_void, name: *const c_char) -> usize {
    if super::real::real_dlsym().is_none() {
        return 1; // no glibc `dlsym` to jump to: answer NULL rather than jump to 0
    }
    if name.is_null() {
        return 0;
    }
    // SAFETY: name is a C string from the caller; only two bytes read before the
    // cheap prefix test, which lets every non-CUDA lookup through at once.
    unsafe {
        let (a, b) = (*name as u8, *name.add(1) as u8);
        if !((a == b'c' && b == b'u') || (a == b'n' && b == b'v')) {
            return 0;
        }
        let name = CStr::from_ptr(name);
        shielded(|| dlsym_swap(handle, name)).unwrap_or(0)
    }
}

/// The `dlsym` override's answer for a `cu*` name (see `dlsym` above): 0 to forward,
/// 1 for NULL, else the pointer to hand out.
unsafe fn dlsym_swap(handle: *mut c_void, name: &CStr) -> usize {
    let Some(entry) = by_name(name.to_bytes()) else {
        return 0;
    };
    if handle == libc::RTLD_NEXT {
        // Resolved relative to the caller, so glibc must answer; but from a program
        // that precedes gpuguard the next definition is gpuguard's own, which must not
        // make CUDA look present when the real library is not loaded.
        let present = entry
            .slots
            .get(Path::Symbol, name, entry.lib.soname())
            .is_some();
        return if present { 0 } else { 1 };
    }
    // SAFETY: a plain lookup through glibc.
    let real = unsafe { super::real::lookup(handle, name) };
    if real.is_null() {
        return 0; // let glibc answer, so dlerror() is set as usual
    }
    if is_wrapper(real) {
        // The search found our own export (RTLD_DEFAULT, or the main program's handle).
        // Hand it out only if the real library is loaded: a process probing for CUDA
        // must not find it just because gpuguard is preloaded.
        let present = entry
            .slots
            .get(Path::Symbol, name, entry.lib.soname())
            .is_some();
        return if present { real as usize } else { 1 };
    }
    match entry.slots.offer(Path::Dlsym, real) {
        Some(i) => entry.wrapper(Path::Dlsym, i) as usize,
        None => {
            unhooked(entry.name);
            real as usize
        }
    }
}

/// Per-thread default stream requested through `cuGetProcAddress`'s flags.
const PROC_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;
const PROC_LEGACY_STREAM: u64 = 1 << 0;

/// The row a `cuGetProcAddress` answer belongs to. First by identity (the pointer is
/// the driver's export of that exact variant); failing that, by the driver's rule:
/// the newest variant of the base name whose version is at most the one requested,
/// `_ptsz` when the per-thread default stream was asked for.
fn proc_entry(
    base: &[u8],
    version: c_int,
    flags: u64,
    real: *mut c_void,
) -> Option<&'static Entry> {
    let candidates = || {
        TABLE
            .iter()
            .filter(move |e| e.lib == Lib::Driver && e.base.as_bytes() == base)
    };
    candidates().next()?;
    // Identity: compare with the exports of the library the pointer lives in.
    // SAFETY: dladdr/dlopen(NOLOAD)/dlsym on a pointer the driver just returned.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(real, &mut info) != 0 && !info.dli_fname.is_null() {
            let h = libc::dlopen(info.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD);
            if !h.is_null() {
                let hit = candidates().find(|e| {
                    let cname = std::ffi::CString::new(e.name).unwrap_or_default();
                    super::real::lookup(h, &cname) == real
                });
                libc::dlclose(h);
                if hit.is_some() {
                    return hit;
                }
            }
        }
    }
    let want_ptds = flags & PROC_PER_THREAD_DEFAULT_STREAM != 0
        || (flags & PROC_LEGACY_STREAM == 0 && config_ptds_default());
    let pick = |ptds: bool| {
        candidates()
            .filter(|e| e.ptds == ptds && e.since <= version)
            .max_by_key(|e| e.since)
    };
    if want_ptds {
        pick(true).or_else(|| pick(false))
    } else {
        pick(false)
    }
}

/// After the real `cuGetProcAddress` answered: swap in our wrapper for hooked rows.
unsafe fn swap_proc(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: pfn was just written by the driver; symbol is the caller's C string.
    unsafe {
        let real = *pfn;
        if real.is_null() || is_wrapper(real) {
            return;
        }
        let base = CStr::from_ptr(symbol).to_bytes();
        if let Some(e) = proc_entry(base, version, flags, real) {
            match e.slots.offer(Path::Proc, real) {
                Some(i) => *pfn = e.wrapper(Path::Proc, i) as *mut c_void,
                None => unhooked(e.name),
            }
        }
    }
}

// ---- CUDA structures read by the handlers ---------------------------------------------
// Mirrors with plain integer fields: reading a C enum into a Rust enum would be
// undefined for values the bindings do not list.

#[repr(C)]
pub struct MemAllocationProp {
    pub kind: c_uint,
    pub requested_handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

const NVML_ERROR_UNINITIALIZED: c_int = 1;

#[repr(C)]
pub struct MemPoolProps {
    pub alloc_type: c_uint,
    pub handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
}

#[repr(C)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub channels: c_uint,
}

#[repr(C)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

#[repr(C)]
pub struct PitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Extent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;

/// Bytes per element of a `CUarray_format`; an estimate for the packed and block
/// formats, whose true footprint the driver does not state.
fn format_bytes(format: c_uint) -> u64 {
    match format {
        0x01 | 0x08 => 1,        // (UN)SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // (UN)SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // (UN)SIGNED_INT32, FLOAT
        _ => 4,
    }
}

fn array_bytes(w: usize, h: usize, d: usize, format: c_uint, channels: c_uint) -> u64 {
    (w.max(1) as u64)
        * (h.max(1) as u64)
        * (d.max(1) as u64)
        * format_bytes(format)
        * u64::from(channels.max(1))
}

fn mipmapped_bytes(d: &Array3dDescriptor, levels: c_uint) -> u64 {
    (0..levels.max(1))
        .map(|l| {
            array_bytes(
                d.width >> l,
                d.height >> l,
                d.depth >> l,
                d.format,
                d.channels,
            )
        })
        .sum()
}

/// The driver aligns a pitch to at most 512 bytes on current GPUs; reserving that
/// much keeps the reservation an upper bound (the excess is given back after).
fn pitch_estimate(width: usize, height: usize) -> u64 {
    (width.div_ceil(512) * 512) as u64 * height as u64
}

/// The device a `cuMemCreate` names in its properties.
unsafe fn vmm_device(prop: *const MemAllocationProp) -> Option<i32> {
    // SAFETY: NULL or the caller's structure; the driver rejects bad ones after.
    unsafe { prop.as_ref() }
        .filter(|p| p.location_type == CU_MEM_LOCATION_TYPE_DEVICE)
        .map(|p| p.location_id)
}

// ---- handlers: one per signature ------------------------------------------------------

/// The allocation an out-parameter names, as a record in `key`'s number space.
unsafe fn made_at(out_ptr: *const u64, key: fn(u64) -> Key, bytes: u64) -> Option<Made> {
    // SAFETY: called only after the real call succeeded, which wrote the value.
    let v = unsafe { out(out_ptr) }?;
    Some(Made { key: key(v), bytes })
}

/// The same for an out-parameter of pointer type (`void **`).
unsafe fn made_ptr(out_ptr: *const *mut c_void, key: fn(u64) -> Key, bytes: u64) -> Option<Made> {
    // SAFETY: as above.
    let v = unsafe { out(out_ptr) }?;
    Some(Made {
        key: key(v as u64),
        bytes,
    })
}

/// Reads an out-pointer the driver wrote after success.
unsafe fn out<T: Copy>(p: *const T) -> Option<T> {
    // SAFETY: called only after the real call succeeded, which wrote *p.
    (!p.is_null()).then(|| unsafe { p.read() })
}

unsafe fn mem_alloc(
    api: u8,
    real: row::cuMemAlloc_v2::Real,
    dptr: *mut CUdeviceptr,
    bytes: usize,
) -> c_int {
    track::driver_alloc(
        api,
        Kind::Device,
        Plan::bytes(bytes as u64),
        || unsafe { real(dptr, bytes) },
        || unsafe { made_at(dptr, Key::device, bytes as u64) },
    )
}

unsafe fn mem_alloc_v1(
    api: u8,
    real: row::cuMemAlloc::Real,
    dptr: *mut u32,
    bytes: c_uint,
) -> c_int {
    track::driver_alloc(
        api,
        Kind::Device,
        Plan::bytes(bytes.into()),
        || unsafe { real(dptr, bytes) },
        || {
            let a = unsafe { out(dptr) }?;
            Some(Made {
                key: Key::device(a.into()),
                bytes: bytes.into(),
            })
        },
    )
}

unsafe fn mem_free_v1(_api: u8, real: row::cuMemFree::Real, dptr: u32) -> c_int {
    track::driver_free(Key::device(dptr.into()), || unsafe { real(dptr) })
}

unsafe fn mem_alloc_pitch(
    api: u8,
    real: row::cuMemAllocPitch_v2::Real,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> c_int {
    track::driver_alloc(
        api,
        Kind::Pitch,
        Plan::bytes(pitch_estimate(width, height)),
        || unsafe { real(dptr, pitch, width, height, elem) },
        || {
            let a = unsafe { out(dptr) }?;
            let p = unsafe { out(pitch) }.unwrap_or(width);
            Some(Made {
                key: Key::device(a),
                bytes: (p as u64) * (height as u64),
            })
        },
    )
}

unsafe fn mem_alloc_managed(
    api: u8,
    real: row::cuMemAllocManaged::Real,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    flags: c_uint,
) -> c_int {
    track::driver_alloc(
        api,
        Kind::Managed,
        Plan::bytes(bytes as u64),
        || unsafe { real(dptr, bytes, flags) },
        || unsafe { made_at(dptr, Key::device, bytes as u64) },
    )
}

unsafe fn mem_free(_api: u8, real: row::cuMemFree_v2::Real, dptr: CUdeviceptr) -> c_int {
    track::driver_free(Key::device(dptr), || unsafe { real(dptr) })
}

unsafe fn mem_alloc_async(
    api: u8,
    real: row::cuMemAllocAsync::Real,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: Stream,
) -> c_int {
    track::driver_alloc(
        api,
        Kind::Pool,
        Plan::bytes(bytes as u64),
        || unsafe { real(dptr, bytes, stream) },
        || unsafe { made_at(dptr, Key::device, bytes as u64) },
    )
}

unsafe fn mem_alloc_from_pool(
    api: u8,
    real: row::cuMemAllocFromPoolAsync::Real,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: *mut c_void,
    stream: Stream,
) -> c_int {
    track::driver_alloc(
        api,
        Kind::Pool,
        Plan {
            bytes: bytes as u64,
            device: track::pool_device(pool),
            pool: Some(pool as u64),
        },
        || unsafe { real(dptr, bytes, pool, stream) },
        || unsafe { made_at(dptr, Key::device, bytes as u64) },
    )
}

unsafe fn pool_create(
    _api: u8,
    real: row::cuMemPoolCreate::Real,
    pool: *mut *mut c_void,
    props: *const MemPoolProps,
) -> c_int {
    track::observe(
        || unsafe { real(pool, props) },
        |books| {
            // SAFETY: written/accepted by the driver on success.
            let (p, props) = unsafe { (out(pool)?, props.as_ref()?) };
            if props.location_type == CU_MEM_LOCATION_TYPE_DEVICE {
                books.add_pool(p as u64, props.location_id);
            }
            Some(())
        },
    )
}

unsafe fn pool_destroy(_api: u8, real: row::cuMemPoolDestroy::Real, pool: *mut c_void) -> c_int {
    track::observe(
        || unsafe { real(pool) },
        |books| {
            books.remove_pool(pool as u64);
            Some(())
        },
    )
}

unsafe fn pool_trim_to(
    _api: u8,
    real: row::cuMemPoolTrimTo::Real,
    pool: *mut c_void,
    keep: usize,
) -> c_int {
    track::observe(
        || unsafe { real(pool, keep) },
        |books| {
            books.pool_trimmed(pool as u64);
            Some(())
        },
    )
}

unsafe fn device_set_pool(
    _api: u8,
    real: row::cuDeviceSetMemPool::Real,
    dev: c_int,
    pool: *mut c_void,
) -> c_int {
    track::observe(
        || unsafe { real(dev, pool) },
        |books| {
            books.add_pool(pool as u64, dev);
            books
                .current_pool
                .get(usize::try_from(dev).ok()?)?
                .store(pool as u64, std::sync::atomic::Ordering::Relaxed);
            Some(())
        },
    )
}

unsafe fn device_pool(
    _api: u8,
    real: row::cuDeviceGetDefaultMemPool::Real,
    pool: *mut *mut c_void,
    dev: c_int,
) -> c_int {
    track::observe(
        || unsafe { real(pool, dev) },
        |books| {
            books.add_pool(unsafe { out(pool) }? as u64, dev);
            Some(())
        },
    )
}

unsafe fn mem_free_async(
    _api: u8,
    real: row::cuMemFreeAsync::Real,
    dptr: CUdeviceptr,
    stream: Stream,
) -> c_int {
    track::driver_free(Key::device(dptr), || unsafe { real(dptr, stream) })
}

unsafe fn mem_create(
    api: u8,
    real: row::cuMemCreate::Real,
    handle: *mut MemHandle,
    bytes: usize,
    prop: *const MemAllocationProp,
    flags: u64,
) -> c_int {
    track::driver_alloc(
        api,
        Kind::Vmm,
        Plan {
            bytes: bytes as u64,
            device: unsafe { vmm_device(prop) },
            pool: None,
        },
        || unsafe { real(handle, bytes, prop, flags) },
        || unsafe { made_at(handle, Key::vmm, bytes as u64) },
    )
}

unsafe fn mem_release(_api: u8, real: row::cuMemRelease::Real, handle: MemHandle) -> c_int {
    // One decision, under the VMM maps' own lock: still mapped (the memory lives until
    // the last unmap, which frees the record), or freed now.
    let deferred =
        shielded(|| active_books().is_some_and(|b| b.vmm.released(handle))).unwrap_or(false);
    if deferred {
        let rc = unsafe { real(handle) };
        if rc != SUCCESS {
            shielded(|| active_books().map(|b| b.vmm.release_failed(handle)));
        }
        return rc;
    }
    track::driver_free(Key::vmm(handle), || unsafe { real(handle) })
}

unsafe fn mem_map(
    _api: u8,
    real: row::cuMemMap::Real,
    va: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: MemHandle,
    flags: u64,
) -> c_int {
    track::observe(
        || unsafe { real(va, size, offset, handle, flags) },
        |books| {
            books.vmm.mapped(va, size as u64, handle);
            Some(())
        },
    )
}

unsafe fn mem_unmap(_api: u8, real: row::cuMemUnmap::Real, va: CUdeviceptr, size: usize) -> c_int {
    track::observe(
        || unsafe { real(va, size) },
        |books| {
            for handle in books.vmm.unmapped(va, size as u64) {
                if let Some(rec) = books.ledger.take(Key::vmm(handle)) {
                    books.ledger.confirm_free(&rec);
                }
            }
            Some(())
        },
    )
}

unsafe fn mem_host_alloc(
    api: u8,
    real: row::cuMemHostAlloc::Real,
    pp: *mut *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> c_int {
    track::driver_alloc(
        api,
        Kind::Host,
        Plan::bytes(bytes as u64),
        || unsafe { real(pp, bytes, flags) },
        || unsafe { made_ptr(pp, Key::host, bytes as u64) },
    )
}

unsafe fn mem_alloc_host(
    api: u8,
    real: row::cuMemAllocHost_v2::Real,
    pp: *mut *mut c_void,
    bytes: usize,
) -> c_int {
    track::driver_alloc(
        api,
        Kind::Host,
        Plan::bytes(bytes as u64),
        || unsafe { real(pp, bytes) },
        || unsafe { made_ptr(pp, Key::host, bytes as u64) },
    )
}

unsafe fn mem_free_host(_api: u8, real: row::cuMemFreeHost::Real, p: *mut c_void) -> c_int {
    track::driver_free(Key::host(p as u64), || unsafe { real(p) })
}

unsafe fn array_create(
    api: u8,
    real: row::cuArrayCreate_v2::Real,
    arr: *mut *mut c_void,
    desc: *const ArrayDescriptor,
) -> c_int {
    track::driver_alloc(
        api,
        Kind::Array,
        Plan::bytes(unsafe { desc.as_ref() }.map_or(0, |d| {
            array_bytes(d.width, d.height, 1, d.format, d.channels)
        })),
        || unsafe { real(arr, desc) },
        || {
            let a = unsafe { out(arr) }?;
            // SAFETY: accepted by the driver, so valid.
            let d = unsafe { desc.as_ref() }?;
            Some(Made {
                key: Key::array(a as u64),
                bytes: array_bytes(d.width, d.height, 1, d.format, d.channels),
            })
        },
    )
}

unsafe fn array3d_create(
    api: u8,
    real: row::cuArray3DCreate_v2::Real,
    arr: *mut *mut c_void,
    desc: *const Array3dDescriptor,
) -> c_int {
    track::driver_alloc(
        api,
        Kind::Array,
        Plan::bytes(unsafe { desc.as_ref() }.map_or(0, |d| {
            array_bytes(d.width, d.height, d.depth, d.format, d.channels)
        })),
        || unsafe { real(arr, desc) },
        || {
            let a = unsafe { out(arr) }?;
            let d = unsafe { desc.as_ref() }?;
            Some(Made {
                key: Key::array(a as u64),
                bytes: array_bytes(d.width, d.height, d.depth, d.format, d.channels),
            })
        },
    )
}

unsafe fn mipmapped_create(
    api: u8,
    real: row::cuMipmappedArrayCreate::Real,
    arr: *mut *mut c_void,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> c_int {
    track::driver_alloc(
        api,
        Kind::Array,
        Plan::bytes(unsafe { desc.as_ref() }.map_or(0, |d| mipmapped_bytes(d, levels))),
        || unsafe { real(arr, desc, levels) },
        || {
            let a = unsafe { out(arr) }?;
            let d = unsafe { desc.as_ref() }?;
            Some(Made {
                key: Key::array(a as u64),
                bytes: mipmapped_bytes(d, levels),
            })
        },
    )
}

unsafe fn array_destroy(_api: u8, real: row::cuArrayDestroy::Real, arr: *mut c_void) -> c_int {
    track::driver_free(Key::array(arr as u64), || unsafe { real(arr) })
}

fn note_created(ctx: *mut Ctx) -> impl FnOnce(&Books) -> Option<()> {
    move |books| {
        // SAFETY: written by the driver on success.
        books.created_ctx.insert(unsafe { out(ctx) }? as u64, ());
        Some(())
    }
}

unsafe fn ctx_create_v2(
    _api: u8,
    real: row::cuCtxCreate_v2::Real,
    ctx: *mut Ctx,
    flags: c_uint,
    dev: c_int,
) -> c_int {
    track::observe(
        || {
            track::creating_context();
            unsafe { real(ctx, flags, dev) }
        },
        note_created(ctx),
    )
}

unsafe fn ctx_create_v3(
    _api: u8,
    real: row::cuCtxCreate_v3::Real,
    ctx: *mut Ctx,
    params: *mut c_void,
    n: c_int,
    flags: c_uint,
    dev: c_int,
) -> c_int {
    track::observe(
        || {
            track::creating_context();
            unsafe { real(ctx, params, n, flags, dev) }
        },
        note_created(ctx),
    )
}

unsafe fn ctx_create_v4(
    _api: u8,
    real: row::cuCtxCreate_v4::Real,
    ctx: *mut Ctx,
    params: *mut c_void,
    flags: c_uint,
    dev: c_int,
) -> c_int {
    track::observe(
        || {
            track::creating_context();
            unsafe { real(ctx, params, flags, dev) }
        },
        note_created(ctx),
    )
}

unsafe fn ctx_destroy(_api: u8, real: row::cuCtxDestroy_v2::Real, ctx: Ctx) -> c_int {
    let rc = track::teardown(|| unsafe { real(ctx) }, |_, r, _| r.ctx == ctx as u64);
    if rc == SUCCESS
        && let Some(b) = active_books()
    {
        b.created_ctx.remove(&(ctx as u64));
    }
    rc
}

/// Records of the primary context of `dev`: on that device, not in a created one.
fn in_primary(dev: c_int) -> impl Fn(&Key, &gpuguard_core::ledger::Record, &Books) -> bool {
    move |_, r, books| i32::from(r.device) == dev && !books.created_ctx.contains_key(&r.ctx)
}

unsafe fn primary_ctx_reset(
    _api: u8,
    real: row::cuDevicePrimaryCtxReset_v2::Real,
    dev: c_int,
) -> c_int {
    track::teardown(|| unsafe { real(dev) }, in_primary(dev))
}

/// Releasing the last reference destroys the primary context and its memory.
unsafe fn primary_ctx_release(
    _api: u8,
    real: row::cuDevicePrimaryCtxRelease_v2::Real,
    dev: c_int,
) -> c_int {
    let gone = std::cell::Cell::new(false);
    track::teardown(
        || {
            let rc = unsafe { real(dev) };
            gone.set(rc == SUCCESS && super::real::DRIVER.primary_ctx_active(dev) == Some(false));
            rc
        },
        |k, r, books| gone.get() && in_primary(dev)(k, r, books),
    )
}

/// The cap of the current device and what is charged against it, if it is capped.
fn current_cap() -> Option<(u64, u64)> {
    let books = books()?;
    let dev = track::ctx_device().1;
    books.note_device(dev);
    books.refresh_pools(dev);
    let c = books.ledger.device(dev);
    Some((c.cap()?, c.charged()))
}

unsafe fn mem_get_info(
    _api: u8,
    real: row::cuMemGetInfo_v2::Real,
    free: *mut usize,
    total: *mut usize,
) -> c_int {
    let Some(_scope) = track::enter_driver() else {
        return unsafe { real(free, total) };
    };
    let rc = unsafe { real(free, total) };
    if rc == SUCCESS {
        shielded(|| {
            let (cap, used) = current_cap()?;
            // SAFETY: the driver accepted and wrote these (each may be NULL).
            unsafe {
                if let Some(t) = total.as_mut() {
                    *t = cap as usize;
                }
                if let Some(f) = free.as_mut() {
                    *f = (*f).min(cap.saturating_sub(used) as usize);
                }
            }
            Some(())
        });
    }
    rc
}

unsafe fn device_total_mem(
    _api: u8,
    real: row::cuDeviceTotalMem_v2::Real,
    bytes: *mut usize,
    dev: c_int,
) -> c_int {
    let Some(_scope) = track::enter_driver() else {
        return unsafe { real(bytes, dev) };
    };
    let rc = unsafe { real(bytes, dev) };
    if rc == SUCCESS {
        shielded(|| {
            let books = books()?;
            books.note_device(dev);
            let cap = books.ledger.device(dev).cap()?;
            // SAFETY: written by the driver on success.
            if let Some(b) = unsafe { bytes.as_mut() } {
                *b = cap as usize;
            }
            Some(())
        });
    }
    rc
}

/// What a capped device shows: total = the cap, used = what is charged against it,
/// free = what is left of the cap, never more than the driver has free.
fn capped_view(cap: u64, used: u64, real_free: u64) -> (u64, u64, u64) {
    let used = used.min(cap);
    (cap, used, real_free.min(cap - used))
}

/// The cap and the charge of an NVML device, once CUDA is in use in this process
/// (an NVML-only process, such as nvidia-smi, is left alone).
fn nvml_cap(handle: *mut c_void) -> Option<(u64, u64)> {
    let books = active_books()?;
    let dev = books.nvml_ordinal(handle as u64)?;
    books.note_device(dev);
    let c = books.ledger.device(dev);
    Some((c.cap()?, c.charged()))
}

unsafe fn nvml_memory(
    _api: u8,
    real: row::nvmlDeviceGetMemoryInfo::Real,
    dev: *mut c_void,
    mem: *mut NvmlMemory,
) -> c_int {
    let rc = unsafe { real(dev, mem) };
    if rc == SUCCESS {
        shielded(|| {
            let (cap, used) = nvml_cap(dev)?;
            // SAFETY: written by NVML on success.
            let m = unsafe { mem.as_mut() }?;
            (m.total, m.used, m.free) = capped_view(cap, used, m.free);
            Some(())
        });
    }
    rc
}

unsafe fn nvml_memory_v2(
    _api: u8,
    real: row::nvmlDeviceGetMemoryInfo_v2::Real,
    dev: *mut c_void,
    mem: *mut NvmlMemoryV2,
) -> c_int {
    let rc = unsafe { real(dev, mem) };
    if rc == SUCCESS {
        shielded(|| {
            let (cap, used) = nvml_cap(dev)?;
            // SAFETY: written by NVML on success.
            let m = unsafe { mem.as_mut() }?;
            (m.total, m.used, m.free) = capped_view(cap, used, m.free);
            m.reserved = 0;
            Some(())
        });
    }
    rc
}

unsafe fn get_proc_address(
    _api: u8,
    real: row::cuGetProcAddress::Real,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> c_int {
    let rc = unsafe { real(symbol, pfn, version, flags) };
    if rc == SUCCESS {
        shielded(|| unsafe { swap_proc(symbol, pfn, version, flags) });
    }
    rc
}

unsafe fn get_proc_address_v2(
    _api: u8,
    real: row::cuGetProcAddress_v2::Real,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> c_int {
    let rc = unsafe { real(symbol, pfn, version, flags, status) };
    if rc == SUCCESS {
        shielded(|| unsafe { swap_proc(symbol, pfn, version, flags) });
    }
    rc
}

unsafe fn rt_malloc(
    api: u8,
    real: row::cudaMalloc::Real,
    p: *mut *mut c_void,
    bytes: usize,
) -> c_int {
    track::runtime_alloc(
        api,
        Kind::Device,
        || unsafe { real(p, bytes) },
        || unsafe { made_ptr(p, Key::device, bytes as u64) },
    )
}

unsafe fn rt_malloc_managed(
    api: u8,
    real: row::cudaMallocManaged::Real,
    p: *mut *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> c_int {
    track::runtime_alloc(
        api,
        Kind::Managed,
        || unsafe { real(p, bytes, flags) },
        || unsafe { made_ptr(p, Key::device, bytes as u64) },
    )
}

unsafe fn rt_malloc_pitch(
    api: u8,
    real: row::cudaMallocPitch::Real,
    p: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> c_int {
    track::runtime_alloc(
        api,
        Kind::Pitch,
        || unsafe { real(p, pitch, width, height) },
        || {
            let a = unsafe { out(p) }?;
            let pitch = unsafe { out(pitch) }.unwrap_or(width);
            Some(Made {
                key: Key::device(a as u64),
                bytes: (pitch * height.max(1)) as u64,
            })
        },
    )
}

unsafe fn rt_malloc_3d(
    api: u8,
    real: row::cudaMalloc3D::Real,
    pitched: *mut PitchedPtr,
    extent: Extent,
) -> c_int {
    track::runtime_alloc(
        api,
        Kind::Pitch,
        || unsafe { real(pitched, extent) },
        || {
            // SAFETY: written by the runtime on success.
            let pp = unsafe { pitched.as_ref() }?;
            let bytes = (pp.pitch * extent.height.max(1) * extent.depth.max(1)) as u64;
            Some(Made {
                key: Key::device(pp.ptr as u64),
                bytes,
            })
        },
    )
}

unsafe fn rt_malloc_async(
    api: u8,
    real: row::cudaMallocAsync::Real,
    p: *mut *mut c_void,
    bytes: usize,
    stream: Stream,
) -> c_int {
    track::runtime_alloc(
        api,
        Kind::Pool,
        || unsafe { real(p, bytes, stream) },
        || unsafe { made_ptr(p, Key::device, bytes as u64) },
    )
}

unsafe fn rt_malloc_from_pool(
    api: u8,
    real: row::cudaMallocFromPoolAsync::Real,
    p: *mut *mut c_void,
    bytes: usize,
    pool: *mut c_void,
    stream: Stream,
) -> c_int {
    track::runtime_alloc(
        api,
        Kind::Pool,
        || unsafe { real(p, bytes, pool, stream) },
        || unsafe { made_ptr(p, Key::device, bytes as u64) },
    )
}

unsafe fn rt_free(api: u8, real: row::cudaFree::Real, p: *mut c_void) -> c_int {
    track::runtime_free(api, Key::device(p as u64), || unsafe { real(p) })
}

unsafe fn rt_free_async(
    api: u8,
    real: row::cudaFreeAsync::Real,
    p: *mut c_void,
    stream: Stream,
) -> c_int {
    track::runtime_free(api, Key::device(p as u64), || unsafe { real(p, stream) })
}

unsafe fn rt_malloc_host(
    api: u8,
    real: row::cudaMallocHost::Real,
    p: *mut *mut c_void,
    bytes: usize,
) -> c_int {
    track::runtime_alloc(
        api,
        Kind::Host,
        || unsafe { real(p, bytes) },
        || unsafe { made_ptr(p, Key::host, bytes as u64) },
    )
}

unsafe fn rt_host_alloc(
    api: u8,
    real: row::cudaHostAlloc::Real,
    p: *mut *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> c_int {
    track::runtime_alloc(
        api,
        Kind::Host,
        || unsafe { real(p, bytes, flags) },
        || unsafe { made_ptr(p, Key::host, bytes as u64) },
    )
}

unsafe fn rt_free_host(api: u8, real: row::cudaFreeHost::Real, p: *mut c_void) -> c_int {
    track::runtime_free(api, Key::host(p as u64), || unsafe { real(p) })
}

unsafe fn rt_device_reset(_api: u8, real: row::cudaDeviceReset::Real) -> c_int {
    // The device is the current one; ask before the reset takes the context away.
    let dev = super::real::DRIVER.current_device().unwrap_or(-1);
    track::teardown(|| unsafe { real() }, in_primary(dev))
}
