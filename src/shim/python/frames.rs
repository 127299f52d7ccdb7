//! The calling thread's Python frames, read by a hook without the GIL, and the
//! names of their code.
//!
//! Only the thread itself changes its frame chain, and it is inside the hook, so the
//! chain and the code objects it references hold still while it is read. Where the
//! thread state keeps it, and how frames are laid out, comes from `layout`: known
//! for the running interpreter from its first allocation on (3.10 to 3.13), else
//! measured by the bridge (`bridge/frames.py`, `_gg_calibrate`) on the main thread, which also checks a
//! known layout and turns frames off if it disagrees. Until one is confirmed,
//! nothing is read. The interpreter's own entry frames (3.12+: owned by the C
//! stack) are not frames of code and are skipped, as are frames of code it made
//! without a source (first line 0: 3.13's shim between a class call and `__init__`).
//!
//! Their names are `names`'s.

use super::api::api;
use super::layout::{self as read, Layout, builtin};
use crate::shim::settings::{LogLevel, log, settings};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::*};

/// Marks a site entry as a Python frame: bit 63, the bytecode offset in bits 47
/// to 62, the code object's address below (user addresses fit in 47 bits).
pub const PY_TAG: usize = 1 << 63;
pub(super) const ADDR_MASK: usize = (1 << 47) - 1;
pub(super) const OFFSET_MAX: usize = 0xFFFF;

/// Where frames stand: not tried yet; being set up; read; no layout known (the
/// calibration may bring one); off for good (finalizing, or a check failed).
const UNTRIED: u8 = 0;
const TRYING: u8 = 1;
const ON: u8 = 2;
const WAITING: u8 = 3;
const OFF: u8 = 4;
static STATE: AtomicU8 = AtomicU8::new(UNTRIED);
static LAYOUT: OnceLock<Layout> = OnceLock::new();
/// Set once a walk found a code object where the layout said: the layout is this
/// interpreter's. Before that, a frame that is not code turns frames off.
static CONFIRMED: AtomicBool = AtomicBool::new(false);
/// Why the interpreter's layout is not known in advance, for the log.
static NO_BUILTIN: OnceLock<&'static str> = OnceLock::new();

pub(super) fn layout() -> Layout {
    LAYOUT.get().copied().unwrap_or_default()
}

/// Frames on with `l`; a layout is published once (then frames stay on with it, or
/// go off for good).
fn publish(l: Layout) -> bool {
    let kind = walk_kind(&l);
    // A layout that does not say where a frame's code, caller or instruction is can
    // name no frame: frames stay off (no interpreter known or measured gives one).
    let ok = kind != WALK_NONE && LAYOUT.set(l).is_ok();
    if ok {
        WALK.store(kind, Relaxed);
    } else if kind == WALK_NONE {
        log(
            LogLevel::Info,
            format_args!("Python frames off: the interpreter's layout lacks a frame offset"),
        );
    }
    STATE.store(if ok { ON } else { OFF }, Release);
    ok
}

/// Which specialisation of `walk_from` reads frames with the published layout,
/// decided when it is published (before frames are on): bit 0: interpreter frames,
/// bit 1: an owner byte, bit 2: a first line. `WALK_NONE`: a layout with a negative
/// frame offset, never published.
static WALK: AtomicU8 = AtomicU8::new(WALK_NONE);
const WALK_NONE: u8 = 8;

fn walk_kind(l: &Layout) -> u8 {
    if l.ts_off < 0 || l.code_off < 0 || l.prev_off < 0 || l.instr_off < 0 {
        return WALK_NONE;
    }
    let first = l.co_firstlineno >= 0 && l.no_source_frames;
    u8::from(l.mode == 1) | u8::from(l.owner_off >= 0) << 1 | u8::from(first) << 2
}

#[derive(serde::Deserialize)]
struct Measured {
    mode: i64,
    ts_off: i64,
    ts_deref: i64,
    code_off: i64,
    prev_off: i64,
    instr_off: i64,
    base: i64,
    #[serde(default = "minus_one")]
    owner_off: i64,
}

fn minus_one() -> i64 {
    -1
}

/// The known layout, tried once Python runs (from a hook or the main thread).
fn try_builtin() -> bool {
    if !settings().cfg.python {
        let _ = STATE.compare_exchange(UNTRIED, WAITING, AcqRel, Acquire);
        return false;
    }
    let Some(a) = api() else {
        let _ = STATE.compare_exchange(UNTRIED, WAITING, AcqRel, Acquire);
        return false;
    };
    // SAFETY: reads the runtime's state; callable without the GIL.
    if unsafe { (a.is_initialized)() } == 0 {
        return false; // not yet: tried again at the next capture
    }
    if STATE
        .compare_exchange(UNTRIED, TRYING, AcqRel, Acquire)
        .is_err()
    {
        return STATE.load(Acquire) == ON;
    }
    // SAFETY: Python is initialized.
    match unsafe { builtin() } {
        Ok(l) => publish(l),
        Err(why) => {
            let _ = NO_BUILTIN.set(why);
            STATE.store(WAITING, Release);
            false
        }
    }
}

/// The layout from `_gg_calibrate`, or its reason for having none: the check of a
/// known layout, or the layout itself where none is known.
pub(super) fn set_layout(json: &str) {
    if STATE.load(Acquire) == UNTRIED {
        try_builtin();
    }
    let measured = match serde_json::from_str::<Measured>(json) {
        Ok(m) if (1..=2).contains(&m.mode) => m,
        _ => {
            if STATE.load(Acquire) == ON {
                // Nothing to check the known layout against: keep it only if the
                // hooks have already seen code where it said.
                log(
                    LogLevel::Info,
                    format_args!(
                        "Python frame layout not measured ({json}); the known one is used"
                    ),
                );
            } else {
                log(
                    LogLevel::Info,
                    format_args!("no Python frames in call sites: {json}"),
                );
            }
            return;
        }
    };
    let m = [
        measured.mode,
        measured.ts_off,
        measured.ts_deref,
        measured.code_off,
        measured.prev_off,
        measured.instr_off,
        measured.base,
        measured.owner_off,
    ];
    match STATE.load(Acquire) {
        ON => {
            let known = layout().frame_part();
            if known != m {
                STATE.store(OFF, Release);
                log(
                    LogLevel::Warn,
                    format_args!(
                        "Python frames off: the interpreter's layout {m:?} is not the known {known:?}"
                    ),
                );
            }
        }
        WAITING | UNTRIED => {
            if let Some(why) = NO_BUILTIN.get() {
                log(
                    LogLevel::Info,
                    format_args!("Python frames from the calibration ({why} in advance)"),
                );
            }
            let l = Layout {
                mode: measured.mode,
                ts_off: measured.ts_off,
                ts_deref: measured.ts_deref,
                code_off: measured.code_off,
                prev_off: measured.prev_off,
                instr_off: measured.instr_off,
                base: measured.base,
                owner_off: measured.owner_off,
                cstack: 3,
                co_filename: -1,
                co_name: -1,
                co_qualname: -1,
                co_firstlineno: -1,
                co_linetable: -1,
                // SAFETY: a lookup through glibc.
                code_type: unsafe {
                    crate::shim::real::lookup(libc::RTLD_DEFAULT, c"PyCode_Type") as i64
                },
                ..Layout::default()
            };
            if l.code_type != 0 {
                publish(l);
            }
        }
        _ => {}
    }
}

/// This thread's Python thread state, 0 when it has none or frames are not read.
#[inline]
pub(crate) fn thread_state() -> usize {
    match STATE.load(Acquire) {
        ON => {}
        UNTRIED => {
            if !try_builtin() {
                return 0;
            }
        }
        _ => return 0,
    }
    match api() {
        // SAFETY: documented as callable without the GIL; reads a thread-local.
        Some(a) => unsafe { (a.this_thread_state)() as usize },
        None => 0,
    }
}

/// Frames a walk notes (`Visits`); a walk that visits more is not noted. Room for
/// the 16 frames kept and an entry frame of the interpreter's between most of them
/// (3.12+: one per call through C, such as each `nn.Module.__call__`).
pub(crate) const VISITS: usize = 32;
/// What a walk made of a frame it skipped as the interpreter's entry frame (a code
/// object's address is 8-aligned: never this).
const SKIPPED_ENTRY: usize = 1;
/// The caller of a walk's last frame when the walk stopped with its room full,
/// before reading it (frames are 8-aligned: never this).
const NOT_READ: usize = usize::MAX;

/// The frames a walk visited and what it made of each, for a memo of the walk
/// (`track::memo`): `same_walk` tells whether a walk now would find the same.
#[derive(Clone)]
pub(crate) struct Visits {
    /// The word at the thread state's `ts_off`, where the layout dereferences it.
    holder: usize,
    /// The innermost frame (0: none).
    first: usize,
    frames: [usize; VISITS],
    /// Per frame: its entry (kept); its code's address (skipped: code without a
    /// source); `SKIPPED_ENTRY`.
    made: [usize; VISITS],
    n: usize,
    /// What the last frame's caller link held when read (`NOT_READ`: not read).
    end: usize,
    /// The walk ended in a way `same_walk` can repeat, with every frame noted.
    ok: bool,
}

impl Visits {
    pub(crate) const fn new() -> Visits {
        Visits {
            holder: 0,
            first: 0,
            frames: [0; VISITS],
            made: [0; VISITS],
            n: 0,
            end: NOT_READ,
            ok: false,
        }
    }

    pub(crate) fn ok(&self) -> bool {
        self.ok
    }

    #[inline(always)]
    fn visit(&mut self, frame: usize, made: usize) {
        if let (Some(f), Some(m)) = (self.frames.get_mut(self.n), self.made.get_mut(self.n)) {
            *f = frame;
            *m = made;
        }
        self.n += 1;
    }
}

/// Appends the Python frames of this thread's state `ts` (innermost first) to
/// `out`; returns how many. No lock, no allocation, no call into Python. `visits`,
/// if given, gets the frames visited (`Visits`).
#[inline]
pub(crate) fn walk(ts: usize, out: &mut [usize], visits: Option<&mut Visits>) -> usize {
    let mut visits = visits;
    if let Some(v) = &mut visits {
        v.ok = false;
        v.n = 0;
    }
    if out.is_empty() || ts == 0 {
        return 0;
    }
    let Some(l) = LAYOUT.get() else {
        return 0;
    };
    let kind = WALK.load(Relaxed);
    if kind == WALK_NONE {
        return 0;
    }
    // SAFETY: reads of this thread's own thread state at offsets known or measured
    // for this interpreter (`ts_off` not negative: `walk_kind`), each pointer
    // checked for null and alignment first.
    let (holder, frame) = unsafe {
        let holder = read::word(ts, l.ts_off);
        if l.ts_deref >= 0 {
            (holder, read::word(holder, l.ts_deref))
        } else {
            (holder, holder)
        }
    };
    if let Some(v) = &mut visits {
        v.holder = holder;
        v.first = frame;
    }
    // SAFETY: the offsets the specialised walks read at are not negative
    // (`walk_kind`: the frame offsets, and those its bits say).
    let n = unsafe { walk_kind_from(kind, frame, l, out, &mut visits) };
    if n > 0 && !CONFIRMED.load(Relaxed) {
        CONFIRMED.store(true, Relaxed);
    }
    n
}

/// `walk` from the innermost frame `frame`, for a layout whose frame offsets
/// (`code_off`, `prev_off`, `instr_off`) are not negative, specialised on what is
/// loop-invariant: interpreter frames (`MODE1`) or frame objects, an `owner` byte
/// (`OWNER`: `owner_off >= 0`), a first line to read (`FIRST`: `co_firstlineno >=
/// 0`). The same frames as the plain loop (`walk_plain`, in tests), in the same order; a frame pointer is
/// checked for null and alignment before anything is read through it.
///
/// # Safety
/// `l` is the published layout, with the offsets above not negative; `frame` is what
/// the thread state holds as its current frame; `out` is not empty.
/// `walk_from` specialised as `kind` (`walk_kind`) says.
///
/// # Safety
/// As `walk_from`'s, for the layout `kind` was made from.
#[inline(always)]
unsafe fn walk_kind_from(
    kind: u8,
    frame: usize,
    l: &Layout,
    out: &mut [usize],
    visits: &mut Option<&mut Visits>,
) -> usize {
    // SAFETY: per the caller.
    unsafe {
        match kind {
            7 => walk_from::<true, true, true>(frame, l, out, visits),
            3 => walk_from::<true, true, false>(frame, l, out, visits),
            5 => walk_from::<true, false, true>(frame, l, out, visits),
            1 => walk_from::<true, false, false>(frame, l, out, visits),
            6 => walk_from::<false, true, true>(frame, l, out, visits),
            2 => walk_from::<false, true, false>(frame, l, out, visits),
            4 => walk_from::<false, false, true>(frame, l, out, visits),
            _ => walk_from::<false, false, false>(frame, l, out, visits),
        }
    }
}

/// A kept frame's entry: its code and where in it the frame is.
///
/// # Safety
/// `frame` is a frame of the layout `l` (mode 1 if `MODE1`), `code` its code.
#[inline(always)]
unsafe fn entry_of<const MODE1: bool>(frame: usize, code: usize, l: &Layout) -> usize {
    let offset = if MODE1 {
        // SAFETY: per the caller.
        let instr =
            unsafe { std::ptr::read_volatile((frame + l.instr_off as usize) as *const usize) };
        instr.wrapping_sub(code).wrapping_sub(l.base as usize)
    } else {
        // SAFETY: per the caller.
        let lasti =
            unsafe { std::ptr::read_volatile((frame + l.instr_off as usize) as *const i32) };
        (lasti.max(0) as usize) * 2
    };
    PY_TAG | (offset.min(OFFSET_MAX) << 47) | code
}

#[inline(always)]
unsafe fn walk_from<const MODE1: bool, const OWNER: bool, const FIRST: bool>(
    mut frame: usize,
    l: &Layout,
    out: &mut [usize],
    visits: &mut Option<&mut Visits>,
) -> usize {
    let len = out.len();
    let out = out.as_mut_ptr();
    let (code_off, prev_off) = (l.code_off as usize, l.prev_off as usize);
    let (owner_off, cstack) = (l.owner_off as usize, l.cstack);
    let first_off = l.co_firstlineno as usize;
    let code_type = l.code_type as usize;
    let mut n = 0;
    // Frames visited, kept or skipped: at most four times the room.
    let mut budget = 4 * len;
    // How the walk ended, for `visits`: the last caller link read, or `NOT_READ`.
    let mut end = frame;
    // SAFETY: every frame pointer is checked for null and alignment before it is
    // read through, a code pointer also for the user address range, and its type
    // before anything else of it is read; `n < len` before every store.
    unsafe {
        while frame != 0 && budget != 0 {
            budget -= 1;
            if frame & 7 != 0 {
                // Not a frame: as `read::word`'s zero for a misaligned base.
                if n == 0 && !CONFIRMED.load(Relaxed) {
                    STATE.store(OFF, Release);
                }
                return n;
            }
            if OWNER
                && i64::from(std::ptr::read_volatile((frame + owner_off) as *const u8)) == cstack
            {
                // The interpreter's own entry frame: no code of the program's.
                if let Some(v) = visits {
                    v.visit(frame, SKIPPED_ENTRY);
                }
                frame = std::ptr::read_volatile((frame + prev_off) as *const usize);
                end = frame;
                continue;
            }
            let code = std::ptr::read_volatile((frame + code_off) as *const usize);
            if !code_pointer(code)
                || std::ptr::read_volatile((code + 8) as *const usize) != code_type
            {
                if n == 0 && !CONFIRMED.load(Relaxed) {
                    // Not code where the layout says: it is not this interpreter's.
                    STATE.store(OFF, Release);
                }
                return n;
            }
            if FIRST && std::ptr::read_volatile((code + first_off) as *const i32) == 0 {
                // Code the interpreter made, with no source (3.13's `__init__` shim
                // between a class call and its `__init__`): not the program's frame.
                if let Some(v) = visits {
                    v.visit(frame, code);
                }
                frame = std::ptr::read_volatile((frame + prev_off) as *const usize);
                end = frame;
                continue;
            }
            let entry = entry_of::<MODE1>(frame, code, l);
            *out.add(n) = entry;
            n += 1;
            if let Some(v) = visits {
                v.visit(frame, entry);
            }
            if n == len {
                end = NOT_READ;
                break;
            }
            frame = std::ptr::read_volatile((frame + prev_off) as *const usize);
            end = frame;
        }
    }
    if let Some(v) = visits {
        v.end = end;
        v.ok = v.n <= VISITS;
    }
    n
}

/// Whether a walk from the thread state `ts` now would visit the frames `v` noted
/// and make the same of each, so find the same entries. What the walk decided on is
/// read again, in its order, each frame only once its caller's link to it (or the
/// thread state's) was found unchanged: only live frames and their code are read.
/// Not read again: a code object's type (a live frame's code is code; the walk
/// checks it only to reject a wrong layout).
pub(crate) fn same_walk(ts: usize, v: &Visits) -> bool {
    let kind = WALK.load(Relaxed);
    if !v.ok || ts == 0 || kind == WALK_NONE {
        return false;
    }
    // What the walk's specialisation reads (`walk_kind`).
    let (mode1, owner, first) = (kind & 1 != 0, kind & 2 != 0, kind & 4 != 0);
    let Some(l) = LAYOUT.get() else {
        return false;
    };
    let (code_off, prev_off) = (l.code_off as usize, l.prev_off as usize);
    // SAFETY: the thread state is this thread's; each frame read is the one its
    // caller's link (or the thread state) holds now, checked before; each code read
    // is the one such a frame holds now, checked before (so alive, as its frame).
    unsafe {
        let mut frame = read::word(ts, l.ts_off);
        if l.ts_deref >= 0 {
            if frame != v.holder {
                return false;
            }
            frame = read::word(frame, l.ts_deref);
        }
        if frame != v.first {
            return false;
        }
        for (i, (&f, &made)) in v.frames[..v.n].iter().zip(&v.made[..v.n]).enumerate() {
            if owner {
                let byte = std::ptr::read_volatile((f + l.owner_off as usize) as *const u8);
                if (i64::from(byte) == l.cstack) != (made == SKIPPED_ENTRY) {
                    return false;
                }
            }
            if made != SKIPPED_ENTRY {
                let kept = made & PY_TAG != 0;
                let code = std::ptr::read_volatile((f + code_off) as *const usize);
                if code != if kept { made & ADDR_MASK } else { made } {
                    return false;
                }
                if first {
                    let line =
                        std::ptr::read_volatile((code + l.co_firstlineno as usize) as *const i32);
                    if (line == 0) == kept {
                        return false;
                    }
                }
                if kept {
                    let entry = if mode1 {
                        entry_of::<true>(f, code, l)
                    } else {
                        entry_of::<false>(f, code, l)
                    };
                    if entry != made {
                        return false;
                    }
                }
            }
            let link = v
                .frames
                .get(i + 1)
                .filter(|_| i + 1 < v.n)
                .copied()
                .unwrap_or(v.end);
            if link != NOT_READ && std::ptr::read_volatile((f + prev_off) as *const usize) != link {
                return false;
            }
        }
        true
    }
}

/// Whether `code` may be followed: non-null, 8-aligned, a user address (at most
/// `ADDR_MASK`). One test: rotated right by 3, the low bits go on top, so exactly
/// those addresses land in [1, ADDR_MASK >> 3].
#[inline(always)]
fn code_pointer(code: usize) -> bool {
    code.rotate_right(3).wrapping_sub(1) < ADDR_MASK >> 3
}

/// The walk as one plain loop, every read through `read::word`'s checks: the
/// reference the specialised walks are tested against.
#[cfg(test)]
fn walk_plain(ts: usize, l: &Layout, out: &mut [usize]) -> usize {
    let code_type = l.code_type as usize;
    let first_line_off = l.co_firstlineno;
    // SAFETY: reads of this thread's own thread state and frames at offsets known
    // or measured for this interpreter; every pointer is checked for null and
    // alignment before it is followed, and a code pointer's type before it is kept.
    unsafe {
        let mut frame = read::word(ts, l.ts_off);
        if l.ts_deref >= 0 {
            frame = read::word(frame, l.ts_deref);
        }
        let mut n = 0;
        let mut hops = 0;
        while frame != 0 && n < out.len() && hops < 4 * out.len() {
            hops += 1;
            if l.owner_off >= 0
                && i64::from(std::ptr::read_volatile(
                    (frame + l.owner_off as usize) as *const u8,
                )) == l.cstack
            {
                // The interpreter's own entry frame: no code of the program's.
                frame = read::word(frame, l.prev_off);
                continue;
            }
            let code = read::word(frame, l.code_off);
            if code == 0 || code & 7 != 0 || code > ADDR_MASK || read::word(code, 8) != code_type {
                if n == 0 && !CONFIRMED.load(Relaxed) {
                    // Not code where the layout says: it is not this interpreter's.
                    STATE.store(OFF, Release);
                }
                break;
            }
            if first_line_off >= 0
                && l.no_source_frames
                && std::ptr::read_volatile((code + first_line_off as usize) as *const i32) == 0
            {
                // Code the interpreter made, with no source: not the program's frame.
                frame = read::word(frame, l.prev_off);
                continue;
            }
            let offset = if l.mode == 1 {
                let instr = read::word(frame, l.instr_off);
                instr.wrapping_sub(code).wrapping_sub(l.base as usize)
            } else {
                let lasti = *((frame as isize + l.instr_off as isize) as *const i32);
                (lasti.max(0) as usize) * 2
            };
            out[n] = PY_TAG | (offset.min(OFFSET_MAX) << 47) | code;
            n += 1;
            frame = read::word(frame, l.prev_off);
        }
        if n > 0 && !CONFIRMED.load(Relaxed) {
            CONFIRMED.store(true, Relaxed);
        }
        n
    }
}

/// No more reading of Python frames (the interpreter is finalizing).
pub(super) fn stop() {
    STATE.store(OFF, Release);
}

pub(crate) fn enabled() -> bool {
    STATE.load(Relaxed) == ON
}

/// `enabled`, ordered after the layout's publication (for reading with it).
pub(super) fn on() -> bool {
    STATE.load(Acquire) == ON
}

/// This thread's innermost Python frame and where in its code it is (0s for a
/// thread that runs no Python now): part of the key of a capture's memo (see
/// `track::memo`). The same reads as the first step of `walk`.
#[inline]
pub(crate) fn innermost(ts: usize) -> (usize, usize) {
    if ts == 0 || WALK.load(Relaxed) == WALK_NONE {
        return (0, 0);
    }
    let Some(l) = LAYOUT.get() else {
        return (0, 0);
    };
    // SAFETY: the reads `walk` starts with, each base checked for null and alignment.
    unsafe {
        let mut frame = read::word(ts, l.ts_off);
        if l.ts_deref >= 0 {
            frame = read::word(frame, l.ts_deref);
        }
        (frame, read::word(frame, l.instr_off))
    }
}

pub(crate) fn is_python(entry: usize) -> bool {
    entry & PY_TAG != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_pointer_is_the_three_checks() {
        let plain = |c: usize| !(c == 0 || c & 7 != 0 || c > ADDR_MASK);
        let mut cases = vec![0, 1, 7, 8, 9, 16, ADDR_MASK, ADDR_MASK - 7, ADDR_MASK + 1];
        cases.extend([
            ADDR_MASK + 8,
            usize::MAX,
            usize::MAX - 7,
            1 << 63,
            (1 << 63) | 8,
        ]);
        cases.extend([
            0x7f12_3456_7890,
            0x7f12_3456_7891,
            0x5555_5555_0000,
            1 << 61,
        ]);
        for b in 0..64 {
            for d in [0usize, 1, 7, 8] {
                cases.push((1usize << b).wrapping_add(d));
                cases.push((1usize << b).wrapping_sub(d));
            }
        }
        for c in cases {
            assert_eq!(code_pointer(c), plain(c), "{c:#x}");
        }
    }

    /// A chain of fake frames and code objects in memory, for comparing the
    /// specialised walks with the general one (boxed: their addresses are kept
    /// while the vectors grow).
    #[allow(clippy::vec_box)]
    struct Fixture {
        frames: Vec<Box<[u64; 16]>>,
        codes: Vec<Box<[u64; 32]>>,
        ts: Box<[u64; 4]>,
    }

    static CODE_TYPE: u64 = 0;

    /// Frame kinds: a code frame, an entry frame (owner 3), a frame of code with
    /// first line 0, a frame whose code is not code, a frame with a null code.
    #[derive(Clone, Copy)]
    enum F {
        Code,
        Entry,
        NoSource,
        NotCode,
        NullCode,
    }

    impl Fixture {
        fn new(kinds: &[F], misaligned_after: Option<usize>) -> Fixture {
            let code_type = &CODE_TYPE as *const u64 as u64;
            let mut fx = Fixture {
                frames: Vec::new(),
                codes: Vec::new(),
                ts: Box::new([0; 4]),
            };
            for (i, k) in kinds.iter().enumerate() {
                let mut c = Box::new([0u64; 32]);
                c[1] = if matches!(k, F::NotCode) {
                    0x1234_5678
                } else {
                    code_type
                };
                let first = if matches!(k, F::NoSource) {
                    0
                } else {
                    10 + i as u64
                };
                c[8] = first << 32; // co_firstlineno at 68
                fx.codes.push(c);
                let mut f = Box::new([0u64; 16]);
                let code = fx.codes[i].as_ptr() as u64;
                f[0] = if matches!(k, F::NullCode) { 0 } else { code }; // code_off 0
                f[7] = code + 192 + 2 * i as u64; // instr_off 56 (mode 1)
                f[8] = if matches!(k, F::Entry) { 3 << 48 } else { 0 }; // owner at 70
                f[12] = 3 * i as u64; // f_lasti at 96 (mode 2)
                fx.frames.push(f);
            }
            for i in 0..fx.frames.len().saturating_sub(1) {
                let next = fx.frames[i + 1].as_ptr() as u64;
                fx.frames[i][1] = if misaligned_after == Some(i) {
                    next + 4
                } else {
                    next
                };
            }
            fx.ts[1] = fx.frames.first().map_or(0, |f| f.as_ptr() as u64); // ts_off 8
            fx
        }

        fn layout(&self, mode1: bool, owner: bool, first: bool) -> Layout {
            Layout {
                mode: if mode1 { 1 } else { 2 },
                ts_off: 8,
                ts_deref: -1,
                code_off: 0,
                prev_off: 8,
                instr_off: if mode1 { 56 } else { 96 },
                base: 192,
                owner_off: if owner { 70 } else { -1 },
                cstack: 3,
                co_firstlineno: if first { 68 } else { -1 },
                no_source_frames: first,
                code_type: &CODE_TYPE as *const u64 as i64,
                ..Layout::default()
            }
        }
    }

    #[test]
    fn the_specialised_walks_read_what_the_plain_loop_reads() {
        // A first frame that is not code turns frames off unless a walk confirmed
        // the layout: confirmed here, so no case changes the process's state.
        CONFIRMED.store(true, Relaxed);
        use F::*;
        let mut chains: Vec<(Vec<F>, Option<usize>)> = vec![
            (vec![Code; 20], None),
            (vec![Code; 3], None),
            (
                vec![Entry, Code, NoSource, Code, Entry, Entry, Code, NoSource],
                None,
            ),
            (
                vec![Code, Code, Code, Code, Code, NotCode, Code, Code],
                None,
            ),
            (vec![Code, Code, NullCode, Code], None),
            (vec![Code; 10], Some(3)),
            (vec![Entry, Code, Code], Some(0)),
            (vec![], None),
        ];
        // Long runs of skipped frames: the walk stops after four times its room.
        let mut long = vec![Entry; 70];
        long.extend([Code; 5]);
        chains.push((long, None));
        let mut mixed = Vec::new();
        for i in 0..80 {
            mixed.push(if i % 4 == 3 {
                Code
            } else if i % 2 == 0 {
                Entry
            } else {
                NoSource
            });
        }
        chains.push((mixed, None));
        for (kinds, mis) in &chains {
            let fx = Fixture::new(kinds, *mis);
            for bits in 0..8u8 {
                let (m, o, f) = (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0);
                let l = fx.layout(m, o, f);
                assert_eq!(walk_kind(&l), bits);
                for room in [1usize, 3, 16] {
                    let (mut a, mut b) = (vec![0usize; room], vec![0usize; room]);
                    let ts = fx.ts.as_ptr() as usize;
                    let na = walk_plain(ts, &l, &mut a);
                    let frame = fx.ts[1] as usize;
                    let mut v = Visits::new();
                    // SAFETY: the fixture's frames and code objects, at the
                    // layout's offsets.
                    let nb = unsafe { walk_kind_from(bits, frame, &l, &mut b, &mut Some(&mut v)) };
                    assert_eq!((na, &a[..na]), (nb, &b[..nb]), "bits {bits} room {room}");
                    // What the walk visited: the kept frames' entries among them.
                    if v.ok {
                        let kept: Vec<usize> = v.made[..v.n]
                            .iter()
                            .copied()
                            .filter(|m| *m & PY_TAG != 0)
                            .collect();
                        assert_eq!(kept, &b[..nb], "bits {bits} room {room}");
                    }
                    if kinds.len() == 20 {
                        assert_eq!(na, room); // the fixture is read as frames
                    }
                }
            }
        }
        let neg = Layout {
            prev_off: -1,
            ..Fixture::new(&[], None).layout(true, true, true)
        };
        assert_eq!(walk_kind(&neg), WALK_NONE);
    }

    /// The published layout for `same_walk`: the fixture's, once per test process.
    fn publish_fixture_layout(l: Layout) -> &'static Layout {
        let published = LAYOUT.get_or_init(|| l);
        WALK.store(walk_kind(published), Relaxed);
        published
    }

    #[test]
    fn a_walk_is_the_same_only_while_every_frame_it_read_is() {
        CONFIRMED.store(true, Relaxed);
        use F::*;
        // One layout for the whole test process (a OnceLock): all three bits on.
        let kinds = [Code, Entry, Code, NoSource, Code, Code];
        let mut fx = Fixture::new(&kinds, None);
        let l = *publish_fixture_layout(fx.layout(true, true, true));
        let ts = fx.ts.as_ptr() as usize;
        let walk_now = |fx: &Fixture, room: usize| {
            let mut out = vec![0usize; room];
            let mut v = Visits::new();
            let frame = fx.ts[1] as usize;
            // As `walk` notes them (the fixture's layout does not dereference).
            (v.holder, v.first) = (frame, frame);
            // SAFETY: the fixture's frames and code objects, at the layout's offsets.
            let n = unsafe { walk_kind_from(7, frame, &l, &mut out, &mut Some(&mut v)) };
            (n, v)
        };
        for room in [2usize, 16] {
            let (n, v) = walk_now(&fx, room);
            assert!(v.ok && n > 0);
            assert!(same_walk(ts, &v), "unchanged: the same walk (room {room})");
            // Each change the walk would see makes it another walk.
            let changes: [(usize, usize, u64); 5] = [
                (0, 7, 2),       // the innermost frame's instruction
                (2, 0, 8),       // a frame's code
                (1, 8, 3 << 48), // an entry frame no longer one
                (0, 1, 8),       // a caller link
                (4, 7, 2),       // an outer frame's instruction
            ];
            for (f, word, delta) in changes {
                if f >= v.n {
                    continue;
                }
                let before = fx.frames[f][word];
                fx.frames[f][word] = before ^ delta;
                let (_, again) = walk_now(&fx, room);
                let same_entries = again.made[..again.n.min(VISITS)] == v.made[..v.n]
                    && again.frames[..again.n.min(VISITS)] == v.frames[..v.n];
                assert!(!same_entries, "frame {f} word {word}: the walk changed");
                assert!(!same_walk(ts, &v), "frame {f} word {word} room {room}");
                fx.frames[f][word] = before;
            }
            // A code object that lost its source: skipped now, kept before.
            let first = fx.codes[2][8];
            fx.codes[2][8] = 0;
            assert!(!same_walk(ts, &v));
            fx.codes[2][8] = first;
            // Another innermost frame in the thread state.
            let head = fx.ts[1];
            fx.ts[1] = fx.frames[2].as_ptr() as u64;
            assert!(!same_walk(ts, &v));
            fx.ts[1] = head;
            assert!(same_walk(ts, &v));
            // No thread state: nothing the same.
            assert!(!same_walk(0, &v));
        }
        // A walk that visits more frames than noted is never the same.
        let long = Fixture::new(&[Code; VISITS + 4], None);
        let mut out = vec![0usize; VISITS + 4];
        let mut v = Visits::new();
        // SAFETY: the fixture's frames and code objects, at the layout's offsets.
        unsafe { walk_kind_from(7, long.ts[1] as usize, &l, &mut out, &mut Some(&mut v)) };
        assert!(!v.ok);
        assert!(!same_walk(long.ts.as_ptr() as usize, &v));
    }
}
