//! The helper thread's doorbell: an eventfd that hooks (a refusal, a threshold, a
//! thread's journal half written) and signal handlers write to, to wake the thread.
//! Async-signal-safe.

use super::hot::HOT;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering::*};

static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

/// Wakes the helper thread, if it runs. The caller's `errno` is left as it was (a
/// hook or a signal handler rings it in the middle of the program's own calls).
pub(crate) fn ring() {
    let fd = WAKE_FD.load(Relaxed);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our eventfd; errno is this thread's.
        unsafe {
            let errno = *libc::__errno_location();
            libc::write(fd, &one as *const u64 as *const c_void, 8);
            *libc::__errno_location() = errno;
        }
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

// `HOT.helper_missing` is set while the helper thread should run but could not be
// started; hooks then ask the registered `retry` (the service's start, backing off)
// to try again.
static RETRY: AtomicUsize = AtomicUsize::new(0);

/// Whether the helper thread could not be started (and a retry is registered).
#[inline]
pub(crate) fn helper_missing() -> bool {
    HOT.helper_missing.load(Relaxed)
}

/// The helper thread could not be started (`retry` tries again), or now runs.
pub(crate) fn set_missing(missing: bool, retry: fn()) {
    RETRY.store(retry as usize, Release);
    HOT.helper_missing.store(missing, Release);
}

/// Tries to start the helper thread again (the registered retry decides when).
#[cold]
pub(crate) fn retry() {
    let f = RETRY.load(Acquire);
    if f != 0 {
        // SAFETY: RETRY only ever holds a `fn()` stored by `set_missing`.
        unsafe { std::mem::transmute::<usize, fn()>(f)() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ringing_leaves_the_callers_errno_as_it_was() {
        // A pipe's read end: the write fails (EBADF), as a lost doorbell would.
        let mut fds = [0 as c_int; 2];
        // SAFETY: a pipe for this test; both ends closed below.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let before = take();
        set(fds[0]);
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = libc::ENOTTY };
        ring();
        let errno = unsafe { *libc::__errno_location() };
        set(before);
        // SAFETY: the test's own descriptors.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        assert_eq!(errno, libc::ENOTTY);
    }
}
