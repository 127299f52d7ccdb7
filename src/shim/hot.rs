//! The process-wide words every hook reads, together on one cache line. Inside a
//! framework's step the hooks find gpuguard's lines evicted by the framework's own
//! work, so each separate static a hook reads is a separate wait: kept apart, the
//! lifecycle state, the books' address, the benchmark switch, the clock's
//! calibration and the stack settings were five or more lines. Each field belongs to
//! the module named on it, which alone writes it (rarely: at activation, at a fork,
//! at a benchmark's block boundary); hooks on every thread only read the line, so it
//! stays shared in every core's cache.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64};

#[repr(C, align(64))]
pub(crate) struct Hot {
    /// `state`: INERT, ACTIVE or DISABLED.
    pub state: AtomicU8,
    /// `wake`: the helper thread should run but could not be started.
    pub helper_missing: AtomicBool,
    /// `bench_switch`: the books are paused (benchmark pass-through; benchmark
    /// builds only).
    #[cfg(feature = "bench")]
    pub paused: AtomicBool,
    /// `settings`: the stack depth plus one (0: the settings are not read yet).
    pub stack_depth: AtomicU8,
    /// `bench_switch`: how many times the books were resumed after a pause.
    #[cfg(feature = "bench")]
    pub resumptions: AtomicU32,
    /// `settings`: captures a second per thread before stacks are sampled (0: every
    /// stack).
    pub stack_rate: AtomicU32,
    /// `settings`: whether the debug log counts captures.
    pub counting: AtomicBool,
    /// `state`: the books of the ACTIVE process (a `Books`; set before `state`).
    pub books: AtomicPtr<c_void>,
    /// `sys`: the time-stamp counter's calibration (`sys::monotonic_ns`).
    pub tsc_base: AtomicU64,
    pub ns_base: AtomicU64,
    pub tsc_mult: AtomicU64,
}

pub(crate) static HOT: Hot = Hot {
    state: AtomicU8::new(0),
    helper_missing: AtomicBool::new(false),
    #[cfg(feature = "bench")]
    paused: AtomicBool::new(false),
    stack_depth: AtomicU8::new(0),
    #[cfg(feature = "bench")]
    resumptions: AtomicU32::new(0),
    stack_rate: AtomicU32::new(0),
    counting: AtomicBool::new(false),
    books: AtomicPtr::new(std::ptr::null_mut()),
    tsc_base: AtomicU64::new(0),
    ns_base: AtomicU64::new(0),
    tsc_mult: AtomicU64::new(0),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_words_fit_one_line() {
        assert!(std::mem::size_of::<Hot>() <= 64);
        assert_eq!(std::mem::align_of::<Hot>(), 64);
    }
}
