//! `gpuguard run [OPTIONS] -- CMD...`: run CMD with the library preloaded, then say
//! in a few lines what the reports CMD's processes wrote during the run show, and
//! end with CMD's status.
//!
//! Why one file of about 770 lines: starting CMD, passing signals on, watching for
//! its processes' reports and summing them up share the run's state (CMD's pid, its
//! process tree, the report folder and the start time).

use super::growth::{live_allocations, native_sites, python_sites};
use super::lib_path::{LIB_VAR, find};
use super::load::{load_keeping, shown};
use super::output::{print_err, warn};
use super::procs::{cuda_processes_under, parents};
use super::report_name::report_name_parts;
use super::text::{clean, count, frames};
use super::words::{holding, pinned_line, rank_words};
use super::{Failure, Outcome};
use gpuguard_core::config::Config;
use gpuguard_core::report::{Report, human_bytes};
use gpuguard_core::reporter::file_name;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
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
    /// GPUGUARD_TRIM_AT: trim framework caches and CUDA pools past this fraction of the cap
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

/// Report and trim signals sent to gpuguard while CMD runs, one bit per signal
/// (`1 << (sig - 1)`), passed on by the main loop.
static DEFERRED: AtomicU64 = AtomicU64::new(0);

extern "C" fn defer_signal(sig: libc::c_int) {
    if (1..=64).contains(&sig) {
        DEFERRED.fetch_or(1 << (sig - 1), Ordering::Relaxed);
    }
}

/// While CMD runs, gpuguard outlives it to write the summary: Ctrl-C and Ctrl-\
/// reach CMD from the terminal and are ignored here (as `system(3)` does); a
/// TERM or HUP sent to gpuguard alone (a job scheduler stopping it) goes on to CMD,
/// and the report and trim signals go to the processes under CMD that use CUDA
/// (`kill -USR1 <pid of gpuguard run>` asks for a report, as the pid a user sees
/// first, also when CMD is a shell that runs the CUDA program as its child).
fn guard_signals(child: u32) {
    CHILD.store(child as i32, Ordering::Relaxed);
    let forward = forward_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    let defer = defer_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // The signals CMD's library listens to, as its environment sets them.
    let cfg = gpuguard_core::config::Config::from_env()
        .map(|p| p.config)
        .unwrap_or_default();
    let for_gpuguard: Vec<libc::c_int> = [libc::SIGUSR1, libc::SIGUSR2]
        .into_iter()
        .chain(cfg.report_signal)
        .chain(cfg.trim_signal)
        .collect();
    // SAFETY: installing dispositions; the handlers only call kill(2) or set a bit.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        for sig in [libc::SIGTERM, libc::SIGHUP] {
            libc::signal(sig, forward);
        }
        for sig in for_gpuguard {
            libc::signal(sig, defer);
        }
    }
}

/// Passes the report and trim signals received since the last call on to the
/// processes under CMD that use CUDA (to CMD itself when none does yet).
fn pass_on_deferred(child: u32) {
    let bits = DEFERRED.swap(0, Ordering::Relaxed);
    if bits == 0 {
        return;
    }
    let mut targets = cuda_processes_under(child);
    if targets.is_empty() {
        targets.push(child);
    }
    for sig in (1..=64).filter(|s| bits & (1 << (s - 1)) != 0) {
        for pid in &targets {
            // SAFETY: kill(2) with a signal this process was sent.
            unsafe {
                libc::kill(*pid as libc::pid_t, sig);
            }
        }
    }
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

/// The `GPUGUARD_*` variables COMMAND will get (the options' over the
/// environment's), checked as the library will: a bad value in the environment
/// would stop COMMAND at load, so it is refused here, before anything starts.
fn check_environment(vars: &[(&'static str, OsString)]) -> Result<(), Failure> {
    let pairs = vars
        .iter()
        .map(|(k, v)| (OsString::from(k), v.clone()))
        .chain(std::env::vars_os().filter(|(k, _)| k != LIB_VAR));
    Config::parse_os(pairs).map(|_| ()).map_err(|e| {
        Failure::Input(format!(
            "{} (set in the environment; the library would stop COMMAND at load)",
            clean(&e.to_string())
        ))
    })
}

pub fn main(args: RunArgs) -> Outcome {
    let vars = checked_vars(&args)?;
    check_environment(&vars)?;
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
    check_dir(&dir, args.dir.is_some())?;
    // Reports are matched by pid and by time: a second of slack for clocks that tick
    // coarsely, far less than any pid takes to come round again.
    let start_ms = unix_ms(SystemTime::now()).saturating_sub(1000);
    // Reports already in the folder are another run's, however recent (a run that
    // ended a moment ago falls within the second of slack).
    let before = report_names(&dir);
    let mut child = Command::new(program)
        .args(rest)
        .env("LD_PRELOAD", preload)
        // The library reads every GPUGUARD_ variable; this one is the command's.
        .env_remove(LIB_VAR)
        .envs(vars)
        // The folder read here, as an absolute path: a library resolves a relative
        // one (or, unset, its working directory) from wherever its process starts,
        // and `sh -c 'cd exp && python train.py'` starts it elsewhere.
        .env(
            "GPUGUARD_DIR",
            std::path::absolute(&dir).unwrap_or_else(|_| dir.clone()),
        )
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
        pass_on_deferred(pid);
        watch.look(&dir);
        std::thread::sleep(POLL);
    };
    CHILD.store(0, Ordering::Relaxed);
    let code = status.map_or(1, shell_status);
    let signal = status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s));
    let reports = reports_of(&dir, &before, &watch.foreign, start_ms);
    print_err(&summary(
        &program.to_string_lossy(),
        pid,
        code,
        signal,
        &dir,
        args.trace.as_deref(),
        &reports,
    ));
    Ok(code)
}

/// Whether a file name is a report's: `gpuguard.*.json` (a reason given through the
/// C API may hold dots, so the name is not always split back into its parts).
fn is_report_name(name: &str) -> bool {
    name.starts_with("gpuguard.") && name.ends_with(".json")
}

/// The names of the report files in `dir`.
fn report_names(dir: &Path) -> HashSet<OsString> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_str().is_some_and(is_report_name))
        .collect()
}

/// The reports in `dir` written since the start, but for those already there
/// (`before`) and those of processes seen running outside CMD's tree.
fn reports_of(
    dir: &Path,
    before: &HashSet<OsString>,
    foreign: &HashSet<u32>,
    start_ms: u64,
) -> Vec<(PathBuf, Report)> {
    let mut found: Vec<(PathBuf, Report)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| !before.contains(&e.file_name()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            if !is_report_name(&name) {
                return None;
            }
            if report_name_parts(&name).is_some_and(|(pid, _, _)| foreign.contains(&pid)) {
                return None;
            }
            // Reports from before the run are not read at all.
            let modified = e.metadata().ok()?.modified().ok()?;
            if unix_ms(modified) < start_ms {
                return None;
            }
            let report = load_keeping(&e.path(), 0).ok()?;
            (report.time_unix_ms >= start_ms && !foreign.contains(&report.pid))
                .then(|| (e.path(), report))
        })
        .collect();
    found.sort_by_key(|(_, r)| (r.pid, r.seq));
    found
}

/// A few lines on stderr: memory per device, the leaking lines, caps hit, trims.
fn summary(
    program: &str,
    pid: u32,
    code: u8,
    signal: Option<i32>,
    dir: &Path,
    trace: Option<&Path>,
    reports: &[(PathBuf, Report)],
) -> String {
    let mut out = String::new();
    let ended = match signal {
        Some(sig) => format!("was ended by {} (status {code})", signal_name(sig)),
        None => format!("ended with status {code}"),
    };
    put!(
        out,
        "\ngpuguard run: {} (pid {pid}) {ended}; {} in {}",
        clean(program),
        count(reports.len() as u64, "report"),
        place(dir)
    );
    if reports.is_empty() {
        match signal {
            Some(sig) => put!(
                out,
                "  (no process of it wrote a report: {} ended it before it exited; \
                 GPUGUARD_SNAPSHOT_EVERY=60s writes reports while it runs)",
                signal_name(sig)
            ),
            // A process that allocates no CUDA memory writes no report unless asked.
            None => put!(
                out,
                "  (no process of it wrote a report: a process writes one once it \
                 allocates CUDA memory, or when asked; did it allocate any?)"
            ),
        }
        return out;
    }
    // Each process's exit report holds its figures at the end, else its latest
    // (a report written after the exit report, by a trim the exit cut short, does
    // not replace it).
    let mut latest: BTreeMap<u32, &Report> = BTreeMap::new();
    for (_, r) in reports {
        let slot = latest.entry(r.pid).or_insert(r);
        let exit = |r: &Report| r.reason == "exit";
        if (exit(r), r.seq) > (exit(slot), slot.seq) {
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
                "  {} (pid {}{}) device {}: peak {}, live {when} {} in {}{}",
                clean(&r.program),
                r.pid,
                rank_words(r),
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
        if let Some(line) = pinned_line(r) {
            put!(out, "  {} (pid {}) {line}", clean(&r.program), r.pid);
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
    render_oom_lines(&mut out, reports);
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
    // A FIFO or device there is not a trace: the library refused it and said why.
    if let Some(trace) = trace.filter(|t| !gpuguard_core::regular_file::is_regular(t)) {
        put!(
            out,
            "  no trace was written to {} (a library that does not write traces says so above)",
            shown(trace)
        );
    }
    put!(
        out,
        "  details: gpuguard show {}",
        show_patterns(dir, reports)
    );
    out
}

/// One line per process the driver refused memory: its first `oom` report's refused
/// call, how many refusals and reports, and the suggestion.
fn render_oom_lines(out: &mut String, reports: &[(PathBuf, Report)]) {
    let mut by_pid: BTreeMap<u32, Vec<&Report>> = BTreeMap::new();
    for (_, r) in reports.iter().filter(|(_, r)| r.oom.is_some()) {
        by_pid.entry(r.pid).or_default().push(r);
    }
    for group in by_pid.values_mut() {
        group.sort_by_key(|r| r.seq);
        let first = group[0];
        let Some(o) = &first.oom else { continue };
        let refusals = group
            .iter()
            .filter_map(|r| r.oom.as_ref().map(|o| o.refusals))
            .max()
            .unwrap_or(1);
        put!(
            out,
            "  out of memory: {} (pid {}) device {}: {} of {} refused by the driver ({}, {}); {}",
            clean(&first.program),
            first.pid,
            o.device,
            clean(&o.api),
            human_bytes(o.bytes),
            count(refusals, "refusal"),
            count(group.len() as u64, "oom report"),
            clean(&o.suggestion)
        );
    }
}

/// `SIGKILL`, `SIGTERM`, ...; `signal 40` for one without a name here.
fn signal_name(sig: i32) -> String {
    const NAMES: &[(i32, &str)] = &[
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGILL, "SIGILL"),
        (libc::SIGTRAP, "SIGTRAP"),
        (libc::SIGABRT, "SIGABRT"),
        (libc::SIGBUS, "SIGBUS"),
        (libc::SIGFPE, "SIGFPE"),
        (libc::SIGKILL, "SIGKILL"),
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGPIPE, "SIGPIPE"),
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGXCPU, "SIGXCPU"),
        (libc::SIGXFSZ, "SIGXFSZ"),
    ];
    NAMES
        .iter()
        .find(|(n, _)| *n == sig)
        .map_or_else(|| format!("signal {sig}"), |(_, name)| name.to_string())
}

/// Where reports went, for the summary's first line.
fn place(dir: &Path) -> String {
    if dir == Path::new(".") {
        "the working directory".into()
    } else {
        shown(dir)
    }
}

/// A word for a shell: as it is when it holds nothing a shell reads specially,
/// else in single quotes.
fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./+:,@%=".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// Most processes named in the `details:` line; past it, one pattern for the folder.
const PATTERNS_NAMED: usize = 4;

/// Shell patterns for this run's reports, one per process
/// (`DIR/gpuguard.prog.123.*.json`), so older reports in the folder stay out of
/// `gpuguard show`.
fn show_patterns(dir: &Path, reports: &[(PathBuf, Report)]) -> String {
    let mut prefixes: Vec<String> = Vec::new();
    for (_, r) in reports {
        // The library's name for the report less `<seq>.<reason>.json`.
        let name = file_name(&r.program, r.rank, r.pid, 0, "x");
        let prefix = name.strip_suffix("0.x.json").unwrap_or(&name).to_string();
        if !prefixes.contains(&prefix) {
            prefixes.push(prefix);
        }
    }
    if prefixes.is_empty() || prefixes.len() > PATTERNS_NAMED {
        prefixes = vec!["gpuguard.".into()];
    }
    let folder = if dir == Path::new(".") {
        String::new()
    } else {
        format!("{}/", dir.display())
    };
    let patterns: Vec<String> = prefixes
        .iter()
        .map(|p| format!("{}*.json", shell_word(&format!("{folder}{p}"))))
        .collect();
    clean(&patterns.join(" ")).into_owned()
}

/// The report folder, checked before COMMAND starts: the summary reads the reports
/// from there, and a library that cannot write there sends them to stderr.
fn check_dir(dir: &Path, from_option: bool) -> Result<(), Failure> {
    let who = if from_option {
        format!("--dir {}", shown(dir))
    } else if dir == Path::new(".") {
        "the working directory".to_string()
    } else {
        format!("GPUGUARD_DIR {}", shown(dir))
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Failure::Input(format!(
                "{who}: not a directory; reports go into a directory"
            )));
        }
        Err(e) => {
            return Err(Failure::Input(format!(
                "{who}: {e}; create the directory first"
            )));
        }
    }
    let Ok(c_dir) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return Ok(());
    };
    // SAFETY: a NUL-terminated path; access(2) only reads it.
    if unsafe { libc::access(c_dir.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(Failure::Input(format!(
            "{who}: reports cannot be written there ({e})"
        )));
    }
    Ok(())
}

/// The lines holding the most live memory at the end, over all processes: Python
/// lines where a report has them, else native call sites.
fn render_leaking_lines(out: &mut String, latest: &BTreeMap<u32, &Report>) {
    let mut lines: Vec<(u64, String, Vec<String>)> = Vec::new();
    for r in latest.values() {
        let py = python_sites(r);
        let sites = if py.is_empty() { native_sites(r) } else { py };
        for s in &sites {
            let mut what = holding(s);
            // With several processes, whose line it is.
            if latest.len() > 1 {
                what.push_str(&format!(" in pid {}", r.pid));
            }
            lines.push((s.live_bytes, what, frames(s.frames)));
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
        // In a Python process the innermost native frames are the interpreter's
        // and ctypes' (libffi); the program's own line is its innermost Python
        // frame.
        let first = site_frames
            .iter()
            .position(|f| f.starts_with("python: "))
            .unwrap_or(0);
        let place: Vec<&str> = site_frames[first..]
            .iter()
            .take(2)
            .map(String::as_str)
            .collect();
        put!(
            out,
            "    {:>11} in {what}: {}",
            human_bytes(*bytes),
            place.join(" <- ")
        );
    }
}
