//! The configuration, read once (at load, or at an earlier hook), and gpuguard's log lines on stderr.

use super::sys::write_stderr;
use gpuguard_core::config::Config;
pub(crate) use gpuguard_core::config::LogLevel;
use std::path::PathBuf;
use std::sync::OnceLock;

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
    let cfg = match Config::from_env() {
        Ok(p) => {
            if p.config.log >= LogLevel::Warn {
                for w in &p.warnings {
                    write_stderr(format!("gpuguard[{}]: {w}\n", std::process::id()).as_bytes());
                }
            }
            p.config
        }
        Err(e) => {
            write_stderr(format!("gpuguard[{}]: {e}\n", std::process::id()).as_bytes());
            // SAFETY: stopping before the program starts, as documented.
            unsafe { libc::_exit(2) };
        }
    };
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
    Settings {
        cfg,
        dir,
        ptds_default,
        launch,
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

/// One line on stderr, `gpuguard[<pid>]: ...`, written with one write(2).
pub(crate) fn log(level: LogLevel, args: std::fmt::Arguments<'_>) {
    if level > config().log || level == LogLevel::Off {
        return;
    }
    let line = format!("gpuguard[{}]: {}\n", std::process::id(), args);
    write_stderr(line.as_bytes());
}
