//! The helper thread and the report signal. The signal handler only counts the request
//! and wakes the thread through an eventfd; the thread (all signals blocked in it)
//! does the I/O: building, symbolizing and writing reports.

use super::{LogLevel, active_books, log, settings, shielded, write_stderr};
use gpuguard_core::report::{ReportConfig, human_bytes};
use gpuguard_core::reporter::{self, FrameInfo, ReportInput};
use gpuguard_core::symbols::SymbolTable;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::*};

/// Report signals received; the thread writes one report for any number of them.
static REPORT_REQUESTS: AtomicU64 = AtomicU64::new(0);
/// Trim signals received; signals that arrive before or during a trim merge into it.
static TRIM_REQUESTS: AtomicU64 = AtomicU64::new(0);
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
static THREAD_RUNNING: AtomicBool = AtomicBool::new(false);
/// The signal numbers, for the handler (0: none).
static REPORT_SIG: AtomicI32 = AtomicI32::new(0);
static TRIM_SIG: AtomicI32 = AtomicI32::new(0);
/// The program's handler for each of our signals (report, trim), called after ours.
static mut PREVIOUS: [Option<libc::sigaction>; 2] = [None, None];
static DIR_WARNED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set on the helper thread: the only thread that may wait for the Python side.
    static ON_HELPER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

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
        let fd = WAKE_FD.load(Relaxed);
        if fd >= 0 {
            let one: u64 = 1;
            libc::write(fd, &one as *const u64 as *const c_void, 8);
        }
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

/// Starts the helper thread, with every signal blocked so they go to the program.
pub(super) fn start() {
    if THREAD_RUNNING.swap(true, AcqRel) {
        return;
    }
    // SAFETY: creating an eventfd and adjusting this thread's mask around the spawn
    // (the new thread inherits the blocked mask).
    unsafe {
        let fd = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
        WAKE_FD.store(fd, Release);
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        let spawned = std::thread::Builder::new()
            .name("gpuguard".into())
            .spawn(move || run(fd));
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if spawned.is_err() {
            THREAD_RUNNING.store(false, Release);
            log(
                LogLevel::Warn,
                format_args!("could not start the helper thread; signal reports are off"),
            );
        }
    }
}

/// Wakes the helper thread for an event a hook noticed (a refusal, a threshold).
pub(crate) fn wake() {
    let fd = WAKE_FD.load(Relaxed);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(fd, &one as *const u64 as *const c_void, 8) };
    }
}

pub(super) fn after_fork_in_child() {
    // The parent's thread does not exist here; the eventfd is the parent's too.
    THREAD_RUNNING.store(false, Release);
    let fd = WAKE_FD.swap(-1, AcqRel);
    if fd >= 0 {
        // SAFETY: closing our own descriptor in the child.
        unsafe { libc::close(fd) };
    }
    REPORT_REQUESTS.store(0, Relaxed);
    TRIM_REQUESTS.store(0, Relaxed);
    EXIT_WRITTEN.store(false, Relaxed);
    super::python::after_fork_in_child();
}

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

fn run(fd: c_int) {
    ON_HELPER.with(|h| h.set(true));
    let mut trims_handled = 0;
    let mut last_auto_trim: Option<u64> = None;
    let started = super::track::monotonic_ns();
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
    let mut next_snapshot = every_ns.map(|e| super::track::monotonic_ns().saturating_add(e));
    loop {
        let cap_waiting = active_books().is_some_and(|b| b.cap_pending.load(Acquire));
        let mut timeout_ms: u64 = if cap_waiting { 100 } else { 1000 };
        if super::python::frames::enabled() {
            timeout_ms = timeout_ms.min(200); // new Python call sites are named soon
        }
        if let Some(due) = next_snapshot {
            let left = due.saturating_sub(super::track::monotonic_ns());
            timeout_ms = timeout_ms.min(left.div_ceil(1_000_000));
        }
        let install_due = started.saturating_add(install_after_ms(installs) * 1_000_000);
        let left = install_due.saturating_sub(super::track::monotonic_ns());
        timeout_ms = timeout_ms.min(left.div_ceil(1_000_000));
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
        let now = REPORT_REQUESTS.load(Relaxed);
        if now != handled {
            handled = now;
            shielded(|| write_report("signal"));
        }
        if TRIM_REQUESTS.load(Relaxed) != trims_handled {
            let base = trims_handled;
            // Signals that come while it runs are answered by it too.
            trims_handled = shielded(|| trim_now("signal", Some(base)))
                .flatten()
                .unwrap_or_else(|| TRIM_REQUESTS.load(Relaxed));
        }
        if super::track::monotonic_ns() >= install_due {
            installs += 1;
            shielded(install_python);
        } else if let Some(books) = active_books() {
            // New call sites with Python frames: have them named soon, while their
            // code objects are alive.
            let n = books.sites.len();
            if n != sites_seen {
                sites_seen = n;
                if shielded(|| !super::python::frames::unresolved(&books.sites).is_empty())
                    .unwrap_or(false)
                {
                    shielded(install_python);
                }
            }
        }
        if let (Some(due), Some(every)) = (next_snapshot, every_ns) {
            let t = super::track::monotonic_ns();
            if t >= due {
                // Late past a whole interval (a slow report): the next is one from now.
                let next = due.saturating_add(every);
                next_snapshot = Some(if next <= t {
                    t.saturating_add(every)
                } else {
                    next
                });
                shielded(|| write_report("snapshot"));
            }
        }
        if let Some(books) = active_books() {
            let auto = shielded(|| thresholds(books)).unwrap_or(None);
            if claim_cap_report(books) {
                shielded(|| write_report("cap"));
            }
            let auto = auto.or_else(|| books.cap_trim_wanted.swap(false, AcqRel).then_some("cap"));
            if let Some(trigger) = auto {
                // At most one automatic trim per GPUGUARD_TRIM_INTERVAL: a job at its
                // cap must not trim in a loop.
                let t = super::track::monotonic_ns();
                let every = settings().cfg.trim_interval_ms.saturating_mul(1_000_000);
                if last_auto_trim.is_none_or(|l| t.saturating_sub(l) >= every) {
                    last_auto_trim = Some(t);
                    shielded(|| trim_now(trigger, None));
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
    }
}

/// Turns the Python side on (recorders, the exit hook) without waiting for it.
fn install_python() {
    if !super::python::present() {
        return;
    }
    let devices = active_books()
        .map(|b| b.ledger.seen_devices())
        .unwrap_or_default();
    let _ = super::python::run(&super::python::call("_gg_install", &devices), None);
}

/// Runs a trim and writes its report. For signals, `base` is the count of trim
/// signals already answered; every signal up to the end of this trim merges into it,
/// and the new count is returned.
fn trim_now(trigger: &str, base: Option<u64>) -> Option<u64> {
    let books = active_books()?;
    let mut t = super::trim::perform(books, trigger);
    let answered = base.map(|b| {
        let now = TRIM_REQUESTS.load(Relaxed);
        t.merged = now.saturating_sub(b).max(1);
        now
    });
    write_report_with("trim", Extra { trim: Some(t) });
    answered
}

/// Whether a cap report should be written now, claiming it if so: one at the first
/// refusal, then at most one a second, whichever thread (helper or exit) asks.
pub(crate) fn claim_cap_report(books: &super::Books) -> bool {
    if !books.cap_pending.load(Acquire) {
        return false;
    }
    let now = super::track::monotonic_ns().max(1);
    let last = books.last_cap_report_ns.load(Acquire);
    if last != 0 && now.saturating_sub(last) < 1_000_000_000 {
        return false;
    }
    books
        .last_cap_report_ns
        .compare_exchange(last, now, AcqRel, Acquire)
        .is_ok()
        && books.cap_pending.swap(false, AcqRel)
}

/// Warnings for thresholds the hooks saw crossed; `Some("threshold")` when a trim
/// threshold was crossed (the caller runs the trim, rate-limited).
fn thresholds(books: &super::Books) -> Option<&'static str> {
    let mut trim = None;
    for (dev, t) in books.thresholds.iter().enumerate() {
        let dev = dev as i32;
        if t.warn_pending.swap(false, Relaxed) {
            let c = books.ledger.device(dev);
            log(
                LogLevel::Warn,
                format_args!(
                    "device {dev}: {} of its {} cap in use (peak {}), past GPUGUARD_WARN_AT",
                    human_bytes(t.crossed_at.load(Relaxed)),
                    human_bytes(c.cap().unwrap_or(0)),
                    human_bytes(c.peak.load(Relaxed))
                ),
            );
        }
        if t.trim_pending.swap(false, Relaxed) {
            trim = Some("threshold");
        }
    }
    trim
}

// ---- reports -------------------------------------------------------------------------

fn program_name() -> String {
    unsafe extern "C" {
        static program_invocation_short_name: *const std::ffi::c_char;
    }
    // SAFETY: glibc sets this before constructors run; it is a C string.
    unsafe {
        let p = program_invocation_short_name;
        if p.is_null() {
            return "unknown".into();
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

fn argv() -> Vec<String> {
    std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Symbol tables read so far for one report, by module path.
type Tables = RefCell<HashMap<String, Option<SymbolTable>>>;

/// `function+0x.. (module+0x..)`, the function from the module's ELF symbols (or the
/// loader's), else `module+0x..`. Frames of gpuguard and the CUDA libraries are marked
/// internal, so a site starts at the caller.
fn symbolize(pc: usize, tables: &Tables) -> FrameInfo {
    use super::python::frames;
    if frames::is_python(pc) {
        return FrameInfo {
            text: match frames::text(pc) {
                Some(t) => format!("{}{t}", gpuguard_core::report::PY_FRAME),
                None => format!("{}(code no longer alive)", gpuguard_core::report::PY_FRAME),
            },
            internal: false,
        };
    }
    // A return address points after the call; look up the call itself.
    let at = pc.saturating_sub(1);
    // SAFETY: dladdr only reads the loader's tables.
    let mut dl: libc::Dl_info = unsafe { std::mem::zeroed() };
    if unsafe { libc::dladdr(at as *const c_void, &mut dl) } == 0 || dl.dli_fname.is_null() {
        return FrameInfo {
            text: format!("{pc:#x}"),
            internal: false,
        };
    }
    // SAFETY: dladdr filled these with C strings owned by the loader.
    let path = unsafe { CStr::from_ptr(dl.dli_fname) }
        .to_string_lossy()
        .into_owned();
    let base = dl.dli_fbase as usize;
    let module = match path.rsplit('/').next() {
        Some(m) if !m.is_empty() => m.to_string(),
        _ => program_name(),
    };
    let off = at - base;
    let internal = super::real::is_own_code(at)
        || module.starts_with("libcuda.so")
        || module.starts_with("libcudart.so");
    let file = if path.is_empty() {
        "/proc/self/exe".to_string()
    } else {
        path
    };
    let mut tables = tables.borrow_mut();
    let table = tables
        .entry(file.clone())
        .or_insert_with(|| SymbolTable::load(std::path::Path::new(&file)));
    let from_elf = table.as_ref().and_then(|t| {
        let addr = if t.absolute { at } else { off } as u64;
        t.lookup(addr).map(|(n, o)| (demangle(n), o))
    });
    let from_loader = || {
        (!dl.dli_sname.is_null()).then(|| {
            // SAFETY: as above.
            let n = unsafe { CStr::from_ptr(dl.dli_sname) }.to_string_lossy();
            (demangle(&n), (at - dl.dli_saddr as usize) as u64)
        })
    };
    let text = match from_elf.or_else(from_loader) {
        Some((name, o)) => format!("{name}+{o:#x} ({module}+{off:#x})"),
        None => format!("{module}+{off:#x}"),
    };
    FrameInfo { text, internal }
}

/// C++ (and Rust legacy) names through the process's own `__cxa_demangle`, where a
/// C++ runtime is loaded; otherwise the name as it is.
fn demangle(name: &str) -> String {
    type Demangle =
        unsafe extern "C" fn(*const c_char, *mut c_char, *mut usize, *mut c_int) -> *mut c_char;
    if !name.starts_with("_Z") {
        return name.to_string();
    }
    let Ok(cname) = std::ffi::CString::new(name) else {
        return name.to_string();
    };
    // SAFETY: a lookup through glibc; the function, if any, is libstdc++'s demangler,
    // which returns a malloc'ed string or NULL.
    unsafe {
        // The C++ runtime is often loaded privately (by a dlopen'ed framework), so
        // look in libstdc++ itself too.
        let mut f = super::real::lookup(libc::RTLD_DEFAULT, c"__cxa_demangle");
        if f.is_null() {
            let h = libc::dlopen(
                c"libstdc++.so.6".as_ptr(),
                libc::RTLD_LAZY | libc::RTLD_NOLOAD,
            );
            if !h.is_null() {
                f = super::real::lookup(h, c"__cxa_demangle");
                libc::dlclose(h);
            }
        }
        if f.is_null() {
            return name.to_string();
        }
        let f: Demangle = std::mem::transmute(f);
        let mut status: c_int = -1;
        let out = f(
            cname.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut status,
        );
        if out.is_null() {
            return name.to_string();
        }
        let s = CStr::from_ptr(out).to_string_lossy().into_owned();
        libc::free(out as *mut c_void);
        if status == 0 { s } else { name.to_string() }
    }
}

/// What some reports carry beyond the books.
#[derive(Default)]
pub(crate) struct Extra {
    pub trim: Option<gpuguard_core::report::TrimReport>,
}

/// How long a report waits for the Python side's classification.
const CLASSIFY_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The frameworks' account of their memory, for a report: asked now on the helper
/// thread (the only one that may wait for the main thread); at exit, what Python's
/// `atexit` handed over; otherwise none.
fn classification(books: &super::Books, reason: &str) -> Option<gpuguard_core::classify::Answer> {
    use super::python::{self, Outcome};
    let text = if reason == "exit" {
        python::at_exit_answer()?
    } else if ON_HELPER.with(|h| h.get()) && python::present() {
        let call = python::call("_gg_classify", &books.ledger.seen_devices());
        match python::run(&call, Some(CLASSIFY_WAIT)) {
            Outcome::Answer(t) => t,
            o => {
                log(
                    LogLevel::Info,
                    format_args!(
                        "no framework classification for this report: {}",
                        o.status()
                    ),
                );
                return None;
            }
        }
    } else {
        return None;
    };
    match gpuguard_core::classify::Answer::parse(&text) {
        Ok(a) => Some(a),
        Err(e) => {
            log(LogLevel::Warn, format_args!("{e}"));
            None
        }
    }
}

/// Set once the exit report is written (from Python's `atexit` in a Python process,
/// else from the C-level exit handler), so it is written once.
static EXIT_WRITTEN: AtomicBool = AtomicBool::new(false);

/// The exit report, the first time this is asked for in the process.
pub(crate) fn write_exit_report() {
    if active_books().is_some() && !EXIT_WRITTEN.swap(true, AcqRel) {
        shielded(|| write_report("exit"));
    }
}

/// Builds and writes a report now; returns where it went (None: to stderr).
pub(crate) fn write_report(reason: &str) -> Option<PathBuf> {
    write_report_with(reason, Extra::default())
}

pub(crate) fn write_report_with(reason: &str, extra: Extra) -> Option<PathBuf> {
    let books = active_books()?;
    // Asked before the report lock: the main thread may be waiting for that lock.
    let classes = classification(books, reason);
    let _guard = books.report_lock.lock().unwrap_or_else(|e| e.into_inner());
    let s = settings();
    let seq = books.seq.fetch_add(1, Relaxed) + 1;
    let pid = std::process::id();
    let program = program_name();
    let now = super::track::monotonic_ns();
    let tables: Tables = RefCell::new(HashMap::new());
    // Pools also give memory back at stream synchronization: measure them now.
    for d in books.ledger.seen_devices() {
        books.refresh_pools(d);
    }
    let input = ReportInput {
        reason,
        seq,
        pid,
        program: &program,
        argv: argv(),
        time_unix_ms: unix_ms(),
        uptime_s: now.saturating_sub(books.started_ns) as f64 / 1e9,
        now_ns: now,
        ledger: &books.ledger,
        sites: &books.sites,
        api_name: &super::table::api_name,
        symbolize: &|pc| symbolize(pc, &tables),
        device_total: &|d| books.total(d),
        config: ReportConfig {
            stack_depth: s.cfg.stack_depth,
            report_signal: s.cfg.report_signal,
            dir: s.dir.to_string_lossy().into_owned(),
            max_live: s.cfg.max_live,
            snapshot_every_ms: s.cfg.snapshot_every_ms,
        },
        denial: if reason == "cap" {
            denial(books, &tables)
        } else {
            None
        },
        max_live: s.cfg.max_live,
        launch: &s.launch,
    };
    let mut report = reporter::build(&input);
    report.trim = extra.trim;
    let recorded = classes.is_some_and(|c| gpuguard_core::classify::apply(&mut report, c));
    gpuguard_core::classify::python_sites_from_stacks(&mut report, recorded);
    let name = reporter::file_name(&program, s.launch.rank, pid, seq, reason);
    let headline = headline(&report);
    // Compact JSON, streamed to the file: `gpuguard show` is for reading it.
    let written = reporter::write_atomic_with(&s.dir, &name, |w| {
        serde_json::to_writer(&mut *w, &report).map_err(std::io::Error::other)?;
        w.write_all(b"\n")
    });
    match written {
        Ok(path) => {
            match &report.trim {
                Some(t) => super::trim::announce(t, Some(&path)),
                None => log(
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
                super::trim::announce(t, None);
            }
            log(
                LogLevel::Warn,
                format_args!("report ({reason}) follows: {headline}"),
            );
            let mut json = serde_json::to_vec_pretty(&report).unwrap_or_default();
            json.push(b'\n');
            write_stderr(&json);
            None
        }
    }
}

/// The last refusal, with its stack symbolized, for a `cap` report.
fn denial(books: &super::Books, tables: &Tables) -> Option<gpuguard_core::report::DenialReport> {
    let d = books
        .denial
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()?;
    let stack = books
        .sites
        .all()
        .get(d.site as usize)
        .cloned()
        .unwrap_or_default();
    let infos: Vec<FrameInfo> = stack.iter().map(|&pc| symbolize(pc, tables)).collect();
    let first_user = infos.iter().position(|f| !f.internal).unwrap_or(0);
    Some(gpuguard_core::report::DenialReport {
        device: d.device,
        bytes: d.bytes,
        api: super::table::api_name(d.api).to_string(),
        charged_bytes: d.charged,
        cap_bytes: d.cap,
        frames: infos.into_iter().skip(first_user).map(|f| f.text).collect(),
    })
}

fn headline(r: &gpuguard_core::report::Report) -> String {
    let mut parts: Vec<String> = r
        .devices
        .iter()
        .map(|d| {
            format!(
                "device {}: {} live in {} allocations, peak {}",
                d.device,
                human_bytes(d.current_bytes),
                d.live_count,
                human_bytes(d.peak_bytes)
            )
        })
        .collect();
    if parts.is_empty() {
        parts.push("no device memory used".into());
    }
    if let Some(d) = &r.denial {
        parts.insert(
            0,
            format!(
                "cap refused {} ({}) on device {}: {} of {} in use",
                human_bytes(d.bytes),
                d.api,
                d.device,
                human_bytes(d.charged_bytes),
                human_bytes(d.cap_bytes)
            ),
        );
    }
    if r.host_pinned.peak_bytes > 0 {
        parts.push(format!(
            "pinned host {} live",
            human_bytes(r.host_pinned.current_bytes)
        ));
    }
    parts.join("; ")
}
