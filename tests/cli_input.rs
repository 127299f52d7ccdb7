//! What `show` and `diff` make of hostile text in a report (issue 30): characters that
//! would steer a terminal (bidi overrides in the tables; DEL and C1 controls in
//! `--json`) come out escaped, and a JSON document that is not a report is named
//! for what it is.

use gpuguard_core::report::{DeviceReport, Report, SCHEMA, Site};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn cli() -> &'static str {
    env!("CARGO_BIN_EXE_gpuguard")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gg-cli-input-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn gpuguard(args: &[&str]) -> Output {
    Command::new(cli()).args(args).output().unwrap()
}

fn stdout_of(args: &[&str]) -> String {
    let out = gpuguard(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A report whose program, argv and frame carry `evil` in the middle.
fn report(dir: &Path, name: &str, seq: u64, evil: &str, bytes: u64) -> PathBuf {
    let r = Report {
        schema: SCHEMA.into(),
        gpuguard_version: "test".into(),
        reason: "snapshot".into(),
        seq,
        pid: 9,
        program: format!("train{evil}gnp.py"),
        argv: vec![format!("train{evil}gnp.py"), format!("--x{evil}")],
        devices: vec![DeviceReport {
            device: 0,
            current_bytes: bytes,
            peak_bytes: bytes,
            ..Default::default()
        }],
        sites: vec![Site {
            id: 0,
            frames: vec![format!("leak{evil}exe.txt+0x1 (app+0x1)"), "main".into()],
            live_bytes: bytes,
            live_count: 1,
            captured: None,
            held_by: Vec::new(),
        }],
        ..Default::default()
    };
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec(&r).unwrap()).unwrap();
    path
}

/// The characters that must never reach a terminal raw.
fn steering(c: char) -> bool {
    (c.is_control() && c != '\n') || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[test]
fn bidi_overrides_are_escaped_in_show_and_diff_tables() {
    let dir = scratch("bidi");
    let a = report(&dir, "a.json", 1, "\u{202e}", 1 << 20);
    let b = report(&dir, "b.json", 2, "\u{2066}\u{202e}", 2 << 20);
    for args in [
        vec!["show", s(&a)],
        vec!["show", s(&a), s(&b)],
        vec!["diff", s(&a), s(&b)],
    ] {
        let out = stdout_of(&args);
        assert!(!out.chars().any(steering), "{args:?}: {out:?}");
        assert!(out.contains("train\\u{202e}gnp.py"), "{args:?}: {out}");
        assert!(out.contains("leak"), "{args:?}: {out}");
        assert!(out.contains("\\u{202e}exe.txt"), "{args:?}: {out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn del_and_c1_controls_are_escaped_in_json_output() {
    let dir = scratch("json");
    let evil = "\u{7f}\u{9b}2J\u{202e}";
    let a = report(&dir, "a.json", 1, evil, 1 << 20);
    let b = report(&dir, "b.json", 2, evil, 2 << 20);
    for args in [
        vec!["show", "--json", s(&a)],
        vec!["diff", "--json", s(&a), s(&b)],
    ] {
        let out = stdout_of(&args);
        assert!(!out.chars().any(steering), "{args:?}: {out:?}");
        assert!(
            out.contains(r"train\u007f\u009b2J\u202egnp.py"),
            "{args:?}: {out}"
        );
        // The same data, parsed.
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let program = if args[0] == "show" {
            &v["reports"][0]["program"]
        } else {
            &v["a"]["program"]
        };
        assert_eq!(
            program.as_str(),
            Some(format!("train{evil}gnp.py").as_str())
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_trace_or_an_array_given_to_show_is_named() {
    let dir = scratch("arrays");
    let trace = dir.join("mem.json");
    std::fs::write(
        &trace,
        "[\n{\"name\":\"gpuguard_trace\",\"ph\":\"M\",\"pid\":7,\"tid\":7,\"args\":{\"schema\":\"gpuguard-trace/1\",\"program\":\"p\"}},\n{\"name\":\"device 0\",\"ph\":\"C\",\"ts\":1,\"pid\":7,\"tid\":7,\"args\":{\"live\":1}}\n]\n",
    )
    .unwrap();
    let array = dir.join("array.json");
    std::fs::write(&array, "[1,2,3]").unwrap();
    for (path, words) in [
        (
            &trace,
            "a gpuguard trace, not a gpuguard report; use `gpuguard plot`",
        ),
        (&array, "a JSON array, not a gpuguard report"),
    ] {
        for cmd in ["show", "flamegraph"] {
            let out = gpuguard(&[cmd, s(path)]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd} {path:?}: {err}");
            assert!(out.stdout.is_empty(), "{cmd}: nothing on stdout");
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.starts_with("gpuguard: "), "{err}");
            assert!(err.contains(words), "{cmd} {path:?}: {err}");
            assert!(!err.contains("trailing characters"), "{err}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bidi_overrides_are_escaped_in_the_ps_table() {
    use gpuguard_core::status::{self, DeviceStatus, Status};
    let runtime = scratch("ps");
    let dir = runtime.join("gpuguard");
    status::ensure_dir(&dir).unwrap();
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let ticks = status::process_start_ticks(Path::new("/proc"), sleeper.id()).unwrap();
    let st = Status {
        schema: status::SCHEMA.into(),
        gpuguard_version: "test".into(),
        pid: sleeper.id(),
        program: "train\u{202e}gnp.py".into(),
        argv: vec!["train\u{202e}gnp.py".into()],
        start_ticks: ticks,
        started_unix_ms: 1,
        report_dir: "/data/\u{2066}reports".into(),
        report_dir_hex: None,
        updated_unix_ms: 1,
        devices: vec![DeviceStatus {
            device: 0,
            live_bytes: 1 << 20,
            peak_bytes: 1 << 20,
            cap_bytes: None,
            pool_held_bytes: 0,
            ..Default::default()
        }],
    };
    status::write_status(&dir, &st).unwrap();
    let out = Command::new(cli())
        .arg("ps")
        .env("XDG_RUNTIME_DIR", &runtime)
        .output()
        .unwrap();
    let json = Command::new(cli())
        .args(["ps", "--json"])
        .env("XDG_RUNTIME_DIR", &runtime)
        .output()
        .unwrap();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("train\\u{202e}gnp.py"), "{text}");
    assert!(!text.chars().any(steering), "{text:?}");
    // `ps --json` escapes them as `\uXXXX`: the same value once parsed.
    let json_text = String::from_utf8(json.stdout).unwrap();
    assert!(json.status.success(), "{json_text}");
    assert!(!json_text.chars().any(steering), "{json_text:?}");
    let parsed: serde_json::Value = serde_json::from_str(&json_text).unwrap();
    assert_eq!(parsed[0]["program"], "train\u{202e}gnp.py", "{json_text}");
    let _ = std::fs::remove_dir_all(&runtime);
}
