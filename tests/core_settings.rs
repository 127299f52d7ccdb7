//! Settings as the process environment holds them: a report directory whose name is
//! not UTF-8 is used byte for byte, and an unknown `GPUGUARD_*` name is one warning
//! naming the closest known variable, the program running on.

mod common;
mod core_support;

use common::*;
use core_support::fresh_dir;
use std::ffi::OsString;
use std::fs;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// Runs `gg leak 1` on the sim under gpuguard with `env` added (values as bytes).
fn gg_leak(env: &[(&str, OsString)]) -> Output {
    let mut cmd = Command::new(sim_dir().join("gg"));
    cmd.args(["leak", "1"])
        .stdin(Stdio::null())
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("LD_PRELOAD", shim());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GPUGUARD_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// `GPUGUARD_DIR` with a byte that is not UTF-8: the report lands in that very
/// directory, not in one whose name has U+FFFD in its place.
#[test]
fn report_dir_is_kept_byte_for_byte() {
    let base = fresh_dir("bytes");
    let mut raw = base.clone().into_os_string().into_vec();
    raw.extend_from_slice(b"/r\xe9ports");
    let dir = PathBuf::from(OsString::from_vec(raw));
    fs::create_dir(&dir).unwrap();
    let out = gg_leak(&[("GPUGUARD_DIR", dir.clone().into_os_string())]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let entries = |d: &PathBuf| -> Vec<OsString> {
        fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect()
    };
    let reports = entries(&dir);
    assert_eq!(reports.len(), 1, "{reports:?}\n{stderr}");
    assert!(reports[0].to_string_lossy().ends_with(".exit.json"));
    // Nothing else appeared beside it (a lossy twin directory, say).
    assert_eq!(entries(&base).len(), 1, "{:?}", entries(&base));
    let _ = fs::remove_dir_all(&base);
}

/// An unknown name: the program runs, and gpuguard says so once, with the closest
/// known name; `GPUGUARD_LOG=off` silences it.
#[test]
fn unknown_variable_is_one_warning() {
    let dir = fresh_dir("warn");
    let out = gg_leak(&[
        ("GPUGUARD_DIR", dir.clone().into_os_string()),
        ("GPUGUARD_CAPP", "1GiB".into()),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("GPUGUARD_CAPP"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].starts_with("gpuguard[")
            && warnings[0]
                .ends_with("unknown variable GPUGUARD_CAPP ignored; did you mean GPUGUARD_CAP?"),
        "{}",
        warnings[0]
    );
    let quiet = gg_leak(&[
        ("GPUGUARD_DIR", dir.clone().into_os_string()),
        ("GPUGUARD_CAPP", "1GiB".into()),
        ("GPUGUARD_LOG", "off".into()),
    ]);
    assert!(quiet.status.success());
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("GPUGUARD_CAPP"));
    let _ = fs::remove_dir_all(&dir);
}

/// Runs `prog args` under gpuguard (the sim's libraries on the path), with `env`
/// added as bytes.
fn preloaded(prog: &str, args: &[&str], env: &[(&str, OsString)]) -> Output {
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("LD_PRELOAD", shim());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GPUGUARD_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// A process that never calls CUDA is not changed by gpuguard: an unknown
/// `GPUGUARD_*` name gets no warning there (before: one per process, so
/// `sh -c 'ls; ls'` printed it three times), while a CUDA program still says it once.
#[test]
fn a_process_without_cuda_says_nothing_about_unknown_variables() {
    let dir = fresh_dir("quiet");
    let env = [
        ("GPUGUARD_DIR", dir.clone().into_os_string()),
        ("GPUGUARD_FOO", OsString::from("1")),
    ];
    let out = preloaded("/bin/sh", &["-c", "/bin/true; /bin/true"], &env);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    let out = preloaded("/bin/true", &[], &env);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    // A CUDA program under a shell: the program says it once, the shell nothing.
    let gg = sim_dir().join("gg");
    let script = format!("/bin/true; '{}' leak 1 >/dev/null; /bin/true", gg.display());
    let out = preloaded("/bin/sh", &["-c", &script], &env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("GPUGUARD_FOO"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].contains("unknown variable GPUGUARD_FOO ignored"),
        "{}",
        warnings[0]
    );
    let _ = fs::remove_dir_all(&dir);
}

/// The control characters of `stderr` a terminal would act on (all but the
/// newline), as their low bytes.
fn raw_controls(stderr: &[u8]) -> Vec<u8> {
    String::from_utf8_lossy(stderr)
        .chars()
        .filter(|c| c.is_control() && *c != '\n')
        .map(|c| c as u32 as u8)
        .collect()
}

/// Names and paths from the environment reach stderr with their control characters
/// escaped: an unknown variable's name, and a `GPUGUARD_DIR` (written to, and one
/// that cannot be). Before, the escape sequences went to the terminal raw.
#[test]
fn control_characters_from_the_environment_are_escaped_on_stderr() {
    let base = fresh_dir("esc");
    let dir = base.join("r\x1b[31mred\x07");
    fs::create_dir(&dir).unwrap();
    let out = gg_leak(&[
        ("GPUGUARD_DIR", dir.clone().into_os_string()),
        ("GPUGUARD_\x1b[31mX", "1".into()),
    ]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(raw_controls(&out.stderr), b"", "{stderr:?}");
    assert!(
        stderr.contains("unknown variable GPUGUARD_\\x1b[31mX ignored"),
        "{stderr}"
    );
    assert!(
        stderr.contains("r\\x1b[31mred\\x07/gpuguard.gg."),
        "{stderr}"
    );
    // A directory that cannot be written: the warning names it escaped, and the
    // report that follows on stderr is JSON (escaped too).
    let missing = base.join("gone\x1b]0;title\x07");
    let out = gg_leak(&[("GPUGUARD_DIR", missing.into_os_string())]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(raw_controls(&out.stderr), b"", "{stderr:?}");
    assert!(
        stderr.contains("cannot write reports to ") && stderr.contains("gone\\x1b]0;title\\x07"),
        "{stderr}"
    );
    let _ = fs::remove_dir_all(&base);
}
