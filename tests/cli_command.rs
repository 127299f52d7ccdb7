//! The `gpuguard` command line as a user meets it: help and errors that name what
//! is wrong, `run` checking its options, finding its library, summarising what
//! its command's processes wrote and passing the status through, `show` answering
//! first, `diff` both ways, and hostile or odd input refused without a hang or an
//! abort.

mod cli_support;
mod common;
mod core_support;

use cli_support::*;
use common::*;
use core_support::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn gpuguard(args: &[&str]) -> Done {
    done(command(args).output().expect("run gpuguard"))
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A fresh folder for files a test makes.
fn scratch(name: &str) -> PathBuf {
    let dir = profile_dir()
        .join("cli-tmp")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A real exit report of `gg leak <k>` (k allocations of 1, 2, .. MiB): its path
/// and contents.
fn leak_report(k: &str) -> (PathBuf, Value) {
    let r = gg_run("gg", &["leak", k], &[]);
    r.assert_ok();
    exit_report(&r)
}

/// `report` written to `dir/name`.
fn write_report(dir: &Path, name: &str, report: &Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, report.to_string()).unwrap();
    p
}

// ---------------------------------------------------------------------------
// The command line
// ---------------------------------------------------------------------------

#[test]
fn every_subcommand_has_help() {
    for sub in ["run", "show", "diff", "trim", "lib"] {
        for args in [vec![sub, "--help"], vec!["help", sub]] {
            let r = gpuguard(&args);
            assert_eq!(r.code, Some(0), "{args:?}\n{}", r.describe());
            assert!(
                r.stdout.contains(&format!("Usage: gpuguard {sub}")),
                "{args:?}\n{}",
                r.describe()
            );
        }
    }
    // `show --help` is help, not a file named --help.
    assert!(!gpuguard(&["show", "--help"]).stderr.contains("cannot read"));
}

#[test]
fn help_documents_the_exit_codes() {
    let r = gpuguard(&["--help"]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let at = r
        .stdout
        .find("Exit status")
        .expect("an exit status section");
    let section = &r.stdout[at..];
    for line in [
        "0    success",
        "1    a check failed",
        "2    wrong usage",
        "128+N",
    ] {
        assert!(section.contains(line), "{line}\n{section}");
    }
}

#[test]
fn unknown_words_are_named() {
    let r = gpuguard(&["frobnicate"]);
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(r.stderr.contains("'frobnicate'"), "{}", r.describe());
    let r = gpuguard(&["show", "--frobnicate", "x.json"]);
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(r.stderr.contains("--frobnicate"), "{}", r.describe());
}

/// A process not under gpuguard, to point `trim` at.
fn bystander() -> std::process::Child {
    Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep")
}

#[test]
fn trim_takes_options_in_any_order() {
    let mut child = bystander();
    let pid = child.id().to_string();
    for args in [
        vec!["trim", &pid, "--timeout", "1"],
        vec!["trim", "--timeout", "1", &pid],
        vec!["trim", &pid, "--timeout", "0"],
        vec!["trim", &pid, "--timeout=0.25"],
    ] {
        let r = gpuguard(&args);
        assert_eq!(r.code, Some(2), "{args:?}\n{}", r.describe());
        // Past the command line: the process was looked at.
        assert!(
            r.stderr.contains("is not running gpuguard"),
            "{args:?}\n{}",
            r.describe()
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn trim_refuses_impossible_timeouts_without_aborting() {
    for bad in ["1e20", "NaN", "-1", "inf", "soon"] {
        let r = gpuguard(&["trim", "1", "--timeout", bad]);
        assert_eq!(r.code, Some(2), "{bad}\n{}", r.describe());
        assert!(r.stderr.contains("--timeout"), "{bad}\n{}", r.describe());
    }
}

// ---------------------------------------------------------------------------
// run
// ---------------------------------------------------------------------------

/// `gpuguard run` on the sim, reports in a fresh folder: (done, report folder).
fn guarded(args: &[&str], env: &[(&str, &str)]) -> (Done, PathBuf) {
    shim();
    // One folder per call: tests run in parallel.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let dir = scratch(&format!("run-{}", CALLS.fetch_add(1, Ordering::Relaxed)));
    let mut c = command(&["run", "--dir", s(&dir)]);
    c.args(args).env("LD_LIBRARY_PATH", sim_dir());
    for (k, v) in env {
        c.env(k, v);
    }
    (done(c.output().expect("run gpuguard run")), dir)
}

#[test]
fn run_names_the_bad_option_before_starting_anything() {
    let marker = scratch("bad-option").join("started");
    let touch = format!("touch {}", s(&marker));
    for (option, value) in [
        ("--cap", "abc"),
        ("--warn-at", "2"),
        ("--trim-at", "lots"),
        ("--log", "loud"),
    ] {
        let (r, _) = guarded(&[option, value, "--", "sh", "-c", &touch], &[]);
        assert_eq!(r.code, Some(2), "{option}\n{}", r.describe());
        assert!(
            r.stderr.contains(option) && r.stderr.contains(value),
            "{option}\n{}",
            r.describe()
        );
        assert!(!marker.exists(), "{option}: the command ran");
    }
}

#[test]
fn run_passes_the_status_through() {
    let (r, _) = guarded(&["--", "sh", "-c", "exit 3"], &[]);
    assert_eq!(r.code, Some(3), "{}", r.describe());
    // Ended by a signal: 128 + its number, as a shell says.
    let (r, _) = guarded(&["--", "sh", "-c", "kill -TERM $$"], &[]);
    assert_eq!(r.code, Some(128 + 15), "{}", r.describe());
}

#[test]
fn run_sets_the_trace_variable_and_keeps_ld_preload() {
    // The real library, named by GPUGUARD_LIB: in a shell that never uses CUDA it
    // does nothing, and the variables are seen as COMMAND gets them.
    let stand_in = shim();
    let other = sim_dir().join("libcudart.so");
    let (r, _) = guarded(
        &[
            "--trace",
            "/tmp/t.json",
            "--",
            "sh",
            "-c",
            "echo \"trace=$GPUGUARD_TRACE\"; echo \"preload=$LD_PRELOAD\"; echo \"lib=${GPUGUARD_LIB-unset}\"",
        ],
        &[("GPUGUARD_LIB", s(&stand_in)), ("LD_PRELOAD", s(&other))],
    );
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(r.stdout.contains("trace=/tmp/t.json"), "{}", r.describe());
    let want = format!(
        "preload={}:{}",
        s(&stand_in.canonicalize().unwrap()),
        s(&other)
    );
    assert!(r.stdout.contains(&want), "{want}\n{}", r.describe());
    // The command's own variable is not passed on to the library.
    assert!(r.stdout.contains("lib=unset"), "{}", r.describe());
}

#[test]
fn run_summarises_the_reports_of_the_command_and_its_children() {
    let gg = sim_dir().join("gg");
    let script = format!("{0} leak 1 >/dev/null && {0} leak 2 >/dev/null", s(&gg));
    // A report of another process already in the folder is not this run's.
    let (old, _) = leak_report("3");
    let (r, dir) = guarded(&["--", "sh", "-c", &script], &[]);
    std::fs::copy(&old, dir.join("gpuguard.gg.1.1.exit.json")).unwrap();
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let exits: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".exit.json"))
        .collect();
    assert_eq!(exits.len(), 3, "two of the run, one planted");
    let summary = r.summary();
    assert!(summary.contains("2 reports in"), "{summary}");
    // Per process and device: peak and live at exit.
    assert!(
        summary.contains("peak 1.0 MiB, live at exit 1.0 MiB in 1 allocation"),
        "{summary}"
    );
    assert!(
        summary.contains("peak 3.0 MiB, live at exit 3.0 MiB in 2 allocations"),
        "{summary}"
    );
    assert!(summary.contains("leaky_function"), "{summary}");
    assert!(
        !summary.contains("6.0 MiB"),
        "the planted report counted\n{summary}"
    );
}

#[test]
fn run_summary_tells_caps_hit() {
    let gg_cap = sim_dir().join("gg_cap");
    let (r, _) = guarded(
        &[
            "--cap",
            "0:16MiB",
            "--",
            s(&gg_cap),
            "deny_loop",
            "3",
            "nowait",
            "rt",
        ],
        &[],
    );
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let summary = r.summary();
    assert!(
        summary.contains("caps hit: pid")
            && summary.contains("3 allocations refused by its 16.0 MiB cap"),
        "{summary}"
    );
}

#[test]
fn run_without_a_command_is_a_usage_error() {
    let r = gpuguard(&["run", "--cap", "1GiB"]);
    assert_eq!(r.code, Some(2), "{}", r.describe());
    assert!(r.stderr.contains("COMMAND"), "{}", r.describe());
}

/// `--trace` naming a FIFO nobody reads: the command runs and ends (before, it
/// never ended: its helper thread blocked opening the FIFO and the exit waited for
/// it), the library says once what the file is, the summary says no trace was
/// written, and the status is the command's.
#[test]
fn run_with_a_trace_fifo_ends() {
    shim();
    let fifo = scratch("run-fifo").join("t.json");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let gg = sim_dir().join("gg");
    let mut c = command(&["run", "--trace", s(&fifo), "--", s(&gg), "leak", "1"]);
    c.env("LD_LIBRARY_PATH", sim_dir())
        .current_dir(fifo.parent().unwrap());
    let r = within(c, Duration::from_secs(30));
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let said: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains("it is a FIFO, not a regular file"))
        .collect();
    assert_eq!(said.len(), 1, "{}", r.describe());
    assert!(
        r.stderr
            .contains(&format!("no trace was written to {}", s(&fifo))),
        "{}",
        r.describe()
    );
}

/// Runs `c` in a process group of its own, its output in files; past `limit` the
/// whole group is killed and the test fails (a command whose child hangs would
/// otherwise hold the output open, and the test, for ever).
fn within(mut c: Command, limit: Duration) -> Done {
    use std::os::unix::process::CommandExt;
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let dir = scratch(&format!("within-{}", CALLS.fetch_add(1, Ordering::Relaxed)));
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    c.process_group(0)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    let mut child = c.spawn().expect("spawn");
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > limit {
            // SAFETY: kill(2) of the group this test started.
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let d = Done {
        code: status.and_then(|s| s.code()),
        stdout: std::fs::read_to_string(&out).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err).unwrap_or_default(),
    };
    assert!(
        status.is_some(),
        "still running after {limit:?}, killed\n{}",
        d.describe()
    );
    d
}

/// `GPUGUARD_LIB` naming something that is not a shared library: before, the
/// loader ignored it (one line of its own) and the command ran unguarded, status 0.
/// Now refused before anything starts: one `gpuguard:` line naming the path,
/// status 2.
#[test]
fn run_refuses_a_library_that_is_not_a_shared_object() {
    let dir = scratch("not-a-lib");
    let marker = dir.join("started");
    let touch = format!("touch {}", s(&marker));
    let empty = dir.join("empty.so");
    std::fs::write(&empty, b"").unwrap();
    let cut = dir.join("cut.so");
    std::fs::write(&cut, &std::fs::read(shim()).unwrap()[..10]).unwrap();
    let text = dir.join("libgpuguard.so");
    std::fs::write(&text, b"#!/bin/sh\nexit 0\n").unwrap();
    for lib in ["/etc/passwd", s(&empty), s(&cut), s(&text)] {
        let (r, _) = guarded(&["--", "sh", "-c", &touch], &[("GPUGUARD_LIB", lib)]);
        assert_eq!(r.code, Some(2), "{lib}\n{}", r.describe());
        let lines: Vec<&str> = r.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{lib}\n{}", r.describe());
        assert!(
            lines[0].starts_with("gpuguard: ")
                && lines[0].contains(lib)
                && lines[0].contains("not a shared library"),
            "{lib}: {}",
            lines[0]
        );
        assert!(!marker.exists(), "{lib}: the command ran");
        // `gpuguard lib` names no such file either: `LD_PRELOAD=$(gpuguard lib)`
        // would run the program unguarded.
        let r = done(
            command(&["lib"])
                .env("GPUGUARD_LIB", lib)
                .output()
                .expect("run gpuguard lib"),
        );
        assert_eq!(r.code, Some(2), "lib {lib}\n{}", r.describe());
        assert!(r.stdout.is_empty(), "lib {lib}\n{}", r.describe());
        assert!(
            r.stderr.contains("not a shared library"),
            "{}",
            r.describe()
        );
    }
    // A shared library, but not gpuguard's: it would load and guard nothing.
    let other = dir.join("libother.so");
    std::fs::copy(libc_path(), &other).unwrap();
    for args in [&["run", "--", "sh", "-c", &touch][..], &["lib"][..]] {
        let r = done(
            command(args)
                .env("GPUGUARD_LIB", &other)
                .output()
                .expect("run gpuguard"),
        );
        assert_eq!(r.code, Some(2), "{args:?}\n{}", r.describe());
        assert!(r.stderr.contains("not gpuguard's"), "{}", r.describe());
    }
    assert!(!marker.exists(), "the command ran");
}

/// A shared library of this machine that is not gpuguard's: the C library this
/// test runs on.
fn libc_path() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so"))
        .map(PathBuf::from)
        .expect("libc among this process's mappings")
}

// ---------------------------------------------------------------------------
// lib: finding the library
// ---------------------------------------------------------------------------

#[test]
fn lib_prints_the_library_beside_the_command() {
    let lib = shim();
    let r = gpuguard(&["lib"]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert_eq!(r.stdout.trim_end(), s(&lib.canonicalize().unwrap()));
}

/// Runs a freshly copied executable. Another test thread that forks while the copy
/// is open for writing holds it open until its exec, and running it then fails
/// with "Text file busy" for that moment: try again.
fn output_of(c: &mut Command) -> Output {
    for _ in 0..100 {
        match c.output() {
            Err(e) if e.raw_os_error() == Some(26) => std::thread::sleep(Duration::from_millis(20)),
            other => return other.expect("run the copied command"),
        }
    }
    panic!("the copied command stayed busy");
}

#[test]
fn an_installed_layout_finds_lib_and_a_lone_copy_says_where_it_looked() {
    let lib = shim();
    let prefix = scratch("prefix");
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    let exe = prefix.join("bin/gpuguard");
    std::fs::copy(cli(), &exe).unwrap();
    let lone = done(output_of(
        Command::new(&exe).arg("lib").env_remove("GPUGUARD_LIB"),
    ));
    assert_eq!(lone.code, Some(2), "{}", lone.describe());
    for place in [
        "GPUGUARD_LIB",
        "bin/libgpuguard.so",
        "bin/../lib/libgpuguard.so",
    ] {
        assert!(lone.stderr.contains(place), "{place}\n{}", lone.describe());
    }
    std::fs::create_dir_all(prefix.join("lib")).unwrap();
    std::fs::copy(&lib, prefix.join("lib/libgpuguard.so")).unwrap();
    let found = done(output_of(
        Command::new(&exe).arg("lib").env_remove("GPUGUARD_LIB"),
    ));
    assert_eq!(found.code, Some(0), "{}", found.describe());
    let want = prefix.join("lib/libgpuguard.so").canonicalize().unwrap();
    assert_eq!(found.stdout.trim_end(), s(&want));
    // Named explicitly but wrong: said so, not looked past.
    let named = done(output_of(
        Command::new(&exe)
            .arg("lib")
            .env("GPUGUARD_LIB", "/nonexistent/libgpuguard.so"),
    ));
    assert_eq!(named.code, Some(2), "{}", named.describe());
    assert!(
        named.stderr.contains("/nonexistent/libgpuguard.so"),
        "{}",
        named.describe()
    );
}

// ---------------------------------------------------------------------------
// show
// ---------------------------------------------------------------------------

#[test]
fn show_answers_first_with_plurals() {
    let (path, _) = leak_report("1");
    let r = gpuguard(&["show", s(&path)]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let out = &r.stdout;
    let table = out.find("device ").expect("a device table");
    let top = out.find("leaky_function").expect("the leaking line");
    let details = out.find("details of").expect("details");
    assert!(table < top && top < details, "{out}");
    assert!(out.contains("1 allocation still live at exit"), "{out}");
    assert!(!out.contains("1 allocations"), "{out}");
    // Start-up frames are not shown.
    assert!(
        !out.contains("__libc_start_main") && !out.contains("_start+"),
        "{out}"
    );
}

#[test]
fn show_leaks_top_and_json() {
    let (path, rep) = leak_report("3");
    let leaks = gpuguard(&["show", "--leaks", s(&path)]);
    assert_eq!(leaks.code, Some(0), "{}", leaks.describe());
    assert!(
        leaks.stdout.contains("leaky_function"),
        "{}",
        leaks.describe()
    );
    assert!(
        !leaks.stdout.contains("allocs"),
        "no device table\n{}",
        leaks.describe()
    );
    assert!(!leaks.stdout.contains("details of"), "{}", leaks.describe());

    let top = gpuguard(&["show", s(&path), "--top", "1"]);
    let listed = live(&rep)
        .iter()
        .filter(|a| top.stdout.contains(a["address"].as_str().unwrap()))
        .count();
    assert_eq!(listed, 1, "{}", top.describe());
    assert!(top.stdout.contains("... 2 more"), "{}", top.describe());
    assert_eq!(gpuguard(&["show", s(&path), "--top", "0"]).code, Some(2));

    let json = gpuguard(&["show", "--json", s(&path)]);
    assert_eq!(json.code, Some(0), "{}", json.describe());
    let v: Value = serde_json::from_str(&json.stdout).expect("show --json is JSON");
    let shown = &v["reports"][0];
    assert_eq!(shown["pid"], rep["pid"]);
    assert_eq!(shown["live_allocations"], 3);
    assert_eq!(
        shown["devices"][0]["live_bytes"],
        rep["devices"][0]["current_bytes"]
    );
    let first = shown["top_sites"][0]["frames"][0].as_str().unwrap();
    assert!(first.starts_with("leaky_function"), "{first}");
}

#[test]
fn show_demangles_frames_and_writes_sizes_for_people() {
    let (_, mut rep) = leak_report("1");
    rep["sites"][0]["frames"] = serde_json::json!([
        "_ZN6cudarc6driver6result12malloc_async17h67cca8cdf474afacE+0x29",
        "_ZN3foo3barEi+0x10 (libfoo.so+0x1234)",
        "main+0x1d (prog+0x8105d)",
        "libc.so.6+0x27249",
        "__libc_start_main+0x84 (libc.so.6+0x27304)",
        "_start+0x20 (prog+0x68a80)"
    ]);
    rep["trim"] = serde_json::json!({
        "trigger": "signal", "merged": 1, "python": "ran", "released_bytes": 62914560,
        "devices": [{"device": 0, "before_bytes": 67108864, "after_bytes": 4194304}],
        "mechanisms": [{"name": "pytorch", "status": "released", "released_bytes": 62914560,
            "detail": "torch.cuda.empty_cache() (native allocator): reserved 67108864 -> 4194304 bytes"}]
    });
    let dir = scratch("mangled");
    let p = write_report(&dir, "r.json", &rep);
    let r = gpuguard(&["show", s(&p)]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(
        r.stdout
            .contains("cudarc::driver::result::malloc_async+0x29"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("foo::bar(int)+0x10"), "{}", r.stdout);
    assert!(r.stdout.contains("main+0x1d"), "{}", r.stdout);
    assert!(!r.stdout.contains("libc.so.6"), "{}", r.stdout);
    assert!(
        r.stdout.contains("reserved 64.0 MiB -> 4.0 MiB"),
        "{}",
        r.stdout
    );
    assert!(!r.stdout.contains("67108864"), "{}", r.stdout);
    assert!(r.stdout.contains("(signal, 1 request)"), "{}", r.stdout);
}

// ---------------------------------------------------------------------------
// diff
// ---------------------------------------------------------------------------

/// `rep` with its one site's bytes and the device's live bytes scaled by `k`, and
/// a second site that only A has.
fn grown(rep: &Value, k: u64) -> Value {
    let mut b = rep.clone();
    let bytes = u(&rep["sites"][0]["live_bytes"]) * k;
    b["sites"][0]["live_bytes"] = bytes.into();
    b["devices"][0]["current_bytes"] = bytes.into();
    b["seq"] = (u(&rep["seq"]) + 1).into();
    b
}

#[test]
fn diff_shows_growth_shrinkage_and_totals() {
    let (_, rep) = leak_report("1");
    let dir = scratch("diff");
    let mut a = rep.clone();
    let mut gone = a["sites"][0].clone();
    gone["frames"] = serde_json::json!(["released_later+0x1 (gg+0x1)"]);
    gone["live_bytes"] = 4096.into();
    a["sites"].as_array_mut().unwrap().push(gone);
    let pa = write_report(&dir, "a.json", &a);
    let pb = write_report(&dir, "b.json", &grown(&rep, 3));
    let r = gpuguard(&["diff", s(&pa), s(&pb)]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let out = &r.stdout;
    assert!(out.contains("1 call site whose live bytes grew"), "{out}");
    assert!(out.contains("+2.0 MiB"), "{out}");
    assert!(out.contains("1 call site whose live bytes shrank"), "{out}");
    assert!(
        out.contains("-4.0 KiB") && out.contains("released_later"),
        "{out}"
    );
    let total = out
        .lines()
        .find(|l| l.trim_start().starts_with("total"))
        .expect("a total line");
    assert!(total.contains("1.0 MiB -> 3.0 MiB (+2.0 MiB)"), "{total}");
    assert!(!out.contains("warning"), "same program\n{out}");

    // --fail-on-growth: over the limit, status 1 with a word on stderr.
    let fail = gpuguard(&["diff", s(&pa), s(&pb), "--fail-on-growth", "1MiB"]);
    assert_eq!(fail.code, Some(1), "{}", fail.describe());
    assert!(
        fail.stderr.contains("--fail-on-growth"),
        "{}",
        fail.describe()
    );
    let pass = gpuguard(&["diff", "--fail-on-growth", "3MiB", s(&pa), s(&pb)]);
    assert_eq!(pass.code, Some(0), "{}", pass.describe());
    let bad = gpuguard(&["diff", s(&pa), s(&pb), "--fail-on-growth", "lots"]);
    assert_eq!(bad.code, Some(2), "{}", bad.describe());

    let json = gpuguard(&["diff", "--json", s(&pa), s(&pb)]);
    let v: Value = serde_json::from_str(&json.stdout).expect("diff --json is JSON");
    assert_eq!(v["live_growth_bytes"], 2 << 20);
    assert_eq!(v["grew"].as_array().unwrap().len(), 1);
    assert_eq!(v["shrank"][0]["change_bytes"], 4096);
    assert_eq!(v["different_programs"], false);
}

#[test]
fn diff_warns_about_different_programs() {
    let (pa, _) = leak_report("1");
    let (pb, _) = leak_report("3");
    let r = gpuguard(&["diff", s(&pa), s(&pb)]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(
        r.stdout
            .contains("warning: A and B come from different programs"),
        "{}",
        r.stdout
    );
}

// ---------------------------------------------------------------------------
// Hostile and odd input
// ---------------------------------------------------------------------------

/// Finishes within a few seconds, with status 2 and a message naming the path.
fn refused_quickly(path: &str, why: &str) {
    let start = Instant::now();
    let mut child = command(&["show", path])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("show {path} did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = done(child.wait_with_output().unwrap());
    assert_eq!(r.code, Some(2), "{path}\n{}", r.describe());
    assert!(
        r.stderr.contains(path) && r.stderr.contains(why),
        "{path}\n{}",
        r.describe()
    );
}

#[test]
fn show_refuses_devices_fifos_and_huge_files_at_once() {
    refused_quickly("/dev/urandom", "regular files only");
    refused_quickly("/dev/zero", "regular files only");
    let dir = scratch("odd");
    let fifo = dir.join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    refused_quickly(s(&fifo), "a FIFO");
    refused_quickly(s(&dir), "a directory");
    // Sparse: no disk used.
    let huge = dir.join("huge.json");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len((1 << 30) + 1)
        .unwrap();
    refused_quickly(s(&huge), "larger than 1024 MiB");
}

#[test]
fn closed_pipes_and_full_disks_end_with_a_status() {
    let (path, _) = leak_report("3");
    for args in [
        vec!["show", s(&path)],
        vec!["--help"],
        vec!["show", "--help"],
    ] {
        // A pipe whose reader is gone before anything is written.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let r = done(command(&args).stdout(writer).output().unwrap());
        assert_eq!(r.code, Some(141), "{args:?}\n{}", r.describe());
        assert!(!r.stderr.contains("panicked"), "{args:?}\n{}", r.describe());

        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let r = done(command(&args).stdout(full).output().unwrap());
        assert_eq!(r.code, Some(2), "{args:?}\n{}", r.describe());
        assert!(
            r.stderr.contains("No space left"),
            "{args:?}\n{}",
            r.describe()
        );
    }
}

#[test]
fn sums_from_reports_do_not_wrap() {
    let (_, rep) = leak_report("1");
    let dir = scratch("wrap");
    let mut omitted = rep.clone();
    omitted["live_omitted"] = u64::MAX.into();
    let p = write_report(&dir, "omitted.json", &omitted);
    let r = gpuguard(&["show", s(&p)]);
    assert!(
        r.stdout.contains("18446744073709551615 allocations"),
        "{}",
        r.describe()
    );

    // Two sites with the same frames of 2^63 bytes each, on two devices of 2^63.
    let mut b = rep.clone();
    b["sites"][0]["live_bytes"] = (1u64 << 63).into();
    let twin = b["sites"][0].clone();
    b["sites"].as_array_mut().unwrap().push(twin);
    let mut dev1 = b["devices"][0].clone();
    dev1["device"] = 1.into();
    b["devices"].as_array_mut().unwrap().push(dev1);
    b["devices"][0]["current_bytes"] = (1u64 << 63).into();
    b["devices"][1]["current_bytes"] = (1u64 << 63).into();
    let pa = write_report(&dir, "a.json", &rep);
    let pb = write_report(&dir, "b.json", &b);
    let r = gpuguard(&["diff", s(&pa), s(&pb), "--fail-on-growth", "1GiB"]);
    assert!(
        !r.stdout.contains("no call site's live bytes grew"),
        "{}",
        r.describe()
    );
    assert_eq!(r.code, Some(1), "{}", r.describe());
}

#[test]
fn control_characters_from_reports_are_escaped() {
    let (_, mut rep) = leak_report("1");
    rep["program"] = "evil\u{1b}[2J".into();
    rep["argv"] = serde_json::json!(["evil", "\u{1b}]0;owned\u{7}", "\u{9b}31m"]);
    rep["sites"][0]["frames"][0] = "frame\u{1b}[31m+0x1 (x+0x1)".into();
    let dir = scratch("escape");
    let p = write_report(&dir, "evil.json", &rep);
    let b = write_report(&dir, "other.json", &leak_report("2").1);
    for args in [vec!["show", s(&p)], vec!["diff", s(&p), s(&b)]] {
        let r = gpuguard(&args);
        assert_eq!(r.code, Some(0), "{args:?}\n{}", r.describe());
        assert!(
            !r.stdout.contains(['\u{1b}', '\u{7}', '\u{9b}']),
            "{args:?}: raw control characters\n{}",
            r.describe()
        );
        assert!(
            r.stdout.contains("evil\\x1b[2J"),
            "{args:?}\n{}",
            r.describe()
        );
    }
}

/// The pid a user sees is `gpuguard run`'s: a report or trim signal sent to it
/// reaches the command, which answers with its report and keeps running.
#[test]
fn run_passes_report_signals_on_to_the_command() {
    shim();
    let dir = scratch("run-forward");
    // The command's first CUDA call activates gpuguard; READY says it happened.
    let child = start_ready(&dir, &sim_dir(), false);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let signal_report = || {
        std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".signal.json"))
    };
    while !signal_report() {
        assert!(
            std::time::Instant::now() < deadline,
            "no signal report from the command"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    finish_ready(child);
}
