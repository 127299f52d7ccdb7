//! The `gpuguard` command: read reports, and run programs under the shim.
//!
//!   gpuguard show REPORT.json...      a readable rendering of one or more reports
//!   gpuguard run [--] COMMAND...      run COMMAND with libgpuguard.so preloaded
//!
//! It shares the report model with the library (`src/report.rs`), included here by
//! path because the library is built only as the preloadable `cdylib`.

#[path = "report.rs"]
#[allow(dead_code)]
mod report;

use report::{Report, SCHEMA, human_bytes};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "usage:
  gpuguard show REPORT.json...     render gpuguard reports
  gpuguard run [OPTIONS] [--] COMMAND...
                                   run COMMAND with libgpuguard.so preloaded
      --cap SIZE         GPUGUARD_CAP: 20GiB, 0.5 (of each device), 0:20GiB,1:0.25
      --warn-at F        GPUGUARD_WARN_AT: warn past this fraction of the cap
      --trim-at F        GPUGUARD_TRIM_AT: trim CUDA pools past this fraction
      --dir DIR          GPUGUARD_DIR: where reports go
      --log LEVEL        GPUGUARD_LOG: off, warn, info, debug
  gpuguard --version";

/// `gpuguard run` options and the variable each one sets.
const RUN_OPTIONS: &[(&str, &str)] = &[
    ("--cap", "GPUGUARD_CAP"),
    ("--warn-at", "GPUGUARD_WARN_AT"),
    ("--trim-at", "GPUGUARD_TRIM_AT"),
    ("--dir", "GPUGUARD_DIR"),
    ("--log", "GPUGUARD_LOG"),
];

/// A user-facing failure: message to stderr, exit status 2.
struct Failure(String);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("show") => show(&args[1..]),
        Some("run") => run(&args[1..]),
        Some("--version") | Some("-V") => {
            println!("gpuguard {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Some("--help") | Some("-h") | Some("help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => Err(Failure(USAGE.to_string())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(msg)) => {
            eprintln!("gpuguard: {msg}");
            ExitCode::from(2)
        }
    }
}

/// Reads and checks one report file.
fn load(path: &Path) -> Result<Report, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure(format!("{}: cannot read: {e}", path.display())))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        Failure(format!(
            "{}: not a complete JSON document ({e}); is the file truncated?",
            path.display()
        ))
    })?;
    match value.get("schema").and_then(|s| s.as_str()) {
        Some(SCHEMA) => {}
        Some(other) if other.starts_with("gpuguard-report/") => {
            return Err(Failure(format!(
                "{}: schema {other} is newer or older than this gpuguard reads ({SCHEMA}); use a matching gpuguard",
                path.display()
            )));
        }
        _ => {
            return Err(Failure(format!(
                "{}: not a gpuguard report (no \"schema\": \"{SCHEMA}\")",
                path.display()
            )));
        }
    }
    serde_json::from_value(value).map_err(|e| {
        Failure(format!(
            "{}: malformed gpuguard report: {e}",
            path.display()
        ))
    })
}

fn show(files: &[String]) -> Result<(), Failure> {
    if files.is_empty() {
        return Err(Failure(format!(
            "show needs at least one report file\n{USAGE}"
        )));
    }
    let mut out = String::new();
    for (i, f) in files.iter().enumerate() {
        let r = load(Path::new(f))?;
        if i > 0 {
            out.push('\n');
        }
        render(&mut out, f, &r);
    }
    print!("{out}");
    Ok(())
}

fn render(out: &mut String, file: &str, r: &Report) {
    use std::fmt::Write;
    let _ = writeln!(out, "gpuguard report {file}");
    let _ = writeln!(
        out,
        "  {} (pid {}), reason: {}, report #{}, {:.1} s after the first CUDA call",
        r.program, r.pid, r.reason, r.seq, r.uptime_s
    );
    if !r.argv.is_empty() {
        let _ = writeln!(out, "  command: {}", r.argv.join(" "));
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "  {:<6} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9} {:>7} {:>7} {:>8}",
        "device", "live", "peak", "total", "cap", "allocs", "frees", "failed", "denied", "unknown"
    );
    for d in &r.devices {
        let _ = writeln!(
            out,
            "  {:<6} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9} {:>7} {:>7} {:>8}",
            d.device,
            human_bytes(d.current_bytes),
            human_bytes(d.peak_bytes),
            if d.total_bytes > 0 {
                human_bytes(d.total_bytes)
            } else {
                "?".into()
            },
            d.cap_bytes.map_or("none".into(), human_bytes),
            d.allocs,
            d.frees,
            d.failed,
            d.denied,
            d.unknown_frees
        );
    }
    if r.devices.is_empty() {
        let _ = writeln!(out, "  (no device memory was used)");
    }
    if let Some(d) = &r.denial {
        let _ = writeln!(
            out,
            "\n  cap refused {} ({}) on device {}: {} of its {} cap in use",
            human_bytes(d.bytes),
            d.api,
            d.device,
            human_bytes(d.charged_bytes),
            human_bytes(d.cap_bytes)
        );
        for f in d.frames.iter().take(6) {
            let _ = writeln!(out, "        {f}");
        }
        let _ = writeln!(out);
    }
    for d in r.devices.iter().filter(|d| d.pool_reserved_bytes > 0) {
        let _ = writeln!(
            out,
            "  device {}: stream-ordered pools hold {} from the driver",
            d.device,
            human_bytes(d.pool_reserved_bytes)
        );
    }
    let h = &r.host_pinned;
    let _ = writeln!(
        out,
        "  pinned host memory: {} live in {} allocations, peak {}",
        human_bytes(h.current_bytes),
        h.live_count,
        human_bytes(h.peak_bytes)
    );
    for d in r.devices.iter().filter(|d| !d.by_kind.is_empty()) {
        let kinds: Vec<String> = d
            .by_kind
            .iter()
            .map(|(k, b)| format!("{k} {}", human_bytes(*b)))
            .collect();
        let _ = writeln!(
            out,
            "  device {} live by kind: {}",
            d.device,
            kinds.join(", ")
        );
    }

    let what = if r.reason == "exit" {
        "still live at exit (leaks, or memory freed only by process teardown)"
    } else {
        "live"
    };
    let total_live = r.live.len() as u64 + r.live_omitted;
    let _ = writeln!(out, "\n  {total_live} allocations {what}");
    if !r.sites.is_empty() {
        let _ = writeln!(out, "\n  call sites by live bytes:");
        for s in r.sites.iter().take(10) {
            let _ = writeln!(
                out,
                "    site {:<4} {:>11} in {} allocations",
                s.id,
                human_bytes(s.live_bytes),
                s.live_count
            );
            for f in s.frames.iter().take(6) {
                let _ = writeln!(out, "        {f}");
            }
            if s.frames.len() > 6 {
                let _ = writeln!(out, "        ... {} more frames", s.frames.len() - 6);
            }
        }
        if r.sites.len() > 10 {
            let _ = writeln!(out, "    ... {} more sites", r.sites.len() - 10);
        }
    }
    if !r.live.is_empty() {
        let _ = writeln!(out, "\n  largest live allocations:");
        let _ = writeln!(
            out,
            "    {:<18} {:>11} {:>4} {:<8} {:<24} {:>9} {:>5}",
            "address", "bytes", "dev", "kind", "api", "age", "site"
        );
        for a in r.live.iter().take(15) {
            let _ = writeln!(
                out,
                "    {:<18} {:>11} {:>4} {:<8} {:<24} {:>8.1}s {:>5}",
                a.address.to_string(),
                human_bytes(a.bytes),
                a.device,
                a.kind,
                a.api,
                a.age_s,
                a.site.map_or("-".into(), |s| s.to_string())
            );
        }
        if total_live > 15 {
            let _ = writeln!(out, "    ... {} more", total_live - 15);
        }
    }
}

/// The shim next to this executable (target/release/gpuguard ->
/// target/release/libgpuguard.so), or in ../lib for an installed layout.
fn find_shim() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [
        dir.join("libgpuguard.so"),
        dir.join("../lib/libgpuguard.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

fn run(args: &[String]) -> Result<(), Failure> {
    let mut vars: Vec<(&str, String)> = Vec::new();
    let mut rest = args;
    while let Some(first) = rest.first() {
        if first == "--" {
            rest = &rest[1..];
            break;
        }
        let (flag, inline) = match first.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (first.as_str(), None),
        };
        let Some(&(_, var)) = RUN_OPTIONS.iter().find(|(f, _)| *f == flag) else {
            if flag.starts_with("--") {
                return Err(Failure(format!("unknown option {flag}\n{USAGE}")));
            }
            break;
        };
        let (value, used) = match inline {
            Some(v) => (v, 1),
            None => match rest.get(1) {
                Some(v) => (v.clone(), 2),
                None => return Err(Failure(format!("{flag} needs a value\n{USAGE}"))),
            },
        };
        vars.push((var, value));
        rest = &rest[used..];
    }
    let cmd = rest;
    let Some(program) = cmd.first() else {
        return Err(Failure(format!("run needs a command\n{USAGE}")));
    };
    let shim = find_shim().ok_or_else(|| {
        Failure("cannot find libgpuguard.so next to the gpuguard executable".into())
    })?;
    let mut preload = shim.canonicalize().unwrap_or(shim).display().to_string();
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload = format!("{preload}:{}", existing.to_string_lossy());
    }
    use std::os::unix::process::CommandExt;
    // The library checks every value when it loads and stops the command with a
    // message naming the variable if one is malformed.
    let err = std::process::Command::new(program)
        .args(&cmd[1..])
        .env("LD_PRELOAD", preload)
        .envs(vars)
        .exec();
    Err(Failure(format!("cannot run {program}: {err}")))
}
