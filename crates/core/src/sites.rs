//! Call sites: stacks of return addresses, interned so that identical stacks are stored
//! once and a record carries only a 32-bit id. Symbolization happens at report time,
//! elsewhere; this module only stores numbers.

use dashmap::DashMap;
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

#[cfg(test)]
mod tests {
    use super::*;

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
