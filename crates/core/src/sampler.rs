//! Which allocations of a thread get their stack captured (`GPUGUARD_STACK_RATE`), and
//! how many bytes each captured one stands for.
//!
//! A capture costs ~350–600 ns inside a framework's step on the H200 (its lines are
//! cold there, and they push the framework's own lines out), and PyTorch's
//! `backend:cudaMallocAsync` makes ~32,000 allocations a second: capturing every one
//! cost 1.5% of a training step, and 1,000 a second per thread still ~0.25 points
//! (GPU runs 35 and 40, docs/validation.md). So each thread captures at most about
//! `rate` stacks a second (250 by default: in run 40 that cost no more than stacks
//! off, within the figure's ±0.3%).
//!
//! A thread counts its allocations and their bytes in windows of `WINDOW_NS`. While
//! the last window held no more than `rate` a second's worth of allocations, every
//! allocation is captured (so a program that allocates rarely, and a burst after a
//! quiet spell, such as a start-up or a model's parameters, lose nothing). Past that
//! the thread samples by bytes, as heap profilers do (tcmalloc, jemalloc): sample
//! points fall at random on the stream of bytes allocated, on average one every
//! `mean` bytes (a Poisson process: the bytes to the next point are drawn from an
//! exponential distribution), and an allocation is captured when a point falls in
//! it. An allocation of `n` bytes is then captured with the chance
//! `p = 1 - exp(-n / mean)`, whatever came before it: a large one almost surely (8
//! times `mean` or more: 99.97%), and every allocation of `ALWAYS_BYTES` or more
//! always. A captured allocation carries its weight `1/p`: it stands for `1/p`
//! allocations and `n/p` bytes, so a site's weighted sums are unbiased estimates of
//! what its allocations hold, captured or not. `mean` is chosen from the last window
//! so that about `rate` a second are captured (the window's bytes over its allowance),
//! and never above what captures `rate` in `FLOOR_AT` allocations of the window's
//! average size (past 32,000 allocations a second a thread's captures grow with
//! them, so a leak among very many allocations is still captured often enough to be
//! named).
//!
//! The books, caps, counts, bytes and peaks stay exact; only some allocations lack a
//! stack, and the sites' figures are estimates where any did.

/// The window the rate is measured over.
pub const WINDOW_NS: u64 = 100_000_000;
/// Past the rate, at least `rate` allocations (of the window's average size) in this
/// many are captured: the allocations a second past which a thread's captures grow.
pub const FLOOR_AT: u64 = 32_000;
/// `GPUGUARD_STACK_RATE` when it is not set: captures a second per thread.
pub const DEFAULT_RATE: u32 = 250;
/// Allocations of this many bytes or more are always captured, whatever the rate: a
/// program cannot make many of them (141 GB, an H200's memory, is 2,100 of them), and
/// one of them is worth naming however often the program allocates. (Below it the
/// chance grows with the size: 1 MiB where `mean` is 1 MiB, 63%.)
pub const ALWAYS_BYTES: u64 = 64 << 20;

/// A captured allocation's weight, `1/p`, as the upper 16 bits of an `f32` (a
/// bfloat16: 8 bits of exponent, 8 of precision, 0.4% at most off after rounding to
/// nearest, either way), so it fits in the spare bits of a record and a journal entry.
/// 0: not captured.
pub type Weight = u16;
/// The weight of an allocation captured for certain.
pub const ONE: Weight = 0x3F80;
/// Not captured.
pub const NONE: Weight = 0;

/// `w` (1 or more) as a `Weight`, rounded to the nearest.
pub fn weight(w: f64) -> Weight {
    let bits = (w.max(1.0) as f32).to_bits();
    // Round to nearest: the upper half, plus one where the lower half is past half.
    let up = bits.saturating_add(0x8000) >> 16;
    up.min(0x7F7F) as Weight
}

/// The weight a `Weight` stands for (0 for `NONE`).
pub fn weight_value(w: Weight) -> f64 {
    f64::from(f32::from_bits(u32::from(w) << 16))
}

const NS_PER_S: u64 = 1_000_000_000;

/// One thread's sampling state. Plain data, kept in the thread's state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampler {
    /// When the current window began (0: no allocation yet).
    window_ns: u64,
    /// Bytes left to the next sample point: integers, so the countdown a hook makes
    /// for most allocations is a subtraction and a compare.
    until: i64,
    /// Allocations in the current window, and their bytes in `UNIT`s (32 bits: the
    /// state fits the hook's second cache line of the thread's state, `track`).
    count: u32,
    units: u32,
    /// Bytes between sample points on average in the current window (0: every
    /// allocation is captured).
    mean: f32,
    /// xorshift state, never 0.
    rng: u32,
}

/// What a window's bytes are counted in: any allocation counts one at least, and a
/// window holds up to 256 GiB.
const UNIT: u64 = 64;

impl Default for Sampler {
    fn default() -> Self {
        Sampler::new()
    }
}

impl Sampler {
    pub const fn new() -> Sampler {
        Sampler {
            window_ns: 0,
            until: 0,
            count: 0,
            units: 0,
            mean: 0.0,
            rng: 0x9E37_79B9,
        }
    }

    /// A sampler whose random points are its own: threads seeded apart (by their
    /// ids) make independent errors, where one seed would make threads with alike
    /// allocations err alike.
    pub const fn seeded(seed: u32) -> Sampler {
        let mut s = Sampler::new();
        // xorshift's state is never 0; a multiplicative mix spreads nearby ids.
        s.rng = seed.wrapping_mul(0x9E37_79B9) | 1;
        s
    }

    /// Whether no allocation has been seen yet (a thread's first: seed it then).
    pub fn is_fresh(&self) -> bool {
        self.window_ns == 0 && self.count == 0
    }

    /// Counts no time before `now_ns`: the next allocation continues the current
    /// window at its chance. For a benchmark's paused books (their steps must sample
    /// as a run without pauses would: a pause is not a quiet spell).
    pub fn restart(&mut self, now_ns: u64) {
        if self.window_ns != 0 {
            self.window_ns = now_ns;
        }
    }

    /// Whether the allocation of `bytes` made at `now_ns` gets its stack captured, at
    /// about `rate` captures a second (`None`: every one), and if so its weight.
    #[inline]
    pub fn take(&mut self, now_ns: u64, bytes: u64, rate: Option<u32>) -> Weight {
        let Some(rate) = rate else {
            return ONE;
        };
        let since = now_ns.wrapping_sub(self.window_ns);
        if self.window_ns == 0 || since >= WINDOW_NS || now_ns < self.window_ns {
            self.next_window(now_ns, since, rate);
        }
        self.count = self.count.saturating_add(1);
        let units = bytes.div_ceil(UNIT).min(u64::from(u32::MAX)) as u32;
        self.units = self.units.saturating_add(units);
        if self.mean.to_bits() == 0 || bytes >= ALWAYS_BYTES {
            return ONE;
        }
        // Below ALWAYS_BYTES: no overflow.
        self.until -= bytes as i64;
        if self.until > 0 {
            return NONE;
        }
        self.captured(bytes)
    }

    /// A sample point fell in this allocation of `bytes`: its weight, and the next
    /// point.
    #[cold]
    fn captured(&mut self, bytes: u64) -> Weight {
        self.until = self.next_gap();
        let p = -(-(bytes as f64) / f64::from(self.mean)).exp_m1();
        if p <= 0.0 {
            return ONE;
        }
        weight(1.0 / p)
    }

    /// Bytes to the next sample point: exponential with mean `mean`.
    fn next_gap(&mut self) -> i64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.rng = x;
        // Uniform in (0, 1]: never ln(0).
        let u = (f64::from(x) + 1.0) / (f64::from(u32::MAX) + 1.0);
        // At least one byte: a point falls in the next allocation at the earliest.
        ((-u.ln() * f64::from(self.mean)) as i64).max(1)
    }

    /// A new window from `now_ns`: its `mean` from the window that just ended (every
    /// allocation if it ended more than a window ago: a quiet spell).
    #[cold]
    fn next_window(&mut self, now_ns: u64, since: u64, rate: u32) {
        let (last, bytes) = if self.window_ns != 0 && since < 2 * WINDOW_NS {
            (u64::from(self.count), u64::from(self.units) * UNIT)
        } else {
            (0, 0)
        };
        let allowed = (u64::from(rate) * WINDOW_NS / NS_PER_S).max(1);
        let mean = if last <= allowed || bytes == 0 {
            0.0
        } else {
            // About `allowed` sample points over the last window's bytes, but at
            // least `rate` in `FLOOR_AT` allocations of its average size.
            let by_rate = bytes as f64 / allowed as f64;
            let by_floor = bytes as f64 / last as f64 * FLOOR_AT as f64 / f64::from(rate);
            by_rate.min(by_floor) as f32
        };
        if mean != self.mean {
            self.mean = mean;
            // Memoryless: a fresh gap at the new mean keeps every allocation's chance.
            self.until = if mean == 0.0 { 0 } else { self.next_gap() };
        }
        self.window_ns = now_ns.max(1);
        self.count = 0;
        self.units = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Of `n` allocations of `bytes` each, `gap_ns` apart from `start`, how many are
    /// captured.
    fn captured(s: &mut Sampler, start: u64, n: u64, gap_ns: u64, rate: Option<u32>) -> u64 {
        (0..n)
            .filter(|i| s.take(start + i * gap_ns, 4096, rate) != NONE)
            .count() as u64
    }

    #[test]
    fn below_the_rate_every_allocation_is_captured_with_weight_one() {
        let mut s = Sampler::new();
        // 500 a second for 10 s, at a rate of 1,000: all 5,000, each standing for one.
        for i in 0..5_000u64 {
            assert_eq!(s.take(1_000 + i * 2_000_000, 4096, Some(1000)), ONE);
        }
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

    /// Per class: the weighted (bytes, count) captured, the true (bytes, count), and
    /// how many were captured.
    type ClassSums = ((f64, f64), (u64, u64), u64);

    /// The weighted (bytes, count) of what `s` captures of `sizes`, made `gap_ns`
    /// apart, by class (the index `class` gives each allocation), and the truth.
    fn estimate(
        s: &mut Sampler,
        sizes: impl Iterator<Item = (usize, u64)>,
        gap_ns: u64,
        classes: usize,
    ) -> Vec<ClassSums> {
        let mut out = vec![((0.0, 0.0), (0u64, 0u64), 0u64); classes];
        for (i, (class, bytes)) in sizes.enumerate() {
            let w = s.take(1_000 + i as u64 * gap_ns, bytes, Some(DEFAULT_RATE));
            let e = &mut out[class];
            e.1.0 += bytes;
            e.1.1 += 1;
            if w != NONE {
                e.0.0 += bytes as f64 * weight_value(w);
                e.0.1 += weight_value(w);
                e.2 += 1;
            }
        }
        out
    }

    #[test]
    fn weighted_captures_estimate_every_class_s_bytes_and_count() {
        // 64 KiB temporaries with one kept 64 KiB allocation in 64 (a tensor kept per
        // step), 2 MiB segments one in 500, a 40 MiB one in 20,000: 32,000 a second
        // for 10 s at the default rate. Each class's weighted sums are within 3.5
        // standard errors (1/sqrt of its captures) of what it allocated, though only
        // ~1 in 128 of the small ones is captured.
        let mut s = Sampler::new();
        let n = 320_000usize;
        let sizes = (0..n).map(|i| {
            if i % 20_000 == 7 {
                (3, 40 << 20)
            } else if i % 500 == 3 {
                (2, 2 << 20)
            } else if i % 64 == 1 {
                (1, 64 << 10)
            } else {
                (0, 64 << 10)
            }
        });
        let got = estimate(&mut s, sizes, 31_250, 4);
        for (class, ((bytes, count), (true_bytes, true_count), n_captured)) in
            got.iter().enumerate()
        {
            let off = (bytes / *true_bytes as f64 - 1.0).abs();
            let off_n = (count / *true_count as f64 - 1.0).abs();
            let bound = 3.5 / (*n_captured as f64).sqrt();
            assert!(
                off < bound && off_n < bound,
                "class {class}: {bytes} of {true_bytes} bytes, {count} of {true_count} \
                 ({n_captured} captured)"
            );
        }
        // The chance grows with the size: the small ones are thinned to about one in
        // 128 past the first window (taken whole), a 2 MiB one many times as often, a
        // 40 MiB one almost always.
        let share = |c: &ClassSums| c.2 as f64 / c.1.1 as f64;
        assert!(share(&got[0]) < 1.0 / 32.0, "{:?}", got[0]);
        assert!(share(&got[2]) > 8.0 * share(&got[0]), "{got:?}");
        assert!(share(&got[3]) > 0.9, "{:?}", got[3]);
    }

    #[test]
    fn allocations_of_always_bytes_are_always_captured() {
        // Far past the rate, a million 4 KiB allocations a second, and one of
        // ALWAYS_BYTES every 1,000: each of those is captured, standing for itself.
        let mut s = Sampler::new();
        for i in 0..1_000_000u64 {
            let big = i % 1_000 == 999;
            let w = s.take(
                1_000 + i * 1_000,
                if big { ALWAYS_BYTES } else { 4096 },
                Some(250),
            );
            if big {
                assert_eq!(w, ONE, "allocation {i}");
            }
        }
    }

    #[test]
    fn past_the_rate_every_place_in_a_step_has_the_same_chance() {
        // A step of 64 allocations of one size, the first right after a pause: each
        // position is captured about as often as any other (the captures keep the
        // lines' proportions).
        let mut s = Sampler::new();
        let mut by_position = [0u32; 64];
        for step in 0..4_000u64 {
            for (i, hits) in by_position.iter_mut().enumerate() {
                // 5 ms of other work, then the step's allocations 10 µs apart.
                let now = 1_000 + step * 5_640_000 + i as u64 * 10_000;
                if s.take(now, 4096, Some(1000)) != NONE {
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
    fn a_restart_keeps_the_window_s_mean() {
        let mut s = Sampler::new();
        // 32,000 a second for 1 s: sampling by bytes.
        captured(&mut s, 1_000, 32_000, 31_250, Some(1000));
        let mean = s.mean;
        assert!(mean > 0.0, "{mean}");
        // A pause of 10 s, then a restart: not a quiet spell.
        s.restart(11_000_000_000);
        s.take(11_000_000_001, 4096, Some(1000));
        assert_eq!(s.mean, mean);
        // Without the restart, the pause is a quiet spell: every allocation again.
        let mut quiet = s;
        quiet.take(30_000_000_000, 4096, Some(1000));
        assert_eq!(quiet.mean, 0.0);
    }

    #[test]
    fn a_clock_that_steps_back_starts_a_window() {
        let mut s = Sampler::new();
        captured(&mut s, 5_000_000_000, 10_000, 1_000, Some(1000));
        // Backwards: a new window (after no quiet spell that it could measure: every
        // allocation), never a panic or a stuck state.
        assert_eq!(s.take(1_000, 4096, Some(1000)), ONE);
        assert_eq!(s.window_ns, 1_000);
        s.take(u64::MAX, u64::MAX, Some(u32::MAX));
    }

    #[test]
    fn a_weight_keeps_its_value_to_half_a_percent() {
        assert_eq!(weight(1.0), ONE);
        assert_eq!(weight_value(ONE), 1.0);
        assert_eq!(weight_value(NONE), 0.0);
        for w in [1.0, 1.5, 3.7, 128.0, 1234.5, 1e6, 3e9] {
            let back = weight_value(weight(w));
            assert!((back / w - 1.0).abs() < 0.005, "{w} -> {back}");
        }
        // Never NONE, never infinite.
        assert_ne!(weight(0.2), NONE);
        assert!(weight_value(weight(f64::INFINITY)).is_finite());
    }
}
