//! A benchmark aid, not a user feature, in benchmark builds only (`--features bench`;
//! the release library has neither the symbol nor its check in the hooks):
//! `gpuguard_bench_set_books(0)` turns the books
//! into pass-through for the whole process (every hook still runs, but calls the real
//! function without recording, reserving against a cap or counting), and
//! `gpuguard_bench_set_books(1)` turns them back on. It exists so that the training
//! benchmark (`scripts/bench/train_bench.py --ab-blocks`) can alternate blocks of
//! steps with and without gpuguard's work inside one process, which removes the
//! between-process noise from the overhead figure (`docs/performance.md`, "Training
//! overhead to ±0.5%: method").
//!
//! While paused the books are not true: an allocation made then and freed after is an
//! unknown free, one made before and freed then stays live in the books, caps are not
//! enforced, and contexts or pools created or destroyed then are not seen. Use it only
//! in a benchmark.
//!
//! The hot path reads one process-wide flag with a Relaxed load (`paused`, checked
//! once per driver hook in `track::enter_driver`), and an allocation's record the
//! count of resumptions beside it (`resumptions`); both sit on the hot line (`hot`)
//! and are written only by this switch, so hooks on every thread only ever read them.

#[cfg(feature = "bench")]
use super::hot::HOT;
#[cfg(feature = "bench")]
use std::ffi::c_int;
#[cfg(feature = "bench")]
use std::sync::atomic::Ordering::Relaxed;

// The flag (`HOT.paused`) and how many times the books were resumed
// (`HOT.resumptions`) are on the hot line (`hot`), written only at block boundaries.

/// How many times the books were resumed after a pause. The stack sampler takes no
/// pause for a quiet spell (`track::sampled_site`): else each step with books on
/// after a paused one would capture every stack of its first window, far more than
/// a run without pauses captures, and the benchmark would overstate the cost.
#[inline(always)]
pub(crate) fn resumptions() -> u32 {
    #[cfg(feature = "bench")]
    return HOT.resumptions.load(Relaxed);
    #[cfg(not(feature = "bench"))]
    0
}

/// Whether the books are paused (benchmark pass-through; never without the switch).
#[inline(always)]
pub(crate) fn paused() -> bool {
    #[cfg(feature = "bench")]
    return HOT.paused.load(Relaxed);
    #[cfg(not(feature = "bench"))]
    false
}

/// Benchmark aid (see the module's doc): `on` 1 keeps the books (the default), 0 makes
/// every hook pass straight through, a negative value only asks. Returns the setting
/// before the call: 1 books on, 0 pass-through.
#[cfg(feature = "bench")]
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn gpuguard_bench_set_books(on: c_int) -> c_int {
    let was_on = if on < 0 {
        !HOT.paused.load(Relaxed)
    } else {
        let was_on = !HOT.paused.swap(on == 0, Relaxed);
        if on != 0 && !was_on {
            HOT.resumptions.fetch_add(1, Relaxed);
        }
        was_on
    };
    c_int::from(was_on)
}

/// A diagnostic build only (`--features hook-timing`): the time-stamp counter read at
/// the phase boundaries of the allocation and free hooks, summed per phase and per
/// setting of the switch, so a benchmark can split what a hook costs inside a real
/// program into gpuguard's own work and the real call's (`gpuguard_bench_hook_times`).
/// Without the feature every function here is an empty inline one.
pub(crate) mod timing {
    /// The phases timed; `N` is their count.
    #[derive(Clone, Copy)]
    pub(crate) enum Phase {
        RtAllocPre,
        RtAllocPost,
        DrvAllocPre,
        DrvAllocReal,
        DrvAllocPost,
        RtFreePre,
        RtFreePost,
        DrvFreePre,
        DrvFreeReal,
        DrvFreePost,
        /// The parts of an allocation's record (inside `DrvAllocPost` or
        /// `RtAllocPost`), charged by `lap`: the Python frames, the native walk, the
        /// fingerprint and site lookup, then the stamp and the entry; or, for a
        /// capture its memo answered (`track::memo`), the check of the memo.
        RecPython,
        RecNative,
        RecSite,
        RecBook,
        RecMemo,
    }
    #[cfg(feature = "hook-timing")]
    pub(crate) const N: usize = 15;

    impl Phase {
        /// The phase after a real call's (itself for any other phase).
        pub(crate) fn post(self) -> Phase {
            match self {
                Phase::DrvAllocReal => Phase::DrvAllocPost,
                Phase::DrvFreeReal => Phase::DrvFreePost,
                p => p,
            }
        }
    }

    #[cfg(feature = "hook-timing")]
    mod on {
        use super::{N, Phase};
        use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

        /// [books on, paused] x phase: (cycles, count).
        static SUMS: [[[AtomicU64; 2]; N]; 2] =
            [const { [const { [AtomicU64::new(0), AtomicU64::new(0)] }; N] }; 2];

        #[inline(always)]
        pub(crate) fn stamp() -> u64 {
            // SAFETY: rdtsc has no preconditions on x86-64.
            unsafe { core::arch::x86_64::_rdtsc() }
        }

        #[inline(always)]
        pub(crate) fn charge(phase: Phase, since: u64) -> u64 {
            let now = stamp();
            let s = &SUMS[usize::from(super::super::paused())][phase as usize];
            s[0].fetch_add(now.wrapping_sub(since), Relaxed);
            s[1].fetch_add(1, Relaxed);
            now
        }

        std::thread_local! {
            /// Where the last `lap` (or `mark`) of this thread ended.
            static MARK: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
        }

        /// Starts a run of `lap`s on this thread.
        #[inline(always)]
        pub(crate) fn mark() {
            MARK.with(|m| m.set(stamp()));
        }

        /// Charges `phase` with the time since this thread's last `lap` or `mark`.
        #[inline(always)]
        pub(crate) fn lap(phase: Phase) {
            MARK.with(|m| m.set(charge(phase, m.get())));
        }

        /// Whether the capture memos are off (`GPUGUARD_BENCH_NO_MEMOS` set: the
        /// diagnostic build's way to time the capture without them).
        pub(crate) fn memos_off() -> bool {
            static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            *OFF.get_or_init(|| std::env::var_os("GPUGUARD_BENCH_NO_MEMOS").is_some())
        }

        /// Time-stamp-counter ticks per millisecond, measured over 20 ms now.
        pub(crate) fn ticks_per_ms() -> u64 {
            let (c0, t0) = (stamp(), std::time::Instant::now());
            while t0.elapsed() < std::time::Duration::from_millis(20) {}
            let (c1, dt) = (stamp(), t0.elapsed());
            (c1.wrapping_sub(c0) as f64 / (dt.as_secs_f64() * 1e3)) as u64
        }

        /// Copies the sums out: `out[(paused * N + phase) * 2 + {0: cycles, 1: count}]`.
        pub(crate) fn read(out: &mut [u64]) {
            for (p, row) in SUMS.iter().enumerate() {
                for (i, s) in row.iter().enumerate() {
                    for (j, v) in s.iter().enumerate() {
                        if let Some(o) = out.get_mut((p * N + i) * 2 + j) {
                            *o = v.load(Relaxed);
                        }
                    }
                }
            }
        }
    }
    #[cfg(feature = "hook-timing")]
    pub(crate) use on::{charge, lap, mark, memos_off, read, stamp, ticks_per_ms};

    #[cfg(not(feature = "hook-timing"))]
    #[inline(always)]
    pub(crate) fn stamp() -> u64 {
        0
    }

    #[cfg(not(feature = "hook-timing"))]
    #[inline(always)]
    pub(crate) fn charge(_phase: Phase, since: u64) -> u64 {
        since
    }

    #[cfg(not(feature = "hook-timing"))]
    #[inline(always)]
    pub(crate) fn mark() {}

    #[cfg(not(feature = "hook-timing"))]
    #[inline(always)]
    pub(crate) fn memos_off() -> bool {
        false
    }

    #[cfg(not(feature = "hook-timing"))]
    #[inline(always)]
    pub(crate) fn lap(_phase: Phase) {}
}

/// Diagnostic (see `timing`): fills `out` (room for `n` values) with the per-phase
/// time-stamp-counter sums and counts, `[paused][phase][cycles, count]`, then the
/// counter's ticks per millisecond (measured for 20 ms now), and returns how many
/// values it wrote. With `out` null it returns how many values a full answer has.
/// Diagnostic builds only (`--features hook-timing`).
///
/// # Safety
/// `out` must point to `n` writable `u64`s (or be null, with `n` 0).
#[cfg(feature = "hook-timing")]
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn gpuguard_bench_hook_times(out: *mut u64, n: usize) -> usize {
    let total = 2 * timing::N * 2 + 1;
    if out.is_null() {
        return total;
    }
    // SAFETY: the caller gives `n` writable values at `out`.
    let out = unsafe { std::slice::from_raw_parts_mut(out, n.min(total)) };
    timing::read(out);
    if let Some(last) = out.get_mut(total - 1) {
        *last = timing::ticks_per_ms();
    }
    out.len()
}

#[cfg(all(test, feature = "bench"))]
mod tests {
    use super::*;

    #[test]
    fn the_switch_pauses_and_resumes_and_says_what_it_was() {
        assert_eq!(gpuguard_bench_set_books(-1), 1);
        assert!(!paused());
        let resumed = resumptions();
        assert_eq!(gpuguard_bench_set_books(0), 1);
        assert!(paused());
        assert_eq!(gpuguard_bench_set_books(-1), 0);
        assert_eq!(gpuguard_bench_set_books(0), 0);
        assert_eq!(gpuguard_bench_set_books(1), 0);
        assert!(!paused());
        assert_eq!(gpuguard_bench_set_books(1), 1);
        // One resumption: the second "on" found the books on already.
        assert_eq!(resumptions(), resumed + 1);
    }
}
