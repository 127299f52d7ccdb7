//! The helper thread's doorbell: an eventfd that hooks (a refusal, a threshold) and
//! signal handlers write to, to wake the thread. Async-signal-safe.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering::*};

static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

/// Wakes the helper thread, if it runs.
pub(crate) fn ring() {
    let fd = WAKE_FD.load(Relaxed);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(fd, &one as *const u64 as *const c_void, 8) };
    }
}

/// Whether a helper thread has a doorbell (it was started and not lost to a fork).
pub(crate) fn running() -> bool {
    WAKE_FD.load(Acquire) >= 0
}

/// The helper thread's eventfd, set when it starts.
pub(crate) fn set(fd: c_int) {
    WAKE_FD.store(fd, Release);
}

/// Takes the eventfd back (-1: none), so nothing rings it any more.
pub(crate) fn take() -> c_int {
    WAKE_FD.swap(-1, AcqRel)
}
