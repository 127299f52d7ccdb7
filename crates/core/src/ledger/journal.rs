//! Per-thread journals: what an uncapped hook writes instead of touching the shared
//! map. Measured on the H200 (docs/performance.md, "The books' cache traffic"): in a
//! real program the map insert of an allocation cost ~1 µs, because between two of
//! PyTorch's allocations its own work pushes the map's lines out of the CPU's caches
//! and the insert then waits on a chain of them (the shard, its lock, its control
//! bytes, the slot) and on the device's shared counters. A journal entry is a few
//! stores to the thread's own ring, which the CPU retires without waiting for the
//! line; the helper thread (or the thread itself, once its ring is full) applies the
//! entries to the map in time order, in a batch whose lines stay warm.
//!
//! Order across threads: an allocation is stamped after its real call returned, a
//! free before its real call; so when the driver hands an address freed by one thread
//! to another, the free's stamp is the earlier, and applying every collected entry by
//! stamp replays what happened. A free published after the allocation that reused its
//! address was applied (the freeing thread was slow to publish) finds a newer record
//! and is counted as the free of the record that allocation replaced. A free whose
//! allocation is not in the books yet is looked at once more after collecting again
//! (an allocation is published before its caller can hand the address to another
//! thread, so a second collection sees it) before it counts as unknown.

use super::{Key, Kind, Record, Space};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

/// Entries a thread's journal holds; when it is full the thread applies every
/// journal itself. The helper thread drains them well before (every 20 ms).
pub const JOURNAL_SLOTS: usize = 4096;

/// One journal entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// An allocation made; with `if_absent` recorded only when its address has no
    /// record yet (a runtime call whose driver call was not seen).
    Alloc {
        key: Key,
        rec: Record,
        if_absent: bool,
    },
    /// A free the driver accepted, stamped before its real call; `device` names the
    /// device to count it on if gpuguard never saw the allocation.
    Free { key: Key, t_ns: u64, device: i16 },
}

impl Event {
    /// The stamp entries are applied in.
    pub fn t_ns(&self) -> u64 {
        match self {
            Event::Alloc { rec, .. } => rec.t_ns,
            Event::Free { t_ns, .. } => *t_ns,
        }
    }
}

const WORDS: usize = 6;
const TAG_ALLOC: u64 = 0;
const TAG_ALLOC_IF_ABSENT: u64 = 1;
const TAG_FREE: u64 = 2;

fn encode(e: &Event) -> [u64; WORDS] {
    let (key, rec, tag) = match *e {
        Event::Alloc {
            key,
            rec,
            if_absent,
        } => (
            key,
            rec,
            if if_absent {
                TAG_ALLOC_IF_ABSENT
            } else {
                TAG_ALLOC
            },
        ),
        Event::Free { key, t_ns, device } => (
            key,
            Record {
                bytes: 0,
                ctx: 0,
                t_ns,
                site: 0,
                thread: 0,
                device,
                kind: Kind::Device,
                api: 0,
                weight: crate::sampler::ONE,
            },
            TAG_FREE,
        ),
    };
    [
        key.value,
        rec.bytes,
        rec.ctx,
        rec.t_ns,
        u64::from(rec.site) | u64::from(rec.thread) << 32,
        // The top 16 bits are the lap (`lap`); kind (7 of them), space (4) and tag
        // (3) share a byte, so the weight fits (`FITS`: no masks on this path).
        u64::from(rec.device as u16)
            | u64::from(rec.kind as u8) << 16
            | (key.space as u64) << 20
            | tag << 22
            | u64::from(rec.api) << 24
            | u64::from(rec.weight) << 32,
    ]
}

/// Kind, space and tag fit their bits of an entry's last word unmasked.
const FITS: () = assert!(
    Kind::ALL.len() <= 16 && Space::HostPtr as u64 <= 3 && TAG_FREE <= 3,
    "an entry's kind, space and tag share one byte"
);

fn decode(w: [u64; WORDS]) -> Event {
    #[allow(clippy::let_unit_value)]
    let () = FITS;
    let space = match (w[5] >> 20) & 0x3 {
        0 => Space::DevicePtr,
        1 => Space::VmmHandle,
        2 => Space::Array,
        _ => Space::HostPtr,
    };
    let key = Key { space, value: w[0] };
    let device = w[5] as u16 as i16;
    let tag = (w[5] >> 22) & 0x3;
    if tag == TAG_FREE {
        return Event::Free {
            key,
            t_ns: w[3],
            device,
        };
    }
    let kind = Kind::ALL
        .get(((w[5] >> 16) & 0xf) as usize)
        .copied()
        .unwrap_or(Kind::Device);
    Event::Alloc {
        key,
        rec: Record {
            bytes: w[1],
            ctx: w[2],
            t_ns: w[3],
            site: w[4] as u32,
            thread: (w[4] >> 32) as u32,
            device,
            kind,
            api: (w[5] >> 24) as u8,
            weight: (w[5] >> 32) as u16,
        },
        if_absent: tag == TAG_ALLOC_IF_ABSENT,
    }
}

/// The position of entries applied, alone on its cache lines: the consumer writes it
/// once a drain, and the producer reads it only when its ring looks full.
#[derive(Default)]
#[repr(align(128))]
struct Padded(AtomicU64);

/// One entry's words.
type Slot = [AtomicU64; WORDS];

/// A journal's entries: a fixed size, so where an entry goes is its index masked
/// by a constant, from the ring's address alone.
type Ring = [Slot; JOURNAL_SLOTS];

const MASK: u64 = JOURNAL_SLOTS as u64 - 1;
const LAP_SHIFT: u32 = JOURNAL_SLOTS.trailing_zeros();
/// The lap of an entry sits in the top 16 bits of its last word (`encode` leaves
/// them clear).
const LAP_BITS: u32 = 48;

/// What the last word of entry `index` carries once the entry is published: which
/// pass over the ring wrote it. A slot still holding the pass before (or the ring's
/// zeros, for the first pass, whose lap is 1) is not published yet.
fn lap(index: u64) -> u64 {
    ((index >> LAP_SHIFT).wrapping_add(1) & 0xffff) << LAP_BITS
}

/// One thread's ring of entries: written by the thread that claimed it, read under
/// the ledger's drain lock. Never freed (a ledger lives as long as its process); a
/// thread that ends gives it back for the next thread to claim.
///
/// An entry is published by its own last word, stored last with release and
/// carrying its lap: a push writes its slot and nothing else the consumer reads (no
/// shared head whose line would travel between the two threads at every drain).
pub struct Journal {
    ring: Box<Ring>,
    /// Entries applied (written only under the drain lock).
    tail: Padded,
    owned: AtomicBool,
}

/// The owner's handle on its journal, kept in the thread's state: the ring's address
/// and the write position, so a push reads no line of the journal's own structure
/// and no line the consumer writes (until the ring looks full).
#[derive(Clone, Copy)]
pub struct Producer {
    ring: Option<&'static Ring>,
    head: u64,
    tail_seen: u64,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("head", &self.head)
            .field("tail_seen", &self.tail_seen)
            .finish_non_exhaustive()
    }
}

impl Producer {
    /// A producer of no journal yet (a thread's initial state).
    pub const fn new() -> Producer {
        Producer {
            ring: None,
            head: 0,
            tail_seen: 0,
        }
    }
}

impl Default for Producer {
    fn default() -> Producer {
        Producer::new()
    }
}

impl Journal {
    pub fn new() -> Journal {
        let slots: Box<[Slot]> = (0..JOURNAL_SLOTS).map(|_| Default::default()).collect();
        let ring: Box<Ring> = slots
            .try_into()
            .unwrap_or_else(|_| unreachable!("JOURNAL_SLOTS slots were made"));
        Journal {
            ring,
            tail: Padded::default(),
            owned: AtomicBool::new(false),
        }
    }

    /// Takes the journal for the calling thread, if no thread has it. The new owner
    /// writes after what the last one published (still to be applied in its order).
    pub fn try_claim(&'static self) -> Option<Producer> {
        self.owned
            .compare_exchange(false, true, AcqRel, Relaxed)
            .ok()?;
        let tail = self.tail.0.load(Acquire);
        Some(Producer {
            ring: Some(&self.ring),
            head: tail.wrapping_add(self.published_from(tail)),
            tail_seen: tail,
        })
    }

    /// The owner ends: another thread may claim the journal (what it holds stays, to
    /// be applied in its time order).
    pub fn release(&self) {
        self.owned.store(false, Release);
    }

    /// How many entries from `tail` on are published.
    fn published_from(&self, tail: u64) -> u64 {
        let mut n = 0;
        while n < JOURNAL_SLOTS as u64 && self.published(tail.wrapping_add(n)) {
            n += 1;
        }
        n
    }

    fn published(&self, index: u64) -> bool {
        let last = self.ring[(index & MASK) as usize][WORDS - 1].load(Acquire);
        last & (0xffff << LAP_BITS) == lap(index)
    }

    /// Appends an entry; false (nothing written) when the ring is full: the owner
    /// must have it drained and push again. `p` must be this journal's producer.
    #[inline]
    pub fn push(&self, p: &mut Producer, e: &Event) -> bool {
        let Some(ring) = p.ring else {
            return false;
        };
        if p.head.wrapping_sub(p.tail_seen) >= JOURNAL_SLOTS as u64 {
            p.tail_seen = self.tail.0.load(Acquire);
            if p.head.wrapping_sub(p.tail_seen) >= JOURNAL_SLOTS as u64 {
                return false;
            }
        }
        let slot = &ring[(p.head & MASK) as usize];
        let w = encode(e);
        for (s, w) in slot[..WORDS - 1].iter().zip(w) {
            s.store(w, Relaxed);
        }
        // Published: the words above are seen by whoever sees this one.
        slot[WORDS - 1].store(w[WORDS - 1] | lap(p.head), Release);
        p.head = p.head.wrapping_add(1);
        true
    }

    /// Whether the owner's last entry completed another half of the ring: the time
    /// to ask for a drain, so a thread writing faster than the drains come does not
    /// fill its ring and have to apply it itself.
    #[inline]
    pub fn half_written(&self, p: &Producer) -> bool {
        p.head.is_multiple_of(JOURNAL_SLOTS as u64 / 2)
    }

    /// Entries published and not yet applied.
    pub fn pending(&self) -> u64 {
        self.published_from(self.tail.0.load(Acquire))
    }

    /// Moves every published entry into `out`, in the order written, each with 0
    /// (the times the drain looked at it before). Only one caller at a time (the
    /// ledger's drain lock).
    pub(super) fn take_into(&self, out: &mut Vec<(Event, u8)>) {
        let tail = self.tail.0.load(Relaxed);
        let mut i = tail;
        while i.wrapping_sub(tail) < JOURNAL_SLOTS as u64 {
            let slot = &self.ring[(i & MASK) as usize];
            let last = slot[WORDS - 1].load(Acquire);
            if last & (0xffff << LAP_BITS) != lap(i) {
                break;
            }
            let mut w = [0u64; WORDS];
            for (d, s) in w.iter_mut().zip(&slot[..WORDS - 1]) {
                *d = s.load(Relaxed);
            }
            w[WORDS - 1] = last & !(0xffff << LAP_BITS);
            out.push((decode(w), 0));
            i = i.wrapping_add(1);
        }
        // The slots read may be written again from here on.
        self.tail.0.store(i, Release);
    }
}

impl Default for Journal {
    fn default() -> Journal {
        Journal::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(addr: u64, t: u64) -> Event {
        Event::Alloc {
            key: Key::device(addr),
            rec: Record {
                bytes: 4096 + addr,
                ctx: 7,
                t_ns: t,
                site: 3,
                thread: 99,
                device: -2,
                kind: Kind::Pool,
                api: 12,
                weight: crate::sampler::ONE,
            },
            if_absent: addr % 2 == 1,
        }
    }

    #[test]
    fn entries_come_back_as_written() {
        let evs = [
            alloc(0x10, 5),
            alloc(0x11, 6),
            Event::Free {
                key: Key::host(0x20),
                t_ns: 9,
                device: 3,
            },
            Event::Alloc {
                key: Key::vmm(u64::MAX),
                rec: Record {
                    bytes: u64::MAX,
                    ctx: u64::MAX,
                    t_ns: u64::MAX,
                    site: u32::MAX,
                    thread: u32::MAX,
                    device: i16::MIN,
                    kind: Kind::Host,
                    api: u8::MAX,
                    weight: u16::MAX,
                },
                if_absent: false,
            },
            Event::Free {
                key: Key::array(1),
                t_ns: 0,
                device: -1,
            },
        ];
        for e in evs {
            assert_eq!(decode(encode(&e)), e);
        }
    }

    fn leaked() -> &'static Journal {
        Box::leak(Box::new(Journal::new()))
    }

    const N: u64 = JOURNAL_SLOTS as u64;

    #[test]
    fn a_full_ring_refuses_until_drained_and_wraps() {
        let j = leaked();
        let mut p = j.try_claim().unwrap();
        assert!(j.try_claim().is_none(), "one owner at a time");
        for i in 0..N {
            assert!(j.push(&mut p, &alloc(i, i)));
        }
        assert!(!j.push(&mut p, &alloc(9, 9)), "full");
        assert_eq!(j.pending(), N);
        let mut out = Vec::new();
        j.take_into(&mut out);
        assert_eq!(out, (0..N).map(|i| (alloc(i, i), 0)).collect::<Vec<_>>());
        assert_eq!(j.pending(), 0);
        // Past the end of the ring, in order: the slots of the first pass are not
        // taken for the second's.
        for i in 10..13 {
            assert!(j.push(&mut p, &alloc(i, i)));
        }
        assert_eq!(j.pending(), 3);
        out.clear();
        j.take_into(&mut out);
        assert_eq!(out, (10..13).map(|i| (alloc(i, i), 0)).collect::<Vec<_>>());
        j.release();
        let q = j.try_claim().expect("released");
        assert_eq!(q.head, p.head, "a new owner goes on where the last stopped");
    }

    #[test]
    fn a_new_owner_writes_after_what_the_last_one_left_unapplied() {
        let j = leaked();
        let mut p = j.try_claim().unwrap();
        let mut out = Vec::new();
        for i in 0..N + 100 {
            assert!(j.push(&mut p, &alloc(i, i)));
            if i % 1000 == 999 {
                j.take_into(&mut out);
            }
        }
        j.take_into(&mut out);
        out.clear();
        // Two entries left unapplied when the owner ends, in the ring's second pass.
        assert!(j.push(&mut p, &alloc(1, 1)));
        assert!(j.push(&mut p, &alloc(2, 2)));
        j.release();
        let mut q = j.try_claim().expect("released");
        assert_eq!(q.head, p.head);
        assert!(j.push(&mut q, &alloc(3, 3)));
        j.take_into(&mut out);
        assert_eq!(
            out.iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![alloc(1, 1), alloc(2, 2), alloc(3, 3)]
        );
    }

    #[test]
    fn the_lap_is_told_apart_after_65536_passes() {
        // The 16-bit lap of index i and of i + 65536 passes are equal: a slot is
        // only ever compared with the pass just before its own, which differs.
        for pass in [1u64, 2, 65_534, 65_535, 65_536, 65_537] {
            let i = pass * N + 17;
            assert_ne!(lap(i), lap(i - N), "pass {pass}");
            assert_eq!(lap(i) & !(0xffff << LAP_BITS), 0);
        }
        // The ring's zeros read as the pass before the first.
        assert_ne!(lap(0), 0);
        assert_eq!(
            lap(N * 65_535),
            0,
            "a pass whose lap is 0 follows lap 0xffff"
        );
    }

    #[test]
    fn each_half_of_the_ring_written_asks_for_a_drain_once() {
        let j = leaked();
        let mut p = j.try_claim().unwrap();
        let mut asked = Vec::new();
        let mut out = Vec::new();
        for i in 0..(2 * N + N / 4) {
            assert!(j.push(&mut p, &alloc(i, i)));
            if j.half_written(&p) {
                asked.push(i);
            }
            // Drained now and then, as the helper does: the asks follow the
            // entries written, not the entries waiting.
            if i % 1000 == 999 {
                j.take_into(&mut out);
            }
        }
        assert_eq!(asked, vec![N / 2 - 1, N - 1, 3 * N / 2 - 1, 2 * N - 1]);
    }

    #[test]
    fn a_consumer_on_another_thread_sees_every_entry_once() {
        let j = leaked();
        let n = 20_000u64;
        let producer = std::thread::spawn(move || {
            let mut p = j.try_claim().unwrap();
            for i in 0..n {
                while !j.push(&mut p, &alloc(i, i)) {
                    std::thread::yield_now();
                }
            }
        });
        let mut out = Vec::new();
        while (out.len() as u64) < n {
            j.take_into(&mut out);
        }
        producer.join().unwrap();
        j.take_into(&mut out);
        assert_eq!(out.len() as u64, n);
        assert!(
            out.iter()
                .enumerate()
                .all(|(i, e)| e.0 == alloc(i as u64, i as u64))
        );
    }
}
