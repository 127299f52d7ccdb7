//! `gpuguard group`, and the groups in `gpuguard ps` and `gpuguard metrics`, over real
//! group files made with the core crate (as the library makes them) whose members are
//! real processes of this test.

// Not every test file uses all of it.
#[allow(dead_code)]
mod cli_support;

use cli_support::{Done, command, done};
use gpuguard_core::cap::uuid_string;
use gpuguard_core::group::{self, Group, UNLIMITED, owner_word};
use gpuguard_core::status::{self, Status};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// A fresh folder holding the status directory `status` (tests run in parallel).
fn scratch(name: &str) -> (PathBuf, PathBuf) {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let root = std::env::temp_dir().join(format!(
        "gg-group-{name}-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let status_dir = root.join("status");
    (root, status_dir)
}

/// `sleep 60`, killed when dropped: a live member. `spawn` returns once the program
/// was executed, so its `comm` is already `sleep`.
struct Kid(Child);

impl Kid {
    fn start() -> Kid {
        Kid(Command::new("sleep").arg("60").spawn().unwrap())
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
    fn owner(&self) -> u64 {
        let ticks = status::process_start_ticks(Path::new("/proc"), self.pid()).unwrap();
        owner_word(self.pid(), ticks)
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The pid of a process that has ended.
fn ended_pid() -> u32 {
    let mut ended = Command::new("true").spawn().unwrap();
    let pid = ended.id();
    ended.wait().unwrap();
    pid
}

fn gg(status_dir: &Path, args: &[&str]) -> Done {
    done(
        command(args)
            .env("GPUGUARD_STATUS_DIR", status_dir)
            .output()
            .expect("run gpuguard"),
    )
}

const UUID: [u8; 16] = [0x3b, 0x2f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xa7];
const UUID2: [u8; 16] = [0x11; 16];

/// Group `name` in `status_dir`: device UUID with an 8 GiB budget, UUID2 unlimited;
/// `a` holds 3 GiB of UUID, `b` 1 GiB of UUID and 5 MiB of UUID2, and a member that
/// is gone 512 MiB of UUID. `b` has a status file naming its program `trainer`.
fn make_group(status_dir: &Path, name: &str, a: &Kid, b: &Kid) -> (Group, usize, usize) {
    let g = Group::open_or_create(status_dir, name).unwrap();
    // Members join before the devices are claimed: the first member of a new job
    // forgets an earlier job's budgets.
    let sa = g.join(a.owner()).unwrap();
    let sb = g.join(b.owner()).unwrap();
    let gone = g.join(owner_word(ended_pid(), 1)).unwrap();
    let dev = g.device(&UUID, 8 * GIB).unwrap();
    let dev2 = g.device(&UUID2, UNLIMITED).unwrap();
    assert!(g.reserve(sa, dev, 3 * GIB, &|| {}));
    assert!(g.reserve(sb, dev, GIB, &|| {}));
    assert!(g.reserve(sb, dev2, 5 * MIB, &|| {}));
    assert!(g.reserve(gone, dev, 512 * MIB, &|| {}));
    let ticks = status::process_start_ticks(Path::new("/proc"), b.pid()).unwrap();
    status::write_status(
        status_dir,
        &Status {
            schema: status::SCHEMA.into(),
            pid: b.pid(),
            program: "trainer".into(),
            start_ticks: ticks,
            ..Default::default()
        },
    )
    .unwrap();
    (g, dev, dev2)
}

/// The line of `text` that has all of `words`.
fn line_with<'a>(text: &'a str, words: &[&str]) -> &'a str {
    text.lines()
        .find(|l| words.iter().all(|w| l.contains(w)))
        .unwrap_or_else(|| panic!("no line with {words:?} in\n{text}"))
}

#[test]
fn group_shows_budget_use_members_and_takes_back_the_gone() {
    let (root, status_dir) = scratch("show");
    let (a, b) = (Kid::start(), Kid::start());
    let (g, dev, _) = make_group(&status_dir, "ddp", &a, &b);
    let u = uuid_string(&UUID);
    let u2 = uuid_string(&UUID2);

    let r = gg(&status_dir, &["group", "ddp"]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let out = &r.stdout;
    let file = group::path(&status_dir, "ddp");
    assert!(
        out.starts_with(&format!("group ddp ({})\n", file.display())),
        "{out}"
    );
    assert!(
        out.contains("took back 512.0 MiB from members that are gone"),
        "{out}"
    );
    // Per device: budget, used, free; the unlimited one has no free figure.
    let d = line_with(out, &[&u]);
    let w: Vec<&str> = d.split_whitespace().collect();
    assert_eq!(
        w,
        [u.as_str(), "8.0", "GiB", "4.0", "GiB", "4.0", "GiB"],
        "{out}"
    );
    let d2: Vec<&str> = line_with(out, &[&u2, "none"]).split_whitespace().collect();
    assert_eq!(d2, [u2.as_str(), "none", "5.0", "MiB", "-"], "{out}");
    // Members: the program from /proc (`sleep`) or from the status file.
    let pa = a.pid().to_string();
    let pb = b.pid().to_string();
    assert!(
        line_with(out, &[&pa, "sleep", &u]).ends_with("3.0 GiB"),
        "{out}"
    );
    assert!(
        line_with(out, &[&pb, "trainer", &u]).ends_with("1.0 GiB"),
        "{out}"
    );
    assert!(
        line_with(out, &[&pb, "trainer", &u2]).ends_with("5.0 MiB"),
        "{out}"
    );
    assert_eq!(g.members().len(), 2, "the gone member's slot was freed");
    assert_eq!(g.used(dev), 4 * GIB);

    let r = gg(&status_dir, &["group", "--json", "ddp"]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["group"], "ddp");
    assert_eq!(v["file"], file.display().to_string());
    assert_eq!(v["reclaimed_bytes"], 0, "taken back by the first look");
    assert_eq!(v["devices"][0]["uuid"], u);
    assert_eq!(v["devices"][0]["budget_bytes"], 8 * GIB);
    assert_eq!(v["devices"][0]["used_bytes"], 4 * GIB);
    assert_eq!(v["devices"][0]["free_bytes"], 4 * GIB);
    assert!(v["devices"][1]["budget_bytes"].is_null());
    assert!(v["devices"][1]["free_bytes"].is_null());
    let members = v["members"].as_array().unwrap();
    assert_eq!(members.len(), 2);
    let mb = members.iter().find(|m| m["pid"] == b.pid()).unwrap();
    assert_eq!(mb["program"], "trainer");
    assert_eq!(mb["held"][0]["uuid"], u);
    assert_eq!(mb["held"][0]["bytes"], GIB);
    assert_eq!(mb["held"][1]["bytes"], 5 * MIB);

    // stdout closed before anything is written: 141, no panic.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let r = done(
        command(&["group", "ddp"])
            .env("GPUGUARD_STATUS_DIR", &status_dir)
            .stdout(writer)
            .output()
            .unwrap(),
    );
    assert_eq!(r.code, Some(141), "{}", r.describe());
    assert!(!r.stderr.contains("panicked"), "{}", r.describe());
    drop(g);
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn cap_changes_the_budget_of_a_running_group() {
    let (root, status_dir) = scratch("cap");
    let (a, b) = (Kid::start(), Kid::start());
    let (g, dev, dev2) = make_group(&status_dir, "ddp", &a, &b);
    let u = uuid_string(&UUID);
    let u2 = uuid_string(&UUID2);

    // Every device of the group; below what it uses: said, and kept.
    let r = gg(&status_dir, &["group", "ddp", "--cap", "2GiB"]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(
        r.stdout
            .contains(&format!("{u}: budget 8.0 GiB -> 2.0 GiB")),
        "{}",
        r.describe()
    );
    assert!(
        r.stdout.contains(&format!("{u2}: budget none -> 2.0 GiB")),
        "{}",
        r.describe()
    );
    assert!(
        r.stderr.contains("more than its new budget"),
        "{}",
        r.describe()
    );
    assert_eq!((g.budget(dev), g.budget(dev2)), (2 * GIB, 2 * GIB));
    assert_eq!(g.used(dev), 4 * GIB, "what is held stays");
    // A reservation past the new budget is refused; the members' own one fits.
    let sa = g.members().iter().find(|m| m.pid == a.pid()).unwrap().slot;
    assert!(!g.reserve(sa, dev, MIB, &|| {}));

    // One device by a prefix of its UUID (any case); `none` lifts the budget.
    let r = gg(&status_dir, &["group", "ddp", "--cap", "GPU-3B2F:none"]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert_eq!((g.budget(dev), g.budget(dev2)), (UNLIMITED, 2 * GIB));
    assert!(g.reserve(sa, dev, MIB, &|| {}));
    let r = gg(
        &status_dir,
        &["group", "ddp", "--json", "--cap", "6GiB,GPU-11:none"],
    );
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["devices"][0]["budget_bytes"], 6 * GIB);
    assert!(v["devices"][1]["budget_bytes"].is_null());
    assert_eq!((g.budget(dev), g.budget(dev2)), (6 * GIB, UNLIMITED));

    // Refused, changing nothing: an ordinal, a share of the device, a UUID the group
    // does not have, a value that is not one.
    for (cap, why) in [
        ("0:2GiB", "ordinal"),
        ("0.5", "total memory"),
        ("GPU-3b2f:0.25", "total memory"),
        ("GPU-ff:1GiB", "names none of group ddp's devices"),
        ("lots", "not valid"),
    ] {
        let r = gg(&status_dir, &["group", "ddp", "--cap", cap]);
        assert_eq!(r.code, Some(2), "{cap}\n{}", r.describe());
        assert!(r.stderr.contains(why), "{cap}\n{}", r.describe());
        assert!(!r.stderr.contains("panicked"), "{}", r.describe());
        assert_eq!((g.budget(dev), g.budget(dev2)), (6 * GIB, UNLIMITED));
    }
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn a_missing_group_or_an_unusable_file_is_said_with_status_2() {
    let (root, status_dir) = scratch("missing");
    let r = gg(&status_dir, &["group", "nope"]);
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(r.stderr.contains("no group nope"), "{}", r.describe());
    let r = gg(&status_dir, &["group", "../etc"]);
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(r.stderr.contains("not a group name"), "{}", r.describe());

    let g = Group::open_or_create(&status_dir, "open").unwrap();
    let path = g.path().to_path_buf();
    drop(g);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let r = gg(&status_dir, &["group", "open"]);
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(r.stderr.contains("mode is not 0600"), "{}", r.describe());
    assert!(!r.stderr.contains("panicked"), "{}", r.describe());
    let r = gg(&status_dir, &["group", "open", "--cap", "1GiB"]);
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o644,
        "left as it was"
    );
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn ps_lists_each_group_and_the_files_it_cannot_use() {
    let (root, status_dir) = scratch("ps");
    let (a, b) = (Kid::start(), Kid::start());
    let (g, _, _) = make_group(&status_dir, "ddp", &a, &b);
    let bad = Group::open_or_create(&status_dir, "loose").unwrap();
    std::fs::set_permissions(bad.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    drop(bad);
    // Not a group file at all, under a group's name.
    std::fs::write(group::path(&status_dir, "junk"), b"junk").unwrap();
    std::fs::set_permissions(
        group::path(&status_dir, "junk"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();

    let r = gg(&status_dir, &["ps"]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let out = &r.stdout;
    let u = uuid_string(&UUID);
    let members = format!("{},{}", a.pid().min(b.pid()), a.pid().max(b.pid()));
    assert!(line_with(out, &["GROUP", "DEVICE", "BUDGET", "USED", "MEMBERS"]).starts_with("GROUP"));
    let w: Vec<&str> = line_with(out, &["ddp", &u]).split_whitespace().collect();
    assert_eq!(
        w,
        [
            "ddp",
            u.as_str(),
            "8.0",
            "GiB",
            "4.0",
            "GiB",
            members.as_str()
        ],
        "{out}"
    );
    let w: Vec<&str> = line_with(out, &["ddp", &uuid_string(&UUID2)])
        .split_whitespace()
        .collect();
    assert_eq!(w[2..5], ["none", "5.0", "MiB"], "{out}");
    assert!(
        line_with(out, &["group loose:"]).contains("mode is not 0600"),
        "{out}"
    );
    assert!(
        line_with(out, &["group junk:"]).contains("bytes, not the"),
        "{out}"
    );
    assert_eq!(g.members().len(), 2, "the gone member was taken out");
    assert!(!r.stderr.contains("panicked"), "{}", r.describe());

    // The table of processes is as it was: the member with a status file is there.
    line_with(out, &[&b.pid().to_string(), "trainer"]);
    // JSON stays the array of statuses.
    let r = gg(&status_dir, &["ps", "--json"]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert!(v.is_array(), "{}", r.stdout);
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn metrics_expose_each_groups_budget_use_and_members() {
    let (root, status_dir) = scratch("metrics");
    let (a, b) = (Kid::start(), Kid::start());
    let (g, _, _) = make_group(&status_dir, "ddp", &a, &b);
    let bad = Group::open_or_create(&status_dir, "loose").unwrap();
    std::fs::set_permissions(bad.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    drop(bad);
    // A link to a good group file: never followed.
    std::os::unix::fs::symlink(
        group::path(&status_dir, "ddp"),
        group::path(&status_dir, "linked"),
    )
    .unwrap();
    let out = root.join("gpuguard.prom");
    let r = done(
        command(&["metrics", "--textfile"])
            .arg(&out)
            .arg("--status-dir")
            .arg(&status_dir)
            .output()
            .unwrap(),
    );
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let text = std::fs::read_to_string(&out).unwrap();
    let u = uuid_string(&UUID);
    let u2 = uuid_string(&UUID2);
    // The exporter only reads: the member that is gone is still counted (3 slots,
    // its 512 MiB in the use) until a member, `ps` or `group` takes it out.
    for want in [
        "# TYPE gpuguard_group_budget_bytes gauge\n".to_string(),
        format!(
            "gpuguard_group_budget_bytes{{group=\"ddp\",uuid=\"{u}\"}} {}\n",
            8 * GIB
        ),
        format!(
            "gpuguard_group_used_bytes{{group=\"ddp\",uuid=\"{u}\"}} {}\n",
            4 * GIB + 512 * MIB
        ),
        format!(
            "gpuguard_group_used_bytes{{group=\"ddp\",uuid=\"{u2}\"}} {}\n",
            5 * MIB
        ),
        "gpuguard_group_members{group=\"ddp\"} 3\n".to_string(),
        "gpuguard_exporter_group_files_skipped 2\n".to_string(),
    ] {
        assert!(text.contains(&want), "{want}\nin\n{text}");
    }
    assert!(!text.contains(&format!(
        "gpuguard_group_budget_bytes{{group=\"ddp\",uuid=\"{u2}\"}}"
    )));
    assert!(!text.contains("group=\"loose\""), "{text}");
    assert!(!text.contains("group=\"linked\""), "{text}");
    assert_eq!(g.members().len(), 3, "nothing changed in the file");
    // Lint-clean where promtool is installed (tests/metrics_prometheus.rs requires it
    // in CI).
    let promtool = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("promtool"))
            .find(|p| p.is_file())
    });
    if promtool.is_none() && std::env::var_os("CI").is_some() {
        panic!("promtool is needed here (.ci/run installs Debian's prometheus)");
    }
    if let Some(promtool) = promtool {
        let check = Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(std::fs::File::open(&out).unwrap())
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(root);
}
