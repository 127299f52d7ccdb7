//! Which allocations of a thread get their stack captured (`GPUGUARD_STACK_RATE`).
//!
//! A capture costs ~350–600 ns inside a framework's step on the H200 (its lines are
//! cold there, and they push the framework's own lines out), and PyTorch's
//! `backend:cudaMallocAsync` makes ~32,000 allocations a second: capturing every one
//! cost 1.5% of a training step, and 1,000 a second per thread still ~0.25 points
//! (GPU runs 35 and 40, docs/validation.md). So each thread captures at most about
//! `rate` stacks a second (250 by default: in run 40 that cost no more than stacks
//! off, within the figure's ±0.3%, and the leak line was still the first suspect).
//! It counts its allocations in windows of `WINDOW_NS`; while the last window held no
//! more than `rate` a second's worth, every allocation is captured (so a program that
//! allocates rarely, and a burst after a quiet spell, such as a start-up or a model's
//! parameters, lose nothing); past that, each allocation is captured at random with
//! the probability that brings the window back to `rate` a second, never less than
//! `rate` in `FLOOR_AT` (one in 128 at the default rate: past 32,000 allocations a
//! second a thread's captures grow with its allocations, so a leak among very many
//! allocations is still captured often enough to be named). Within a window every
//! allocation has the same chance, wherever it comes in a step, so the captured
//! allocations keep the proportions of the lines that made them.
//!
//! The books, caps, counts, bytes and peaks stay exact; only some allocations lack a
//! stack. A leak made every step is still named: it is captured in some of its steps,
//! and its line grows from one report to the next.

/// The window the rate is measured over.
pub const WINDOW_NS: u64 = 100_000_000;
/// Past the rate, at least `rate` allocations in this many are captured: the
/// allocations a second past which a thread's captures grow with them.
pub const FLOOR_AT: u64 = 32_000;
/// `GPUGUARD_STACK_RATE` when it is not set: captures a second per thread.
pub const DEFAULT_RATE: u32 = 250;

const NS_PER_S: u64 = 1_000_000_000;
/// A probability as a fraction of 2^32 (`u32::MAX`: every allocation).
const EVERY: u32 = u32::MAX;

/// One thread's sampling state. Plain data, kept in the thread's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampler {
    /// When the current window began (0: no allocation yet).
    window_ns: u64,
    /// Allocations in the current window.
    count: u32,
    /// The chance of a capture in the current window, in 2^32nds.
    chance: u32,
    /// xorshift state, never 0.
    rng: u32,
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler::new()
    }
}

impl Sampler {
    pub const fn new() -> Sampler {
        Sampler {
            window_ns: 0,
            count: 0,
            chance: EVERY,
            rng: 0x9E37_79B9,
        }
    }

    /// Counts no time before `now_ns`: the next allocation continues the current
    /// window at its chance. For a benchmark's paused books (their steps must sample
    /// as a run without pauses would: a pause is not a quiet spell).
    pub fn restart(&mut self, now_ns: u64) {
        if self.window_ns != 0 {
            self.window_ns = now_ns;
        }
    }

    /// Whether the allocation made at `now_ns` gets its stack captured, at `rate`
    /// captures a second (`None`: every one).
    #[inline]
    pub fn take(&mut self, now_ns: u64, rate: Option<u32>) -> bool {
        let Some(rate) = rate else {
            return true;
        };
        let since = now_ns.wrapping_sub(self.window_ns);
        if self.window_ns == 0 || since >= WINDOW_NS || now_ns < self.window_ns {
            self.next_window(now_ns, since, rate);
        }
        self.count = self.count.saturating_add(1);
        if self.chance == EVERY {
            return true;
        }
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.rng = x;
        x < self.chance
    }

    /// A new window from `now_ns`: its chance from the window that just ended (none
    /// if it ended more than a window ago: a quiet spell).
    #[cold]
    fn next_window(&mut self, now_ns: u64, since: u64, rate: u32) {
        let last = if self.window_ns != 0 && since < 2 * WINDOW_NS {
            u64::from(self.count)
        } else {
            0
        };
        let allowed = (u64::from(rate) * WINDOW_NS / NS_PER_S).max(1);
        self.chance = if last <= allowed {
            EVERY
        } else {
            let floor = (u64::from(rate) << 32) / FLOOR_AT;
            ((allowed << 32) / last).clamp(floor, u64::from(EVERY)) as u32
        };
        self.window_ns = now_ns.max(1);
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Of `n` allocations `gap_ns` apart from `start`, how many are captured.
    fn captured(s: &mut Sampler, start: u64, n: u64, gap_ns: u64, rate: Option<u32>) -> u64 {
        (0..n).filter(|i| s.take(start + i * gap_ns, rate)).count() as u64
    }

    #[test]
    fn below_the_rate_every_allocation_is_captured() {
        let mut s = Sampler::new();
        // 500 a second for 10 s, at a rate of 1,000: all 5,000.
        assert_eq!(captured(&mut s, 1_000, 5_000, 2_000_000, Some(1000)), 5_000);
    }

    #[test]
    fn a_burst_after_a_quiet_spell_is_captured_whole() {
        let mut s = Sampler::new();
        // A start-up: 5,000 allocations within 5 ms.
        assert_eq!(captured(&mut s, 1_000, 5_000, 1_000, Some(1000)), 5_000);
        // Quiet for 2 s, then another burst.
        assert_eq!(
            captured(&mut s, 2_001_000_000, 5_000, 1_000, Some(1000)),
            5_000
        );
    }

    #[test]
    fn past_the_rate_about_the_rate_is_captured() {
        let mut s = Sampler::new();
        // 32,000 a second for 10 s (PyTorch's backend:cudaMallocAsync in training):
        // the first window whole (3,200), then about 1,000 a second.
        let n = 320_000;
        let got = captured(&mut s, 1_000, n, 31_250, Some(1000));
        let expected = 3_200 + 9_900;
        assert!(
            got.abs_diff(expected) < expected / 10,
            "{got} captured, about {expected} expected"
        );
    }

    #[test]
    fn far_past_the_rate_the_floor_is_captured() {
        // A million a second for 1 s: past the first window, `rate` in 32,000 (one
        // in 32 at 1,000 a second, one in 128 at 250).
        for (rate, one_in) in [(1000, 32), (250, 128)] {
            let mut s = Sampler::new();
            let n = 1_000_000;
            let got = captured(&mut s, 1_000, n, 1_000, Some(rate));
            // The first window's 100,000 all, then the floor.
            let expected = 100_000 + (n - 100_000) / one_in;
            assert!(
                got.abs_diff(expected) < expected / 10,
                "rate {rate}: {got} captured, about {expected} expected"
            );
        }
    }

    #[test]
    fn past_the_rate_every_place_in_a_step_has_the_same_chance() {
        // A step of 64 allocations, the first right after a pause: each position is
        // captured about as often as any other (the captures keep the lines'
        // proportions).
        let mut s = Sampler::new();
        let mut by_position = [0u32; 64];
        for step in 0..4_000u64 {
            for (i, hits) in by_position.iter_mut().enumerate() {
                // 5 ms of other work, then the step's allocations 10 µs apart.
                let now = 1_000 + step * 5_640_000 + i as u64 * 10_000;
                if s.take(now, Some(1000)) {
                    *hits += 1;
                }
            }
        }
        let (lo, hi) = (by_position.iter().min(), by_position.iter().max());
        let (lo, hi) = (*lo.unwrap(), *hi.unwrap());
        assert!(lo > 0 && hi < lo * 2, "{by_position:?}");
    }

    #[test]
    fn without_a_rate_every_allocation_is_captured() {
        let mut s = Sampler::new();
        assert_eq!(captured(&mut s, 1_000, 100_000, 10, None), 100_000);
    }

    #[test]
    fn a_restart_keeps_the_window_s_chance() {
        let mut s = Sampler::new();
        // 32,000 a second for 1 s: the chance falls to about 1,000 in 32,000.
        captured(&mut s, 1_000, 32_000, 31_250, Some(1000));
        let chance = s.chance;
        assert!(chance < EVERY / 16, "{chance}");
        // A pause of 10 s, then a restart: not a quiet spell.
        s.restart(11_000_000_000);
        s.take(11_000_000_001, Some(1000));
        assert_eq!(s.chance, chance);
        // Without the restart, the pause is a quiet spell: every allocation again.
        let mut quiet = s;
        quiet.take(30_000_000_000, Some(1000));
        assert_eq!(quiet.chance, EVERY);
    }

    #[test]
    fn a_clock_that_steps_back_starts_a_window() {
        let mut s = Sampler::new();
        captured(&mut s, 5_000_000_000, 10_000, 1_000, Some(1000));
        // Backwards: a new window (after no quiet spell that it could measure: every
        // allocation), never a panic or a stuck state.
        assert!(s.take(1_000, Some(1000)));
        assert_eq!(s.window_ns, 1_000);
        s.take(u64::MAX, Some(u32::MAX));
    }
}
