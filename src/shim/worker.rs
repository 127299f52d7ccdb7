//! The helper thread and the report and trim signals. The signal handler only counts
//! the request and wakes the thread through its doorbell (`wake`); the thread (all
//! signals blocked in it) does the I/O: reports (`report`), trims (`trim`) and the
//! Python side's setup. A trim asked while a stream of the process is in CUDA graph
//! capture is held (`Trims`) until no stream captures, at most `trim::CAPTURE_WAIT`;
//! reports are answered meanwhile.

use super::books::{Books, Denial, RefusalSlot};
use super::python::{self, Outcome};
use super::report::{self, Extra};
use super::settings::{LogLevel, log, settings};
use super::state::{active_books, shielded};
use super::sys::monotonic_ns;
use super::{capture, control, endings, events, observe, trim, wake};
use gpuguard_core::report::{TrimReport, human_bytes};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::*};
use std::time::Duration;

/// Report signals received; the thread writes one report for any number of them.
static REPORT_REQUESTS: AtomicU64 = AtomicU64::new(0);
/// Trim signals received; signals that arrive before or during a trim merge into it.
static TRIM_REQUESTS: AtomicU64 = AtomicU64::new(0);
static THREAD_RUNNING: AtomicBool = AtomicBool::new(false);
/// The signal numbers, for the handler (0: none).
static REPORT_SIG: AtomicI32 = AtomicI32::new(0);
static TRIM_SIG: AtomicI32 = AtomicI32::new(0);
/// The program's handler for each of our signals (report, trim), called after ours.
static mut PREVIOUS: [Option<libc::sigaction>; 2] = [None, None];

extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, uctx: *mut c_void) {
    // SAFETY: async-signal-safe work only: atomics, write(2), errno save/restore.
    unsafe {
        let errno = *libc::__errno_location();
        let slot = if sig == TRIM_SIG.load(Relaxed) {
            TRIM_REQUESTS.fetch_add(1, Relaxed);
            1
        } else {
            REPORT_REQUESTS.fetch_add(1, Relaxed);
            0
        };
        wake::ring();
        chain(slot, sig, info, uctx);
        *libc::__errno_location() = errno;
    }
}

/// Calls the handler the program had before ours, as it asked to be called.
unsafe fn chain(slot: usize, sig: c_int, info: *mut libc::siginfo_t, uctx: *mut c_void) {
    // SAFETY: PREVIOUS[slot] is written before our handler is installed for that
    // signal and not after.
    let Some(prev) = (unsafe { (*std::ptr::addr_of!(PREVIOUS))[slot] }) else {
        return;
    };
    let h = prev.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        return; // the default would kill the process: our signals never do
    }
    // SAFETY: h is a handler the program installed with these flags.
    unsafe {
        if prev.sa_flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = std::mem::transmute(h);
            f(sig, info, uctx);
        } else {
            let f: extern "C" fn(c_int) = std::mem::transmute(h);
            f(sig);
        }
    }
}

fn our_handler() -> usize {
    on_signal as extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) as usize
}

/// Installs the handlers of the report and trim signals, keeping whatever handler
/// was there to chain.
pub(super) fn install_signal_handler() {
    let cfg = &settings().cfg;
    for (slot, sig, num) in [
        (0, cfg.report_signal, &REPORT_SIG),
        (1, cfg.trim_signal, &TRIM_SIG),
    ] {
        let Some(sig) = sig else {
            continue;
        };
        num.store(sig, Relaxed);
        // SAFETY: sigaction with zeroed, then filled structures.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction == our_handler()
            {
                continue;
            }
            (*std::ptr::addr_of_mut!(PREVIOUS))[slot] = Some(old);
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = our_handler();
            act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

/// At activation: if the program installed its own handler since load, put ours back
/// in front and chain to the program's.
pub(super) fn signals_on_activation() {
    // Signals before CUDA asked for nothing.
    REPORT_REQUESTS.store(0, Relaxed);
    TRIM_REQUESTS.store(0, Relaxed);
    install_signal_handler();
}

/// Failed starts so far, and when the next try is due (monotonic ns).
static START_FAILURES: AtomicU64 = AtomicU64::new(0);
static NEXT_START_NS: AtomicU64 = AtomicU64::new(0);
static START_WARNED: AtomicBool = AtomicBool::new(false);

/// Starts the helper thread, with every signal blocked so they go to the program.
/// If it cannot be started, a later hook tries again (backing off), and requests
/// asked meanwhile are answered once it runs.
pub(super) fn start() {
    if THREAD_RUNNING.swap(true, AcqRel) {
        return;
    }
    // SAFETY: creating an eventfd and adjusting this thread's mask around the spawn
    // (the new thread inherits the blocked mask).
    unsafe {
        let fd = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        let spawned = if fd < 0 || (super::fault::hit("spawn") && START_FAILURES.load(Relaxed) == 0)
        {
            Err(std::io::Error::other("no eventfd"))
        } else {
            std::thread::Builder::new()
                .name("gpuguard".into())
                .spawn(move || run(fd))
        };
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        match spawned {
            Ok(_) => {
                wake::set(fd);
                // Ring once: what was asked before it ran is answered now.
                wake::ring();
                wake::set_missing(false, retry);
            }
            Err(e) => {
                if fd >= 0 {
                    libc::close(fd);
                }
                let n = START_FAILURES.fetch_add(1, Relaxed);
                let backoff_ms = 20u64 << n.min(9);
                NEXT_START_NS.store(
                    monotonic_ns().saturating_add(backoff_ms * 1_000_000),
                    Relaxed,
                );
                THREAD_RUNNING.store(false, Release);
                wake::set_missing(true, retry);
                if !START_WARNED.swap(true, Relaxed) {
                    log(
                        LogLevel::Warn,
                        format_args!(
                            "could not start the helper thread ({e}); trying again at later CUDA calls"
                        ),
                    );
                }
            }
        }
    }
}

/// Starts the helper thread again if the backoff since the last failure is over
/// (hooks call it through `wake::retry`).
#[cold]
fn retry() {
    if monotonic_ns() >= NEXT_START_NS.load(Relaxed) {
        start();
    }
}

pub(super) fn after_fork_in_child() {
    // The parent's thread does not exist here; the eventfd is the parent's too.
    THREAD_RUNNING.store(false, Release);
    wake::set_missing(false, retry);
    START_FAILURES.store(0, Relaxed);
    let fd = wake::take();
    if fd >= 0 {
        // SAFETY: closing our own descriptor in the child.
        unsafe { libc::close(fd) };
    }
    REPORT_REQUESTS.store(0, Relaxed);
    TRIM_REQUESTS.store(0, Relaxed);
    capture::after_fork_in_child();
    super::real::after_fork_in_child();
    report::after_fork_in_child();
    python::after_fork_in_child();
    observe::after_fork_in_child();
    events::after_fork_in_child();
    control::after_fork_in_child();
    super::tags::after_fork_in_child();
    endings::after_fork_in_child();
}

/// How often the helper thread applies the hooks' journals while any exist: a thread's
/// journal (4,096 entries) lasts ~60 ms of PyTorch's busiest allocation rate seen
/// (cudaMallocAsync: 1,289 entries a ~20 ms step, over two threads). A thread that
/// writes faster rings the doorbell at each half journal (`track::journal_push`).
const JOURNAL_DRAIN_MS: u64 = 20;
/// ... and once a drain found nothing (a thread that writes again rings at its next
/// half journal, and the helper is back to `JOURNAL_DRAIN_MS`).
const JOURNAL_IDLE_MS: u64 = 250;

/// When the Python side is (re)installed after activation: soon (a framework may
/// still be initializing CUDA when gpuguard activates), then less and less often,
/// so a framework imported later still gets its recorder.
const INSTALL_AFTER_MS: [u64; 10] = [
    0, 200, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000,
];

/// When (ms after activation) the `n`th setup of the Python side is due: the list,
/// then every 64 s.
fn install_after_ms(n: usize) -> u64 {
    INSTALL_AFTER_MS
        .get(n)
        .copied()
        .unwrap_or_else(|| 64_000 * (n as u64).saturating_sub(8))
}

/// How often a held trim looks again whether the program's captures ended.
const HELD_POLL_MS: u64 = 10;

fn run(fd: c_int) {
    let mut trims = Trims::default();
    let mut last_auto_trim: Option<u64> = None;
    let started = monotonic_ns();
    let mut installs = 0usize;
    let mut sites_seen = 0usize;
    // The count was reset at activation: a signal that came between then and now is
    // a request this thread must still answer.
    let mut handled = 0;
    let every_ns = settings()
        .cfg
        .snapshot_every_ms
        .map(|ms| ms.saturating_mul(1_000_000));
    // The thread starts at activation: the first snapshot is one interval after it.
    let mut next_snapshot = every_ns.map(|e| monotonic_ns().saturating_add(e));
    endings::helper_started();
    // From what was finished, not what was asked: an exit that asked before this
    // thread got here is answered too (else it waits out its whole bound).
    let mut settled = endings::settle_done();
    let mut journal_busy = true;
    loop {
        let cap_waiting =
            active_books().is_some_and(|b| b.cap_refusal.pending() || b.oom_refusal.pending());
        let mut timeout_ms: u64 = if cap_waiting { 100 } else { 1000 };
        if python::frames::enabled() {
            timeout_ms = timeout_ms.min(200); // new Python call sites are named soon
        }
        if let Some(due) = next_snapshot {
            let left = due.saturating_sub(monotonic_ns());
            timeout_ms = timeout_ms.min(left.div_ceil(1_000_000));
        }
        // The timeline, status file and memory line (`observe`).
        timeout_ms = timeout_ms.min(observe::due_in_ms(monotonic_ns()));
        let install_due = started.saturating_add(install_after_ms(installs) * 1_000_000);
        let left = install_due.saturating_sub(monotonic_ns());
        timeout_ms = timeout_ms.min(left.div_ceil(1_000_000));
        if active_books().is_some_and(|b| b.ledger.journaled()) {
            timeout_ms = timeout_ms.min(if journal_busy {
                JOURNAL_DRAIN_MS
            } else {
                JOURNAL_IDLE_MS
            });
        }
        if trims.held.is_some() {
            // A trim waits for a CUDA graph capture to end: look again soon.
            timeout_ms = timeout_ms.min(HELD_POLL_MS);
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling and draining our own eventfd.
        unsafe {
            libc::poll(&mut pfd, 1, timeout_ms as c_int);
            let mut v: u64 = 0;
            libc::read(fd, &mut v as *mut u64 as *mut c_void, 8);
        }
        // What the hooks journaled goes into the books (see the ledger's journal).
        if let Some(b) = active_books() {
            journal_busy = shielded(|| b.ledger.drain()).unwrap_or(0) > 0;
        }
        // The process is ending (exit, or a signal whose default ends it): what was
        // asked is finished first, then the final report.
        let asked = endings::settle_asked();
        let ending = endings::pending();
        if asked != settled || ending.is_some() {
            if !report::exit_written() {
                answer_requests(&mut handled, &mut trims);
                // A trim still held for a capture is given up now, and said.
                trims.retry(true);
            }
            if let Some(sig) = ending {
                report::write_final_report(Some(sig), python::at_exit_answer);
                super::group::leave();
                // The trace closed and the status file removed, as at exit.
                shielded(observe::on_exit);
                endings::finished();
            }
            settled = asked;
            endings::settled(asked);
            continue;
        }
        answer_requests(&mut handled, &mut trims);
        trims.retry(false);
        if monotonic_ns() >= install_due {
            installs += 1;
            shielded(install_python);
        } else if let Some(books) = active_books() {
            // New call sites with Python frames: have them named soon, while their
            // code objects are alive.
            let n = books.sites.len();
            if n != sites_seen {
                sites_seen = n;
                if shielded(|| !python::names::unresolved(&books.sites).is_empty()).unwrap_or(false)
                {
                    shielded(install_python);
                }
            }
        }
        if let (Some(due), Some(every)) = (next_snapshot, every_ns) {
            let t = monotonic_ns();
            if t >= due {
                // Late past a whole interval (a slow report): the next is one from now.
                let next = due.saturating_add(every);
                next_snapshot = Some(if next <= t {
                    t.saturating_add(every)
                } else {
                    next
                });
                // Nothing allocated yet: a snapshot would say nothing.
                if active_books().is_some_and(|b| b.allocated_any()) {
                    shielded(|| write_report("snapshot", Extra::default()));
                }
            }
        }
        if let Some(books) = active_books() {
            let auto = shielded(|| thresholds(books)).unwrap_or(None);
            let auto = auto.or_else(|| books.cap_trim_wanted.swap(false, AcqRel).then_some("cap"));
            let auto = auto.or_else(|| books.oom_trim_wanted.swap(false, AcqRel).then_some("oom"));
            // Another member of the group was refused: unused leases go back, and the
            // frameworks' caches are trimmed so that it can proceed.
            let squeezed =
                shielded(|| super::group::tick(books, monotonic_ns() / 1_000_000)).unwrap_or(false);
            let auto = auto.or_else(|| squeezed.then_some("group"));
            if let Some(trigger) = auto {
                // At most one automatic trim per GPUGUARD_TRIM_INTERVAL: a job at its
                // cap must not trim in a loop.
                let t = monotonic_ns();
                let every = settings().cfg.trim_interval_ms.saturating_mul(1_000_000);
                if last_auto_trim.is_none_or(|l| t.saturating_sub(l) >= every) {
                    last_auto_trim = Some(t);
                    trims.ask(trigger, false, None);
                } else {
                    log(
                        LogLevel::Debug,
                        format_args!(
                            "{trigger} trim skipped: one ran less than GPUGUARD_TRIM_INTERVAL ago"
                        ),
                    );
                }
            }
        }
        shielded(observe::tick);
    }
}

/// A trim asked through the C API (`gpuguard_trim`) on a Python process's main
/// thread: the trim must not wait for that thread, so the Python side (framework
/// caches, the classification) is left out and CUDA pools are trimmed, here. While a
/// stream captures it cannot wait for the capture either (this may be the capturing
/// thread): the trim is skipped and its report says so.
pub(crate) fn api_trim_here() -> Option<std::path::PathBuf> {
    let books = active_books()?;
    let t = match trim::attempt(books, "api", false, None) {
        trim::Attempt::Done(t) => t,
        trim::Attempt::Capturing => {
            trim::skipped(books, "api", Duration::ZERO, trim::GaveUp::MainThread)
        }
    };
    report::write(
        books,
        "trim",
        Extra {
            trim: Some(t),
            ..Extra::default()
        },
        None,
    )
}

/// Answers what was asked of the helper thread: a report signal (one report for any
/// number of them), trim signals (merged into one trim), a cap refusal's report, the
/// C API's trims.
fn answer_requests(handled: &mut u64, trims: &mut Trims) {
    let now = REPORT_REQUESTS.load(Relaxed);
    if now != *handled {
        *handled = now;
        shielded(|| write_report("signal", Extra::default()));
    }
    if TRIM_REQUESTS.load(Relaxed) != trims.handled {
        trims.ask("signal", true, None);
    }
    if let Some(books) = active_books()
        && let Some(d) = claim_cap_report(books)
    {
        shielded(|| {
            write_report(
                "cap",
                Extra {
                    refusal: Some(d),
                    ..Extra::default()
                },
            )
        });
    }
    if let Some(books) = active_books()
        && let Some(d) = claim_oom_report(books)
    {
        shielded(|| {
            write_report(
                "oom",
                Extra {
                    refusal: Some(d),
                    ..Extra::default()
                },
            )
        });
    }
    if let Some(ticket) = control::trim_wanted() {
        trims.ask("api", false, Some(ticket));
    }
}

/// A trim held while a stream of the process is in CUDA graph capture.
struct Held {
    trigger: &'static str,
    /// When it was first asked for (monotonic ns).
    since_ns: u64,
    /// Whether it answers trim signals (all counted up to its end).
    signals: bool,
    /// The newest C API ticket it answers.
    ticket: Option<u64>,
}

/// The helper thread's trims: one at a time, run at once or held while a stream
/// captures; requests that come while one is held merge into it.
#[derive(Default)]
struct Trims {
    /// Trim signals answered so far.
    handled: u64,
    held: Option<Held>,
}

impl Trims {
    /// A trim asked by `trigger` (`signals`: trim signals asked it; `ticket`: the C
    /// API did): run now, or held while a stream captures.
    fn ask(&mut self, trigger: &'static str, signals: bool, ticket: Option<u64>) {
        if let Some(h) = &mut self.held {
            h.signals |= signals;
            h.ticket = h.ticket.max(ticket);
            return;
        }
        let h = Held {
            trigger,
            since_ns: monotonic_ns(),
            signals,
            ticket,
        };
        self.attempt(h, None);
    }

    /// The held trim, if any: run once no stream captures; given up (and said) when a
    /// capture is still in progress after `trim::CAPTURE_WAIT`, or when `ending`.
    fn retry(&mut self, ending: bool) {
        let Some(h) = self.held.take() else {
            return;
        };
        let waited = std::time::Duration::from_nanos(monotonic_ns().saturating_sub(h.since_ns));
        if capture::active() > 0 && (ending || waited >= trim::CAPTURE_WAIT) {
            let why = if ending {
                trim::GaveUp::Ending
            } else {
                trim::GaveUp::Waited
            };
            let t =
                active_books().and_then(|b| shielded(|| trim::skipped(b, h.trigger, waited, why)));
            self.finish(h, t);
            return;
        }
        self.attempt(h, Some(waited));
    }

    fn attempt(&mut self, h: Held, waited: Option<std::time::Duration>) {
        let Some(books) = active_books() else {
            self.finish(h, None);
            return;
        };
        match shielded(|| trim::attempt(books, h.trigger, true, waited)) {
            Some(trim::Attempt::Capturing) => {
                if waited.is_none() {
                    log(
                        LogLevel::Info,
                        format_args!(
                            "{} trim deferred: a CUDA graph capture is in progress (waiting at most {} s for it to end)",
                            h.trigger,
                            trim::CAPTURE_WAIT.as_secs()
                        ),
                    );
                }
                self.held = Some(h);
            }
            Some(trim::Attempt::Done(t)) => self.finish(h, Some(t)),
            None => self.finish(h, None),
        }
    }

    /// Writes the trim's report and answers what it was asked by: every trim signal
    /// counted up to now (merged into it), the C API's tickets.
    fn finish(&mut self, h: Held, t: Option<TrimReport>) {
        let answered = h.signals.then(|| TRIM_REQUESTS.load(Relaxed));
        let path = t.and_then(|mut t| {
            if let Some(now) = answered {
                t.merged = now.saturating_sub(self.handled).max(1);
            }
            shielded(|| {
                write_report(
                    "trim",
                    Extra {
                        trim: Some(t),
                        ..Extra::default()
                    },
                )
            })
            .flatten()
        });
        if let Some(now) = answered {
            self.handled = now;
        }
        if let Some(ticket) = h.ticket {
            control::trim_done(ticket, path);
        }
    }
}

/// Turns the Python side on (recorders, the exit hook) without waiting for it.
pub(super) fn install_python() {
    if !python::present() {
        return;
    }
    let devices = active_books()
        .map(|b| b.ledger.seen_devices())
        .unwrap_or_default();
    let _ = python::run(&python::call("_gg_install", &devices), None);
}

/// The refusal a cap report should be written for now, claimed: one at the first
/// refusal, then at most one a second, whichever thread (helper or exit) asks.
pub(crate) fn claim_cap_report(books: &Books) -> Option<Denial> {
    claim(&books.cap_refusal, &books.last_cap_report_ns)
}

/// The refusal by the driver an `oom` report should be written for now, claimed, at
/// the same rate as cap reports.
pub(crate) fn claim_oom_report(books: &Books) -> Option<Denial> {
    claim(&books.oom_refusal, &books.last_oom_report_ns)
}

/// One report at the first refusal, then at most one a second: the refusal kept
/// meanwhile is the first since the last report.
fn claim(slot: &RefusalSlot, last_ns: &AtomicU64) -> Option<Denial> {
    if !slot.pending() {
        return None;
    }
    let now = monotonic_ns().max(1);
    let last = last_ns.load(Acquire);
    if last != 0 && now.saturating_sub(last) < 1_000_000_000 {
        return None;
    }
    if last_ns
        .compare_exchange(last, now, AcqRel, Acquire)
        .is_err()
    {
        return None;
    }
    slot.take()
}

/// Warnings for thresholds the hooks saw crossed; `Some("threshold")` when a trim
/// threshold was crossed (the caller runs the trim, rate-limited).
fn thresholds(books: &Books) -> Option<&'static str> {
    let mut trim = None;
    for (dev, t) in books.thresholds.iter().enumerate() {
        let dev = dev as i32;
        if t.warn_pending.swap(false, Relaxed) {
            // The crossing thread wrote the line; the timeline gets it here.
            let c = books.ledger.device(dev);
            events::push(events::Event::Warning {
                t_ns: monotonic_ns(),
                device: dev,
                message: format!(
                    "{} of its {} cap in use (peak {}), past GPUGUARD_WARN_AT",
                    human_bytes(t.crossed_at.load(Relaxed)),
                    human_bytes(c.cap().unwrap_or(0)),
                    human_bytes(t.crossed_peak.load(Relaxed))
                ),
            });
        }
        if t.trim_pending.swap(false, Relaxed) {
            trim = Some("threshold");
        }
    }
    trim
}

/// How long a report waits for the Python side's classification.
const CLASSIFY_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// A report from the helper thread, with the frameworks' account of their memory
/// asked now: the helper is the only thread that may wait for the main thread.
fn write_report(reason: &str, extra: Extra) -> Option<std::path::PathBuf> {
    let books = active_books()?;
    // Asked before the report lock: the main thread may be waiting for that lock.
    let classification = if python::present() {
        let call = python::call("_gg_classify", &books.ledger.seen_devices());
        match python::run(&call, Some(CLASSIFY_WAIT)) {
            Outcome::Answer(t) => Some(t),
            o => {
                log(
                    LogLevel::Info,
                    format_args!(
                        "no framework classification for this report: {}",
                        o.status()
                    ),
                );
                None
            }
        }
    } else {
        None
    };
    report::write(books, reason, extra, classification)
}
