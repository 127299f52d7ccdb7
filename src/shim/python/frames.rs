//! The calling thread's Python frames, read by a hook without the GIL.
//!
//! Only the thread itself changes its frame chain, and it is inside the hook, so the
//! chain and the code objects it references hold still while it is read. Where the
//! thread state keeps it, and how frames are laid out, is measured by `bridge.py`
//! (`_gg_calibrate`) for the running interpreter and checked there before it is
//! handed over; until then (and if it failed) nothing is read.

use super::api::{api, lock};
use crate::shim::settings::{LogLevel, log};
use gpuguard_core::sites::SiteTable;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, Ordering::*};

/// Marks a site entry as a Python frame: bit 63, the bytecode offset in bits 47
/// to 62, the code object's address below (user addresses fit in 47 bits).
pub const PY_TAG: usize = 1 << 63;
const ADDR_MASK: usize = (1 << 47) - 1;
const OFFSET_MAX: usize = 0xFFFF;

static ON: AtomicBool = AtomicBool::new(false);
/// mode (1: interpreter frames, 2: frame objects), ts_off, ts_deref (-1: none),
/// code_off, prev_off, instr_off, base.
static LAYOUT: [AtomicI64; 7] = [const { AtomicI64::new(0) }; 7];
type Names = Mutex<Option<HashMap<usize, Option<String>>>>;

/// Resolved entries: file:line in function, or None when the code was gone. Behind
/// a pointer, so a forked child whose copy was locked at the fork (by a thread that
/// does not exist there) gets a fresh table instead of a lock nobody will release.
static NAMES_AT: AtomicPtr<Names> = AtomicPtr::new(std::ptr::null_mut());
static FIRST_NAMES: Names = Mutex::new(None);

fn names() -> &'static Names {
    // SAFETY: NAMES_AT is null or a leaked, never-freed table.
    unsafe { NAMES_AT.load(Acquire).as_ref() }.unwrap_or(&FIRST_NAMES)
}

/// In a forked child: a table locked at the fork is replaced (its lock would never
/// be released); its names are kept when it was free.
pub(crate) fn after_fork_in_child() {
    let locked = names().try_lock().is_err();
    if locked {
        NAMES_AT.store(Box::into_raw(Box::new(Mutex::new(None))), Release);
    }
}

#[derive(serde::Deserialize)]
struct Layout {
    mode: i64,
    ts_off: i64,
    ts_deref: i64,
    code_off: i64,
    prev_off: i64,
    instr_off: i64,
    base: i64,
}

/// The layout from `_gg_calibrate`, or its reason for having none.
pub(super) fn set_layout(json: &str) {
    match serde_json::from_str::<Layout>(json) {
        Ok(l) if (1..=2).contains(&l.mode) => {
            for (slot, v) in LAYOUT.iter().zip([
                l.mode,
                l.ts_off,
                l.ts_deref,
                l.code_off,
                l.prev_off,
                l.instr_off,
                l.base,
            ]) {
                slot.store(v, Relaxed);
            }
            ON.store(true, Release);
        }
        _ => log(
            LogLevel::Info,
            format_args!("no Python frames in call sites: {json}"),
        ),
    }
}

/// This thread's Python thread state, 0 when it has none or frames are not read.
#[inline]
pub(crate) fn thread_state() -> usize {
    if !ON.load(Acquire) {
        return 0;
    }
    match api() {
        // SAFETY: documented as callable without the GIL; reads a thread-local.
        Some(a) => unsafe { (a.this_thread_state)() as usize },
        None => 0,
    }
}

/// Appends the Python frames of this thread's state `ts` (innermost first) to
/// `out`; returns how many. No lock, no allocation, no call into Python.
#[inline]
pub(crate) fn walk(ts: usize, out: &mut [usize]) -> usize {
    if out.is_empty() || ts == 0 {
        return 0;
    }
    let l: [i64; 7] = std::array::from_fn(|i| LAYOUT[i].load(Relaxed));
    let [mode, ts_off, ts_deref, code_off, prev_off, instr_off, base] = l;
    // SAFETY: reads of this thread's own thread state and frames at offsets
    // measured and checked for this interpreter; every pointer is checked for
    // null and alignment before it is followed.
    unsafe {
        let mut frame = word(ts, ts_off);
        if ts_deref >= 0 {
            frame = word(frame, ts_deref);
        }
        let mut n = 0;
        while frame != 0 && n < out.len() {
            let code = word(frame, code_off);
            if code == 0 || code & 7 != 0 || code > ADDR_MASK {
                break;
            }
            let offset = if mode == 1 {
                let instr = word(frame, instr_off);
                instr.wrapping_sub(code).wrapping_sub(base as usize)
            } else {
                let lasti = *((frame as isize + instr_off as isize) as *const i32);
                (lasti.max(0) as usize) * 2
            };
            out[n] = PY_TAG | (offset.min(OFFSET_MAX) << 47) | code;
            n += 1;
            frame = word(frame, prev_off);
        }
        n
    }
}

/// The word at `base + off`, 0 if `base` is null or misaligned.
unsafe fn word(base: usize, off: i64) -> usize {
    if base == 0 || base & 7 != 0 {
        return 0;
    }
    // SAFETY: per the caller.
    unsafe { std::ptr::read_volatile((base as isize + off as isize) as *const usize) }
}

/// No more reading of Python frames (the interpreter is finalizing).
pub(super) fn stop() {
    ON.store(false, Release);
}

pub(crate) fn enabled() -> bool {
    ON.load(Relaxed)
}

pub(crate) fn is_python(entry: usize) -> bool {
    entry & PY_TAG != 0
}

fn split(entry: usize) -> (usize, usize) {
    (entry & ADDR_MASK, (entry >> 47) & OFFSET_MAX)
}

/// `file:line in function` for a resolved entry; None if not (yet) resolved.
pub(crate) fn text(entry: usize) -> Option<String> {
    lock(names()).as_ref()?.get(&entry).cloned().flatten()
}

/// Python entries of the sites that have not been resolved yet.
pub(crate) fn unresolved(sites: &SiteTable) -> Vec<usize> {
    if !ON.load(Acquire) {
        return Vec::new();
    }
    let names = lock(names());
    let mut out: Vec<usize> = sites
        .all()
        .iter()
        .flat_map(|s| s.iter().copied())
        .filter(|e| is_python(*e) && names.as_ref().is_none_or(|m| !m.contains_key(e)))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

pub(crate) fn pairs_json(entries: &[usize]) -> String {
    let pairs: Vec<(usize, usize)> = entries.iter().map(|e| split(*e)).collect();
    serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".into())
}

/// `_gg_resolve`'s answer: `[[address, offset, text or null], ...]`.
pub(super) fn resolved(json: &str) {
    let Ok(list) = serde_json::from_str::<Vec<(usize, usize, Option<String>)>>(json) else {
        return;
    };
    let mut names = lock(names());
    let m = names.get_or_insert_with(HashMap::new);
    for (addr, off, text) in list {
        let entry = PY_TAG | (off.min(OFFSET_MAX) << 47) | (addr & ADDR_MASK);
        // A miss is kept too: its code object is gone and will not come back,
        // and asking again would search every live function each time.
        if text.is_some() || !m.contains_key(&entry) {
            m.insert(entry, text);
        }
    }
}
