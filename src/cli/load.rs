//! Reading report files: regular files only, bounded in size, checked against the
//! schema, with one clear line for anything else.

use super::Failure;
use super::text::clean;
use gpuguard_core::report::{Report, SCHEMA};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The largest report read. The library's reports stay far below it (a report
/// lists at most `GPUGUARD_MAX_LIVE` allocations); past it the file is not one of
/// them, and reading it would only fill memory.
pub const MAX_REPORT_BYTES: u64 = 1 << 30;

/// What kind of thing a path is, in words, when it is not a regular file.
fn kind_of(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// A path for a message, with control characters escaped.
pub fn shown(path: &Path) -> String {
    clean(&path.display().to_string()).into_owned()
}

/// The bytes of a report file: refused at once if it is not a regular file (a FIFO
/// or `/dev/urandom` would never end) or is larger than [`MAX_REPORT_BYTES`].
pub fn read_bounded(path: &Path) -> Result<Vec<u8>, Failure> {
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
    if !meta.file_type().is_file() {
        return Err(fail(format!(
            "{}, not a report file; gpuguard reads regular files only",
            kind_of(meta.file_type())
        )));
    }
    let too_big = || {
        fail(format!(
            "larger than {} MiB, not a gpuguard report",
            MAX_REPORT_BYTES >> 20
        ))
    };
    if meta.len() > MAX_REPORT_BYTES {
        return Err(too_big());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // Bounded again while reading: a file may grow after the size was taken.
    file.take(MAX_REPORT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| fail(format!("cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_REPORT_BYTES {
        return Err(too_big());
    }
    Ok(bytes)
}

/// Only the schema of a document, to say what is wrong before reading the rest.
#[derive(serde::Deserialize)]
struct SchemaProbe {
    schema: Option<serde_json::Value>,
}

/// Reads and checks one report file.
pub fn load(path: &Path) -> Result<Report, Failure> {
    let bytes = read_bounded(path)?;
    let name = shown(path);
    let probe: SchemaProbe = serde_json::from_slice(&bytes).map_err(|e| {
        Failure::Input(if e.is_eof() {
            format!("{name}: not a complete JSON document ({e}); is the file truncated?")
        } else {
            format!("{name}: not a gpuguard report: not JSON ({e})")
        })
    })?;
    match probe.schema.as_ref().and_then(|s| s.as_str()) {
        Some(SCHEMA) => {}
        Some(other) if other.starts_with("gpuguard-report/") => {
            return Err(Failure::Input(format!(
                "{name}: schema {} is newer or older than this gpuguard reads ({SCHEMA}); use a matching gpuguard",
                clean(other)
            )));
        }
        _ => {
            return Err(Failure::Input(format!(
                "{name}: not a gpuguard report (no \"schema\": \"{SCHEMA}\")"
            )));
        }
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| Failure::Input(format!("{name}: malformed gpuguard report: {e}")))
}

/// Reads every file, stopping at the first that cannot be read.
pub fn load_all<P: AsRef<Path>>(paths: &[P]) -> Result<Vec<Report>, Failure> {
    paths.iter().map(|p| load(p.as_ref())).collect()
}
