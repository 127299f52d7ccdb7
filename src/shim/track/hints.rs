//! What a thread's last captures from each place found, to hide the capture's cache
//! misses behind the real call.
//!
//! Measured on the H200 (docs/performance.md, "The stack capture's cold lines"):
//! inside PyTorch's training step the capture of an allocation's stack cost ~900 ns,
//! against ~125 ns in a tight loop. The walk is a chain of loads, each waiting for
//! the last: the learned distance of each native frame, each Python frame's code
//! object, then the thread's site cache; between two allocations the framework's
//! own work has pushed all of them out of the near caches.
//!
//! So each hook, before its real call (which takes microseconds), makes a key of
//! where it is (its stack depth, the innermost Python frame and instruction) and, if
//! its thread captured from there before, asks the CPU to fetch the lines that
//! capture read; they arrive while the driver works. After the real call the capture
//! runs as before, exactly, and if it found the very stack the hint holds, takes the
//! hint's site id without the fingerprint or the site cache. A wrong hint (another
//! stack at the same key) costs some useless fetches and one comparison, never a
//! wrong site.

use super::frames;
use super::prefetch;
use super::unwind;
use std::cell::Cell;

/// Hints a thread keeps, direct-mapped by key.
const SLOTS: usize = 64;
/// Frames a hint holds; longer stacks are not hinted.
const WORDS: usize = 32;

struct Hint {
    /// 0: empty.
    key: Cell<u64>,
    site: Cell<u32>,
    n: Cell<u32>,
    words: [Cell<usize>; WORDS],
}

/// One thread's hints, for one site table (cleared with the thread's site cache).
pub(super) struct Hints {
    slots: [Hint; SLOTS],
}

/// The key of a capture about to be made: the stack depth of the hook and the
/// innermost Python frame with its instruction (0s outside Python). Never 0.
#[inline]
pub(super) fn key(sp: usize, py: (usize, usize)) -> u64 {
    let k = (sp as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (py.0 as u64)
            .rotate_left(17)
            .wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        ^ (py.1 as u64).rotate_left(41);
    k | 1
}

impl Hints {
    pub(super) const fn new() -> Hints {
        Hints {
            slots: [const {
                Hint {
                    key: Cell::new(0),
                    site: Cell::new(0),
                    n: Cell::new(0),
                    words: [const { Cell::new(0) }; WORDS],
                }
            }; SLOTS],
        }
    }

    #[inline]
    fn slot(&self, key: u64) -> &Hint {
        &self.slots[((key >> 32) as usize ^ key as usize) & (SLOTS - 1)]
    }

    /// Fetches the hint at `key` itself (an outer hook's first step: by the time the
    /// hook beneath reads it, it is near).
    #[inline]
    pub(super) fn prefetch_hint(&self, key: u64) {
        let h = self.slot(key) as *const Hint as usize;
        let size = std::mem::size_of::<Hint>();
        let mut line = h & !63;
        while line < h + size {
            prefetch(line);
            line += 64;
        }
    }

    /// Fetches what the last capture at `key` read: its frames' learned distances
    /// and code objects.
    #[inline]
    pub(super) fn prefetch(&self, key: u64) {
        let h = self.slot(key);
        if h.key.get() != key {
            return;
        }
        let n = (h.n.get() as usize).min(WORDS);
        for w in &h.words[..n] {
            let w = w.get();
            if !frames::prefetch_code(w) {
                unwind::prefetch_learned(w);
            }
        }
    }

    /// The site of `stack` if the hint at `key` holds that very stack.
    #[inline]
    pub(super) fn site(&self, key: u64, stack: &[usize]) -> Option<u32> {
        let h = self.slot(key);
        let same = h.key.get() == key
            && h.n.get() as usize == stack.len()
            && h.words.iter().zip(stack).all(|(w, s)| w.get() == *s);
        same.then(|| h.site.get())
    }

    /// Remembers the stack captured at `key` and its site.
    #[inline]
    pub(super) fn put(&self, key: u64, stack: &[usize], site: u32) {
        let h = self.slot(key);
        if stack.len() > WORDS {
            h.key.set(0);
            return;
        }
        for (w, s) in h.words.iter().zip(stack) {
            w.set(*s);
        }
        h.n.set(stack.len() as u32);
        h.site.set(site);
        h.key.set(key);
    }

    /// Forgets every hint (the site ids of another site table).
    pub(super) fn clear(&self) {
        for h in &self.slots {
            h.key.set(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_names_only_the_stack_it_holds() {
        let h = Hints::new();
        let k = key(0x7ffd_0000_1000, (0x5555_0000, 0x5555_0040));
        assert_ne!(k, 0);
        assert_eq!(h.site(k, &[1, 2, 3]), None);
        h.put(k, &[1, 2, 3], 7);
        assert_eq!(h.site(k, &[1, 2, 3]), Some(7));
        // Another stack at the same key, a prefix, a longer one: no site.
        assert_eq!(h.site(k, &[1, 2, 4]), None);
        assert_eq!(h.site(k, &[1, 2]), None);
        assert_eq!(h.site(k, &[1, 2, 3, 4]), None);
        // Another key: no site, even for the same stack.
        let other = key(0x7ffd_0000_1010, (0x5555_0000, 0x5555_0040));
        assert_ne!(other, k);
        assert_eq!(h.site(other, &[1, 2, 3]), None);
        h.clear();
        assert_eq!(h.site(k, &[1, 2, 3]), None);
    }

    #[test]
    fn stacks_too_long_to_hold_are_not_hinted() {
        let h = Hints::new();
        let k = key(8, (0, 0));
        h.put(k, &[5; 4], 1);
        let long = [9usize; WORDS + 1];
        h.put(k, &long, 2);
        assert_eq!(h.site(k, &long), None);
        assert_eq!(h.site(k, &[5; 4]), None, "the old hint at that key is gone");
        // Fetching for a dropped hint does nothing (no stale stack is fetched for).
        h.prefetch(k);
    }

    #[test]
    fn keys_differ_by_depth_and_by_python_position() {
        let base = key(0x7ffd_0000_2000, (0x1000, 0x1100));
        assert_ne!(base, key(0x7ffd_0000_2040, (0x1000, 0x1100)));
        assert_ne!(base, key(0x7ffd_0000_2000, (0x1000, 0x1102)));
        assert_ne!(base, key(0x7ffd_0000_2000, (0x1080, 0x1100)));
    }
}
