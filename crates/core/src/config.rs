//! Configuration from `GPUGUARD_*` variables, parsed once when the library loads.
//!
//! Parsing is pure: it takes a lookup function, so the rules are unit-tested without
//! touching the process environment. A malformed value is an error that names the
//! variable, the value and the accepted forms; the loader turns it into exit status 2.
//!
//! Why one file of about 620 lines before its tests: each variable's parse rule, its
//! error text and its accepted forms sit side by side, so adding or changing a variable
//! is one place to read.

use crate::cap::CapSpec;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// How much gpuguard says on stderr about itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Off = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

/// Native frames kept per allocation when `GPUGUARD_STACK_DEPTH` is not set.
pub const DEFAULT_STACK_DEPTH: usize = 16;
/// Upper bound on `GPUGUARD_STACK_DEPTH`: deeper stacks cost time and rarely help.
pub const MAX_STACK_DEPTH: usize = 64;

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Where reports go; `None` means the working directory at load time.
    pub dir: Option<PathBuf>,
    pub log: LogLevel,
    pub stack_depth: usize,
    /// Stack captures a second per thread before they are sampled
    /// (`GPUGUARD_STACK_RATE`, see `sampler`); `None` (`all`): every allocation's.
    pub stack_rate: Option<u32>,
    /// Signal number that asks for a report, or `None` when disabled.
    pub report_signal: Option<i32>,
    /// Per-device memory caps (`GPUGUARD_CAP`); empty when none.
    pub cap: CapSpec,
    /// Fraction of a cap whose upward crossing logs a warning; `None` when off.
    pub warn_at: Option<f64>,
    /// Fraction of a cap whose upward crossing trims pools; `None` (the default) off.
    pub trim_at: Option<f64>,
    /// Keep only this many live allocations (the largest) in a report; `None`: all.
    pub max_live: Option<usize>,
    /// Interval of `snapshot` reports, in milliseconds; `None` (the default) off.
    pub snapshot_every_ms: Option<u64>,
    /// Signal number that asks for a trim of framework caches, or `None` when disabled.
    pub trim_signal: Option<i32>,
    /// Least time between two automatic trims (threshold, cap), in milliseconds.
    pub trim_interval_ms: u64,
    /// Whether gpuguard may run its Python side in a Python process (trims of
    /// PyTorch/CuPy caches, cache-or-leak classification, Python frames in sites).
    pub python: bool,
    /// Also turn on the frameworks' own recorders (PyTorch's memory history, a CuPy
    /// memory hook) for block-exact Python lines; they cost the framework time on
    /// every allocation, so they are off unless asked for (`GPUGUARD_PYTHON=lines`).
    pub python_recorders: bool,
    /// Where the helper thread writes the memory timeline (`GPUGUARD_TRACE`); `None`:
    /// no timeline.
    pub trace: Option<PathBuf>,
    /// Interval of the memory line on stderr (`GPUGUARD_LOG_EVERY`), in
    /// milliseconds; `None` (the default) off.
    pub log_every_ms: Option<u64>,
    /// Signals whose default action (ending the process) gpuguard precedes with the
    /// final exit report (`GPUGUARD_FINAL_REPORT_SIGNALS`): SIGTERM, SIGINT, SIGHUP,
    /// SIGABRT by default; empty when off.
    pub final_report_signals: Vec<i32>,
    /// When the driver refuses an allocation for lack of memory, trim the device's
    /// stream-ordered pools and retry the call once, and ask for a full trim
    /// (`GPUGUARD_OOM_TRIM`); off by default.
    pub oom_trim: bool,
    /// The group whose budget this process shares (`GPUGUARD_GROUP`), its budget
    /// per device (`GPUGUARD_GROUP_CAP`, as `GPUGUARD_CAP`; used by the member that
    /// first uses a device), and whether a group file that cannot be used stops the
    /// process (`GPUGUARD_GROUP_ON_ERROR=stop`, the default) or lets it run without
    /// the group (`run`).
    pub group: Option<String>,
    pub group_cap: CapSpec,
    pub group_stop_on_error: bool,
}

/// The signals `GPUGUARD_FINAL_REPORT_SIGNALS` may name, and their short names.
pub const FINAL_REPORT_SIGNALS: [(i32, &str); 4] = [
    (libc::SIGTERM, "TERM"),
    (libc::SIGINT, "INT"),
    (libc::SIGHUP, "HUP"),
    (libc::SIGABRT, "ABRT"),
];

/// `TERM,INT,HUP,ABRT` (any subset, `SIG` prefix and case free), or `none`.
pub fn parse_final_report_signals(v: &str) -> Option<Vec<i32>> {
    let t = v.trim();
    if t.eq_ignore_ascii_case("none") {
        return Some(Vec::new());
    }
    let mut out = Vec::new();
    for word in t.split(',') {
        let w = word.trim().to_ascii_uppercase();
        let w = w.strip_prefix("SIG").unwrap_or(&w);
        let (sig, _) = FINAL_REPORT_SIGNALS.iter().find(|(_, n)| *n == w)?;
        if !out.contains(sig) {
            out.push(*sig);
        }
    }
    Some(out)
}

impl Default for Config {
    fn default() -> Self {
        Config {
            dir: None,
            log: LogLevel::Warn,
            stack_depth: DEFAULT_STACK_DEPTH,
            stack_rate: Some(crate::sampler::DEFAULT_RATE),
            report_signal: Some(libc::SIGUSR1),
            cap: CapSpec::default(),
            group: None,
            group_cap: CapSpec::default(),
            group_stop_on_error: true,
            warn_at: Some(0.8),
            trim_at: None,
            max_live: None,
            snapshot_every_ms: None,
            trim_signal: Some(libc::SIGUSR2),
            trim_interval_ms: 5_000,
            python: true,
            python_recorders: false,
            trace: None,
            log_every_ms: None,
            final_report_signals: FINAL_REPORT_SIGNALS.iter().map(|(s, _)| *s).collect(),
            oom_trim: false,
        }
    }
}

/// A variable gpuguard could not accept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub var: String,
    pub value: String,
    pub accepted: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={:?} is not valid; accepted: {}",
            self.var, self.value, self.accepted
        )
    }
}

/// Every variable this version understands. Any other name starting with `GPUGUARD_`
/// is reported as a warning (with the closest known name) and otherwise ignored: one
/// stray or newer variable must not stop every program of a job.
pub const KNOWN_VARS: &[&str] = &[
    "GPUGUARD_CAP",
    "GPUGUARD_WARN_AT",
    "GPUGUARD_TRIM_AT",
    "GPUGUARD_DIR",
    "GPUGUARD_LOG",
    "GPUGUARD_STACK_DEPTH",
    "GPUGUARD_STACK_RATE",
    "GPUGUARD_REPORT_SIGNAL",
    "GPUGUARD_MAX_LIVE",
    "GPUGUARD_SNAPSHOT_EVERY",
    "GPUGUARD_TRIM_SIGNAL",
    "GPUGUARD_TRIM_INTERVAL",
    "GPUGUARD_PYTHON",
    "GPUGUARD_TRACE",
    "GPUGUARD_LOG_EVERY",
    "GPUGUARD_FINAL_REPORT_SIGNALS",
    "GPUGUARD_LABELS",
    "GPUGUARD_STATUS_DIR",
    "GPUGUARD_OOM_TRIM",
    "GPUGUARD_GROUP",
    "GPUGUARD_GROUP_CAP",
    "GPUGUARD_GROUP_ON_ERROR",
    // The command's own (where `gpuguard` finds the library); the library ignores it,
    // and a shell that exports it for `$(gpuguard lib)` must not get a warning.
    "GPUGUARD_LIB",
];

/// A configuration, and what parsing noticed without refusing it.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    pub config: Config,
    /// One line each, without a prefix or a newline (e.g. an unknown variable, with the
    /// closest known name). The library prints each once, when it activates (its
    /// first CUDA call): a process that never uses CUDA prints nothing.
    pub warnings: Vec<String>,
}

impl Config {
    /// Parses the configuration from `(name, value)` pairs as the process environment
    /// holds them (`std::env::vars_os()`), in order: when a name appears twice the first
    /// counts, as with `getenv`. Names not starting with `GPUGUARD_` are ignored.
    ///
    /// Values are taken as bytes: `GPUGUARD_DIR` is kept exactly (a path need not be
    /// UTF-8); every other variable must be UTF-8 text. A malformed value of a known
    /// variable is an error; an unknown `GPUGUARD_*` name is a warning.
    pub fn parse_os<K, V>(env: impl IntoIterator<Item = (K, V)>) -> Result<Parsed, ConfigError>
    where
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        let mut vars = Vars::default();
        let mut warnings = Vec::new();
        for (name, value) in env {
            let (name, value) = (name.as_ref(), value.as_ref());
            if !name.as_bytes().starts_with(b"GPUGUARD_") {
                continue;
            }
            match KNOWN_VARS.iter().find(|k| name == OsStr::new(k)) {
                Some(&known) => {
                    vars.0.entry(known).or_insert_with(|| value.to_os_string());
                }
                None => {
                    let line = unknown_var_warning(&name.to_string_lossy());
                    if !warnings.contains(&line) {
                        warnings.push(line);
                    }
                }
            }
        }
        let config = Config::from_vars(&vars)?;
        Ok(Parsed { config, warnings })
    }

    /// `parse_os` over this process's environment.
    pub fn from_env() -> Result<Parsed, ConfigError> {
        Config::parse_os(std::env::vars_os())
    }

    /// Parses the configuration from text values. `vars` lists every `GPUGUARD_*` name
    /// present; `get` returns a variable's value. Unknown names are ignored here (see
    /// `parse_os` for the warnings about them, and for paths kept as bytes).
    pub fn parse<'a>(
        vars: impl IntoIterator<Item = &'a str>,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut pairs: Vec<(String, String)> = KNOWN_VARS
            .iter()
            .filter_map(|k| get(k).map(|v| (k.to_string(), v)))
            .collect();
        pairs.extend(
            vars.into_iter()
                .filter(|k| !KNOWN_VARS.contains(k))
                .map(|k| (k.to_string(), String::new())),
        );
        Config::parse_os(pairs).map(|p| p.config)
    }

    fn from_vars(vars: &Vars) -> Result<Config, ConfigError> {
        let mut cfg = Config::default();
        if let Some(v) = vars.0.get("GPUGUARD_DIR") {
            if v.is_empty() {
                return Err(err("GPUGUARD_DIR", "", &accepted("GPUGUARD_DIR")));
            }
            cfg.dir = Some(PathBuf::from(v));
        }
        if let Some(v) = vars.0.get("GPUGUARD_TRACE") {
            if v.is_empty() {
                return Err(err("GPUGUARD_TRACE", "", &accepted("GPUGUARD_TRACE")));
            }
            cfg.trace = Some(PathBuf::from(v));
        }
        if let Some(v) = vars.text("GPUGUARD_LOG_EVERY")? {
            cfg.log_every_ms =
                parse_interval_ms(&v).ok_or_else(|| refuse("GPUGUARD_LOG_EVERY", &v))?;
        }
        if let Some(v) = vars.text("GPUGUARD_LOG")? {
            cfg.log = parse_log(&v).ok_or_else(|| refuse("GPUGUARD_LOG", &v))?;
        }
        if let Some(v) = vars.text("GPUGUARD_STACK_DEPTH")? {
            cfg.stack_depth = parse_count(&v)
                .filter(|d| *d <= MAX_STACK_DEPTH)
                .ok_or_else(|| refuse("GPUGUARD_STACK_DEPTH", &v))?;
        }
        if let Some(v) = vars.text("GPUGUARD_STACK_RATE")? {
            cfg.stack_rate =
                parse_stack_rate(&v).ok_or_else(|| refuse("GPUGUARD_STACK_RATE", &v))?;
        }
        let report_signal = vars.text("GPUGUARD_REPORT_SIGNAL")?;
        if let Some(v) = &report_signal {
            cfg.report_signal =
                parse_signal(v).ok_or_else(|| refuse("GPUGUARD_REPORT_SIGNAL", v))?;
        }
        let trim_signal = vars.text("GPUGUARD_TRIM_SIGNAL")?;
        if let Some(v) = &trim_signal {
            cfg.trim_signal = parse_signal(v).ok_or_else(|| refuse("GPUGUARD_TRIM_SIGNAL", v))?;
        }
        if cfg.trim_signal.is_some() && cfg.trim_signal == cfg.report_signal {
            // One signal cannot do both. A signal set explicitly wins over the other's
            // default; two explicit settings that clash are an error.
            match (report_signal, trim_signal) {
                (Some(_), Some(v)) => {
                    return Err(err(
                        "GPUGUARD_TRIM_SIGNAL",
                        &v,
                        "a signal other than GPUGUARD_REPORT_SIGNAL's",
                    ));
                }
                (Some(_), None) => cfg.trim_signal = None,
                _ => cfg.report_signal = None,
            }
        }
        if let Some(v) = vars.text("GPUGUARD_TRIM_INTERVAL")? {
            cfg.trim_interval_ms = parse_interval_ms(&v)
                .and_then(|i| i)
                .ok_or_else(|| refuse("GPUGUARD_TRIM_INTERVAL", &v))?;
        }
        if let Some(v) = vars.text("GPUGUARD_PYTHON")? {
            // The documented words only: `yes` or `1` would read as on to one person
            // and as a typo to another.
            (cfg.python, cfg.python_recorders) = match v.trim().to_ascii_lowercase().as_str() {
                "on" => (true, false),
                "lines" => (true, true),
                "off" => (false, false),
                _ => return Err(refuse("GPUGUARD_PYTHON", &v)),
            };
        }
        if let Some(v) = vars.text("GPUGUARD_OOM_TRIM")? {
            cfg.oom_trim = match v.trim().to_ascii_lowercase().as_str() {
                "1" | "on" => true,
                "0" | "off" => false,
                _ => return Err(refuse("GPUGUARD_OOM_TRIM", &v)),
            };
        }
        if let Some(v) = vars.text("GPUGUARD_CAP")? {
            cfg.cap = CapSpec::parse(&v).ok_or_else(|| refuse("GPUGUARD_CAP", &v))?;
        }
        if let Some(v) = vars.text("GPUGUARD_GROUP")? {
            let name = v.trim().to_string();
            if !crate::group_name::valid(&name) {
                return Err(refuse("GPUGUARD_GROUP", &v));
            }
            cfg.group = Some(name);
        }
        if let Some(v) = vars.text("GPUGUARD_GROUP_CAP")? {
            cfg.group_cap = CapSpec::parse(&v).ok_or_else(|| refuse("GPUGUARD_GROUP_CAP", &v))?;
        }
        if let Some(v) = vars.text("GPUGUARD_GROUP_ON_ERROR")? {
            cfg.group_stop_on_error = match v.trim().to_ascii_lowercase().as_str() {
                "stop" => true,
                "run" => false,
                _ => return Err(refuse("GPUGUARD_GROUP_ON_ERROR", &v)),
            };
        }
        for (var, slot) in [
            ("GPUGUARD_WARN_AT", &mut cfg.warn_at),
            ("GPUGUARD_TRIM_AT", &mut cfg.trim_at),
        ] {
            if let Some(v) = vars.text(var)? {
                *slot = parse_threshold(&v).ok_or_else(|| refuse(var, &v))?;
            }
        }
        if let Some(v) = vars.text("GPUGUARD_MAX_LIVE")? {
            cfg.max_live = Some(
                parse_count(&v)
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| refuse("GPUGUARD_MAX_LIVE", &v))?,
            );
        }
        if let Some(v) = vars.text("GPUGUARD_SNAPSHOT_EVERY")? {
            cfg.snapshot_every_ms =
                parse_interval_ms(&v).ok_or_else(|| refuse("GPUGUARD_SNAPSHOT_EVERY", &v))?;
        }
        if let Some(v) = vars.text("GPUGUARD_FINAL_REPORT_SIGNALS")? {
            cfg.final_report_signals = parse_final_report_signals(&v)
                .ok_or_else(|| refuse("GPUGUARD_FINAL_REPORT_SIGNALS", &v))?;
        }
        Ok(cfg)
    }
}

/// The known variables present, first value of each, as bytes.
#[derive(Default)]
struct Vars(BTreeMap<&'static str, OsString>);

impl Vars {
    /// A variable's value as text; a value that is not UTF-8 is refused, naming the
    /// variable (only `GPUGUARD_DIR` is taken as bytes).
    fn text(&self, var: &'static str) -> Result<Option<String>, ConfigError> {
        match self.0.get(var) {
            None => Ok(None),
            Some(v) => match v.to_str() {
                Some(t) => Ok(Some(t.to_string())),
                None => Err(err(
                    var,
                    &v.to_string_lossy(),
                    &format!("UTF-8 text: {}", accepted(var)),
                )),
            },
        }
    }
}

/// The error for a malformed `value` of `var`, with what `var` accepts.
fn refuse(var: &str, value: &str) -> ConfigError {
    err(var, value, &accepted(var))
}

/// What each variable accepts, as the error message says it.
fn accepted(var: &str) -> String {
    match var {
        "GPUGUARD_DIR" => "a directory path (any bytes, not empty)".into(),
        "GPUGUARD_TRACE" => "a file path (any bytes, not empty)".into(),
        "GPUGUARD_LOG_EVERY" => {
            "an interval with a unit (200ms, 60s, 5m; at least 1ms), or off".into()
        }
        "GPUGUARD_LOG" => "off, warn, info, debug".into(),
        "GPUGUARD_STACK_DEPTH" => {
            format!("a whole number of frames from 0 (off) to {MAX_STACK_DEPTH}")
        }
        "GPUGUARD_STACK_RATE" => format!(
            "stack captures a second per thread, a whole number from 1 to {MAX_STACK_RATE}, \
             or all"
        ),
        "GPUGUARD_REPORT_SIGNAL" | "GPUGUARD_TRIM_SIGNAL" => accepted_signals(),
        "GPUGUARD_TRIM_INTERVAL" => "an interval with a unit (500ms, 5s, 2m; at least 1ms)".into(),
        "GPUGUARD_PYTHON" => "on, lines or off".into(),
        "GPUGUARD_OOM_TRIM" => "1 or on, 0 or off".into(),
        "GPUGUARD_FINAL_REPORT_SIGNALS" => {
            "a comma list of TERM, INT, HUP, ABRT (the default: all four), or none".into()
        }
        "GPUGUARD_CAP" | "GPUGUARD_GROUP_CAP" => crate::cap::ACCEPTED.into(),
        "GPUGUARD_GROUP" => format!("a group name: {}", crate::group_name::RULE),
        "GPUGUARD_GROUP_ON_ERROR" => "stop or run".into(),
        "GPUGUARD_WARN_AT" | "GPUGUARD_TRIM_AT" => {
            "a fraction of the cap in (0, 1] (0.8 or 80%), or off".into()
        }
        "GPUGUARD_MAX_LIVE" => "a whole number of live allocations, 1 or more".into(),
        "GPUGUARD_SNAPSHOT_EVERY" => {
            "an interval with a unit (500ms, 60s, 2m, 1h; at least 1ms), or off".into()
        }
        _ => String::new(),
    }
}

/// Upper bound on `GPUGUARD_STACK_RATE` (a million captures a second is every
/// allocation of any program; `all` says so plainly).
pub const MAX_STACK_RATE: u32 = 1_000_000;

/// `GPUGUARD_STACK_RATE`: `all` (every allocation's stack) or captures a second.
pub fn parse_stack_rate(v: &str) -> Option<Option<u32>> {
    if v.trim().eq_ignore_ascii_case("all") {
        return Some(None);
    }
    let n = parse_count(v)?;
    (1..=MAX_STACK_RATE as usize)
        .contains(&n)
        .then_some(Some(n as u32))
}

/// A whole number in plain decimal digits (surrounding blanks allowed; no sign), as
/// `GPUGUARD_STACK_DEPTH` and `GPUGUARD_MAX_LIVE` take it.
pub fn parse_count(v: &str) -> Option<usize> {
    let t = v.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

/// The line for a `GPUGUARD_*` name this version does not know: with the closest known
/// name when one is close enough to be a slip of the keyboard.
pub fn unknown_var_warning(name: &str) -> String {
    match closest_known_var(name) {
        Some(known) => format!("unknown variable {name} ignored; did you mean {known}?"),
        None => format!(
            "unknown variable {name} ignored; known: {}",
            KNOWN_VARS.join(", ")
        ),
    }
}

/// The known name nearest to `name` by edit distance (letter case ignored), if within
/// a third of its length after the `GPUGUARD_` prefix, rounded up, e.g.
/// `GPUGUARD_CAPP` -> `GPUGUARD_CAP`, `GPUGUARD_REPORTSIGNAL` -> `GPUGUARD_REPORT_SIGNAL`.
pub fn closest_known_var(name: &str) -> Option<&'static str> {
    let upper = name.to_ascii_uppercase();
    let tail = upper.strip_prefix("GPUGUARD_").unwrap_or(&upper);
    KNOWN_VARS
        .iter()
        .map(|k| {
            let known_tail = &k["GPUGUARD_".len()..];
            (edit_distance(tail, known_tail), known_tail.len(), *k)
        })
        .filter(|&(d, len, _)| d <= len.div_ceil(3))
        .min_by_key(|&(d, _, _)| d)
        .map(|(_, _, k)| k)
}

/// Levenshtein distance over bytes (insertions, deletions, substitutions).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(diag + usize::from(ca != cb));
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// `500ms`, `60s`, `1.5s`, `2m`, `1h` or `off`: `Some(None)` for off, `None` when
/// malformed or under a millisecond. Letter case and blanks are free; the number is
/// plain decimal and the unit one of those four.
pub fn parse_interval_ms(v: &str) -> Option<Option<u64>> {
    let t = v.trim().to_ascii_lowercase();
    if t == "off" {
        return Some(None);
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "ms" => 1.0,
        "s" => 1e3,
        "m" => 60e3,
        "h" => 3600e3,
        _ => return None,
    };
    let n = plain_decimal(num)?;
    let ms = (n * scale).round();
    (ms.is_finite() && (1.0..=1e15).contains(&ms)).then_some(Some(ms as u64))
}

/// `0.8`, `80%` or `off`: `Some(None)` for off, `None` when malformed. The number is
/// plain decimal (no sign, exponent, `inf` or `nan`).
pub fn parse_threshold(v: &str) -> Option<Option<f64>> {
    let t = v.trim().to_ascii_lowercase();
    if t == "off" {
        return Some(None);
    }
    let f = match t.strip_suffix('%') {
        Some(p) => plain_decimal(p.trim())? / 100.0,
        None => plain_decimal(&t)?,
    };
    (f > 0.0 && f <= 1.0).then_some(Some(f))
}

/// A number written with decimal digits and at most one point (`0.8`, `80`, `1.5`,
/// `.5`): what docs/configuration.md shows, and nothing `f64`'s parser takes beside it
/// (`8e-1`, `+0.8`, `inf`).
fn plain_decimal(s: &str) -> Option<f64> {
    let digits = s.bytes().filter(u8::is_ascii_digit).count();
    let points = s.bytes().filter(|&b| b == b'.').count();
    (digits > 0 && points <= 1 && digits + points == s.len())
        .then(|| s.parse().ok())
        .flatten()
}

fn err(var: &str, value: &str, accepted: &str) -> ConfigError {
    ConfigError {
        var: var.to_string(),
        value: value.to_string(),
        accepted: accepted.to_string(),
    }
}

/// `off`, `warn`, `info` or `debug` (letter case and blanks free).
pub fn parse_log(v: &str) -> Option<LogLevel> {
    match v.trim().to_ascii_lowercase().as_str() {
        "off" => Some(LogLevel::Off),
        "warn" => Some(LogLevel::Warn),
        "info" => Some(LogLevel::Info),
        "debug" => Some(LogLevel::Debug),
        _ => None,
    }
}

const SIGNAL_NAMES: &[(&str, i32)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("CHLD", libc::SIGCHLD),
    ("CONT", libc::SIGCONT),
    ("TSTP", libc::SIGTSTP),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("XFSZ", libc::SIGXFSZ),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("IO", libc::SIGIO),
    ("PWR", libc::SIGPWR),
];

/// Signals a report or a trim can never ride on:
/// - `KILL` and `STOP` cannot be caught;
/// - `SEGV`, `BUS`, `FPE`, `ILL`, `TRAP` and `SYS` are raised by the kernel at a
///   faulting instruction or system call: a handler that returns runs it again, and
///   taking them would hide crashes from the program's own crash handler and debuggers;
/// - `ABRT` is raised by `abort()`: the program is dying, and its handler (a crash
///   reporter) must see it.
const FORBIDDEN_SIGNALS: &[(i32, &str)] = &[
    (libc::SIGKILL, "KILL"),
    (libc::SIGSTOP, "STOP"),
    (libc::SIGABRT, "ABRT"),
    (libc::SIGSEGV, "SEGV"),
    (libc::SIGBUS, "BUS"),
    (libc::SIGFPE, "FPE"),
    (libc::SIGILL, "ILL"),
    (libc::SIGTRAP, "TRAP"),
    (libc::SIGSYS, "SYS"),
];

/// The kernel's first real-time signal on Linux (every architecture). The C library
/// keeps those from here up to `SIGRTMIN()` for itself (glibc: 32 and 33, for its
/// threads; `SIGRTMIN()` is then 34): one sent there is not the program's to handle
/// (with glibc, 32 kills the process and 33 is swallowed).
const KERNEL_SIGRTMIN: i32 = 32;

/// The real-time signals as the program sees them: `(SIGRTMIN(), SIGRTMAX())`, asked
/// of the C library (34 and 64 with glibc on Linux).
fn rt_range() -> (i32, i32) {
    (libc::SIGRTMIN(), libc::SIGRTMAX())
}

/// The signal forms accepted, with this process's real-time range.
fn accepted_signals() -> String {
    let (rtmin, rtmax) = rt_range();
    let forbidden: Vec<&str> = FORBIDDEN_SIGNALS.iter().map(|(_, n)| *n).collect();
    let mut text = format!(
        "none, a signal name (USR1, SIGUSR2, HUP, ...), RTMIN+n or RTMAX-n with n from 0 to {span}, \
         or a number from 1 to {last_std} or from {rtmin} (RTMIN) to {rtmax} (RTMAX); not {}",
        forbidden.join(", "),
        span = rtmax - rtmin,
        last_std = KERNEL_SIGRTMIN - 1,
    );
    if rtmin > KERNEL_SIGRTMIN {
        let reserved: Vec<String> = (KERNEL_SIGRTMIN..rtmin).map(|n| n.to_string()).collect();
        text += &format!(" ({} belong to the C library)", reserved.join(" and "));
    }
    text
}

/// Decimal digits without a sign, blanks or a leading zero (`0` itself aside), so
/// `010` is never read as 10 where octal 8 was meant.
fn decimal(s: &str) -> Option<u32> {
    let ok =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if ok { s.parse().ok() } else { None }
}

/// `RTMIN`, `RTMIN+n`, `RTMAX`, `RTMAX-n` (upper case, without `SIG`): `Some(number)`,
/// `Some(None)` when malformed or out of `i32`; `None` when not such a form at all.
fn realtime_form(s: &str) -> Option<Option<i32>> {
    let (rtmin, rtmax) = rt_range();
    let offset = |rest: &str, sign: char| -> Option<i32> {
        if rest.is_empty() {
            return Some(0);
        }
        i32::try_from(decimal(rest.strip_prefix(sign)?)?).ok()
    };
    if let Some(rest) = s.strip_prefix("RTMIN") {
        Some(offset(rest, '+').and_then(|k| rtmin.checked_add(k)))
    } else {
        let rest = s.strip_prefix("RTMAX")?;
        Some(offset(rest, '-').and_then(|k| rtmax.checked_sub(k)))
    }
}

/// `Some(None)` for `none`, `Some(Some(n))` for a signal gpuguard can take, `None`
/// otherwise.
///
/// Forms, any letter case, blanks around allowed: a name with or without `SIG` (`USR1`,
/// `SIGHUP`); `RTMIN`, `RTMIN+n`, `RTMAX`, `RTMAX-n` (with or without `SIG`; `n` in
/// decimal, no sign, blank or leading zero; the result must stay within
/// `RTMIN..=RTMAX`); a decimal number. Accepted numbers are the standard signals 1 to
/// 31 less `FORBIDDEN_SIGNALS`, and `SIGRTMIN()..=SIGRTMAX()`; never 0, a negative,
/// the C library's reserved 32 and 33, or anything past `SIGRTMAX()`.
pub fn parse_signal(v: &str) -> Option<Option<i32>> {
    let s = v.trim().to_ascii_uppercase();
    if s == "NONE" {
        return Some(None);
    }
    let (rtmin, rtmax) = rt_range();
    let num = if s.bytes().all(|b| b.is_ascii_digit()) {
        i32::try_from(decimal(&s)?).ok()?
    } else if let Some(rt) = realtime_form(s.strip_prefix("SIG").unwrap_or(&s)) {
        // An offset form names a real-time signal or nothing: never a standard one.
        return rt.filter(|n| (rtmin..=rtmax).contains(n)).map(Some);
    } else {
        let bare = s.strip_prefix("SIG").unwrap_or(&s);
        let &(_, n) = SIGNAL_NAMES.iter().find(|(name, _)| *name == bare)?;
        n
    };
    let standard =
        (1..KERNEL_SIGRTMIN).contains(&num) && !FORBIDDEN_SIGNALS.iter().any(|(n, _)| *n == num);
    let realtime = (rtmin..=rtmax).contains(&num);
    (standard || realtime).then_some(Some(num))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::parse(pairs.iter().map(|(k, _)| *k), |k| map.get(k).cloned())
    }

    #[test]
    fn defaults_when_nothing_is_set() {
        let c = parse(&[]).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.stack_depth, 16);
        assert_eq!(c.report_signal, Some(libc::SIGUSR1));
        assert_eq!(c.log, LogLevel::Warn);
    }

    #[test]
    fn accepted_values() {
        let c = parse(&[
            ("GPUGUARD_DIR", "/tmp/x"),
            ("GPUGUARD_LOG", "DEBUG"),
            ("GPUGUARD_STACK_DEPTH", "0"),
            ("GPUGUARD_REPORT_SIGNAL", "sigusr2"),
        ])
        .unwrap();
        assert_eq!(c.dir, Some(PathBuf::from("/tmp/x")));
        assert_eq!(c.log, LogLevel::Debug);
        assert_eq!(c.stack_depth, 0);
        assert_eq!(c.report_signal, Some(libc::SIGUSR2));
        // The report signal took the trim signal's default: trims by signal are off.
        assert_eq!(c.trim_signal, None);
        assert_eq!(parse_signal("none"), Some(None));
        assert_eq!(parse_signal("10"), Some(Some(10)));
        assert_eq!(parse_signal("HUP"), Some(Some(libc::SIGHUP)));
        assert_eq!(parse_signal("RTMIN+2"), Some(Some(libc::SIGRTMIN() + 2)));
        assert_eq!(parse_signal("rtmax"), Some(Some(libc::SIGRTMAX())));
        assert_eq!(parse_signal("RTMAX-1"), Some(Some(libc::SIGRTMAX() - 1)));
    }

    #[test]
    fn stack_rate_takes_a_count_or_all() {
        assert_eq!(parse(&[]).unwrap().stack_rate, Some(250));
        let c = parse(&[("GPUGUARD_STACK_RATE", " 1000 ")]).unwrap();
        assert_eq!(c.stack_rate, Some(1000));
        let c = parse(&[("GPUGUARD_STACK_RATE", "ALL")]).unwrap();
        assert_eq!(c.stack_rate, None);
        for bad in ["0", "-5", "1e3", "fast", "", "1000001"] {
            let e = parse(&[("GPUGUARD_STACK_RATE", bad)]).unwrap_err();
            assert_eq!(e.var, "GPUGUARD_STACK_RATE", "{bad}");
            assert!(e.to_string().contains("all"), "{e}");
        }
    }

    #[test]
    fn malformed_values_name_variable_value_and_forms() {
        let e = parse(&[("GPUGUARD_LOG", "loud")]).unwrap_err();
        assert_eq!(e.var, "GPUGUARD_LOG");
        assert_eq!(e.value, "loud");
        let text = e.to_string();
        assert!(text.contains("GPUGUARD_LOG") && text.contains("loud") && text.contains("debug"));

        for bad in ["-1", "abc", "65", "1.5", ""] {
            let e = parse(&[("GPUGUARD_STACK_DEPTH", bad)]).unwrap_err();
            assert_eq!(e.var, "GPUGUARD_STACK_DEPTH", "{bad}");
        }
        for bad in [
            "KILL", "SIGSTOP", "9", "SEGV", "0", "999", "USR3", "RTMIN+x",
        ] {
            assert_eq!(parse_signal(bad), None, "{bad}");
            assert!(parse(&[("GPUGUARD_REPORT_SIGNAL", bad)]).is_err());
        }
        assert!(parse(&[("GPUGUARD_DIR", "")]).is_err());
    }

    #[test]
    fn trace_and_log_every() {
        let c = parse(&[
            ("GPUGUARD_TRACE", "/tmp/t.json"),
            ("GPUGUARD_LOG_EVERY", "200ms"),
        ])
        .unwrap();
        assert_eq!(c.trace, Some(PathBuf::from("/tmp/t.json")));
        assert_eq!(c.log_every_ms, Some(200));
        assert_eq!(
            parse(&[("GPUGUARD_LOG_EVERY", "60s")])
                .unwrap()
                .log_every_ms,
            Some(60_000)
        );
        assert_eq!(
            parse(&[("GPUGUARD_LOG_EVERY", "off")])
                .unwrap()
                .log_every_ms,
            None
        );
        for bad in ["60", "abc", "0ms", "-1s"] {
            let e = parse(&[("GPUGUARD_LOG_EVERY", bad)]).unwrap_err();
            assert_eq!(e.var, "GPUGUARD_LOG_EVERY", "{bad}");
            assert!(e.accepted.contains("200ms"), "{}", e.accepted);
        }
        let e = parse(&[("GPUGUARD_TRACE", "")]).unwrap_err();
        assert_eq!(e.var, "GPUGUARD_TRACE");
    }

    #[test]
    fn caps_and_thresholds() {
        let c = parse(&[
            ("GPUGUARD_CAP", "0:20GiB,1:0.25"),
            ("GPUGUARD_WARN_AT", "90%"),
            ("GPUGUARD_TRIM_AT", "0.7"),
        ])
        .unwrap();
        assert_eq!(c.cap.limit_for(0), Some(crate::cap::Limit::Bytes(20 << 30)));
        assert_eq!(c.warn_at, Some(0.9));
        assert_eq!(c.trim_at, Some(0.7));
        assert_eq!(parse(&[("GPUGUARD_WARN_AT", "off")]).unwrap().warn_at, None);
        for bad in ["abc", "0", "-1", "1.5", "12XB"] {
            let e = parse(&[("GPUGUARD_CAP", bad)]).unwrap_err();
            assert_eq!((e.var.as_str(), e.value.as_str()), ("GPUGUARD_CAP", bad));
            assert!(e.accepted.contains("20GiB"), "{}", e.accepted);
        }
        for bad in ["0", "1.2", "x", "150%"] {
            assert!(parse(&[("GPUGUARD_WARN_AT", bad)]).is_err(), "{bad}");
            assert!(parse(&[("GPUGUARD_TRIM_AT", bad)]).is_err(), "{bad}");
        }
    }

    #[test]
    fn max_live_and_snapshot_interval() {
        let c = parse(&[
            ("GPUGUARD_MAX_LIVE", "5"),
            ("GPUGUARD_SNAPSHOT_EVERY", "500ms"),
        ])
        .unwrap();
        assert_eq!(c.max_live, Some(5));
        assert_eq!(c.snapshot_every_ms, Some(500));
        assert_eq!(parse(&[]).unwrap().max_live, None);
        assert_eq!(parse(&[]).unwrap().snapshot_every_ms, None);
        for (v, ms) in [
            ("60s", Some(60_000)),
            ("2m", Some(120_000)),
            ("1.5s", Some(1500)),
            ("1h", Some(3_600_000)),
            (" 10 ms ", Some(10)),
            ("off", None),
        ] {
            assert_eq!(parse_interval_ms(v), Some(ms), "{v}");
        }
        for bad in [
            "", "5", "0s", "0.1ms", "-1s", "5x", "s", "1..2s", "ms5", "none", "1min", "1e3ms",
        ] {
            assert_eq!(parse_interval_ms(bad), None, "{bad}");
            let e = parse(&[("GPUGUARD_SNAPSHOT_EVERY", bad)]).unwrap_err();
            assert_eq!(e.var, "GPUGUARD_SNAPSHOT_EVERY");
            assert!(e.accepted.contains("500ms"), "{}", e.accepted);
        }
        for bad in ["0", "-1", "x", "1.5", ""] {
            let e = parse(&[("GPUGUARD_MAX_LIVE", bad)]).unwrap_err();
            assert_eq!(
                (e.var.as_str(), e.value.as_str()),
                ("GPUGUARD_MAX_LIVE", bad)
            );
        }
    }

    #[test]
    fn unknown_gpuguard_variables_warn_and_are_ignored() {
        let p = Config::parse_os([
            ("GPUGUARD_CAPP", "1GiB"),
            ("GPUGUARD_LOG", "info"),
            ("GPUGUARD_TYPO", "1"),
            ("GPUGUARD_CAPP", "2GiB"),
            ("GPUGUARDX", "1"),
            ("CUDA_VISIBLE_DEVICES", "0"),
            // The command's variable: known, ignored by the library, no warning.
            ("GPUGUARD_LIB", "/opt/gpuguard/lib/libgpuguard.so"),
        ])
        .unwrap();
        // The known variable still counts; nothing of the unknown one is taken.
        assert_eq!(p.config.log, LogLevel::Info);
        assert!(p.config.cap.is_empty());
        // One line per unknown name, however often it appears; other prefixes are
        // none of gpuguard's business.
        assert_eq!(p.warnings.len(), 2, "{:?}", p.warnings);
        assert_eq!(
            p.warnings[0],
            "unknown variable GPUGUARD_CAPP ignored; did you mean GPUGUARD_CAP?"
        );
        assert!(
            p.warnings[1].starts_with("unknown variable GPUGUARD_TYPO ignored; known: ")
                && p.warnings[1].contains("GPUGUARD_REPORT_SIGNAL"),
            "{}",
            p.warnings[1]
        );
        // The text entry point takes them without a word and without failing.
        assert!(parse(&[("GPUGUARD_CAPP", "1GiB"), ("GPUGUARDX", "1")]).is_ok());
    }

    #[test]
    fn closest_names() {
        for (typo, want) in [
            ("GPUGUARD_CAPP", Some("GPUGUARD_CAP")),
            ("GPUGUARD_cap", Some("GPUGUARD_CAP")),
            ("GPUGUARD_LGO", None), // two edits from a three-letter name: too far
            ("GPUGUARD_LOGS", Some("GPUGUARD_LOG")),
            ("GPUGUARD_REPORTSIGNAL", Some("GPUGUARD_REPORT_SIGNAL")),
            ("GPUGUARD_SNAPSHOT_EVRY", Some("GPUGUARD_SNAPSHOT_EVERY")),
            ("GPUGUARD_STACKDEPTH", Some("GPUGUARD_STACK_DEPTH")),
            ("GPUGUARD_TRIM_SIGNL", Some("GPUGUARD_TRIM_SIGNAL")),
            ("GPUGUARD_WARN", Some("GPUGUARD_WARN_AT")),
            ("GPUGUARD_TYPO", None),
            ("GPUGUARD_", None),
            ("GPUGUARD_TRACE", Some("GPUGUARD_TRACE")),
            ("GPUGUARD_LOG_EVRY", Some("GPUGUARD_LOG_EVERY")),
        ] {
            assert_eq!(closest_known_var(typo), want, "{typo}");
        }
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("abc", "abc"), 0);
    }

    #[test]
    fn values_are_bytes() {
        use std::os::unix::ffi::OsStringExt;
        // A directory whose name is not UTF-8 is kept byte for byte.
        let dir = OsString::from_vec(b"/tmp/r\xe9ports/\xff".to_vec());
        let p = Config::parse_os([(OsString::from("GPUGUARD_DIR"), dir.clone())]).unwrap();
        assert_eq!(p.config.dir.unwrap().into_os_string(), dir);
        // Any other variable must be text: the error names it.
        let bad = OsString::from_vec(b"deb\xffug".to_vec());
        let e = Config::parse_os([(OsString::from("GPUGUARD_LOG"), bad)]).unwrap_err();
        assert_eq!(e.var, "GPUGUARD_LOG");
        assert!(e.accepted.starts_with("UTF-8 text"), "{}", e.accepted);
        assert!(e.to_string().starts_with("GPUGUARD_LOG="), "{e}");
        // A name that is not UTF-8 is an unknown variable, named as well as it can be.
        let name = OsString::from_vec(b"GPUGUARD_\xffX".to_vec());
        let p = Config::parse_os([(name, OsString::from("1"))]).unwrap();
        assert_eq!(p.warnings.len(), 1);
        assert!(p.warnings[0].starts_with("unknown variable GPUGUARD_"));
        // The first of two same-named variables counts, as with getenv.
        let p = Config::parse_os([("GPUGUARD_LOG", "info"), ("GPUGUARD_LOG", "loud")]).unwrap();
        assert_eq!(p.config.log, LogLevel::Info);
    }

    #[test]
    fn signals_that_cannot_be_handled_are_refused() {
        let (rtmin, rtmax) = (libc::SIGRTMIN(), libc::SIGRTMAX());
        // glibc on Linux: 32 and 33 are its own, the program's range is 34..=64.
        assert_eq!((rtmin, rtmax), (34, 64));
        for bad in [
            "32",
            "33",
            "65",
            "0",
            "-1",
            "-10",
            "+10",
            "010",
            "2147483648",
            "9",
            "19",
            "KILL",
            "SIGSTOP",
            "SEGV",
            "SIGBUS",
            "FPE",
            "ILL",
            "TRAP",
            "ABRT",
            "SYS",
            "6",
            "11",
            "31",
            "SIG10",
            "RTMAX+1",
            "RTMIN+-1",
            "RTMIN-1",
            "RTMIN+ 3",
            "RTMIN +3",
            "RTMIN+03",
            "RTMIN+31",
            "RTMAX-31",
            "RTMIN+4294967296",
            "RTMAX--1",
            "RTMAX+0",
            "RTMIN-0",
            "RTMIN+",
            "RTMAX-",
            "RTMIN3",
            "RT",
            "",
            "SIG",
            "USR1 USR2",
        ] {
            assert_eq!(parse_signal(bad), None, "{bad}");
            let e = parse(&[("GPUGUARD_REPORT_SIGNAL", bad)]).unwrap_err();
            assert_eq!(
                (e.var.as_str(), e.value.as_str()),
                ("GPUGUARD_REPORT_SIGNAL", bad)
            );
            let e = parse(&[("GPUGUARD_TRIM_SIGNAL", bad)]).unwrap_err();
            assert_eq!(e.var, "GPUGUARD_TRIM_SIGNAL");
        }
        for (good, n) in [
            ("34", 34),
            ("64", 64),
            ("1", 1),
            ("30", 30),
            (" 10 ", 10),
            ("RTMIN", rtmin),
            ("sigrtmin+0", rtmin),
            ("RTMIN+1", rtmin + 1),
            ("RTMIN+30", rtmax),
            ("RTMAX", rtmax),
            ("RTMAX-0", rtmax),
            ("RTMAX-30", rtmin),
            ("SIGRTMAX-2", rtmax - 2),
            ("term", libc::SIGTERM),
            ("SIGCHLD", libc::SIGCHLD),
        ] {
            assert_eq!(parse_signal(good), Some(Some(n)), "{good}");
        }
        // The message gives the range in force.
        let e = parse(&[("GPUGUARD_REPORT_SIGNAL", "RTMAX+1")]).unwrap_err();
        let text = e.to_string();
        for part in [
            "from 0 to 30",
            "from 34 (RTMIN) to 64 (RTMAX)",
            "32 and 33",
            "ABRT",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
    }

    #[test]
    fn oom_trim_is_off_unless_asked() {
        assert!(!parse(&[]).unwrap().oom_trim);
        for on in ["1", "on", " ON "] {
            assert!(
                parse(&[("GPUGUARD_OOM_TRIM", on)]).unwrap().oom_trim,
                "{on}"
            );
        }
        for off in ["0", "off"] {
            assert!(
                !parse(&[("GPUGUARD_OOM_TRIM", off)]).unwrap().oom_trim,
                "{off}"
            );
        }
        for bad in ["yes", "2", ""] {
            let e = parse(&[("GPUGUARD_OOM_TRIM", bad)]).unwrap_err();
            assert_eq!(e.accepted, "1 or on, 0 or off", "{bad}");
        }
    }

    #[test]
    fn trim_settings() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.trim_signal, Some(libc::SIGUSR2));
        assert_eq!(c.trim_interval_ms, 5_000);
        assert!(c.python && !c.python_recorders);
        // Only the documented words.
        for bad in ["yes", "true", "1", "no", "false", "0", ""] {
            let e = parse(&[("GPUGUARD_PYTHON", bad)]).unwrap_err();
            assert_eq!((e.var.as_str(), e.value.as_str()), ("GPUGUARD_PYTHON", bad));
            assert_eq!(e.accepted, "on, lines or off");
        }
        for bad in ["none", "8e-1", "+0.8", "inf", "nan", "0.8.1", "80 %%"] {
            assert_eq!(parse_threshold(bad), None, "{bad}");
        }
        assert_eq!(parse_threshold(".5"), Some(Some(0.5)));
        assert_eq!(parse_final_report_signals("off"), None);
        assert!(
            parse(&[("GPUGUARD_PYTHON", "lines")])
                .unwrap()
                .python_recorders
        );
        let c = parse(&[
            ("GPUGUARD_TRIM_SIGNAL", "hup"),
            ("GPUGUARD_TRIM_INTERVAL", "250ms"),
            ("GPUGUARD_PYTHON", "off"),
        ])
        .unwrap();
        assert_eq!(c.trim_signal, Some(libc::SIGHUP));
        assert_eq!(c.trim_interval_ms, 250);
        assert!(!c.python);
        assert_eq!(
            parse(&[("GPUGUARD_TRIM_SIGNAL", "none")])
                .unwrap()
                .trim_signal,
            None
        );
        // An explicit trim signal on the report signal's default takes it over.
        let c = parse(&[("GPUGUARD_TRIM_SIGNAL", "USR1")]).unwrap();
        assert_eq!(
            (c.trim_signal, c.report_signal),
            (Some(libc::SIGUSR1), None)
        );
        for bad in [
            &[("GPUGUARD_TRIM_SIGNAL", "KILL")][..],
            &[
                ("GPUGUARD_TRIM_SIGNAL", "USR1"),
                ("GPUGUARD_REPORT_SIGNAL", "USR1"),
            ][..],
            &[("GPUGUARD_TRIM_INTERVAL", "off")][..],
            &[("GPUGUARD_TRIM_INTERVAL", "5")][..],
            &[("GPUGUARD_PYTHON", "maybe")][..],
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.var, bad[0].0, "{bad:?}");
        }
    }
}

/// Where this process sits in a distributed run, from its launcher's variables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Launch {
    pub rank: Option<u64>,
    pub local_rank: Option<u64>,
    pub world_size: Option<u64>,
    /// This machine's name; set only when a rank is known.
    pub host: Option<String>,
}

/// Each launcher's (rank, local rank, world size) variables, most specific first:
/// torchrun's ranks are per process even under Slurm or MPI.
const LAUNCHERS: &[(&str, Option<&str>, &str)] = &[
    ("RANK", Some("LOCAL_RANK"), "WORLD_SIZE"),
    (
        "OMPI_COMM_WORLD_RANK",
        Some("OMPI_COMM_WORLD_LOCAL_RANK"),
        "OMPI_COMM_WORLD_SIZE",
    ),
    ("SLURM_PROCID", Some("SLURM_LOCALID"), "SLURM_NTASKS"),
    ("PMI_RANK", None, "PMI_SIZE"),
];

impl Launch {
    /// The first launcher whose rank variable holds a whole number gives every field;
    /// none: all `None`. `hostname` is asked only when a rank is known.
    pub fn detect(
        get: impl Fn(&str) -> Option<String>,
        hostname: impl FnOnce() -> Option<String>,
    ) -> Launch {
        let num = |k: &str| get(k).and_then(|v| v.trim().parse::<u64>().ok());
        for &(rank, local, size) in LAUNCHERS {
            if let Some(r) = num(rank) {
                return Launch {
                    rank: Some(r),
                    local_rank: local.and_then(num),
                    world_size: num(size),
                    host: hostname().filter(|h| !h.is_empty()),
                };
            }
        }
        Launch::default()
    }
}

#[cfg(test)]
mod launch_tests {
    use super::*;

    fn detect(pairs: &[(&str, &str)]) -> Launch {
        Launch::detect(
            |k| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            },
            || Some("node7".into()),
        )
    }

    #[test]
    fn launchers() {
        assert_eq!(detect(&[]), Launch::default());
        assert_eq!(detect(&[("LOCAL_RANK", "1")]), Launch::default());
        let t = detect(&[("RANK", "3"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "8")]);
        assert_eq!(
            t,
            Launch {
                rank: Some(3),
                local_rank: Some(1),
                world_size: Some(8),
                host: Some("node7".into())
            }
        );
        let s = detect(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS", "6"),
        ]);
        assert_eq!(
            (s.rank, s.local_rank, s.world_size),
            (Some(5), Some(0), Some(6))
        );
        let o = detect(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("SLURM_PROCID", "0"),
        ]);
        assert_eq!(
            (o.rank, o.local_rank, o.world_size),
            (Some(2), Some(2), Some(4))
        );
        let p = detect(&[("PMI_RANK", "1"), ("PMI_SIZE", "2")]);
        assert_eq!(
            (p.rank, p.local_rank, p.world_size),
            (Some(1), None, Some(2))
        );
        // torchrun under Slurm: torchrun's per-process rank wins.
        let both = detect(&[("SLURM_PROCID", "0"), ("RANK", "9")]);
        assert_eq!(both.rank, Some(9));
        // A malformed rank is not a rank.
        assert_eq!(detect(&[("RANK", "x")]), Launch::default());
    }

    #[test]
    fn final_report_signals_parse() {
        assert_eq!(
            Config::default().final_report_signals,
            vec![libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGABRT]
        );
        assert_eq!(
            parse_final_report_signals("abrt"),
            Some(vec![libc::SIGABRT])
        );
        assert_eq!(parse_final_report_signals("none"), Some(vec![]));
        assert_eq!(
            parse_final_report_signals("sigterm, HUP,TERM"),
            Some(vec![libc::SIGTERM, libc::SIGHUP])
        );
        assert_eq!(parse_final_report_signals("USR1"), None);
        assert_eq!(parse_final_report_signals(""), None);
    }
}
