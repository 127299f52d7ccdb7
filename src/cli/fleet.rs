//! The guarded processes of this machine as `gpuguard metrics` sees them: the status
//! files of every status directory it may read, read without changing anything.
//!
//! Safe to run as root: a directory is opened without following a link and used
//! only when nobody but its owner can reach it (mode 0700); each file is opened
//! relative to that directory without following a link and without waiting (a FIFO
//! is refused), used only when it is a regular file of the directory's owner, and
//! read to at most `status::MAX_FILE_BYTES`. Whatever is skipped is counted by why.
//! A process stays listed for the grace period after its file was last read (it
//! removes its file at exit), so that a short job is still scraped once. The groups
//! sharing a budget (`groups/*.group` in each directory) are read as they are now,
//! read-only, under the same checks.

use gpuguard_core::cap;
use gpuguard_core::group::{self, Group};
use gpuguard_core::status::{self, Status};
use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// At most this many status files are read per directory and look.
pub const MAX_FILES_PER_DIR: usize = 4096;

/// Why a status file (or directory) was not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Skip {
    /// Not a status file of this schema: not JSON, another schema, another pid.
    Garbage,
    /// Larger than a status file can be.
    TooBig,
    /// A symbolic link (never followed).
    Symlink,
    /// Owned by another user than the directory's.
    OtherUser,
    /// A FIFO, socket, device or directory.
    NotRegular,
    /// Could not be opened or read.
    Unreadable,
    /// Its process is gone and the file older than the grace period.
    Stale,
    /// Past `MAX_FILES_PER_DIR` in its directory.
    TooMany,
    /// A status directory that others can reach, of another user, or a link.
    UnsafeDir,
}

impl Skip {
    pub const ALL: [Skip; 9] = [
        Skip::Garbage,
        Skip::TooBig,
        Skip::Symlink,
        Skip::OtherUser,
        Skip::NotRegular,
        Skip::Unreadable,
        Skip::Stale,
        Skip::TooMany,
        Skip::UnsafeDir,
    ];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Skip::Garbage => "garbage",
            Skip::TooBig => "too_big",
            Skip::Symlink => "symlink",
            Skip::OtherUser => "other_user",
            Skip::NotRegular => "not_regular",
            Skip::Unreadable => "unreadable",
            Skip::Stale => "stale",
            Skip::TooMany => "too_many",
            Skip::UnsafeDir => "unsafe_dir",
        }
    }
}

/// A status directory to read, and whose it must be (`None`: anyone's, for root).
#[derive(Clone, Debug, PartialEq)]
pub struct Dir {
    pub path: PathBuf,
    pub owner: Option<u32>,
}

/// The directories read by default: this user's status directory; as root, every
/// user's (`/dev/shm/gpuguard-<uid>`, `/run/user/<uid>/gpuguard`) and the one
/// `GPUGUARD_STATUS_DIR` names.
pub fn default_dirs(me: u32) -> Vec<Dir> {
    let mut dirs = Vec::new();
    if let Ok(own) = status::status_dir_here() {
        dirs.push(Dir {
            path: own,
            owner: (me != 0).then_some(me),
        });
    }
    if me != 0 {
        // Groups live there whatever XDG_RUNTIME_DIR says (group::base_dir).
        if let Ok(base) = gpuguard_core::group::base_dir_here()
            && !dirs.iter().any(|d| d.path == base)
        {
            dirs.push(Dir {
                path: base,
                owner: Some(me),
            });
        }
        return dirs;
    }
    let uid_dirs = |parent: &str, prefix: &str, tail: &str| -> Vec<Dir> {
        let mut found: Vec<Dir> = std::fs::read_dir(parent)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let uid = name.to_str()?.strip_prefix(prefix)?.parse::<u32>().ok()?;
                Some(Dir {
                    path: e.path().join(tail),
                    owner: Some(uid),
                })
            })
            .collect();
        found.sort_by(|a, b| a.path.cmp(&b.path));
        found
    };
    for d in uid_dirs("/dev/shm", "gpuguard-", "")
        .into_iter()
        .chain(uid_dirs("/run/user", "", "gpuguard"))
    {
        let path = PathBuf::from(d.path.to_string_lossy().trim_end_matches('/'));
        if !dirs.iter().any(|x| x.path == path) {
            dirs.push(Dir { path, ..d });
        }
    }
    dirs
}

/// What one look at the directories found.
#[derive(Debug, Default)]
pub struct Look {
    pub statuses: Vec<Status>,
    /// Status files read and used.
    pub read: u64,
    pub skipped: BTreeMap<Skip, u64>,
    /// Directories read (missing ones are not counted anywhere).
    pub dirs_read: u64,
}

/// A group sharing a budget (`GPUGUARD_GROUP`) as its file has it now.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupFigures {
    pub name: String,
    /// Per device: UUID (`GPU-...`), budget ([`group::UNLIMITED`]: none) and use.
    pub devices: Vec<(String, u64, u64)>,
    /// Members with a slot, those gone but not yet taken out by a member (or by
    /// `gpuguard ps` or `gpuguard group`) included.
    pub members: u64,
}

/// The groups of the status directory open as `dir` (of user `owner`), added to
/// `out` unless a group of that name is there already; counts in `skipped` the
/// group files that cannot be used (and a `groups` directory that is not safe). The
/// `groups` directory is opened relative to `dir` and checked as `dir` was; each
/// file read-only, relative to it, never through a link ([`Group::open_read_only`]).
fn read_groups(dir: &OwnedFd, owner: u32, out: &mut Vec<GroupFigures>, skipped: &mut u64) {
    // SAFETY: a directory descriptor and a NUL-terminated name.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c"groups".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        // No group made yet, or something else in its place.
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT) {
            *skipped += 1;
        }
        return;
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let safe = fd
        .try_clone()
        .map(std::fs::File::from)
        .and_then(|f| f.metadata())
        .is_ok_and(|m| m.uid() == owner && m.permissions().mode() & 0o077 == 0);
    let base = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    let listing = match std::fs::read_dir(&base) {
        Ok(l) if safe => l,
        _ => {
            *skipped += 1;
            return;
        }
    };
    let mut files = 0usize;
    for entry in listing.flatten() {
        let file_name = entry.file_name();
        let Some(name) = file_name
            .to_str()
            .filter(|n| !n.starts_with('.'))
            .and_then(|n| n.strip_suffix(".group"))
        else {
            continue;
        };
        files += 1;
        if files > MAX_FILES_PER_DIR || group::check_name(name).is_err() {
            *skipped += 1;
            continue;
        }
        // Through the descriptor's directory: what is read is in what was checked.
        let Ok(g) = Group::open_read_only(&base.join(&file_name), name, owner) else {
            *skipped += 1;
            continue;
        };
        if out.iter().any(|x| x.name == name) {
            // The same name in two status directories: one series only.
            *skipped += 1;
            continue;
        }
        out.push(GroupFigures {
            name: name.to_string(),
            devices: g
                .devices()
                .into_iter()
                .map(|(i, uuid, budget)| (cap::uuid_string(&uuid), budget, g.used(i)))
                .collect(),
            members: g.members().len() as u64,
        });
    }
}

/// Opens `path` as a directory, never through a link.
fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated path; the descriptor returned is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `name` in the directory `dir` for reading: never through a link, never
/// waiting for a writer.
fn open_in(dir: &OwnedFd, name: &std::ffi::OsStr) -> std::io::Result<std::fs::File> {
    let c = CString::new(name.as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a directory descriptor and a NUL-terminated name.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// One status file, or why it was skipped; `Ok(None)` when it vanished meanwhile.
fn read_file(dir: &OwnedFd, owner: u32, name: &std::ffi::OsStr) -> Result<Option<Status>, Skip> {
    let file = match open_in(dir, name) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(Skip::Symlink),
        Err(_) => return Err(Skip::Unreadable),
    };
    let meta = file.metadata().map_err(|_| Skip::Unreadable)?;
    if !meta.is_file() {
        return Err(Skip::NotRegular);
    }
    if meta.uid() != owner {
        return Err(Skip::OtherUser);
    }
    if meta.len() > status::MAX_FILE_BYTES {
        return Err(Skip::TooBig);
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(status::MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|_| Skip::Unreadable)?;
    if bytes.len() as u64 > status::MAX_FILE_BYTES {
        return Err(Skip::TooBig);
    }
    let s: Status = serde_json::from_slice(&bytes).map_err(|_| Skip::Garbage)?;
    if s.schema != status::SCHEMA {
        return Err(Skip::Garbage);
    }
    Ok(Some(s))
}

/// Reads every status file of `dirs`. A file whose process is gone (or whose pid now
/// names another process) is used while it is younger than `grace_ms`: its process
/// may run in another pid namespace (a container), or have just ended.
pub fn look(dirs: &[Dir], proc_root: &Path, now_ms: u64, grace_ms: u64) -> Look {
    let mut out = Look::default();
    let skip = |out: &mut Look, why: Skip| *out.skipped.entry(why).or_insert(0) += 1;
    for d in dirs {
        let fd = match open_dir(&d.path) {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                skip(&mut out, Skip::UnsafeDir);
                continue;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                skip(&mut out, Skip::UnsafeDir);
                continue;
            }
            Err(_) => {
                skip(&mut out, Skip::Unreadable);
                continue;
            }
        };
        // Checked on the descriptor: what is read is what was checked.
        let meta = fd
            .try_clone()
            .map(std::fs::File::from)
            .and_then(|f| f.metadata());
        let Ok(meta) = meta else {
            skip(&mut out, Skip::Unreadable);
            continue;
        };
        if d.owner.is_some_and(|o| o != meta.uid()) || meta.permissions().mode() & 0o077 != 0 {
            skip(&mut out, Skip::UnsafeDir);
            continue;
        }
        let owner = meta.uid();
        let listing = std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        let Ok(listing) = listing else {
            skip(&mut out, Skip::Unreadable);
            continue;
        };
        out.dirs_read += 1;
        let mut files = 0usize;
        for entry in listing.flatten() {
            let name = entry.file_name();
            // Only `<pid>.json`: temporaries and anything else are not status files.
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".json"))
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            files += 1;
            if files > MAX_FILES_PER_DIR {
                skip(&mut out, Skip::TooMany);
                continue;
            }
            match read_file(&fd, owner, &name) {
                Ok(None) => {}
                Ok(Some(s)) if s.pid != pid => skip(&mut out, Skip::Garbage),
                Ok(Some(s)) => {
                    let running =
                        status::process_start_ticks(proc_root, pid) == Some(s.start_ticks);
                    if !running && now_ms.saturating_sub(s.updated_unix_ms) > grace_ms {
                        skip(&mut out, Skip::Stale);
                        continue;
                    }
                    out.read += 1;
                    out.statuses.push(s);
                }
                Err(why) => skip(&mut out, why),
            }
        }
    }
    out
}

/// Where the status directories are: the default ones (of user `me`, or of every
/// user for root), given ones, and every subdirectory of given roots (one per job
/// or container, made by the library under `GPUGUARD_STATUS_DIR`). Found again at
/// each look: a user or a job that starts later is seen.
#[derive(Clone, Debug, Default)]
pub struct Source {
    /// `Some(me)`: the default directories of this user (of all, for root).
    pub defaults: Option<u32>,
    pub dirs: Vec<Dir>,
    /// Directories whose subdirectories are status directories, and whose those
    /// must be (`None`: anyone's, for root).
    pub roots: Vec<(PathBuf, Option<u32>)>,
}

/// At most this many subdirectories of a root are read.
pub const MAX_SUBDIRS: usize = 4096;

impl Source {
    pub fn dirs(&self) -> Vec<Dir> {
        let mut out = self.defaults.map(default_dirs).unwrap_or_default();
        out.extend(self.dirs.iter().cloned());
        for (root, owner) in &self.roots {
            let mut subs: Vec<PathBuf> = std::fs::read_dir(root)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .take(MAX_SUBDIRS)
                .collect();
            subs.sort();
            out.extend(subs.into_iter().map(|path| Dir {
                path,
                owner: *owner,
            }));
        }
        out
    }
}

/// The processes seen, each kept for the grace period after it was last read.
pub struct Fleet {
    pub source: Source,
    pub grace_ms: u64,
    proc_root: PathBuf,
    /// By (directory, pid, start time): the last status read and when (unix ms).
    seen: HashMap<(PathBuf, u32, u64), (Status, u64)>,
}

/// What [`Fleet::refresh`] gives: the processes to expose and the last look's counts.
pub struct View {
    pub statuses: Vec<Status>,
    pub look: Look,
    /// The groups read now, by name.
    pub groups: Vec<GroupFigures>,
    /// Group files (or `groups` directories) that could not be used.
    pub groups_skipped: u64,
}

impl Fleet {
    pub fn new(source: Source, grace_ms: u64) -> Fleet {
        Fleet {
            source,
            grace_ms,
            proc_root: PathBuf::from("/proc"),
            seen: HashMap::new(),
        }
    }

    /// Reads the directories now; the processes read, and those read within the
    /// grace period, by pid.
    pub fn refresh(&mut self, now_ms: u64) -> View {
        let mut total = Look::default();
        let mut groups = Vec::new();
        let mut groups_skipped = 0;
        for d in self.source.dirs() {
            group_look(&d, &mut groups, &mut groups_skipped);
            let one = look(
                std::slice::from_ref(&d),
                &self.proc_root,
                now_ms,
                self.grace_ms,
            );
            for s in &one.statuses {
                self.seen
                    .insert((d.path.clone(), s.pid, s.start_ticks), (s.clone(), now_ms));
            }
            total.read += one.read;
            total.dirs_read += one.dirs_read;
            for (k, v) in one.skipped {
                *total.skipped.entry(k).or_insert(0) += v;
            }
        }
        let grace = self.grace_ms;
        self.seen
            .retain(|_, (_, at)| now_ms.saturating_sub(*at) <= grace);
        let mut statuses: Vec<Status> = self.seen.values().map(|(s, _)| s.clone()).collect();
        statuses.sort_by_key(|s| (s.pid, s.start_ticks));
        groups.sort_by(|a, b| a.name.cmp(&b.name));
        View {
            statuses,
            look: total,
            groups,
            groups_skipped,
        }
    }
}

/// The groups of status directory `d`, when it is one to read (as [`look`] checks
/// it: no link, its owner's, mode 0700); nothing when it is not, [`look`] counting it.
fn group_look(d: &Dir, out: &mut Vec<GroupFigures>, skipped: &mut u64) {
    let Ok(fd) = open_dir(&d.path) else {
        return;
    };
    let meta = fd
        .try_clone()
        .map(std::fs::File::from)
        .and_then(|f| f.metadata());
    let Ok(meta) = meta else {
        return;
    };
    if d.owner.is_some_and(|o| o != meta.uid()) || meta.permissions().mode() & 0o077 != 0 {
        return;
    }
    read_groups(&fd, meta.uid(), out, skipped);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::DirBuilderExt;

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("gpuguard-fleet-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        dir
    }

    fn me() -> u32 {
        std::fs::metadata("/proc/self").unwrap().uid()
    }

    fn status_of_me(updated: u64) -> Status {
        let pid = std::process::id();
        Status {
            schema: status::SCHEMA.into(),
            pid,
            program: "t".into(),
            start_ticks: status::process_start_ticks(Path::new("/proc"), pid).unwrap(),
            updated_unix_ms: updated,
            ..Default::default()
        }
    }

    #[test]
    fn hostile_files_are_counted_by_why_and_never_followed() {
        let dir = temp_dir("hostile");
        let me_pid = std::process::id();
        status::write_status(&dir, &status_of_me(1_000)).unwrap();
        std::fs::write(dir.join("11.json"), "{not json").unwrap();
        std::fs::write(
            dir.join("12.json"),
            vec![b' '; (status::MAX_FILE_BYTES + 1) as usize],
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.join("13.json")).unwrap();
        let fifo = CString::new(dir.join("14.json").as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        // Another pid than its name says.
        let mut other = status_of_me(1_000);
        other.pid = 15;
        std::fs::write(dir.join("16.json"), serde_json::to_vec(&other).unwrap()).unwrap();
        // A process that is gone, its file old: stale; young: still listed.
        let mut gone = status_of_me(1_000);
        gone.pid = u32::MAX - 3;
        status::write_status(&dir, &gone).unwrap();
        let dirs = [Dir {
            path: dir.clone(),
            owner: Some(me()),
        }];
        let l = look(&dirs, Path::new("/proc"), 1_000 + 60_001, 60_000);
        assert_eq!(
            l.statuses.iter().map(|s| s.pid).collect::<Vec<_>>(),
            [me_pid]
        );
        let counts: Vec<(&str, u64)> = l.skipped.iter().map(|(k, v)| (k.label(), *v)).collect();
        assert_eq!(
            counts,
            [
                ("garbage", 2),
                ("too_big", 1),
                ("symlink", 1),
                ("not_regular", 1),
                ("stale", 1)
            ]
        );
        let l = look(&dirs, Path::new("/proc"), 1_000 + 59_000, 60_000);
        assert_eq!(l.statuses.len(), 2);
        // The directory of another user, or open to others: not read at all.
        let wrong = [Dir {
            path: dir.clone(),
            owner: Some(me().wrapping_add(1)),
        }];
        let l = look(&wrong, Path::new("/proc"), 0, 60_000);
        assert!(l.statuses.is_empty());
        assert_eq!(l.skipped.get(&Skip::UnsafeDir), Some(&1));
        let link = dir.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let l = look(
            &[Dir {
                path: link.clone(),
                owner: None,
            }],
            Path::new("/proc"),
            0,
            60_000,
        );
        assert!(l.statuses.is_empty());
        assert_eq!(l.skipped.get(&Skip::UnsafeDir), Some(&1));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let l = look(&dirs, Path::new("/proc"), 0, 60_000);
        assert!(l.statuses.is_empty());
        let _ = std::fs::remove_file(link);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn an_ended_process_stays_for_the_grace_period() {
        let dir = temp_dir("grace");
        status::write_status(&dir, &status_of_me(5_000)).unwrap();
        let source = Source {
            dirs: vec![Dir {
                path: dir.clone(),
                owner: Some(me()),
            }],
            ..Default::default()
        };
        let mut fleet = Fleet::new(source, 10_000);
        assert_eq!(fleet.refresh(5_000).statuses.len(), 1);
        status::remove_status(&dir, std::process::id()).unwrap();
        assert_eq!(
            fleet.refresh(15_000).statuses.len(),
            1,
            "within the grace period"
        );
        assert!(fleet.refresh(15_001).statuses.is_empty(), "past it");
        let _ = std::fs::remove_dir_all(dir);
    }
}
