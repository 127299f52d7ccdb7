//! `gpuguard trim PID`: send a process running under gpuguard its trim signal, wait
//! for its trim report and print what came back.

use super::load::{load_keeping, shown};
use super::output::print;
use super::procs::{cuda_processes_under, still_running};
use super::report_name::report_name_parts;
use super::text::clean;
use super::trim_report::render_trim;
use super::{Failure, Outcome};
use gpuguard_core::{config, status};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
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

/// The longest `--timeout`, an hour: a process answers a trim within seconds, and
/// one that is stopped never does; past this a number is a slip (an exponent too
/// many, milliseconds given as seconds).
pub const MAX_TIMEOUT_SECS: f64 = 3600.0;

/// `--timeout SECS`: whole or fractional seconds, 0 (do not wait past the first
/// look) to [`MAX_TIMEOUT_SECS`]; refused when negative, not a number or larger.
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
    if secs > MAX_TIMEOUT_SECS {
        return Err(format!(
            "{text:?}: the timeout is at most {MAX_TIMEOUT_SECS} seconds (an hour)"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
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
    let using_cuda = cuda_processes_under(pid);
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
    let gone = || Failure::Input(format!("no process {pid}"));
    // With the pid, names this process even if the pid is reused while we wait.
    let started = status::process_start_ticks(Path::new("/proc"), pid).ok_or_else(gone)?;
    // Its own settings: the trim signal and where its reports go.
    let environ = std::fs::read(proc_dir.join("environ")).map_err(|e| {
        Failure::Input(format!("cannot read the environment of process {pid}: {e}"))
    })?;
    let env: HashMap<OsString, OsString> = environ
        .split(|b| *b == 0)
        .filter_map(|kv| {
            let at = kv.iter().position(|b| *b == b'=')?;
            let (k, v) = (&kv[..at], &kv[at + 1..]);
            Some((OsStr::from_bytes(k).into(), OsStr::from_bytes(v).into()))
        })
        .collect();
    let cfg = config::Config::parse_os(&env)
        .map_err(|e| Failure::Input(format!("process {pid}: {}", clean(&e.to_string()))))?
        .config;
    let Some(sig) = cfg.trim_signal else {
        return Err(Failure::Input(format!(
            "process {pid} has its trim signal off (GPUGUARD_TRIM_SIGNAL=none)"
        )));
    };
    let dir = report_dir(pid, &proc_dir, &env, cfg.dir)?;
    let before = trim_reports(&dir, pid);
    // SAFETY: kill(2) with a checked pid and a signal number the process's own
    // settings accepted.
    if unsafe { libc::kill(pid as libc::pid_t, sig) } != 0 {
        return Err(Failure::Input(format!(
            "cannot signal process {pid}: {}",
            std::io::Error::last_os_error()
        )));
    }
    let deadline = Instant::now() + args.timeout;
    let new_report = || {
        trim_reports(&dir, pid)
            .into_iter()
            .rfind(|p| !before.contains(p))
    };
    loop {
        if let Some(path) = new_report() {
            return answer(pid, &path);
        }
        if !still_running(pid, started) {
            // It may have written the report as it ended: one last look.
            return match new_report() {
                Some(path) => answer(pid, &path),
                None => Err(Failure::Input(format!(
                    "process {pid} ended without writing a trim report in {}",
                    shown(&dir)
                ))),
            };
        }
        if Instant::now() >= deadline {
            return Err(Failure::Input(format!(
                "process {pid} wrote no trim report in {} within {:.1} s (is it stopped, or is its report directory elsewhere?)",
                shown(&dir),
                args.timeout.as_secs_f64()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Prints the trim report at `path`.
fn answer(pid: u32, path: &Path) -> Outcome {
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
    Ok(0)
}

/// Where process `pid` writes its reports. Its status file says so byte for byte,
/// wherever it has moved since it started (with `GPUGUARD_DIR` unset the reports go
/// to the directory it started in); it is believed only from a status directory the
/// library would use. Without one (gpuguard not active yet, status files off):
/// `GPUGUARD_DIR` as its environment has it, else its current directory.
fn report_dir(
    pid: u32,
    proc_dir: &Path,
    env: &HashMap<OsString, OsString>,
    configured: Option<PathBuf>,
) -> Result<PathBuf, Failure> {
    let owner = std::fs::metadata(proc_dir).map(|m| m.uid()).ok();
    let from_status = owner.and_then(|uid| {
        let dir = status::status_dir(|k| env.get(OsStr::new(k)).cloned(), uid);
        status::check_dir(&dir, uid).ok()?;
        status::read_of(&dir, pid).map(|s| s.report_dir_path())
    });
    let dir = from_status.or(configured);
    match dir {
        Some(d) if d.is_absolute() => Ok(d),
        // Relative: under the directory the process is in now, as its writes resolve it.
        d => {
            let cwd = std::fs::read_link(proc_dir.join("cwd")).map_err(|e| {
                Failure::Input(format!("cannot find the directory of process {pid}: {e}"))
            })?;
            Ok(d.map_or(cwd.clone(), |d| cwd.join(d)))
        }
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
        assert_eq!(parse_timeout("3600"), Ok(Duration::from_secs(3600)));
        for bad in ["1e20", "1e15", "3600.5", "NaN", "-1", "inf", "soon", ""] {
            assert!(parse_timeout(bad).is_err(), "{bad}");
        }
    }
}
