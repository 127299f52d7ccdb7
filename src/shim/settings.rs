//! The configuration, read once (at load, or at an earlier hook), and gpuguard's log lines on stderr.

use super::hot::HOT;
use super::sys::write_stderr;
use gpuguard_core::config::Config;
pub(crate) use gpuguard_core::config::LogLevel;
use gpuguard_core::escape;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering::*};

static CONFIG: OnceLock<Settings> = OnceLock::new();

/// Configuration plus what load time learned about the process.
pub(crate) struct Settings {
    pub cfg: Config,
    pub dir: PathBuf,
    /// `CUDA_API_PER_THREAD_DEFAULT_STREAM` was set: `cuGetProcAddress` default flags
    /// then mean the `_ptsz` variants.
    pub ptds_default: bool,
    /// Rank, world size and host of a distributed run, read at load.
    pub launch: gpuguard_core::config::Launch,
    /// The fleet labels of the status file (`job`, `pod`, `namespace`,
    /// `GPUGUARD_LABELS`), read at load: `gpuguard_core::status::labels_from_env`.
    pub labels: std::collections::BTreeMap<String, String>,
    /// What the settings' check noticed without refusing (an unknown variable),
    /// said at activation (`say_warnings`).
    warnings: Vec<String>,
}

/// The settings, read from the environment on first use, whichever path comes first
/// (the constructor, or a hook that another library's constructor reached before
/// gpuguard's ran): both see the same settings.
pub(crate) fn settings() -> &'static Settings {
    CONFIG.get_or_init(from_env)
}

/// The settings from the environment. Malformed settings stop the process before
/// the program starts, as documented.
fn from_env() -> Settings {
    // Values are read as bytes: a report directory keeps its exact name.
    let (cfg, mut warnings) = match Config::from_env() {
        Ok(p) => (p.config, p.warnings),
        Err(e) => {
            let e = e.to_string();
            let line = format!("gpuguard[{}]: {}\n", std::process::id(), escape::clean(&e));
            write_stderr(line.as_bytes());
            // SAFETY: stopping before the program starts, as documented.
            unsafe { libc::_exit(2) };
        }
    };
    publish_hot(&cfg);
    let dir = match &cfg.dir {
        Some(d) => d.clone(),
        None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    };
    let ptds_default = std::env::var_os("CUDA_API_PER_THREAD_DEFAULT_STREAM")
        .is_some_and(|v| v != "0" && !v.is_empty());
    let launch = gpuguard_core::config::Launch::detect(
        |k| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned()),
        hostname,
    );
    let (labels, label_warnings) = gpuguard_core::status::labels_from_env(|k| {
        std::env::var_os(k).map(|v| v.to_string_lossy().into_owned())
    });
    warnings.extend(label_warnings);
    Settings {
        cfg,
        dir,
        ptds_default,
        launch,
        labels,
        warnings,
    }
}

/// Set once the warnings were said; a forked child inherits it, so a process tree
/// says them once per exec.
static WARNINGS_SAID: AtomicBool = AtomicBool::new(false);

/// Says what the settings' check noticed (an unknown `GPUGUARD_*` name), once, when
/// gpuguard activates: a process that never uses CUDA (a shell, `ls`, a launcher)
/// is left exactly as it was, stderr included.
pub(crate) fn say_warnings() {
    if WARNINGS_SAID.swap(true, AcqRel) {
        return;
    }
    for w in &settings().warnings {
        log(LogLevel::Warn, format_args!("{w}"));
    }
}

fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    if unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

pub(crate) fn config() -> &'static Config {
    &settings().cfg
}

pub(crate) fn config_ptds_default() -> bool {
    settings().ptds_default
}

/// One line on stderr, `gpuguard[<pid>]: ...`, written with one write(2). Control
/// characters are escaped: messages carry names and paths from the environment and
/// the program (a variable's name, `GPUGUARD_DIR`), which could hold terminal escape
/// sequences, or a newline that would forge a line.
pub(crate) fn log(level: LogLevel, args: std::fmt::Arguments<'_>) {
    if level > config().log || level == LogLevel::Off {
        return;
    }
    let text = args.to_string();
    let line = format!(
        "gpuguard[{}]: {}\n",
        std::process::id(),
        escape::clean(&text)
    );
    write_stderr(line.as_bytes());
}

/// The stack settings a hook reads at each allocation.
#[derive(Clone, Copy)]
pub(crate) struct Stacks {
    /// Frames kept (0: stacks off).
    pub depth: usize,
    /// Captures a second per thread before sampling (`None`: every stack).
    pub rate: Option<u32>,
}

/// The stack settings, from the hot line (`hot`), where `from_env` copied them: a
/// hook reads that line anyway, and the settings' own lines would be one more wait.
#[inline]
pub(crate) fn stacks() -> Stacks {
    let d = HOT.stack_depth.load(Acquire);
    if d == 0 {
        // Not read yet.
        let c = config();
        return Stacks {
            depth: c.stack_depth,
            rate: c.stack_rate,
        };
    }
    let r = HOT.stack_rate.load(Relaxed);
    Stacks {
        depth: usize::from(d - 1),
        rate: (r != 0).then_some(r),
    }
}

/// Whether the debug log counts the captures (`GPUGUARD_LOG=debug`), from the hot
/// line.
#[inline]
pub(crate) fn counting() -> bool {
    if HOT.stack_depth.load(Acquire) == 0 {
        return config().log >= LogLevel::Debug;
    }
    HOT.counting.load(Relaxed)
}

/// Copies what hooks read of the settings onto the hot line.
fn publish_hot(cfg: &Config) {
    HOT.stack_rate.store(cfg.stack_rate.unwrap_or(0), Relaxed);
    HOT.counting.store(cfg.log >= LogLevel::Debug, Relaxed);
    let depth = cfg.stack_depth.min(gpuguard_core::config::MAX_STACK_DEPTH) as u8;
    HOT.stack_depth.store(depth + 1, Release);
}
