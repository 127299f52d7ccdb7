//! Phase labels (`gpuguard_push_tag("eval")` / `gpuguard_pop_tag()`): a stack per
//! thread; an allocation's site gets the innermost tag as its outermost frame,
//! `tag: eval`, so sites (and the flame graph) split by phase. A hook only reads the
//! thread's current tag id, which `track` keeps in its per-thread state (the hook
//! has it at hand); names are interned when pushed.

use std::cell::RefCell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::*};

/// A stack entry that is a tag: bit 62, with bit 63 (Python frames) clear; the low
/// bits are the tag's id. Native addresses never reach bit 47.
const TAG_BIT: usize = 1 << 62;
const PY_BIT: usize = 1 << 63;
/// Tag names are cut to this many bytes; at most this many distinct tags.
const MAX_NAME: usize = 256;
const MAX_TAGS: usize = 1 << 16;
/// A thread's tags nest at most this deep; deeper pushes are refused.
const MAX_DEPTH: usize = 64;
/// The text that starts a tag frame in a site.
pub(crate) const TAG_FRAME: &str = "tag: ";

/// Interned names; id n is `NAMES[n - 1]`.
static NAMES: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Set in a forked child whose copy of the lock was held at the fork.
static BROKEN: AtomicBool = AtomicBool::new(false);

thread_local! {
    static STACK: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's innermost tag id (0: none). Hooks read a copy that the C
/// API keeps in `track`'s per-thread state (no thread-local lookup of its own in a
/// capture); this layer stays below `track`.
#[cfg(test)]
pub(crate) fn current() -> u32 {
    STACK.with(|s| s.borrow().last().copied().unwrap_or(0))
}

/// The stack entry for tag `id`.
#[inline]
pub(crate) fn entry(id: u32) -> usize {
    TAG_BIT | id as usize
}

pub(crate) fn is_tag(entry: usize) -> bool {
    entry & (PY_BIT | TAG_BIT) == TAG_BIT
}

/// `tag: <name>` for a tag entry.
pub(crate) fn text(entry: usize) -> String {
    let id = entry & !TAG_BIT;
    let name = if BROKEN.load(Acquire) {
        None
    } else {
        NAMES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id.wrapping_sub(1))
            .cloned()
    };
    format!("{TAG_FRAME}{}", name.unwrap_or_else(|| format!("#{id}")))
}

fn intern(name: &str) -> Option<u32> {
    if BROKEN.load(Acquire) {
        return None;
    }
    let mut cut = name.len().min(MAX_NAME);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let name = &name[..cut];
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = names.iter().position(|n| n == name) {
        return Some(i as u32 + 1);
    }
    if names.len() >= MAX_TAGS {
        return None;
    }
    names.push(name.to_string());
    Some(names.len() as u32)
}

/// Pushes a tag on the calling thread: its id, now the innermost; None when refused
/// (too deep, too many distinct tags).
pub(crate) fn push(name: &str) -> Option<u32> {
    let id = intern(name)?;
    STACK
        .try_with(|s| {
            let mut s = s.borrow_mut();
            if s.len() >= MAX_DEPTH {
                return None;
            }
            s.push(id);
            Some(id)
        })
        .ok()
        .flatten()
}

/// Pops the calling thread's innermost tag: the id innermost now (0: none); None
/// when it had none.
pub(crate) fn pop() -> Option<u32> {
    STACK
        .try_with(|s| {
            let mut s = s.borrow_mut();
            s.pop()?;
            Some(s.last().copied().unwrap_or(0))
        })
        .ok()
        .flatten()
}

/// In a forked child: the names stay (the child's thread keeps its tags).
pub(crate) fn after_fork_in_child() {
    if NAMES.try_lock().is_err() {
        BROKEN.store(true, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_nest_per_thread() {
        assert_eq!(current(), 0);
        let train = push("train").unwrap();
        assert_eq!(current(), train);
        let eval = push("eval").unwrap();
        assert_eq!(current(), eval);
        assert_ne!(train, eval);
        assert!(is_tag(entry(eval)) && !is_tag(0x7fff_0000_1000) && !is_tag(PY_BIT | 5));
        assert_eq!(text(entry(eval)), "tag: eval");
        std::thread::spawn(|| assert_eq!(current(), 0))
            .join()
            .unwrap();
        assert_eq!(pop(), Some(train));
        assert_eq!(current(), train);
        assert_eq!(push("eval"), Some(eval), "one id per name");
        assert_eq!(pop(), Some(train));
        assert_eq!(pop(), Some(0));
        assert_eq!(current(), 0);
        assert_eq!(pop(), None);
    }
}
