//! Reports: built from the books, symbolized, written atomically to the report
//! directory (or to stderr when it cannot be written), with one line on stderr.
//! Whoever asks for one supplies the frameworks' account, if it has one.

use super::books::{Books, Denial};
use super::settings::{LogLevel, log, settings};
use super::state::{active_books, shielded};
use super::symbolize::{Tables, symbolize};
use super::sys::{self, write_stderr};
use super::{capture, endings, events, fault, oom, table};
use gpuguard_core::classify::Answer;
use gpuguard_core::report::{ReportConfig, TrimReport, human_bytes};
use gpuguard_core::reporter::{self, FrameInfo, ReportInput};
use std::cell::RefCell;
use std::ffi::c_int;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::*};

static DIR_WARNED: AtomicBool = AtomicBool::new(false);

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What some reports carry beyond the books.
#[derive(Default)]
pub(crate) struct Extra {
    pub trim: Option<gpuguard_core::report::TrimReport>,
    /// The signal ending the process, for its final report.
    pub ending: Option<gpuguard_core::report::Ending>,
    /// For a `cap` or `oom` report: the refusal it is written for, as the hook kept
    /// it.
    pub refusal: Option<Denial>,
}

/// Set once the exit report is written (from Python's `atexit` in a Python process,
/// else from the C-level exit handler), so it is written once.
static EXIT_WRITTEN: AtomicBool = AtomicBool::new(false);

/// How long the exit waits for the helper thread to finish what it was asked for.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The exit report, the first time this is asked for in the process, with the
/// frameworks' account `at_exit_answer` gives (what Python's `atexit` handed over).
pub(crate) fn write_exit_report(at_exit_answer: impl FnOnce() -> Option<String>) {
    write_final_report(None, at_exit_answer);
}

/// The exit report, marked with the signal ending the process if one is. Reports
/// already asked for are written first (bounded); none is written after it.
pub(crate) fn write_final_report(
    ending: Option<c_int>,
    at_exit_answer: impl FnOnce() -> Option<String>,
) {
    if active_books().is_none() || EXIT_WRITTEN.load(Acquire) {
        return;
    }
    if !endings::settle(SETTLE_WAIT) && endings::first_to_give_up() {
        log(
            LogLevel::Warn,
            format_args!(
                "the helper thread did not finish the reports asked before exit within {} s; \
                 the exit goes on without waiting for it (at most {} s in all)",
                SETTLE_WAIT.as_secs(),
                endings::EXIT_WAIT.as_secs()
            ),
        );
    }
    if let Some(books) = active_books()
        && !EXIT_WRITTEN.swap(true, AcqRel)
    {
        if !books.allocated_any() {
            // A process that only asked the driver about devices (a framework's
            // compile worker): its report would have no device and nothing live.
            log(
                LogLevel::Info,
                format_args!(
                    "no exit report: this process allocated no CUDA memory \
                     (a report signal or gpuguard_write_report still writes one)"
                ),
            );
            return;
        }
        let extra = Extra {
            ending: ending.map(|signal| gpuguard_core::report::Ending {
                signal,
                name: endings::name(signal).to_string(),
            }),
            ..Extra::default()
        };
        shielded(|| write(books, "exit", extra, at_exit_answer()));
    }
}

/// Whether the exit report was written (or is being written).
pub(crate) fn exit_written() -> bool {
    EXIT_WRITTEN.load(Acquire)
}

/// In a forked child: the parent's exit report is not the child's.
pub(crate) fn after_fork_in_child() {
    EXIT_WRITTEN.store(false, Relaxed);
    if let Ok(mut series) = SERIES.try_lock() {
        series.clear();
    }
}

/// How many of the last reports the top suspected leak of the status file is judged
/// over.
const SERIES_LEN: usize = 12;
/// How many sites (and Python lines) of each report the series keeps.
const SERIES_SITES: usize = 1000;

/// The last reports, reduced to what `growth::suspects` reads (sites, lines,
/// classification, seq, reason, uptime).
static SERIES: std::sync::Mutex<std::collections::VecDeque<gpuguard_core::report::Report>> =
    std::sync::Mutex::new(std::collections::VecDeque::new());

/// Keeps `report` in the series and publishes the series' top suspect for the status
/// file (`events::suspect`). On the report writer's thread, after the report: never
/// in a hook.
fn judge_series(report: &gpuguard_core::report::Report) {
    let Ok(mut series) = SERIES.try_lock() else {
        return;
    };
    if series.len() >= SERIES_LEN {
        series.pop_front();
    }
    series.push_back(gpuguard_core::report::Report {
        seq: report.seq,
        reason: report.reason.clone(),
        uptime_s: report.uptime_s,
        // The largest only (reports list them most first): a leak grows into them,
        // and a program with 100,000 sites would otherwise keep twelve copies.
        sites: report.sites.iter().take(SERIES_SITES).cloned().collect(),
        python_sites: report
            .python_sites
            .iter()
            .take(SERIES_SITES)
            .cloned()
            .collect(),
        classification: report.classification.clone(),
        ..Default::default()
    });
    let refs: Vec<&gpuguard_core::report::Report> = series.iter().collect();
    let top = gpuguard_core::growth::suspects(&refs)
        .into_iter()
        .next()
        .map(|s| {
            let line = s.key.frames.first().cloned().unwrap_or_default();
            (line, s.per_second.unwrap_or(0.0))
        });
    events::set_suspect(top);
}

/// A report now, without the frameworks' account (only the helper thread may wait
/// for the Python side); returns where it went (None: to stderr).
pub(crate) fn write_report(reason: &str) -> Option<PathBuf> {
    write(active_books()?, reason, Extra::default(), None)
}

/// Builds and writes a report now; `classification` is the frameworks' account of
/// their memory (the Python side's JSON) when the caller has one. Returns where it
/// went (None: to stderr).
pub(crate) fn write(
    books: &Books,
    reason: &str,
    extra: Extra,
    classification: Option<String>,
) -> Option<PathBuf> {
    // Read before the report lock: the main thread may be waiting for that lock.
    let classes = classification.and_then(|text| match Answer::parse(&text) {
        Ok(a) => Some(a),
        Err(e) => {
            log(LogLevel::Warn, format_args!("{e}"));
            None
        }
    });
    // While the process ends, the helper thread may hold this lock for good (a write
    // that never returns): waited for within the end's bound only.
    let _guard = if endings::exiting() {
        let Some(g) = endings::lock_at_exit(&books.report_lock) else {
            if endings::first_to_give_up() {
                log(
                    LogLevel::Warn,
                    format_args!(
                        "the helper thread held the report lock past the exit's {} s bound; \
                         ending without the {reason} report",
                        endings::EXIT_WAIT.as_secs()
                    ),
                );
            }
            return None;
        };
        g
    } else {
        books.report_lock.lock().unwrap_or_else(|e| e.into_inner())
    };
    fault::point("report");
    if reason != "exit" && EXIT_WRITTEN.load(Acquire) {
        // The exit report is the last one of the process; a trim is still said.
        if let Some(t) = &extra.trim {
            announce(t, None);
        }
        return None;
    }
    let s = settings();
    let seq = books.seq.fetch_add(1, Relaxed) + 1;
    let pid = std::process::id();
    let program = sys::program_name();
    let now = sys::monotonic_ns();
    let tables: Tables = RefCell::default();
    // Pools also give memory back at stream synchronization: measure them now (not
    // while a stream is in CUDA graph capture: the last figures stand, and the report
    // says so).
    for d in books.ledger.seen_devices() {
        books.refresh_pools(d);
    }
    let capturing = capture::active();
    let refusal = match (reason, extra.refusal) {
        ("cap", Some(d)) => Some(denial(books, &d, &tables)),
        _ => None,
    };
    let oom_refusal = match (reason, extra.refusal) {
        ("oom", Some(d)) => Some(d),
        _ => None,
    };
    let input = ReportInput {
        reason,
        seq,
        pid,
        program: &program,
        argv: sys::argv(),
        time_unix_ms: unix_ms(),
        uptime_s: now.saturating_sub(books.started_ns) as f64 / 1e9,
        now_ns: now,
        ledger: &books.ledger,
        sites: &books.sites,
        api_name: &table::api_name,
        symbolize: &|pc| symbolize(pc, &tables),
        device_total: &|d| books.total(d),
        config: ReportConfig {
            stack_depth: s.cfg.stack_depth,
            stack_rate: s.cfg.stack_rate,
            report_signal: s.cfg.report_signal,
            dir: s.dir.to_string_lossy().into_owned(),
            max_live: s.cfg.max_live,
            snapshot_every_ms: s.cfg.snapshot_every_ms,
            sampled_by_bytes: true,
        },
        denial: refusal.as_ref().map(|(d, _)| d.clone()),
        max_live: s.cfg.max_live,
        launch: &s.launch,
    };
    // The live list stays compact (sorted entries) and is streamed into the file;
    // it is built as report objects only where something needs them: a framework's
    // blocks joined by address, or the stderr fallback.
    let (mut report, live) = reporter::build_parts(&input);
    if let Some((_, refused_ns)) = refusal {
        at_writing(&mut report, books, refused_ns);
    }
    if classes.is_some() {
        reporter::materialize(&mut report, &live, &input);
    }
    report.trim = extra.trim;
    report.ending = extra.ending;
    report.capture = (capturing > 0).then(|| gpuguard_core::report::CaptureNote {
        streams: capturing,
        detail: format!(
            "written while {capturing} stream{} of the process {} in CUDA graph capture: no CUDA call was made for it (what pools hold is as last measured{})",
            if capturing == 1 { "" } else { "s" },
            if capturing == 1 { "was" } else { "were" },
            if classes.is_some() {
                ""
            } else {
                "; framework caches were not classified, a framework's calls could break the capture"
            }
        ),
    });
    let recorded = classes.is_some_and(|c| gpuguard_core::classify::apply(&mut report, c));
    for d in &report.devices {
        if let (Some(u), Some(c)) = (d.in_use_bytes, d.cached_bytes) {
            events::set_framework(d.device, u, c);
        }
    }
    gpuguard_core::classify::python_sites_from_stacks(&mut report, recorded);
    if let Some(t) = &report.trim {
        events::count_trim(t.released_bytes);
    }
    if reason != "exit" {
        judge_series(&report);
    }
    if let Some(d) = report.denial.as_mut() {
        // A cap report reads as an oom report does: the other processes on the
        // device, and what would have helped.
        (d.others, d.others_source) = oom::others_on(books, d.device);
        d.group = super::group::figures(d.device);
        let cached = report
            .devices
            .iter()
            .find(|x| x.device == d.device)
            .and_then(|x| x.cached_bytes);
        d.suggestion = match &d.group {
            Some(g) if gpuguard_core::oom::by_group(d) => {
                gpuguard_core::oom::suggest_group(d.bytes, cached, g)
            }
            _ => gpuguard_core::oom::suggest_cap(d.bytes, cached, d.cap_bytes),
        };
    }
    if let Some(d) = oom_refusal {
        let frames = site_frames(books, d.site, &tables);
        report.oom = Some(oom::describe(books, &report, &d, frames));
    }
    let name = reporter::file_name(&program, s.launch.rank, pid, seq, reason);
    let headline = headline(&report);
    // Compact JSON, streamed to the file: `gpuguard show` is for reading it.
    let written = reporter::write_atomic_with(&s.dir, &name, |w| {
        reporter::write_json(w, &report, &live, &input)?;
        w.write_all(b"\n")
    });
    if reason == "snapshot" && written.is_ok() {
        // Test-only: a write that never returns, the report lock held.
        fault::stall("stall-report");
    }
    // For the timeline: the trim, then the report.
    let t_ns = sys::monotonic_ns();
    if let Some(t) = &report.trim {
        events::push(events::Event::Trim {
            t_ns,
            trigger: t.trigger.clone(),
            released_bytes: t.released_bytes,
        });
    }
    events::push(events::Event::Report {
        t_ns,
        reason: reason.to_string(),
        path: written
            .as_ref()
            .ok()
            .map(|p| p.to_string_lossy().into_owned()),
    });
    match written {
        Ok(path) => {
            match (&report.trim, &report.oom) {
                (Some(t), _) => announce(t, Some(&path)),
                (None, Some(o)) => log(
                    LogLevel::Warn,
                    format_args!(
                        "{}; report {}",
                        gpuguard_core::oom::answer(o),
                        path.display()
                    ),
                ),
                (None, None) => log(
                    LogLevel::Warn,
                    format_args!("report {} ({reason}): {headline}", path.display()),
                ),
            }
            Some(path)
        }
        Err(e) => {
            if !DIR_WARNED.swap(true, Relaxed) {
                log(
                    LogLevel::Warn,
                    format_args!(
                        "cannot write reports to {}: {e}; writing them to stderr instead",
                        s.dir.display()
                    ),
                );
            }
            if let Some(t) = &report.trim {
                announce(t, None);
            }
            if let Some(o) = &report.oom {
                log(
                    LogLevel::Warn,
                    format_args!("{}; report follows", gpuguard_core::oom::answer(o)),
                );
            }
            log(
                LogLevel::Warn,
                format_args!("report ({reason}) follows: {headline}"),
            );
            if report.live.is_empty() {
                reporter::materialize(&mut report, &live, &input);
            }
            let mut json = serde_json::to_vec_pretty(&report).unwrap_or_default();
            json.push(b'\n');
            write_stderr(&json);
            None
        }
    }
}

/// A cap refusal, with its stack symbolized, for a `cap` report, and when it was
/// (monotonic ns).
fn denial(
    books: &Books,
    d: &Denial,
    tables: &Tables,
) -> (gpuguard_core::report::DenialReport, u64) {
    let report = gpuguard_core::report::DenialReport {
        device: d.device,
        bytes: d.bytes,
        api: table::api_name(d.api).to_string(),
        charged_bytes: d.charged,
        cap_bytes: d.cap,
        live_bytes: Some(d.live),
        // Once the report's own figures are read (`at_writing`).
        at_writing: None,
        frames: site_frames(books, d.site, tables),
        // With the report's own figures (`cap_context`).
        others: Vec::new(),
        others_source: String::new(),
        suggestion: String::new(),
        group: None,
    };
    (report, d.t_ns)
}

/// A call site's stack, symbolized, innermost first.
pub(super) fn site_frames(books: &Books, site: u32, tables: &Tables) -> Vec<String> {
    let stack = books
        .sites
        .all()
        .get(site as usize)
        .cloned()
        .unwrap_or_default();
    let infos: Vec<FrameInfo> = stack.iter().map(|&pc| symbolize(pc, tables)).collect();
    reporter::site_frames(&infos.iter().collect::<Vec<_>>())
}

/// A cap report's refused device as the report found it (its `devices[]` figures),
/// and how long after the refusal: the helper thread writes the report later, and
/// the program may have freed or allocated meanwhile.
fn at_writing(report: &mut gpuguard_core::report::Report, books: &Books, refused_ns: u64) {
    let Some(d) = report.denial.as_mut() else {
        return;
    };
    let live_bytes = report
        .devices
        .iter()
        .find(|x| x.device == d.device)
        .map_or(0, |x| x.current_bytes);
    d.at_writing = Some(gpuguard_core::report::AtWriting {
        after_s: sys::monotonic_ns().saturating_sub(refused_ns) as f64 / 1e9,
        live_bytes,
        charged_bytes: books.ledger.device(d.device).charged(),
    });
}

fn headline(r: &gpuguard_core::report::Report) -> String {
    let mut parts: Vec<String> = r
        .devices
        .iter()
        .map(|d| {
            format!(
                "device {}: {} live in {} allocation{}, peak {}",
                d.device,
                human_bytes(d.current_bytes),
                d.live_count,
                if d.live_count == 1 { "" } else { "s" },
                human_bytes(d.peak_bytes)
            )
        })
        .collect();
    if parts.is_empty() {
        parts.push("no device memory used".into());
    }
    if let Some(d) = &r.denial {
        // Two moments: the refusal's figures, then the devices' as written.
        let mut refusal = match &d.group {
            Some(g) if gpuguard_core::oom::by_group(d) => format!(
                "group {}'s budget refused {} ({}) on device {}: at the refusal {} in use",
                g.name,
                human_bytes(d.bytes),
                d.api,
                d.device,
                human_bytes(d.charged_bytes)
            ),
            _ => format!(
                "cap refused {} ({}) on device {}: at the refusal {} of {} in use",
                human_bytes(d.bytes),
                d.api,
                d.device,
                human_bytes(d.charged_bytes),
                human_bytes(d.cap_bytes)
            ),
        };
        if let Some(live) = d.live_bytes {
            refusal.push_str(&format!(" ({} live)", human_bytes(live)));
        }
        if let Some(w) = &d.at_writing {
            parts[0] = format!("at writing, {:.3} s later: {}", w.after_s, parts[0]);
        }
        parts.insert(0, refusal);
        if !d.suggestion.is_empty() {
            parts.push(format!(
                "other processes {}; {}",
                human_bytes(gpuguard_core::oom::held_by(&d.others)),
                d.suggestion
            ));
        }
    }
    if r.host_pinned.peak_bytes > 0 {
        parts.push(format!(
            "pinned host {} live",
            human_bytes(r.host_pinned.current_bytes)
        ));
    }
    parts.join("; ")
}

/// The one stderr line a trim leaves.
fn announce(t: &TrimReport, report: Option<&std::path::Path>) {
    let parts: Vec<String> = t
        .mechanisms
        .iter()
        .map(|m| match m.status.as_str() {
            "trimmed" | "released" => format!("{} {}", m.name, human_bytes(m.released_bytes)),
            s => format!("{} {s}", m.name),
        })
        .collect();
    let devs: Vec<String> = t
        .devices
        .iter()
        .map(|d| {
            format!(
                "device {} {} -> {}",
                d.device,
                human_bytes(d.before_bytes),
                human_bytes(d.after_bytes)
            )
        })
        .collect();
    let deferred = t.deferred.as_ref().map_or(String::new(), |d| {
        format!(
            "; {} after waiting {:.1} s for a CUDA graph capture",
            d.outcome,
            d.waited_ms as f64 / 1000.0
        )
    });
    log(
        LogLevel::Warn,
        format_args!(
            "trim ({}): {} released ({}); {}; python {}{deferred}{}",
            t.trigger,
            human_bytes(t.released_bytes),
            parts.join(", "),
            if devs.is_empty() {
                "no device memory".into()
            } else {
                devs.join(", ")
            },
            t.python,
            report.map_or(String::new(), |p| format!("; report {}", p.display()))
        ),
    );
}
