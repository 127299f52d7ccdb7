//! `gpuguard ps`: every process of this user running gpuguard, from the status files
//! their helper threads keep (`gpuguard_core::status`): a line per process and device
//! with live, peak and cap, the report directory and how old the figures are; then
//! the groups sharing a budget (`gpuguard group` shows one in full). `--json` prints
//! the statuses; `--watch [SECS]` redraws like `top`.

use super::load::shown;
use super::output::{print, warn};
use super::text::clean;
use super::{Failure, Outcome};
use gpuguard_core::group;
use gpuguard_core::report::human_bytes;
use gpuguard_core::status::{self, Status};
use std::io::IsTerminal;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How `ps` shows what it found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Format {
    Table,
    Json,
}

/// What one look at the status directory found. `read_all` removes the files of
/// ended processes, so it is only run in a directory the library itself would use
/// (`status::check_dir`: a real directory of this user, mode 0700); any other is
/// skipped, listing nothing and deleting nothing, with a warning the first time
/// (`warned` remembers it across `--watch` redraws).
/// The statuses in `dir`; `None` when the directory was skipped (said once).
fn look(dir: &Path, warned: &mut bool) -> Result<Option<Vec<Status>>, Failure> {
    let me = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .map_err(|e| Failure::Input(format!("cannot find this process's user: {e}")))?;
    match status::check_dir(dir, me) {
        Ok(()) => {}
        // No status directory: no process has made one yet.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Some(Vec::new())),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            if !*warned {
                *warned = true;
                warn(&format!(
                    "{}; skipped, nothing listed or removed in it",
                    clean(&e.to_string())
                ));
            }
            return Ok(None);
        }
        Err(e) => {
            return Err(Failure::Input(format!(
                "{}: cannot read the status directory: {e}",
                shown(dir)
            )));
        }
    }
    status::read_all(dir).map(Some).map_err(|e| {
        Failure::Input(format!(
            "{}: cannot read the status directory: {e}",
            shown(dir)
        ))
    })
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The table: a line per process and device (a process that has not used a device yet
/// gets one line with dashes).
pub fn render_table(statuses: &[Status], dir: &Path, now_ms: u64) -> String {
    if statuses.is_empty() {
        return format!(
            "no process is running gpuguard (no status files in {})\n",
            shown(dir)
        );
    }
    let mut rows: Vec<[String; 10]> = vec![
        [
            "PID", "PROGRAM", "DEV", "LIVE", "PEAK", "CAP", "POOLS", "REFUSED", "UPDATED",
            "REPORTS",
        ]
        .map(String::from),
    ];
    for s in statuses {
        let age = age(now_ms.saturating_sub(s.updated_unix_ms));
        let program = super::text::printable(&s.program, 24);
        let reports = super::text::printable(&s.report_dir, 200);
        if s.devices.is_empty() {
            rows.push([
                s.pid.to_string(),
                program,
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                age,
                reports,
            ]);
            continue;
        }
        for d in &s.devices {
            rows.push([
                s.pid.to_string(),
                program.clone(),
                d.device.to_string(),
                human_bytes(d.live_bytes),
                human_bytes(d.peak_bytes),
                d.cap_bytes.map_or("none".into(), human_bytes),
                human_bytes(d.pool_held_bytes),
                refused(d),
                age.clone(),
                reports.clone(),
            ]);
        }
    }
    // Numbers right-aligned, text left-aligned; the last column unpadded.
    let rows: Vec<Vec<String>> = rows.into_iter().map(Vec::from).collect();
    super::text::columns(&rows, &[0, 3, 4, 5, 6])
}

/// Allocations refused on a device: by the driver for lack of memory (`oom`, each
/// with an `oom` report, rate-limited) and by the cap; `-` when none.
fn refused(d: &gpuguard_core::status::DeviceStatus) -> String {
    let mut parts = Vec::new();
    if d.oom_refusals > 0 {
        parts.push(format!("{} oom", d.oom_refusals));
    }
    if d.cap_refusals > 0 {
        parts.push(format!("{} cap", d.cap_refusals));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// `0.4 s ago`, `3 min ago`: how old a status is. Old figures mean a busy or stopped
/// helper thread.
fn age(ms: u64) -> String {
    if ms < 60_000 {
        format!("{:.1} s ago", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{} min ago", ms / 60_000)
    } else {
        format!("{} h ago", ms / 3_600_000)
    }
}

/// One look, rendered.
fn render(dir: &Path, format: Format, warned: &mut bool) -> Result<String, Failure> {
    let Some(statuses) = look(dir, warned)? else {
        return Ok(match format {
            Format::Table => format!("no status files read: {} was skipped\n", shown(dir)),
            Format::Json => "[]\n".into(),
        });
    };
    Ok(match format {
        // Then the groups sharing a budget (`GPUGUARD_GROUP`), whose files are in the
        // same directory; members that are gone are taken out as their status files are.
        Format::Table => {
            render_table(&statuses, dir, now_unix_ms())
                + &group::base_dir_here()
                    .map(|base| super::group::render_summary(&base))
                    .unwrap_or_default()
        }
        // A status file's program and argv come from the process: escaped as `show
        // --json` escapes a report's strings.
        Format::Json => super::json::pretty(&statuses)
            .map_err(|e| Failure::Input(format!("cannot encode the statuses: {e}")))?,
    })
}

/// `gpuguard ps` options.
#[derive(clap::Args)]
#[command(
    after_help = "Each process running gpuguard keeps a status file, rewritten about \
    once a second, in GPUGUARD_STATUS_DIR when set, else $XDG_RUNTIME_DIR/gpuguard, \
    else /dev/shm/gpuguard-UID; files of processes that are gone are removed here. A status \
    directory the library would not use (not a directory of this user with mode 0700) \
    is skipped with a warning: nothing in it is listed or removed. Then a line per \
    group (GPUGUARD_GROUP) and device: its budget, what it uses and its members; \
    gpuguard group NAME shows one in full."
)]
pub struct PsArgs {
    /// Print the processes' statuses as JSON
    #[arg(long)]
    pub json: bool,
    /// Refresh every SECS seconds (1 when no value is given) until Ctrl-C
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "1", value_parser = parse_interval)]
    pub watch: Option<Duration>,
}

/// Prints the processes once, or every `--watch` interval until stdout closes or
/// Ctrl-C (whose default action ends the process: nothing here needs restoring, the
/// terminal is only ever cleared).
pub fn main(args: PsArgs) -> Outcome {
    let dir = status::status_dir_here()
        .map_err(|e| Failure::Input(format!("cannot find the status directory: {e}")))?;
    let format = if args.json {
        Format::Json
    } else {
        Format::Table
    };
    let mut warned = false;
    let Some(every) = args.watch else {
        print(&render(&dir, format, &mut warned)?)?;
        return Ok(0);
    };
    let terminal = std::io::stdout().is_terminal();
    loop {
        let mut text = render(&dir, format, &mut warned)?;
        if terminal {
            // Home and clear, then the table under a heading like top's.
            text = format!(
                "\x1b[H\x1b[2Jgpuguard ps, every {} s (Ctrl-C to stop)\n\n{text}",
                trim_secs(every)
            );
        } else {
            text.push('\n');
        }
        // A closed stdout (`gpuguard ps --watch | head`) ends the loop here.
        print(&text)?;
        std::thread::sleep(every);
    }
}

fn trim_secs(d: Duration) -> String {
    let s = format!("{:.1}", d.as_secs_f64());
    s.trim_end_matches(".0").to_string()
}

/// `--watch SECS`: a positive number of seconds, at least 0.1.
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    match text.parse::<f64>() {
        Ok(s) if (0.1..=86_400.0).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => Err(format!(
            "--watch {text:?}: give the seconds between refreshes, from 0.1 to 86400"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuguard_core::status::DeviceStatus;

    #[test]
    fn table_has_a_line_per_device() {
        let s = Status {
            pid: 77,
            program: "train\u{1b}[2J.py".into(),
            report_dir: "/tmp/r".into(),
            updated_unix_ms: 10_000,
            devices: vec![
                DeviceStatus {
                    device: 0,
                    live_bytes: 3 << 30,
                    peak_bytes: 4 << 30,
                    cap_bytes: Some(8 << 30),
                    pool_held_bytes: 0,
                    oom_refusals: 2,
                    cap_refusals: 1,
                    ..Default::default()
                },
                DeviceStatus {
                    device: 1,
                    live_bytes: 0,
                    peak_bytes: 1 << 20,
                    cap_bytes: None,
                    pool_held_bytes: 0,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let text = render_table(&[s], Path::new("/d"), 12_500);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("PID"));
        let w: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(w[..3], ["77", "train\\x1b[2J.py", "0"]);
        assert!(lines[1].contains("3.0 GiB") && lines[1].contains("8.0 GiB"));
        assert!(lines[1].contains("2.5 s ago") && lines[1].ends_with("/tmp/r"));
        assert!(lines[1].contains("2 oom, 1 cap"), "{text}");
        assert!(lines[2].contains("none"));
        assert!(lines[2].contains("0 B  -  "), "{text}");
        assert!(!text.contains('\u{1b}'));
        assert!(render_table(&[], Path::new("/d"), 0).contains("no process"));
    }

    #[test]
    fn watch_interval() {
        assert_eq!(parse_interval("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_interval("0.5").unwrap(), Duration::from_millis(500));
        for bad in ["0", "-1", "abc", "nan", "1e9"] {
            assert!(parse_interval(bad).is_err(), "{bad}");
        }
    }
}
