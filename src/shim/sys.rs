//! Small calls into the C library that need no state of gpuguard's.

use std::ffi::c_void;

/// Monotonic nanoseconds (hooks stamp every record with it).
#[inline]
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer. The coarse clock is a few ns through the vDSO and
    // its millisecond resolution is plenty for ages.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Writes all of `bytes` to stderr (fd 2), retrying after signals.
pub(crate) fn write_stderr(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: writing a valid buffer to fd 2.
        let n = unsafe { libc::write(2, bytes.as_ptr() as *const c_void, bytes.len()) };
        if n <= 0 {
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        bytes = &bytes[n as usize..];
    }
}
