//! The FFI surface towards CUDA callers: the list of hooked functions (`table`)
//! expanded row by row into the exported symbol, the wrapper the `dlsym` override
//! hands out, the wrapper `cuGetProcAddress` hands out (by base name and version), the
//! real-pointer slots and the row's handler, whose body the row's rule gives
//! (`handle!`); the `dlsym` override and the `cuGetProcAddress` answer; the few
//! custom handlers. Every wrapper is thin: find the real pointer, call the handler.
//!
//! Why one file of about 780 lines: the rows' tokens (types, rule helpers such as
//! `out`, custom handler names) resolve where the list is expanded, which is here,
//! and the lookup answers read the table this expansion makes. The last 80 lines are
//! the table's unit tests.

use super::books::Books;
use super::cuda::*;
use super::real::{PER_PATH, Path, SLOTS_PER_ROW, Slots, fn_at, path_base};
use super::settings::config_ptds_default;
use super::state::{active_books, books, shielded};
use super::track::{self, Made, Plan};
use gpuguard_core::ledger::{Key, Kind};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::Ordering::Relaxed;

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
            Lib::Driver => NOT_INITIALIZED,
            Lib::Runtime => RT_NOT_INITIALIZED,
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
    if UNHOOKED.fetch_add(1, Relaxed) == 0 {
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
            [$base:literal, $since:literal, $ptds:literal] => $rule:ident $how:tt;
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

                /// The row's handler: what its rule says, around the real call.
                #[allow(unused_variables, clippy::too_many_arguments)]
                unsafe fn handler(api: u8, real: Real, $($arg: $ty),*) -> c_int {
                    unsafe { handle!(api, real, ($($arg),*), $rule $how) }
                }

                #[inline(always)]
                pub unsafe fn call(slot: usize, $($arg: $ty),*) -> c_int {
                    match SLOTS.get_at(slot, NAME, Lib::$lib.soname()) {
                        // SAFETY: the slot holds the real function looked up by this
                        // row's name, whose signature is `Real`.
                        Some(p) => unsafe {
                            handler(Api::$name as u8, fn_at::<Real>(p as usize), $($arg),*)
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

/// A row's rule expanded into its handler's body (the rules are described in
/// `table`). `$real` is the real function, `($a),*` the row's arguments.
macro_rules! handle {
    ($api:ident, $real:ident, ($($a:ident),*), custom($handler:path)) => {
        $handler($api, $real, $($a),*)
    };
    ($api:ident, $real:ident, ($($a:ident),*),
        alloc { kind: $kind:ident, out: $out:ident, key: $key:ident, size: $size:expr }) => {
        handle!($api, $real, ($($a),*), alloc_measured {
            kind: $kind, out: $out, key: $key, estimate: ($size) as u64, size: Some(($size) as u64)
        })
    };
    ($api:ident, $real:ident, ($($a:ident),*),
        alloc { kind: $kind:ident, out: $out:ident, key: $key:ident, size: $size:expr,
                device: $device:expr, pool: $pool:expr }) => {
        track::driver_alloc(
            $api,
            Kind::$kind,
            Plan { bytes: ($size) as u64, device: $device, pool: $pool },
            || $real($($a),*),
            || Some(Made { key: Key::$key(out($out)? as u64), bytes: ($size) as u64 }),
        )
    };
    ($api:ident, $real:ident, ($($a:ident),*),
        alloc_measured { kind: $kind:ident, out: $out:ident, key: $key:ident,
                         estimate: $estimate:expr, size: $size:expr }) => {
        track::driver_alloc(
            $api,
            Kind::$kind,
            Plan::bytes($estimate),
            || $real($($a),*),
            || {
                let key = Key::$key(out($out)? as u64);
                Some(Made { key, bytes: $size? })
            },
        )
    };
    ($api:ident, $real:ident, ($($a:ident),*), free { key: $key:ident, arg: $arg:ident }) => {
        track::driver_free(Key::$key($arg as u64), || $real($($a),*))
    };
    ($api:ident, $real:ident, ($($a:ident),*),
        rt_alloc { kind: $kind:ident, out: $out:ident, key: $key:ident, size: $size:expr }) => {
        track::runtime_alloc(
            $api,
            Kind::$kind,
            || ($size) as u64,
            || $real($($a),*),
            || {
                let key = Key::$key(out($out)? as u64);
                Some(Made { key, bytes: ($size) as u64 })
            },
        )
    };
    ($api:ident, $real:ident, ($($a:ident),*), rt_free { key: $key:ident, arg: $arg:ident }) => {
        track::runtime_free($api, Key::$key($arg as u64), || $real($($a),*))
    };
    ($api:ident, $real:ident, ($($a:ident),*), capture_begin { stream: $s:ident }) => {
        track::capture_begin($s as u64, || $real($($a),*))
    };
    ($api:ident, $real:ident, ($($a:ident),*), capture_end { stream: $s:ident }) => {
        track::capture_end($s as u64, || $real($($a),*))
    };
    ($api:ident, $real:ident, ($($a:ident),*), observe { note: $note:expr }) => {
        track::observe(|| $real($($a),*), $note)
    };
    ($api:ident, $real:ident, ($($a:ident),*), observe { before: $before:expr, note: $note:expr }) => {
        track::observe(
            || {
                $before;
                $real($($a),*)
            },
            $note,
        )
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

/// After the real `cuGetProcAddress` answered `rc`: on success, swap in our wrapper
/// for hooked rows.
unsafe fn swap_proc(
    rc: c_int,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) {
    if rc != SUCCESS {
        return;
    }
    shielded(|| unsafe { swap_answer(symbol, pfn, version, flags) });
}

unsafe fn swap_answer(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
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

// ---- what the rules' expressions use ------------------------------------------------

/// Reads an out-pointer the call wrote (`None` for NULL).
///
/// # Safety
/// Called only after the real call succeeded, which wrote `*p` (or `p` is NULL).
unsafe fn out<T: Copy>(p: *const T) -> Option<T> {
    // SAFETY: as above.
    (!p.is_null()).then(|| unsafe { p.read() })
}

/// The driver aligns a pitch to at most 512 bytes on current GPUs; reserving that
/// much keeps the reservation an upper bound (the excess is given back after).
fn pitch_estimate(width: usize, height: usize) -> u64 {
    (width.div_ceil(512) * 512) as u64 * height as u64
}

/// A context made with `cuCtxCreate`: its records are told apart from the primary
/// context's.
fn note_created(books: &Books, ctx: CUcontext) -> Option<()> {
    books.created_ctx.insert(ctx as u64, ());
    Some(())
}

// ---- the custom handlers ------------------------------------------------------------

unsafe fn mem_release(
    _api: u8,
    real: row::cuMemRelease::Real,
    handle: CUmemGenericAllocationHandle,
) -> c_int {
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

unsafe fn ctx_destroy(_api: u8, real: row::cuCtxDestroy_v2::Real, ctx: CUcontext) -> c_int {
    let rc = track::teardown(|| unsafe { real(ctx) }, |_, r, _| r.ctx == ctx as u64);
    if rc == SUCCESS
        && let Some(b) = active_books()
    {
        b.created_ctx.remove(&(ctx as u64));
    }
    rc
}

/// Records of the primary context of `dev`: on that device, not in a created one.
fn in_primary(dev: CUdevice) -> impl Fn(&Key, &gpuguard_core::ledger::Record, &Books) -> bool {
    move |_, r, books| i32::from(r.device) == dev && !books.created_ctx.contains_key(&r.ctx)
}

unsafe fn primary_ctx_reset(
    _api: u8,
    real: row::cuDevicePrimaryCtxReset_v2::Real,
    dev: CUdevice,
) -> c_int {
    track::teardown(|| unsafe { real(dev) }, in_primary(dev))
}

/// Releasing the last reference destroys the primary context and its memory.
unsafe fn primary_ctx_release(
    _api: u8,
    real: row::cuDevicePrimaryCtxRelease_v2::Real,
    dev: CUdevice,
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

unsafe fn rt_device_reset(_api: u8, real: row::cudaDeviceReset::Real) -> c_int {
    // The device is the current one; ask before the reset takes the context away.
    let dev = super::real::DRIVER.current_device().unwrap_or(-1);
    track::teardown(|| unsafe { real() }, in_primary(dev))
}

unsafe fn rt_malloc_3d(
    api: u8,
    real: row::cudaMalloc3D::Real,
    pitched: *mut cudaPitchedPtr,
    extent: cudaExtent,
) -> c_int {
    track::runtime_alloc(
        api,
        Kind::Pitch,
        || {
            let (w, h, d) = (extent.width, extent.height.max(1), extent.depth.max(1));
            w.saturating_mul(h).saturating_mul(d) as u64
        },
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

/// The limit of the current device (its cap, or its group's budget) and what is
/// used of it, if it has one (`Books::limit_view`).
fn current_cap() -> Option<(u64, u64)> {
    let books = books()?;
    let dev = track::ctx_device().1;
    books.note_device(dev);
    books.refresh_pools(dev);
    books.limit_view(dev)
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
    dev: CUdevice,
) -> c_int {
    let Some(_scope) = track::enter_driver() else {
        return unsafe { real(bytes, dev) };
    };
    let rc = unsafe { real(bytes, dev) };
    if rc == SUCCESS {
        shielded(|| {
            let books = books()?;
            books.note_device(dev);
            let (cap, _) = books.limit_view(dev)?;
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

/// After an NVML memory query succeeded: the capped view, once CUDA is in use in this
/// process (an NVML-only process, such as nvidia-smi, is left alone): `view` gets
/// the device's cap and charge, to write into the answer.
fn nvml_capped(rc: c_int, dev: NvmlDevice, view: impl FnOnce(u64, u64)) {
    if rc != SUCCESS {
        return;
    }
    shielded(|| {
        let books = active_books()?;
        let d = books.nvml_ordinal(dev as u64)?;
        books.note_device(d);
        let (total, used) = books.limit_view(d)?;
        view(total, used);
        Some(())
    });
}

unsafe fn nvml_memory(
    _api: u8,
    real: row::nvmlDeviceGetMemoryInfo::Real,
    dev: NvmlDevice,
    mem: *mut NvmlMemory,
) -> c_int {
    let rc = unsafe { real(dev, mem) };
    nvml_capped(rc, dev, |cap, used| {
        // SAFETY: written by NVML on success.
        if let Some(m) = unsafe { mem.as_mut() } {
            (m.total, m.used, m.free) = capped_view(cap, used, m.free);
        }
    });
    rc
}

unsafe fn nvml_memory_v2(
    _api: u8,
    real: row::nvmlDeviceGetMemoryInfo_v2::Real,
    dev: NvmlDevice,
    mem: *mut NvmlMemoryV2,
) -> c_int {
    let rc = unsafe { real(dev, mem) };
    nvml_capped(rc, dev, |cap, used| {
        // SAFETY: written by NVML on success.
        if let Some(m) = unsafe { mem.as_mut() } {
            (m.total, m.used, m.free) = capped_view(cap, used, m.free);
            m.reserved = 0;
        }
    });
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
    unsafe { swap_proc(rc, symbol, pfn, version, flags) };
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
    unsafe { swap_proc(rc, symbol, pfn, version, flags) };
    rc
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_and_in_row_order() {
        let mut seen = HashSet::new();
        for (i, e) in TABLE.iter().enumerate() {
            assert!(seen.insert(e.name), "{} twice", e.name);
            assert_eq!(super::super::table::api_name(i as u8), e.name);
        }
        assert!(TABLE.len() < u8::MAX as usize, "a record's api is a u8");
        assert_eq!(Api::cuMemAlloc_v2 as u8, 0);
        assert_eq!(TABLE[Api::cudaDeviceReset as usize].name, "cudaDeviceReset");
        assert_eq!(
            by_name(b"cuMemFree_v2").map(|e| e.name),
            Some("cuMemFree_v2")
        );
    }

    #[test]
    fn every_row_has_distinct_wrappers() {
        let mut all = HashSet::new();
        for e in TABLE {
            for w in &e.wrappers {
                assert!(!w.0.is_null(), "{}", e.name);
                assert!(all.insert(w.0 as usize), "{}: a wrapper shared", e.name);
                assert!(is_wrapper(w.0 as *mut c_void));
            }
        }
        assert!(!is_wrapper(std::ptr::null_mut()));
    }

    #[test]
    fn proc_rows_have_a_base_name_and_version() {
        for e in TABLE {
            match e.lib {
                Lib::Driver => {
                    assert!(e.name.starts_with(e.base), "{} / {}", e.name, e.base);
                    assert!(e.since >= 2000, "{}", e.name);
                    assert_eq!(e.ptds, e.name.ends_with("_ptsz"), "{}", e.name);
                }
                Lib::Runtime | Lib::Nvml => {
                    assert_eq!((e.base, e.since, e.ptds), ("", 0, false), "{}", e.name);
                }
            }
        }
        // A base name and version pick one row: no two variants collide.
        let mut variants = HashSet::new();
        for e in TABLE.iter().filter(|e| e.lib == Lib::Driver) {
            assert!(variants.insert((e.base, e.since, e.ptds)), "{}", e.name);
        }
    }

    #[test]
    fn missing_functions_answer_valid_codes() {
        assert_eq!(Lib::Driver.missing(), NOT_INITIALIZED);
        assert_eq!(Lib::Runtime.missing(), RT_NOT_INITIALIZED);
        assert_eq!(Lib::Nvml.missing(), NVML_ERROR_UNINITIALIZED);
    }

    #[test]
    fn pitch_estimate_is_an_upper_bound() {
        assert_eq!(pitch_estimate(1, 3), 512 * 3);
        assert_eq!(pitch_estimate(513, 1), 1024);
        assert_eq!(capped_view(100, 150, 500), (100, 100, 0));
        assert_eq!(capped_view(100, 40, 30), (100, 40, 30));
    }
}
