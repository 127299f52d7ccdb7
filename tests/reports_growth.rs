//! Leak reports over time: `GPUGUARD_MAX_LIVE` (a short live list), periodic
//! `snapshot` reports, ranks of distributed runs in reports and file names, and the
//! `gpuguard diff` / multi-report `gpuguard show` views of growth.

mod common;
mod core_support;

use common::*;
use core_support::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn cli() -> &'static str {
    env!("CARGO_BIN_EXE_gpuguard")
}

fn gpuguard(args: &[&str]) -> Run {
    run(cli(), args, &[], false)
}

/// Exit status 0 (the CLI and hello_gpu print no `OK` line).
fn succeeded(r: &Run) {
    assert!(r.status.success(), "{}", r.describe());
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// The program exited 2 before running, with one line naming the variable and value.
fn assert_refused(var: &str, value: &str) {
    let r = gg_run("gg", &["leak", "1"], &[(var, value)]);
    assert_eq!(
        r.status.code(),
        Some(2),
        "{var}={value:?}\n{}",
        r.describe()
    );
    assert_eq!(r.stdout, "", "{var}={value:?}: the program must not run");
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", r.describe());
    assert!(
        lines[0].contains(var) && lines[0].contains(value) && lines[0].contains("accepted"),
        "{:?}",
        lines[0]
    );
    assert!(dir_files(&r).is_empty());
}

/// Total live allocations the counters know of.
fn counted_live(rep: &Value) -> u64 {
    rep["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| u(&d["live_count"]))
        .sum::<u64>()
        + u(&rep["host_pinned"]["live_count"])
}

fn site_frames(site: &Value) -> String {
    site["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

// ---- GPUGUARD_MAX_LIVE -----------------------------------------------------------

#[test]
fn max_live_keeps_the_largest_and_counts_the_rest() {
    let full = gg_run("gg", &["leak", "3"], &[]);
    full.assert_ok();
    let (_, all) = exit_report(&full);
    let r = gg_run("gg", &["leak", "3"], &[("GPUGUARD_MAX_LIVE", "1")]);
    r.assert_ok();
    let (_, rep) = exit_report(&r);
    let live = live(&rep);
    assert_eq!(live.len(), 1, "{rep:#}");
    let total = counted_live(&rep);
    assert!(total >= 3, "{rep:#}");
    assert_eq!(u(&rep["live_omitted"]), total - 1, "{rep:#}");
    // The one kept is the largest (leak 3's biggest is 3 MiB).
    let largest = live_set(&all).into_iter().map(|(_, b)| b).max().unwrap();
    assert_eq!(u(&live[0]["bytes"]), largest);
    assert_eq!(largest, 3 << 20);
    // Sites and counters still cover every allocation.
    let bytes = |v: &Value| -> u64 {
        v["sites"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| u(&s["live_bytes"]))
            .sum()
    };
    assert_eq!(bytes(&rep), bytes(&all));
    assert_eq!(
        rep["devices"][0]["current_bytes"],
        all["devices"][0]["current_bytes"]
    );
    assert_eq!(rep["config"]["max_live"], 1);
    assert_eq!(u(&all["live_omitted"]), 0);
    // `show` counts the omitted ones too.
    let (path, _) = exit_report(&r);
    let out = gpuguard(&["show", s(&path)]);
    succeeded(&out);
    assert!(
        out.stdout
            .contains(&format!("{total} allocations still live at exit")),
        "{}",
        out.stdout
    );
}

#[test]
fn malformed_max_live_is_refused() {
    for bad in ["0", "-3", "many", "1.5"] {
        assert_refused("GPUGUARD_MAX_LIVE", bad);
    }
}

// ---- GPUGUARD_SNAPSHOT_EVERY -------------------------------------------------------

/// Steps of `gg snapshots` (see tests/progs/gg.c): each leaks one 8 MiB cache.
const SNAP_STEPS: u64 = 3;

/// `gg snapshots 3` with a snapshot every 500 ms: its snapshot reports, ordered by
/// seq. After each step the program waits until two more snapshots are written (a
/// handshake, not a pause): the second was taken after the step's leak and before
/// the next step, so for each step k a snapshot holds the weights and exactly k
/// caches, however the machine schedules the run.
fn growing_snapshots() -> (Run, Vec<(PathBuf, Value)>) {
    let steps = SNAP_STEPS.to_string();
    let r = gg_run(
        "gg",
        &["snapshots", &steps],
        &[("GPUGUARD_SNAPSHOT_EVERY", "500ms")],
    );
    r.assert_ok();
    let mut snaps = reports_with_reason(&r, "snapshot");
    snaps.sort_by_key(|(_, v)| u(&v["seq"]));
    (r, snaps)
}

/// The 8 MiB caches live in a report.
fn caches(v: &Value) -> u64 {
    live(v).iter().filter(|e| u(&e["bytes"]) == 8 << 20).count() as u64
}

/// Whether a report holds exactly the weights and `k` caches (no temporaries).
fn between_steps(v: &Value, k: u64) -> bool {
    let mut sizes: Vec<u64> = live(v).iter().map(|e| u(&e["bytes"])).collect();
    sizes.sort_unstable();
    let mut want = vec![8u64 << 20; k as usize];
    want.push(256 << 20);
    sizes == want
}

/// For each step k, the first snapshot taken between step k and step k+1.
fn after_each_step(snaps: &[(PathBuf, Value)]) -> Vec<&(PathBuf, Value)> {
    (1..=SNAP_STEPS)
        .map(|k| {
            snaps
                .iter()
                .find(|(_, v)| between_steps(v, k))
                .unwrap_or_else(|| panic!("no snapshot after step {k} alone"))
        })
        .collect()
}

#[test]
fn snapshots_at_the_interval_show_growth() {
    let (r, snaps) = growing_snapshots();
    let waited: Vec<u64> = r
        .out()
        .kv("STEP_DONE")
        .iter()
        .map(|l| l["waited"])
        .collect();
    assert_eq!(waited, vec![1; SNAP_STEPS as usize], "{}", r.describe());
    // Two at least after each step.
    assert!(
        snaps.len() as u64 >= 2 * SNAP_STEPS,
        "{}\n{:?}",
        r.describe(),
        dir_files(&r)
    );
    for (p, v) in &snaps {
        assert_eq!(v["reason"], "snapshot");
        let name = file_name(p);
        assert!(
            name.starts_with(&format!("gpuguard.gg.{}.", r.pid))
                && name.ends_with(".snapshot.json"),
            "{name}"
        );
        assert_eq!(v["config"]["snapshot_every_ms"], 500);
    }
    // The leak grows from snapshot to snapshot, never shrinks, and each step's
    // cache shows in the snapshot after it.
    let counts: Vec<u64> = snaps.iter().map(|(_, v)| caches(v)).collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    after_each_step(&snaps);
    let (first, last) = (&snaps[0].1, &snaps[snaps.len() - 1].1);
    assert!(caches(last) > caches(first), "{first:#}\n{last:#}");
    assert_eq!(caches(last), SNAP_STEPS);
    // At the interval: the k-th snapshot comes no sooner than k intervals after
    // gpuguard started (uptime_s counts from then); that they keep coming while the
    // program runs is what the program's waits above prove.
    for (i, (_, v)) in snaps.iter().enumerate() {
        let t = v["uptime_s"].as_f64().unwrap();
        assert!(t >= 0.5 * (i + 1) as f64 - 0.01, "snapshot {i} at {t} s");
    }
    // The exit report still comes last.
    let (_, exit) = exit_report(&r);
    assert!(u(&exit["seq"]) > u(&last["seq"]));
    assert_eq!(caches(&exit), SNAP_STEPS);
}

#[test]
fn no_snapshots_by_default() {
    let r = gg_run("hello_gpu", &["12"], &[]);
    succeeded(&r);
    assert!(reports_with_reason(&r, "snapshot").is_empty());
}

#[test]
fn malformed_snapshot_interval_is_refused() {
    for bad in ["5", "0s", "fast", "-1s"] {
        assert_refused("GPUGUARD_SNAPSHOT_EVERY", bad);
    }
}

// ---- ranks ------------------------------------------------------------------------

fn assert_ranked(env: &[(&str, &str)], rank: u64, local: Option<u64>, size: u64) -> PathBuf {
    let r = gg_run("gg", &["leak", "1"], env);
    r.assert_ok();
    let (p, rep) = exit_report(&r);
    assert_eq!(
        file_name(&p),
        format!("gpuguard.gg.r{rank}.{}.{}.exit.json", r.pid, rep["seq"])
    );
    assert_eq!(rep["rank"], rank);
    assert_eq!(rep["local_rank"].as_u64(), local);
    assert_eq!(rep["world_size"], size);
    assert!(!rep["host"].as_str().unwrap().is_empty(), "{rep:#}");
    p
}

#[test]
fn ranks_from_each_launcher() {
    assert_ranked(
        &[("RANK", "3"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "8")],
        3,
        Some(1),
        8,
    );
    assert_ranked(
        &[
            ("SLURM_PROCID", "5"),
            ("SLURM_LOCALID", "2"),
            ("SLURM_NTASKS", "6"),
        ],
        5,
        Some(2),
        6,
    );
    assert_ranked(
        &[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
        ],
        2,
        Some(0),
        4,
    );
    assert_ranked(&[("PMI_RANK", "1"), ("PMI_SIZE", "2")], 1, None, 2);
}

#[test]
fn no_rank_no_fields_and_plain_names() {
    let r = gg_run("gg", &["leak", "1"], &[]);
    r.assert_ok();
    let (p, rep) = exit_report(&r);
    assert_eq!(
        file_name(&p),
        format!("gpuguard.gg.{}.{}.exit.json", r.pid, rep["seq"])
    );
    for k in ["rank", "local_rank", "world_size", "host"] {
        assert!(rep.get(k).is_none(), "{k} in {rep:#}");
    }
}

#[test]
fn show_summarizes_ranks() {
    let a = assert_ranked(&[("RANK", "1"), ("WORLD_SIZE", "2")], 1, None, 2);
    let b = assert_ranked(&[("RANK", "0"), ("WORLD_SIZE", "2")], 0, None, 2);
    let out = gpuguard(&["show", s(&a), s(&b)]);
    succeeded(&out);
    let lines: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("  rank "))
        .collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    assert!(lines[0].starts_with("  rank 0/2 host "), "{}", out.stdout);
    assert!(lines[1].starts_with("  rank 1/2 host "), "{}", out.stdout);
    assert!(
        lines[0].contains("device 0 ") && lines[0].contains(" live, peak "),
        "{}",
        out.stdout
    );
    // Different processes: no trend to judge.
    assert!(!out.stdout.contains("suspected leaks"), "{}", out.stdout);
}

// ---- diff and growth across reports -----------------------------------------------

#[test]
fn diff_lists_grown_sites_first() {
    let a = gg_run("gg", &["leak", "1"], &[]);
    let b = gg_run("gg", &["leak", "3"], &[]);
    a.assert_ok();
    b.assert_ok();
    let (pa, _) = exit_report(&a);
    let (pb, rb) = exit_report(&b);
    let out = gpuguard(&["diff", s(&pa), s(&pb)]);
    succeeded(&out);
    let text = &out.stdout;
    let grown = text
        .find("grew from A to B")
        .unwrap_or_else(|| panic!("{text}"));
    let first_site = &text[grown..];
    let leaky = first_site.find("leaky_function").expect(text);
    // leak 1 holds 1 MiB there, leak 3 holds 6 MiB: +5 MiB, 1 then 3 allocations.
    assert!(first_site[..leaky].contains("+5.0 MiB"), "{text}");
    assert!(first_site.contains("1.0 MiB in 1 allocation\n"), "{text}");
    assert!(first_site.contains("6.0 MiB in 3 allocations"), "{text}");
    // Reversed, nothing grew at that site: it shrank.
    let back = gpuguard(&["diff", s(&pb), s(&pa)]);
    succeeded(&back);
    let shrank = back.stdout.find("shrank from A to B").expect(&back.stdout);
    assert!(
        !back.stdout[..shrank].contains("leaky_function"),
        "{}",
        back.stdout
    );
    let shrunk_site = &back.stdout[shrank..];
    let leaky = shrunk_site.find("leaky_function").expect(&back.stdout);
    assert!(shrunk_site[..leaky].contains("-5.0 MiB"), "{}", back.stdout);
    // The site's frames are in the report, so they match across processes.
    assert!(
        rb["sites"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| site_frames(s).contains("leaky_function"))
    );
}

#[test]
fn diff_and_show_of_snapshots_name_the_leak() {
    let (r, snaps) = growing_snapshots();
    // The snapshots after the first and the last step: the weights in both, no
    // temporaries, one cache against three.
    let steps = after_each_step(&snaps);
    let (first, last) = (&steps[0].0, &steps[steps.len() - 1].0);
    let out = gpuguard(&["diff", s(first), s(last)]);
    succeeded(&out);
    let text = &out.stdout;
    let at = text.find("grew from A to B").expect(text);
    let first_frame = text[at..]
        .lines()
        .find(|l| l.starts_with("        "))
        .expect(text);
    assert!(first_frame.contains("remember_batch_stats"), "{text}");

    // Several snapshots and the exit report of one process: the leak only grew. The
    // snapshots after each step (one more cache in each; those taken while a step
    // ran may hold its temporaries, and the leak rises in only every other interval
    // of the whole series, as the program waits out two snapshots a step).
    let (exit, _) = exit_report(&r);
    let mut args: Vec<&str> = vec!["show"];
    // Given in reverse: show orders by seq.
    args.push(s(&exit));
    args.extend(steps.iter().rev().map(|(p, _)| s(p)));
    let out = gpuguard(&args);
    succeeded(&out);
    let text = &out.stdout;
    let sect = text.find("suspected leaks in gg").expect(text);
    let section = &text[sect..];
    // Up to the reports that follow the answer.
    let section = &section[..section.find("\n\n").unwrap_or(section.len())];
    // Every report given is in the series, in seq order.
    let mut seqs: Vec<u64> = steps.iter().map(|(_, v)| u(&v["seq"])).collect();
    seqs.push(u(&exit_report(&r).1["seq"]));
    let series: Vec<String> = seqs.iter().map(|n| format!("#{n}")).collect();
    let across = format!("across reports {}:", series.join(", "));
    assert!(section.contains(&across), "{across}\n{section}");
    let first_frame = section
        .lines()
        .find(|l| l.starts_with("        "))
        .expect(section);
    assert!(first_frame.contains("remember_batch_stats"), "{section}");
    // The weights (allocated once, never grown) are not suspected.
    assert!(!section.contains("256.0 MiB"), "{section}");
}

/// `gg snapshots 4 3`, a snapshot every 250 ms: the leak steps once every three
/// snapshots or more (a handshake: each step waits for three more), so it rises in at
/// most a third of the intervals and never falls. Its report files in file-name order
/// (a shell's glob), which is not `seq` order past nine reports, and their seqs.
fn leak_every_third_snapshot() -> (Run, Vec<PathBuf>, Vec<u64>) {
    let r = gg_run(
        "gg",
        &["snapshots", "4", "3"],
        &[("GPUGUARD_SNAPSHOT_EVERY", "250ms")],
    );
    r.assert_ok();
    let waited: Vec<u64> = r
        .out()
        .kv("STEP_DONE")
        .iter()
        .map(|l| l["waited"])
        .collect();
    assert_eq!(waited, vec![1; 4], "{}", r.describe());
    let mut files: Vec<(PathBuf, Value)> = reports_with_reason(&r, "snapshot");
    files.push(exit_report(&r));
    files.sort_by_key(|(p, _)| file_name(p));
    assert!(files.len() >= 13, "{:?}", dir_files(&r));
    let seqs = files.iter().map(|(_, v)| u(&v["seq"])).collect();
    (r, files.into_iter().map(|(p, _)| p).collect(), seqs)
}

#[test]
fn a_leak_stepping_every_third_snapshot_is_the_suspect() {
    let (r, files, _) = leak_every_third_snapshot();
    let mut args = vec!["show", "--leaks"];
    args.extend(files.iter().map(|p| s(p)));
    let out = gpuguard(&args);
    succeeded(&out);
    let text = &out.stdout;
    let at = text
        .find(&format!("suspected leaks in gg (pid {})", r.pid))
        .expect(text);
    let section = &text[at..text[at..].find("\n\n").map_or(text.len(), |e| at + e)];
    // One suspect: the cache kept each step. It rose in at most half the intervals
    // (the former criterion needed more) and never fell. Neither the weights (held
    // throughout) nor the temporaries (live in a snapshot taken during a step) are.
    let heads: Vec<&str> = section.lines().filter(|l| l.starts_with("    +")).collect();
    assert_eq!(heads.len(), 1, "{section}");
    let (rose, intervals) = {
        let words: Vec<&str> = heads[0].split_whitespace().collect();
        let at = words.iter().position(|w| *w == "rose").expect(section);
        let n = |w: &str| w.trim_end_matches(',').parse::<usize>().expect(section);
        (n(words[at + 2]), n(words[at + 4]))
    };
    assert!(rose >= 3 && 2 * rose <= intervals, "{section}");
    assert!(heads[0].ends_with(", never fell"), "{section}");
    let first_frame = section
        .lines()
        .find(|l| l.starts_with("        "))
        .expect(section);
    assert!(first_frame.contains("remember_batch_stats"), "{section}");
    assert!(!section.contains("256.0 MiB"), "{section}");
}

#[test]
fn show_answers_first_and_takes_reports_in_seq_order() {
    let (r, files, seqs) = leak_every_third_snapshot();
    let mut sorted = seqs.clone();
    sorted.sort_unstable();
    assert_ne!(
        seqs, sorted,
        "file-name order is seq order: the test shows nothing"
    );
    let names: Vec<&str> = files.iter().map(|p| s(p)).collect();
    let in_seq: Vec<&str> = {
        let mut v: Vec<(u64, &str)> = seqs.iter().copied().zip(names.iter().copied()).collect();
        v.sort_unstable();
        v.into_iter().map(|(_, n)| n).collect()
    };
    for leaks in [true, false] {
        let mut args = vec!["show"];
        if leaks {
            args.push("--leaks");
        }
        args.extend(&names);
        let out = gpuguard(&args);
        succeeded(&out);
        let text = &out.stdout;
        // The answer first: the suspected leaks, before any report's own figures.
        assert!(
            text.starts_with(&format!("suspected leaks in gg (pid {})", r.pid)),
            "{text}"
        );
        assert!(text.contains("remember_batch_stats"), "{text}");
        // Then the reports, by seq: their headers, and their details.
        for prefix in ["gpuguard report ", "details of "] {
            let shown: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix(prefix))
                .collect();
            if leaks && prefix == "details of " {
                assert!(shown.is_empty(), "{text}");
            } else {
                assert_eq!(shown, in_seq, "{prefix}\n{text}");
            }
        }
    }
    let mut args = vec!["show", "--json"];
    args.extend(&names);
    let out = gpuguard(&args);
    succeeded(&out);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    let listed: Vec<u64> = v["reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| u(&r["seq"]))
        .collect();
    assert_eq!(listed, sorted);
}

#[test]
fn diff_refuses_bad_files_and_arguments() {
    let a = gg_run("gg", &["leak", "1"], &[]);
    a.assert_ok();
    let (pa, _) = exit_report(&a);
    let truncated = a.dir.join("truncated.json");
    let text = std::fs::read_to_string(&pa).unwrap();
    std::fs::write(&truncated, &text[..text.len() / 2]).unwrap();
    let missing = a.dir.join("missing.json");
    for bad in [&truncated, &missing] {
        for args in [["diff", s(&pa), s(bad)], ["diff", s(bad), s(&pa)]] {
            let r = gpuguard(&args);
            assert_eq!(r.status.code(), Some(2), "{args:?}\n{}", r.describe());
            assert!(r.stderr.contains(s(bad)), "{}", r.describe());
        }
    }
    for args in [
        vec!["diff"],
        vec!["diff", s(&pa)],
        vec!["diff", s(&pa), s(&pa), s(&pa)],
    ] {
        let r = gpuguard(&args);
        assert_eq!(r.status.code(), Some(2), "{args:?}\n{}", r.describe());
        assert!(
            r.stderr.to_lowercase().contains("usage"),
            "{}",
            r.describe()
        );
    }
}
