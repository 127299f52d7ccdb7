//! Leak reports for Python programs (issue 6): the Python line that holds framework
//! memory, in use versus cached, and growth between reports, end to end with
//! python3 over the stand-in frameworks of tests/python/fakefw on the simulated
//! CUDA stack.

mod common;

use common::{Run, run_trainer, trainer_leak_line};
use serde_json::Value;
use std::process::Command;

const MIB: u64 = 1 << 20;

fn report(r: &Run, reason: &str) -> Vec<(std::path::PathBuf, Value)> {
    let mut v: Vec<(std::path::PathBuf, Value)> = r
        .reports()
        .into_iter()
        .filter(|(_, v)| v["reason"] == reason)
        .collect();
    v.sort_by_key(|(_, v)| v["seq"].as_u64());
    v
}

fn leak_frame() -> String {
    format!("trainer.py:{} in <module>", trainer_leak_line())
}

/// `GPUGUARD_PYTHON=lines`: the frameworks' own recorders, block-exact lines.
const LINES: &[(&str, &str)] = &[("GPUGUARD_PYTHON", "lines")];

#[test]
fn pytorch_exit_report_names_the_leaking_line_and_splits_cache() {
    // 16 MiB cached, 5 MiB leaked by the marked line, in blocks the cache already
    // held: only PyTorch's recorder can tell which line holds them.
    let r = run_trainer(
        &["torch", "installed", "cache:16", "leak:2", "leak:3"],
        LINES,
        true,
    );
    r.assert_ok();
    let exit = &report(&r, "exit")[0].1;
    let top = &exit["python_sites"][0];
    assert_eq!(top["framework"], "pytorch");
    assert!(
        top["frames"][0].as_str().unwrap().ends_with(&leak_frame()),
        "{top:#}"
    );
    assert_eq!(top["live_bytes"], 5 * MIB);
    assert_eq!(top["live_count"], 5);
    let d = &exit["devices"][0];
    assert_eq!(d["in_use_bytes"], 5 * MIB);
    assert_eq!(d["cached_bytes"], 11 * MIB);
    assert_eq!(d["current_bytes"], 16 * MIB);
    assert_eq!(exit["classification"][0]["status"], "classified");
    // Every live record is the framework's; only the leaked blocks are in use.
    let live = exit["live"].as_array().unwrap();
    assert_eq!(live.len(), 16);
    assert!(live.iter().all(|a| a["owner"] == "pytorch"));
    let in_use: u64 = live
        .iter()
        .map(|a| a["in_use_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(in_use, 5 * MIB);
}

#[test]
fn by_default_the_line_that_grew_pytorch_s_cache_is_named_from_the_stack() {
    // No recorder (the default): the hooks' own reading of the Python stack names
    // the line whose allocations made PyTorch take new memory from the driver; the
    // in-use/cached split and each segment's owner come from PyTorch's snapshot.
    let r = run_trainer(&["torch", "installed", "leak:3", "ready:0.5"], &[], true);
    r.assert_ok();
    let exit = &report(&r, "exit")[0].1;
    let top = &exit["python_sites"][0];
    assert_eq!(top["framework"], "python-stack");
    assert_eq!(top["live_bytes"], 3 * MIB);
    assert!(
        top["frames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f.as_str().unwrap().ends_with(&leak_frame())),
        "{top:#}"
    );
    assert_eq!(exit["devices"][0]["in_use_bytes"], 3 * MIB);
    assert_eq!(exit["devices"][0]["cached_bytes"], 0);
    assert!(
        exit["live"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["owner"] == "pytorch")
    );
    let detail = exit["classification"][0]["detail"].as_str().unwrap();
    assert!(detail.contains("recorder off"), "{detail}");
}

#[test]
fn diff_of_two_mid_run_reports_puts_the_leaking_line_first() {
    let r = run_trainer(
        &[
            "torch",
            "installed",
            "cache:8",
            "leak:1",
            "signal:USR1",
            "leak:4",
            "cache:8",
            "signal:USR1",
        ],
        LINES,
        true,
    );
    r.assert_ok();
    let sig = report(&r, "signal");
    assert_eq!(sig.len(), 2, "{}", r.describe());
    let out = Command::new(env!("CARGO_BIN_EXE_gpuguard"))
        .arg("diff")
        .arg(&sig[0].0)
        .arg(&sig[1].0)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    // The first growing site listed is the Python line, +4 MiB.
    let after_header = text
        .split("most first:")
        .nth(1)
        .unwrap_or_else(|| panic!("{text}"));
    let first_site: Vec<&str> = after_header
        .split("\n    +")
        .nth(1)
        .unwrap_or_else(|| panic!("{text}"))
        .lines()
        .collect();
    assert!(first_site[0].starts_with("4.0 MiB"), "{text}");
    assert!(
        first_site
            .iter()
            .any(|l| l.contains("[pytorch blocks, Python]")),
        "{text}"
    );
    assert!(
        first_site.iter().any(|l| l.ends_with(&leak_frame())),
        "{text}"
    );

    // `show` renders the Python lines above the native sites.
    let out = Command::new(env!("CARGO_BIN_EXE_gpuguard"))
        .arg("show")
        .arg(&sig[1].0)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let py = text.find("Python lines holding").expect("python section");
    let native = text
        .find("call sites by live bytes")
        .expect("native section");
    assert!(py < native, "{text}");
    assert!(text.contains("in use by live tensors/arrays"), "{text}");
}

#[test]
fn cupy_blocks_are_attributed_to_their_line() {
    let r = run_trainer(&["cupy", "installed", "cache:6", "leak:3"], LINES, true);
    r.assert_ok();
    let exit = &report(&r, "exit")[0].1;
    let top = &exit["python_sites"][0];
    assert_eq!(top["framework"], "cupy");
    assert!(
        top["frames"][0].as_str().unwrap().ends_with(&leak_frame()),
        "{top:#}"
    );
    assert_eq!(top["live_bytes"], 3 * MIB);
    assert_eq!(exit["devices"][0]["in_use_bytes"], 3 * MIB);
    assert_eq!(exit["devices"][0]["cached_bytes"], 3 * MIB);
}

#[test]
fn stacks_off_means_no_recorders_but_still_a_split() {
    let r = run_trainer(
        &["torch", "installed", "cache:4", "leak:1"],
        &[("GPUGUARD_STACK_DEPTH", "0"), ("GPUGUARD_PYTHON", "lines")],
        true,
    );
    r.assert_ok();
    let exit = &report(&r, "exit")[0].1;
    assert!(exit.get("python_sites").is_none(), "{exit:#}");
    assert_eq!(exit["devices"][0]["in_use_bytes"], MIB);
    assert_eq!(exit["devices"][0]["cached_bytes"], 3 * MIB);
    assert_eq!(exit["classification"][0]["status"], "classified");
}

#[test]
fn gpuguard_python_off_leaves_python_alone() {
    let r = run_trainer(
        &["torch", "ready:0.5", "cache:4", "leak:1", "signal:USR2"],
        &[("GPUGUARD_PYTHON", "off")],
        true,
    );
    r.assert_ok();
    let trim = &report(&r, "trim")[0].1["trim"];
    assert!(
        trim["python"].as_str().unwrap().starts_with("absent"),
        "{trim:#}"
    );
    let exit = &report(&r, "exit")[0].1;
    assert!(exit.get("classification").is_none());
    assert!(exit["devices"][0].get("in_use_bytes").is_none());
}

#[test]
fn a_process_without_gpuguard_is_untouched() {
    let r = run_trainer(&["torch", "cache:4", "leak:1", "state"], &[], false);
    r.assert_ok();
    assert!(r.reports().is_empty());
    assert!(!r.stderr.contains("gpuguard"));
}

#[test]
fn the_exit_report_is_taken_before_the_interpreter_tears_down() {
    // The program ends holding 3 MiB in a global list; Python's teardown frees them
    // (their __del__ calls cudaFree). The exit report shows what the program held at
    // its end, not the empty state after teardown.
    // (installed: until gpuguard's Python side is set up, as in any program that
    // runs longer than a moment after its first CUDA call.)
    let r = run_trainer(&["none", "installed", "owned:3"], &[], true);
    r.assert_ok();
    let exits = report(&r, "exit");
    assert_eq!(exits.len(), 1, "one exit report\n{}", r.describe());
    let exit = &exits[0].1;
    assert_eq!(exit["devices"][0]["current_bytes"], 3 * MIB);
    assert_eq!(exit["live"].as_array().unwrap().len(), 3);
}

#[test]
fn jax_buffers_get_their_lines_from_jax_s_own_profile() {
    // The arena (64 MiB) is one driver allocation; JAX's memory_stats split it and
    // its device memory profile names the line of each live buffer.
    let r = run_trainer(&["jax", "installed", "leak:3"], &[], true);
    r.assert_ok();
    let exit = &report(&r, "exit")[0].1;
    let top = &exit["python_sites"][0];
    assert_eq!(top["framework"], "jax");
    assert!(
        top["frames"][0].as_str().unwrap().ends_with(&leak_frame()),
        "{top:#}"
    );
    assert_eq!(top["live_bytes"], 3 * MIB);
    assert_eq!(top["live_count"], 3);
    let d = &exit["devices"][0];
    assert_eq!(d["in_use_bytes"], 3 * MIB);
    assert_eq!(d["cached_bytes"], 61 * MIB);
    let c = exit["classification"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["framework"] == "jax")
        .unwrap();
    assert_eq!(c["status"], "classified");
}

#[test]
fn python_frames_of_the_allocating_thread_name_the_line_without_a_recorder() {
    // Raw allocations through ctypes: no framework, no recorder. The hook reads the
    // calling thread's Python frames itself; they are named while the code is alive.
    let r = run_trainer(&["none", "installed", "leak:3", "ready:0.5"], &[], true);
    r.assert_ok();
    let exit = &report(&r, "exit")[0].1;
    let top = &exit["python_sites"][0];
    assert_eq!(top["framework"], "python-stack");
    assert_eq!(top["live_bytes"], 3 * MIB);
    let frames: Vec<&str> = top["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(
        frames[0].contains("simrt.py:") && frames[0].ends_with("in malloc"),
        "{frames:?}"
    );
    assert!(
        frames.iter().any(|f| f.ends_with(&leak_frame())),
        "{frames:?}"
    );
    // The native site carries the same Python frames after its native ones.
    let site = &exit["sites"][0];
    let last: Vec<&str> = site["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f.as_str())
        .filter(|f| f.starts_with("python: "))
        .collect();
    assert_eq!(last.len(), frames.len(), "{site:#}");

    // Stacks off: no frames read at all.
    let r = run_trainer(
        &["none", "installed", "leak:3", "ready:0.5"],
        &[("GPUGUARD_STACK_DEPTH", "0")],
        true,
    );
    r.assert_ok();
    let exit = &report(&r, "exit")[0].1;
    assert!(exit.get("python_sites").is_none(), "{exit:#}");
}

#[test]
fn a_small_tensor_kept_each_step_is_a_suspected_leak_with_its_line_by_default() {
    // Default mode (no GPUGUARD_PYTHON=lines): one 64 KiB tensor kept a step, which
    // PyTorch's cache absorbs (a 2 MiB segment every 32 steps), over a series of
    // snapshots. The recorder runs in short windows after each report; the blocks it
    // names that live on grow from report to report.
    small_leak_is_a_suspect("small:500:3", "250ms");
}

#[test]
fn slow_steps_are_covered_by_a_window_that_waits_for_allocations() {
    // 60 ms steps of 4 allocations, snapshots every 400 ms: a window of a fiftieth of
    // the interval would see a step's leak one time in three; it stays open until it
    // has seen enough allocations (up to a fifth of the interval).
    small_leak_is_a_suspect("small:45:60", "400ms");
}

fn small_leak_is_a_suspect(action: &str, every: &str) {
    let line = common::marked_line("trainer.py", "SMALL-LEAK-LINE");
    let r = run_trainer(
        &["torch", "installed", action],
        &[("GPUGUARD_SNAPSHOT_EVERY", every)],
        true,
    );
    r.assert_ok();
    // The windows leave nothing on the program's stderr: PyTorch warns when its
    // recorder is turned off on another thread than the one that turned it on.
    assert!(
        !r.stderr.contains("Requested callback is not found"),
        "{}",
        r.describe()
    );
    let text = show_series(&r);
    let snaps = report(&r, "snapshot");
    let exit = report(&r, "exit");
    let want = format!("trainer.py:{line} in <module>");
    // The line is among the suspects, as a sampled PyTorch site. (Not always the first:
    // the lines that made the cache grow are suspects too, and a report whose window
    // saw none of the step's blocks makes the sampled site's series less steady.)
    assert!(
        suspects(&text).iter().any(|lines| lines
            .iter()
            .any(|l| l.contains("[pytorch-sampled blocks, Python]"))
            && lines.iter().any(|l| l.ends_with(&want))),
        "{text}"
    );
    let detail = exit[0].1["classification"][0]["detail"].as_str().unwrap();
    assert!(detail.contains("after each report"), "{detail}");
    // The line's figure at exit estimates what it kept, though the windows saw only
    // some of its blocks: scaled by the share of allocations they saw.
    if let Some(steps) = action
        .strip_prefix("small:")
        .and_then(|a| a.split(':').next())
    {
        let kept = steps.parse::<u64>().unwrap() * (64 << 10);
        let line = exit[0].1["python_sites"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| {
                s["framework"] == "pytorch-sampled"
                    && s["frames"][0].as_str().is_some_and(|f| f.ends_with(&want))
            })
            .unwrap_or_else(|| panic!("no sampled line: {:#}", exit[0].1));
        let got = line["live_bytes"].as_u64().unwrap();
        assert!(
            line["captured"]
                .as_u64()
                .is_some_and(|c| c * (64 << 10) < kept),
            "{line}"
        );
        assert!(
            (got as f64 / kept as f64 - 1.0).abs() < 0.3,
            "{got} estimated, {kept} kept: {line}"
        );
        assert!(detail.contains("estimates, scaled by"), "{detail}");
        // The segments that hold those blocks were requested by whichever allocation
        // needed a new one; their call site names the line whose blocks fill them,
        // with about as many bytes.
        let id = line["id"].as_u64().unwrap();
        let held: u64 = exit[0].1["sites"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["held_by"].as_array().cloned().unwrap_or_default())
            .filter(|h| h["python_site"].as_u64() == Some(id))
            .map(|h| h["bytes"].as_u64().unwrap())
            .sum();
        assert!(
            (held as f64 / kept as f64 - 1.0).abs() < 0.3,
            "{held} of the segments credited to the line, {kept} kept: {:#}",
            exit[0].1["sites"]
        );
        let shown = Command::new(env!("CARGO_BIN_EXE_gpuguard"))
            .arg("show")
            .arg(&exit[0].0)
            .output()
            .unwrap();
        let shown = String::from_utf8_lossy(&shown.stdout);
        assert!(
            shown
                .lines()
                .any(|l| l.contains("held by ~") && l.ends_with(&want)),
            "{shown}"
        );
        // Among the suspects, the growing segments' call site names that line (where
        // enough steps grew the cache by several segments: a 2 MiB one per 32).
        let seg_suspect = text.split("\n\n").next().is_some_and(|s| {
            s.lines()
                .any(|l| l.starts_with("      held by ~") && l.ends_with(&want))
        });
        assert!(seg_suspect || kept < 8 * (2 << 20), "{text}");
        // The sampled line's rows among the suspects are marked as estimates.
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with('#') && l.contains(" ~")),
            "{text}"
        );
    }
    // Each report says what it cost the main thread, and from the second one on, how
    // long the last window was open and how many allocations it recorded.
    // (A report whose classification timed out, under load, has neither.)
    for (p, r) in snaps
        .iter()
        .filter(|(_, r)| r.get("classification").is_some())
    {
        let ms = r["python_cost"]["main_thread_ms"].as_f64();
        assert!(
            ms.is_some_and(|m| m > 0.0 && m < 5_000.0),
            "{}: {r:#}",
            p.display()
        );
    }
    let windows: Vec<&Value> = snaps[1..]
        .iter()
        .filter_map(|(_, r)| r["python_cost"]["windows"].as_array())
        .flatten()
        .collect();
    assert!(
        windows.iter().any(|w| w["framework"] == "pytorch"
            && w["ms"].as_f64().is_some_and(|m| m > 0.0)
            && w["allocations"].as_u64().is_some_and(|n| n > 0)),
        "{windows:?}"
    );
    assert!(text.contains("gpuguard's Python side: "), "{text}");
    // The exit report's classification (taken in Python's atexit) says its cost too.
    assert!(
        exit[0].1["python_cost"]["main_thread_ms"]
            .as_f64()
            .is_some(),
        "{:#}",
        exit[0].1
    );
}

/// `gpuguard show` over the snapshots and the exit report of `r`: its text.
fn show_series(r: &Run) -> String {
    let snaps = report(r, "snapshot");
    assert!(snaps.len() >= 4, "{}", r.describe());
    let mut files: Vec<&std::path::PathBuf> = snaps.iter().map(|(p, _)| p).collect();
    let exit = report(r, "exit");
    files.push(&exit[0].0);
    let out = Command::new(env!("CARGO_BIN_EXE_gpuguard"))
        .arg("show")
        .args(&files)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The suspected leaks of `show`'s text, first first: each one's lines (a suspect
/// begins with its growth, `    +8.0 MiB...`; the section ends with a blank line).
fn suspects(text: &str) -> Vec<Vec<&str>> {
    let Some(at) = text.find("suspected leaks in") else {
        return Vec::new();
    };
    let section = &text[at..];
    let section = &section[..section.find("\n\n").unwrap_or(section.len())];
    section
        .split("\n    +")
        .skip(1)
        .map(|s| s.lines().collect())
        .collect()
}

fn cupy_detail(exit: &Value) -> String {
    exit["classification"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["framework"] == "cupy")
        .unwrap_or_else(|| panic!("{exit:#}"))["detail"]
        .as_str()
        .unwrap()
        .to_string()
}

const SAMPLED_CUPY: &str = "[cupy-sampled blocks, Python]";

#[test]
fn a_small_cupy_array_kept_each_step_is_the_first_suspect_by_default() {
    // Default mode, snapshots every second: each step frees three 64 KiB temporaries
    // and keeps a 64 KiB array, which takes one of their chunks, so CuPy's pool grows
    // at the temporaries' line (the stacks' own suspect, as on the H200). A CuPy
    // memory hook in short windows after each report names the kept array's line:
    // the first suspect, as a sampled CuPy site. Each window's first half lasts until
    // it has recorded 256 pool mallocs (64 steps of 3 ms), well within its time bound
    // (two fifths of the interval), so it covers whole steps however the main thread
    // is scheduled.
    let line = common::marked_line("trainer.py", "SMALL-LEAK-LINE");
    let r = run_trainer(
        &["cupy", "installed", "small:s6:3"],
        &[("GPUGUARD_SNAPSHOT_EVERY", "1s")],
        true,
    );
    r.assert_ok();
    let text = show_series(&r);
    let all = suspects(&text);
    let first = all.first().unwrap_or_else(|| panic!("{text}"));
    let want = format!("trainer.py:{line} in <module>");
    assert!(first.iter().any(|l| l.contains(SAMPLED_CUPY)), "{text}");
    assert!(first.iter().any(|l| l.ends_with(&want)), "{text}");
    // The stacks' line of the pool's growth is a suspect too, after it.
    assert!(
        all.iter()
            .skip(1)
            .any(|s| s.iter().any(|l| l.contains("[allocations, Python stack]"))),
        "{text}"
    );
    for (p, v) in r.reports() {
        assert!(
            !v.to_string().contains("(code no longer alive)"),
            "{}",
            p.display()
        );
    }
    let exit = &report(&r, "exit")[0].1;
    let detail = cupy_detail(exit);
    assert!(detail.contains("window after each report"), "{detail}");
    // The line's figure at exit estimates what it kept, though the windows recorded
    // only some of the time: scaled by the time they recorded.
    let kept: u64 = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("KEPT "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no KEPT line\n{}", r.describe()));
    let kept = kept * (64 << 10);
    let line = exit["python_sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| {
            s["framework"] == "cupy-sampled"
                && s["frames"][0].as_str().is_some_and(|f| f.ends_with(&want))
        })
        .unwrap_or_else(|| panic!("no sampled line: {exit:#}"));
    let got = line["live_bytes"].as_u64().unwrap();
    assert!(line["captured"].as_u64().is_some(), "{line}");
    assert!(
        (got as f64 / kept as f64 - 1.0).abs() < 0.3,
        "{got} estimated, {kept} kept: {line}\n{detail}"
    );
    assert!(detail.contains("estimates, scaled by"), "{detail}");
    // The reports say what the windows were: how long the hook was in, how many pool
    // mallocs it recorded.
    let windows: Vec<Value> = r
        .reports()
        .into_iter()
        .filter_map(|(_, v)| v["python_cost"]["windows"].as_array().cloned())
        .flatten()
        .collect();
    assert!(
        windows.iter().any(|w| w["framework"] == "cupy"
            && w["ms"].as_f64().is_some_and(|m| m > 0.0)
            && w["allocations"].as_u64().is_some_and(|n| n > 0)),
        "{windows:?}"
    );
    // A window closed on its count: it recorded the 256 pool mallocs it waits for.
    assert!(
        windows.iter().any(
            |w| w["framework"] == "cupy" && w["allocations"].as_u64().is_some_and(|n| n >= 256)
        ),
        "{windows:?}"
    );
}

#[test]
fn slow_cupy_steps_are_covered_by_a_window_that_waits_for_pool_mallocs() {
    // 300 ms steps of 4 pool mallocs (at the step's end), snapshots every second: a
    // window that closed after a fifth of the interval (200 ms) missed a step's
    // mallocs about one time in three, and the kept array's line then did not rise in
    // that interval. The first half waits for 256 pool mallocs; it gets fewer here,
    // so it closes on time, after two fifths of the interval (400 ms): each window
    // holds a step's end, and both halves end before the next report.
    let line = common::marked_line("trainer.py", "SMALL-LEAK-LINE");
    let r = run_trainer(
        &["cupy", "installed", "small:20:300"],
        &[("GPUGUARD_SNAPSHOT_EVERY", "1s")],
        true,
    );
    r.assert_ok();
    let text = show_series(&r);
    let all = suspects(&text);
    let first = all.first().unwrap_or_else(|| panic!("{text}"));
    let want = format!("trainer.py:{line} in <module>");
    assert!(first.iter().any(|l| l.contains(SAMPLED_CUPY)), "{text}");
    assert!(first.iter().any(|l| l.ends_with(&want)), "{text}");
}

fn sampled_cupy_bytes(report: &Value) -> u64 {
    report["python_sites"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|s| s["framework"] == "cupy-sampled")
                .map(|s| s["live_bytes"].as_u64().unwrap())
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn sampled_cupy_blocks_freed_between_windows_drop_out() {
    // The kept arrays are freed on another thread, whose frees the windows' hook (on
    // the main thread, as CuPy's hooks are per thread) never sees; but the pool has
    // nothing in use any more, so no sampled block may still be counted.
    let r = run_trainer(
        &["cupy", "installed", "small:200:3", "dropleaks", "ready:0.6"],
        &[("GPUGUARD_SNAPSHOT_EVERY", "250ms")],
        true,
    );
    r.assert_ok();
    let snaps = report(&r, "snapshot");
    assert!(
        snaps.iter().any(|(_, v)| sampled_cupy_bytes(v) > 0),
        "{}",
        r.describe()
    );
    let exit = &report(&r, "exit")[0].1;
    assert_eq!(exit["devices"][0]["in_use_bytes"], 0, "{exit:#}");
    assert_eq!(sampled_cupy_bytes(exit), 0, "{exit:#}");
}

#[test]
fn cupy_temporaries_alone_are_no_sampled_suspect() {
    // The same loop keeping nothing: the windows run (the detail says so), and what
    // they record dies within them, so no sampled CuPy line is a suspect.
    let r = run_trainer(
        &["cupy", "installed", "temps:500:3"],
        &[("GPUGUARD_SNAPSHOT_EVERY", "250ms")],
        true,
    );
    r.assert_ok();
    let text = show_series(&r);
    assert!(
        suspects(&text)
            .iter()
            .all(|s| !s.iter().any(|l| l.contains(SAMPLED_CUPY))),
        "{text}"
    );
    let detail = cupy_detail(&report(&r, "exit")[0].1);
    assert!(detail.contains("the last "), "{detail}");
}

#[test]
fn cupy_windows_never_change_the_hooks_while_cupy_runs_them() {
    // The program's own CuPy memory hook runs Python for 300 us in each malloc and
    // free call, so gpuguard's pending calls (the report's, which opens a window, and
    // the timer's, which closes it) often land inside it, while CuPy's loop over the
    // hooks dict is running: adding or removing gpuguard's hook then would raise
    // RuntimeError in the program. Three seconds of windows, snapshots every 100 ms.
    let r = run_trainer(
        &["cupy", "userhook:300", "installed", "small:400:3"],
        &[("GPUGUARD_SNAPSHOT_EVERY", "100ms")],
        true,
    );
    r.assert_ok();
    for bad in ["RuntimeError", "Traceback", "Exception ignored"] {
        assert!(!r.stderr.contains(bad), "{}", r.describe());
    }
    let detail = cupy_detail(&report(&r, "exit")[0].1);
    assert!(detail.contains("hook changes waited"), "{detail}");
    // gpuguard's hook, entered after the program's, is last in the dict: it closes
    // its windows from inside its own last call, where CPython's iterator is done.
    assert!(
        detail.contains("closed by the hook in its own last call"),
        "{detail}"
    );
}

#[test]
fn cupy_lines_mode_keeps_its_hook_on_every_block() {
    // GPUGUARD_PYTHON=lines: the permanent hook, as before; no windows.
    let line = common::marked_line("trainer.py", "SMALL-LEAK-LINE");
    let mut env = vec![("GPUGUARD_SNAPSHOT_EVERY", "250ms")];
    env.extend_from_slice(LINES);
    let r = run_trainer(&["cupy", "installed", "small:300:3"], &env, true);
    r.assert_ok();
    let text = show_series(&r);
    let first = suspects(&text).into_iter().next().unwrap_or_default();
    let want = format!("trainer.py:{line} in <module>");
    assert!(
        first.iter().any(|l| l.contains("[cupy blocks, Python]")),
        "{text}"
    );
    assert!(first.iter().any(|l| l.ends_with(&want)), "{text}");
    assert!(!text.contains("cupy-sampled"), "{text}");
    let exit = &report(&r, "exit")[0].1;
    assert_eq!(exit["python_sites"][0]["live_count"], 300, "{exit:#}");
    let detail = cupy_detail(exit);
    assert!(detail.contains("gpuguard's CuPy hook"), "{detail}");
}

#[test]
fn cupy_with_stacks_off_opens_no_window() {
    let r = run_trainer(
        &["cupy", "installed", "small:100:3"],
        &[
            ("GPUGUARD_SNAPSHOT_EVERY", "250ms"),
            ("GPUGUARD_STACK_DEPTH", "0"),
        ],
        true,
    );
    r.assert_ok();
    let exit = &report(&r, "exit")[0].1;
    assert!(exit.get("python_sites").is_none(), "{exit:#}");
    let detail = cupy_detail(exit);
    assert!(detail.contains("hook off"), "{detail}");
}

#[test]
fn gpuguard_starts_its_python_thread_once_and_on_the_main_thread() {
    // A Python thread started from another thread can race the interpreter's shutdown:
    // Thread.start() returns once the new thread runs Python, but the new OS thread
    // first touches the thread state the interpreter allocated for it, which shutdown
    // frees. The windows' timer thread used to start the next timer thread at each
    // tick, and on CPython 3.10 one started as the program ended wrote into the freed
    // interpreter (SIGSEGV after the program's last line, 5 of 100 runs of
    // trim::signal_trims_cupy_pools under load). Which thread starts gpuguard's threads
    // is deterministic where that race is not: one timer thread for the process,
    // started on the main thread, through every window of both frameworks.
    for fw in ["cupy", "torch"] {
        let r = run_trainer(
            &[fw, "watchthreads", "installed", "small:s3:3"],
            &[("GPUGUARD_SNAPSHOT_EVERY", "250ms")],
            true,
        );
        r.assert_ok();
        let started: Vec<&str> = r
            .stdout
            .lines()
            .filter_map(|l| l.strip_prefix("STARTED "))
            .collect();
        assert_eq!(
            started,
            vec!["gpuguard-window main"],
            "{fw}: {}",
            r.describe()
        );
        // The windows ran (their ticks are what started threads before).
        let windows = r
            .reports()
            .into_iter()
            .filter_map(|(_, v)| v["python_cost"]["windows"].as_array().cloned())
            .flatten()
            .count();
        assert!(windows > 0, "{fw}: {}", r.describe());
    }
}

#[test]
fn leaks_made_every_step_are_named_though_stacks_are_sampled() {
    // Raw allocations through ctypes, four a step, none freed (three from a list
    // comprehension, one kept in a list), a step about every millisecond: thousands
    // a second, past GPUGUARD_STACK_RATE, so only some get a stack. Both lines are
    // still captured in some steps of every interval, so both are suspects.
    // Handshakes, not times: the steps begin once gpuguard's Python side is set up
    // (else their frames are not read) and go on over 8 snapshot intervals, however
    // fast this Python runs them (a fixed count of steps at full speed fit in 2
    // intervals on a fast CPython, too few for a trend).
    let kept = common::marked_line("trainer.py", "SMALL-LEAK-LINE");
    let r = run_trainer(
        &["none", "installed", "small:s8:1"],
        &[("GPUGUARD_SNAPSHOT_EVERY", "150ms")],
        true,
    );
    r.assert_ok();
    assert!(r.out().has_line("INSTALLED"), "{}", r.describe());
    let exit = &report(&r, "exit")[0].1;
    let passed = exit["sampled_out"]["count"].as_u64().unwrap_or(0);
    assert!(passed > 0, "no allocation passed over: not sampled");
    let text = show_series(&r);
    assert!(text.contains("not captured"), "{text}");
    let all = suspects(&text);
    let named = |want: &str| {
        all.iter()
            .any(|lines| lines.iter().any(|l| l.ends_with(want)))
    };
    assert!(named(&format!("trainer.py:{kept} in <module>")), "{text}");
    // The comprehension's own frame before 3.12, inlined in <module> from 3.12 on.
    let temps = kept - 3;
    assert!(
        named(&format!("trainer.py:{temps} in <listcomp>"))
            || named(&format!("trainer.py:{temps} in <module>")),
        "{text}"
    );
}
