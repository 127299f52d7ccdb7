//! Watching a process from outside: the memory timeline (`GPUGUARD_TRACE`), the
//! status file `gpuguard ps` reads, and the periodic memory line on stderr
//! (`GPUGUARD_LOG_EVERY`). All of it runs on the helper thread (`tick`, as often as
//! `due_in_ms` asks) and at exit (`on_exit`), never in a hook: hooks only move the
//! ledger's counters, which this samples.
//!
//! Failures cost one warning each: a trace or status directory that cannot be
//! written is dropped and the program runs on.

use super::books::Books;
use super::endings;
use super::events::{self, Event};
use super::settings::{LogLevel, log, settings};
use super::state::active_books;
use super::sys::monotonic_ns;
use gpuguard_core::report::human_bytes;
use gpuguard_core::status::{self, DeviceStatus, Status};
use gpuguard_core::trace::{TraceOptions, TraceWriter, event};
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::*};

/// How often the helper samples the books while a trace is written.
const TRACE_TICK_MS: u64 = 50;
/// How often it samples them for the periodic line's "peak since the last line".
const LOG_TICK_MS: u64 = 100;

struct Observer {
    pid: u32,
    trace: Option<TraceWriter>,
    status_dir: Option<PathBuf>,
    /// What a status file says that does not change.
    status_base: Status,
    next_status_ns: u64,
    log_every_ns: Option<u64>,
    next_log_ns: u64,
    /// Per device: the overall peak at the last line, and the highest live bytes
    /// since (the books' high-water mark, read at each sample).
    lines: BTreeMap<i32, (u64, u64)>,
    /// Per device: refusals already put on the timeline.
    denied: BTreeMap<i32, u64>,

    /// The latest time put on the timeline (events are stamped no earlier).
    last_t_us: u64,
    finished: bool,
}

static OBSERVER: Mutex<Option<Observer>> = Mutex::new(None);
/// Set in a forked child whose copy of the lock was held at the fork.
static BROKEN: AtomicBool = AtomicBool::new(false);

/// The observer, locked. While the process ends, waited for within the end's
/// bound only (`endings::lock_at_exit`): the helper thread may hold it for good, in
/// a write that never returns.
fn lock() -> Option<std::sync::MutexGuard<'static, Option<Observer>>> {
    if BROKEN.load(Acquire) {
        return None;
    }
    if endings::exiting() {
        return endings::lock_at_exit(&OBSERVER);
    }
    Some(OBSERVER.lock().unwrap_or_else(|e| e.into_inner()))
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Milliseconds until the helper thread should call `tick` (its poll timeout is
/// at most this).
pub(crate) fn due_in_ms(now_ns: u64) -> u64 {
    let Some(guard) = lock() else {
        return u64::MAX;
    };
    let Some(o) = guard.as_ref() else {
        return 0; // not started yet
    };
    if o.finished {
        return u64::MAX;
    }
    let mut ms = u64::MAX;
    if o.trace.is_some() {
        ms = TRACE_TICK_MS;
    }
    if o.log_every_ns.is_some() {
        ms = ms.min(LOG_TICK_MS);
        ms = ms.min(o.next_log_ns.saturating_sub(now_ns).div_ceil(1_000_000));
    }
    if o.status_dir.is_some() {
        ms = ms.min(o.next_status_ns.saturating_sub(now_ns).div_ceil(1_000_000));
    }
    ms
}

/// The helper thread's periodic work: started at its first call (the books exist
/// then), it samples the books into the trace, rewrites the status file when due
/// and writes the memory line when due.
pub(crate) fn tick() {
    let Some(books) = active_books() else {
        return;
    };
    let Some(mut guard) = lock() else {
        return;
    };
    let o = this_process(&mut guard, books);
    if o.finished {
        return;
    }
    if books.seq.load(Relaxed) > 0 {
        // Test-only: a write that never returns, this lock held.
        super::fault::stall("stall-observe");
    }
    let now = monotonic_ns();
    sample(o, books, now);
    if o.status_dir.is_some() && now >= o.next_status_ns {
        o.next_status_ns = now.saturating_add(status::UPDATE_INTERVAL_MS * 1_000_000);
        write_status(o, books);
    }
    if let Some(every) = o.log_every_ns
        && now >= o.next_log_ns
    {
        // The next line one period after this one (late past a whole period: one
        // period from now).
        let next = o.next_log_ns.saturating_add(every);
        o.next_log_ns = if next <= now {
            now.saturating_add(every)
        } else {
            next
        };
        log_line(o, books);
    }
}

/// At exit, after the exit report: the last samples and events (the exit report's
/// among them), the trace closed, the status file removed. Once per process; the
/// helper's ticks stop then. Endings other than `exit` (a fatal signal handled by
/// gpuguard) call this too once they write their report.
pub(crate) fn on_exit() {
    let Some(books) = active_books() else {
        return;
    };
    let Some(mut guard) = lock() else {
        if !BROKEN.load(Acquire) && endings::first_to_give_up() {
            log(
                LogLevel::Warn,
                format_args!(
                    "the helper thread held the timeline's lock past the exit's {} s bound; \
                     ending without closing the trace or removing the status file",
                    endings::EXIT_WAIT.as_secs()
                ),
            );
        }
        return;
    };
    // A process that exits before the helper's first tick still leaves its trace.
    let o = this_process(&mut guard, books);
    let pid = o.pid;
    if o.finished {
        return;
    }
    o.finished = true;
    let now = monotonic_ns();
    sample(o, books, now);
    if let Some(mut w) = o.trace.take() {
        if let Err(e) = w.finish(t_us(books, now)) {
            warn_trace(&e);
        }
        events::set_wanted(false);
    }
    if let Some(dir) = o.status_dir.take() {
        let _ = status::remove_status(&dir, pid);
    }
}

/// In a forked child: the parent's trace writer and status file are not the
/// child's. They are forgotten (never flushed or removed from here); the child
/// starts its own at its first tick, under its own pid.
pub(crate) fn after_fork_in_child() {
    match OBSERVER.try_lock() {
        Ok(mut g) => {
            if let Some(o) = g.take() {
                std::mem::forget(o);
            }
        }
        Err(_) => BROKEN.store(true, Release),
    }
}

/// This process's observer, started now if need be. One left from the parent of a
/// fork (a fork the hook below did not see) is forgotten unwritten.
fn this_process<'a>(slot: &'a mut Option<Observer>, books: &Books) -> &'a mut Observer {
    let pid = std::process::id();
    if slot.as_ref().is_some_and(|o| o.pid != pid)
        && let Some(o) = slot.take()
    {
        std::mem::forget(o);
    }
    slot.get_or_insert_with(|| start(books, pid))
}

fn t_us(books: &Books, now_ns: u64) -> u64 {
    now_ns.saturating_sub(books.started_ns) / 1_000
}

fn start(books: &Books, pid: u32) -> Observer {
    let cfg = &settings().cfg;
    let now = monotonic_ns();
    let started_unix_ms =
        unix_ms().saturating_sub(now.saturating_sub(books.started_ns) / 1_000_000);
    let program = super::sys::program_name();
    let trace = cfg
        .trace
        .as_deref()
        .and_then(|p| open_trace(p, pid, &program, started_unix_ms));
    events::set_wanted(trace.is_some());
    let status_dir = match status::status_dir_here() {
        Ok(d) => match status::ensure_dir(&d) {
            Ok(()) => Some(d),
            Err(e) => {
                // The directory's own check names it; an error of the system does not.
                let said = e.to_string();
                let named = said.starts_with(&*d.to_string_lossy());
                let place = if named {
                    String::new()
                } else {
                    format!("{}: ", d.display())
                };
                log(
                    LogLevel::Warn,
                    format_args!(
                        "no status file for `gpuguard ps`: {place}{said}; running without it"
                    ),
                );
                None
            }
        },
        Err(e) => {
            log(
                LogLevel::Warn,
                format_args!("no status file for `gpuguard ps`: {e}; running without it"),
            );
            None
        }
    };
    // Byte for byte: `gpuguard trim` looks for the trim report there.
    let (report_dir, report_dir_hex) = status::report_dir_fields(&settings().dir);
    let status_base = Status {
        schema: status::SCHEMA.into(),
        gpuguard_version: env!("CARGO_PKG_VERSION").into(),
        pid,
        program,
        argv: super::sys::argv(),
        start_ticks: status::process_start_ticks(Path::new("/proc"), pid).unwrap_or(0),
        started_unix_ms,
        report_dir,
        report_dir_hex,
        updated_unix_ms: 0,
        devices: Vec::new(),
        rank: settings().launch.rank,
        labels: settings().labels.clone(),
        ..Default::default()
    };
    let log_every_ns = cfg.log_every_ms.map(|ms| ms.saturating_mul(1_000_000));
    Observer {
        pid,
        trace,
        status_dir,
        status_base,
        next_status_ns: now,
        log_every_ns,
        next_log_ns: log_every_ns.map_or(u64::MAX, |e| now.saturating_add(e)),
        lines: BTreeMap::new(),
        denied: BTreeMap::new(),
        last_t_us: 0,
        finished: false,
    }
}

/// The file the trace goes to: `path`, unless another running process (the parent
/// of a fork, another program of the same job) is writing it; then `path` with
/// `.<pid>` before its extension. Only a regular file is read (a FIFO's open or
/// read would wait for a writer); anything else is refused when it is created.
fn trace_path(path: &Path, pid: u32) -> PathBuf {
    let owner = gpuguard_core::regular_file::open(path).ok().and_then(|f| {
        use std::io::{BufRead, BufReader, Read};
        let mut head = String::new();
        let mut r = BufReader::new(f.take(4096));
        // Line 1 is `[`, line 2 the header event with the writer's pid.
        r.read_line(&mut head).ok()?;
        head.clear();
        r.read_line(&mut head).ok()?;
        let v: serde_json::Value = serde_json::from_str(head.trim().trim_end_matches(',')).ok()?;
        (v.get("name")?.as_str()? == gpuguard_core::trace::HEADER_EVENT)
            .then(|| v.get("pid")?.as_u64())
            .flatten()
    });
    let taken = owner.is_some_and(|p| {
        p != u64::from(pid)
            && i32::try_from(p).is_ok_and(|p| {
                // SAFETY: signal 0 only asks whether the process exists.
                let alive = unsafe { libc::kill(p, 0) } == 0;
                alive || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
            })
    });
    if !taken {
        return path.to_path_buf();
    }
    let mut name = path.file_stem().unwrap_or_default().to_os_string();
    name.push(format!(".{pid}"));
    if let Some(ext) = path.extension() {
        name.push(".");
        name.push(ext);
    }
    path.with_file_name(name)
}

fn open_trace(path: &Path, pid: u32, program: &str, start_unix_ms: u64) -> Option<TraceWriter> {
    let path = trace_path(path, pid);
    let options = TraceOptions {
        pid,
        program: program.into(),
        start_unix_ms,
        version: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    };
    match TraceWriter::create(&path, options) {
        Ok(w) => {
            log(
                LogLevel::Info,
                format_args!("memory timeline to {}", path.display()),
            );
            Some(w)
        }
        Err(e) => {
            log(
                LogLevel::Warn,
                format_args!(
                    "cannot write the trace to {}: {e}; running without it",
                    path.display()
                ),
            );
            None
        }
    }
}

fn warn_trace(e: &std::io::Error) {
    log(
        LogLevel::Warn,
        format_args!("the trace stopped: {e}; running without it"),
    );
}

/// Samples every device into the trace and the line's window peaks, and puts new
/// refusals and the events waiting on the timeline.
fn sample(o: &mut Observer, books: &Books, now: u64) {
    let t = t_us(books, now);
    let devices = books.ledger.seen_devices();
    if let Some(tr) = o.trace.as_mut() {
        // Events first, each no earlier than the last tick (one stamped before it may
        // arrive after it), so time never runs backwards on the timeline.
        let floor = o.last_t_us;
        let at = |t_ns: u64| t_us(books, t_ns).clamp(floor, t.max(floor));
        for e in events::take() {
            match e {
                Event::Report { t_ns, reason, path } => tr.instant(
                    at(t_ns),
                    event::REPORT,
                    json!({"reason": reason, "path": path}),
                ),
                Event::Trim {
                    t_ns,
                    trigger,
                    released_bytes,
                } => tr.instant(
                    at(t_ns),
                    event::TRIM,
                    json!({"trigger": trigger, "released_bytes": released_bytes}),
                ),
                Event::Warning {
                    t_ns,
                    device,
                    message,
                } => tr.instant(
                    at(t_ns),
                    event::WARNING,
                    json!({"device": device, "message": message}),
                ),
            }
        }
        o.last_t_us = floor.max(t);
    }
    let t = o.last_t_us.max(t);
    for &d in &devices {
        let c = books.ledger.device(d);
        // The high-water mark first: read and restarted at the level now, so what
        // came between this sample and the one before is in it.
        let high = c.take_high();
        let live = c.current();
        let w = o.lines.entry(d).or_insert((0, 0));
        w.1 = w.1.max(high);
        if let Some(tr) = o.trace.as_mut() {
            tr.sample_high(t, d, live, high, c.pool_excess(), c.cap());
        }
    }
    let Some(tr) = o.trace.as_mut() else {
        return;
    };
    for &d in &devices {
        let denied = books.ledger.device(d).denied.load(Relaxed);
        let seen = o.denied.entry(d).or_insert(0);
        if denied > *seen {
            let n = denied - *seen;
            *seen = denied;
            let last = books.cap_refusal.peek().filter(|x| x.device == d);
            let args = match last {
                Some(x) => json!({"device": d, "bytes": x.bytes, "charged": x.charged,
                    "cap": x.cap, "refusals": n}),
                None => json!({"device": d, "refusals": n}),
            };
            tr.instant(t, event::CAP_REFUSAL, args);
        }
    }
    if let Err(e) = tr.flush() {
        warn_trace(&e);
        o.trace = None;
        events::set_wanted(false);
    }
}

fn write_status(o: &mut Observer, books: &Books) {
    let Some(dir) = o.status_dir.as_deref() else {
        return;
    };
    let mut s = o.status_base.clone();
    s.updated_unix_ms = unix_ms();
    s.reports = books.seq.load(Relaxed);
    (s.trims, s.trim_released_bytes) = events::trims();
    s.top_suspect = events::suspect().map(|(line, rate)| status::SuspectStatus {
        line,
        bytes_per_second: rate,
    });
    s.devices = books
        .ledger
        .seen_devices()
        .into_iter()
        .map(|d| {
            let c = books.ledger.device(d);
            let uuid = books.device_uuid(d);
            let framework = events::framework(d);
            DeviceStatus {
                device: d,
                live_bytes: c.current(),
                peak_bytes: c.peak.load(Relaxed),
                cap_bytes: c.cap(),
                pool_held_bytes: c.pool_excess(),
                uuid,
                framework_in_use_bytes: framework.map(|f| f.0),
                framework_cached_bytes: framework.map(|f| f.1),
                oom_refusals: books.oom_counts[d as usize].load(Relaxed),
                cap_refusals: c.denied.load(Relaxed),
            }
        })
        .collect();
    if let Err(e) = status::write_status(dir, &s) {
        log(
            LogLevel::Warn,
            format_args!(
                "cannot write the status file for `gpuguard ps` in {}: {e}; no more status files",
                dir.display()
            ),
        );
        o.status_dir = None;
    }
}

/// `memory: device 0 live 1.2 GiB (torch in use 1.0 GiB, cached 200.0 MiB), peak
/// 1.5 GiB since the last line, 2.0 GiB overall, cap 4.0 GiB; device 1 ...`
fn log_line(o: &mut Observer, books: &Books) {
    let mut line = String::from("memory:");
    let devices = books.ledger.seen_devices();
    if devices.is_empty() {
        line.push_str(" no device memory used");
    }
    for (i, &d) in devices.iter().enumerate() {
        let c = books.ledger.device(d);
        let live = c.current();
        let peak = c.peak.load(Relaxed);
        let w = o.lines.entry(d).or_insert((0, 0));
        // A new overall peak since the last line is exact; otherwise the highest
        // level the high-water marks saw since.
        let since = if peak > w.0 { peak } else { w.1.max(live) };
        *w = (peak, live);
        let sep = if i == 0 { " " } else { "; " };
        let _ = write!(line, "{sep}device {d} live {}", human_bytes(live));
        if let Some((in_use, cached)) = events::framework(d) {
            let _ = write!(
                line,
                " (framework in use {}, cached {} at the last report)",
                human_bytes(in_use),
                human_bytes(cached)
            );
        }
        let _ = write!(
            line,
            ", peak {} since the last line, {} overall, ",
            human_bytes(since),
            human_bytes(peak)
        );
        match c.cap() {
            Some(cap) => {
                let _ = write!(line, "cap {}", human_bytes(cap));
            }
            None => line.push_str("uncapped"),
        }
    }
    log(LogLevel::Warn, format_args!("{line}"));
}
