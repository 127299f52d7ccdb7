//! Report files nobody can block or litter: whatever someone else placed at the
//! temporary names a process could use (files, symlinks, the fixed name earlier
//! versions used) does not stop its reports, and temporaries that a killed writer left
//! behind are removed by the next process that reports into the directory, while a
//! live writer's, another machine's and anything else stay.

mod common;
mod core_support;

use common::*;
use core_support::*;
use gpuguard_core::reporter::temp_file_name;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// A pid no process has: a child that has been waited for.
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    pid
}

/// The report names a `gg` process of `pid` may write, and the temporary names it could
/// pick if its random part were guessable: with a file or a symlink at each, the
/// process still writes its exit report, and touches none of them.
#[test]
fn squatted_temporary_names_do_not_block_the_report() {
    let dir = fresh_dir("squat");
    let victim = dir.join("victim");
    fs::write(&victim, b"keep").unwrap();
    let go = dir.join("go");
    // The program waits (under gpuguard already, same pid through exec) until the
    // names of its pid are taken.
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.01; done; exec '{}' leak 2",
        go.display(),
        sim_dir().join("gg").display()
    );
    let mut child = Command::new("/bin/sh")
        .args(["-c", &script])
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("LD_PRELOAD", shim())
        .env("GPUGUARD_DIR", &dir)
        .env_remove("GPUGUARD_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut squatted = Vec::new();
    for program in ["gg", "sh"] {
        for seq in 0..8 {
            let report = format!("gpuguard.{program}.{pid}.{seq}.exit.json");
            squatted.push(format!(".{report}.tmp"));
        }
    }
    for seq in 0..64 {
        for random in [0, 1, u64::MAX, u64::from(pid), seq] {
            squatted.push(temp_file_name(pid, seq, random));
        }
    }
    squatted.sort();
    squatted.dedup();
    for (i, n) in squatted.iter().enumerate() {
        if i % 2 == 0 {
            symlink(&victim, dir.join(n)).unwrap();
        } else {
            fs::write(dir.join(n), b"theirs").unwrap();
        }
    }
    let before = names(&dir);
    fs::write(&go, b"").unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "timed out");
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(status.success(), "{status:?}\n{stderr}");
    assert!(
        !stderr.contains("cannot write reports"),
        "the report was blocked:\n{stderr}"
    );
    let reports: Vec<String> = names(&dir)
        .into_iter()
        .filter(|n| !before.contains(n) && n != "go")
        .collect();
    assert_eq!(
        reports.len(),
        1,
        "one new file, the exit report: {reports:?}"
    );
    assert!(
        reports[0].ends_with(&format!(".{pid}.1.exit.json")),
        "{reports:?}"
    );
    let text = fs::read_to_string(dir.join(&reports[0])).unwrap();
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(live(&report).len(), 2, "{report:#}");
    // Nothing placed there was written through, moved or removed.
    assert_eq!(fs::read(&victim).unwrap(), b"keep");
    for (i, n) in squatted.iter().enumerate() {
        let meta = fs::symlink_metadata(dir.join(n)).unwrap();
        assert_eq!(meta.file_type().is_symlink(), i % 2 == 0, "{n}");
    }
    let _ = fs::remove_dir_all(&dir);
}

/// Temporaries of a writer that died mid-write (a 10 MB one, as kill -9 left them) are
/// removed when the next process reports into the directory; a live writer's, another
/// machine's, older versions' and other files are kept.
#[test]
fn stale_temporaries_of_dead_writers_are_cleaned() {
    let dir = fresh_dir("stale");
    let dead = dead_pid();
    let stale: Vec<String> = (1..4)
        .map(|seq| temp_file_name(dead, seq, seq * 7))
        .collect();
    for n in &stale {
        fs::write(dir.join(n), vec![b'{'; 10 << 20]).unwrap();
    }
    let live = temp_file_name(std::process::id(), 1, 99);
    let mine = temp_file_name(dead, 9, 9);
    let other_host = {
        // Same form, another machine's host tag.
        let (head, tail) = mine.split_at(".gpuguard-".len());
        let tag = u32::from_str_radix(&tail[..8], 16).unwrap() ^ 0xffff_ffff;
        format!("{head}{tag:08x}{}", &tail[8..])
    };
    let kept = [
        live.clone(),
        other_host,
        format!(".gpuguard.gg.{dead}.1.exit.json.tmp"),
        "notes.tmp".to_string(),
        format!("gpuguard.gg.{dead}.1.exit.json"),
    ];
    for n in &kept {
        fs::write(dir.join(n), b"x").unwrap();
    }
    // A symlink with a stale name is not a temporary gpuguard made: kept too.
    symlink("/etc/hostname", dir.join(&mine)).unwrap();

    let dir_text = dir.to_str().unwrap();
    let r = gg_run("gg", &["leak", "1"], &[("GPUGUARD_DIR", dir_text)]);
    r.assert_ok();
    let now = names(&dir);
    for n in &stale {
        assert!(!now.contains(n), "{n} should be gone: {now:?}");
    }
    for n in kept.iter().chain([&mine]) {
        assert!(now.contains(n), "{n} should be kept: {now:?}");
    }
    let exit = format!("gpuguard.gg.{}.1.exit.json", r.pid);
    assert!(now.contains(&exit), "{now:?}");
    // Only the report was added: the writer left no temporary of its own.
    assert_eq!(now.len(), kept.len() + 2, "{now:?}");
    let _ = fs::remove_dir_all(&dir);
}
