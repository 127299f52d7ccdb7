//! Configuration from `GPUGUARD_*` variables, parsed once when the library loads.
//!
//! Parsing is pure: it takes a lookup function, so the rules are unit-tested without
//! touching the process environment. A malformed value is an error that names the
//! variable, the value and the accepted forms; the loader turns it into exit status 2.

use crate::cap::CapSpec;
use std::fmt;
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
}

impl Default for Config {
    fn default() -> Self {
        Config {
            dir: None,
            log: LogLevel::Warn,
            stack_depth: DEFAULT_STACK_DEPTH,
            report_signal: Some(libc::SIGUSR1),
            cap: CapSpec::default(),
            warn_at: Some(0.8),
            trim_at: None,
            max_live: None,
            snapshot_every_ms: None,
            trim_signal: Some(libc::SIGUSR2),
            trim_interval_ms: 5_000,
            python: true,
            python_recorders: false,
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

/// Every variable this version understands. Anything else starting with `GPUGUARD_`
/// is refused, so a misspelt or newer option is never silently ignored.
pub const KNOWN_VARS: &[&str] = &[
    "GPUGUARD_CAP",
    "GPUGUARD_WARN_AT",
    "GPUGUARD_TRIM_AT",
    "GPUGUARD_DIR",
    "GPUGUARD_LOG",
    "GPUGUARD_STACK_DEPTH",
    "GPUGUARD_REPORT_SIGNAL",
    "GPUGUARD_MAX_LIVE",
    "GPUGUARD_SNAPSHOT_EVERY",
    "GPUGUARD_TRIM_SIGNAL",
    "GPUGUARD_TRIM_INTERVAL",
    "GPUGUARD_PYTHON",
];

impl Config {
    /// Parses the configuration. `vars` lists every `GPUGUARD_*` name present (for the
    /// unknown-variable check); `get` returns a variable's value.
    pub fn parse<'a>(
        vars: impl IntoIterator<Item = &'a str>,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        for name in vars {
            if name.starts_with("GPUGUARD_") && !KNOWN_VARS.contains(&name) {
                return Err(ConfigError {
                    var: name.to_string(),
                    value: get(name).unwrap_or_default(),
                    accepted: format!("only the variables {}", KNOWN_VARS.join(", ")),
                });
            }
        }
        let mut cfg = Config::default();
        if let Some(v) = get("GPUGUARD_DIR") {
            if v.is_empty() {
                return Err(err("GPUGUARD_DIR", &v, "a directory path"));
            }
            cfg.dir = Some(PathBuf::from(v));
        }
        if let Some(v) = get("GPUGUARD_LOG") {
            cfg.log =
                parse_log(&v).ok_or_else(|| err("GPUGUARD_LOG", &v, "off, warn, info, debug"))?;
        }
        if let Some(v) = get("GPUGUARD_STACK_DEPTH") {
            cfg.stack_depth = v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|d| *d <= MAX_STACK_DEPTH)
                .ok_or_else(|| {
                    err(
                        "GPUGUARD_STACK_DEPTH",
                        &v,
                        &format!("a whole number of frames from 0 (off) to {MAX_STACK_DEPTH}"),
                    )
                })?;
        }
        if let Some(v) = get("GPUGUARD_REPORT_SIGNAL") {
            cfg.report_signal = parse_signal(&v).ok_or_else(|| {
                err(
                    "GPUGUARD_REPORT_SIGNAL",
                    &v,
                    "none, a signal name (USR1, SIGUSR2, HUP, RTMIN+3, ...) or number; not KILL, STOP or a fault signal",
                )
            })?;
        }
        if let Some(v) = get("GPUGUARD_TRIM_SIGNAL") {
            cfg.trim_signal = parse_signal(&v).ok_or_else(|| {
                err(
                    "GPUGUARD_TRIM_SIGNAL",
                    &v,
                    "none, a signal name (USR2, SIGUSR1, HUP, RTMIN+3, ...) or number; not KILL, STOP or a fault signal",
                )
            })?;
        }
        if cfg.trim_signal.is_some() && cfg.trim_signal == cfg.report_signal {
            // One signal cannot do both. A signal set explicitly wins over the other's
            // default; two explicit settings that clash are an error.
            match (get("GPUGUARD_REPORT_SIGNAL"), get("GPUGUARD_TRIM_SIGNAL")) {
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
        if let Some(v) = get("GPUGUARD_TRIM_INTERVAL") {
            cfg.trim_interval_ms = parse_interval_ms(&v).and_then(|i| i).ok_or_else(|| {
                err(
                    "GPUGUARD_TRIM_INTERVAL",
                    &v,
                    "an interval with a unit (500ms, 5s, 2m; at least 1ms)",
                )
            })?;
        }
        if let Some(v) = get("GPUGUARD_PYTHON") {
            (cfg.python, cfg.python_recorders) = match v.trim().to_ascii_lowercase().as_str() {
                "on" | "1" | "yes" | "true" => (true, false),
                "lines" => (true, true),
                "off" | "0" | "no" | "false" => (false, false),
                _ => return Err(err("GPUGUARD_PYTHON", &v, "on, lines or off")),
            };
        }
        if let Some(v) = get("GPUGUARD_CAP") {
            cfg.cap =
                CapSpec::parse(&v).ok_or_else(|| err("GPUGUARD_CAP", &v, crate::cap::ACCEPTED))?;
        }
        for (var, slot) in [
            ("GPUGUARD_WARN_AT", &mut cfg.warn_at),
            ("GPUGUARD_TRIM_AT", &mut cfg.trim_at),
        ] {
            if let Some(v) = get(var) {
                *slot = parse_threshold(&v).ok_or_else(|| {
                    err(
                        var,
                        &v,
                        "a fraction of the cap in (0, 1] (0.8 or 80%), or off",
                    )
                })?;
            }
        }
        if let Some(v) = get("GPUGUARD_MAX_LIVE") {
            cfg.max_live = Some(
                v.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| {
                        err(
                            "GPUGUARD_MAX_LIVE",
                            &v,
                            "a whole number of live allocations, 1 or more",
                        )
                    })?,
            );
        }
        if let Some(v) = get("GPUGUARD_SNAPSHOT_EVERY") {
            cfg.snapshot_every_ms = parse_interval_ms(&v).ok_or_else(|| {
                err(
                    "GPUGUARD_SNAPSHOT_EVERY",
                    &v,
                    "an interval with a unit (500ms, 60s, 2m, 1h; at least 1ms), or off",
                )
            })?;
        }
        Ok(cfg)
    }
}

/// `500ms`, `60s`, `1.5s`, `2m`, `1h` or `off`: `Some(None)` for off, `None` when
/// malformed or under a millisecond.
pub fn parse_interval_ms(v: &str) -> Option<Option<u64>> {
    let t = v.trim().to_ascii_lowercase();
    if t == "off" || t == "none" {
        return Some(None);
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "ms" => 1.0,
        "s" => 1e3,
        "m" | "min" => 60e3,
        "h" => 3600e3,
        _ => return None,
    };
    let n: f64 = num.parse().ok()?;
    let ms = (n * scale).round();
    (ms.is_finite() && (1.0..=1e15).contains(&ms)).then_some(Some(ms as u64))
}

/// `0.8`, `80%` or `off`: `Some(None)` for off, `None` when malformed.
fn parse_threshold(v: &str) -> Option<Option<f64>> {
    let t = v.trim().to_ascii_lowercase();
    if t == "off" || t == "none" {
        return Some(None);
    }
    let f = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().ok()? / 100.0,
        None => t.parse::<f64>().ok()?,
    };
    (f > 0.0 && f <= 1.0).then_some(Some(f))
}

fn err(var: &str, value: &str, accepted: &str) -> ConfigError {
    ConfigError {
        var: var.to_string(),
        value: value.to_string(),
        accepted: accepted.to_string(),
    }
}

fn parse_log(v: &str) -> Option<LogLevel> {
    match v.trim().to_ascii_lowercase().as_str() {
        "off" | "none" | "0" => Some(LogLevel::Off),
        "warn" | "warning" => Some(LogLevel::Warn),
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
    ("SYS", libc::SIGSYS),
];

/// Signals a report could never safely ride on: uncatchable, or raised by faults.
const FORBIDDEN_SIGNALS: &[i32] = &[
    libc::SIGKILL,
    libc::SIGSTOP,
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGTRAP,
    libc::SIGABRT,
];

/// `Some(None)` for "none", `Some(Some(n))` for a usable signal, `None` when malformed.
pub fn parse_signal(v: &str) -> Option<Option<i32>> {
    let s = v.trim().to_ascii_uppercase();
    if s == "NONE" || s == "OFF" {
        return Some(None);
    }
    let bare = s.strip_prefix("SIG").unwrap_or(&s);
    let (rtmin, rtmax) = (libc::SIGRTMIN(), libc::SIGRTMAX());
    let num = if let Ok(n) = bare.parse::<i32>() {
        n
    } else if let Some(&(_, n)) = SIGNAL_NAMES.iter().find(|(name, _)| *name == bare) {
        n
    } else if let Some(rest) = bare.strip_prefix("RTMIN") {
        rtmin + parse_offset(rest)?
    } else if let Some(rest) = bare.strip_prefix("RTMAX") {
        rtmax - parse_offset(rest.replacen('-', "+", 1).as_str())?
    } else {
        return None;
    };
    let valid = (1..=rtmax).contains(&num) && !FORBIDDEN_SIGNALS.contains(&num);
    valid.then_some(Some(num))
}

fn parse_offset(rest: &str) -> Option<i32> {
    if rest.is_empty() {
        return Some(0);
    }
    rest.strip_prefix('+')?.parse::<i32>().ok()
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
        for bad in ["", "5", "0s", "0.1ms", "-1s", "5x", "s", "1..2s", "ms5"] {
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
    fn unknown_gpuguard_variables_are_refused() {
        let e = parse(&[("GPUGUARD_CAPP", "1GiB")]).unwrap_err();
        assert_eq!(e.var, "GPUGUARD_CAPP");
        assert!(e.accepted.contains("GPUGUARD_LOG"));
        // Other prefixes are none of gpuguard's business.
        assert!(parse(&[("GPUGUARDX", "1"), ("CUDA_VISIBLE_DEVICES", "0")]).is_ok());
    }

    #[test]
    fn trim_settings() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.trim_signal, Some(libc::SIGUSR2));
        assert_eq!(c.trim_interval_ms, 5_000);
        assert!(c.python && !c.python_recorders);
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
}
