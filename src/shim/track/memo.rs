//! What a thread's last capture from each place found, remembered with everything
//! that capture read, so a capture that would read the same takes its site without
//! walking the stack.
//!
//! Measured on the H200 (docs/performance.md, "The stack capture's cold lines"):
//! inside PyTorch's training step the capture of an allocation's stack cost ~900 ns,
//! against ~125 ns in a tight loop. The walk is a chain of loads, each waiting for
//! the last (each native frame's learned distance, then the next return address;
//! each Python frame's link to its caller), and between two allocations the
//! framework's own work has pushed those lines out of the near caches.
//!
//! A memo is keyed by where the capture is made (its stack depth, the innermost
//! Python frame and its instruction) and holds, besides the site: the capture's
//! anchor (an address in its own frame), the return addresses the native walk read
//! with the stack addresses it read them at (`unwind::StackReads`), and the Python
//! frames it visited with what it made of each (`frames::Visits`). A later capture
//! with the same anchor reads the same stack addresses again and the same frames'
//! fields: loads whose addresses are known in advance, so they overlap instead of
//! queueing behind each other. If every value is the one remembered, the walk would
//! find the very same stack (the learned distances are a property of the return
//! addresses), and the memo's site is taken. Any difference, and the capture walks
//! as before and remembers anew: a memo never names a stack it was not made from.
//!
//! Fetching a memo's lines ahead, during the real call, was measured and dropped:
//! on the H200 it cost 135 ns before the call and saved 70 after (run 31 in
//! docs/validation.md).

use super::frames::{self, Visits};
use super::unwind::StackReads;

/// Memos a thread keeps: sets of `WAYS` by key, so a few stacks met at one key (a
/// function called from several places at one stack depth) keep a memo each.
const SLOTS: usize = 128;
const WAYS: usize = 4;
const SETS: usize = SLOTS / WAYS;
/// Stack reads a memo holds (above its anchor); a walk that read more is not
/// remembered.
const READS: usize = 28;

struct Memo {
    /// 0: empty.
    key: u64,
    site: u32,
    /// The thread's phase label when it was made (`tags`).
    tag: u32,
    /// An address in the capturing function's frame: where the stack addresses
    /// below are measured from.
    anchor: usize,
    /// The thread's Python state (0: none; then no Python frames were read).
    ts: usize,
    n: u32,
    /// Stack addresses (bytes above `anchor`) and the return addresses read there.
    at: [u32; READS],
    val: [usize; READS],
    py: Visits,
}

/// One thread's memos, for one site table (cleared with the thread's site cache),
/// and the scratch a capture notes its reads into.
pub(super) struct Memos {
    /// `SLOTS` of them, set after set.
    slots: Box<[Memo]>,
    /// Per set, the way the next new memo replaces once all are taken (in turn),
    /// and the way last found or made (checked first).
    next: [u8; SETS],
    last: [u8; SETS],
    pub(super) reads: StackReads,
    pub(super) visits: Visits,
}

/// The key of a capture about to be made: its anchor (how deep the stack is there)
/// and the innermost Python frame with its instruction (0s outside Python). Never 0.
/// Each part is multiplied by its own odd constant (its low bits then reach every
/// bit above them) and the halves folded, so any part's change moves the set
/// (`Memos::set_of`): the lines of one function, which differ only in their
/// instruction, must not all fall in one set and evict each other.
#[inline]
pub(super) fn key(anchor: usize, py: (usize, usize)) -> u64 {
    let k = (anchor as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (py.0 as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        ^ (py.1 as u64).wrapping_mul(0x1656_67B1_9E37_79F9);
    (k ^ (k >> 29)) | 1
}

impl Memo {
    /// Whether a capture anchored at `anchor`, with the Python state `ts` and the
    /// label `tag`, would find the stack this memo was made from.
    #[inline]
    fn holds(&self, anchor: usize, ts: usize, tag: u32) -> bool {
        if self.anchor != anchor || self.ts != ts || self.tag != tag {
            return false;
        }
        let n = (self.n as usize).min(READS);
        // Above the anchor, below the stack's top (checked by the walk that made
        // the memo): the live part of this thread's stack.
        let same_stack = self.at[..n].iter().zip(&self.val[..n]).all(|(&at, &val)| {
            // SAFETY: see above.
            unsafe { std::ptr::read_volatile((anchor + at as usize) as *const usize) == val }
        });
        same_stack && (ts == 0 || frames::same_walk(ts, &self.py))
    }
}

impl Memos {
    /// Memos on the heap (about 115 KiB: only threads that capture have them);
    /// `None` if the memory cannot be had (the captures then walk, as without).
    pub(super) fn boxed() -> Option<Box<Memos>> {
        let mut slots = Vec::new();
        slots.try_reserve_exact(SLOTS).ok()?;
        slots.extend((0..SLOTS).map(|_| Memo {
            key: 0,
            site: 0,
            tag: 0,
            anchor: 0,
            ts: 0,
            n: 0,
            at: [0; READS],
            val: [0; READS],
            py: Visits::new(),
        }));
        let memos = Memos {
            slots: slots.into_boxed_slice(),
            next: [0; SETS],
            last: [0; SETS],
            reads: StackReads::new(),
            visits: Visits::new(),
        };
        let layout = std::alloc::Layout::new::<Memos>();
        // SAFETY: `Memos` is not zero-sized; the allocation, if made, has its
        // layout, is written whole before the box owns it, and is freed by the box
        // (the global allocator's, as `Box::from_raw` requires).
        unsafe {
            let p = std::alloc::alloc(layout) as *mut Memos;
            if p.is_null() {
                return None;
            }
            p.write(memos);
            Some(Box::from_raw(p))
        }
    }

    #[inline]
    fn set_of(key: u64) -> usize {
        // Bits 1-5 of the key, whose bit 0 is always set.
        (key as usize >> 1) % SETS
    }

    #[inline]
    fn set(&self, key: u64) -> &[Memo] {
        let s = Self::set_of(key) * WAYS;
        &self.slots[s..s + WAYS]
    }

    /// Whether some memo is at `key` (for the debug log's counts).
    pub(super) fn has(&self, key: u64) -> bool {
        self.set(key).iter().any(|m| m.key == key)
    }

    /// The site of a memo at `key` if a capture here now (anchored at `anchor`,
    /// with the Python state `ts` and the label `tag`) would find the stack it was
    /// made from.
    #[inline]
    pub(super) fn find(&mut self, key: u64, anchor: usize, ts: usize, tag: u32) -> Option<u32> {
        let set = Self::set_of(key);
        let last = usize::from(self.last[set]) % WAYS;
        let way = (0..WAYS).map(|i| (last + i) % WAYS).find(|&w| {
            let m = &self.slots[set * WAYS + w];
            m.key == key && m.holds(anchor, ts, tag)
        })?;
        self.last[set] = way as u8;
        Some(self.slots[set * WAYS + way].site)
    }

    /// Remembers the capture just made at `key` (its reads in `self.reads` and, with
    /// a Python state `ts`, `self.visits`) and its site; false for a capture whose
    /// reads were not all noted (not remembered).
    pub(super) fn put(&mut self, key: u64, anchor: usize, ts: usize, tag: u32, site: u32) -> bool {
        if !self.reads.ok || (ts != 0 && !self.visits.ok()) {
            return false;
        }
        // Reads below the anchor are of gpuguard's own frames beneath the capturing
        // function: the same code, the same values, every time.
        let r = &self.reads;
        let above = || {
            r.at[..r.n]
                .iter()
                .zip(&r.val[..r.n])
                .filter(|(at, _)| **at > anchor)
        };
        if above().count() > READS || above().any(|(at, _)| at - anchor > u32::MAX as usize) {
            return false;
        }
        let set = Self::set_of(key);
        let ways = &mut self.slots[set * WAYS..(set + 1) * WAYS];
        let way = match ways.iter().position(|m| m.key == 0) {
            Some(w) => w,
            None => {
                let w = usize::from(self.next[set]) % WAYS;
                self.next[set] = ((w + 1) % WAYS) as u8;
                w
            }
        };
        self.last[set] = way as u8;
        let m = &mut ways[way];
        let mut n = 0;
        for (i, (&at, &val)) in above().enumerate() {
            m.at[i] = (at - anchor) as u32;
            m.val[i] = val;
            n += 1;
        }
        m.n = n as u32;
        m.anchor = anchor;
        m.ts = ts;
        m.tag = tag;
        m.site = site;
        if ts != 0 {
            m.py.clone_from(&self.visits);
        }
        m.key = key;
        true
    }

    /// Forgets every memo (the site ids of another site table).
    pub(super) fn clear(&mut self) {
        for m in self.slots.iter_mut() {
            m.key = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake stack: `words` as the memory a walk read, the anchor at its start.
    fn noted(m: &mut Memos, words: &[usize], below: usize) {
        let base = words.as_ptr() as usize;
        m.reads.n = 0;
        // A read below the anchor (gpuguard's own frame), then one per word.
        m.reads.at[0] = base - 8;
        m.reads.val[0] = below;
        for (i, w) in words.iter().enumerate() {
            m.reads.at[i + 1] = base + 8 * i;
            m.reads.val[i + 1] = *w;
        }
        m.reads.n = words.len() + 1;
        m.reads.ok = true;
    }

    #[test]
    fn a_memo_names_only_the_stack_it_read() {
        let mut m = Memos::boxed().unwrap();
        let stack = vec![0x40_1000usize, 0x40_2000, 0x40_3000, 0];
        let anchor = stack.as_ptr() as usize - 4;
        let k = key(0x7ffd_0000_1000, (0, 0));
        assert_ne!(k, 0);
        assert_eq!(m.find(k, anchor, 0, 0), None);
        noted(&mut m, &stack, 0x1234);
        m.put(k, anchor, 0, 0, 7);
        assert_eq!(m.find(k, anchor, 0, 0), Some(7));
        // Another anchor, label, Python state or key: not this memo.
        assert_eq!(m.find(k, anchor + 16, 0, 0), None);
        assert_eq!(m.find(k, anchor, 0, 3), None);
        assert_eq!(m.find(k, anchor, 0x5555_0000, 0), None);
        let other = key(0x7ffd_0000_1010, (0, 0));
        assert_eq!(m.find(other, anchor, 0, 0), None);
        // Any return address changed: another stack.
        let mut stack = stack;
        // By index: the memo reads the words through their addresses in between.
        #[allow(clippy::needless_range_loop)]
        for i in 0..stack.len() {
            stack[i] ^= 0x10;
            assert_eq!(m.find(k, anchor, 0, 0), None, "word {i}");
            stack[i] ^= 0x10;
        }
        assert_eq!(m.find(k, anchor, 0, 0), Some(7));
        m.clear();
        assert_eq!(m.find(k, anchor, 0, 0), None);
    }

    #[test]
    fn captures_not_wholly_noted_are_not_remembered() {
        let mut m = Memos::boxed().unwrap();
        let stack = vec![0x40_1000usize; 8];
        let anchor = stack.as_ptr() as usize - 8;
        let k = key(0x7ffd_0000_2000, (0, 0));
        noted(&mut m, &stack, 0);
        m.put(k, anchor, 0, 0, 1);
        assert_eq!(m.find(k, anchor, 0, 0), Some(1));
        // A full unwind (reads not noted): not remembered (the memo of the stack
        // before is kept: it still names only its own stack).
        m.reads.ok = false;
        m.put(k, anchor, 0, 0, 2);
        assert_eq!(m.find(k, anchor, 0, 0), Some(1));
        m.clear();
        // More reads above the anchor than a memo holds.
        let long = vec![0x40_1000usize; READS + 1];
        noted(&mut m, &long, 0);
        m.put(k, long.as_ptr() as usize - 8, 0, 0, 3);
        assert_eq!(m.find(k, long.as_ptr() as usize - 8, 0, 0), None);
        // A Python state whose frames were not all noted.
        noted(&mut m, &stack, 0);
        m.put(k, anchor, 0x5555_0000, 0, 4);
        assert_eq!(m.find(k, anchor, 0x5555_0000, 0), None);
    }

    #[test]
    fn a_few_stacks_at_one_key_keep_a_memo_each() {
        let mut m = Memos::boxed().unwrap();
        let k = key(0x7ffd_0000_3000, (0, 0));
        let stacks: Vec<Vec<usize>> = (0..WAYS + 1).map(|i| vec![0x40_0000 + i, 0]).collect();
        // One anchor for all: the stacks in turn at the same place.
        let mut place = vec![0usize; 2];
        let anchor = place.as_ptr() as usize - 8;
        for (i, st) in stacks.iter().enumerate().take(WAYS) {
            place.copy_from_slice(st);
            noted(&mut m, &place, 0);
            m.put(k, anchor, 0, 0, i as u32);
        }
        for (i, st) in stacks.iter().enumerate().take(WAYS) {
            place.copy_from_slice(st);
            assert_eq!(m.find(k, anchor, 0, 0), Some(i as u32));
        }
        // One more: it replaces one of them, and only its own stack names it.
        place.copy_from_slice(&stacks[WAYS]);
        noted(&mut m, &place, 0);
        m.put(k, anchor, 0, 0, 99);
        assert_eq!(m.find(k, anchor, 0, 0), Some(99));
        let kept = stacks[..WAYS]
            .iter()
            .enumerate()
            .filter(|(i, st)| {
                place.copy_from_slice(st);
                m.find(k, anchor, 0, 0) == Some(*i as u32)
            })
            .count();
        assert_eq!(kept, WAYS - 1);
    }

    #[test]
    fn the_lines_of_one_function_spread_over_the_sets() {
        // Eight allocating lines of one function (one frame, one anchor; the
        // instructions 2 to 40 bytes apart): each keeps its memo.
        let mut m = Memos::boxed().unwrap();
        let stack = vec![0x40_1000usize, 0];
        let anchor = stack.as_ptr() as usize - 8;
        let frame = 0x7f00_1234_5678usize;
        let keys: Vec<u64> = [2usize, 6, 10, 14, 20, 26, 32, 40]
            .iter()
            .map(|d| key(0x7ffd_0000_4000, (frame, frame + 0x100 + d)))
            .collect();
        for (i, k) in keys.iter().enumerate() {
            noted(&mut m, &stack, 0);
            assert!(m.put(*k, anchor, 0, 0, i as u32));
        }
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(m.find(*k, anchor, 0, 0), Some(i as u32), "line {i}");
        }
        // And so do the same line at sixteen stack depths, and sixteen frames.
        let sets = |f: &dyn Fn(usize) -> u64| {
            (0..16)
                .map(|i| Memos::set_of(f(i)))
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        };
        assert!(sets(&|i| key(0x7ffd_0000_4000 + 0x60 * i, (frame, frame + 0x100))) >= 8);
        assert!(sets(&|i| key(0x7ffd_0000_4000, (frame + 0x50 * i, frame + 0x100))) >= 8);
    }

    #[test]
    fn keys_differ_by_depth_and_by_python_position() {
        let base = key(0x7ffd_0000_2000, (0x1000, 0x1100));
        assert_ne!(base, key(0x7ffd_0000_2040, (0x1000, 0x1100)));
        assert_ne!(base, key(0x7ffd_0000_2000, (0x1000, 0x1102)));
        assert_ne!(base, key(0x7ffd_0000_2000, (0x1080, 0x1100)));
    }
}
