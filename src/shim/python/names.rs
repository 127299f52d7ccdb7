//! The names of the Python frames in call sites: `file:line in function`.
//!
//! When a capture makes a new call site, its code objects are alive (they are
//! running), so their names and line tables (immutable fields) are copied then, and
//! a frame is named from that copy whenever the report comes. Where no copy could be
//! made, the bridge names frames (`bridge/frames.py`, `_gg_resolve`) while their code is alive.

use super::api::lock;
use super::frames::{self, ADDR_MASK, OFFSET_MAX, PY_TAG, is_python};
use super::layout as read;
use gpuguard_core::pylines::{self, Format};
use gpuguard_core::sites::SiteTable;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};

/// A table behind a pointer, so a forked child whose copy was locked at the fork (by
/// a thread that does not exist there) gets a fresh table instead of a lock nobody
/// will release.
struct ForkSafe<T: 'static> {
    at: AtomicPtr<Mutex<Option<T>>>,
    first: Mutex<Option<T>>,
}

impl<T> ForkSafe<T> {
    const fn new() -> Self {
        ForkSafe {
            at: AtomicPtr::new(std::ptr::null_mut()),
            first: Mutex::new(None),
        }
    }

    fn get(&'static self) -> &'static Mutex<Option<T>> {
        // SAFETY: `at` is null or a leaked, never-freed table.
        unsafe { self.at.load(Acquire).as_ref() }.unwrap_or(&self.first)
    }

    /// In a forked child: a table locked at the fork is replaced; its contents are
    /// kept when it was free. Returns whether it was replaced.
    fn after_fork_in_child(&'static self) -> bool {
        let locked = self.get().try_lock().is_err();
        if locked {
            self.at
                .store(Box::into_raw(Box::new(Mutex::new(None))), Release);
        }
        locked
    }
}

/// Resolved entries: file:line in function, or None when the code was gone.
static NAMES: ForkSafe<HashMap<usize, Option<String>>> = ForkSafe::new();

fn names() -> &'static Mutex<Option<HashMap<usize, Option<String>>>> {
    NAMES.get()
}

/// In a forked child: the name table and the code copies, if locked at the fork
/// (a report reading them, a hook copying names), are replaced by empty ones.
pub(crate) fn after_fork_in_child() {
    NAMES.after_fork_in_child();
    if COPIES.after_fork_in_child() {
        // The parent's copies are gone from this process's view: the budget
        // counts what the child can still name from.
        COPIED_BYTES.store(0, Relaxed);
    }
}

/// A code object's names and line table, copied while it ran.
struct CodeCopy {
    /// (co_filename, co_name, co_linetable, co_firstlineno): another code object
    /// at the same address differs in these.
    ident: (usize, usize, usize, i32),
    file: String,
    name: String,
    first_line: i32,
    table: Vec<u8>,
    format: Format,
}

/// Copies by code object address, and the bytes they hold (bounded).
static COPIES: ForkSafe<HashMap<usize, CodeCopy>> = ForkSafe::new();
static COPIED_BYTES: AtomicUsize = AtomicUsize::new(0);
const COPY_LIMIT: usize = 32 << 20;
const TABLE_MAX: usize = 128 << 10;
const TEXT_MAX: usize = 4096;

/// A new call site was made from `stack` on this thread, inside the hook: its
/// Python frames' code objects are alive now, so their names are copied (once per
/// code object, bounded in all).
pub(crate) fn remember(stack: &[usize]) {
    if !frames::on() {
        return;
    }
    let l = frames::layout();
    if !l.names() || COPIED_BYTES.load(Relaxed) > COPY_LIMIT {
        return;
    }
    // Never waits in a hook: if a report is reading the copies right now, this
    // site's frames are named by the bridge instead.
    let Ok(mut copies) = COPIES.get().try_lock() else {
        return;
    };
    let m = copies.get_or_insert_with(HashMap::new);
    for &e in stack.iter().filter(|e| is_python(**e)) {
        let code = e & ADDR_MASK;
        // SAFETY: `code` is the code object of a frame running on this thread (its
        // type was checked by `walk`); the fields read are immutable.
        unsafe {
            let first_line =
                std::ptr::read_volatile((code + l.co_firstlineno as usize) as *const i32);
            let ident = (
                read::word(code, l.co_filename),
                read::word(code, l.co_name),
                read::word(code, l.co_linetable),
                first_line,
            );
            if m.get(&code).is_some_and(|c| c.ident == ident) {
                continue;
            }
            let name = (l.co_qualname >= 0)
                .then(|| read::string(&l, read::word(code, l.co_qualname), TEXT_MAX))
                .flatten()
                .or_else(|| read::string(&l, ident.1, TEXT_MAX));
            let (Some(file), Some(name), Some(table)) = (
                read::string(&l, ident.0, TEXT_MAX),
                name,
                read::bytes(&l, ident.2, TABLE_MAX),
            ) else {
                continue;
            };
            COPIED_BYTES.fetch_add(file.len() + name.len() + table.len() + 64, Relaxed);
            let format = if l.lines_format == 1 {
                Format::Pairs310
            } else {
                Format::Locations311
            };
            m.insert(
                code,
                CodeCopy {
                    ident,
                    file,
                    name,
                    first_line,
                    table,
                    format,
                },
            );
        }
    }
}

/// `file:line in function` from a copy of the entry's code object, if one was made.
fn copied_text(entry: usize) -> Option<String> {
    let (addr, off) = split(entry);
    let copies = lock(COPIES.get());
    let c = copies.as_ref()?.get(&addr)?;
    let line = pylines::line_at(c.format, c.first_line, &c.table, off).unwrap_or(c.first_line);
    Some(format!("{}:{line} in {}", c.file, c.name))
}

fn has_copy(entry: usize) -> bool {
    lock(COPIES.get())
        .as_ref()
        .is_some_and(|m| m.contains_key(&(entry & ADDR_MASK)))
}

fn split(entry: usize) -> (usize, usize) {
    (entry & ADDR_MASK, (entry >> 47) & OFFSET_MAX)
}

/// `file:line in function` for a resolved entry; None if not (yet) resolved.
pub(crate) fn text(entry: usize) -> Option<String> {
    copied_text(entry).or_else(|| lock(names()).as_ref()?.get(&entry).cloned().flatten())
}

/// Python entries of the sites that have not been resolved yet.
pub(crate) fn unresolved(sites: &SiteTable) -> Vec<usize> {
    if !frames::on() {
        return Vec::new();
    }
    let copied: Vec<usize> = sites
        .all()
        .iter()
        .flat_map(|s| s.iter().copied())
        .filter(|e| is_python(*e) && !has_copy(*e))
        .collect();
    let names = lock(names());
    let mut out: Vec<usize> = copied
        .into_iter()
        .filter(|e| names.as_ref().is_none_or(|m| !m.contains_key(e)))
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
