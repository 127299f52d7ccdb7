//! Reading a report without holding all of its `live[]`: a report can list a
//! million live allocations (~130 MB of JSON), while a view prints at most the first
//! few (the list is written largest first). [`from_reader_keeping`] parses the
//! document as it streams in, checks every entry of `live[]` as a
//! [`LiveAllocation`] (a malformed entry fails exactly as before), keeps only the
//! first `keep` and adds the others to `live_omitted`, so that
//! `live.len() + live_omitted` still counts every live allocation.
//!
//! How: `Report::live` deserializes through [`live`], which reads how many entries
//! to keep from a thread-local set only for the duration of
//! [`from_reader_keeping`]; everywhere else (the default) it keeps them all, as the
//! derived `Vec` would.

use crate::report::{LiveAllocation, Report};
use serde::Deserializer;
use serde::de::{SeqAccess, Visitor};
use std::cell::Cell;
use std::io::Read;

thread_local! {
    /// How many `live[]` entries the parse under way on this thread keeps.
    static KEEP: Cell<usize> = const { Cell::new(usize::MAX) };
    /// How many it dropped.
    static DROPPED: Cell<u64> = const { Cell::new(0) };
}

/// Restores the thread's setting also when the parse panics.
struct Restore(usize);

impl Drop for Restore {
    fn drop(&mut self) {
        KEEP.with(|k| k.set(self.0));
    }
}

/// Parses one report from `reader`, keeping the first `keep` entries of `live[]`
/// and counting the rest into `live_omitted`. `keep == usize::MAX` is the plain
/// `serde_json::from_reader`. The reader is read in small pieces: wrap a file in a
/// `BufReader`.
pub fn from_reader_keeping<R: Read>(reader: R, keep: usize) -> serde_json::Result<Report> {
    let _restore = Restore(KEEP.with(|k| k.replace(keep)));
    DROPPED.with(|d| d.set(0));
    let mut report: Report = serde_json::from_reader(reader)?;
    let dropped = DROPPED.with(|d| d.replace(0));
    report.live_omitted = report.live_omitted.saturating_add(dropped);
    Ok(report)
}

/// The same over bytes already in memory.
pub fn from_slice_keeping(bytes: &[u8], keep: usize) -> serde_json::Result<Report> {
    let _restore = Restore(KEEP.with(|k| k.replace(keep)));
    DROPPED.with(|d| d.set(0));
    let mut report: Report = serde_json::from_slice(bytes)?;
    let dropped = DROPPED.with(|d| d.replace(0));
    report.live_omitted = report.live_omitted.saturating_add(dropped);
    Ok(report)
}

/// `deserialize_with` of `Report::live`: the derived `Vec`'s behavior (and error
/// messages), keeping only as many entries as the thread's setting says.
pub fn live<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<LiveAllocation>, D::Error> {
    d.deserialize_seq(LiveVisitor(KEEP.with(Cell::get)))
}

struct LiveVisitor(usize);

impl<'de> Visitor<'de> for LiveVisitor {
    type Value = Vec<LiveAllocation>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // As serde's own `Vec`: a capacity from the hint, but never a large one.
        let hint = seq.size_hint().unwrap_or(0).min(4096);
        let mut kept = Vec::with_capacity(hint.min(self.0));
        let mut dropped = 0u64;
        while let Some(entry) = seq.next_element::<LiveAllocation>()? {
            if kept.len() < self.0 {
                kept.push(entry);
            } else {
                dropped += 1;
            }
        }
        if dropped > 0 {
            DROPPED.with(|d| d.set(d.get().saturating_add(dropped)));
        }
        Ok(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Hex, SCHEMA};

    fn report(n: u64, omitted: u64) -> Report {
        Report {
            schema: SCHEMA.into(),
            live: (0..n)
                .map(|i| LiveAllocation {
                    address: Hex(0x1000 + i),
                    bytes: 1000 - i,
                    kind: "device".into(),
                    api: "cuMemAlloc_v2".into(),
                    site: Some(i as u32),
                    ..Default::default()
                })
                .collect(),
            live_omitted: omitted,
            ..Default::default()
        }
    }

    #[test]
    fn keeps_the_first_entries_and_counts_the_rest() {
        let full = report(500, 7);
        let text = serde_json::to_vec(&full).unwrap();
        for keep in [0usize, 1, 10, 499, 500, 501, usize::MAX] {
            let r = from_reader_keeping(std::io::BufReader::new(&text[..]), keep).unwrap();
            let n = keep.min(500);
            assert_eq!(r.live.len(), n, "keep {keep}");
            assert!(r.live.capacity() <= 2 * n + 8, "keep {keep}");
            assert_eq!(r.live[..], full.live[..n]);
            assert_eq!(r.live.len() as u64 + r.live_omitted, 507, "keep {keep}");
            let s = from_slice_keeping(&text, keep).unwrap();
            assert_eq!(s, r);
            // All else as the plain parse.
            let mut rest = r.clone();
            rest.live = full.live.clone();
            rest.live_omitted = full.live_omitted;
            assert_eq!(rest, full);
        }
        // Outside it, all entries are kept.
        assert_eq!(serde_json::from_slice::<Report>(&text).unwrap(), full);
    }

    #[test]
    fn a_malformed_entry_fails_as_before() {
        let full = report(50, 0);
        let text = serde_json::to_string(&full)
            .unwrap()
            .replace("\"0x1028\"", "\"zz\"");
        let plain = serde_json::from_str::<Report>(&text)
            .unwrap_err()
            .to_string();
        let kept = from_slice_keeping(text.as_bytes(), 3)
            .unwrap_err()
            .to_string();
        assert_eq!(kept, plain);
        assert!(plain.contains("not a hex address"), "{plain}");
        // From a reader, the same words (serde_json may place the column one on).
        let streamed = from_reader_keeping(text.as_bytes(), 3)
            .unwrap_err()
            .to_string();
        let words = |m: &str| m.split(" at line").next().unwrap_or("").to_string();
        assert_eq!(words(&streamed), words(&plain));
        let text = serde_json::to_string(&full)
            .unwrap()
            .replace("\"live\":[", "\"live\":{\"a\":1,")
            .replace("}],\"live_omitted\"", "},\"live_omitted\"");
        let plain = serde_json::from_str::<Report>(&text)
            .unwrap_err()
            .to_string();
        let kept = from_slice_keeping(text.as_bytes(), 3)
            .unwrap_err()
            .to_string();
        assert_eq!(kept, plain);
        // The words of serde's own `Vec`.
        assert!(
            plain.contains("invalid type: map, expected a sequence"),
            "{plain}"
        );
        // The setting does not outlive the parse.
        assert_eq!(KEEP.with(Cell::get), usize::MAX);
    }
}
