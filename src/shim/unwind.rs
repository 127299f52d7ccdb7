//! Stack capture that remembers what it learned.
//!
//! libgcc's DWARF unwinder looks up and interprets the unwind rules of every frame on
//! every call, about 1,500 instructions a frame. But a return address always sits in the
//! same frame of the same function, and for frames of fixed size (nearly all) the
//! distance from one frame's canonical frame address (CFA) to its caller's is a property
//! of that return address alone. So the first time a return address is met, a full DWARF
//! unwind measures that distance; afterwards the walk is a table lookup and one load a
//! frame. Every load is checked against the thread's stack bounds: a wrong distance (a
//! frame of dynamic size) can cut a stack short or misname a frame, never fault.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

unsafe extern "C" {
    fn _Unwind_Backtrace(
        trace: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
        arg: *mut c_void,
    ) -> c_int;
    fn _Unwind_GetIPInfo(ctx: *mut c_void, ip_before_insn: *mut c_int) -> usize;
    fn _Unwind_GetCFA(ctx: *mut c_void) -> usize;
}

/// Return address -> distance to the caller's CFA, packed as `pc << 16 | distance / 8`
/// (frames are 8-byte multiples; up to 512 KiB). Lock-free, in sets of two ways (one
/// 16-byte pair, never across a cache line): a direct-mapped table lost to two of
/// gpuguard's own return addresses that share a slot, in about three of four address
/// layouts of one build. Those frames are in every capture, so each capture relearned
/// one and evicted the other: every capture was a full unwind (~1.7 µs) and none was
/// remembered. A collision of three now only costs relearning.
const SLOTS: usize = 1 << 16;
const WAYS: usize = 2;
#[repr(align(16))]
struct Set([AtomicU64; WAYS]);
static DISTANCES: [Set; SLOTS / WAYS] =
    [const { Set([AtomicU64::new(0), AtomicU64::new(0)]) }; SLOTS / WAYS];
/// The distance of a frame with no caller: the walk ends there.
const OUTERMOST: u64 = 0xffff;

/// Fibonacci hashing: the product's top bits depend on every bit of `pc`.
#[inline(always)]
fn hash(pc: usize) -> u64 {
    (pc as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[inline(always)]
fn set_of(pc: usize) -> &'static Set {
    &DISTANCES[(hash(pc) >> 49) as usize & (SLOTS / WAYS - 1)]
}

fn learned(pc: usize) -> Option<u64> {
    if pc == 0 {
        return None;
    }
    let units = learned_units(pc)?;
    Some(if units == OUTERMOST {
        OUTERMOST
    } else {
        units * 8
    })
}

/// What `learned` finds for `pc`, which is not 0, in 8-byte units (`OUTERMOST` as
/// itself). An empty slot (0) never matches a `pc` that is not 0, and a stored
/// slot's units are never 0 (`learn`).
#[inline(always)]
fn learned_units(pc: usize) -> Option<u64> {
    let set = &set_of(pc).0;
    let (a, b) = (set[0].load(Relaxed), set[1].load(Relaxed));
    if (a >> 16) == pc as u64 {
        Some(a & 0xffff)
    } else if (b >> 16) == pc as u64 {
        Some(b & 0xffff)
    } else {
        None
    }
}

fn learn(pc: usize, distance: u64) {
    // Return addresses of user space fit in 48 bits.
    let units = if distance == OUTERMOST {
        OUTERMOST
    } else if distance.is_multiple_of(8) && distance / 8 < OUTERMOST {
        distance / 8
    } else {
        return;
    };
    if pc as u64 >> 48 != 0 || units == 0 {
        return;
    }
    let set = &set_of(pc).0;
    // Its own way if it has one, else an empty one, else the way a bit of its hash
    // names (so of three that collide, each evicts only sometimes the same one).
    let way = (0..WAYS)
        .find(|&w| set[w].load(Relaxed) >> 16 == pc as u64)
        .or_else(|| (0..WAYS).find(|&w| set[w].load(Relaxed) == 0))
        .unwrap_or((hash(pc) >> 48) as usize & (WAYS - 1));
    set[way].store((pc as u64) << 16 | units, Relaxed);
}

/// Captures that had to learn (full unwinds) and that walked, for `GPUGUARD_LOG=debug`.
pub(crate) static FULL_UNWINDS: AtomicU64 = AtomicU64::new(0);
pub(crate) static WALKS: AtomicU64 = AtomicU64::new(0);
/// Captures a memo answered without a walk (`track::memo`), and of those that
/// walked: with a memo at their key that no longer held, and not remembered (a
/// walk that could not note all it read), for the same log line.
pub(crate) static REMEMBERED: AtomicU64 = AtomicU64::new(0);
pub(crate) static MEMO_STALE: AtomicU64 = AtomicU64::new(0);
pub(crate) static MEMO_UNKEPT: AtomicU64 = AtomicU64::new(0);
/// Allocations left without a stack by the sampler (`GPUGUARD_STACK_RATE`).
pub(crate) static SAMPLED_OUT: AtomicU64 = AtomicU64::new(0);

/// Most return addresses a walk notes where it read them (`StackReads`).
pub(crate) const STACK_READS: usize = 32;

/// Where a fast walk read each return address, and what it found there: with the
/// table of learned distances (a property of the return addresses alone), these
/// reads decide the whole walk, so a walk that would read the same values at the
/// same addresses finds the same stack (`track::memo`). `ok` only after a fast walk
/// that noted all its reads; never after a full unwind.
pub(crate) struct StackReads {
    pub(crate) at: [usize; STACK_READS],
    pub(crate) val: [usize; STACK_READS],
    pub(crate) n: usize,
    pub(crate) ok: bool,
}

impl StackReads {
    pub(crate) const fn new() -> StackReads {
        StackReads {
            at: [0; STACK_READS],
            val: [0; STACK_READS],
            n: 0,
            ok: false,
        }
    }
}

/// Notes one read of the walk, if reads are noted.
#[inline(always)]
fn note_read(reads: &mut Option<&mut StackReads>, at: usize, val: usize) {
    if let Some(r) = reads {
        if let (Some(a), Some(v)) = (r.at.get_mut(r.n), r.val.get_mut(r.n)) {
            *a = at;
            *v = val;
        }
        r.n += 1;
    }
}

/// Where a walk starts: the CFA of `probe`'s frame and its return address.
#[repr(C)]
struct Start {
    cfa: usize,
    pc: usize,
}

/// Records its own CFA and return address into `*start`; if `learn_fn` is not null,
/// tail-jumps to it with the same arguments, so the full unwind that runs there sees
/// exactly the frames a fast walk from here would (the caller at the same return
/// address).
#[unsafe(naked)]
unsafe extern "C" fn probe(_start: *mut Start, _learn_fn: usize, _state: *mut Learning) {
    core::arch::naked_asm!(
        "lea rax, [rsp + 8]",
        "mov [rdi], rax",
        "mov rax, [rsp]",
        "mov [rdi + 8], rax",
        "test rsi, rsi",
        "jz 2f",
        "jmp rsi",
        "2:",
        "ret",
    )
}

/// State of a full unwind that also learns.
struct Learning<'a> {
    out: &'a mut [usize],
    n: usize,
    skip: &'a dyn Fn(usize) -> bool,
    /// The previous frame: (return address, CFA where it was found, signal frame).
    prev: Option<(usize, usize, bool)>,
}

unsafe extern "C" fn learn_entry(_start: *mut Start, _learn_fn: usize, state: *mut Learning) {
    // SAFETY: `state` is the Learning passed to `probe` by `capture`.
    let state = unsafe { &mut *state };
    unsafe { _Unwind_Backtrace(each_frame, state as *mut Learning as *mut c_void) };
    if let Some((ra, _, false)) = state.prev {
        learn(ra, OUTERMOST);
    }
}

/// libgcc hands each frame as (the return address into the caller, the CFA the
/// return address sits under); the caller's own CFA comes with the next frame. So a
/// return address's distance is learned one frame later.
unsafe extern "C" fn each_frame(ctx: *mut c_void, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the Learning passed in `learn_entry`; `ctx` is libgcc's.
    let st = unsafe { &mut *(arg as *mut Learning) };
    let mut before: c_int = 0;
    let ra = unsafe { _Unwind_GetIPInfo(ctx, &mut before) };
    let cfa = unsafe { _Unwind_GetCFA(ctx) };
    if ra == 0 {
        return 5; // _URC_END_OF_STACK
    }
    let signal = before != 0;
    // Around a signal frame distances depend on where the signal struck: not learned.
    if let Some((prev_ra, prev_cfa, prev_signal)) = st.prev
        && !prev_signal
        && !signal
        && cfa > prev_cfa
    {
        learn(prev_ra, (cfa - prev_cfa) as u64);
    }
    st.prev = Some((ra, cfa, signal));
    if !(st.skip)(ra) && st.n < st.out.len() {
        st.out[st.n] = ra;
        st.n += 1;
    }
    0 // _URC_NO_REASON
}

pub(crate) fn counting() -> bool {
    super::settings::counting()
}

/// This thread's stack, [lo, hi), for bounds checks.
pub(crate) fn stack_bounds() -> (usize, usize) {
    // SAFETY: pthread_getattr_np on the calling thread, with a destroyed attr after.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return (0, 0);
        }
        let mut addr: *mut c_void = std::ptr::null_mut();
        let mut size: usize = 0;
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
        libc::pthread_attr_destroy(&mut attr);
        if ok {
            (addr as usize, addr as usize + size)
        } else {
            (0, 0)
        }
    }
}

/// Fills `out` with the calling thread's return addresses, innermost first, leaving
/// out those `skip` rejects (gpuguard's own frames); returns how many. `bounds` is the
/// thread's stack. Walks from what was learned; learns, with a full unwind, on a
/// return address it has not met. Generic in `skip` so the fast walk tests it inline.
/// `reads`, if given, gets the fast walk's reads (`StackReads`).
#[inline(never)]
pub(crate) fn capture<F: Fn(usize) -> bool>(
    out: &mut [usize],
    bounds: (usize, usize),
    skip: F,
    reads: Option<&mut StackReads>,
) -> usize {
    let mut reads = reads;
    if let Some(r) = &mut reads {
        r.n = 0;
        r.ok = false;
    }
    let mut start = Start { cfa: 0, pc: 0 };
    // Without known stack bounds (or on a stack outside them, such as a signal's
    // alternate stack) every capture is a full unwind.
    if bounds.0 < bounds.1 {
        // SAFETY: probe only writes `start` (no `learn_fn`: its state is not read).
        unsafe { probe(&mut start, 0, std::ptr::null_mut()) };
        if let Some(n) = walk(&start, out, bounds, &skip, &mut reads) {
            if let Some(r) = reads {
                r.ok = r.n <= STACK_READS;
            }
            if counting() {
                WALKS.fetch_add(1, Relaxed);
            }
            return n;
        }
    }
    if counting() {
        FULL_UNWINDS.fetch_add(1, Relaxed);
    }
    let mut state = Learning {
        out,
        n: 0,
        skip: &skip,
        prev: None,
    };
    let (fast_pc, fast_cfa) = (start.pc, start.cfa);
    // SAFETY: probe writes `start`, then learn_entry runs a full unwind into `state`.
    unsafe { probe(&mut start, learn_entry as *const () as usize, &mut state) };
    // The first call of `probe` returns to another address, where this function's
    // frame may be smaller (the compiler can set the frame up late, on the slow path
    // only); but this function's CFA is one and the same: measured from the second
    // call, it gives the first call's distance.
    if fast_pc != 0
        && let Some(d) = learned(start.pc).filter(|d| *d != OUTERMOST)
    {
        let capture_cfa = start.cfa + d as usize;
        if capture_cfa > fast_cfa {
            learn(fast_pc, (capture_cfa - fast_cfa) as u64);
        }
    }
    state.n
}

/// The fast walk; `None` at a return address not learned yet.
#[inline(always)]
fn walk<F: Fn(usize) -> bool>(
    start: &Start,
    out: &mut [usize],
    (lo, hi): (usize, usize),
    skip: &F,
    reads: &mut Option<&mut StackReads>,
) -> Option<usize> {
    let (mut cfa, mut pc) = (start.cfa, start.pc);
    if cfa < lo || cfa > hi {
        return None;
    }
    if out.is_empty() {
        return Some(0);
    }
    // gpuguard's own frames are only at the top: left out, and once past them, no
    // more checks.
    loop {
        if pc == 0 {
            return Some(0);
        }
        let units = learned_units(pc)?;
        if !skip(pc) {
            return walk_kept(cfa, pc, units, out, (lo, hi), reads);
        }
        if units == OUTERMOST {
            return Some(0);
        }
        cfa += units as usize * 8;
        // The return address into the next frame sits just below its CFA.
        if cfa < lo + 8 || cfa > hi {
            return Some(0);
        }
        // SAFETY: cfa - 8 lies within this thread's stack (checked above).
        pc = unsafe { ((cfa - 8) as *const usize).read() };
        note_read(reads, cfa - 8, pc);
    }
}

/// The fast walk past gpuguard's own frames, from `pc` (not 0, its distance
/// learned: `units` of 8 bytes) at `cfa`: every frame kept. `out` is not empty.
#[inline(always)]
fn walk_kept(
    mut cfa: usize,
    mut pc: usize,
    mut units: u64,
    out: &mut [usize],
    (lo, hi): (usize, usize),
    reads: &mut Option<&mut StackReads>,
) -> Option<usize> {
    let mut n = 0;
    loop {
        out[n] = pc;
        n += 1;
        if units == OUTERMOST {
            return Some(n);
        }
        cfa += units as usize * 8;
        // The return address into the next frame sits just below its CFA.
        if cfa < lo + 8 || cfa > hi || n == out.len() {
            return Some(n);
        }
        // SAFETY: cfa - 8 lies within this thread's stack (checked above).
        pc = unsafe { ((cfa - 8) as *const usize).read() };
        note_read(reads, cfa - 8, pc);
        if pc == 0 {
            return Some(n);
        }
        units = learned_units(pc)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A return address that falls in the same set as `pc` (a search from `from`).
    fn colliding(pc: usize, from: usize) -> usize {
        let want = set_of(pc) as *const Set;
        (from..)
            .find(|&q| q != pc && std::ptr::eq(set_of(q), want))
            .expect("a collision")
    }

    #[test]
    fn two_return_addresses_of_one_set_both_stay_learned() {
        // Two of gpuguard's own frames in one set: each capture learned one and
        // evicted the other, so every capture was a full unwind.
        let a = 0x7f12_3456_7000usize;
        let b = colliding(a, 0x7f12_3450_0000);
        learn(a, 0x40);
        learn(b, 0x88);
        learn(a, 0x40);
        assert_eq!(learned(a), Some(0x40));
        assert_eq!(learned(b), Some(0x88));
        // A third one evicts one of them, never itself unlearned at once.
        let c = colliding(a, b + 1);
        learn(c, OUTERMOST);
        assert_eq!(learned(c), Some(OUTERMOST));
        assert!(learned(a).is_some() || learned(b).is_some());
    }

    #[test]
    fn a_distance_is_relearned_in_place() {
        let a = 0x7f22_0000_1234usize;
        learn(a, 0x30);
        learn(a, 0x50);
        assert_eq!(learned(a), Some(0x50));
        let set = &set_of(a).0;
        let held = set
            .iter()
            .filter(|w| w.load(Relaxed) >> 16 == a as u64)
            .count();
        assert_eq!(held, 1, "one way per return address");
    }

    #[test]
    fn distances_that_cannot_be_packed_are_not_learned() {
        let a = 0x7f33_0000_0100usize;
        learn(a, 12); // not a multiple of 8
        learn(a, 8 * OUTERMOST); // too far
        learn(1 << 50, 0x40); // not a user-space address
        assert_eq!(learned(a), None);
        assert_eq!(learned(1 << 50), None);
    }
}
