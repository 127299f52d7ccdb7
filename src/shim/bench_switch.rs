//! A benchmark aid, not a user feature: `gpuguard_bench_set_books(0)` turns the books
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
//! once per driver hook in `track::enter_driver`); the flag sits alone on its cache
//! line, written only by this switch, so hooks on every thread only ever read it.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// The flag, alone on its cache line (written only at block boundaries).
#[repr(align(64))]
struct Flag(AtomicBool);

static PAUSED: Flag = Flag(AtomicBool::new(false));

/// Whether the books are paused (benchmark pass-through).
#[inline(always)]
pub(crate) fn paused() -> bool {
    PAUSED.0.load(Relaxed)
}

/// Benchmark aid (see the module's doc): `on` 1 keeps the books (the default), 0 makes
/// every hook pass straight through, a negative value only asks. Returns the setting
/// before the call: 1 books on, 0 pass-through.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn gpuguard_bench_set_books(on: c_int) -> c_int {
    let was_on = if on < 0 {
        !PAUSED.0.load(Relaxed)
    } else {
        !PAUSED.0.swap(on == 0, Relaxed)
    };
    c_int::from(was_on)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_pauses_and_resumes_and_says_what_it_was() {
        assert_eq!(std::mem::align_of::<Flag>(), 64);
        assert_eq!(gpuguard_bench_set_books(-1), 1);
        assert!(!paused());
        assert_eq!(gpuguard_bench_set_books(0), 1);
        assert!(paused());
        assert_eq!(gpuguard_bench_set_books(-1), 0);
        assert_eq!(gpuguard_bench_set_books(0), 0);
        assert_eq!(gpuguard_bench_set_books(1), 0);
        assert!(!paused());
        assert_eq!(gpuguard_bench_set_books(1), 1);
    }
}
