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

/// Return address -> distance to the caller's CFA, packed as `pc << 16 | distance`.
/// Direct-mapped and lock-free: a collision only costs a relearn.
const SLOTS: usize = 1 << 16;
static DISTANCES: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
/// The distance of a frame with no caller: the walk ends there.
const OUTERMOST: u64 = 0xffff;

fn slot(pc: usize) -> &'static AtomicU64 {
    let h = (pc as u64 ^ (pc as u64 >> 17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    &DISTANCES[(h >> 48) as usize & (SLOTS - 1)]
}

fn learned(pc: usize) -> Option<u64> {
    let v = slot(pc).load(Relaxed);
    (v != 0 && (v >> 16) == pc as u64).then_some(v & 0xffff)
}

fn learn(pc: usize, distance: u64) {
    // Return addresses of user space fit in 48 bits; larger frames are not kept.
    if pc as u64 >> 48 == 0 && distance > 0 && distance <= OUTERMOST {
        slot(pc).store((pc as u64) << 16 | distance, Relaxed);
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
    /// (pc, cfa) of the previous frame; pc 0 after a signal frame.
    prev: (usize, usize),
    first: bool,
}

unsafe extern "C" fn learn_entry(_start: *mut Start, _learn_fn: usize, state: *mut Learning) {
    // SAFETY: `state` is the Learning passed to `probe` by `capture`.
    let state = unsafe { &mut *state };
    unsafe { _Unwind_Backtrace(each_frame, state as *mut Learning as *mut c_void) };
    if state.prev.0 != 0 {
        learn(state.prev.0, OUTERMOST);
    }
}

unsafe extern "C" fn each_frame(ctx: *mut c_void, arg: *mut c_void) -> c_int {
    const URC_NO_REASON: c_int = 0;
    // SAFETY: `arg` is the Learning passed in `learn_entry`; `ctx` is libgcc's.
    let st = unsafe { &mut *(arg as *mut Learning) };
    let mut before: c_int = 0;
    let pc = unsafe { _Unwind_GetIPInfo(ctx, &mut before) };
    let cfa = unsafe { _Unwind_GetCFA(ctx) };
    if pc == 0 {
        return 5; // _URC_END_OF_STACK
    }
    if st.first {
        // The frame of `learn_entry` itself: it stands where `probe`'s frame stood.
        st.first = false;
        st.prev = (0, cfa);
        return URC_NO_REASON;
    }
    let prev_cfa = st.prev.1;
    if before == 0 && prev_cfa != 0 && cfa > prev_cfa {
        learn(pc, (cfa - prev_cfa) as u64);
    }
    // A signal frame's distances depend on where the signal struck: never learned.
    st.prev = if before != 0 { (0, 0) } else { (pc, cfa) };
    if !(st.skip)(pc) && st.n < st.out.len() {
        st.out[st.n] = pc;
        st.n += 1;
    }
    URC_NO_REASON
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
/// return address it has not met.
#[inline(never)]
pub(crate) fn capture(
    out: &mut [usize],
    bounds: (usize, usize),
    skip: &dyn Fn(usize) -> bool,
) -> usize {
    let mut start = Start { cfa: 0, pc: 0 };
    let mut state = Learning {
        out,
        n: 0,
        skip,
        prev: (0, 0),
        first: true,
    };
    // Without known stack bounds (or on a stack outside them, such as a signal's
    // alternate stack) every capture is a full unwind.
    if bounds.0 < bounds.1 {
        // SAFETY: probe only writes `start`.
        unsafe { probe(&mut start, 0, &mut state) };
        if let Some(n) = walk(&start, state.out, bounds, state.skip) {
            return n;
        }
    }
    let fast_pc = start.pc;
    // SAFETY: probe writes `start`, then learn_entry runs a full unwind into `state`.
    unsafe { probe(&mut start, learn_entry as *const () as usize, &mut state) };
    // This function's frame has one size at both calls of `probe`: the distance
    // measured from this call's return address holds for the first call's too.
    if fast_pc != 0
        && let Some(d) = learned(start.pc)
    {
        learn(fast_pc, d);
    }
    state.n
}

/// The fast walk; `None` at a return address not learned yet.
fn walk(
    start: &Start,
    out: &mut [usize],
    (lo, hi): (usize, usize),
    skip: &dyn Fn(usize) -> bool,
) -> Option<usize> {
    let (mut cfa, mut pc) = (start.cfa, start.pc);
    if cfa < lo || cfa > hi {
        return None;
    }
    let mut n = 0;
    while n < out.len() {
        if pc == 0 {
            return Some(n);
        }
        let distance = learned(pc)?;
        if !skip(pc) {
            out[n] = pc;
            n += 1;
        }
        if distance == OUTERMOST {
            return Some(n);
        }
        cfa += distance as usize;
        // The return address into the next frame sits just below its CFA.
        if cfa < lo + 8 || cfa > hi {
            return Some(n);
        }
        // SAFETY: cfa - 8 lies within this thread's stack (checked above).
        pc = unsafe { ((cfa - 8) as *const usize).read() };
    }
    Some(n)
}
