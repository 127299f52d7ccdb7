//! `gpuguard group NAME`: one memory budget shared by a group of processes
//! (`GPUGUARD_GROUP`), read from its file (`gpuguard_core::group`): per device the
//! budget, what the group uses and what is left, and its members with what each
//! holds. `--cap CAPS` changes the budget while the group runs. Also what `ps` shows
//! of every group of this user ([`list`], [`render_summary`]).

use super::output::{print, warn};
use super::text::clean;
use super::{Failure, Outcome};
use gpuguard_core::cap::{Limit, parse_limit, uuid_string};
use gpuguard_core::group::{self, Group, UNLIMITED};
use gpuguard_core::report::human_bytes;
use gpuguard_core::status;
use serde::Serialize;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// `gpuguard group` options.
#[derive(clap::Args)]
#[command(after_help = "The group's file is DIR/groups/NAME.group, DIR being \
    $GPUGUARD_STATUS_DIR where set, else /dev/shm/gpuguard-UID (whatever \
    $XDG_RUNTIME_DIR says: every member finds the same file). Members that are gone \
    are taken out first, and their bytes given back to the group.\n\n\
    --cap takes a size for every device of the group (8GiB), a size per device named \
    by its UUID or a prefix of it (GPU-3b2f:8GiB, as listed here), or none to lift \
    the budget (GPU-3b2f:none for one device); comma-separated. Ordinals (0:8GiB) and \
    fractions (0.5) are refused: ordinals differ per process and the command does not \
    know a device's total memory.")]
pub struct GroupArgs {
    /// The group's name (GPUGUARD_GROUP)
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Change the group's budget now (see below)
    #[arg(long, value_name = "CAPS")]
    pub cap: Option<String>,
    /// Print the group as JSON
    #[arg(long)]
    pub json: bool,
}

/// A new budget: bytes, or [`UNLIMITED`].
type Budget = u64;

/// `--cap` read: a budget for every device, and per UUID prefix (lower case).
#[derive(Debug, Default, PartialEq)]
pub struct NewCaps {
    pub default: Option<Budget>,
    pub per_uuid: Vec<(String, Budget)>,
}

/// One value of `--cap`: a size or `none`.
fn budget(text: &str) -> Result<Budget, String> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("none") {
        return Ok(UNLIMITED);
    }
    let fraction = || {
        format!(
            "--cap {t:?}: a share of a device's memory cannot be set here (this command does not know the device's total memory); give a size such as 8GiB"
        )
    };
    if t.ends_with('%') {
        return Err(fraction());
    }
    match parse_limit(t) {
        Some(Limit::Bytes(b)) => Ok(b),
        Some(Limit::Fraction(_)) => Err(fraction()),
        None => Err(format!(
            "--cap {t:?} is not valid; accepted: a size (8GiB, 512MiB, 1.5GB, bytes) or none"
        )),
    }
}

/// Reads `--cap`: `8GiB`, `none`, `GPU-3b2f:8GiB`, `GPU-3b2f:none`, comma-separated.
pub fn parse_caps(text: &str) -> Result<NewCaps, String> {
    let mut caps = NewCaps::default();
    if text.trim().is_empty() {
        return Err("--cap is empty; give a size (8GiB), GPU-<uuid>:SIZE or none".into());
    }
    for part in text.split(',').map(str::trim) {
        match part.split_once(':') {
            Some((dev, value)) => {
                let dev = dev.trim();
                if dev.parse::<u32>().is_ok() {
                    return Err(format!(
                        "--cap {part:?}: a device ordinal differs from one process to another; name the device by its UUID (GPU-…), as `gpuguard group` lists it"
                    ));
                }
                if !gpuguard_core::cap::uuid_name(dev) {
                    return Err(format!(
                        "--cap {part:?}: {dev:?} is not a device UUID (GPU-…) or a prefix of one"
                    ));
                }
                let dev = dev.to_ascii_lowercase();
                if caps.per_uuid.iter().any(|(d, _)| *d == dev) {
                    return Err(format!("--cap names {dev} twice"));
                }
                caps.per_uuid.push((dev, budget(value)?));
            }
            None => {
                if caps.default.replace(budget(part)?).is_some() {
                    return Err("--cap gives two values for every device".into());
                }
            }
        }
    }
    Ok(caps)
}

impl NewCaps {
    /// The new budget of the device with this UUID (`GPU-…`): the longest UUID
    /// prefix it begins with, else the value for every device.
    fn for_uuid(&self, uuid: &str) -> Option<Budget> {
        let u = uuid.to_ascii_lowercase();
        self.per_uuid
            .iter()
            .filter(|(name, _)| u.starts_with(name.as_str()))
            .max_by_key(|(name, _)| name.len())
            .map(|(_, b)| *b)
            .or(self.default)
    }
}

/// A budget for people: `none` for no limit.
fn budget_text(b: u64) -> String {
    if b == UNLIMITED {
        "none".into()
    } else {
        human_bytes(b)
    }
}

/// One device of a group, as shown.
#[derive(Serialize, Debug, Clone)]
pub struct DeviceView {
    pub uuid: String,
    /// `null`: no limit.
    pub budget_bytes: Option<u64>,
    pub used_bytes: u64,
    /// `null` when there is no limit.
    pub free_bytes: Option<u64>,
}

/// What a member holds of one device.
#[derive(Serialize, Debug, Clone)]
pub struct Held {
    pub uuid: String,
    pub bytes: u64,
}

/// One member, as shown.
#[derive(Serialize, Debug, Clone)]
pub struct MemberView {
    pub pid: u32,
    /// From the member's status file, else `/proc/<pid>/comm`; `null` when neither says.
    pub program: Option<String>,
    pub held: Vec<Held>,
}

/// A group, as shown.
#[derive(Serialize, Debug, Clone)]
pub struct GroupView {
    pub group: String,
    pub file: String,
    /// Bytes given back from members that were gone, just before this look.
    pub reclaimed_bytes: u64,
    pub devices: Vec<DeviceView>,
    pub members: Vec<MemberView>,
}

/// The program of process `pid`: its status file's name (`status_dir`), else
/// `/proc/<pid>/comm`.
fn program_of(status_dir: &Path, pid: u32) -> Option<String> {
    if let Some(s) = status::read_of(status_dir, pid) {
        return Some(s.program);
    }
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| c.trim_end_matches('\n').to_string())
        .filter(|c| !c.is_empty())
}

/// A look at `g`, whose members that are gone were already taken out
/// (`reclaimed` bytes given back).
pub fn view(g: &Group, name: &str, status_dir: &Path, reclaimed: u64) -> GroupView {
    let devices = g.devices();
    let uuids: Vec<(usize, String)> = devices
        .iter()
        .map(|(i, u, _)| (*i, uuid_string(u)))
        .collect();
    let device_views = devices
        .iter()
        .zip(&uuids)
        .map(|((i, _, budget), (_, uuid))| {
            let used = g.used(*i);
            let limited = *budget != UNLIMITED;
            DeviceView {
                uuid: uuid.clone(),
                budget_bytes: limited.then_some(*budget),
                used_bytes: used,
                free_bytes: limited.then(|| budget.saturating_sub(used)),
            }
        })
        .collect();
    let members = g
        .members()
        .into_iter()
        .map(|m| MemberView {
            pid: m.pid,
            program: program_of(status_dir, m.pid),
            held: uuids
                .iter()
                .filter_map(|(i, uuid)| {
                    let bytes = m.held.get(*i).copied().unwrap_or(0);
                    (bytes > 0).then(|| Held {
                        uuid: uuid.clone(),
                        bytes,
                    })
                })
                .collect(),
        })
        .collect();
    GroupView {
        group: name.to_string(),
        file: g.path().display().to_string(),
        reclaimed_bytes: reclaimed,
        devices: device_views,
        members,
    }
}

/// The text of `gpuguard group NAME`.
pub fn render(v: &GroupView) -> String {
    let mut out = String::new();
    put!(out, "group {} ({})", clean(&v.group), clean(&v.file));
    if v.reclaimed_bytes > 0 {
        put!(
            out,
            "took back {} from members that are gone",
            human_bytes(v.reclaimed_bytes)
        );
    }
    put!(out);
    if v.devices.is_empty() {
        put!(
            out,
            "no device yet (the first member to use one sets its budget from GPUGUARD_GROUP_CAP)"
        );
    } else {
        let mut rows = vec![
            ["DEVICE", "BUDGET", "USED", "FREE"]
                .map(String::from)
                .to_vec(),
        ];
        for d in &v.devices {
            rows.push(vec![
                d.uuid.clone(),
                d.budget_bytes.map_or("none".into(), human_bytes),
                human_bytes(d.used_bytes),
                d.free_bytes.map_or("-".into(), human_bytes),
            ]);
        }
        out.push_str(&super::text::columns(&rows, &[1, 2, 3]));
    }
    put!(out);
    if v.members.is_empty() {
        put!(out, "no members");
        return out;
    }
    let mut rows = vec![
        ["PID", "PROGRAM", "DEVICE", "HELD"]
            .map(String::from)
            .to_vec(),
    ];
    for m in &v.members {
        let program = m
            .program
            .as_deref()
            .map_or_else(|| "-".to_string(), |p| super::text::printable(p, 24));
        if m.held.is_empty() {
            rows.push(vec![
                m.pid.to_string(),
                program.clone(),
                "-".into(),
                human_bytes(0),
            ]);
        }
        for h in &m.held {
            rows.push(vec![
                m.pid.to_string(),
                program.clone(),
                h.uuid.clone(),
                human_bytes(h.bytes),
            ]);
        }
    }
    out.push_str(&super::text::columns(&rows, &[0, 3]));
    out
}

/// A group file by name: opened, or why it cannot be used.
pub type Listed = (String, Result<Group, String>);

/// The group files in `status_dir` (`groups/*.group`), by name: each opened, or why
/// it cannot be. An empty list when there is no groups directory; an error when it
/// is not one the library would use (as [`status::check_dir`] says).
pub fn list(status_dir: &Path) -> Result<Vec<Listed>, String> {
    let dir = group::dir(status_dir);
    let me = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .map_err(|e| format!("cannot find this process's user: {e}"))?;
    match status::check_dir(&dir, me) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.to_string()),
    }
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut out: Vec<Listed> = Vec::new();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let file_name = file_name.to_string_lossy();
        // `.NAME.PID.new`: a file being made by a member; not a group yet.
        if file_name.starts_with('.') {
            continue;
        }
        let Some(name) = file_name.strip_suffix(".group") else {
            continue;
        };
        let opened = match group::check_name(name) {
            Ok(()) => Group::open(&entry.path(), name).map_err(|e| e.0),
            Err(_) => Err(format!(
                "group {name}: {}: not a group name; not used",
                entry.path().display()
            )),
        };
        out.push((name.to_string(), opened));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// `ps`'s section: a line per group and device (budget, used, member pids), and a
/// line for each file that cannot be used, saying why. Members that are gone are
/// taken out first. Empty when there is no group.
pub fn render_summary(status_dir: &Path) -> String {
    let groups = match list(status_dir) {
        Ok(g) => g,
        Err(e) => return format!("\ngroups: {}\n", clean(&e)),
    };
    if groups.is_empty() {
        return String::new();
    }
    let mut rows = vec![
        ["GROUP", "DEVICE", "BUDGET", "USED", "MEMBERS"]
            .map(String::from)
            .to_vec(),
    ];
    let mut unusable = Vec::new();
    for (name, opened) in &groups {
        let g = match opened {
            Ok(g) => g,
            Err(why) => {
                // The reason names the group and its file.
                unusable.push(clean(why).into_owned());
                continue;
            }
        };
        g.reclaim_dead(Path::new("/proc"), false);
        let mut pids: Vec<u32> = g.members().iter().map(|m| m.pid).collect();
        pids.sort_unstable();
        let pids = if pids.is_empty() {
            "-".to_string()
        } else {
            pids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let devices = g.devices();
        if devices.is_empty() {
            rows.push(vec![
                name.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                pids.clone(),
            ]);
        }
        for (i, uuid, budget) in devices {
            rows.push(vec![
                name.clone(),
                uuid_string(&uuid),
                budget_text(budget),
                human_bytes(g.used(i)),
                pids.clone(),
            ]);
        }
    }
    let mut out = String::from("\n");
    if rows.len() > 1 {
        out.push_str(&super::text::columns(&rows, &[2, 3]));
    }
    for line in unusable {
        put!(out, "{line}");
    }
    out
}

/// What `--cap` changed on one device.
struct Change {
    uuid: String,
    from: u64,
    to: u64,
    used: u64,
}

/// Applies `caps` to the group's devices; an error, changing nothing, when a UUID
/// named matches none of them or the group has no device yet.
fn apply(g: &Group, name: &str, caps: &NewCaps) -> Result<Vec<Change>, String> {
    let devices = g.devices();
    if devices.is_empty() {
        return Err(format!(
            "group {name} has no device yet, so no budget to change: the first member to use a device sets it (GPUGUARD_GROUP_CAP)"
        ));
    }
    let uuids: Vec<String> = devices.iter().map(|(_, u, _)| uuid_string(u)).collect();
    for (prefix, _) in &caps.per_uuid {
        if !uuids
            .iter()
            .any(|u| u.to_ascii_lowercase().starts_with(prefix))
        {
            return Err(format!(
                "--cap: {prefix} names none of group {name}'s devices ({})",
                uuids.join(", ")
            ));
        }
    }
    let mut changes = Vec::new();
    for ((i, _, from), uuid) in devices.iter().zip(uuids) {
        if let Some(to) = caps.for_uuid(&uuid) {
            g.set_budget(*i, to);
            changes.push(Change {
                uuid,
                from: *from,
                to,
                used: g.used(*i),
            });
        }
    }
    Ok(changes)
}

/// The status directory and the group's file, checked as the library checks them.
fn locate(name: &str) -> Result<(PathBuf, PathBuf), Failure> {
    group::check_name(name).map_err(|_| {
        Failure::Input(format!(
            "{:?} is not a group name: 1 to 64 of A-Z a-z 0-9 . _ -, not starting with '.'",
            clean(name)
        ))
    })?;
    let status_dir = status::status_dir_here()
        .map_err(|e| Failure::Input(format!("cannot find the status directory: {e}")))?;
    let base = group::base_dir_here()
        .map_err(|e| Failure::Input(format!("cannot find the groups' directory: {e}")))?;
    let path = group::path(&base, name);
    match std::fs::symlink_metadata(&path) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Failure::Input(format!(
                "no group {name}: {} does not exist (its first member makes it: GPUGUARD_GROUP={name})",
                clean(&path.display().to_string())
            )));
        }
        Err(e) => {
            return Err(Failure::Input(format!(
                "{}: {e}",
                clean(&path.display().to_string())
            )));
        }
    }
    let me = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .map_err(|e| Failure::Input(format!("cannot find this process's user: {e}")))?;
    // A directory the library would not use holds no file it uses either.
    for dir in [base.clone(), group::dir(&base)] {
        status::check_dir(&dir, me).map_err(|e| Failure::Input(clean(&e.to_string()).into()))?;
    }
    Ok((status_dir, path))
}

pub fn main(args: GroupArgs) -> Outcome {
    let caps = match &args.cap {
        Some(text) => Some(parse_caps(text).map_err(Failure::Input)?),
        None => None,
    };
    let (status_dir, path) = locate(&args.name)?;
    let g = Group::open(&path, &args.name).map_err(|e| Failure::Input(clean(&e.0).into()))?;
    let reclaimed = g.reclaim_dead(Path::new("/proc"), false);
    let mut said = String::new();
    if let Some(caps) = &caps {
        for c in apply(&g, &args.name, caps).map_err(Failure::Input)? {
            if c.to != UNLIMITED && c.used > c.to {
                warn(&format!(
                    "{}: the group uses {}, more than its new budget: what is held stays, new reservations are refused until members free memory",
                    c.uuid,
                    human_bytes(c.used)
                ));
            }
            put!(
                said,
                "{}: budget {} -> {}",
                c.uuid,
                budget_text(c.from),
                budget_text(c.to)
            );
        }
    }
    let v = view(&g, &args.name, &status_dir, reclaimed);
    if args.json {
        let text = super::json::pretty(&v)
            .map_err(|e| Failure::Input(format!("cannot encode the group: {e}")))?;
        if !said.is_empty() {
            // The changes said on stderr: stdout stays one JSON value.
            for line in said.lines() {
                warn(line);
            }
        }
        print(&text)?;
    } else {
        if !said.is_empty() {
            said.push('\n');
        }
        print(&(said + &render(&v)))?;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_by_uuid_size_or_none() {
        let c = parse_caps("8GiB").unwrap();
        assert_eq!(c.default, Some(8 << 30));
        let c = parse_caps("none, GPU-3B:2GiB, gpu-3b00:none").unwrap();
        assert_eq!(c.default, Some(UNLIMITED));
        let u = "GPU-3b000000-0000-0000-0000-0000000000a7";
        assert_eq!(c.for_uuid(u), Some(UNLIMITED), "the longest prefix");
        assert_eq!(
            c.for_uuid("GPU-3b110000-0000-0000-0000-000000000000"),
            Some(2 << 30)
        );
        assert_eq!(c.for_uuid("GPU-11"), Some(UNLIMITED));
        let e = parse_caps("0:2GiB").unwrap_err();
        assert!(e.contains("ordinal"), "{e}");
        for frac in ["0.5", "GPU-3b:0.25", "50%"] {
            let e = parse_caps(frac).unwrap_err();
            assert!(e.contains("total memory"), "{frac}: {e}");
        }
        for bad in [
            "",
            "abc",
            "1GiB,2GiB",
            "GPU-3b:1GiB,gpu-3B:2GiB",
            "x:1GiB",
            "GPU-:1GiB",
            "0",
        ] {
            assert!(parse_caps(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tables_align() {
        let rows = vec![
            vec!["A".to_string(), "NUM".into(), "LAST".into()],
            vec!["long".to_string(), "1".into(), "x".into()],
        ];
        assert_eq!(
            crate::cli::text::columns(&rows, &[1]),
            "A     NUM  LAST\nlong    1  x\n"
        );
    }
}
