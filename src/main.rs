//! The `gpuguard` command: read reports, and run programs under the shim.
//!
//!   gpuguard show REPORT.json...      a readable rendering of one or more reports
//!   gpuguard diff A.json B.json       the call sites whose live bytes grew from A to B
//!   gpuguard run [--] COMMAND...      run COMMAND with libgpuguard.so preloaded
//!   gpuguard trim PID                 trim a running process's caches, print what came back
//!
//! It shares the report model and the parsing of `GPUGUARD_*` variables with the
//! library through the `gpuguard-core` crate.

use gpuguard_core::{config, report};
use report::{Report, SCHEMA, human_bytes};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "usage:
  gpuguard show REPORT.json...     render gpuguard reports; with several reports of one
                                   process, flag call sites whose live bytes only grew
                                   (suspected leaks); with ranks, a line per rank
  gpuguard diff A.json B.json      call sites whose live bytes grew from A to B
  gpuguard run [OPTIONS] [--] COMMAND...
                                   run COMMAND with libgpuguard.so preloaded
      --cap SIZE         GPUGUARD_CAP: 20GiB, 0.5 (of each device), 0:20GiB,1:0.25
      --warn-at F        GPUGUARD_WARN_AT: warn past this fraction of the cap
      --trim-at F        GPUGUARD_TRIM_AT: trim CUDA pools past this fraction
      --dir DIR          GPUGUARD_DIR: where reports go
      --log LEVEL        GPUGUARD_LOG: off, warn, info, debug
  gpuguard trim [--timeout SECS] PID
                                   trim the framework caches and CUDA pools of a
                                   process running under gpuguard (sends its trim
                                   signal), wait for its trim report (30 s by
                                   default) and print what came back
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
        Some("diff") => diff(&args[1..]),
        Some("run") => run(&args[1..]),
        Some("trim") => trim(&args[1..]),
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
    let reports = files
        .iter()
        .map(|f| load(Path::new(f)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = String::new();
    for (i, (f, r)) in files.iter().zip(&reports).enumerate() {
        if i > 0 {
            out.push('\n');
        }
        render(&mut out, f, r);
    }
    render_suspected(&mut out, &reports);
    render_ranks(&mut out, &reports);
    print!("{out}");
    Ok(())
}

/// A site's identity across reports (ids differ from report to report): its frames.
fn site_key(frames: &[String]) -> String {
    if frames.is_empty() {
        "(no stack)".into()
    } else {
        frames.join("\n")
    }
}

/// How a Python site's key starts (native frames never start with a bracket).
const PY_SITE_MARK: &str = "[";

/// Live (bytes, count) per site, by frames text.
fn site_map(r: &Report) -> std::collections::BTreeMap<String, (u64, u64)> {
    let mut m = std::collections::BTreeMap::new();
    for s in &r.sites {
        let e: &mut (u64, u64) = m.entry(site_key(&s.frames)).or_default();
        e.0 += s.live_bytes;
        e.1 += s.live_count;
    }
    // Python sites (framework blocks in use) are compared too, marked as such.
    for s in &r.python_sites {
        let key = format!(
            "{PY_SITE_MARK}{} blocks, Python]\n{}",
            s.framework,
            site_key(&s.frames)
        );
        let e: &mut (u64, u64) = m.entry(key).or_default();
        e.0 += s.live_bytes;
        e.1 += s.live_count;
    }
    m
}

/// A site that grew: its frames and live (bytes, count) in each report compared.
#[derive(Debug, PartialEq)]
struct Growth {
    frames: String,
    live: Vec<(u64, u64)>,
}

impl Growth {
    fn is_python(&self) -> bool {
        self.frames.starts_with(PY_SITE_MARK)
    }

    fn grew(&self) -> u64 {
        let first = self.live.first().map_or(0, |l| l.0);
        let last = self.live.last().map_or(0, |l| l.0);
        last.saturating_sub(first)
    }
}

/// Sites whose live bytes never fell and ended higher across `reports` (in order),
/// most growth first. With two reports: every site that grew from the first.
fn growing_sites(reports: &[&Report]) -> Vec<Growth> {
    let maps: Vec<_> = reports.iter().map(|r| site_map(r)).collect();
    let keys: std::collections::BTreeSet<&String> = maps.iter().flat_map(|m| m.keys()).collect();
    let mut out: Vec<Growth> = keys
        .into_iter()
        .map(|k| Growth {
            frames: k.clone(),
            live: maps
                .iter()
                .map(|m| m.get(k).copied().unwrap_or_default())
                .collect(),
        })
        .filter(|g| g.live.windows(2).all(|w| w[1].0 >= w[0].0) && g.grew() > 0)
        .collect();
    // Python lines (the program's own code) first: in a framework process the native
    // sites are the framework's allocator, whose growth mixes cache and leak.
    out.sort_by(|a, b| {
        b.is_python()
            .cmp(&a.is_python())
            .then(b.grew().cmp(&a.grew()))
            .then(a.frames.cmp(&b.frames))
    });
    out
}

fn render_growth(out: &mut String, g: &Growth, labels: &[String]) {
    use std::fmt::Write;
    let _ = writeln!(out, "    +{}", human_bytes(g.grew()));
    for (label, (bytes, count)) in labels.iter().zip(&g.live) {
        let _ = writeln!(
            out,
            "      {label:<10} {:>11} in {count} allocations",
            human_bytes(*bytes)
        );
    }
    let frames: Vec<&str> = g.frames.lines().collect();
    for f in frames.iter().take(6) {
        let _ = writeln!(out, "        {f}");
    }
    if frames.len() > 6 {
        let _ = writeln!(out, "        ... {} more frames", frames.len() - 6);
    }
}

/// For each process (host and pid) with 2+ reports, ordered by seq: the sites whose
/// live bytes only grew.
fn render_suspected(out: &mut String, reports: &[Report]) {
    use std::fmt::Write;
    type Process<'a> = (Option<&'a str>, u32);
    let mut groups: Vec<(Process, Vec<&Report>)> = Vec::new();
    for r in reports {
        let key = (r.host.as_deref(), r.pid);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.push(r),
            None => groups.push((key, vec![r])),
        }
    }
    for ((_, pid), mut group) in groups.into_iter().filter(|(_, g)| g.len() >= 2) {
        group.sort_by_key(|r| r.seq);
        group.dedup_by_key(|r| r.seq);
        if group.len() < 2 {
            continue;
        }
        let grown = gpuguard_core::growth::suspects(&group);
        let seqs: Vec<String> = group.iter().map(|r| format!("#{}", r.seq)).collect();
        let _ = writeln!(
            out,
            "\nsuspected leaks in {} (pid {pid}), across reports {}:",
            group[0].program,
            seqs.join(", ")
        );
        if grown.is_empty() {
            let _ = writeln!(
                out,
                "  none: no call site's live bytes grew in most intervals"
            );
            continue;
        }
        let _ = writeln!(
            out,
            "  call sites whose live bytes grew in most intervals, steadiest first, then fastest:"
        );
        let labels: Vec<String> = group.iter().map(|r| format!("#{}", r.seq)).collect();
        for g in grown.iter().take(10) {
            let frames = match &g.key.framework {
                Some(fw) => format!(
                    "{PY_SITE_MARK}{fw} blocks, Python]\n{}",
                    site_key(&g.key.frames)
                ),
                None => site_key(&g.key.frames),
            };
            let _ = writeln!(
                out,
                "    rose in {} of {} intervals{}{}",
                g.rose,
                g.intervals,
                g.per_second
                    .map_or(String::new(), |r| format!(", {}/s", human_bytes(r as u64))),
                if g.exit_drop_ignored {
                    ", then fell at exit (judged before that drop)"
                } else {
                    ""
                }
            );
            render_growth(
                out,
                &Growth {
                    frames,
                    live: g.live.clone(),
                },
                &labels,
            );
        }
        if grown.len() > 10 {
            let _ = writeln!(out, "    ... {} more sites", grown.len() - 10);
        }
    }
}

/// One line per rank (its latest report) when the reports carry ranks.
fn render_ranks(out: &mut String, reports: &[Report]) {
    use std::fmt::Write;
    let mut latest: Vec<&Report> = Vec::new();
    for r in reports.iter().filter(|r| r.rank.is_some()) {
        let same = |o: &&mut &Report| o.rank == r.rank && o.host == r.host && o.pid == r.pid;
        match latest.iter_mut().find(same) {
            Some(slot) if slot.seq < r.seq => *slot = r,
            Some(_) => {}
            None => latest.push(r),
        }
    }
    if latest.is_empty() {
        return;
    }
    latest.sort_by_key(|r| (r.rank, r.host.clone(), r.pid));
    let _ = writeln!(out, "\nper rank (latest report of each):");
    for r in latest {
        let devs: Vec<String> = r
            .devices
            .iter()
            .map(|d| {
                format!(
                    "device {} {} live, peak {}",
                    d.device,
                    human_bytes(d.current_bytes),
                    human_bytes(d.peak_bytes)
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "  rank {}{} host {} pid {} (#{} {}): {}",
            r.rank.unwrap_or_default(),
            r.world_size.map_or(String::new(), |w| format!("/{w}")),
            r.host.as_deref().unwrap_or("?"),
            r.pid,
            r.seq,
            r.reason,
            if devs.is_empty() {
                "no device memory used".into()
            } else {
                devs.join("; ")
            }
        );
    }
}

fn diff(files: &[String]) -> Result<(), Failure> {
    let [a, b] = files else {
        return Err(Failure(format!("diff needs two report files\n{USAGE}")));
    };
    let ra = load(Path::new(a))?;
    let rb = load(Path::new(b))?;
    let grown: Vec<Growth> = growing_sites(&[&ra, &rb]);
    let mut out = String::new();
    use std::fmt::Write;
    let _ = writeln!(out, "gpuguard diff");
    for (label, f, r) in [("A", a, &ra), ("B", b, &rb)] {
        let _ = writeln!(
            out,
            "  {label}: {f}: {} (pid {}), reason {}, report #{}, {:.1} s",
            r.program, r.pid, r.reason, r.seq, r.uptime_s
        );
    }
    if grown.is_empty() {
        let _ = writeln!(out, "\n  no call site's live bytes grew from A to B");
    } else {
        let _ = writeln!(
            out,
            "\n  {} call sites whose live bytes grew from A to B, Python lines first, most first:",
            grown.len()
        );
        let labels = ["A".to_string(), "B".to_string()];
        for g in &grown {
            render_growth(&mut out, g, &labels);
        }
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

    render_classes(out, r);
    if let Some(t) = &r.trim {
        render_trim(out, t);
    }

    let what = if r.reason == "exit" {
        "still live at exit (leaks, or memory freed only by process teardown)"
    } else {
        "live"
    };
    let total_live = r.live.len() as u64 + r.live_omitted;
    let _ = writeln!(out, "\n  {total_live} allocations {what}");
    if !r.python_sites.is_empty() {
        let _ = writeln!(
            out,
            "\n  Python lines holding framework memory in use, by bytes:"
        );
        for s in r.python_sites.iter().take(10) {
            let _ = writeln!(
                out,
                "    py site {:<3} {:>11} in {} blocks ({})",
                s.id,
                human_bytes(s.live_bytes),
                s.live_count,
                s.framework
            );
            for f in s.frames.iter().take(6) {
                let _ = writeln!(out, "        {f}");
            }
            if s.frames.len() > 6 {
                let _ = writeln!(out, "        ... {} more frames", s.frames.len() - 6);
            }
        }
        if r.python_sites.len() > 10 {
            let _ = writeln!(
                out,
                "    ... {} more Python sites",
                r.python_sites.len() - 10
            );
        }
    }
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

/// In use, cached and unclassified bytes per device, and where the split came from.
fn render_classes(out: &mut String, r: &Report) {
    use std::fmt::Write;
    for d in &r.devices {
        if let (Some(u), Some(c)) = (d.in_use_bytes, d.cached_bytes) {
            let _ = writeln!(
                out,
                "  device {}: {} in use by live tensors/arrays, {} cached by frameworks, {} unclassified",
                d.device,
                human_bytes(u),
                human_bytes(c),
                human_bytes(d.current_bytes.saturating_sub(u + c))
            );
        }
    }
    for c in &r.classification {
        let _ = writeln!(
            out,
            "  {}: {}{}",
            c.framework,
            c.status,
            c.detail
                .as_deref()
                .map_or(String::new(), |d| format!(" ({d})"))
        );
    }
}

fn render_trim(out: &mut String, t: &report::TrimReport) {
    use std::fmt::Write;
    let _ = writeln!(
        out,
        "\n  trim ({}, {} request{}): {} released; Python side: {}",
        t.trigger,
        t.merged,
        if t.merged == 1 { "" } else { "s" },
        human_bytes(t.released_bytes),
        t.python
    );
    for d in &t.devices {
        let _ = writeln!(
            out,
            "    device {}: {} -> {}",
            d.device,
            human_bytes(d.before_bytes),
            human_bytes(d.after_bytes)
        );
    }
    for m in &t.mechanisms {
        let _ = writeln!(
            out,
            "    {:<11} {:<15} {:>11}  {}",
            m.name,
            m.status,
            human_bytes(m.released_bytes),
            m.detail.as_deref().unwrap_or("")
        );
    }
}

/// `gpuguard trim PID`: the process's trim signal, then its trim report.
fn trim(args: &[String]) -> Result<(), Failure> {
    let mut timeout = std::time::Duration::from_secs(30);
    let mut rest = args;
    while let Some(first) = rest.first() {
        match first.as_str() {
            "--timeout" => {
                let v = rest.get(1).and_then(|v| v.parse::<f64>().ok());
                let Some(secs) = v.filter(|s| *s > 0.0 && s.is_finite()) else {
                    return Err(Failure(format!(
                        "--timeout needs a number of seconds\n{USAGE}"
                    )));
                };
                timeout = std::time::Duration::from_secs_f64(secs);
                rest = &rest[2..];
            }
            _ => break,
        }
    }
    let [pid] = rest else {
        return Err(Failure(format!("trim needs one process id\n{USAGE}")));
    };
    let pid: u32 = pid
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| Failure(format!("not a process id: {pid:?}")))?;
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let maps = std::fs::read_to_string(proc_dir.join("maps")).map_err(|e| {
        Failure(if e.kind() == std::io::ErrorKind::NotFound {
            format!("no process {pid}")
        } else {
            format!("cannot inspect process {pid}: {e}")
        })
    })?;
    if !maps.lines().any(|l| l.contains("libgpuguard")) {
        return Err(Failure(format!(
            "process {pid} is not running gpuguard (libgpuguard.so is not loaded in it)"
        )));
    }
    // Its own settings: the trim signal and where its reports go.
    let environ = std::fs::read(proc_dir.join("environ"))
        .map_err(|e| Failure(format!("cannot read the environment of process {pid}: {e}")))?;
    let vars: std::collections::HashMap<String, String> = environ
        .split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            k.starts_with("GPUGUARD_")
                .then(|| (k.to_string(), v.to_string()))
        })
        .collect();
    let cfg = config::Config::parse(vars.keys().map(String::as_str), |k| vars.get(k).cloned())
        .map_err(|e| Failure(format!("process {pid}: {e}")))?;
    let Some(sig) = cfg.trim_signal else {
        return Err(Failure(format!(
            "process {pid} has its trim signal off (GPUGUARD_TRIM_SIGNAL=none)"
        )));
    };
    let dir = match cfg.dir {
        Some(d) if d.is_absolute() => d,
        d => {
            let cwd = std::fs::read_link(proc_dir.join("cwd"))
                .map_err(|e| Failure(format!("cannot find the directory of process {pid}: {e}")))?;
            d.map_or(cwd.clone(), |d| cwd.join(d))
        }
    };
    let before = trim_reports(&dir, pid);
    // SAFETY: kill(2) with a checked pid and a valid signal number.
    if unsafe { libc::kill(pid as libc::pid_t, sig) } != 0 {
        return Err(Failure(format!(
            "cannot signal process {pid}: {}",
            std::io::Error::last_os_error()
        )));
    }
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let new: Vec<PathBuf> = trim_reports(&dir, pid)
            .into_iter()
            .filter(|p| !before.contains(p))
            .collect();
        if let Some(path) = new.last() {
            let r = load(path)?;
            let mut out = String::new();
            if let Some(t) = &r.trim {
                render_trim(&mut out, t);
            }
            println!(
                "gpuguard trim: process {pid} ({}), report {}",
                r.program,
                path.display()
            );
            print!("{out}");
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(Failure(format!(
                "process {pid} wrote no trim report in {} in {:.0} s (is it stopped, or is its report directory elsewhere?)",
                dir.display(),
                timeout.as_secs_f64()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The trim reports of one process in a directory, oldest first (by sequence number).
fn trim_reports(dir: &Path, pid: u32) -> Vec<PathBuf> {
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let stem = name.strip_prefix("gpuguard.")?.strip_suffix(".trim.json")?;
            // <program>[.r<rank>].<pid>.<seq>
            let mut parts = stem.rsplit('.');
            let seq: u64 = parts.next()?.parse().ok()?;
            let p: u32 = parts.next()?.parse().ok()?;
            (p == pid).then(|| (seq, e.path()))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, p)| p).collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use report::Site;

    fn rep(pid: u32, seq: u64, sites: &[(&str, u64)]) -> Report {
        Report {
            pid,
            seq,
            sites: sites
                .iter()
                .enumerate()
                .map(|(i, (f, b))| Site {
                    id: i as u32,
                    frames: vec![f.to_string(), "main".into()],
                    live_bytes: *b,
                    live_count: 1,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn growth_matches_sites_by_frames_and_orders_by_growth() {
        let a = rep(1, 1, &[("weights", 100), ("cache", 10), ("gone", 5)]);
        // Ids are reassigned between reports: only frames match sites.
        let b = rep(1, 2, &[("cache", 50), ("new", 20), ("weights", 100)]);
        let g = growing_sites(&[&a, &b]);
        let names: Vec<&str> = g.iter().map(|g| g.frames.lines().next().unwrap()).collect();
        assert_eq!(names, ["cache", "new"]);
        assert_eq!(g[0].live, vec![(10, 1), (50, 1)]);
        assert_eq!(g[0].grew(), 40);
        assert_eq!(g[1].live, vec![(0, 0), (20, 1)]);
    }

    #[test]
    fn suspected_leaks_grow_in_most_intervals() {
        let r1 = rep(7, 1, &[("leak", 10), ("bumpy", 10)]);
        let r2 = rep(7, 2, &[("leak", 20), ("bumpy", 5)]);
        let r3 = rep(7, 3, &[("leak", 30), ("bumpy", 40)]);
        let other = rep(8, 1, &[("leak", 1)]);
        // Order by seq, whatever the order given; one pid's single report is no trend.
        let mut out = String::new();
        render_suspected(&mut out, &[r3, other, r1, r2]);
        assert!(out.contains("across reports #1, #2, #3"), "{out}");
        assert!(out.contains("leak") && !out.contains("bumpy"), "{out}");
        assert_eq!(out.matches("suspected leaks").count(), 1, "{out}");
    }

    #[test]
    fn rank_lines_only_with_ranks() {
        let mut out = String::new();
        render_ranks(&mut out, &[rep(1, 1, &[])]);
        assert!(out.is_empty());
        let mut a = rep(1, 1, &[]);
        a.rank = Some(1);
        a.host = Some("n1".into());
        let mut b = rep(2, 4, &[]);
        b.rank = Some(0);
        b.world_size = Some(2);
        b.host = Some("n0".into());
        let mut a2 = a.clone();
        a2.seq = 2;
        render_ranks(&mut out, &[a, a2, b]);
        let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("  rank ")).collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(lines[0].contains("rank 0/2 host n0 pid 2"), "{out}");
        assert!(lines[1].contains("rank 1 host n1 pid 1 (#2"), "{out}");
    }
}
