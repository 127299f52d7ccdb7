//! Which allocations of a thread get their stack captured (`GPUGUARD_STACK_RATE`).
//!
//! A capture costs ~350 ns inside a framework's step on the H200 (its lines are cold
//! there), and PyTorch's `backend:cudaMallocAsync` makes ~32,000 allocations a second:
//! capturing every one cost 1.5% of a training step. So each thread captures at most
//! `rate` stacks a second on average (with a burst of `BURST` after a quiet spell: a
//! program's start-up, its model's parameters, a first step), and past that one
//! allocation in `OVER` at random, so no allocation site is ever out of reach. The
//! books, caps, counts and bytes stay exact; only some allocations lack a stack. A
//! leak made every step is still named: it is captured in some of its steps, and its
//! line grows from one report to the next.
//!
//! What a site's bytes then say: only its captured allocations, and not in proportion.
//! The allowance goes to the first allocations after a pause (in a step, those after a
//! wait or a long computation), the one in `OVER` to any allocation alike; so the
//! lines that allocate right after a pause hold more captured bytes than their share.

/// Captures a thread may make at once after a quiet spell.
pub const BURST: u64 = 1024;
/// Past the rate, one allocation in this many is captured (a power of two).
pub const OVER: u32 = 32;
/// `GPUGUARD_STACK_RATE` when it is not set: captures a second per thread.
pub const DEFAULT_RATE: u32 = 1000;

const NS_PER_S: u64 = 1_000_000_000;

/// One thread's allowance. Plain data, kept in the thread's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampler {
    /// Captures allowed now, in billionths (a capture is `NS_PER_S`): time times the
    /// rate, so no division is made per allocation.
    credit: u64,
    /// When the allowance was last topped up (0: never).
    last_ns: u64,
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
            credit: BURST * NS_PER_S,
            last_ns: 0,
            rng: 0x9E37_79B9,
        }
    }

    /// Counts no time before `now_ns` toward the allowance: the time since the last
    /// allocation was not a time this thread could have allocated in (a
    /// benchmark's books paused: their steps must sample as a run without pauses
    /// would, not with the pauses' allowance on top).
    pub fn restart(&mut self, now_ns: u64) {
        self.last_ns = now_ns;
    }

    /// Whether the allocation made at `now_ns` gets its stack captured, at `rate`
    /// captures a second (`None`: every one).
    #[inline]
    pub fn take(&mut self, now_ns: u64, rate: Option<u32>) -> bool {
        let Some(rate) = rate else {
            return true;
        };
        let elapsed = if self.last_ns == 0 {
            0
        } else {
            now_ns.saturating_sub(self.last_ns)
        };
        self.last_ns = now_ns;
        self.credit = self
            .credit
            .saturating_add(elapsed.saturating_mul(u64::from(rate)))
            .min(BURST * NS_PER_S);
        if self.credit >= NS_PER_S {
            self.credit -= NS_PER_S;
            return true;
        }
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.rng = x;
        x & (OVER - 1) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Of `n` allocations `gap_ns` apart, how many are captured.
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
        // A start-up: 1,000 allocations within a millisecond.
        assert_eq!(captured(&mut s, 1_000, 1_000, 1_000, Some(1000)), 1_000);
        // Quiet for 2 s (the allowance fills again), then another burst.
        assert_eq!(
            captured(&mut s, 2_001_000_000, 1_000, 1_000, Some(1000)),
            1_000
        );
    }

    #[test]
    fn past_the_rate_the_rate_and_one_in_over_of_the_rest() {
        let mut s = Sampler::new();
        // 32,000 a second for 10 s (PyTorch's backend:cudaMallocAsync in training):
        // the burst, then 1,000 a second, and about one in 32 of the other 31,000.
        let n = 320_000;
        let got = captured(&mut s, 1_000, n, 31_250, Some(1000));
        let expected = BURST + 10 * 1000 + (n - 10 * 1000 - BURST) / u64::from(OVER);
        assert!(
            got.abs_diff(expected) < expected / 10,
            "{got} captured, about {expected} expected"
        );
        assert!(got < n / 10, "{got} of {n}: not sampled");
    }

    #[test]
    fn past_the_rate_no_allocation_is_out_of_reach() {
        // The random share reaches allocations at every position of a repeating step
        // (a site that allocates at the same moment of each step is still captured).
        let mut s = Sampler::new();
        let mut by_position = [0u32; 64];
        for step in 0..2_000u64 {
            for (i, hits) in by_position.iter_mut().enumerate() {
                let now = 1_000 + (step * 64 + i as u64) * 10_000;
                if s.take(now, Some(1000)) {
                    *hits += 1;
                }
            }
        }
        assert!(by_position.iter().all(|&h| h > 20), "{by_position:?}");
    }

    #[test]
    fn a_restart_counts_no_time_before_it() {
        let mut s = Sampler::new();
        // Use the burst up at 32,000 a second.
        captured(&mut s, 1_000, 2_000, 31_250, Some(1000));
        let before = s;
        // A pause of 10 s, then a restart: no allowance from the pause.
        s.restart(10_000_000_000);
        assert_eq!(s.credit, before.credit);
        let mut unrestarted = before;
        unrestarted.take(10_000_000_000, Some(1000));
        assert_eq!(unrestarted.credit, (BURST - 1) * NS_PER_S);
    }

    #[test]
    fn without_a_rate_every_allocation_is_captured() {
        let mut s = Sampler::new();
        assert_eq!(captured(&mut s, 1_000, 100_000, 10, None), 100_000);
    }

    #[test]
    fn a_clock_that_steps_back_or_jumps_does_not_break_the_allowance() {
        let mut s = Sampler::new();
        assert!(s.take(5_000_000_000, Some(1000)));
        // Backwards: no time passed.
        assert!(s.take(1_000, Some(1000)));
        assert_eq!(s.credit, (BURST - 2) * NS_PER_S);
        // A jump of years only fills the allowance to its burst.
        s.take(u64::MAX / 2, Some(u32::MAX));
        assert_eq!(s.credit, BURST * NS_PER_S - NS_PER_S);
    }
}
