//! One memory budget per device shared by the processes of a group
//! (`GPUGUARD_GROUP`): a small file mapped by every member, changed only with
//! atomic operations on it. No lock: HAMi-core's shared region is guarded by a
//! semaphore, and a member SIGKILLed while holding it stops every other member
//! (HAMi-core #86, #260, #248). Here nothing is ever held: a dead member's bytes are
//! only counted, in its own slot, and taken back by whoever finds it dead.
//!
//! The file: a header, a table of devices (matched by UUID, so processes with
//! different `CUDA_VISIBLE_DEVICES` share the right budget) and a slot per member.
//! A member's slot holds, per device, the bytes it has reserved; the group's use of a
//! device is the sum over slots. A reservation adds to its own slot first, then sums
//! every slot (sequentially consistent operations), and takes its bytes back when
//! the sum is over the budget: of two reservations racing, the later one in the
//! single order of those operations sees both, so the budget is never exceeded. A
//! member killed in the middle of a reservation left its bytes in its own slot,
//! which goes back whole when the slot is reclaimed.
//!
//! A slot is owned by a word holding the member's pid and its start time (low 31
//! bits of clock ticks since boot): a pid reused by another process has another
//! start time, so it is not mistaken for the member.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::*};

/// The layout's version: a file of another version is refused, never written.
pub const VERSION: u32 = 1;
/// Members a group can have at once.
pub const SLOTS: usize = 64;
/// Devices a group can share.
pub const DEVICES: usize = 16;
/// A device's budget when the group's setting names none: no limit.
pub const UNLIMITED: u64 = u64::MAX;

const MAGIC: u64 = u64::from_le_bytes(*b"GGGROUP\0");
/// An owner word with this bit set: the slot is being reclaimed by the pid in its
/// low bits.
const RECLAIMING: u64 = 1 << 63;

#[repr(C, align(64))]
struct Header {
    magic: u64,
    version: u32,
    header_bytes: u32,
    slots: u32,
    devices: u32,
    uid: u32,
    _pad: u32,
    /// The pid namespace (inode of `/proc/self/ns/pid`) of the creator: pids mean
    /// something only within one.
    pid_ns: u64,
    /// Bumped by a member refused for the budget: the others give back what they
    /// hold unused and trim their frameworks' caches.
    squeeze: AtomicU64,
    created_unix_ms: u64,
}

#[repr(C, align(64))]
struct DeviceEntry {
    /// 0 free, else the tag of the device's UUID (`uuid_tag`).
    state: AtomicU64,
    uuid: [AtomicU64; 2],
    budget: AtomicU64,
}

#[repr(C, align(64))]
struct Slot {
    /// 0 free; `start31 << 32 | pid`; or `RECLAIMING | pid`.
    owner: AtomicU64,
    /// The last `squeeze` this member answered.
    squeeze_seen: AtomicU64,
    held: [AtomicU64; DEVICES],
}

#[repr(C)]
struct Layout {
    header: Header,
    devices: [DeviceEntry; DEVICES],
    slots: [Slot; SLOTS],
}

/// The file's size.
pub const FILE_BYTES: usize = std::mem::size_of::<Layout>();

/// Why a group cannot be used: said to the user as it is.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupError(pub String);

impl std::fmt::Display for GroupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn err(msg: impl Into<String>) -> GroupError {
    GroupError(msg.into())
}

/// Whether `name` may name a group ([`crate::group_name::valid`]), as an error that
/// says the rule.
pub fn check_name(name: &str) -> Result<(), GroupError> {
    if crate::group_name::valid(name) {
        Ok(())
    } else {
        Err(err(format!(
            "GPUGUARD_GROUP={name:?}: a group name is {}",
            crate::group_name::RULE
        )))
    }
}

/// The directory of a user's group files: `groups` in [`base_dir`].
pub fn dir(base: &Path) -> PathBuf {
    base.join("groups")
}

/// Where a user's group files live, whatever `XDG_RUNTIME_DIR` a member has (two
/// members of one group with different ones must still find one file; a login
/// session's runtime directory also goes at its last logout): `GPUGUARD_STATUS_DIR`
/// when set to an absolute path (a directory a job's containers share), else
/// `/dev/shm/gpuguard-<uid>`. `var` reads an environment variable.
pub fn base_dir(var: impl Fn(&str) -> Option<std::ffi::OsString>, uid: u32) -> PathBuf {
    crate::status::status_dir(
        |k| {
            (k == crate::status::STATUS_DIR_VAR)
                .then(|| var(k))
                .flatten()
        },
        uid,
    )
}

/// [`base_dir`] of this process's environment and user.
pub fn base_dir_here() -> io::Result<PathBuf> {
    let uid = std::fs::metadata("/proc/self")?.uid();
    Ok(base_dir(|k| std::env::var_os(k), uid))
}

/// The file of group `name` under [`base_dir`] `base`.
pub fn path(base: &Path, name: &str) -> PathBuf {
    dir(base).join(format!("{name}.group"))
}

/// This process's pid namespace (the inode of `/proc/self/ns/pid`; 0 unknown).
pub fn pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// The owner word of process `pid` started at `start_ticks`.
pub fn owner_word(pid: u32, start_ticks: u64) -> u64 {
    ((start_ticks & 0x7fff_ffff) << 32) | u64::from(pid)
}

/// A member as the file has it.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    pub slot: usize,
    pub pid: u32,
    /// Reserved bytes per device entry.
    pub held: [u64; DEVICES],
}

/// A group file, mapped.
#[derive(Debug)]
pub struct Group {
    map: *mut Layout,
    path: PathBuf,
    /// The mapped file's device and inode: whether its name still names it.
    id: (u64, u64),
}

// SAFETY: every field of the mapping read or written concurrently is an atomic; the
// plain header fields are written once, before the file gets its name.
unsafe impl Send for Group {}
unsafe impl Sync for Group {}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: our own mapping of FILE_BYTES.
        unsafe { libc::munmap(self.map.cast(), FILE_BYTES) };
    }
}

impl Group {
    /// Opens group `name` of this user, creating its file (mode 0600) if there is
    /// none. Two processes creating it at the same instant agree on one file: each
    /// writes a whole file under a name of its own and links it to the group's name,
    /// which only one link can take.
    pub fn open_or_create(status_dir: &Path, name: &str) -> Result<Group, GroupError> {
        check_name(name)?;
        let dir = dir(status_dir);
        crate::status::ensure_dir(status_dir)
            .and_then(|()| crate::status::ensure_dir(&dir))
            .map_err(|e| err(format!("group {name}: {e}")))?;
        let path = path(status_dir, name);
        match std::fs::symlink_metadata(&path) {
            Ok(_) => return Self::open(&path, name),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(format!("group {name}: {}: {e}", path.display()))),
        }
        let tmp = dir.join(format!(".{name}.{}.new", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let made = (|| -> io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)?;
            use std::io::Write;
            f.write_all(&initial_bytes())?;
            match std::fs::hard_link(&tmp, &path) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
                _ => Ok(()),
            }
        })();
        let _ = std::fs::remove_file(&tmp);
        made.map_err(|e| {
            err(format!(
                "group {name}: cannot create {}: {e}",
                path.display()
            ))
        })?;
        Self::open(&path, name)
    }

    /// Opens an existing group file, checking it: a regular file of this user, mode
    /// 0600, of this layout and version, made in this pid namespace.
    pub fn open(path: &Path, name: &str) -> Result<Group, GroupError> {
        let me = std::fs::metadata("/proc/self")
            .map_err(|e| err(format!("group {name}: {e}")))?
            .uid();
        let g = Self::map_checked(path, name, me, true)?;
        let ns = pid_namespace();
        let made_in = g.layout().header.pid_ns;
        if made_in != 0 && ns != 0 && made_in != ns {
            return Err(err(format!(
                "group {name}: {}: made in another pid namespace (a container): its members' pids mean nothing here; not used",
                path.display()
            )));
        }
        Ok(g)
    }

    /// Opens a group file of user `owner` only to read it (`gpuguard metrics`, which
    /// may run as root with read access only, and changes nothing): opened read-only
    /// and mapped privately, so that nothing done through the mapping reaches the
    /// file. Checked as [`Group::open`] checks, less the pid namespace (its pids are
    /// not looked at). `path`'s last component is not followed if a link.
    pub fn open_read_only(path: &Path, name: &str, owner: u32) -> Result<Group, GroupError> {
        Self::map_checked(path, name, owner, false)
    }

    /// `path` opened (never through a link) and mapped, if it is a regular file of
    /// user `owner`, mode 0600, of this layout's size, and its header says this
    /// layout and version and that user: shared and writable when `write`, else
    /// read-only and private.
    fn map_checked(path: &Path, name: &str, owner: u32, write: bool) -> Result<Group, GroupError> {
        let bad = |why: String| err(format!("group {name}: {}: {why}; not used", path.display()));
        let file: File = OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| bad(e.to_string()))?;
        let meta = file.metadata().map_err(|e| bad(e.to_string()))?;
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        if meta.uid() != owner {
            return Err(bad("belongs to another user".into()));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(bad("other users can reach it (mode is not 0600)".into()));
        }
        if meta.len() != FILE_BYTES as u64 {
            return Err(bad(format!(
                "{} bytes, not the {FILE_BYTES} of this version's layout (another version of gpuguard, or damaged)",
                meta.len()
            )));
        }
        use std::os::fd::AsRawFd;
        // SAFETY: a mapping of the whole file, which has exactly that size; a
        // private one shows the file's contents in pages never written.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                if write {
                    libc::MAP_SHARED
                } else {
                    libc::MAP_PRIVATE
                },
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(bad(io::Error::last_os_error().to_string()));
        }
        let g = Group {
            map: p.cast(),
            path: path.to_path_buf(),
            id: (meta.dev(), meta.ino()),
        };
        let h = &g.layout().header;
        if h.magic != MAGIC {
            return Err(bad("not a group file".into()));
        }
        if h.version != VERSION
            || h.header_bytes as usize != std::mem::size_of::<Header>()
            || h.slots as usize != SLOTS
            || h.devices as usize != DEVICES
        {
            return Err(bad(format!(
                "layout version {} (this gpuguard's is {VERSION})",
                h.version
            )));
        }
        if h.uid != owner {
            return Err(bad("made by another user".into()));
        }
        Ok(g)
    }

    fn layout(&self) -> &Layout {
        // SAFETY: a live mapping of a whole `Layout` (checked size).
        unsafe { &*self.map }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the group's name still names the file this process mapped (a file
    /// removed or replaced splits the group: members opening it now get another).
    pub fn still_named(&self) -> bool {
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id)
    }

    /// The device entry of `uuid`, claimed if the group has none, its budget set to
    /// `budget` if none is set yet (a later member's own setting does not change
    /// it; see [`Group::join`] for a new job). `None` when the table is full. One
    /// compare-and-swap claims an entry and names its device (a tag made from the
    /// UUID), so two members can never claim two entries for one device, however
    /// long either stalls.
    pub fn device(&self, uuid: &[u8; 16], budget: u64) -> Option<usize> {
        let (a, b) = uuid_words(uuid);
        let tag = uuid_tag(a, b);
        for (i, e) in self.layout().devices.iter().enumerate() {
            let found = match e.state.compare_exchange(0, tag, AcqRel, Acquire) {
                Ok(_) => {
                    e.uuid[0].store(a, Relaxed);
                    e.uuid[1].store(b, Relaxed);
                    true
                }
                Err(t) => t == tag,
            };
            if found {
                let _ = e.budget.compare_exchange(0, budget.max(1), AcqRel, Relaxed);
                return Some(i);
            }
        }
        None
    }

    /// The UUIDs and budgets of the devices the group has.
    pub fn devices(&self) -> Vec<(usize, [u8; 16], u64)> {
        self.layout()
            .devices
            .iter()
            .enumerate()
            .filter(|(_, e)| e.state.load(Acquire) != 0)
            .map(|(i, e)| {
                let mut u = [0u8; 16];
                u[..8].copy_from_slice(&e.uuid[0].load(Relaxed).to_le_bytes());
                u[8..].copy_from_slice(&e.uuid[1].load(Relaxed).to_le_bytes());
                (i, u, e.budget.load(Relaxed))
            })
            .collect()
    }

    /// A device's budget ([`UNLIMITED`]: none; 0: not set yet, by a member that
    /// claimed the device an instant ago).
    pub fn budget(&self, dev: usize) -> u64 {
        self.layout().devices[dev].budget.load(Acquire)
    }

    /// Changes a device's budget while the group runs: what is allocated stays; the
    /// members are squeezed, so their unused leases come back (within a second, by
    /// their helper threads) and allocations past the new budget are refused.
    pub fn set_budget(&self, dev: usize, bytes: u64) {
        self.layout().devices[dev]
            .budget
            .store(bytes.max(1), Release);
        self.squeeze();
    }

    /// Takes a slot for process `owner` ([`owner_word`]); `None` when all [`SLOTS`]
    /// are taken. A slot with this very owner word is this process's before an
    /// `exec` (same pid, same start time): taken again, its count emptied. A member
    /// that finds no other member is a new job: the budgets set by an earlier one
    /// are forgotten, so its own `GPUGUARD_GROUP_CAP` applies.
    pub fn join(&self, owner: u64) -> Option<usize> {
        let l = self.layout();
        let pid = owner & 0xffff_ffff;
        let mine = l.slots.iter().position(|s| {
            let w = s.owner.load(Acquire);
            w == owner
                || (w == RECLAIMING | pid
                    && s.owner.compare_exchange(w, owner, AcqRel, Relaxed).is_ok())
        });
        let slot = mine.or_else(|| {
            l.slots
                .iter()
                .position(|s| s.owner.compare_exchange(0, owner, AcqRel, Relaxed).is_ok())
        })?;
        let s = &l.slots[slot];
        for h in &s.held {
            h.store(0, SeqCst);
        }
        s.squeeze_seen
            .store(l.header.squeeze.load(Relaxed), Relaxed);
        if self.members().iter().all(|m| m.slot == slot) {
            for e in &l.devices {
                e.budget.store(0, Release);
            }
        }
        Some(slot)
    }

    /// Gives back everything slot `slot` holds (a member's exit). The slot stays
    /// marked with the member's pid until the process is gone (a reclaim frees it):
    /// a thread of the exiting process still in a hook cannot reach another
    /// member's count through it.
    pub fn leave(&self, slot: usize, owner: u64) {
        let s = &self.layout().slots[slot];
        let left = RECLAIMING | (owner & 0xffff_ffff);
        if s.owner
            .compare_exchange(owner, left, AcqRel, Relaxed)
            .is_err()
        {
            return;
        }
        for h in &s.held {
            h.store(0, SeqCst);
        }
    }

    /// Reserves `bytes` of device `dev` for slot `slot`, never taking the group past
    /// the device's budget. `between` runs after the slot's own count rose and before
    /// the group's sum is read (tests stop a member there). Never waits on another
    /// member: a sum over the budget made only by another reservation in flight is
    /// looked at again a few times, then refused.
    pub fn reserve(&self, slot: usize, dev: usize, bytes: u64, between: &dyn Fn()) -> bool {
        let budget = self.budget(dev);
        let mine = &self.layout().slots[slot].held[dev];
        // Checked: a count that wrapped would let anything through.
        let add = || {
            mine.fetch_update(SeqCst, Relaxed, |h| h.checked_add(bytes))
                .is_ok()
        };
        if budget == UNLIMITED {
            return add();
        }
        if bytes > budget {
            return false;
        }
        for attempt in 0..16 {
            if !add() {
                return false;
            }
            between();
            let used = self.used(dev);
            if used <= budget {
                return true;
            }
            mine.fetch_sub(bytes, SeqCst);
            // Over the budget even without this reservation's bytes, as the slots
            // stand now (another reservation in flight counts there too): refused.
            // Else another reservation was in flight and went: again.
            if self.used(dev).saturating_add(bytes) > budget {
                return false;
            }
            for _ in 0..(1 << attempt.min(8)) {
                std::hint::spin_loop();
            }
        }
        false
    }

    /// Gives back `bytes` of device `dev` from slot `slot` (no lower than 0).
    pub fn release(&self, slot: usize, dev: usize, bytes: u64) {
        let _ = self.layout().slots[slot].held[dev]
            .fetch_update(SeqCst, Relaxed, |h| Some(h.saturating_sub(bytes)));
    }

    /// What slot `slot` holds of device `dev`.
    pub fn held(&self, slot: usize, dev: usize) -> u64 {
        self.layout().slots[slot].held[dev].load(SeqCst)
    }

    /// What the group holds of device `dev`: the sum over slots.
    pub fn used(&self, dev: usize) -> u64 {
        self.layout()
            .slots
            .iter()
            .map(|s| s.held[dev].load(SeqCst))
            .fold(0u64, u64::saturating_add)
    }

    /// The members now, with what each holds.
    pub fn members(&self) -> Vec<Member> {
        self.layout()
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let w = s.owner.load(Acquire);
                (w != 0 && w & RECLAIMING == 0).then(|| Member {
                    slot: i,
                    pid: w as u32,
                    held: std::array::from_fn(|d| s.held[d].load(Relaxed)),
                })
            })
            .collect()
    }

    /// Asks every member to give back what it holds unused and to trim its
    /// frameworks' caches (a member was refused for the budget).
    pub fn squeeze(&self) {
        self.layout().header.squeeze.fetch_add(1, AcqRel);
    }

    /// Whether a squeeze came since slot `slot` last answered one; marks it answered.
    pub fn take_squeeze(&self, slot: usize) -> bool {
        let now = self.layout().header.squeeze.load(Acquire);
        self.layout().slots[slot].squeeze_seen.swap(now, AcqRel) != now
    }

    /// Frees the slots of members that are gone: their pid names no process, or a
    /// process with another start time (`proc_root`'s `<pid>/stat`), and gives their
    /// bytes back. `quick` asks only whether the pid exists (no file read: for a
    /// hook); a reused pid is then taken as alive, and left to a full look. Returns
    /// the bytes given back.
    pub fn reclaim_dead(&self, proc_root: &Path, quick: bool) -> u64 {
        let me = u64::from(std::process::id());
        let mut freed = 0u64;
        for s in &self.layout().slots {
            let w = s.owner.load(Acquire);
            if w == 0 {
                continue;
            }
            let pid = w as u32;
            let dead = if w & RECLAIMING != 0 {
                // A reclaimer that died in the middle: another one finishes.
                !alive(pid as i32)
            } else if quick {
                !alive(pid as i32)
            } else {
                match crate::status::process_start_ticks(proc_root, pid) {
                    None => !alive(pid as i32),
                    Some(t) => owner_word(pid, t) != w || ended(proc_root, pid),
                }
            };
            if !dead
                || s.owner
                    .compare_exchange(w, RECLAIMING | me, AcqRel, Relaxed)
                    .is_err()
            {
                continue;
            }
            for h in &s.held {
                freed = freed.saturating_add(h.swap(0, SeqCst));
            }
            s.owner.store(0, Release);
        }
        freed
    }
}

/// Whether process `pid` has ended but not been reaped (state Z or X in
/// `<proc>/<pid>/stat`): it holds no memory, and a signal-0 probe says it exists.
fn ended(proc_root: &Path, pid: u32) -> bool {
    std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).is_ok_and(|stat| {
        stat.rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X")
    })
}

/// A device entry's state word once claimed: a tag of its UUID, never 0.
fn uuid_tag(a: u64, b: u64) -> u64 {
    ((a ^ b.rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 1) | 1 << 63
}

fn uuid_words(u: &[u8; 16]) -> (u64, u64) {
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    a.copy_from_slice(&u[..8]);
    b.copy_from_slice(&u[8..]);
    (u64::from_le_bytes(a), u64::from_le_bytes(b))
}

/// Whether a process `pid` exists (a signal-0 probe; no file read).
fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks for the process.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// A fresh file's bytes: the header, then zeros.
fn initial_bytes() -> Vec<u8> {
    let mut bytes = vec![0u8; FILE_BYTES];
    let uid = std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid());
    let put = |b: &mut Vec<u8>, at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
    put(
        &mut bytes,
        std::mem::offset_of!(Header, magic),
        &MAGIC.to_le_bytes(),
    );
    put(
        &mut bytes,
        std::mem::offset_of!(Header, version),
        &VERSION.to_le_bytes(),
    );
    let hb = std::mem::size_of::<Header>() as u32;
    put(
        &mut bytes,
        std::mem::offset_of!(Header, header_bytes),
        &hb.to_le_bytes(),
    );
    put(
        &mut bytes,
        std::mem::offset_of!(Header, slots),
        &(SLOTS as u32).to_le_bytes(),
    );
    put(
        &mut bytes,
        std::mem::offset_of!(Header, devices),
        &(DEVICES as u32).to_le_bytes(),
    );
    put(
        &mut bytes,
        std::mem::offset_of!(Header, uid),
        &uid.to_le_bytes(),
    );
    put(
        &mut bytes,
        std::mem::offset_of!(Header, pid_ns),
        &pid_namespace().to_le_bytes(),
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    put(
        &mut bytes,
        std::mem::offset_of!(Header, created_unix_ms),
        &now.to_le_bytes(),
    );
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gg-group-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn names_that_are_not_file_names_are_refused() {
        for bad in ["", "a/b", "..", ".x", "a b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["ddp", "job-1.a_b", &"x".repeat(64)] {
            assert!(check_name(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn reservations_stop_at_the_budget_and_come_back() {
        let d = tmp("budget");
        let g = Group::open_or_create(&d, "g").unwrap();
        let a = g.join(owner_word(1, 1)).unwrap();
        let b = g.join(owner_word(2, 1)).unwrap();
        let dev = g.device(&[7; 16], 100).unwrap();
        assert_eq!(g.device(&[7; 16], 999), Some(dev), "the first budget stays");
        assert_eq!(
            g.device(&[8; 16], 5),
            Some(dev + 1),
            "another device, another entry"
        );
        assert_eq!(g.budget(dev), 100);
        assert!(g.reserve(a, dev, 60, &|| {}));
        assert!(!g.reserve(b, dev, 41, &|| {}));
        assert!(g.reserve(b, dev, 40, &|| {}));
        assert_eq!(g.used(dev), 100);
        g.release(a, dev, 60);
        assert!(g.reserve(b, dev, 60, &|| {}));
        assert_eq!((g.held(a, dev), g.held(b, dev)), (0, 100));
        // Another process opening the same name gets the same file.
        let again = Group::open_or_create(&d, "g").unwrap();
        assert_eq!(again.used(dev), 100);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_dead_members_slot_is_reclaimed_and_a_reused_pid_is_not_it() {
        let d = tmp("reclaim");
        let g = Group::open_or_create(&d, "g").unwrap();
        let me = std::process::id();
        let start = crate::status::process_start_ticks(Path::new("/proc"), me).unwrap();
        // This process, with its own start time: alive.
        let live = g.join(owner_word(me, start)).unwrap();
        // This pid with another start time: a member that died, its pid reused.
        let reused = g.join(owner_word(me, start + 1)).unwrap();
        let dev = g.device(&[1; 16], 1000).unwrap();
        assert!(g.reserve(live, dev, 100, &|| {}));
        assert!(g.reserve(reused, dev, 300, &|| {}));
        // The quick look (pid exists) cannot tell; the full one can.
        assert_eq!(g.reclaim_dead(Path::new("/proc"), true), 0);
        assert_eq!(g.reclaim_dead(Path::new("/proc"), false), 300);
        assert_eq!(g.used(dev), 100);
        assert_eq!(g.members().len(), 1);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_huge_reservation_cannot_wrap_the_count() {
        let d = tmp("wrap");
        let g = Group::open_or_create(&d, "g").unwrap();
        let a = g.join(owner_word(1, 1)).unwrap();
        let dev = g.device(&[3; 16], 1 << 30).unwrap();
        assert!(g.reserve(a, dev, 100, &|| {}));
        assert!(!g.reserve(a, dev, u64::MAX - 50, &|| {}));
        assert!(!g.reserve(a, dev, u64::MAX, &|| {}));
        assert_eq!(g.used(dev), 100);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_left_slot_takes_no_new_member_until_its_process_is_gone_and_exec_takes_its_own_back() {
        let d = tmp("leave");
        let g = Group::open_or_create(&d, "g").unwrap();
        let me = std::process::id();
        let start = crate::status::process_start_ticks(Path::new("/proc"), me).unwrap();
        let mine = owner_word(me, start);
        let a = g.join(mine).unwrap();
        let other = g.join(owner_word(1, 1)).unwrap();
        let dev = g.device(&[4; 16], 1000).unwrap();
        assert!(g.reserve(a, dev, 300, &|| {}));
        g.leave(a, mine);
        assert_eq!(g.used(dev), 0);
        // A stray write of the leaving process lands in its own slot, which no new
        // member was given.
        let newcomer = g.join(owner_word(2, 1)).unwrap();
        assert_ne!(newcomer, a);
        // The same process (an exec'd image: same pid and start) gets it back.
        assert_eq!(g.join(mine), Some(a));
        // A slot that still names this process's owner word is taken again, emptied.
        assert!(g.reserve(a, dev, 200, &|| {}));
        assert_eq!(g.join(mine), Some(a));
        assert_eq!(g.held(a, dev), 0);
        let _ = other;
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_new_job_sets_its_own_budget() {
        let d = tmp("stale");
        let g = Group::open_or_create(&d, "g").unwrap();
        let a = g.join(owner_word(1, 1)).unwrap();
        let dev = g.device(&[5; 16], 4 << 30).unwrap();
        g.leave(a, owner_word(1, 1));
        // pid 1 is alive: its left slot stays, but it is no member any more.
        let b = g.join(owner_word(2, 2)).unwrap();
        assert_eq!(g.device(&[5; 16], 100), Some(dev));
        assert_eq!(g.budget(dev), 100, "the earlier job's budget is forgotten");
        let c = g.join(owner_word(3, 3)).unwrap();
        assert_eq!(g.device(&[5; 16], 999), Some(dev));
        assert_eq!(
            g.budget(dev),
            100,
            "a member joining a running job keeps it"
        );
        let _ = (b, c);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn files_of_another_layout_or_mode_are_refused() {
        let d = tmp("bad");
        let g = Group::open_or_create(&d, "g").unwrap();
        let p = g.path().to_path_buf();
        drop(g);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            Group::open(&p, "g")
                .unwrap_err()
                .0
                .contains("mode is not 0600")
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[8] = 99; // the version
        std::fs::write(&p, &bytes).unwrap();
        assert!(
            Group::open(&p, "g")
                .unwrap_err()
                .0
                .contains("layout version 99")
        );
        std::fs::write(&p, b"short").unwrap();
        assert!(Group::open(&p, "g").unwrap_err().0.contains("5 bytes"));
        std::fs::write(&p, vec![0u8; FILE_BYTES]).unwrap();
        assert!(
            Group::open(&p, "g")
                .unwrap_err()
                .0
                .contains("not a group file")
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
