//! The `gpuguard` command as a new user meets it, on the simulated driver: `run`
//! summing up only its own reports and pointing at them, refusing a report folder
//! it could not read back, and `show` listing each line of code once, in words
//! that fit what the figures count.

mod cli_support;
mod common;

use cli_support::{Done, cli};
use common::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The command with the simulated driver on the library path.
fn command(args: &[&str]) -> Command {
    shim();
    let mut c = cli_support::command(args);
    c.env("LD_LIBRARY_PATH", sim_dir());
    c
}

fn done(c: &mut Command) -> Done {
    cli_support::done(c.output().expect("run gpuguard"))
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A fresh folder (tests run in parallel).
fn scratch(name: &str) -> PathBuf {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let dir = profile_dir().join("cli-ux-tmp").join(format!(
        "{name}-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn files_ending(dir: &Path, tail: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(tail))
        .collect();
    v.sort();
    v
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// `gpuguard run --dir DIR -- CMD...`.
fn run_in(dir: &Path, cmd: &[&str]) -> Done {
    let mut args = vec!["run", "--dir", s(dir), "--"];
    args.extend_from_slice(cmd);
    done(&mut command(&args))
}

/// A program of the simulated stack, by name.
fn prog(name: &str) -> String {
    s(&sim_dir().join(name)).to_string()
}

/// `hello_gpu STEPS` under `gpuguard run` into `dir`, which ends well.
fn hello(dir: &Path, steps: &str) -> Done {
    let r = run_in(dir, &[&prog("hello_gpu"), steps]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    r
}

/// Two runs in a row into one folder: the second counts none of the first's
/// reports, even one written a moment before it started.
#[test]
fn run_counts_only_the_reports_written_during_it() {
    let dir = scratch("back-to-back");
    let first = hello(&dir, "3");
    assert!(
        first.summary().contains("1 report in"),
        "{}",
        first.describe()
    );
    let second = done(&mut command(&["run", "--dir", s(&dir), "--", "true"]));
    assert_eq!(second.code, Some(0), "{}", second.describe());
    let summary = second.summary();
    assert!(summary.contains("0 reports in"), "{summary}");
    assert!(!summary.contains("hello_gpu"), "{summary}");
}

/// A process of the command that allocated no CUDA memory (a framework's compile
/// worker) writes no report, and the summary counts the reports there are without
/// looking for its; with none at all it says when a process writes one.
#[test]
fn run_summary_leaves_out_a_process_that_allocated_nothing() {
    let dir = scratch("quiet");
    let script = format!("{} quiet && {} 3", prog("gg"), prog("hello_gpu"));
    let r = run_in(&dir, &["sh", "-c", &script]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let summary = r.summary();
    assert!(summary.contains("; 1 report in"), "{summary}");
    assert!(
        summary.contains("hello_gpu (pid") && !summary.contains("gg (pid"),
        "{summary}"
    );
    let dir = scratch("quiet-alone");
    let r = run_in(&dir, &[&prog("gg"), "quiet"]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let summary = r.summary();
    assert!(
        summary.contains("; 0 reports in")
            && summary.contains("a process writes one once it allocates CUDA memory"),
        "{summary}"
    );
}

/// The `details:` line names this run's reports, not every report in the folder,
/// and works as typed in a shell, also in a folder whose name has a space.
#[test]
fn run_details_line_names_only_this_runs_reports() {
    let dir = scratch("details").join("with space");
    std::fs::create_dir_all(&dir).unwrap();
    let old = hello(&dir, "3");
    let r = hello(&dir, "3");
    let line = r
        .summary()
        .lines()
        .find_map(|l| l.trim().strip_prefix("details: gpuguard "))
        .unwrap_or_else(|| panic!("no details line\n{}", r.describe()))
        .to_string();
    let exits = files_ending(&dir, ".exit.json");
    assert_eq!(exits.len(), 2);
    let pid_of = |d: &Done| {
        let at = d.summary().find("(pid ").unwrap() + 5;
        d.summary()[at..].split(')').next().unwrap().to_string()
    };
    let (old_pid, pid) = (pid_of(&old), pid_of(&r));
    assert!(line.contains(&format!(".{pid}.")), "{line}");
    // Typed into a shell, it shows this run's report and only it.
    let shown = done(
        Command::new("sh")
            .arg("-c")
            .arg(format!("{} {line}", cli().replace(' ', "\\ "))),
    );
    assert_eq!(shown.code, Some(0), "{line}\n{}", shown.describe());
    assert!(
        shown.stdout.contains(&format!("(pid {pid})")),
        "{}",
        shown.describe()
    );
    assert!(
        !shown.stdout.contains(&format!("(pid {old_pid})")),
        "the earlier run's report was shown\n{}",
        shown.describe()
    );
}

/// A report folder that does not exist (or is a file) is refused before the
/// command starts: the library would write its reports to stderr instead, and
/// the summary would say no process wrote any.
#[test]
fn run_refuses_a_report_folder_it_cannot_use() {
    let base = scratch("bad-dir");
    let missing = base.join("missing");
    let file = base.join("a-file");
    std::fs::write(&file, b"").unwrap();
    for dir in [&missing, &file] {
        refused_before_start(&["--dir", s(dir)], &[], &["--dir", s(dir)]);
    }
    // The same from the environment, naming the variable.
    refused_before_start(&[], &[("GPUGUARD_DIR", s(&missing))], &["GPUGUARD_DIR"]);
}

/// `gpuguard run OPTIONS -- sh -c 'touch MARKER'` with `env` is refused (status
/// 2, no summary, a message holding each of `needles`) before the command starts.
fn refused_before_start(options: &[&str], env: &[(&str, &str)], needles: &[&str]) {
    let base = scratch("refused");
    let marker = base.join("started");
    let touch = format!("touch {}", s(&marker));
    let mut args = vec!["run"];
    args.extend_from_slice(options);
    if !options.contains(&"--dir") && !env.iter().any(|(k, _)| *k == "GPUGUARD_DIR") {
        args.extend(["--dir", s(&base)]);
    }
    args.extend(["--", "sh", "-c", &touch]);
    let mut c = command(&args);
    c.envs(env.iter().copied());
    let r = done(&mut c);
    assert_eq!(r.code, Some(2), "{options:?} {env:?}\n{}", r.describe());
    for needle in needles {
        assert!(r.stderr.contains(needle), "{needle}\n{}", r.describe());
    }
    assert!(!r.stderr.contains("gpuguard run:"), "{}", r.describe());
    assert!(!marker.exists(), "the command ran: {options:?} {env:?}");
}

/// One line of code is one line in the lists, whatever ids the library gave it:
/// `show` and `run`'s summary add up sites whose frames are the same.
#[test]
fn sites_with_the_same_frames_are_listed_once() {
    let dir = scratch("same-frames");
    hello(&dir, "3");
    let exit = files_ending(&dir, ".exit.json").pop().unwrap();
    // Two sites of one line, as the library writes them when the first call
    // through a path differs below the program's frames.
    let mut report = read_json(&exit);
    let mut twin = report["sites"][0].clone();
    twin["id"] = json!(777);
    report["sites"].as_array_mut().unwrap().push(twin);
    let twice = dir.join("gpuguard.hello_gpu.1.9.exit.json");
    std::fs::write(&twice, report.to_string()).unwrap();
    let shown = done(&mut command(&["show", s(&twice)]));
    assert_eq!(shown.code, Some(0), "{}", shown.describe());
    let sites: Vec<&str> = shown
        .stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("site"))
        .collect();
    assert_eq!(sites.len(), 1, "{}", shown.describe());
    assert!(
        sites[0].contains(", 777") && sites[0].contains("16.0 MiB in 2 allocations"),
        "{}",
        shown.describe()
    );
    let json = done(&mut command(&["show", "--json", s(&twice)]));
    let v: Value = serde_json::from_str(&json.stdout).unwrap();
    let top = v["reports"][0]["top_sites"].as_array().unwrap();
    assert_eq!(top.len(), 1, "{}", json.stdout);
    assert_eq!(top[0]["live_count"], 2);
    // hello_gpu leaks from one line; the summary names it once.
    let r6 = hello(&dir, "6");
    let lines = r6
        .summary()
        .lines()
        .filter(|l| l.contains("remember_batch_stats"))
        .count();
    assert_eq!(lines, 1, "{}", r6.describe());
}

/// A real exit report of `hello_gpu 3` given one `python-stack` Python line (3
/// allocations, 8 MiB), written as `gpuguard.python3.1.1.exit.json` in a fresh
/// folder: its path and contents.
fn python_stack_report(name: &str) -> (PathBuf, Value) {
    let dir = scratch(name);
    hello(&dir, "3");
    let exit = files_ending(&dir, ".exit.json").pop().unwrap();
    let mut report = read_json(&exit);
    report["python_sites"] = json!([{
        "id": 0,
        "framework": "python-stack",
        "frames": ["train.py:12 in step", "train.py:30 in <module>"],
        "live_bytes": 8388608,
        "live_count": 3
    }]);
    let p = dir.join("gpuguard.python3.1.1.exit.json");
    std::fs::write(&p, report.to_string()).unwrap();
    (p, report)
}

/// Python lines read from the allocating thread's stack (`python-stack`) count
/// allocations taken from the driver, cached memory included: they are not called
/// framework blocks in use.
#[test]
fn python_stack_lines_are_called_allocations() {
    let (p, mut report) = python_stack_report("python-stack");
    let shown = done(&mut command(&["show", s(&p)]));
    assert_eq!(shown.code, Some(0), "{}", shown.describe());
    let out = &shown.stdout;
    assert!(!out.contains("framework memory in use"), "{out}");
    assert!(!out.contains("3 blocks"), "{out}");
    assert!(
        out.contains("8.0 MiB in 3 allocations (python-stack)"),
        "{out}"
    );
    // A framework's own lines are still its blocks in use.
    report["python_sites"][0]["framework"] = json!("pytorch");
    std::fs::write(&p, report.to_string()).unwrap();
    let shown = done(&mut command(&["show", s(&p)]));
    assert!(
        shown.stdout.contains("framework memory in use")
            && shown.stdout.contains("3 blocks (pytorch)"),
        "{}",
        shown.describe()
    );
}

/// Milliseconds since the epoch, as reports carry them.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A pid no process can have (past Linux's largest `pid_max`).
const NO_PID: u32 = 4_194_399;

/// `gpuguard run` over a command that copies `reports` (name, contents) into the
/// report folder, as processes of the command would write them: the summary.
fn run_planting(reports: &[(String, Value)], extra: &[&str]) -> Done {
    let staging = scratch("staging");
    for (name, v) in reports {
        std::fs::write(staging.join(name), v.to_string()).unwrap();
    }
    let dir = scratch("planted");
    let copy = format!("cp {}/* {}/", s(&staging), s(&dir));
    let mut args = vec!["run", "--dir", s(&dir)];
    args.extend_from_slice(extra);
    args.extend(["--", "sh", "-c", &copy]);
    let r = done(&mut command(&args));
    assert_eq!(r.code, Some(0), "{}", r.describe());
    r
}

/// A real exit report of `hello_gpu 3`, made to look written now by `NO_PID`.
fn fresh_report() -> Value {
    let dir = scratch("fresh");
    hello(&dir, "3");
    let mut v = read_json(&files_ending(&dir, ".exit.json").pop().unwrap());
    v["pid"] = json!(NO_PID);
    v["time_unix_ms"] = json!(now_ms());
    v
}

/// A trim the exit cut short can write its report after the exit report: the
/// summary's "live at exit" still comes from the exit report.
#[test]
fn run_summary_takes_live_at_exit_from_the_exit_report() {
    let exit = fresh_report();
    let mut late = exit.clone();
    late["seq"] = json!(2);
    late["reason"] = json!("trim");
    late["devices"][0]["current_bytes"] = json!(0);
    let r = run_planting(
        &[
            (format!("gpuguard.hello_gpu.{NO_PID}.1.exit.json"), exit),
            (format!("gpuguard.hello_gpu.{NO_PID}.2.trim.json"), late),
        ],
        &[],
    );
    let summary = r.summary();
    assert!(summary.contains("2 reports in"), "{summary}");
    assert!(
        summary.contains("live at exit 8.0 MiB in 1 allocation"),
        "{summary}"
    );
}

/// In a Python process a native site starts in the interpreter and libffi; the
/// summary names the program's Python line instead.
#[test]
fn run_summary_names_the_python_line_of_a_native_site() {
    let mut v = fresh_report();
    v["sites"][0]["frames"] = json!([
        "libffi.so.8+0x6f79",
        "ffi_call+0xcc (libffi.so.8+0x6b0c)",
        "_PyEval_EvalFrameDefault+0x2e52 (libpython3.11.so.1.0+0xfd9c2)",
        "python: train.py:41 in remember",
        "python: train.py:90 in <module>"
    ]);
    let r = run_planting(
        &[(format!("gpuguard.python3.{NO_PID}.1.exit.json"), v)],
        &[],
    );
    let summary = r.summary();
    let line = summary
        .lines()
        .find(|l| l.contains("in 1 allocation:"))
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(
        line.ends_with("python: train.py:41 in remember <- python: train.py:90 in <module>"),
        "{summary}"
    );
}

/// `run --trace FILE` with a library that wrote no trace says so, instead of
/// leaving the user to look for the file.
#[test]
fn run_says_when_no_trace_was_written() {
    let trace = scratch("trace").join("t.json");
    let r = run_planting(
        &[(
            format!("gpuguard.hello_gpu.{NO_PID}.1.exit.json"),
            fresh_report(),
        )],
        &["--trace", s(&trace)],
    );
    let summary = r.summary();
    assert!(
        trace.exists() || summary.contains(&format!("no trace was written to {}", s(&trace))),
        "{summary}"
    );
}

/// `plot` given something that is not a trace calls it a trace, not a report.
#[test]
fn plot_refusals_speak_of_traces() {
    let r = done(&mut command(&["plot", "/dev/null"]));
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(
        r.stderr.contains("not a trace file") && !r.stderr.contains("report"),
        "{}",
        r.describe()
    );
}

/// A reason given through the C API may hold dots (`epoch.3`): the file name says
/// `epoch_3` (one field), the report itself keeps the reason; the report is this
/// run's, counted and matched by the details line.
#[test]
fn run_counts_reports_whose_reason_has_dots() {
    let dir = scratch("dotted");
    let script = "import ctypes\n\
                  lib = ctypes.CDLL(None)\n\
                  rt = ctypes.CDLL('libcudart.so.13')\n\
                  p = ctypes.c_void_p()\n\
                  assert rt.cudaMalloc(ctypes.byref(p), 1 << 20) == 0\n\
                  assert lib.gpuguard_write_report(b'epoch.3', None, 0) == 0\n";
    let r = done(
        command(&["run", "--dir", s(&dir), "--", "python3", "-c", script])
            .env("GPUGUARD_PYTHON", "off"),
    );
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert_eq!(
        files_ending(&dir, ".epoch_3.json").len(),
        1,
        "{}",
        r.describe()
    );
    let summary = r.summary();
    assert!(summary.contains("2 reports in"), "{summary}");
    let line = summary
        .lines()
        .find_map(|l| l.trim().strip_prefix("details: gpuguard "))
        .unwrap_or_else(|| panic!("{summary}"));
    let shown = done(
        Command::new("sh")
            .arg("-c")
            .arg(format!("{} {line}", cli())),
    );
    assert_eq!(shown.code, Some(0), "{}", shown.describe());
    assert!(
        shown.stdout.contains("reason: epoch.3"),
        "{}",
        shown.describe()
    );
}

/// A command ended by a signal is said to be, by the signal's name; with no report
/// written, the summary does not suggest the command never used CUDA.
#[test]
fn run_summary_names_the_signal_that_ended_the_command() {
    let dir = scratch("killed");
    let r = run_in(&dir, &["sh", "-c", "kill -KILL $$"]);
    assert_eq!(r.code, Some(128 + 9), "{}", r.describe());
    let summary = r.summary();
    assert!(
        summary.contains("was ended by SIGKILL (status 137)"),
        "{summary}"
    );
    assert!(
        summary.contains("SIGKILL ended it before it exited")
            && !summary.contains("did it use CUDA"),
        "{summary}"
    );
}

/// The pid a user sees first is `gpuguard run`'s: `gpuguard trim` given it trims
/// the command that runs under it.
#[test]
fn trim_given_the_pid_of_gpuguard_run_trims_its_command() {
    shim();
    let dir = scratch("trim-run");
    let child = cli_support::start_ready(&dir, &sim_dir(), false);
    let run_pid = child.id().to_string();
    let r = done(&mut command(&["trim", &run_pid, "--timeout", "20"]));
    cli_support::finish_ready(child);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(
        r.stdout.starts_with("gpuguard trim: process ")
            && !r.stdout.contains(&format!("process {run_pid} ")),
        "{}",
        r.describe()
    );
    assert_eq!(files_ending(&dir, ".trim.json").len(), 1);
}

/// `gpuguard show DIR` (the report folder's name) is refused with the pattern that
/// names the reports in it.
#[test]
fn show_given_a_folder_names_the_reports_in_it() {
    let dir = scratch("folder");
    for sub in ["show", "flamegraph"] {
        let r = done(&mut command(&[sub, s(&dir)]));
        assert_eq!(r.code, Some(2), "{}", r.describe());
        assert!(
            r.stderr.contains(&format!("{}/gpuguard.*.json", s(&dir))),
            "{sub}\n{}",
            r.describe()
        );
    }
}

/// A malformed `GPUGUARD_*` value in the environment is refused before the command
/// starts, naming the variable, as the options are (the library would stop the
/// command at load and the summary would wonder whether it used CUDA).
#[test]
fn run_checks_the_environments_variables_before_starting() {
    for (var, value) in [("GPUGUARD_CAP", "abc"), ("GPUGUARD_REPORT_SIGNAL", "KILL")] {
        refused_before_start(&[], &[(var, value)], &[var, value]);
    }
    // An option overrides the environment's value, as the library sees it.
    let base = scratch("env-check");
    let r = done(
        command(&["run", "--cap", "1GiB", "--dir", s(&base), "--", "true"])
            .env("GPUGUARD_CAP", "abc"),
    );
    assert_eq!(r.code, Some(0), "{}", r.describe());
}

/// The flame graph's Python view says what python-stack lines hold (the
/// allocations they made), not framework blocks in use.
#[test]
fn flamegraph_python_view_of_python_stack_lines_speaks_of_allocations() {
    let (p, _) = python_stack_report("flame-stack");
    let r = done(&mut command(&["flamegraph", s(&p), "-o", "-"]));
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(
        !r.stdout.contains("framework blocks in use"),
        "{}",
        r.describe()
    );
    assert!(
        r.stdout
            .contains("live allocations, by the Python line that made them"),
        "{}",
        r.describe()
    );
}

/// With several processes (a parent and the child it forked), each line of the
/// summary says whose it is.
#[test]
fn run_summary_says_whose_line_it_is() {
    let dir = scratch("fork");
    let r = run_in(&dir, &[&prog("gg"), "fork", "leak"]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let summary = r.summary();
    let lines: Vec<&str> = summary
        .lines()
        .skip_while(|l| !l.contains("top lines"))
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .collect();
    assert!(lines.len() >= 2, "{summary}");
    for l in lines {
        assert!(l.contains(" in pid "), "{summary}");
    }
}

/// `diff` with the later report first warns that the changes read backwards.
#[test]
fn diff_warns_when_the_later_report_comes_first() {
    let dir = scratch("reversed");
    // `gg snapshots 1` waits until two snapshots are written (a handshake): with
    // the exit report, three reports of one process, however slow the machine.
    let r = done(
        command(&["run", "--dir", s(&dir), "--", &prog("gg"), "snapshots", "1"])
            .env("GPUGUARD_SNAPSHOT_EVERY", "200ms"),
    );
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let snaps = files_ending(&dir, ".json");
    assert!(snaps.len() >= 3, "{}", r.describe());
    let (first, last) = (&snaps[0], snaps.last().unwrap());
    let seq = |p: &Path| read_json(p)["seq"].as_u64().unwrap();
    let (first, last) = if seq(first) < seq(last) {
        (first, last)
    } else {
        (last, first)
    };
    let fine = done(&mut command(&["diff", s(first), s(last)]));
    assert!(
        !fine.stdout.contains("read backwards"),
        "{}",
        fine.describe()
    );
    let back = done(&mut command(&["diff", s(last), s(first)]));
    assert_eq!(back.code, Some(0), "{}", back.describe());
    assert!(
        back.stdout.contains("the changes read backwards"),
        "{}",
        back.describe()
    );
    let json = done(&mut command(&["diff", "--json", s(last), s(first)]));
    let v: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["written_backwards"], true);
}

/// Pinned host memory is counted apart from device memory: `show` and `run`'s
/// summary say how much a process pinned (a process that pinned host memory and
/// used no device memory no longer reads as having used nothing).
#[test]
fn pinned_host_memory_is_shown() {
    let dir = scratch("pinned");
    let r = run_in(&dir, &[&prog("gg"), "host"]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(
        r.summary()
            .contains("pinned host memory: 297.0 KiB live in 2 allocations"),
        "{}",
        r.describe()
    );
    let exit = files_ending(&dir, ".exit.json").pop().unwrap();
    let shown = done(&mut command(&["show", s(&exit)]));
    assert_eq!(shown.code, Some(0), "{}", shown.describe());
    let out = &shown.stdout;
    assert!(
        out.contains("pinned host memory: 297.0 KiB live in 2 allocations, peak"),
        "{out}"
    );
    // A host allocation's `dev` is no device.
    let host_rows: Vec<&str> = out
        .lines()
        .filter(|l| l.trim_start().starts_with("0x") && l.contains(" host "))
        .collect();
    assert!(!host_rows.is_empty(), "{out}");
    for row in host_rows {
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[3], "-", "{row}");
    }
    let json = done(&mut command(&["show", "--json", s(&exit)]));
    let v: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["reports"][0]["host_pinned"]["live_count"], 2);
}

/// A report of a distributed run says its rank where it says who wrote it, in
/// `show` and in `run`'s summary.
#[test]
fn reports_of_a_rank_say_which() {
    let dir = scratch("rank");
    let r = done(
        command(&["run", "--dir", s(&dir), "--", &prog("hello_gpu"), "1"])
            .env("RANK", "1")
            .env("WORLD_SIZE", "2")
            .env("LOCAL_RANK", "1"),
    );
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(
        r.summary().contains(", rank 1/2 on host "),
        "{}",
        r.describe()
    );
    let exit = files_ending(&dir, ".exit.json").pop().unwrap();
    let shown = done(&mut command(&["show", s(&exit)]));
    let who = shown.stdout.lines().nth(1).unwrap_or_default();
    assert!(who.contains(", rank 1/2 on host "), "{}", shown.describe());
}

/// A command that changes directory before it starts the CUDA program still
/// writes its reports where `gpuguard run` reads them: the working directory
/// `run` started in, or `--dir` taken from there.
#[test]
fn run_finds_the_reports_of_a_command_that_changes_directory() {
    let base = scratch("cd");
    std::fs::create_dir_all(base.join("exp")).unwrap();
    std::fs::create_dir_all(base.join("out")).unwrap();
    let cd_and_run = format!("cd exp && {} 3 >/dev/null", prog("hello_gpu"));
    for (options, folder) in [
        (&[][..], base.clone()),
        (&["--dir", "out"][..], base.join("out")),
    ] {
        let mut args = vec!["run"];
        args.extend_from_slice(options);
        args.extend(["--", "sh", "-c", &cd_and_run]);
        let r = done(command(&args).current_dir(&base));
        assert_eq!(r.code, Some(0), "{}", r.describe());
        assert!(
            r.summary().contains("1 report in"),
            "{options:?}\n{}",
            r.describe()
        );
        assert_eq!(files_ending(&folder, ".exit.json").len(), 1, "{options:?}");
        assert!(files_ending(&base.join("exp"), ".json").is_empty());
        for f in files_ending(&folder, ".exit.json") {
            std::fs::remove_file(f).unwrap();
        }
    }
}

/// `kill -USR1 <pid of gpuguard run>` reaches the CUDA program also when the
/// command is a shell that runs it as a child (the shell would swallow it).
#[test]
fn run_passes_report_signals_to_the_cuda_process_under_a_shell() {
    shim();
    let dir = scratch("shell-signal");
    let child = cli_support::start_ready(&dir, &sim_dir(), true);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while files_ending(&dir, ".signal.json").is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no signal report from the program under the shell"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    cli_support::finish_ready(child);
}
