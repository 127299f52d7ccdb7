//! The configuration, read once at load, and gpuguard's log lines on stderr.

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

pub(crate) fn settings() -> &'static Settings {
    CONFIG.get_or_init(|| Settings {
        cfg: Config::default(),
        dir: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
        ptds_default: false,
        launch: Default::default(),
    })
}

pub(crate) fn config() -> &'static Config {
    &settings().cfg
}

pub(crate) fn config_ptds_default() -> bool {
    settings().ptds_default
}

/// Keeps what load time read; the first call wins.
pub(crate) fn install(settings: Settings) {
    let _ = CONFIG.set(settings);
}

/// One line on stderr, `gpuguard[<pid>]: ...`, written with one write(2).
pub(crate) fn log(level: LogLevel, args: std::fmt::Arguments<'_>) {
    if level > config().log || level == LogLevel::Off {
        return;
    }
    let line = format!("gpuguard[{}]: {}\n", std::process::id(), args);
    write_stderr(line.as_bytes());
}
