//! Small calls into the C library that need no state of gpuguard's.

use super::hot::HOT;
use std::ffi::c_void;
use std::sync::atomic::Ordering::*;

/// Monotonic nanoseconds: every stamp gpuguard takes (records, journal entries,
/// reports' ages) comes from here, so they all compare. The journals order
/// allocations and frees of different threads by it, so it must be fine-grained
/// (a coarse tick would make a free and the reuse of its address look simultaneous)
/// and cheap: with the kernel's clock on the time-stamp counter it is the counter,
/// scaled to CLOCK_MONOTONIC at activation (`calibrate_clock`); else CLOCK_MONOTONIC.
#[inline]
pub(crate) fn monotonic_ns() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        let mult = HOT.tsc_mult.load(Acquire);
        if mult != 0 {
            // SAFETY: rdtsc has no preconditions on x86-64.
            let tsc = unsafe { core::arch::x86_64::_rdtsc() };
            let since = tsc.saturating_sub(HOT.tsc_base.load(Relaxed));
            return HOT
                .ns_base
                .load(Relaxed)
                .wrapping_add(((u128::from(since) * u128::from(mult)) >> 32) as u64);
        }
    }
    clock_ns()
}

/// CLOCK_MONOTONIC through the C library.
fn clock_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

// The counter's calibration (on the hot line, `hot`): ns = ns_base + (tsc -
// tsc_base) * tsc_mult / 2^32; tsc_mult is 0 until calibrated (and stays 0 where the
// counter is not the kernel's clock: it may then differ between CPUs).

/// Scales the time-stamp counter to CLOCK_MONOTONIC over about a millisecond, once,
/// at activation (the first CUDA call), if the kernel keeps its own clock on it.
/// Stamps taken before keep comparing with later ones: the scale is anchored to
/// the clock at the end of the measurement.
#[cold]
pub(crate) fn calibrate_clock() {
    #[cfg(target_arch = "x86_64")]
    {
        if HOT.tsc_mult.load(Acquire) != 0 {
            return;
        }
        let src = std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .unwrap_or_default();
        if src.trim() != "tsc" {
            return;
        }
        // SAFETY: rdtsc has no preconditions on x86-64.
        let tsc = || unsafe { core::arch::x86_64::_rdtsc() };
        let (t0, n0) = bracketed(clock_ns, tsc);
        while clock_ns().saturating_sub(n0) < 1_000_000 {}
        let (t1, n1) = bracketed(clock_ns, tsc);
        let (dt, dn) = (t1.saturating_sub(t0), n1.saturating_sub(n0));
        if dt == 0 {
            return;
        }
        let mult = ((u128::from(dn) << 32) / u128::from(dt)) as u64;
        HOT.tsc_base.store(t1, Relaxed);
        HOT.ns_base.store(n1, Relaxed);
        HOT.tsc_mult.store(mult.max(1), Release);
    }
}

/// A reading of the counter and the clock's time at that moment: the counter read
/// between two readings of the clock, their midpoint, from the tightest of a few
/// tries. A thread preempted between the two readings of a pair (a loaded machine)
/// would otherwise pair a counter with a clock milliseconds later: over the 1 ms
/// measurement that made the counter's scale several times too large (a cap report
/// came twice within a second of real time, in CI).
fn bracketed(mut clock: impl FnMut() -> u64, mut counter: impl FnMut() -> u64) -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..8 {
        let a = clock();
        let c = counter();
        let b = clock();
        let width = b.saturating_sub(a);
        if width < best.0 {
            best = (width, c, a + width / 2);
        }
        if width < 1_000 {
            break;
        }
    }
    (best.1, best.2)
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

/// The program's short name (`program_invocation_short_name`).
pub(crate) fn program_name() -> String {
    unsafe extern "C" {
        static program_invocation_short_name: *const std::ffi::c_char;
    }
    // SAFETY: glibc sets this before constructors run; it is a C string.
    unsafe {
        let p = program_invocation_short_name;
        if p.is_null() {
            return "unknown".into();
        }
        std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// The command line, from /proc/self/cmdline.
pub(crate) fn argv() -> Vec<String> {
    std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_counter_reading_pairs_with_the_clock_around_it_not_after_a_preemption() {
        // The clock jumps 5 ms between the counter and the second clock reading of the
        // first two tries (the thread was preempted there), then reads tight.
        let now = Cell::new(1_000_000u64);
        let calls = Cell::new(0u32);
        let clock = || {
            let n = calls.get();
            calls.set(n + 1);
            // Readings 1 and 3 (the second of each of the first two pairs) jump.
            let step = if n == 1 || n == 3 { 5_000_000 } else { 100 };
            now.set(now.get() + step);
            now.get()
        };
        let counter = || now.get() * 3;
        let (c, n) = bracketed(clock, counter);
        // The third pair: clock 11,000,300 and 11,000,400 around a counter read at
        // 11,000,300 (x3): the midpoint is 11,000,350, 50 ns from the counter's
        // moment, not milliseconds after it (the first pair's would be 2.5 ms).
        assert_eq!(c, 11_000_300 * 3);
        assert_eq!(n, 11_000_350);
    }

    #[test]
    fn without_a_tight_pair_the_tightest_is_kept() {
        let now = Cell::new(0u64);
        let calls = Cell::new(0u64);
        // Every pair is 2 µs wide but the fifth, 1.5 µs.
        let clock = || {
            let k = calls.get();
            calls.set(k + 1);
            let width = if k / 2 == 4 { 1_500 } else { 2_000 };
            now.set(now.get() + if k % 2 == 1 { width } else { 10 });
            now.get()
        };
        let (c, n) = bracketed(clock, || now.get());
        assert_eq!(n - c, 750, "the fifth pair's midpoint");
    }
}
