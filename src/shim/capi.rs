//! The C API declared in `include/gpuguard.h`, for programs that want to ask gpuguard
//! directly (C, C++, Python's ctypes).

use super::state::{active_books, books, shielded};
use super::{control, python, real, report, tags, track, worker};
use gpuguard_core::ledger::MAX_DEVICES;
use std::ffi::{CStr, c_char, c_int};

/// Mirrors `struct gpuguard_device_counters` in the header.
#[repr(C)]
pub struct DeviceCounters {
    pub device: i32,
    pub reserved0: u32,
    pub total_bytes: u64,
    pub cap_bytes: u64,
    pub current_bytes: u64,
    pub peak_bytes: u64,
    pub allocs: u64,
    pub frees: u64,
    pub failed: u64,
    pub denied: u64,
    pub unknown_frees: u64,
}

static VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => panic!("version"),
    };

#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn gpuguard_version() -> *const c_char {
    VERSION.as_ptr()
}

/// Counters of one device; zeros before gpuguard has seen any CUDA call.
///
/// # Safety
/// `out` is NULL or points to a writable `gpuguard_device_counters`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn gpuguard_device_counters(
    device: c_int,
    out: *mut DeviceCounters,
) -> c_int {
    if out.is_null() || device < 0 || device as usize >= MAX_DEVICES {
        return -1;
    }
    if active_books().is_some()
        && let Some(n) = real::DRIVER.device_count()
        && device >= n
    {
        return -1;
    }
    let mut c = DeviceCounters {
        device,
        reserved0: 0,
        total_bytes: 0,
        cap_bytes: 0,
        current_bytes: 0,
        peak_bytes: 0,
        allocs: 0,
        frees: 0,
        failed: 0,
        denied: 0,
        unknown_frees: 0,
    };
    if let Some(b) = active_books() {
        b.ledger.drain();
        let s = b.ledger.device(device).snapshot();
        c.total_bytes = b.total(device);
        c.cap_bytes = b.ledger.device(device).cap().unwrap_or(0);
        c.current_bytes = s.current;
        c.peak_bytes = s.peak;
        c.allocs = s.allocs;
        c.frees = s.frees;
        c.failed = s.failed;
        c.denied = s.denied;
        c.unknown_frees = s.unknown_frees;
    }
    // SAFETY: out checked non-null; the caller provides the struct.
    unsafe { out.write(c) };
    0
}

/// Pinned host memory: current and peak bytes.
///
/// # Safety
/// Each pointer is NULL or points to a writable `uint64_t`.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn gpuguard_host_pinned(current: *mut u64, peak: *mut u64) -> c_int {
    let s = active_books()
        .map(|b| {
            b.ledger.drain();
            b.ledger.host().snapshot()
        })
        .unwrap_or_default();
    // SAFETY: each pointer is written only when non-null.
    unsafe {
        if !current.is_null() {
            current.write(s.current);
        }
        if !peak.is_null() {
            peak.write(s.peak);
        }
    }
    0
}

/// Writes a report now. `reason` may be NULL (`request`). On success the file's path
/// is copied into `path_out` (NUL-terminated, truncated to `path_len`) and 0 returned;
/// -1 when the report could not be written to a file.
///
/// # Safety
/// `reason` is NULL or a C string; `path_out` is NULL or has `path_len` writable bytes.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn gpuguard_write_report(
    reason: *const c_char,
    path_out: *mut c_char,
    path_len: usize,
) -> c_int {
    let reason = if reason.is_null() {
        "request".to_string()
    } else {
        // SAFETY: the caller passes a C string.
        unsafe { CStr::from_ptr(reason) }
            .to_string_lossy()
            .into_owned()
    };
    let written = shielded(|| {
        books()?;
        report::write_report(&reason)
    })
    .flatten();
    let Some(path) = written else {
        return -1;
    };
    // SAFETY: as the caller promised.
    unsafe { copy_path(&path, path_out, path_len) };
    0
}

/// Copies `path` into the caller's buffer, NUL-terminated, truncated to `len`.
///
/// # Safety
/// `out` is NULL or has `len` writable bytes.
unsafe fn copy_path(path: &std::path::Path, out: *mut c_char, len: usize) {
    if out.is_null() || len == 0 {
        return;
    }
    let bytes = path.as_os_str().as_encoded_bytes();
    let n = bytes.len().min(len - 1);
    // SAFETY: at most len bytes written into the caller's buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out as *mut u8, n);
        *out.add(n) = 0;
    }
}

/// Trims now (framework caches, then CUDA pools) and waits up to `timeout_ms` for
/// its report: 0 when written (its path copied into `path_out` as by
/// `gpuguard_write_report`; an empty path when it went to stderr), 1 on timeout (the
/// trim still runs), -1 when gpuguard cannot trim (disabled, no helper thread).
///
/// # Safety
/// `path_out` is NULL or has `path_len` writable bytes.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn gpuguard_trim(
    timeout_ms: u32,
    path_out: *mut c_char,
    path_len: usize,
) -> c_int {
    if shielded(books).flatten().is_none() {
        return -1;
    }
    // The main thread of a Python process runs the trim's Python side, and the helper
    // may be waiting for it (a cap report's classification, a cap trim): from that
    // thread the trim runs here, without the Python side.
    // SAFETY: plain system calls.
    let main = unsafe { libc::getpid() == libc::gettid() };
    if main && python::present() {
        return match shielded(worker::api_trim_here) {
            Some(path) => {
                // SAFETY: as the caller promised.
                unsafe { copy_path(&path.unwrap_or_default(), path_out, path_len) };
                0
            }
            None => -1,
        };
    }
    let Some(ticket) = control::ask_trim() else {
        return -1;
    };
    let wait = std::time::Duration::from_millis(u64::from(timeout_ms));
    match control::wait_trim(ticket, wait) {
        None => 1,
        Some(path) => {
            let path = path.unwrap_or_default();
            // SAFETY: as the caller promised.
            unsafe { copy_path(&path, path_out, path_len) };
            0
        }
    }
}

/// Sets device `device`'s cap to `bytes` while the program runs; 0 lifts it. A cap
/// above the device's memory is clamped to it. Usage already above the new cap is
/// left alone: the allocations that follow are refused until usage is back under it.
/// Returns 0, 1 when usage is already above the new cap, -1 for a bad device or
/// when gpuguard is not tracking (disabled).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn gpuguard_set_cap(device: c_int, bytes: u64) -> c_int {
    if device < 0 || device as usize >= MAX_DEVICES {
        return -1;
    }
    let Some(b) = shielded(books).flatten() else {
        return -1;
    };
    if let Some(n) = real::DRIVER.device_count()
        && device >= n
    {
        return -1;
    }
    let set = shielded(|| {
        let cap = b.set_cap_now(device, bytes);
        cap > 0 && b.ledger.device(device).charged() > cap
    });
    match set {
        Some(true) => 1,
        Some(false) => 0,
        None => -1,
    }
}

/// Pushes a phase label on the calling thread: allocations it makes until the
/// matching `gpuguard_pop_tag` carry the innermost label (their sites end in a
/// `tag: <label>` frame). Returns 0, or -1 for NULL, or when refused (64 deep, 65536
/// distinct labels). Labels longer than 256 bytes are cut.
///
/// # Safety
/// `tag` is NULL or a C string.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn gpuguard_push_tag(tag: *const c_char) -> c_int {
    if tag.is_null() {
        return -1;
    }
    // SAFETY: the caller passes a C string.
    let name = unsafe { CStr::from_ptr(tag) }.to_string_lossy();
    match shielded(|| tags::push(&name)) {
        Some(Some(id)) => {
            track::set_current_tag(id);
            0
        }
        _ => -1,
    }
}

/// Pops the calling thread's innermost phase label. Returns 0, or -1 when the thread
/// has none.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn gpuguard_pop_tag() -> c_int {
    match shielded(tags::pop) {
        Some(Some(id)) => {
            track::set_current_tag(id);
            0
        }
        _ => -1,
    }
}
