//! Reading report files: regular files only, bounded in size, checked against the
//! schema, with one clear line for anything else.

use super::Failure;
use super::text::clean;
use gpuguard_core::report::{Report, SCHEMA};
use gpuguard_core::report_stream::{Unread, from_reader_spliced, from_slice_keeping};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The largest report read. The library's reports stay far below it (a report
/// lists at most `GPUGUARD_MAX_LIVE` allocations); past it the file is not one of
/// them, and reading it would only fill memory.
pub const MAX_REPORT_BYTES: u64 = 1 << 30;

/// A path for a message, with control characters escaped.
pub fn shown(path: &Path) -> String {
    clean(&path.display().to_string()).into_owned()
}

/// A report file (or, as `what` says, a trace) opened for reading: refused at once
/// if it is not a regular file (a FIFO or `/dev/urandom` would never end) or is
/// larger than [`MAX_REPORT_BYTES`].
fn open_bounded(path: &Path, what: &str) -> Result<File, Failure> {
    let name = shown(path);
    let fail = |what: String| Failure::Input(format!("{name}: {what}"));
    // Non-blocking, so opening a FIFO with no writer returns at once; the type is
    // then checked on the opened file, not on a name that could change meanwhile.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| fail(format!("cannot read: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| fail(format!("cannot read: {e}")))?;
    if meta.file_type().is_dir() && what == "report" {
        // What a user who wrote the folder's name meant: the reports in it.
        return Err(fail(format!(
            "a directory, not a report file; name the reports in it: {}/gpuguard.*.json",
            name.trim_end_matches('/')
        )));
    }
    if !meta.file_type().is_file() {
        return Err(fail(format!(
            "{}, not a {what} file; gpuguard reads regular files only",
            gpuguard_core::regular_file::kind(meta.file_type())
        )));
    }
    if meta.len() > MAX_REPORT_BYTES {
        return Err(too_big(path, what));
    }
    Ok(file)
}

/// The message for a file past [`MAX_REPORT_BYTES`].
fn too_big(path: &Path, what: &str) -> Failure {
    Failure::Input(format!(
        "{}: larger than {} MiB, not a gpuguard {what}",
        shown(path),
        MAX_REPORT_BYTES >> 20
    ))
}

/// The bytes of a report file (or, as `what` says, a trace), checked as
/// [`open_bounded`] does.
pub fn read_bounded(path: &Path, what: &str) -> Result<Vec<u8>, Failure> {
    let file = open_bounded(path, what)?;
    let len = file.metadata().map_or(0, |m| m.len());
    let mut bytes = Vec::with_capacity(len as usize);
    // Bounded again while reading: a file may grow after the size was taken.
    file.take(MAX_REPORT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Failure::Input(format!("{}: cannot read: {e}", shown(path))))?;
    if bytes.len() as u64 > MAX_REPORT_BYTES {
        return Err(too_big(path, what));
    }
    Ok(bytes)
}

/// A trace (or, as `what` says, another file) checked as [`open_bounded`] does,
/// handed to `read` as a buffered stream: it is never held whole. Past
/// [`MAX_REPORT_BYTES`] while it is read, refused as [`open_bounded`] refuses it.
pub fn read_streamed<T>(
    path: &Path,
    what: &str,
    read: impl FnOnce(&mut dyn std::io::BufRead) -> T,
) -> Result<T, Failure> {
    let file = open_bounded(path, what)?;
    let bounded = Bounded::new(&file)
        .map_err(|e| Failure::Input(format!("{}: cannot read: {e}", shown(path))))?;
    let mut reader = std::io::BufReader::with_capacity(256 << 10, bounded);
    let out = read(&mut reader);
    if reader.get_ref().over() {
        return Err(too_big(path, what));
    }
    Ok(out)
}

/// A file read at most [`MAX_REPORT_BYTES`] + 1 bytes, counting them: the bound
/// kept while a report streams in (a file may grow after its size was taken).
struct Bounded<'a> {
    file: std::io::Take<&'a File>,
    read: u64,
}

impl<'a> Bounded<'a> {
    /// From the start of `file`.
    fn new(mut file: &'a File) -> std::io::Result<Self> {
        file.seek(SeekFrom::Start(0))?;
        Ok(Bounded {
            file: file.take(MAX_REPORT_BYTES + 1),
            read: 0,
        })
    }

    fn over(&self) -> bool {
        self.read > MAX_REPORT_BYTES
    }
}

impl Read for Bounded<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// Only the schema of a document, to say what is wrong before reading the rest.
#[derive(serde::Deserialize)]
struct SchemaProbe {
    schema: Option<serde_json::Value>,
}

/// Reads and checks one report file, keeping only the first `keep` entries of
/// `live[]` (the largest; the others are counted into `live_omitted`). The file
/// streams through a small buffer: neither its text nor all its live allocations
/// are held, whatever its size. The messages are those of reading it whole.
pub fn load_keeping(path: &Path, keep: usize) -> Result<Report, Failure> {
    let file = open_bounded(path, "report")?;
    let name = shown(path);
    let cannot = |e: std::io::Error| Failure::Input(format!("{name}: cannot read: {e}"));
    let mut bounded = Bounded::new(&file).map_err(cannot)?;
    let parsed = from_reader_spliced(&mut bounded, keep);
    if bounded.over() {
        return Err(too_big(path, "report"));
    }
    match parsed {
        Ok(report) => {
            // A typed `schema` is a string: only its value can be wrong.
            check_schema(&name, Some(report.schema.as_str()))?;
            Ok(report)
        }
        Err(Unread::Io(e)) => Err(cannot(e)),
        Err(Unread::Limit(why)) => Err(Failure::Input(format!("{name}: {why}"))),
        // Broken, or written unusually (rare): read whole, as always, to say what
        // is wrong in the words and at the position reading it whole gave; unless
        // its first bytes already say what else it is.
        Err(Unread::Whole) => {
            if let Some(what) = other_document(&head(&file).map_err(cannot)?) {
                return Err(Failure::Input(format!("{name}: {what}")));
            }
            load_whole(path, &read_bounded(path, "report")?, keep)
        }
    }
}

/// The first bytes of `file`: enough for a trace's first event.
fn head(mut file: &File) -> std::io::Result<Vec<u8>> {
    const HEAD: u64 = 64 << 10;
    file.seek(SeekFrom::Start(0))?;
    let mut bytes = Vec::new();
    file.take(HEAD).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The first event of a trace, as far as telling one apart needs.
#[derive(serde::Deserialize)]
struct FirstEvent {
    name: String,
}

/// What a document that is not a JSON object is, from its first bytes, when that
/// can be said better than a JSON parser's words (`trailing characters` for
/// `[1,2,3]`): a gpuguard trace, or another JSON array.
fn other_document(head: &[u8]) -> Option<String> {
    let text = head.trim_ascii_start();
    let rest = text.strip_prefix(b"[")?;
    let first = serde_json::Deserializer::from_slice(rest.trim_ascii_start())
        .into_iter::<FirstEvent>()
        .next();
    Some(match first {
        Some(Ok(e)) if e.name == gpuguard_core::trace::HEADER_EVENT => {
            "a gpuguard trace, not a gpuguard report; use `gpuguard plot` to draw it".to_string()
        }
        _ => "a JSON array, not a gpuguard report (a report is a JSON object)".to_string(),
    })
}

/// A report's bytes checked in order: whether they are JSON at all, then whether
/// they are a gpuguard report, only then whether it is well-formed.
fn load_whole(path: &Path, bytes: &[u8], keep: usize) -> Result<Report, Failure> {
    let name = shown(path);
    let probe: SchemaProbe = serde_json::from_slice(bytes).map_err(|e| {
        Failure::Input(if e.is_eof() {
            format!("{name}: not a complete JSON document ({e}); is the file truncated?")
        } else {
            format!("{name}: not a gpuguard report: not JSON ({e})")
        })
    })?;
    check_schema(&name, probe.schema.as_ref().and_then(|s| s.as_str()))?;
    from_slice_keeping(bytes, keep)
        .map_err(|e| Failure::Input(format!("{name}: malformed gpuguard report: {e}")))
}

/// Whether a document's `schema` is the one this gpuguard reads.
fn check_schema(name: &str, schema: Option<&str>) -> Result<(), Failure> {
    match schema {
        Some(SCHEMA) => Ok(()),
        Some(other) if other.starts_with("gpuguard-report/") => Err(Failure::Input(format!(
            "{name}: schema {} is newer or older than this gpuguard reads ({SCHEMA}); use a matching gpuguard",
            clean(other)
        ))),
        _ => Err(Failure::Input(format!(
            "{name}: not a gpuguard report (no \"schema\": \"{SCHEMA}\")"
        ))),
    }
}

/// Reads every file, stopping at the first that cannot be read, keeping `keep`
/// live allocations of each (see [`load_keeping`]).
pub fn load_all_keeping<P: AsRef<Path>>(paths: &[P], keep: usize) -> Result<Vec<Report>, Failure> {
    paths
        .iter()
        .map(|p| load_keeping(p.as_ref(), keep))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuguard_core::report::{Hex, LiveAllocation, Site};

    fn report(live: u64) -> Report {
        Report {
            schema: SCHEMA.into(),
            reason: "exit".into(),
            live: (0..live)
                .map(|i| LiveAllocation {
                    address: Hex(0x7f00_0000_0000 + (i << 12)),
                    bytes: 1 << 20,
                    kind: "device".into(),
                    api: "cuMemAlloc_v2".into(),
                    site: Some(0),
                    ..Default::default()
                })
                .collect(),
            live_omitted: 3,
            sites: vec![Site {
                id: 0,
                frames: vec!["main".into()],
                live_bytes: live << 20,
                live_count: live,
                captured: None,
                held_by: Vec::new(),
                captured_bytes: 0,
            }],
            ..Default::default()
        }
    }

    fn write(name: &str, text: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("gg-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn message(r: Result<Report, Failure>) -> String {
        match r {
            Err(Failure::Input(m)) => m,
            Err(_) => panic!("not an input failure"),
            Ok(_) => panic!("read"),
        }
    }

    /// What reading the file whole said (the code before streaming), for comparison.
    fn whole(path: &Path) -> Result<Report, String> {
        let bytes = std::fs::read(path).unwrap();
        let name = shown(path);
        let probe: SchemaProbe = serde_json::from_slice(&bytes).map_err(|e| {
            if e.is_eof() {
                format!("{name}: not a complete JSON document ({e}); is the file truncated?")
            } else {
                format!("{name}: not a gpuguard report: not JSON ({e})")
            }
        })?;
        check_schema(&name, probe.schema.as_ref().and_then(|s| s.as_str())).map_err(
            |f| match f {
                Failure::Input(m) => m,
                _ => unreachable!(),
            },
        )?;
        serde_json::from_slice(&bytes)
            .map_err(|e| format!("{name}: malformed gpuguard report: {e}"))
    }

    #[test]
    fn keeps_the_first_live_allocations_and_counts_all() {
        let full = report(5000);
        let path = write("many.json", &serde_json::to_vec(&full).unwrap());
        for keep in [0, 10, 5000, usize::MAX] {
            let r = load_keeping(&path, keep).unwrap();
            assert_eq!(r.live.len(), keep.min(5000));
            assert_eq!(r.live[..], full.live[..r.live.len()]);
            assert_eq!(r.live.len() as u64 + r.live_omitted, 5003);
            let mut rest = r.clone();
            rest.live = full.live.clone();
            rest.live_omitted = 3;
            assert_eq!(rest, full, "all else as read whole");
        }
    }

    #[test]
    fn arrays_and_traces_are_named() {
        for (name, body, words) in [
            (
                "array.json",
                "[1,2,3]",
                "a JSON array, not a gpuguard report",
            ),
            (
                "empty_array.json",
                " [ ]",
                "a JSON array, not a gpuguard report",
            ),
            (
                "trace.json",
                "[\n{\"name\":\"gpuguard_trace\",\"ph\":\"M\",\"args\":{}},\n{\"name\":\"x\",",
                "a gpuguard trace, not a gpuguard report; use `gpuguard plot`",
            ),
        ] {
            let path = write(name, body.as_bytes());
            for keep in [0, usize::MAX] {
                let m = message(load_keeping(&path, keep));
                assert!(m.contains(words), "{name}: {m}");
                assert!(!m.contains("trailing"), "{name}: {m}");
            }
        }
    }

    #[test]
    fn broken_files_are_refused_with_the_messages_of_reading_them_whole() {
        let text = serde_json::to_string(&report(300)).unwrap();
        let mut cases = vec![
            ("truncated.json", text[..text.len() / 2].to_string()),
            ("empty.json", String::new()),
            ("not_json.json", "hello".to_string()),
            ("trailing.json", format!("{text} x")),
            (
                "no_schema.json",
                text.replace("\"schema\":\"gpuguard-report/1\",", ""),
            ),
            (
                "future.json",
                text.replace("gpuguard-report/1", "gpuguard-report/9"),
            ),
            ("foreign.json", text.replace("gpuguard-report/1", "other")),
            (
                "number_schema.json",
                text.replace("\"gpuguard-report/1\"", "7"),
            ),
            // A malformed entry far past those kept.
            (
                "bad_entry.json",
                text.replace("\"0x7f0000100000\"", "\"zz\""),
            ),
            ("bad_type.json", text.replace("\"seq\":0", "\"seq\":\"0\"")),
            // Both a newer schema and a malformed entry: the schema is named.
            (
                "future_bad.json",
                text.replace("gpuguard-report/1", "gpuguard-report/9")
                    .replace("\"0x7f0000100000\"", "\"zz\""),
            ),
            // Malformed and cut short: the cut is named.
            (
                "bad_cut.json",
                text.replace("\"0x7f0000100000\"", "\"zz\"")[..text.len() - 40].to_string(),
            ),
        ];
        cases.push((
            "missing_live.json",
            text.replace("\"live\":[", "\"xlive\":["),
        ));
        for (name, body) in cases {
            let path = write(name, body.as_bytes());
            let expected = whole(&path).expect_err(name);
            for keep in [0, 3, usize::MAX] {
                assert_eq!(
                    message(load_keeping(&path, keep)),
                    expected,
                    "{name} keep {keep}"
                );
            }
        }
    }
}
