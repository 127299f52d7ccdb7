//! `gpuguard trim PID`: send a process running under gpuguard its trim signal, wait
//! for its trim report and print what came back.

use super::load::{load_keeping, shown};
use super::output::print;
use super::show::render_trim;
use super::text::clean;
use super::{Failure, Outcome};
use gpuguard_core::config;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `gpuguard trim` options.
#[derive(clap::Args)]
#[command(
    after_help = "Sends the process its trim signal (GPUGUARD_TRIM_SIGNAL, USR2 by \
    default), waits for the trim report it writes and prints what each mechanism gave back."
)]
pub struct TrimArgs {
    /// A process running under gpuguard, or `gpuguard run` (its command is trimmed)
    #[arg(value_name = "PID", value_parser = parse_pid)]
    pub pid: u32,
    /// Seconds to wait for the trim report (fractions allowed; 0: look once)
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse_timeout, allow_hyphen_values = true)]
    pub timeout: Duration,
}

/// A process id: a whole number from 1 to the largest pid_t.
fn parse_pid(text: &str) -> Result<u32, String> {
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|p| (1..=i32::MAX as u32).contains(p))
        .ok_or_else(|| format!("not a process id: {text:?}"))
}

/// `--timeout SECS`: whole or fractional seconds, 0 (do not wait past the first
/// look) and up; refused when negative, not a number or too large for a duration.
pub fn parse_timeout(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!(
            "{text:?}: the timeout must be a number of seconds, 0 or more"
        ));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{text:?} seconds is too long a timeout"))
}

/// The libraries a process has mapped, from `/proc/PID/maps`.
fn maps(pid: u32) -> Result<String, Failure> {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| {
        Failure::Input(if e.kind() == std::io::ErrorKind::NotFound {
            format!("no process {pid}")
        } else {
            format!("cannot inspect process {pid}: {e}")
        })
    })
}

/// Whether a process is `gpuguard run` (whose pid is the one a user sees first).
fn is_gpuguard_run(pid: u32) -> bool {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    comm.trim_end() == "gpuguard" && cmdline.split(|b| *b == 0).nth(1) == Some(b"run")
}

/// The process to trim: `pid` itself when gpuguard is loaded in it; for the pid of
/// `gpuguard run`, the one process under it that uses CUDA with gpuguard loaded.
fn target(pid: u32) -> Result<u32, Failure> {
    let guarded = |m: &str| m.lines().any(|l| l.contains("libgpuguard"));
    if guarded(&maps(pid)?) {
        return Ok(pid);
    }
    if !is_gpuguard_run(pid) {
        return Err(Failure::Input(format!(
            "process {pid} is not running gpuguard (libgpuguard.so is not loaded in it)"
        )));
    }
    let using_cuda = super::run::cuda_processes_under(pid);
    match using_cuda.as_slice() {
        [one] => Ok(*one),
        [] => Err(Failure::Input(format!(
            "process {pid} is gpuguard run, and no process under it uses CUDA yet"
        ))),
        many => {
            let names: Vec<String> = many
                .iter()
                .map(|p| {
                    let comm =
                        std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
                    format!("{p} ({})", clean(comm.trim_end()))
                })
                .collect();
            Err(Failure::Input(format!(
                "process {pid} is gpuguard run, with several processes using CUDA under it: {}; trim one of them",
                names.join(", ")
            )))
        }
    }
}

pub fn main(args: TrimArgs) -> Outcome {
    let pid = target(args.pid)?;
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    // Its own settings: the trim signal and where its reports go.
    let environ = std::fs::read(proc_dir.join("environ")).map_err(|e| {
        Failure::Input(format!("cannot read the environment of process {pid}: {e}"))
    })?;
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
        .map_err(|e| Failure::Input(format!("process {pid}: {}", clean(&e.to_string()))))?;
    let Some(sig) = cfg.trim_signal else {
        return Err(Failure::Input(format!(
            "process {pid} has its trim signal off (GPUGUARD_TRIM_SIGNAL=none)"
        )));
    };
    let dir = match cfg.dir {
        Some(d) if d.is_absolute() => d,
        d => {
            let cwd = std::fs::read_link(proc_dir.join("cwd")).map_err(|e| {
                Failure::Input(format!("cannot find the directory of process {pid}: {e}"))
            })?;
            d.map_or(cwd.clone(), |d| cwd.join(d))
        }
    };
    let before = trim_reports(&dir, pid);
    // SAFETY: kill(2) with a checked pid and a signal number the process's own
    // settings accepted.
    if unsafe { libc::kill(pid as libc::pid_t, sig) } != 0 {
        return Err(Failure::Input(format!(
            "cannot signal process {pid}: {}",
            std::io::Error::last_os_error()
        )));
    }
    // No deadline when the timeout is beyond what the clock can add.
    let deadline = Instant::now().checked_add(args.timeout);
    loop {
        let new: Vec<PathBuf> = trim_reports(&dir, pid)
            .into_iter()
            .filter(|p| !before.contains(p))
            .collect();
        if let Some(path) = new.last() {
            let r = load_keeping(path, 0)?;
            let mut out = String::new();
            put!(
                out,
                "gpuguard trim: process {pid} ({}), report {}",
                clean(&r.program),
                shown(path)
            );
            if let Some(t) = &r.trim {
                render_trim(&mut out, t);
            }
            print(&out)?;
            return Ok(0);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Failure::Input(format!(
                "process {pid} wrote no trim report in {} within {:.1} s (is it stopped, or is its report directory elsewhere?)",
                shown(&dir),
                args.timeout.as_secs_f64()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A report file's name, `gpuguard.<program>[.r<rank>].<pid>.<seq>.<reason>.json`,
/// read from the right (program names may hold dots): (pid, seq, reason).
pub fn report_name_parts(name: &str) -> Option<(u32, u64, &str)> {
    let stem = name.strip_prefix("gpuguard.")?.strip_suffix(".json")?;
    let mut parts = stem.rsplit('.');
    let reason = parts.next()?;
    let seq: u64 = parts.next()?.parse().ok()?;
    let pid: u32 = parts.next()?.parse().ok()?;
    Some((pid, seq, reason))
}

/// The trim reports of one process in a directory, oldest first (by sequence number).
fn trim_reports(dir: &Path, pid: u32) -> Vec<PathBuf> {
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (p, seq, reason) = report_name_parts(&name)?;
            (p == pid && reason == "trim").then(|| (seq, e.path()))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, p)| p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout("0"), Ok(Duration::ZERO));
        assert_eq!(parse_timeout("0.25"), Ok(Duration::from_millis(250)));
        for bad in ["1e20", "NaN", "-1", "inf", "soon", ""] {
            assert!(parse_timeout(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn report_names() {
        assert_eq!(
            report_name_parts("gpuguard.gg.12.3.trim.json"),
            Some((12, 3, "trim"))
        );
        assert_eq!(
            report_name_parts("gpuguard.my.prog.r1.12.3.exit.json"),
            Some((12, 3, "exit"))
        );
        assert_eq!(report_name_parts("gpuguard.gg.x.3.trim.json"), None);
    }
}
