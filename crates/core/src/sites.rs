//! Call sites: stacks of return addresses, interned so that identical stacks are stored
//! once and a record carries only a 32-bit id. Symbolization happens at report time,
//! elsewhere; this module only stores numbers.

use dashmap::DashMap;
use std::cell::Cell;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

/// Hashes a stack eight bytes at a time; stacks are hashed once per allocation.
#[derive(Default)]
pub struct StackHasher(u64);

impl Hasher for StackHasher {
    fn finish(&self) -> u64 {
        let x = self.0;
        x ^ (x >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
            self.0 = (self.0.rotate_left(23) ^ w).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        for b in chunks.remainder() {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
}

pub struct SiteTable {
    ids: DashMap<Box<[usize]>, u32, BuildHasherDefault<StackHasher>>,
    /// id -> frames; appended only when a new stack is seen, read at report time.
    frames: Mutex<Vec<Box<[usize]>>>,
}

impl Default for SiteTable {
    fn default() -> Self {
        Self::new()
    }
}

impl SiteTable {
    pub fn new() -> SiteTable {
        SiteTable {
            ids: DashMap::with_capacity_and_hasher_and_shard_amount(
                256,
                BuildHasherDefault::default(),
                64,
            ),
            frames: Mutex::new(Vec::new()),
        }
    }

    /// The id of this stack, creating it on first sight.
    pub fn intern(&self, stack: &[usize]) -> u32 {
        self.intern_new(stack).0
    }

    /// The id of this stack, and whether this call created it (exactly one caller
    /// sees `true` for each stack).
    pub fn intern_new(&self, stack: &[usize]) -> (u32, bool) {
        if let Some(id) = self.ids.get(stack) {
            return (*id, false);
        }
        let mut created = false;
        let id = *self.ids.entry(stack.into()).or_insert_with(|| {
            created = true;
            let mut frames = self.frames.lock().unwrap_or_else(|e| e.into_inner());
            frames.push(stack.into());
            (frames.len() - 1) as u32
        });
        (id, created)
    }

    /// The frames of every site, indexed by id.
    pub fn all(&self) -> Vec<Box<[usize]>> {
        self.frames
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    // Not inlined: valgrind's suppressions name it (tests/valgrind.supp), and the map's
    // own frames vanish when they are inlined into the caller.
    #[inline(never)]
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// A stack's fingerprint: two independent 64-bit hashes of its frames. Two different
/// stacks share one only by a 2^-128 accident, so a thread's `SiteCache` can name a
/// stack's id from it without comparing the frames.
pub fn fingerprint(stack: &[usize]) -> (u64, u64) {
    let n = stack.len() as u64;
    let (mut a, mut b) = (n, !n);
    for &w in stack {
        let w = w as u64;
        a = (a.rotate_left(23) ^ w).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        b = (b.rotate_left(37) ^ w).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    }
    (a ^ (a >> 29), b ^ (b >> 32))
}

/// Slots of a `SiteCache`.
pub const SITE_CACHE_SLOTS: usize = 256;

/// One thread's cache of the stacks it interned: fingerprint to site id, direct-mapped.
/// In PyTorch each allocation comes from a different stack than the last, and a lookup
/// in the shared table reads a chain of lines (a shard lock, its control bytes, the
/// slot, the stored frames) that the framework's own work has evicted between two
/// allocations; a hit here reads one line of the thread's own (docs/performance.md,
/// "The books' cache traffic").
pub struct SiteCache {
    slots: [Cell<(u64, u64, u32)>; SITE_CACHE_SLOTS],
}

impl Default for SiteCache {
    fn default() -> Self {
        Self::new()
    }
}

impl SiteCache {
    pub const fn new() -> SiteCache {
        SiteCache {
            slots: [const { Cell::new((0, 0, u32::MAX)) }; SITE_CACHE_SLOTS],
        }
    }

    #[inline]
    fn slot(&self, fp: (u64, u64)) -> &Cell<(u64, u64, u32)> {
        &self.slots[(fp.0 as usize) & (SITE_CACHE_SLOTS - 1)]
    }

    /// The id cached for a stack of this fingerprint.
    #[inline]
    pub fn get(&self, fp: (u64, u64)) -> Option<u32> {
        let (a, b, id) = self.slot(fp).get();
        (a == fp.0 && b == fp.1 && id != u32::MAX).then_some(id)
    }

    /// Caches an id (replacing whatever shared its slot).
    #[inline]
    pub fn put(&self, fp: (u64, u64), id: u32) {
        self.slot(fp).set((fp.0, fp.1, id));
    }

    /// Forgets every id (the ids of another site table).
    pub fn clear(&self) {
        for s in &self.slots {
            s.set((0, 0, u32::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_names_what_it_was_given_and_nothing_else() {
        let c = SiteCache::new();
        let (x, y) = (fingerprint(&[1, 2, 3]), fingerprint(&[1, 2, 4]));
        assert_ne!(x, y);
        assert_eq!(c.get(x), None);
        c.put(x, 7);
        assert_eq!(c.get(x), Some(7));
        assert_eq!(c.get(y), None);
        // Frames in another order, a prefix, an empty stack: other fingerprints.
        for other in [&[3usize, 2, 1][..], &[1, 2], &[], &[1, 2, 3, 0]] {
            assert_ne!(fingerprint(other), x, "{other:?}");
        }
        c.clear();
        assert_eq!(c.get(x), None);
    }

    #[test]
    fn fingerprints_of_many_similar_stacks_differ() {
        // Stacks as captured: return addresses near each other, differing in one or
        // two frames.
        let mut seen = std::collections::HashSet::new();
        for i in 0..20_000usize {
            let base = [
                0x7f00_1234_5000 + i % 97,
                0x5555_0000_1000 + i,
                0x7f00_2000_0000 + i / 97,
            ];
            assert!(seen.insert(fingerprint(&base)), "{i}");
            assert!(seen.insert(fingerprint(&base[..2])), "{i}");
        }
        // The slot (low bits of the first hash) spreads them too.
        let used: std::collections::HashSet<u64> = seen
            .iter()
            .map(|f| f.0 & (SITE_CACHE_SLOTS as u64 - 1))
            .collect();
        assert_eq!(used.len(), SITE_CACHE_SLOTS);
    }

    #[test]
    fn identical_stacks_share_an_id() {
        let t = SiteTable::new();
        let a = t.intern(&[1, 2, 3]);
        let b = t.intern(&[1, 2, 4]);
        assert_ne!(a, b);
        assert_eq!(t.intern(&[1, 2, 3]), a);
        assert_eq!(t.len(), 2);
        assert_eq!(&*t.all()[a as usize], &[1, 2, 3]);
        assert_eq!(&*t.all()[b as usize], &[1, 2, 4]);
    }

    #[test]
    fn concurrent_interning_is_consistent() {
        let t = std::sync::Arc::new(SiteTable::new());
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let t = t.clone();
                std::thread::spawn(move || {
                    (0..200usize)
                        .map(|i| t.intern(&[i, i + 1]))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let ids: Vec<Vec<u32>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[0] == w[1]));
        assert_eq!(t.len(), 200);
        let all = t.all();
        for (i, id) in ids[0].iter().enumerate() {
            assert_eq!(&*all[*id as usize], &[i, i + 1]);
        }
    }
}
