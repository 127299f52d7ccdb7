//! Virtual memory management: which physical handles are mapped where.
//!
//! The physical memory of a `cuMemCreate` handle stays allocated until the handle is
//! released *and* its last mapping is unmapped; a common idiom releases the handle
//! right after `cuMemMap`. So a release of a mapped handle is deferred here and the
//! memory is freed at its last `cuMemUnmap`. Safe Rust; the shim feeds it.

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct HandleState {
    maps: u32,
    released: bool,
}

type Map<V> = crate::ledger::U64Map<V>;

#[derive(Default)]
pub struct VmmMaps {
    /// Mapping start address -> (handle, size).
    mappings: Map<(u64, u64)>,
    handles: Map<HandleState>,
}

impl VmmMaps {
    pub fn new() -> VmmMaps {
        VmmMaps::default()
    }

    /// `cuMemMap(va, size, 0, handle)` succeeded.
    pub fn mapped(&self, va: u64, size: u64, handle: u64) {
        if let Some((old_handle, _)) = self.mappings.insert(va, (handle, size)) {
            // The driver reused a start address we thought mapped: forget the old.
            self.drop_map(old_handle);
        }
        self.handles.entry(handle).or_default().maps += 1;
    }

    /// `cuMemUnmap(va, size)` succeeded: the mappings in the range are gone. Returns
    /// the handles whose memory is now freed (released earlier, last mapping gone).
    /// Unmapping covers whole mappings laid end to end from `va`.
    pub fn unmapped(&self, va: u64, size: u64) -> Vec<u64> {
        let mut freed = Vec::new();
        let mut at = va;
        while at < va.saturating_add(size) {
            let Some((_, (handle, len))) = self.mappings.remove(&at) else {
                break;
            };
            if self.drop_map(handle) {
                freed.push(handle);
            }
            if len == 0 {
                break;
            }
            at = at.saturating_add(len);
        }
        freed
    }

    /// One mapping of `handle` went away; true when that freed its memory.
    fn drop_map(&self, handle: u64) -> bool {
        let done = match self.handles.get_mut(&handle) {
            Some(mut s) => {
                s.maps = s.maps.saturating_sub(1);
                s.maps == 0 && s.released
            }
            None => false,
        };
        if done {
            self.handles.remove(&handle);
        }
        done
    }

    /// `cuMemRelease(handle)` succeeded. True when the handle is still mapped, so its
    /// memory lives on until the last unmap; false when it is freed now.
    pub fn released(&self, handle: u64) -> bool {
        let mapped = match self.handles.get_mut(&handle) {
            Some(mut s) if s.maps > 0 => {
                s.released = true;
                true
            }
            _ => false,
        };
        if !mapped {
            self.handles.remove(&handle);
        }
        mapped
    }

    /// Whether a release of `handle` now would be deferred.
    /// The program's `cuMemRelease` failed after `released` deferred it: the handle
    /// is not released after all.
    pub fn release_failed(&self, handle: u64) {
        if let Some(mut s) = self.handles.get_mut(&handle) {
            s.released = false;
        }
    }

    pub fn is_mapped(&self, handle: u64) -> bool {
        self.handles.get(&handle).is_some_and(|s| s.maps > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_while_mapped_frees_at_last_unmap() {
        let v = VmmMaps::new();
        v.mapped(0x1000, 0x100, 7);
        v.mapped(0x2000, 0x100, 7);
        assert!(v.released(7), "still mapped: deferred");
        assert_eq!(v.unmapped(0x1000, 0x100), Vec::<u64>::new());
        assert_eq!(v.unmapped(0x2000, 0x100), vec![7]);
        assert!(!v.is_mapped(7));
    }

    /// A release racing the last unmap: exactly one of them frees the handle (the
    /// release says "not mapped" or the unmap returns it), never neither or both.
    #[test]
    fn release_and_last_unmap_agree_on_who_frees() {
        for i in 0..2000u64 {
            let v = std::sync::Arc::new(VmmMaps::new());
            v.mapped(0x1000, 0x100, i);
            let v2 = v.clone();
            let t = std::thread::spawn(move || v2.unmapped(0x1000, 0x100) == vec![i]);
            let deferred = v.released(i);
            let unmap_freed = t.join().unwrap();
            assert_eq!(
                u8::from(!deferred) + u8::from(unmap_freed),
                1,
                "iteration {i}"
            );
        }
    }

    #[test]
    fn unmapped_then_released_frees_at_release() {
        let v = VmmMaps::new();
        v.mapped(0x1000, 0x100, 9);
        assert!(v.unmapped(0x1000, 0x100).is_empty(), "not released yet");
        assert!(!v.released(9));
    }

    #[test]
    fn one_unmap_covers_adjacent_mappings() {
        let v = VmmMaps::new();
        v.mapped(0x1000, 0x100, 1);
        v.mapped(0x1100, 0x200, 2);
        v.mapped(0x1300, 0x100, 3);
        assert!(v.released(1) && v.released(2) && v.released(3));
        let mut freed = v.unmapped(0x1000, 0x400);
        freed.sort();
        assert_eq!(freed, vec![1, 2, 3]);
    }

    #[test]
    fn unknown_handles_are_harmless() {
        let v = VmmMaps::new();
        assert!(v.unmapped(0x5000, 0x100).is_empty());
        assert!(!v.released(42));
    }
}
