//! `gpuguard run [OPTIONS] -- CMD...`: run CMD with the library preloaded, then say
//! in a few lines what the reports CMD's processes wrote during the run show, and
//! end with CMD's status.

use super::growth::live_allocations;
use super::lib_path::{LIB_VAR, find};
use super::load::{load, shown};
use super::output::{print_err, warn};
use super::text::{clean, count, frames};
use super::trim::report_name_parts;
use super::{Failure, Outcome};
use gpuguard_core::config::Config;
use gpuguard_core::report::{Report, human_bytes};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `gpuguard run` options.
#[derive(clap::Args)]
#[command(
    after_help = "Each option sets the GPUGUARD_ variable named in its help; \
    values are checked before COMMAND starts. The library is looked for at \
    $GPUGUARD_LIB, beside this executable, then in ../lib. When COMMAND ends, a \
    summary of the reports its processes wrote goes to stderr, and gpuguard exits \
    with COMMAND's status (128+N when signal N ended it)."
)]
pub struct RunArgs {
    /// GPUGUARD_CAP: a cap per device: 20GiB, 0.5 (of each device), 0:20GiB,1:0.25
    #[arg(long, value_name = "SIZE")]
    pub cap: Option<String>,
    /// GPUGUARD_WARN_AT: warn past this fraction of the cap (0.9 or 90%)
    #[arg(long, value_name = "F")]
    pub warn_at: Option<String>,
    /// GPUGUARD_TRIM_AT: trim CUDA pools past this fraction of the cap
    #[arg(long, value_name = "F")]
    pub trim_at: Option<String>,
    /// GPUGUARD_DIR: where reports go (default: the working directory)
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// GPUGUARD_LOG: off, warn, info, debug
    #[arg(long, value_name = "LEVEL")]
    pub log: Option<String>,
    /// GPUGUARD_TRACE: write a memory timeline (Chrome trace format) to FILE
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// The command and its arguments (after `--` when they start with a dash)
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<OsString>,
}

/// Each option that sets a variable the library reads, with that variable.
const OPTION_VARS: &[(&str, &str)] = &[
    ("--cap", "GPUGUARD_CAP"),
    ("--warn-at", "GPUGUARD_WARN_AT"),
    ("--trim-at", "GPUGUARD_TRIM_AT"),
    ("--dir", "GPUGUARD_DIR"),
    ("--log", "GPUGUARD_LOG"),
];

/// The variable `--trace` sets.
const TRACE_VAR: &str = "GPUGUARD_TRACE";

/// How many leaking lines the summary names.
const SUMMARY_LINES: usize = 5;

/// How often the report folder is looked at while CMD runs.
const POLL: Duration = Duration::from_millis(100);

/// The options' values, checked with the library's own parsers, so a bad value is
/// refused here, naming the option, before anything starts.
fn checked_vars(args: &RunArgs) -> Result<Vec<(&'static str, OsString)>, Failure> {
    let mut vars: Vec<(&'static str, OsString)> = Vec::new();
    let texts = [
        args.cap.clone(),
        args.warn_at.clone(),
        args.trim_at.clone(),
        args.dir.as_ref().map(|d| d.to_string_lossy().into_owned()),
        args.log.clone(),
    ];
    let mut given: HashMap<&str, String> = HashMap::new();
    for ((_, var), text) in OPTION_VARS.iter().zip(texts) {
        if let Some(text) = text {
            given.insert(var, text);
        }
    }
    if let Err(e) = Config::parse(given.keys().copied(), |k| given.get(k).cloned()) {
        let option = OPTION_VARS
            .iter()
            .find(|(_, var)| *var == e.var)
            .map_or(e.var.as_str(), |(option, _)| option);
        return Err(Failure::Input(format!(
            "{option} {:?} is not valid; accepted: {}",
            clean(&e.value),
            e.accepted
        )));
    }
    for (option, var) in OPTION_VARS {
        let value: Option<OsString> = match *option {
            // A directory is passed as given, bytes and all.
            "--dir" => args.dir.clone().map(OsString::from),
            _ => given.get(var).map(OsString::from),
        };
        if let Some(v) = value {
            vars.push((var, v));
        }
    }
    if let Some(trace) = &args.trace {
        if trace.as_os_str().is_empty() {
            return Err(Failure::Input("--trace needs a file name".into()));
        }
        vars.push((TRACE_VAR, trace.clone().into_os_string()));
    }
    Ok(vars)
}

/// The pid of CMD while it runs, for the signal forwarder.
static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward_signal(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// While CMD runs, gpuguard outlives it to write the summary: Ctrl-C and Ctrl-\
/// reach CMD from the terminal and are ignored here (as `system(3)` does); a
/// TERM or HUP sent to gpuguard alone (a job scheduler stopping it) goes on to CMD,
/// and so do the report and trim signals (`kill -USR1 <pid of gpuguard run>` asks
/// CMD for a report, as the pid a user sees first).
fn guard_signals(child: u32) {
    CHILD.store(child as i32, Ordering::Relaxed);
    let forward = forward_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // The signals CMD's library listens to, as its environment sets them.
    let cfg = gpuguard_core::config::Config::from_env()
        .map(|p| p.config)
        .unwrap_or_default();
    let passed_on = [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2]
        .into_iter()
        .chain(cfg.report_signal)
        .chain(cfg.trim_signal);
    // SAFETY: installing dispositions; the handler only calls kill(2).
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        for sig in passed_on {
            libc::signal(sig, forward);
        }
    }
}

/// Parent of every process, read from `/proc/*/stat`.
fn parents() -> HashMap<u32, u32> {
    let mut map = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
        let Some(after) = stat.rfind(')').map(|at| &stat[at + 1..]) else {
            continue;
        };
        if let Some(ppid) = after.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            map.insert(pid, ppid);
        }
    }
    map
}

/// Tells CMD's processes from others writing reports into the same folder. A
/// report is only known to be a process's once it is written, when the process may
/// be gone already; so the processes whose reports appear are looked at as they
/// appear, and those seen running outside CMD's tree are set aside.
struct ReportWatch {
    root: u32,
    /// CMD and its descendants seen so far.
    family: HashSet<u32>,
    /// Processes seen running outside CMD's tree.
    foreign: HashSet<u32>,
}

impl ReportWatch {
    fn new(root: u32) -> ReportWatch {
        ReportWatch {
            root,
            family: HashSet::from([root]),
            foreign: HashSet::new(),
        }
    }

    /// Classifies the writers of reports in `dir` not classified yet.
    fn look(&mut self, dir: &Path) {
        let writers: Vec<u32> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| report_name_parts(e.file_name().to_str()?).map(|(pid, _, _)| pid))
            .filter(|pid| !self.family.contains(pid) && !self.foreign.contains(pid))
            .collect();
        if writers.is_empty() {
            return;
        }
        let parents = parents();
        self.add_descendants(&parents);
        for pid in writers {
            if parents.contains_key(&pid) && !self.family.contains(&pid) {
                self.foreign.insert(pid);
            }
        }
    }

    fn add_descendants(&mut self, parents: &HashMap<u32, u32>) {
        let mut changed = true;
        while changed {
            changed = false;
            for (pid, ppid) in parents {
                if (*ppid == self.root || self.family.contains(ppid)) && self.family.insert(*pid) {
                    changed = true;
                }
            }
        }
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The status a shell would give: the exit code, or 128 + the signal that ended it.
fn shell_status(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => (128 + sig) as u8,
        (None, None) => 1,
    }
}

pub fn main(args: RunArgs) -> Outcome {
    let vars = checked_vars(&args)?;
    let Some((program, rest)) = args.command.split_first() else {
        return Err(Failure::Input(
            "run needs a command: gpuguard run [OPTIONS] -- COMMAND...".into(),
        ));
    };
    let lib = find()?;
    let mut preload = lib.into_os_string();
    // Keep what the caller preloads: gpuguard's library first, theirs after.
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(existing);
    }
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::var_os("GPUGUARD_DIR")
            .filter(|d| !d.is_empty())
            .map_or_else(|| PathBuf::from("."), PathBuf::from),
    };
    // Reports are matched by pid and by time: a second of slack for clocks that tick
    // coarsely, far less than any pid takes to come round again.
    let start_ms = unix_ms(SystemTime::now()).saturating_sub(1000);
    let mut child = Command::new(program)
        .args(rest)
        .env("LD_PRELOAD", preload)
        // The library reads every GPUGUARD_ variable; this one is the command's.
        .env_remove(LIB_VAR)
        .envs(vars)
        .spawn()
        .map_err(|e| {
            Failure::Input(format!(
                "cannot run {}: {e}",
                clean(&program.to_string_lossy())
            ))
        })?;
    let pid = child.id();
    guard_signals(pid);
    let mut watch = ReportWatch::new(pid);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(e) => {
                warn(&format!(
                    "cannot wait for {}: {e}",
                    clean(&program.to_string_lossy())
                ));
                break None;
            }
        }
        watch.look(&dir);
        std::thread::sleep(POLL);
    };
    CHILD.store(0, Ordering::Relaxed);
    let code = status.map_or(1, shell_status);
    let reports = reports_of(&dir, &watch.foreign, start_ms);
    print_err(&summary(
        &program.to_string_lossy(),
        pid,
        code,
        &dir,
        &reports,
    ));
    Ok(code)
}

/// The reports in `dir` written since the start, but for those of processes seen
/// running outside CMD's tree.
fn reports_of(dir: &Path, foreign: &HashSet<u32>, start_ms: u64) -> Vec<(PathBuf, Report)> {
    let mut found: Vec<(PathBuf, Report)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (pid, _, _) = report_name_parts(&name)?;
            if foreign.contains(&pid) {
                return None;
            }
            // Reports from before the run are not read at all.
            let modified = e.metadata().ok()?.modified().ok()?;
            if unix_ms(modified) < start_ms {
                return None;
            }
            let report = load(&e.path()).ok()?;
            (report.time_unix_ms >= start_ms).then(|| (e.path(), report))
        })
        .collect();
    found.sort_by_key(|(_, r)| (r.pid, r.seq));
    found
}

/// A few lines on stderr: memory per device, the leaking lines, caps hit, trims.
fn summary(program: &str, pid: u32, code: u8, dir: &Path, reports: &[(PathBuf, Report)]) -> String {
    let mut out = String::new();
    put!(
        out,
        "\ngpuguard run: {} (pid {pid}) ended with status {code}; {} in {}",
        clean(program),
        count(reports.len() as u64, "report"),
        shown(dir)
    );
    if reports.is_empty() {
        put!(out, "  (no process of it wrote a report: did it use CUDA?)");
        return out;
    }
    // Each process's latest report holds its figures at the end.
    let mut latest: BTreeMap<u32, &Report> = BTreeMap::new();
    for (_, r) in reports {
        let slot = latest.entry(r.pid).or_insert(r);
        if r.seq > slot.seq {
            *slot = r;
        }
    }
    for r in latest.values() {
        let when = if r.reason == "exit" {
            "at exit".to_string()
        } else {
            format!("at its last report ({})", clean(&r.reason))
        };
        for d in &r.devices {
            put!(
                out,
                "  {} (pid {}) device {}: peak {}, live {when} {} in {}{}",
                clean(&r.program),
                r.pid,
                d.device,
                human_bytes(d.peak_bytes),
                human_bytes(d.current_bytes),
                count(d.live_count, "allocation"),
                d.cap_bytes
                    .map_or(String::new(), |c| format!(", cap {}", human_bytes(c)))
            );
        }
        if r.devices.is_empty() {
            put!(
                out,
                "  {} (pid {}): no device memory used",
                clean(&r.program),
                r.pid
            );
        }
    }
    render_leaking_lines(&mut out, &latest);
    let refused: Vec<String> = latest
        .values()
        .flat_map(|r| r.devices.iter().map(move |d| (r, d)))
        .filter(|(_, d)| d.denied > 0)
        .map(|(r, d)| {
            format!(
                "pid {} device {}: {} refused{}",
                r.pid,
                d.device,
                count(d.denied, "allocation"),
                d.cap_bytes
                    .map_or(String::new(), |c| format!(" by its {} cap", human_bytes(c)))
            )
        })
        .collect();
    let cap_reports = reports.iter().filter(|(_, r)| r.reason == "cap").count() as u64;
    if !refused.is_empty() || cap_reports > 0 {
        put!(
            out,
            "  caps hit: {}{}",
            refused.join("; "),
            if cap_reports > 0 {
                format!(" ({})", count(cap_reports, "cap report"))
            } else {
                String::new()
            }
        );
    }
    let trims: Vec<&Report> = reports
        .iter()
        .map(|(_, r)| r)
        .filter(|r| r.trim.is_some())
        .collect();
    if !trims.is_empty() {
        let released = trims
            .iter()
            .filter_map(|r| r.trim.as_ref())
            .fold(0u64, |acc, t| acc.saturating_add(t.released_bytes));
        put!(
            out,
            "  trims: {}, {} released",
            count(trims.len() as u64, "trim"),
            human_bytes(released)
        );
    }
    put!(
        out,
        "  details: gpuguard show {}/gpuguard.*.json",
        shown(dir)
    );
    out
}

/// The lines holding the most live memory at the end, over all processes: Python
/// lines where a report has them, else native call sites.
fn render_leaking_lines(out: &mut String, latest: &BTreeMap<u32, &Report>) {
    let mut lines: Vec<(u64, String, Vec<String>)> = Vec::new();
    for r in latest.values() {
        if !r.python_sites.is_empty() {
            for s in &r.python_sites {
                let what = format!("{} ({})", count(s.live_count, "block"), clean(&s.framework));
                lines.push((s.live_bytes, what, frames(&s.frames)));
            }
        } else {
            for s in &r.sites {
                lines.push((
                    s.live_bytes,
                    count(s.live_count, "allocation"),
                    frames(&s.frames),
                ));
            }
        }
    }
    if lines.is_empty() {
        return;
    }
    lines.sort_by_key(|line| std::cmp::Reverse(line.0));
    let live: u64 = latest
        .values()
        .fold(0, |acc, r| acc.saturating_add(live_allocations(r)));
    put!(
        out,
        "  top lines holding live memory ({} in all):",
        count(live, "allocation")
    );
    for (bytes, what, site_frames) in lines.iter().take(SUMMARY_LINES) {
        let place: Vec<&str> = site_frames.iter().take(2).map(String::as_str).collect();
        put!(
            out,
            "    {:>11} in {what}: {}",
            human_bytes(*bytes),
            place.join(" <- ")
        );
    }
}
