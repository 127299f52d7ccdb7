//! Status files: what `gpuguard ps` lists. Each process running gpuguard keeps one
//! small JSON file, `<pid>.json`, in the status directory ([`status_dir`]); the
//! library's helper thread rewrites it about once a second (atomically: a private
//! temporary renamed into place, mode 0600) and removes it at exit. Files of processes
//! that died without removing theirs are recognised ([`read_all`]) by the process being
//! gone or its start time differing (the pid was reused), and removed.

use crate::reporter::write_atomic;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub const SCHEMA: &str = "gpuguard-status/1";

/// The setting that names the status directory ([`status_dir`]).
pub const STATUS_DIR_VAR: &str = "GPUGUARD_STATUS_DIR";

/// How often the library rewrites its status file.
pub const UPDATE_INTERVAL_MS: u64 = 1_000;

/// Status files are small; a larger file is not one (readers read no more).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Status {
    pub schema: String,
    pub gpuguard_version: String,
    pub pid: u32,
    pub program: String,
    pub argv: Vec<String>,
    /// The process's start time in clock ticks since boot (`/proc/<pid>/stat` field
    /// 22): with the pid, it names the process even after the pid is reused.
    pub start_ticks: u64,
    /// When gpuguard saw the first CUDA call.
    pub started_unix_ms: u64,
    /// Where its reports go (`GPUGUARD_DIR`, else the directory it started in), for
    /// people: a name that is not UTF-8 has U+FFFD in place of its odd bytes.
    pub report_dir: String,
    /// The report directory's name byte for byte, in hex, when it is not UTF-8
    /// (absent otherwise, and from files of older versions): what `gpuguard trim`
    /// looks in. See [`report_dir_fields`] and [`Status::report_dir_path`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_dir_hex: Option<String>,
    pub updated_unix_ms: u64,
    pub devices: Vec<DeviceStatus>,
    /// The rank of a distributed run, when a launcher's variables give one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u64>,
    /// Names that place the process in a fleet (`job`, `pod`, `namespace` and those
    /// of `GPUGUARD_LABELS`), read at start: [`labels_from_env`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Reports written so far (snapshots, signals, caps, trims).
    #[serde(default)]
    pub reports: u64,
    /// Trims done so far, and the bytes they gave back in all.
    #[serde(default)]
    pub trims: u64,
    #[serde(default)]
    pub trim_released_bytes: u64,
    /// The first suspected leak over the process's last reports
    /// (`growth::suspects`), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_suspect: Option<SuspectStatus>,
}

/// A suspected leak, as a status file carries it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SuspectStatus {
    /// Its innermost frame or line (`train.py:42 in step`).
    pub line: String,
    /// How fast it grew over the reports judged; 0 when they carry no times.
    pub bytes_per_second: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DeviceStatus {
    pub device: i32,
    pub live_bytes: u64,
    pub peak_bytes: u64,
    /// `null` when uncapped.
    pub cap_bytes: Option<u64>,
    /// What stream-ordered pools hold unused (charged against the cap).
    #[serde(default)]
    pub pool_held_bytes: u64,
    /// The device's UUID (`GPU-...`), so other processes find it whatever their
    /// `CUDA_VISIBLE_DEVICES`; absent when the driver could not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The frameworks' memory in use and cached (held in their pools), at the last
    /// report that had their account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework_in_use_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework_cached_bytes: Option<u64>,
    /// Allocations the driver refused for lack of memory, and those the cap refused.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub oom_refusals: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cap_refusals: u64,
}

/// At most this many labels from the environment, names and values this long.
pub const MAX_LABELS: usize = 8;
pub const MAX_LABEL_NAME: usize = 32;
pub const MAX_LABEL_VALUE: usize = 128;

/// Label names a process may not set: the exporter gives them itself.
pub const RESERVED_LABELS: &[&str] = &["pid", "program", "device", "uuid", "rank", "instance"];

/// Whether `name` may be a label a process sets: `[a-zA-Z_][a-zA-Z0-9_]*`, at most
/// [`MAX_LABEL_NAME`] characters, not starting with `__`, not a [`RESERVED_LABELS`] one.
pub fn good_label_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_LABEL_NAME
        && !name.starts_with("__")
        && !RESERVED_LABELS.contains(&name)
        && name
            .chars()
            .enumerate()
            .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()))
}

/// The fleet labels of a process, from its environment (`get`): `job` from Slurm's
/// `SLURM_JOB_ID`, `pod` and `namespace` from the Kubernetes downward-API variables
/// `POD_NAME` and `POD_NAMESPACE`, then each `name=value` of `GPUGUARD_LABELS`
/// (comma-separated; it overrides those). A name is `[a-zA-Z_][a-zA-Z0-9_]*` of at
/// most 32 characters, not one the exporter gives itself nor starting with `__`; a
/// value at most 128 characters; at most 8 labels. Returns the labels and a warning
/// for each pair left out.
pub fn labels_from_env(
    get: impl Fn(&str) -> Option<String>,
) -> (BTreeMap<String, String>, Vec<String>) {
    let mut labels = BTreeMap::new();
    let mut warnings = Vec::new();
    for (var, name) in [
        ("SLURM_JOB_ID", "job"),
        ("POD_NAME", "pod"),
        ("POD_NAMESPACE", "namespace"),
    ] {
        if let Some(v) = get(var).filter(|v| !v.is_empty() && v.chars().count() <= MAX_LABEL_VALUE)
        {
            labels.insert(name.to_string(), v);
        }
    }
    for pair in get("GPUGUARD_LABELS").unwrap_or_default().split(',') {
        let pair = pair.trim();
        if pair.is_empty() {
            continue;
        }
        let Some((name, value)) = pair.split_once('=') else {
            warnings.push(format!(
                "GPUGUARD_LABELS: {pair:?} is not name=value; ignored"
            ));
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if !good_label_name(name) {
            warnings.push(format!(
                "GPUGUARD_LABELS: {name:?} cannot be a label name (letters, digits and _, \
                 at most {MAX_LABEL_NAME}, not {}); ignored",
                RESERVED_LABELS.join(", ")
            ));
            continue;
        }
        if value.chars().count() > MAX_LABEL_VALUE {
            warnings.push(format!(
                "GPUGUARD_LABELS: the value of {name} is longer than {MAX_LABEL_VALUE} characters; ignored"
            ));
            continue;
        }
        if !labels.contains_key(name) && labels.len() >= MAX_LABELS {
            warnings.push(format!(
                "GPUGUARD_LABELS: more than {MAX_LABELS} labels; {name} ignored"
            ));
            continue;
        }
        labels.insert(name.to_string(), value.to_string());
    }
    (labels, warnings)
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `report_dir` and `report_dir_hex` for a report directory: its name as text, and
/// its bytes in hex when the text cannot carry them.
pub fn report_dir_fields(dir: &Path) -> (String, Option<String>) {
    let bytes = dir.as_os_str().as_bytes();
    match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_string(), None),
        Err(_) => (
            dir.to_string_lossy().into_owned(),
            Some(bytes.iter().map(|b| format!("{b:02x}")).collect()),
        ),
    }
}

impl Status {
    /// The report directory byte for byte: from `report_dir_hex` when present and
    /// well formed, else `report_dir`. Relative when the process's `GPUGUARD_DIR` was
    /// (reports then go under its current directory).
    pub fn report_dir_path(&self) -> PathBuf {
        let from_hex = self.report_dir_hex.as_deref().and_then(|hex| {
            let digits = hex.as_bytes();
            if digits.len() % 2 != 0 {
                return None;
            }
            digits
                .chunks(2)
                .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
                .collect::<Option<Vec<u8>>>()
        });
        match from_hex {
            Some(bytes) => PathBuf::from(OsString::from_vec(bytes)),
            None => PathBuf::from(&self.report_dir),
        }
    }
}

/// The status directory: `GPUGUARD_STATUS_DIR` when that variable names an absolute
/// path (a host path that a job's containers and the exporter share), else
/// `$XDG_RUNTIME_DIR/gpuguard` when that variable names an absolute path (the
/// per-user runtime directory of a login session), else `/dev/shm/gpuguard-<uid>`
/// (memory-backed, like the runtime directory). `var` reads an environment variable.
/// Whichever it is, it is used only as [`check_dir`] allows.
pub fn status_dir(var: impl Fn(&str) -> Option<OsString>, uid: u32) -> PathBuf {
    if let Some(dir) = var(STATUS_DIR_VAR).map(PathBuf::from)
        && dir.is_absolute()
    {
        return dir;
    }
    match var("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(runtime) if runtime.is_absolute() => runtime.join("gpuguard"),
        _ => PathBuf::from(format!("/dev/shm/gpuguard-{uid}")),
    }
}

/// The status directory of this process's environment and user.
pub fn status_dir_here() -> std::io::Result<PathBuf> {
    // /proc/self belongs to the process's effective user.
    let uid = std::fs::metadata("/proc/self")?.uid();
    Ok(status_dir(|k| std::env::var_os(k), uid))
}

/// Creates `dir` (mode 0700) if need be and checks that it is a real directory of this
/// user that nobody else can reach: under `/dev/shm` another user could have made it
/// first, to read the files or to plant some.
pub fn ensure_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let me = std::fs::metadata("/proc/self")?.uid();
    check_dir(dir, me)
}

/// Checks, without creating it, that `dir` is a status directory the library would
/// use for files of user `owner`: a directory (not a link to one) of that user, mode
/// 0700. Readers (`gpuguard ps`, `gpuguard trim`) apply it too, so that nothing
/// planted where another user could reach is believed or deleted. The error (kind
/// `PermissionDenied`) says `<dir>: <why>; not used for status files`.
pub fn check_dir(dir: &Path, owner: u32) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    let unsafe_dir = |why: &str| {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{}: {why}; not used for status files", dir.display()),
        ))
    };
    if meta.file_type().is_symlink() {
        return unsafe_dir("a symbolic link");
    }
    if !meta.is_dir() {
        return unsafe_dir("not a directory");
    }
    if meta.uid() != owner {
        return unsafe_dir("belongs to another user");
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return unsafe_dir("other users can reach it (mode is not 0700)");
    }
    Ok(())
}

/// The file name of a process's status.
pub fn file_name(pid: u32) -> String {
    format!("{pid}.json")
}

/// Writes `status` as `dir/<pid>.json`, atomically, mode 0600. The directory must
/// exist ([`ensure_dir`]).
pub fn write_status(dir: &Path, status: &Status) -> std::io::Result<PathBuf> {
    let bytes = serde_json::to_vec(status).map_err(std::io::Error::other)?;
    write_atomic(dir, &file_name(status.pid), &bytes)
}

/// Removes a process's status file (at exit); a file already gone is fine.
pub fn remove_status(dir: &Path, pid: u32) -> std::io::Result<()> {
    match std::fs::remove_file(dir.join(file_name(pid))) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// A process's start time in clock ticks since boot, from `<proc>/<pid>/stat` field 22;
/// `None` when there is no such process.
pub fn process_start_ticks(proc_root: &Path, pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    // Field 2, the command name, is in parentheses and may hold spaces and
    // parentheses itself: count from the last `)`, which ends it.
    let after_name = &stat[stat.rfind(')')? + 1..];
    // After the name come fields 3, 4, ...: field 22 is the 20th of them.
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// The status of each live process in `dir`, by pid. Files of processes that are gone
/// (or whose pid now names another process) are removed, as are their temporaries;
/// files that cannot be read as a status are skipped. A missing directory has none.
pub fn read_all(dir: &Path) -> std::io::Result<Vec<Status>> {
    read_all_with(dir, Path::new("/proc"))
}

/// [`read_all`] with the process table at `proc_root`.
pub fn read_all_with(dir: &Path, proc_root: &Path) -> std::io::Result<Vec<Status>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let path = entry.path();
        // `.<pid>.json.tmp`: a write in progress, or left by a process killed in it.
        if let Some(pid) = name
            .strip_prefix('.')
            .and_then(|n| n.strip_suffix(".json.tmp"))
            .and_then(|p| p.parse::<u32>().ok())
        {
            if process_start_ticks(proc_root, pid).is_none() {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        let Some(pid) = name
            .strip_suffix(".json")
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Some(status) = read_one(&path).filter(|s| s.pid == pid) else {
            continue;
        };
        match process_start_ticks(proc_root, pid) {
            Some(ticks) if ticks == status.start_ticks => out.push(status),
            // Gone, or the pid now names another process: the file is stale.
            _ => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    out.sort_by_key(|s| s.pid);
    Ok(out)
}

/// The status of process `pid` in `dir`, when its file is there and names that very
/// process (same start time); `None` otherwise. Removes nothing.
pub fn read_of(dir: &Path, pid: u32) -> Option<Status> {
    read_of_with(dir, pid, Path::new("/proc"))
}

/// [`read_of`] with the process table at `proc_root`.
pub fn read_of_with(dir: &Path, pid: u32, proc_root: &Path) -> Option<Status> {
    let status = read_one(&dir.join(file_name(pid))).filter(|s| s.pid == pid)?;
    (process_start_ticks(proc_root, pid) == Some(status.start_ticks)).then_some(status)
}

/// One status file, `None` when it is not one of this schema (or not a regular file).
fn read_one(path: &Path) -> Option<Status> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_FILE_BYTES {
        return None;
    }
    // Looked at again on the descriptor: the name may have become a link or a FIFO
    // since (a FIFO opened without O_NONBLOCK would wait for a writer).
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    file.take(MAX_FILE_BYTES).read_to_string(&mut text).ok()?;
    let status: Status = serde_json::from_str(&text).ok()?;
    (status.schema == SCHEMA).then_some(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "gpuguard-status-test-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn status(pid: u32, start_ticks: u64) -> Status {
        Status {
            schema: SCHEMA.into(),
            gpuguard_version: "0.1.0".into(),
            pid,
            program: "train.py".into(),
            argv: vec!["python".into(), "train.py".into()],
            start_ticks,
            report_dir: "/tmp/r".into(),
            devices: vec![DeviceStatus {
                device: 0,
                live_bytes: 5,
                peak_bytes: 9,
                cap_bytes: Some(100),
                pool_held_bytes: 1,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn directory_rule() {
        let env: HashMap<&str, &str> = [("XDG_RUNTIME_DIR", "/run/user/1000")].into();
        let var = |k: &str| env.get(k).map(OsString::from);
        assert_eq!(status_dir(var, 1000), Path::new("/run/user/1000/gpuguard"));
        assert_eq!(
            status_dir(|_| None, 1000),
            Path::new("/dev/shm/gpuguard-1000")
        );
        // A relative runtime directory is not one.
        let rel = |_: &str| Some(OsString::from("run"));
        assert_eq!(status_dir(rel, 7), Path::new("/dev/shm/gpuguard-7"));
    }

    #[test]
    fn status_dir_setting_comes_first_when_absolute() {
        let env: HashMap<&str, &str> = [
            ("GPUGUARD_STATUS_DIR", "/srv/gg/status"),
            ("XDG_RUNTIME_DIR", "/run/user/1000"),
        ]
        .into();
        let var = |k: &str| env.get(k).map(OsString::from);
        assert_eq!(status_dir(var, 1000), Path::new("/srv/gg/status"));
        let rel = |k: &str| (k == STATUS_DIR_VAR).then(|| OsString::from("status"));
        assert_eq!(status_dir(rel, 7), Path::new("/dev/shm/gpuguard-7"));
    }

    #[test]
    fn labels_from_slurm_kubernetes_and_the_setting() {
        let env: HashMap<&str, &str> = [
            ("SLURM_JOB_ID", "812"),
            ("POD_NAME", "trainer-0"),
            ("POD_NAMESPACE", "ml"),
            (
                "GPUGUARD_LABELS",
                "team=vision, job=override,bad-name=x,pid=1,__x=y,novalue,,experiment=e1",
            ),
        ]
        .into();
        let (labels, warnings) = labels_from_env(|k| env.get(k).map(|v| v.to_string()));
        let got: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("experiment", "e1"),
                ("job", "override"),
                ("namespace", "ml"),
                ("pod", "trainer-0"),
                ("team", "vision")
            ]
        );
        assert_eq!(warnings.len(), 4, "{warnings:?}");
        let many: String = (0..20).map(|i| format!("k{i}=v,")).collect();
        let (labels, warnings) =
            labels_from_env(|k| (k == "GPUGUARD_LABELS").then(|| many.clone()));
        assert_eq!(labels.len(), MAX_LABELS);
        assert_eq!(warnings.len(), 20 - MAX_LABELS);
        let long = format!("a={}", "x".repeat(MAX_LABEL_VALUE + 1));
        let (labels, _) = labels_from_env(|k| (k == "GPUGUARD_LABELS").then(|| long.clone()));
        assert!(labels.is_empty());
    }

    #[test]
    fn start_ticks_of_this_process_and_of_none() {
        let me = process_start_ticks(Path::new("/proc"), std::process::id());
        assert!(me.is_some_and(|t| t > 0));
        let fake = temp_dir("proc");
        std::fs::create_dir_all(fake.join("12")).unwrap();
        // A command name with spaces and parentheses.
        let fields: Vec<String> = (3..=30).map(|i| i.to_string()).collect();
        std::fs::write(
            fake.join("12/stat"),
            format!("12 (a) b (c) {}\n", fields.join(" ")),
        )
        .unwrap();
        assert_eq!(process_start_ticks(&fake, 12), Some(22));
        assert_eq!(process_start_ticks(&fake, 13), None);
    }

    #[test]
    fn written_private_read_back_and_stale_ones_removed() {
        let dir = temp_dir("rw");
        ensure_dir(&dir).unwrap();
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let me = std::process::id();
        let ticks = process_start_ticks(Path::new("/proc"), me).unwrap();
        let live = status(me, ticks);
        let p = write_status(&dir, &live).unwrap();
        assert_eq!(p, dir.join(format!("{me}.json")));
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // A reused pid (same pid, other start time) and a pid that cannot be running.
        let reused_dir = temp_dir("rw-reused");
        ensure_dir(&reused_dir).unwrap();
        write_status(&reused_dir, &status(me, ticks + 1)).unwrap();
        let dead = u32::MAX - 1;
        write_status(&dir, &status(dead, 1)).unwrap();
        std::fs::write(dir.join(format!(".{dead}.json.tmp")), "{").unwrap();
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        std::fs::write(dir.join("77.json"), "not json").unwrap();

        assert_eq!(read_all(&dir).unwrap(), vec![live]);
        assert!(!dir.join(format!("{dead}.json")).exists());
        assert!(!dir.join(format!(".{dead}.json.tmp")).exists());
        assert!(
            dir.join("notes.txt").exists(),
            "only status files are touched"
        );
        assert!(read_all(&reused_dir).unwrap().is_empty());
        assert!(!reused_dir.join(format!("{me}.json")).exists());

        remove_status(&dir, me).unwrap();
        remove_status(&dir, me).unwrap();
        assert!(read_all(&dir).unwrap().is_empty());
        assert!(read_all(&dir.join("missing")).unwrap().is_empty());
    }

    #[test]
    fn report_dir_keeps_its_bytes_and_old_files_still_read() {
        use std::os::unix::ffi::OsStrExt;
        let odd = Path::new(std::ffi::OsStr::from_bytes(b"/data/r\xffports"));
        let (text, hex) = report_dir_fields(odd);
        assert_eq!(text, "/data/r\u{fffd}ports");
        let mut s = status(1, 1);
        (s.report_dir, s.report_dir_hex) = (text, hex);
        let back: Status = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
        assert_eq!(back.report_dir_path(), odd);
        // A UTF-8 name is written as before: no new field.
        let (text, hex) = report_dir_fields(Path::new("/tmp/r"));
        assert_eq!((text.as_str(), hex), ("/tmp/r", None));
        let plain = serde_json::to_string(&status(1, 1)).unwrap();
        assert!(!plain.contains("report_dir_hex"), "{plain}");
        // A file of an older version (no such field), or a malformed field.
        let old: Status = serde_json::from_str(&plain).unwrap();
        assert_eq!(old.report_dir_path(), Path::new("/tmp/r"));
        let mut bad = status(1, 1);
        bad.report_dir_hex = Some("2fz".into());
        assert_eq!(bad.report_dir_path(), Path::new("/tmp/r"));
    }

    #[test]
    fn a_status_is_read_for_its_own_process_only() {
        let dir = temp_dir("of");
        ensure_dir(&dir).unwrap();
        let me = std::process::id();
        let ticks = process_start_ticks(Path::new("/proc"), me).unwrap();
        write_status(&dir, &status(me, ticks + 1)).unwrap();
        assert_eq!(read_of(&dir, me), None, "another process of the same pid");
        write_status(&dir, &status(me, ticks)).unwrap();
        assert_eq!(read_of(&dir, me), Some(status(me, ticks)));
        assert_eq!(read_of(&dir, u32::MAX - 1), None);
    }

    #[test]
    fn directory_others_can_reach_is_refused() {
        let dir = temp_dir("open");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(ensure_dir(&dir).is_err());
        let file = temp_dir("file");
        std::fs::write(&file, "").unwrap();
        assert!(ensure_dir(&file).is_err());
        // A link to a good directory is not one: what it points at can change.
        let good = temp_dir("good");
        ensure_dir(&good).unwrap();
        let link = temp_dir("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let e = ensure_dir(&link).unwrap_err();
        assert!(e.to_string().contains("a symbolic link"), "{e}");
        let me = std::fs::metadata("/proc/self").unwrap().uid();
        assert!(check_dir(&good, me).is_ok());
        let e = check_dir(&good, me.wrapping_add(1)).unwrap_err();
        assert!(e.to_string().contains("another user"), "{e}");
    }
}
