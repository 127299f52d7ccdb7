//! Group budgets (`GPUGUARD_GROUP`, `GPUGUARD_GROUP_CAP`): the processes of a group
//! share one budget per device. On the sim, with real processes of
//! `tests/progs/gg_group.c` under the real library: each process has its own sim
//! (its own books), so "the group's memory" is the sum over processes of what each
//! process's sim holds. The group's file is read with the core API
//! (`gpuguard_core::group`), as a handshake (what the members reserved), never to
//! decide what the members may do.
//!
//! What users rely on:
//! - the sum of what the members hold never passes the budget, however they race;
//! - once every member was refused and the others gave their unused leases back
//!   (the squeeze), the members fill the budget exactly;
//! - a member that dies (SIGKILL, even in the middle of a reservation) gives its
//!   bytes back, and a pid reused by another process is not taken for a member;
//! - a group file that is foreign, of another layout, damaged or reachable by other
//!   users is never used: the process stops (status 2) or, with
//!   `GPUGUARD_GROUP_ON_ERROR=run`, runs without the group;
//! - groups never mix; `cuMemGetInfo` shows the budget; the cap report names the group
//!   and its members.

mod common;
mod core_support;

use common::*;
use core_support::*;
use gpuguard_core::group::{self, Group};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError, channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The bound of a handshake (a poll of the group file or of a program's output):
/// far past any wait a loaded machine causes; it only keeps a broken build from
/// hanging its test.
const HANDSHAKE: Duration = Duration::from_secs(20);

/// The bound the semantics give a live member's helper thread to take back a dead
/// member's slot (it checks about once a second).
const HELPER_RECLAIM: Duration = Duration::from_secs(2);

// ---- set-up -------------------------------------------------------------------------

/// A fresh folder standing for `$XDG_RUNTIME_DIR`: this test's status directory, so
/// its group files, alone.
fn runtime_dir(name: &str) -> PathBuf {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let dir = profile_dir().join("gg-tmp").join(format!(
        "group-runtime-{name}-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The status directory under `runtime`, named by GPUGUARD_STATUS_DIR: the group
/// files go there too (without it they go to /dev/shm/gpuguard-<uid>, shared by
/// every test).
fn status_dir(runtime: &Path) -> PathBuf {
    runtime.join("gpuguard")
}

fn group_file(runtime: &Path, name: &str) -> PathBuf {
    group::path(&status_dir(runtime), name)
}

/// The environment of a member of group `name` with budget `cap` on a sim of `mem`
/// bytes per device.
fn member_env(runtime: &Path, name: &str, cap: &str, mem: u64) -> Vec<(String, String)> {
    vec![
        ("XDG_RUNTIME_DIR".into(), runtime.display().to_string()),
        (
            "GPUGUARD_STATUS_DIR".into(),
            status_dir(runtime).display().to_string(),
        ),
        ("GPUGUARD_GROUP".into(), name.into()),
        ("GPUGUARD_GROUP_CAP".into(), cap.into()),
        ("SIMCUDA_MEM".into(), mem.to_string()),
    ]
}

fn with(env: &[(String, String)], extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v = env.to_vec();
    v.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    v
}

fn refs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// `gg_group ARGS` under the library, to its end.
fn member_run(args: &[&str], env: &[(String, String)]) -> Run {
    gg_run("gg_group", args, &refs(env))
}

/// libgpuguard.so built with the `fault-injection` feature (once per test process).
fn fault_lib() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| feature_lib("fault-injection", "fault"))
        .clone()
}

// ---- members that run alongside the test --------------------------------------------

/// A `gg_group` process the test talks to while it runs (stdin a pipe).
struct Member {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    pid: u32,
    rx: Receiver<String>,
    /// Every stdout line so far, in order.
    lines: Vec<String>,
    stdout: Arc<Mutex<String>>,
    stderr: Option<std::thread::JoinHandle<String>>,
    dir: PathBuf,
}

fn spawn_member(args: &[&str], env: &[(String, String)]) -> Member {
    spawn_member_with(args, env, &shim())
}

fn spawn_member_with(args: &[&str], env: &[(String, String)], lib: &Path) -> Member {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let dir = profile_dir().join("gg-tmp").join(format!(
        "group-member-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = Command::new(sim_dir().join("gg_group"));
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    clear_gpuguard_env(&mut cmd);
    cmd.env("LD_LIBRARY_PATH", sim_dir())
        .env("LD_PRELOAD", lib)
        .env("GPUGUARD_DIR", &dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawning gg_group");
    let pid = child.id();
    let out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let stdout = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = channel();
    let all = stdout.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            {
                let mut a = all.lock().unwrap();
                a.push_str(&line);
                a.push('\n');
            }
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let stderr = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    Member {
        stdin: child.stdin.take(),
        child: Some(child),
        pid,
        rx,
        lines: Vec::new(),
        stdout,
        stderr: Some(stderr),
        dir,
    }
}

impl Member {
    /// Takes the lines printed so far; false once stdout ended.
    fn pump(&mut self) -> bool {
        loop {
            match self.rx.try_recv() {
                Ok(l) => self.lines.push(l),
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }

    /// The first line starting with `tag` and a space, if printed yet.
    fn line(&mut self, tag: &str) -> Option<String> {
        self.pump();
        let want = format!("{tag} ");
        self.lines
            .iter()
            .find(|l| l.starts_with(&want) || l.as_str() == tag)
            .cloned()
    }

    /// Waits (bounded) for a line starting with `tag`.
    fn wait_line(&mut self, tag: &str) -> String {
        let bound = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(l) = self.line(tag) {
                return l;
            }
            let open = self.pump();
            if !open || Instant::now() > bound {
                let what = if open { "timed out" } else { "stdout ended" };
                panic!(
                    "member {} {what} waiting for {tag}\n{}",
                    self.pid,
                    self.describe_now()
                );
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn send(&mut self, line: &str) {
        let s = self.stdin.as_mut().expect("stdin open");
        s.write_all(format!("{line}\n").as_bytes())
            .and_then(|()| s.flush())
            .unwrap_or_else(|e| panic!("writing to member {}: {e}", self.pid));
    }

    fn describe_now(&self) -> String {
        format!("--- stdout so far\n{}", self.stdout.lock().unwrap())
    }

    /// Closes stdin and waits (bounded) for the end.
    fn finish(mut self) -> Run {
        drop(self.stdin.take());
        self.wait_end()
    }

    /// SIGKILL, and the process reaped.
    fn kill9(mut self) -> Run {
        let child = self.child.as_mut().unwrap();
        child.kill().expect("SIGKILL the member");
        self.wait_end()
    }

    fn wait_end(&mut self) -> Run {
        let mut child = self.child.take().unwrap();
        let bound = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > bound {
                let _ = child.kill();
                let _ = child.wait();
                panic!("member {} did not end\n{}", self.pid, self.describe_now());
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        drop(self.stdin.take());
        let stderr = self.stderr.take().unwrap().join().unwrap_or_default();
        // The reader thread ends with the pipe; wait for it to have taken every line.
        let bound = Instant::now() + Duration::from_secs(10);
        while self.pump() && Instant::now() < bound {
            std::thread::sleep(Duration::from_millis(1));
        }
        Run {
            status,
            stdout: self.stdout.lock().unwrap().clone(),
            stderr,
            dir: self.dir.clone(),
            pid: self.pid,
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // A test that failed half-way: no member outlives it.
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `key=value` numbers of a line.
fn kv_of(line: &str) -> std::collections::BTreeMap<String, u64> {
    Out(line)
        .kv(line.split_whitespace().next().unwrap_or(""))
        .pop()
        .unwrap_or_default()
}

// ---- the group file -------------------------------------------------------------------

/// The group's file, opened once it exists and has its device (the first member
/// made it), and that device's entry.
fn open_group(runtime: &Path, name: &str) -> (Group, usize) {
    let path = group_file(runtime, name);
    let bound = Instant::now() + HANDSHAKE;
    loop {
        if let Ok(g) = Group::open(&path, name) {
            let devs = g.devices();
            if !devs.is_empty() {
                assert_eq!(devs.len(), 1, "one device in {}: {devs:?}", path.display());
                let dev = devs[0].0;
                return (g, dev);
            }
        }
        assert!(
            Instant::now() < bound,
            "no usable group file {} after {HANDSHAKE:?}: {:?}",
            path.display(),
            Group::open(&path, name).err()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// What the slot of process `pid` holds of `dev`, if it is a member.
fn slot_of(g: &Group, pid: u32, dev: usize) -> Option<u64> {
    g.members()
        .into_iter()
        .find(|m| m.pid == pid)
        .map(|m| m.held[dev])
}

/// Polls (bounded by `bound`) until `done` holds; returns how long it took, or
/// panics with `what`.
fn poll_until(bound: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if done() {
            return start.elapsed();
        }
        assert!(start.elapsed() < bound, "{what} (gave up after {bound:?})");
        std::thread::sleep(Duration::from_millis(2));
    }
}

// ---- the race -------------------------------------------------------------------------

/// 8 processes × 8 threads race 1 MiB blocks for a budget of 2 GiB (each process's
/// sim has 4 GiB: only the group refuses; a budget past 1 GiB, so that members
/// reserve leases ahead of what they allocate in its first part, and the squeeze has
/// something to give back). The processes start together (a file the test creates
/// once each has its `go`). Every thread stops at its first refusal.
/// Then: the processes hold no more than the budget, by their own count, by their
/// sims' books, and by their sims' high-water marks (nothing is freed before the end,
/// so the sum of the high-water marks bounds the sum at every instant). Once the
/// group's file shows that the members reserve exactly what they hold (the squeeze
/// answered: the handshake), an `again` round fills the budget exactly.
///
/// The threads start together, so each process's first use of the device is itself
/// raced by its 8 threads, as in a framework that starts its workers at once.
#[test]
fn racing_members_never_pass_the_budget_and_then_fill_it_exactly() {
    race(false);
}

/// The same race, each process's main thread having used the device once (one block
/// allocated and freed) before its threads start: what the race proves when the
/// device's first use is not raced.
#[test]
fn racing_members_after_a_single_threaded_first_use() {
    race(true);
}

/// One member alone, its 8 threads making the device's first allocations at once:
/// the budget holds for them too (the smallest form of the race above).
#[test]
fn threads_racing_a_members_first_use_of_the_device_are_limited() {
    let runtime = runtime_dir("first-use");
    let env = member_env(&runtime, "firstuse", "64MiB", GIB);
    let mut m = spawn_member(&["race", "8", "1"], &env);
    m.wait_line("READY");
    m.send("go");
    let race = kv_of(&m.wait_line("RACE"));
    m.send("again");
    m.wait_line("AGAIN");
    let r = m.finish();
    r.assert_ok();
    let s = r.section("race");
    assert_eq!(
        (race["held"], s.sim(0).unwrap()["live"]),
        (64 * MIB, 64 * MIB),
        "8 threads of one member, 1 MiB blocks, a budget of 64 MiB, a sim of 1 GiB\n{}",
        r.describe()
    );
    assert_eq!(s.gg(0).unwrap()["denied"], 8, "{}", r.describe());
    let _ = std::fs::remove_dir_all(runtime);
}

fn race(warm: bool) {
    const PROCS: usize = 8;
    const THREADS: u64 = 8;
    const BUDGET: u64 = 2 * GIB;
    let name = if warm { "race-warm" } else { "race" };
    let runtime = runtime_dir(name);
    let start_file = runtime.join("start");
    let env = with(
        &member_env(&runtime, name, "2GiB", 4 * GIB),
        &[("GG_START_FILE", start_file.to_str().unwrap())],
    );
    let threads = THREADS.to_string();
    let mut args = vec!["race", &threads, "1"];
    if warm {
        args.push("warm");
    }
    let mut ms: Vec<Member> = (0..PROCS).map(|_| spawn_member(&args, &env)).collect();
    for m in &mut ms {
        m.wait_line("READY");
    }
    for m in &mut ms {
        m.send("go");
    }
    std::fs::write(&start_file, b"").unwrap();

    // Round 1, watched from the file meanwhile. (The file's sum may pass the budget
    // for an instant: a reservation adds to its slot before it looks at the sum, and
    // takes its bytes back if they do not fit. That is not memory anyone holds, so
    // it is only recorded, not asserted.)
    let mut group: Option<(Group, usize)> = None;
    let mut most_reserved = 0u64;
    let bound = Instant::now() + Duration::from_secs(120);
    let race_lines: Vec<String> = loop {
        if group.is_none()
            && let Ok(g) = Group::open(&group_file(&runtime, name), name)
            && let Some(&(dev, _, _)) = g.devices().first()
        {
            group = Some((g, dev));
        }
        if let Some((g, dev)) = &group {
            most_reserved = most_reserved.max(g.used(*dev));
        }
        let got: Vec<Option<String>> = ms.iter_mut().map(|m| m.line("RACE")).collect();
        if got.iter().all(Option::is_some) {
            break got.into_iter().map(Option::unwrap).collect();
        }
        for m in &mut ms {
            assert!(
                m.pump(),
                "member {} ended early\n{}",
                m.pid,
                m.describe_now()
            );
        }
        assert!(Instant::now() < bound, "round 1 did not end");
        std::thread::sleep(Duration::from_millis(1));
    };
    let race: Vec<_> = race_lines.iter().map(|l| kv_of(l)).collect();
    let held1: Vec<u64> = race.iter().map(|m| m["held"]).collect();
    let sum1: u64 = held1.iter().sum();
    // The sims' books of round 1, printed after RACE: what each process's driver
    // holds, and its high-water mark.
    let (mut sim1, mut peaks1) = (0u64, 0u64);
    for m in &mut ms {
        m.wait_line("SIMPEAK");
        let text = m.lines.join("\n");
        let out = Out(&text);
        sim1 += out.sim(0).expect("SIM line")["live"];
        peaks1 += out.kv("SIMPEAK").pop().unwrap()["peak"];
    }
    eprintln!(
        "round 1: held {held1:?} (sum {sum1}; the sims' books {sim1}, the sum of their \
         peaks {peaks1}), the file's sum reached {most_reserved} meanwhile"
    );
    assert!(
        sum1 <= BUDGET && sim1 <= BUDGET && peaks1 <= BUDGET,
        "after round 1 the members hold {sum1} bytes (the sims' books {sim1}, the sum of \
         their peaks {peaks1}), past the budget {BUDGET}: {held1:?}"
    );
    assert_eq!(sim1, sum1, "round 1: the sims' books vs the RACE lines");
    for (i, m) in race.iter().enumerate() {
        assert_eq!(
            m["refused"], THREADS,
            "member {}: each thread stops at its first refusal: {}",
            ms[i].pid, race_lines[i]
        );
    }

    // The handshake: the squeeze answered, the members reserve what they hold.
    let (g, dev) = open_group(&runtime, name);
    assert_eq!(g.budget(dev), BUDGET, "the budget GPUGUARD_GROUP_CAP set");
    let waited = poll_until(
        HANDSHAKE,
        &format!("the group's reservations never came down to what its members hold ({sum1})"),
        || g.used(dev) == sum1,
    );
    eprintln!("squeeze answered {waited:?} after the last RACE line was read");
    let members = g.members();
    assert_eq!(members.len(), PROCS, "{members:?}");
    for (i, m) in ms.iter().enumerate() {
        assert_eq!(
            slot_of(&g, m.pid, dev),
            Some(held1[i]),
            "member {}'s slot, with every lease given back: {members:?}",
            m.pid
        );
    }

    for m in &mut ms {
        m.send("again");
    }
    let again: Vec<_> = ms
        .iter_mut()
        .map(|m| kv_of(&m.wait_line("AGAIN")))
        .collect();
    let held2: Vec<u64> = again.iter().map(|m| m["held"]).collect();
    let sum2: u64 = held2.iter().sum();
    for (i, m) in again.iter().enumerate() {
        assert_eq!(m["refused"], 2 * THREADS, "member {}", ms[i].pid);
        assert!(held2[i] >= held1[i], "nothing was freed");
    }
    assert_eq!(
        sum2, BUDGET,
        "after every member was refused and the squeeze answered, the members fill the \
         budget exactly: {held2:?} (round 1: {held1:?})"
    );

    let runs: Vec<Run> = ms.into_iter().map(Member::finish).collect();
    let mut sims = (0u64, 0u64, 0u64, 0u64);
    for r in &runs {
        r.assert_ok();
        let s1 = r.section("race");
        let s2 = r.section("again");
        sims.0 += s1.sim(0).unwrap()["live"];
        sims.1 += s1.kv("SIMPEAK").pop().unwrap()["peak"];
        sims.2 += s2.sim(0).unwrap()["live"];
        sims.3 += s2.kv("SIMPEAK").pop().unwrap()["peak"];
        // every refusal the threads saw is one of gpuguard's denials
        assert_eq!(s2.gg(0).unwrap()["denied"], 2 * THREADS, "{}", r.describe());
        assert_eq!(r.section("end").sim(0).unwrap()["live"], 0);
        let (_, exit) = exit_report(r);
        assert_eq!(
            u(&device_entry(&exit, 0).unwrap()["denied"]),
            2 * THREADS,
            "{}",
            r.describe()
        );
    }
    // The sims' own books: what the processes held, the sum of the high-water marks
    // never past the budget.
    assert_eq!(sims.0, sum1, "round 1: the sims' books vs RACE lines");
    assert!(
        sims.1 <= BUDGET,
        "round 1: sum of the sims' peaks {}",
        sims.1
    );
    assert_eq!(sims.2, BUDGET, "round 2: the sims' books");
    assert!(
        sims.3 <= BUDGET,
        "round 2: sum of the sims' peaks {}",
        sims.3
    );
    // Every member gave its bytes back at exit.
    assert_eq!(g.used(dev), 0, "{:?}", g.members());
    assert!(g.members().is_empty(), "{:?}", g.members());
    let _ = std::fs::remove_dir_all(runtime);
}

// ---- dead members ---------------------------------------------------------------------

/// A member SIGKILLed in the middle of its first reservation (the `group-kill` fault:
/// after its slot's count rose, before the group's sum was read) left bytes in its
/// slot. The next member gets the whole budget anyway, within its first fill: the
/// dead slot is taken back when it would otherwise be refused (no wait, no retry by
/// the program).
#[test]
fn a_member_killed_inside_a_reservation_gives_its_bytes_back() {
    let runtime = runtime_dir("kill-mid");
    let name = "killmid";
    let env = member_env(&runtime, name, "64MiB", 256 * MIB);
    let lib = fault_lib().display().to_string();
    let fenv = with(
        &env,
        &[("LD_PRELOAD", &lib), ("GGTEST_FAULT", "group-kill")],
    );
    let dead = run("gg_group", &["fill", "1"], &refs(&fenv), false);
    assert_eq!(
        dead.signal(),
        Some(libc::SIGKILL),
        "the fault kills the member\n{}",
        dead.describe()
    );
    assert!(dead.out().kv("FILL").is_empty(), "{}", dead.describe());
    let (g, dev) = open_group(&runtime, name);
    let left = slot_of(&g, dead.pid, dev);
    assert!(
        left.is_some_and(|b| b > 0),
        "the dead member's slot keeps the bytes of the reservation it was in: {:?}",
        g.members()
    );
    assert_eq!(g.used(dev), left.unwrap());

    let next = member_run(&["fill", "1"], &env);
    next.assert_ok();
    let fill = next.out().kv("FILL").pop().unwrap();
    assert_eq!(
        (fill["held"], fill["rc"]),
        (64 * MIB, 2),
        "the next member gets the whole budget, then CUDA_ERROR_OUT_OF_MEMORY\n{}",
        next.describe()
    );
    assert_eq!(slot_of(&g, dead.pid, dev), None, "{:?}", g.members());
    assert_eq!(g.used(dev), 0, "{:?}", g.members());
    let _ = std::fs::remove_dir_all(runtime);
}

/// A member SIGKILLed while it holds 200 MiB of a 256 MiB budget: the next member
/// takes the whole budget (the dead slot reclaimed at its refusal); and with another
/// member alive meanwhile, that member's helper thread takes the slot back by itself
/// within 2 s, nobody allocating.
#[test]
fn a_member_killed_while_holding_memory_gives_it_back() {
    const BUDGET: u64 = 256 * MIB;
    let runtime = runtime_dir("kill-hold");
    let name = "killhold";
    let env = member_env(&runtime, name, "256MiB", GIB);

    // At the next member's refusal.
    let mut x = spawn_member(&["hold", "200"], &env);
    assert_eq!(kv_of(&x.wait_line("HELD"))["rc"], 0);
    let (g, dev) = open_group(&runtime, name);
    assert!(slot_of(&g, x.pid, dev).is_some_and(|b| b >= 200 * MIB));
    let xpid = x.pid;
    let killed = x.kill9();
    assert_eq!(killed.signal(), Some(libc::SIGKILL));
    let z = member_run(&["fill", "1"], &env);
    z.assert_ok();
    assert_eq!(
        z.out().kv("FILL").pop().unwrap()["held"],
        BUDGET,
        "the whole budget after the holder died\n{}",
        z.describe()
    );
    assert_eq!(slot_of(&g, xpid, dev), None);

    // By a live member's helper thread.
    let mut y = spawn_member(&["hold", "1"], &env);
    assert_eq!(kv_of(&y.wait_line("HELD"))["rc"], 0);
    let mut x2 = spawn_member(&["hold", "200"], &env);
    assert_eq!(kv_of(&x2.wait_line("HELD"))["rc"], 0);
    let x2pid = x2.pid;
    assert!(slot_of(&g, x2pid, dev).is_some_and(|b| b >= 200 * MIB));
    x2.kill9();
    let took = poll_until(
        HANDSHAKE,
        "the dead member's slot was never taken back by the live member",
        || slot_of(&g, x2pid, dev).is_none(),
    );
    assert!(
        took <= HELPER_RECLAIM,
        "the live member's helper took the dead slot back after {took:?}, past {HELPER_RECLAIM:?}"
    );
    let y_slot = slot_of(&g, y.pid, dev).expect("y is a member");
    assert!(y_slot >= MIB);
    let z2 = member_run(&["fill", "1"], &env);
    z2.assert_ok();
    let held = z2.out().kv("FILL").pop().unwrap()["held"];
    assert!(
        held + MIB <= BUDGET && held >= (BUDGET - y_slot) / MIB * MIB,
        "with 1 MiB live in y (its slot {y_slot}), z took {held}\n{}",
        z2.describe()
    );
    y.finish().assert_ok();
    assert_eq!(g.used(dev), 0, "{:?}", g.members());
    let _ = std::fs::remove_dir_all(runtime);
}

/// A member that finds no other member is a new job, whose `GPUGUARD_GROUP_CAP` is
/// the budget: also when the last job's member was SIGKILLed and its slot is not
/// yet taken back (it is taken back first, with what it held).
#[test]
fn a_crashed_jobs_budget_and_bytes_do_not_carry_to_the_next_job() {
    let runtime = runtime_dir("new-job");
    let name = "newjob";
    let mut x = spawn_member(&["hold", "100"], &member_env(&runtime, name, "256MiB", GIB));
    assert_eq!(kv_of(&x.wait_line("HELD"))["rc"], 0);
    assert_eq!(x.kill9().signal(), Some(libc::SIGKILL));
    let z = member_run(&["fill", "1"], &member_env(&runtime, name, "512MiB", GIB));
    z.assert_ok();
    assert_eq!(
        z.out().kv("FILL").pop().unwrap()["held"],
        512 * MIB,
        "the new job's budget, whole\n{}",
        z.describe()
    );
    let _ = std::fs::remove_dir_all(runtime);
}

/// A slot whose owner word names a live pid with another start time is a dead
/// member whose pid was reused: taken back. With the right start time it is a
/// member: kept. With the core API, then through the library (a member's helper
/// thread looks about once a second).
#[test]
fn a_reused_pid_is_not_taken_for_a_member() {
    let runtime = runtime_dir("reuse");
    let mut sleeper = Command::new("sleep").arg("120").spawn().expect("sleep");
    let spid = sleeper.id();
    let start = gpuguard_core::status::process_start_ticks(Path::new("/proc"), spid)
        .expect("the sleeper's start time");

    // The core API alone.
    let g = Group::open_or_create(&status_dir(&runtime), "reuse-core").unwrap();
    let right = g.join(group::owner_word(spid, start)).unwrap();
    let wrong = g.join(group::owner_word(spid, start + 1)).unwrap();
    let dev = g.device(&[9; 16], 100 * MIB).unwrap();
    assert!(g.reserve(right, dev, 10 * MIB, &|| {}));
    assert!(g.reserve(wrong, dev, 30 * MIB, &|| {}));
    assert_eq!(
        g.reclaim_dead(Path::new("/proc"), true),
        0,
        "the quick look cannot tell"
    );
    assert_eq!(g.reclaim_dead(Path::new("/proc"), false), 30 * MIB);
    assert_eq!(
        g.members().iter().map(|m| m.slot).collect::<Vec<_>>(),
        [right]
    );
    assert_eq!(g.used(dev), 10 * MIB);
    drop(g);

    // Through the library: a member runs (its helper thread looks); the test plants
    // two slots of the sleeper's pid, the right one first (a look at the slots in
    // order reaches it before the wrong one).
    let name = "reuse";
    let env = member_env(&runtime, name, "64MiB", 256 * MIB);
    let mut y = spawn_member(&["hold", "1"], &env);
    assert_eq!(kv_of(&y.wait_line("HELD"))["rc"], 0);
    let (g, dev) = open_group(&runtime, name);
    let right_word = group::owner_word(spid, start);
    let right = g.join(right_word).unwrap();
    let wrong = g.join(group::owner_word(spid, start + 1)).unwrap();
    assert!(right < wrong);
    assert!(g.reserve(right, dev, 8 * MIB, &|| {}));
    assert!(g.reserve(wrong, dev, 40 * MIB, &|| {}));
    let took = poll_until(
        HANDSHAKE,
        "the slot of the reused pid was never taken back",
        || !g.members().iter().any(|m| m.slot == wrong),
    );
    assert!(
        took <= HELPER_RECLAIM,
        "the member's helper took the reused pid's slot back after {took:?}"
    );
    assert!(
        g.members().iter().any(|m| m.slot == right && m.pid == spid),
        "the slot with the right start time is kept: {:?}",
        g.members()
    );
    assert_eq!(g.held(right, dev), 8 * MIB);
    // A member filling the group refuses past budget - 8 MiB - y's share, and its
    // refusal's own look (pid alive) keeps the right slot too.
    let y_slot = slot_of(&g, y.pid, dev).unwrap();
    let z = member_run(&["fill", "1"], &env);
    z.assert_ok();
    let held = z.out().kv("FILL").pop().unwrap()["held"];
    assert!(
        held + 8 * MIB + MIB <= 64 * MIB && held >= (64 * MIB - 8 * MIB - y_slot) / MIB * MIB,
        "z took {held} next to the planted 8 MiB and y's slot {y_slot}\n{}",
        z.describe()
    );
    assert_eq!(g.held(right, dev), 8 * MIB, "{:?}", g.members());
    g.leave(right, right_word);
    y.finish().assert_ok();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let _ = std::fs::remove_dir_all(runtime);
}

// ---- chaos: members killed at random moments ----------------------------------------

/// The seed of the chaos test's schedule (which member is killed or asked to trim,
/// and when) and of its members' own choices: fixed, so that every run makes the
/// same choices (the interleavings still differ from run to run: the assertions hold
/// for every interleaving). Printed in every failure message.
const CHAOS_SEED: u64 = 0x6767_0c4a_05ee_d001;

/// splitmix64: the test's deterministic choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A `gg_group chaos` member and how many times it was paused.
struct ChaosMember {
    m: Member,
    id: u64,
    pauses: u64,
}

/// Spawns chaos member `id`: 3 threads; even ids fork children, ids not 2 mod 3
/// also allocate from the default pool (what a trim gives back). Started ("go")
/// once it is set up (READY: a member).
fn spawn_chaos(id: u64, env: &[(String, String)]) -> ChaosMember {
    let seed = CHAOS_SEED.wrapping_add(id).to_string();
    let mut args = vec!["chaos", "3", seed.as_str()];
    if id.is_multiple_of(2) {
        args.push("fork");
    }
    if id % 3 != 2 {
        args.push("pool");
    }
    let mut m = spawn_member(&args, env);
    m.wait_line("READY");
    m.send("go");
    ChaosMember { m, id, pauses: 0 }
}

/// Waits (bounded) for the `PAUSED` line of member `c`'s latest pause.
fn wait_paused(c: &mut ChaosMember, ctx: &str) -> std::collections::BTreeMap<String, u64> {
    let bound = Instant::now() + Duration::from_secs(60);
    loop {
        let open = c.m.pump();
        if let Some(kv) =
            c.m.lines
                .iter()
                .filter(|l| l.starts_with("PAUSED "))
                .map(|l| kv_of(l))
                .find(|kv| kv.get("seq") == Some(&c.pauses))
        {
            return kv;
        }
        if !open || Instant::now() > bound {
            let what = if open { "timed out" } else { "stdout ended" };
            panic!(
                "{ctx}: member {} (id {}) {what} waiting for PAUSED seq={}\n{}",
                c.m.pid,
                c.id,
                c.pauses,
                c.m.describe_now()
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Polls (bounded by `bound`) until `done` holds; returns how long it took, or
/// panics with `what()`, the state when it gave up.
fn poll_or(bound: Duration, mut done: impl FnMut() -> bool, what: impl Fn() -> String) -> Duration {
    let start = Instant::now();
    loop {
        if done() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < bound,
            "{} (gave up after {bound:?})",
            what()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// What happens at one moment of a chaos round.
#[derive(Clone, Copy, Debug)]
enum ChaosEvent {
    /// SIGKILL a member (chosen when it happens), and start a replacement.
    Kill,
    /// The trim signal (SIGUSR2) to a member.
    Trim,
    /// The trim signal, then SIGKILL 0 to 3 ms later: killed during its trim.
    TrimThenKill,
}

/// Killing members at random moments (in the middle of their reservations, during
/// their trims, during their forks) never leaks budget past the reclaim and never
/// lets the group pass its budget. 5 members of a 2 GiB budget (4 GiB sims), each
/// 3 threads allocating and freeing 2-64 MiB blocks at random, far more than the
/// budget (so reservations, refusals, squeezes and dead-slot reclaims run all the
/// time); some allocate from a pool (what trims give back), some fork children that
/// join the group on their own and end normally, end holding memory, or are
/// SIGKILLed by their parent (or with it: PR_SET_PDEATHSIG). Each of 4 rounds runs
/// them for 0.6 s while the test SIGKILLs 1-2 members and sends the trim signal to
/// 2-4 at moments of a fixed-seed schedule, starting a replacement for each killed
/// member at once. Then every survivor stops between two operations (the `PAUSED`
/// handshake: its children ended, its pool trimmed) and:
/// 1. within the reclaim bound (`HELPER_RECLAIM`, counted from the handshake, after
///    every death of the round) the file's members are exactly the live members, and
///    its use is the sum of their slots: nothing of a dead member or child stays;
/// 2. the group's use is within the budget, every member's sim holds no more than its
///    slot reserves, and the sims together hold no more than the budget;
/// 3. after a squeeze (the test asks for one through the file; answered within the
///    same bound), every slot is exactly what its member's sim holds, so the group's
///    use equals what the live members hold.
///
/// No member or child may crash or hang (a child forked while its parent's helper
/// thread initialized NVML once kept that initialization "in progress" forever and
/// took 10 s to exit). At the end every member ends normally and the group's use
/// is 0, with no members.
#[test]
fn members_killed_at_random_moments_never_leak_or_pass_the_budget() {
    const MEMBERS: u64 = 5;
    const ROUNDS: u64 = 4;
    const BUDGET: u64 = 2 * GIB;
    const WINDOW_MS: u64 = 600;
    let started = Instant::now();
    let runtime = runtime_dir("chaos");
    let name = "chaos";
    let env = member_env(&runtime, name, "2GiB", 4 * GIB);
    let mut rng = Rng(CHAOS_SEED);
    let mut ms: Vec<ChaosMember> = (0..MEMBERS).map(|id| spawn_chaos(id, &env)).collect();
    let mut next_id = MEMBERS;
    let (g, dev) = open_group(&runtime, name);
    assert_eq!(g.budget(dev), BUDGET);
    let mut runs: Vec<Run> = Vec::new();
    let (mut kills, mut trims, mut most_seen) = (0u64, 0u64, 0u64);

    for round in 1..=ROUNDS {
        let ctx = format!("chaos seed {CHAOS_SEED:#x}, round {round}");
        // The round's schedule: moments (ms into the window) and what happens.
        let mut events: Vec<(u64, ChaosEvent)> = Vec::new();
        for _ in 0..1 + rng.below(2) {
            let e = if rng.below(3) == 0 {
                ChaosEvent::TrimThenKill
            } else {
                ChaosEvent::Kill
            };
            events.push((rng.below(WINDOW_MS), e));
        }
        for _ in 0..2 + rng.below(3) {
            events.push((rng.below(WINDOW_MS), ChaosEvent::Trim));
        }
        events.sort_by_key(|e| e.0);
        let t0 = Instant::now();
        let mut watch_until = |until: Duration| {
            // The file's use meanwhile, only recorded: a reservation in flight adds
            // to its slot before it looks at the sum (and a member killed there
            // leaves it until the reclaim), so the file may pass the budget for a
            // moment without anyone holding the memory.
            while t0.elapsed() < until {
                most_seen = most_seen.max(g.used(dev));
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        for (at, e) in events {
            watch_until(Duration::from_millis(at));
            let i = rng.below(ms.len() as u64) as usize;
            let gap = rng.below(4);
            if matches!(e, ChaosEvent::Trim | ChaosEvent::TrimThenKill) {
                // SAFETY: the member is our unreaped child: its pid is its own.
                let rc = unsafe { libc::kill(ms[i].m.pid as i32, libc::SIGUSR2) };
                assert_eq!(rc, 0, "{ctx}: SIGUSR2 to {}", ms[i].m.pid);
                trims += 1;
            }
            if matches!(e, ChaosEvent::Kill | ChaosEvent::TrimThenKill) {
                if matches!(e, ChaosEvent::TrimThenKill) {
                    std::thread::sleep(Duration::from_millis(gap));
                }
                let c = ms.swap_remove(i);
                let run = c.m.kill9();
                assert_eq!(
                    run.signal(),
                    Some(libc::SIGKILL),
                    "{ctx}: member id {} ended before the test killed it\n{}",
                    c.id,
                    run.describe()
                );
                runs.push(run);
                kills += 1;
                ms.push(spawn_chaos(next_id, &env));
                next_id += 1;
            }
        }
        watch_until(Duration::from_millis(WINDOW_MS));

        // The handshake: every survivor stopped, its children ended.
        for c in &mut ms {
            c.pauses += 1;
            c.m.send("pause");
        }
        let paused: Vec<_> = ms.iter_mut().map(|c| wait_paused(c, &ctx)).collect();
        let quiet = Instant::now();
        if let Some(i) = paused
            .iter()
            .position(|p| p["kids_hung"] != 0 || p["kids_bad"] != 0)
        {
            let (id, p) = (ms[i].id, paused[i].clone());
            let r = ms.swap_remove(i).m.kill9();
            panic!(
                "{ctx}: member {} (id {id}): a forked child hung (kids_hung) or crashed \
                 (kids_bad): {p:?}\n{}",
                r.pid,
                r.describe()
            );
        }
        let live: std::collections::BTreeSet<u32> = ms.iter().map(|c| c.m.pid).collect();
        let file_pids =
            || -> std::collections::BTreeSet<u32> { g.members().iter().map(|m| m.pid).collect() };
        let slot_sum = || g.members().iter().map(|m| m.held[dev]).sum::<u64>();
        // 1. Nothing of the dead stays past the reclaim bound.
        let reclaimed = poll_or(
            HANDSHAKE,
            || file_pids() == live && g.used(dev) == slot_sum(),
            || {
                format!(
                    "{ctx}: the group's file never came to list exactly the live members \
                     {live:?} with nothing outside their slots: {:?}, used {}",
                    g.members(),
                    g.used(dev)
                )
            },
        );
        assert!(
            reclaimed <= HELPER_RECLAIM,
            "{ctx}: the dead members' slots were taken back {reclaimed:?} after the \
             survivors stopped, past the bound {HELPER_RECLAIM:?}: {:?}",
            g.members()
        );
        // 2. Within the budget, by the file and by the sims' books.
        let used = g.used(dev);
        let sims: u64 = paused.iter().map(|p| p["sim"]).sum();
        let members = g.members();
        let report = || {
            let per: Vec<String> = ms
                .iter()
                .zip(&paused)
                .map(|(c, p)| {
                    format!(
                        "pid {} id {}: slot {:?} sim {} charged {} held {} pool {} refused {} \
                         forks {} kids_killed {}",
                        c.m.pid,
                        c.id,
                        slot_of(&g, c.m.pid, dev),
                        p["sim"],
                        p["charged"],
                        p["held"],
                        p["pool"],
                        p["refused"],
                        p["forks"],
                        p["kids_killed"]
                    )
                })
                .collect();
            format!("used {} of {BUDGET}\n{}", g.used(dev), per.join("\n"))
        };
        assert!(
            used <= BUDGET && sims <= BUDGET,
            "{ctx}: the group passed its budget: the file's use {used}, the sims hold {sims}\n{}",
            report()
        );
        for (c, p) in ms.iter().zip(&paused) {
            let slot = slot_of(&g, c.m.pid, dev).unwrap_or(0);
            assert!(
                p["sim"] <= slot && p["charged"] <= slot,
                "{ctx}: member {} (id {}) holds more than its slot reserves: {members:?}\n{}",
                c.m.pid,
                c.id,
                report()
            );
        }
        // 3. After a squeeze, the group's use is exactly what the live members hold.
        g.squeeze();
        let answered = poll_or(
            HANDSHAKE,
            || {
                ms.iter()
                    .zip(&paused)
                    .all(|(c, p)| slot_of(&g, c.m.pid, dev) == Some(p["sim"]))
            },
            || {
                format!(
                    "{ctx}: after a squeeze the slots never came down to what the members \
                     hold\n{}",
                    report()
                )
            },
        );
        assert!(
            answered <= HELPER_RECLAIM,
            "{ctx}: the squeeze was answered after {answered:?}"
        );
        assert_eq!(
            g.used(dev),
            sims,
            "{ctx}: the group's use vs what its live members hold\n{}",
            report()
        );
        eprintln!(
            "{ctx}: {} members hold {sims} of {BUDGET} (the file's use reached {most_seen} \
             meanwhile); dead slots gone {reclaimed:?} and the squeeze answered {answered:?} \
             after the handshake ({:?} in all); {kills} kills, {trims} trim signals so far",
            ms.len(),
            quiet.elapsed()
        );
        if round < ROUNDS {
            for c in &mut ms {
                c.m.send("go");
            }
        }
    }

    // The end: every member ends normally, giving everything back.
    let ctx = format!("chaos seed {CHAOS_SEED:#x}, the end");
    let (mut forks, mut kids_killed) = (0, 0);
    for c in ms {
        let id = c.id;
        let r = c.m.finish();
        assert!(
            r.status.success() && r.out().ok(),
            "{ctx}: member id {id} did not end cleanly\n{}",
            r.describe()
        );
        let end = r.out().kv("CHAOS").pop().unwrap();
        assert!(
            end["kids_hung"] == 0 && end["kids_bad"] == 0,
            "{ctx}: {}",
            r.describe()
        );
        forks += end["forks"];
        kids_killed += end["kids_killed"];
        assert_eq!(
            r.section("end").sim(0).unwrap()["live"],
            0,
            "{ctx}: {}",
            r.describe()
        );
        runs.push(r);
    }
    assert_eq!(
        (g.used(dev), g.members()),
        (0, vec![]),
        "{ctx}: the group's use with every member ended"
    );
    let trim_reports: usize = runs
        .iter()
        .map(|r| reports_with_reason(r, "trim").len())
        .sum();
    // The trims the schedule sent were answered (so kills did land among trims).
    assert!(
        trim_reports > 0,
        "chaos seed {CHAOS_SEED:#x}: {trims} trim signals and no trim report"
    );
    eprintln!(
        "chaos seed {CHAOS_SEED:#x}: {} members in all, {kills} killed, {trims} trim \
         signals ({trim_reports} trim reports), {forks} children of the survivors \
         ({kids_killed} killed by their parent); {:?}",
        next_id,
        started.elapsed()
    );
    let _ = std::fs::remove_dir_all(runtime);
}

// ---- group files that must not be used ----------------------------------------------

/// A file under the group's name, made by `make` from a good one: returns its path.
fn plant(runtime: &Path, name: &str, make: impl FnOnce(&Path)) -> PathBuf {
    let g = Group::open_or_create(&status_dir(runtime), name).unwrap();
    let path = g.path().to_path_buf();
    drop(g);
    make(&path);
    path
}

fn set_bytes(path: &Path, at: usize, v: &[u8]) {
    let mut b = std::fs::read(path).unwrap();
    b[at..at + v.len()].copy_from_slice(v);
    std::fs::write(path, b).unwrap();
}

/// The files the library must refuse, with a word of the reason it gives. The header:
/// magic (8 bytes), version (4), header size (4), slots (4), devices (4), uid (4).
/// A way to spoil a good group file.
type Spoil = Box<dyn Fn(&Path)>;

fn bad_files() -> Vec<(&'static str, Spoil, &'static str)> {
    vec![
        (
            "old",
            Box::new(|p: &Path| set_bytes(p, 8, &0u32.to_le_bytes())),
            "layout version 0",
        ),
        (
            "truncated",
            Box::new(|p: &Path| {
                let b = std::fs::read(p).unwrap();
                std::fs::write(p, &b[..b.len() / 2]).unwrap();
            }),
            "bytes, not the",
        ),
        (
            "zeros",
            Box::new(|p: &Path| std::fs::write(p, vec![0u8; group::FILE_BYTES]).unwrap()),
            "not a group file",
        ),
        (
            "mode",
            Box::new(|p: &Path| {
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap()
            }),
            "mode is not 0600",
        ),
        (
            "madeby",
            Box::new(|p: &Path| set_bytes(p, 24, &12345u32.to_le_bytes())),
            "made by another user",
        ),
    ]
}

/// What a file is, to show it was not written: bytes, mode, owner.
fn fingerprint(p: &Path) -> (Vec<u8>, u32, u32) {
    let m = std::fs::metadata(p).unwrap();
    (std::fs::read(p).unwrap(), m.mode(), m.uid())
}

/// The stop case: status 2, the program's first CUDA call never returned (no FILL),
/// one of gpuguard's lines names the file and the reason; the file untouched.
fn assert_stopped(r: &Run, path: &Path, reason: &str, before: &(Vec<u8>, u32, u32)) {
    assert_eq!(
        r.status.code(),
        Some(2),
        "{}: GPUGUARD_GROUP_ON_ERROR=stop (the default) stops with status 2\n{}",
        path.display(),
        r.describe()
    );
    assert!(r.out().kv("FILL").is_empty(), "{}", r.describe());
    let p = path.display().to_string();
    assert!(
        gg_stderr_lines(r, r.pid)
            .iter()
            .any(|l| l.contains(&p) && l.contains(reason)),
        "a line naming {p} and {reason:?}\n{}",
        r.describe()
    );
    assert!(fingerprint(path) == *before, "{p} was changed");
}

/// The run case: the program runs to its end, not limited by the group (the sim's
/// 64 MiB, not the group's 16 MiB), with a warning naming the file and the reason.
fn assert_ran_without(r: &Run, path: &Path, reason: &str, before: &(Vec<u8>, u32, u32)) {
    r.assert_ok();
    let fill = r.out().kv("FILL").pop().unwrap();
    assert_eq!(
        (fill["held"], fill["rc"]),
        (64 * MIB, 2),
        "{}: without the group only the device limits\n{}",
        path.display(),
        r.describe()
    );
    assert_eq!(r.gg(0).unwrap()["denied"], 0, "{}", r.describe());
    let p = path.display().to_string();
    assert!(
        gg_stderr_lines(r, r.pid)
            .iter()
            .any(|l| l.contains(&p) && l.contains(reason)),
        "a warning naming {p} and {reason:?}\n{}",
        r.describe()
    );
    assert!(fingerprint(path) == *before, "{p} was changed");
}

#[test]
fn foreign_old_and_damaged_group_files_are_refused() {
    let runtime = runtime_dir("bad");
    for (case, make, reason) in bad_files() {
        let name = format!("bad-{case}");
        let path = plant(&runtime, &name, make);
        let before = fingerprint(&path);
        let env = member_env(&runtime, &name, "16MiB", 64 * MIB);
        let r = member_run(&["fill", "1"], &env);
        assert_stopped(&r, &path, reason, &before);
        let r = member_run(
            &["fill", "1"],
            &with(&env, &[("GPUGUARD_GROUP_ON_ERROR", "run")]),
        );
        assert_ran_without(&r, &path, reason, &before);
    }
    let _ = std::fs::remove_dir_all(runtime);
}

/// A group file that belongs to another user is refused. Making one needs root
/// (chown); otherwise this part is skipped, saying so (the header's uid, checked
/// above as "made by another user", needs no root).
#[test]
fn another_users_group_file_is_refused() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("note: not root: cannot make a file of another user; part skipped");
        return;
    }
    let runtime = runtime_dir("owner");
    let name = "owner";
    let path = plant(&runtime, name, |p| {
        std::os::unix::fs::chown(p, Some(12345), Some(12345)).unwrap()
    });
    let before = fingerprint(&path);
    assert_eq!(before.2, 12345);
    let env = member_env(&runtime, name, "16MiB", 64 * MIB);
    let r = member_run(&["fill", "1"], &env);
    assert_stopped(&r, &path, "belongs to another user", &before);
    let r = member_run(
        &["fill", "1"],
        &with(&env, &[("GPUGUARD_GROUP_ON_ERROR", "run")]),
    );
    assert_ran_without(&r, &path, "belongs to another user", &before);
    let _ = std::fs::remove_dir_all(runtime);
}

/// Names that are not file names are a settings error: status 2 before the program
/// runs (no output), one line naming the variable and the value; no file made.
#[test]
fn group_names_that_are_not_file_names_are_refused() {
    let runtime = runtime_dir("names");
    for bad in ["a/b", ".."] {
        let env = member_env(&runtime, bad, "16MiB", 64 * MIB);
        let r = member_run(&["nocuda"], &env);
        assert_eq!(r.status.code(), Some(2), "{bad:?}\n{}", r.describe());
        assert_eq!(r.stdout, "", "{bad:?}: the program must not run");
        assert!(
            r.stderr.contains("GPUGUARD_GROUP") && r.stderr.contains(bad),
            "{bad:?}\n{}",
            r.describe()
        );
        let groups = group::dir(&status_dir(&runtime));
        let made: Vec<_> = std::fs::read_dir(&groups)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(made.is_empty(), "{made:?}");
    }
    let _ = std::fs::remove_dir_all(runtime);
}

// ---- separate groups, meminfo, refusals, reports --------------------------------------

/// Two groups in one status directory, 64 MiB and 96 MiB: each fills its own budget
/// while the other is full; a second member of the full one gets nothing.
#[test]
fn separate_groups_never_mix() {
    let runtime = runtime_dir("two");
    let env1 = member_env(&runtime, "one", "64MiB", GIB);
    let env2 = member_env(&runtime, "two", "96MiB", GIB);
    let mut a = spawn_member(&["fill", "1", "hold"], &env1);
    let fa = kv_of(&a.wait_line("FILL"));
    assert_eq!((fa["held"], fa["rc"]), (64 * MIB, 2));
    let b = member_run(&["fill", "1"], &env2);
    b.assert_ok();
    let fb = b.out().kv("FILL").pop().unwrap();
    assert_eq!((fb["held"], fb["rc"]), (96 * MIB, 2), "{}", b.describe());
    let c = member_run(&["fill", "1"], &env1);
    c.assert_ok();
    let fc = c.out().kv("FILL").pop().unwrap();
    assert_eq!((fc["held"], fc["rc"]), (0, 2), "{}", c.describe());
    let (g1, d1) = open_group(&runtime, "one");
    let (g2, d2) = open_group(&runtime, "two");
    assert_eq!((g1.budget(d1), g2.budget(d2)), (64 * MIB, 96 * MIB));
    let m1: Vec<u32> = g1.members().iter().map(|m| m.pid).collect();
    assert_eq!(m1, [a.pid], "{:?}", g1.members());
    assert!(g2.members().is_empty(), "{:?}", g2.members());
    assert_eq!(g2.used(d2), 0);
    a.finish().assert_ok();
    assert_eq!(g1.used(d1), 0);
    let _ = std::fs::remove_dir_all(runtime);
}

/// Devices are matched by UUID, not by the CUDA ordinal: a member that sees physical
/// device 1 as its device 0 (`CUDA_VISIBLE_DEVICES=1`) has its own budget there; a
/// member that sees it as its device 0 through `CUDA_VISIBLE_DEVICES=1,0` shares it.
#[test]
fn devices_are_matched_by_uuid() {
    let runtime = runtime_dir("uuid");
    let env = member_env(&runtime, "uuid", "64MiB", GIB);
    let mut a = spawn_member(
        &["fill", "1", "hold"],
        &with(&env, &[("CUDA_VISIBLE_DEVICES", "1")]),
    );
    let fa = kv_of(&a.wait_line("FILL"));
    assert_eq!((fa["held"], fa["rc"]), (64 * MIB, 2));
    // Physical device 0, ordinal 0: another device, its own budget.
    let b = member_run(&["fill", "1"], &env);
    b.assert_ok();
    let fb = b.out().kv("FILL").pop().unwrap();
    assert_eq!((fb["held"], fb["rc"]), (64 * MIB, 2), "{}", b.describe());
    // Physical device 1 again, under its ordinal 0 in that process too: full.
    let c = member_run(
        &["fill", "1"],
        &with(&env, &[("CUDA_VISIBLE_DEVICES", "1,0")]),
    );
    c.assert_ok();
    let fc = c.out().kv("FILL").pop().unwrap();
    assert_eq!((fc["held"], fc["rc"]), (0, 2), "{}", c.describe());
    let g = Group::open(&group_file(&runtime, "uuid"), "uuid").unwrap();
    let devs = g.devices();
    assert_eq!(devs.len(), 2, "one entry per physical device: {devs:?}");
    assert!(devs.iter().all(|d| d.2 == 64 * MIB), "{devs:?}");
    a.finish().assert_ok();
    let _ = std::fs::remove_dir_all(runtime);
}

/// cuMemGetInfo and cudaMemGetInfo in a member: total is its share (the budget less
/// what the other members hold; the process's own cap if smaller), free what the
/// group leaves it; a later member's
/// GPUGUARD_GROUP_CAP does not change the budget; `0.5` is half the device.
#[test]
fn meminfo_in_a_member_shows_the_groups_budget() {
    const BUDGET: u64 = 256 * MIB;
    let runtime = runtime_dir("meminfo");
    let env = member_env(&runtime, "mi", "256MiB", GIB);
    let info = |out: Out<'_>| -> Vec<(u64, u64, u64)> {
        ["MEMINFO", "RTMEMINFO"]
            .iter()
            .map(|t| {
                let m = out.kv(t).pop().unwrap_or_else(|| panic!("no {t}"));
                (m["rc"], m["free"], m["total"])
            })
            .collect()
    };
    let r = member_run(&["meminfo", "40"], &env);
    r.assert_ok();
    for i in info(r.section("fresh")) {
        assert_eq!(i, (0, BUDGET, BUDGET), "alone, fresh\n{}", r.describe());
    }
    for i in info(r.section("used")) {
        assert_eq!(
            i,
            (0, BUDGET - 40 * MIB, BUDGET),
            "alone, 40 MiB\n{}",
            r.describe()
        );
    }

    let mut a = spawn_member(&["hold", "100"], &env);
    assert_eq!(kv_of(&a.wait_line("HELD"))["rc"], 0);
    let (g, dev) = open_group(&runtime, "mi");
    let a_slot = slot_of(&g, a.pid, dev).unwrap();
    let r = member_run(
        &["meminfo", "40"],
        &with(&env, &[("GPUGUARD_GROUP_CAP", "512MiB")]),
    );
    r.assert_ok();
    // Its share: the budget less what the other member holds (its slot), of which
    // what it has charged is used.
    assert!(a_slot >= 100 * MIB, "{a_slot}");
    for i in info(r.section("fresh")) {
        assert_eq!(
            i,
            (0, BUDGET - a_slot, BUDGET - a_slot),
            "fresh, with another member holding {a_slot}\n{}",
            r.describe()
        );
    }
    for i in info(r.section("used")) {
        assert_eq!(
            i,
            (0, BUDGET - a_slot - 40 * MIB, BUDGET - a_slot),
            "40 MiB, with another member holding {a_slot}\n{}",
            r.describe()
        );
    }
    // The process's own cap, smaller than what the group leaves it.
    let r = member_run(&["meminfo"], &with(&env, &[("GPUGUARD_CAP", "0:64MiB")]));
    r.assert_ok();
    for i in info(r.section("fresh")) {
        assert_eq!(i, (0, 64 * MIB, 64 * MIB), "{}", r.describe());
    }
    a.finish().assert_ok();

    // A fraction of the device, as GPUGUARD_CAP takes it (which has no `50%` form).
    let r = member_run(
        &["meminfo"],
        &member_env(&runtime, "half", "0.5", 512 * MIB),
    );
    r.assert_ok();
    for i in info(r.section("fresh")) {
        assert_eq!(i, (0, BUDGET, BUDGET), "0.5 of 512 MiB\n{}", r.describe());
    }
    let _ = std::fs::remove_dir_all(runtime);
}

/// A runtime allocation past the budget is cudaErrorMemoryAllocation, counted as a
/// denial; a process's own GPUGUARD_CAP still applies inside the group.
#[test]
fn refusals_are_cap_refusals_and_the_own_cap_still_applies() {
    let runtime = runtime_dir("refusals");
    let env = member_env(&runtime, "ref", "32MiB", 256 * MIB);
    let r = member_run(&["fill", "1", "rt"], &env);
    r.assert_ok();
    let f = r.out().kv("FILL").pop().unwrap();
    assert_eq!(
        (f["held"], f["rc"]),
        (32 * MIB, 2),
        "cudaErrorMemoryAllocation at the budget\n{}",
        r.describe()
    );
    assert_eq!(
        r.section("full").gg(0).unwrap()["denied"],
        1,
        "{}",
        r.describe()
    );
    let (_, exit) = exit_report(&r);
    assert_eq!(u(&device_entry(&exit, 0).unwrap()["denied"]), 1);

    let r = member_run(&["fill", "1"], &with(&env, &[("GPUGUARD_CAP", "0:20MiB")]));
    r.assert_ok();
    let f = r.out().kv("FILL").pop().unwrap();
    assert_eq!(
        (f["held"], f["rc"]),
        (20 * MIB, 2),
        "the process's own cap inside the group\n{}",
        r.describe()
    );
    let _ = std::fs::remove_dir_all(runtime);
}

/// The cap report of a refusal for the group's budget names the group, its budget,
/// its use and its members with what each holds.
#[test]
fn the_cap_report_names_the_group_and_its_members() {
    const BUDGET: u64 = 128 * MIB;
    let runtime = runtime_dir("report");
    let name = "rep";
    let env = member_env(&runtime, name, "128MiB", GIB);
    let mut a = spawn_member(&["hold", "100"], &env);
    assert_eq!(kv_of(&a.wait_line("HELD"))["rc"], 0);
    let r = member_run(&["fill", "1", "waitcap"], &env);
    r.assert_ok();
    let f = r.out().kv("FILL").pop().unwrap();
    assert_eq!(f["rc"], 2, "{}", r.describe());
    let b_held = f["held"];
    assert!(b_held + 100 * MIB <= BUDGET, "{}", r.describe());
    let reports = reports_with_reason(&r, "cap");
    let (path, rep) = reports
        .iter()
        .min_by_key(|(_, v)| u(&v["seq"]))
        .unwrap_or_else(|| panic!("no cap report\n{}", r.describe()));
    let d = &rep["denial"];
    assert_eq!(d["device"], 0, "{}: {d:#}", path.display());
    assert_eq!(u(&d["bytes"]), MIB, "{d:#}");
    let grp = &d["group"];
    assert_eq!(grp["name"], name, "{}: {d:#}", path.display());
    assert_eq!(u(&grp["budget_bytes"]), BUDGET, "{grp:#}");
    let used = u(&grp["used_bytes"]);
    assert!(
        used <= BUDGET && used + MIB > BUDGET,
        "at a refusal of 1 MiB the group's use is within 1 MiB of its budget: {grp:#}"
    );
    let members: Vec<(u64, u64)> = grp["members"]
        .as_array()
        .unwrap_or_else(|| panic!("members[]: {grp:#}"))
        .iter()
        .map(|m| (u(&m["pid"]), u(&m["held_bytes"])))
        .collect();
    assert_eq!(members.len(), 2, "{grp:#}");
    let held_of = |pid: u32| {
        members
            .iter()
            .find(|m| m.0 == u64::from(pid))
            .unwrap_or_else(|| panic!("no member {pid}: {grp:#}"))
            .1
    };
    assert!(held_of(a.pid) >= 100 * MIB, "{grp:#}");
    assert!(held_of(r.pid) >= b_held, "{grp:#}");
    assert!(
        members.iter().map(|m| m.1).sum::<u64>() <= BUDGET,
        "{grp:#}"
    );
    let (_, exit) = exit_report(&r);
    assert_eq!(u(&device_entry(&exit, 0).unwrap()["denied"]), 1);
    a.finish().assert_ok();
    let _ = std::fs::remove_dir_all(runtime);
}
