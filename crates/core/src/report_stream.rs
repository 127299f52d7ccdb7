//! Reading a report without holding all of its `live[]`: a report can list a
//! million live allocations (~130 MB of JSON), while a view prints at most the first
//! few (the list is written largest first). Every entry of `live[]` is still parsed
//! as a [`LiveAllocation`] (a malformed one fails as before); only the first `keep`
//! are kept, the others are added to `live_omitted`, so that
//! `live.len() + live_omitted` still counts every live allocation.
//!
//! - [`from_reader_spliced`] (what the command uses): the text streams through a
//!   256 KiB buffer; each `live[]` entry is parsed where it lies, the rest of the
//!   document is gathered and parsed at the end. Memory: the document less its
//!   entries; time: about that of `serde_json::from_slice` over the whole text.
//! - Strings are bounded: any string of the report longer than [`MAX_STRING_BYTES`]
//!   is cut there (at a character) and marked with `…`, by every reader here; the
//!   spliced reader drops such a string's tail as it streams in, so a report with a
//!   1 GB program name costs kilobytes. A `live[]` entry longer than
//!   [`MAX_ENTRY_BYTES`] is refused ([`Unread::Limit`]): the library writes entries
//!   of a few hundred bytes.
//! - [`from_slice_keeping`], [`from_reader_keeping`]: plain `serde_json` parses in
//!   which `Report::live` deserializes through [`live`], which reads how many
//!   entries to keep from a thread-local set only for the duration of the call;
//!   everywhere else (the default) it keeps them all, as the derived `Vec` would.

use crate::report::{LiveAllocation, Report};
use serde::Deserializer;
use serde::de::{SeqAccess, Visitor};
use std::borrow::Cow;
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
    bound_strings(&mut report);
    Ok(report)
}

/// The same over bytes already in memory.
pub fn from_slice_keeping(bytes: &[u8], keep: usize) -> serde_json::Result<Report> {
    let _restore = Restore(KEEP.with(|k| k.replace(keep)));
    DROPPED.with(|d| d.set(0));
    let mut report: Report = serde_json::from_slice(bytes)?;
    let dropped = DROPPED.with(|d| d.replace(0));
    report.live_omitted = report.live_omitted.saturating_add(dropped);
    bound_strings(&mut report);
    Ok(report)
}

/// Why [`from_reader_spliced`] returned no report.
#[derive(Debug)]
pub enum Unread {
    /// Reading failed.
    Io(std::io::Error),
    /// Not a report this reader takes in pieces: malformed or truncated (or, in
    /// theory, valid but cut where an entry's parse did not say "end of input").
    /// Read it whole to know which, and why.
    Whole,
    /// Past a stated limit (a `live[]` entry longer than [`MAX_ENTRY_BYTES`]): not
    /// a report the library wrote. Why, in words.
    Limit(String),
}

/// The longest string kept from a report, in bytes: a program name, an argument, a
/// frame. Longer ones are cut there, at a character, and end in `…`.
pub const MAX_STRING_BYTES: usize = 4 << 10;

/// The longest `live[]` entry taken, in bytes (the library's are a few hundred).
pub const MAX_ENTRY_BYTES: usize = 64 << 10;

/// Text of a string kept by the spliced reader before its tail is dropped, in
/// bytes as written: enough for [`MAX_STRING_BYTES`] + 1 bytes of text however it
/// is escaped (at most 6 written bytes, `\u00XX`, for one byte of text), so that
/// [`bound_strings`] then cuts it exactly where it cuts the string read whole.
const RAW_STRING_BYTES: usize = 6 * (MAX_STRING_BYTES + 1);

/// `s` cut to [`MAX_STRING_BYTES`] (at a character) and marked with `…`.
fn cut(s: &mut String) {
    if s.len() > MAX_STRING_BYTES {
        let mut end = MAX_STRING_BYTES;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
}

fn cut_cow(s: &mut Cow<'static, str>) {
    if s.len() > MAX_STRING_BYTES {
        let mut owned = s.to_string();
        cut(&mut owned);
        *s = Cow::Owned(owned);
    }
}

fn cut_all(v: &mut [String]) {
    v.iter_mut().for_each(cut);
}

/// Every string of `r` cut as [`cut`] says.
fn bound_strings(r: &mut Report) {
    for s in [
        &mut r.schema,
        &mut r.gpuguard_version,
        &mut r.reason,
        &mut r.program,
    ] {
        cut(s);
    }
    cut_all(&mut r.argv);
    r.host.iter_mut().for_each(cut);
    cut(&mut r.config.dir);
    for d in &mut r.devices {
        if d.by_kind.keys().any(|k| k.len() > MAX_STRING_BYTES) {
            let kinds = std::mem::take(&mut d.by_kind);
            for (mut k, b) in kinds {
                cut(&mut k);
                let e = d.by_kind.entry(k).or_default();
                *e = e.saturating_add(b);
            }
        }
    }
    for a in &mut r.live {
        cut_cow(&mut a.kind);
        cut_cow(&mut a.api);
        a.owner.iter_mut().for_each(cut);
    }
    for s in &mut r.sites {
        cut_all(&mut s.frames);
    }
    for s in &mut r.python_sites {
        cut(&mut s.framework);
        cut_all(&mut s.frames);
    }
    for c in &mut r.classification {
        cut(&mut c.framework);
        cut(&mut c.status);
        c.detail.iter_mut().for_each(cut);
    }
    if let Some(d) = &mut r.denial {
        cut(&mut d.api);
        cut_all(&mut d.frames);
    }
    if let Some(t) = &mut r.trim {
        cut(&mut t.trigger);
        cut(&mut t.python);
        for m in &mut t.mechanisms {
            cut(&mut m.name);
            cut(&mut m.status);
            m.detail.iter_mut().for_each(cut);
        }
        if let Some(d) = &mut t.deferred {
            cut(&mut d.outcome);
            cut(&mut d.detail);
        }
    }
    if let Some(e) = &mut r.ending {
        cut(&mut e.name);
    }
    if let Some(c) = &mut r.python_cost {
        for w in &mut c.windows {
            cut(&mut w.framework);
        }
    }
    if let Some(c) = &mut r.capture {
        cut(&mut c.detail);
    }
}

/// The size of the reads; an entry longer than what is left of it grows it.
const CHUNK: usize = 256 << 10;

/// Parses one report from `reader` as [`from_reader_keeping`] does, faster: the
/// entries of the top-level `live` array are parsed one by one from the text as it
/// streams in (every one checked as a [`LiveAllocation`]; the first `keep` kept),
/// while the rest of the document, with `"live":[]`, is gathered and parsed at the
/// end. Holds the document less its `live[]` entries, a read buffer and the kept
/// entries (a `live` key written with escapes is not seen: its array is then
/// parsed with the rest). Anything else not parsed that way, valid or not, is
/// [`Unread::Whole`]. A document taken is one the whole parse takes, read the
/// same; the one exception, in theory: an entry nested within 2 levels of
/// `serde_json`'s nesting limit (128), which counts here from the entry.
pub fn from_reader_spliced<R: Read>(mut reader: R, keep: usize) -> Result<Report, Unread> {
    let mut s = Splicer {
        keep,
        ..Splicer::default()
    };
    let mut buf = vec![0u8; CHUNK];
    let (mut pos, mut end, mut eof) = (0, 0, false);
    loop {
        if pos == end {
            (pos, end) = (0, read_some(&mut reader, &mut buf)?);
            if end == 0 {
                break;
            }
        }
        let b = buf[pos];
        if s.mode == Mode::Outer {
            s.outer_byte(b);
            pos += 1;
            continue;
        }
        if !matches!((b, &s.mode), (b'{' | b'[', Mode::Start | Mode::AfterComma)) {
            s.between(b)?;
            pos += 1;
            continue;
        }
        // An entry: parsed where it lies; one cut by the end of the buffer again
        // after more is read.
        loop {
            let mut entries =
                serde_json::Deserializer::from_slice(&buf[pos..end]).into_iter::<LiveAllocation>();
            match entries.next() {
                Some(Ok(_)) if entries.byte_offset() > MAX_ENTRY_BYTES => {
                    return Err(entry_too_long());
                }
                Some(Ok(entry)) => {
                    pos += entries.byte_offset();
                    s.take(entry);
                    break;
                }
                Some(Err(e)) if e.is_eof() && !eof => {
                    buf.copy_within(pos..end, 0);
                    (pos, end) = (0, end - pos);
                    if end > MAX_ENTRY_BYTES {
                        // Growing the buffer for it would hold a file's worth.
                        return Err(entry_too_long());
                    }
                    if end == buf.len() {
                        buf.resize(buf.len() * 2, 0);
                    }
                    let n = read_some(&mut reader, &mut buf[end..])?;
                    eof = n == 0;
                    end += n;
                }
                _ => return Err(Unread::Whole),
            }
        }
    }
    s.finish()
}

fn entry_too_long() -> Unread {
    Unread::Limit(format!(
        "a live[] entry longer than {} KiB; not a report gpuguard wrote",
        MAX_ENTRY_BYTES >> 10
    ))
}

/// One read, retried when interrupted.
fn read_some<R: Read>(reader: &mut R, buf: &mut [u8]) -> Result<usize, Unread> {
    loop {
        match reader.read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Unread::Io(e)),
        }
    }
}

/// Where the splicer is in the text.
#[derive(Default, PartialEq)]
enum Mode {
    /// Outside `live[]`: the text goes to `outer`.
    #[default]
    Outer,
    /// Inside `live[]`, between entries: before the first, after an entry, after
    /// a comma.
    Start,
    AfterEntry,
    AfterComma,
}

#[derive(Default)]
struct Splicer {
    keep: usize,
    mode: Mode,
    /// The document less the entries of `live[]`.
    outer: Vec<u8>,
    /// Nesting depth in `outer`; inside a string; after a backslash in one.
    depth: usize,
    in_str: bool,
    esc: bool,
    /// Where the content of the string under way starts in `outer`, and whether
    /// it began at depth 1 (a key of the top-level object, or a value there).
    str_start: usize,
    str_top: bool,
    /// In a string past [`RAW_STRING_BYTES`]: its tail is dropped up to the
    /// closing quote.
    dropping: bool,
    /// Hex digits still to come in a `\uXXXX` escape, and the value so far; the
    /// last one read was a high surrogate (its low half must not be cut off).
    hex_left: u8,
    hex: u32,
    high_surrogate: bool,
    /// The last token at depth 1 was the string `"live"`; then `:` came after it.
    after_live: bool,
    live_value: bool,
    spliced: bool,
    kept: Vec<LiveAllocation>,
    dropped: u64,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl Splicer {
    fn outer_byte(&mut self, b: u8) {
        if self.in_str {
            self.string_byte(b);
            return;
        }
        self.outer.push(b);
        if is_ws(b) {
            return;
        }
        let after_live = std::mem::take(&mut self.after_live);
        let live_value = std::mem::take(&mut self.live_value);
        match b {
            b'"' => {
                self.in_str = true;
                self.str_top = self.depth == 1;
                self.str_start = self.outer.len();
            }
            b':' => self.live_value = after_live && self.depth == 1,
            b'[' if live_value => {
                // The `[` stays in `outer`, its entries are taken one by one.
                self.spliced = true;
                self.mode = Mode::Start;
            }
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => self.depth = self.depth.saturating_sub(1),
            _ => {}
        }
    }

    /// A byte of a string outside `live[]`: kept up to [`RAW_STRING_BYTES`], then
    /// dropped to the closing quote, cut where the text kept is whole (not inside
    /// an escape or a UTF-8 sequence, not between a surrogate pair's halves).
    fn string_byte(&mut self, b: u8) {
        if self.dropping {
            if self.esc {
                self.esc = false;
            } else if b == b'\\' {
                self.esc = true;
            } else if b == b'"' {
                self.outer.push(b);
                self.in_str = false;
                self.dropping = false;
            }
            return;
        }
        let inside = self.esc
            || self.hex_left > 0
            || (0x80..0xc0).contains(&b)
            || (b == b'\\' && self.high_surrogate);
        let whole = !inside;
        if whole && b != b'"' && self.outer.len() - self.str_start >= RAW_STRING_BYTES {
            self.dropping = true;
            self.esc = b == b'\\';
            return;
        }
        self.outer.push(b);
        if self.hex_left > 0 {
            self.hex = self.hex << 4 | (b as char).to_digit(16).unwrap_or(0);
            self.hex_left -= 1;
            if self.hex_left == 0 {
                self.high_surrogate = (0xd800..0xdc00).contains(&self.hex);
            }
        } else if self.esc {
            self.esc = false;
            if b == b'u' {
                (self.hex_left, self.hex) = (4, 0);
            } else {
                self.high_surrogate = false;
            }
        } else if b == b'\\' {
            self.esc = true;
        } else if b == b'"' {
            self.in_str = false;
            self.high_surrogate = false;
            self.after_live =
                self.str_top && &self.outer[self.str_start..self.outer.len() - 1] == b"live";
        } else {
            self.high_surrogate = false;
        }
    }

    /// A byte inside `live[]` between entries.
    fn between(&mut self, b: u8) -> Result<(), Unread> {
        if is_ws(b) {
            return Ok(());
        }
        match (b, &self.mode) {
            (b']', Mode::Start | Mode::AfterEntry) => {
                self.outer.push(b']');
                self.mode = Mode::Outer;
            }
            (b',', Mode::AfterEntry) => self.mode = Mode::AfterComma,
            _ => return Err(Unread::Whole),
        }
        Ok(())
    }

    fn take(&mut self, entry: LiveAllocation) {
        if self.kept.len() < self.keep {
            self.kept.push(entry);
        } else {
            self.dropped += 1;
        }
        self.mode = Mode::AfterEntry;
    }

    fn finish(self) -> Result<Report, Unread> {
        if self.mode != Mode::Outer || self.in_str {
            return Err(Unread::Whole);
        }
        let mut report = from_slice_keeping(&self.outer, self.keep).map_err(|_| Unread::Whole)?;
        if self.spliced {
            report.live = self.kept;
            report.live_omitted = report.live_omitted.saturating_add(self.dropped);
            // The rest was bounded by `from_slice_keeping`.
            bound_strings(&mut report);
        }
        Ok(report)
    }
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

    /// Reads at most `n` bytes a call: entries cut at every place.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.1.min(buf.len()).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn spliced_reads_as_the_whole_parse() {
        let full = report(300, 7);
        let text = serde_json::to_vec(&full).unwrap();
        for keep in [0usize, 5, 300, usize::MAX] {
            let whole = from_slice_keeping(&text, keep).unwrap();
            for step in [1, 7, 4096, usize::MAX] {
                let r = from_reader_spliced(Trickle(&text, step), keep).unwrap();
                assert_eq!(r, whole, "keep {keep} step {step}");
                assert!(r.live.len() <= keep);
            }
        }
        // Spaces and newlines anywhere between tokens.
        let pretty = serde_json::to_vec_pretty(&full).unwrap();
        let r = from_reader_spliced(Trickle(&pretty, 100), 2).unwrap();
        assert_eq!(r, from_slice_keeping(&text, 2).unwrap());
    }

    #[test]
    fn long_strings_are_cut_the_same_by_every_reader() {
        let mut full = report(30, 0);
        let long = |unit: &str| unit.repeat((6 * MAX_STRING_BYTES) / unit.len() + 7);
        full.program = long("p");
        full.argv = vec![long("é"), long("\u{1f600}"), long("a\u{1}"), "short".into()];
        full.sites = vec![crate::report::Site {
            frames: vec![long("\u{202e}x"), long("\n"), "main".into()],
            ..Default::default()
        }];
        full.live[3].api = Cow::Owned(long("api"));
        let text = serde_json::to_vec(&full).unwrap();
        // Surrogate pairs written as escapes, as some writers do.
        let escaped = String::from_utf8(text.clone())
            .unwrap()
            .replace('\u{1f600}', "\\ud83d\\ude00");
        for text in [text, escaped.into_bytes()] {
            let whole = from_slice_keeping(&text, 5).unwrap();
            for step in [1, 333, usize::MAX] {
                let r = from_reader_spliced(Trickle(&text, step), 5).unwrap();
                assert_eq!(r, whole, "step {step}");
            }
            let strings = [
                &whole.program,
                &whole.argv[0],
                &whole.argv[1],
                &whole.argv[2],
            ]
            .into_iter()
            .chain(&whole.sites[0].frames[..2]);
            for s in strings {
                assert!(s.ends_with('…'), "{}", &s[..20]);
                assert!(s.len() <= MAX_STRING_BYTES + '…'.len_utf8(), "{}", s.len());
                assert!(s.len() > MAX_STRING_BYTES - 4, "{}", s.len());
            }
            assert_eq!(whole.argv[3], "short");
            assert!(whole.live[3].api.ends_with('…'));
            assert!(whole.program.starts_with("ppp"));
        }
    }

    #[test]
    fn an_absurd_entry_is_refused_without_holding_it() {
        let mut full = report(3, 0);
        full.live[1].kind = Cow::Owned("k".repeat(MAX_ENTRY_BYTES));
        let text = serde_json::to_vec(&full).unwrap();
        match from_reader_spliced(Trickle(&text, 4096), 1) {
            Err(Unread::Limit(why)) => assert!(why.contains("64 KiB"), "{why}"),
            other => panic!("{:?}", other.map(|r| r.live.len())),
        }
    }

    #[test]
    fn spliced_leaves_anything_else_to_the_whole_parse() {
        let text = serde_json::to_string(&report(20, 0)).unwrap();
        let whole = |t: &str| {
            matches!(
                from_reader_spliced(Trickle(t.as_bytes(), 64), 3),
                Err(Unread::Whole)
            )
        };
        let cut = &text[..text.len() / 2];
        assert!(whole(cut));
        assert!(whole(&text[..text.len() - 1]));
        assert!(whole(&format!("{text}x")));
        assert!(whole(&text.replace("[{", "[,{")));
        assert!(whole(&text.replace("},{", "},,{")));
        assert!(whole(&text.replace("},{", "}{")));
        assert!(whole(&text.replace("}],", "},],")));
        assert!(whole(&text.replace("\"0x1005\"", "\"zz\"")));
        assert!(whole(&text.replace("\"live\":[", "\"live\":[1,")));
        // An escaped key is not seen: `live` is then parsed with the rest.
        let escaped = text.replace("\"live\":", "\"l\\u0069ve\":");
        let r = from_reader_spliced(Trickle(escaped.as_bytes(), 64), 3).unwrap();
        assert_eq!(r, from_slice_keeping(text.as_bytes(), 3).unwrap());
        // A second `live`: refused by the whole parse too.
        let twice = text.replacen("{", "{\"live\":[],", 1);
        assert!(whole(&twice));
        assert!(serde_json::from_str::<Report>(&twice).is_err());
        // `live` as a nested key or a string value is left alone.
        let nested = text.replace("\"reason\":\"\"", "\"reason\":\"live\"");
        let r = from_reader_spliced(Trickle(nested.as_bytes(), 5), 3).unwrap();
        assert_eq!(r.reason, "live");
        assert_eq!(r.live.len() as u64 + r.live_omitted, 20);
    }
}
