//! Everything that touches the process: load-time setup, the lifecycle, signals, fork,
//! exit, and the hooks. All `unsafe` FFI of gpuguard lives under this module.
//!
//! Lifecycle: INERT at load (no thread, no file, no output) -> ACTIVE at the first CUDA
//! call that gpuguard tracks (books created, helper thread started) -> DISABLED if
//! gpuguard itself failed (every hook then passes straight through). A forked child
//! starts INERT again with fresh books.

// Under `cargo test` the exports are not exported (a test binary must not interpose
// on itself), so much of this module is unreachable there.
#![cfg_attr(test, allow(dead_code))]

pub mod capi;
mod caps;
pub mod hooks;
mod python;
mod real;
mod table;
mod track;
mod trim;
mod unwind;
mod worker;

use gpuguard_core::config::{Config, LogLevel};
use gpuguard_core::ledger::Ledger;
use gpuguard_core::sites::SiteTable;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, Ordering::*};
use std::sync::{Mutex, OnceLock};

const INERT: u8 = 0;
const ACTIVE: u8 = 1;
const DISABLED: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(INERT);
static ACTIVATING: AtomicBool = AtomicBool::new(false);
static BOOKS: AtomicPtr<Books> = AtomicPtr::new(std::ptr::null_mut());
static CONFIG: OnceLock<Settings> = OnceLock::new();

/// The books of one process (a forked child gets new ones).
pub(crate) struct Books {
    pub ledger: Ledger,
    pub sites: SiteTable,
    pub started_ns: u64,
    /// Serializes report writing; reports never tear.
    pub report_lock: Mutex<()>,
    pub seq: AtomicU64,
    /// Device sizes, asked once per device when it is first used.
    pub totals: Box<[AtomicU64]>,
    /// Memory pools: their device and what each held at its last measurement.
    pub pools: gpuguard_core::ledger::U64Map<caps::PoolInfo>,
    /// Each device's current pool (what `cuMemAllocAsync` draws from), 0 if unknown.
    pub current_pool: Box<[AtomicU64]>,
    /// Contexts made with cuCtxCreate (the rest are primary contexts).
    pub created_ctx: gpuguard_core::ledger::U64Map<()>,
    /// Set before the first cuCtxCreate: until then records need no context.
    pub created_any: AtomicBool,
    /// Devices visible to the process, asked at the first allocation (0: not yet;
    /// -1: the driver could not say).
    pub device_count: std::sync::atomic::AtomicI32,
    /// VMM mappings, so a handle released while mapped is freed at its last unmap.
    pub vmm: gpuguard_core::vmm::VmmMaps,
    /// Warning and trim thresholds of capped devices.
    pub thresholds: Box<[caps::Thresholds]>,
    /// The last refusal by a cap, waiting for its report.
    pub denial: Mutex<Option<caps::Denial>>,
    pub cap_pending: AtomicBool,
    /// A refusal asks the helper thread for a full trim (rate-limited).
    pub cap_trim_wanted: AtomicBool,
    /// When the last cap report was claimed (monotonic ns, 0: never).
    pub last_cap_report_ns: AtomicU64,
    /// NVML device handles and their CUDA ordinals (-1: not visible here).
    pub nvml: gpuguard_core::ledger::U64Map<i32>,
}

impl Books {
    fn new() -> Books {
        Books {
            ledger: Ledger::new(),
            sites: SiteTable::new(),
            started_ns: track::monotonic_ns(),
            report_lock: Mutex::new(()),
            seq: AtomicU64::new(0),
            totals: (0..gpuguard_core::ledger::MAX_DEVICES)
                .map(|_| AtomicU64::new(0))
                .collect(),
            pools: Default::default(),
            current_pool: (0..gpuguard_core::ledger::MAX_DEVICES)
                .map(|_| AtomicU64::new(0))
                .collect(),
            created_ctx: Default::default(),
            created_any: AtomicBool::new(false),
            device_count: std::sync::atomic::AtomicI32::new(0),
            vmm: gpuguard_core::vmm::VmmMaps::new(),
            thresholds: caps::new_thresholds(),
            denial: Mutex::new(None),
            cap_pending: AtomicBool::new(false),
            cap_trim_wanted: AtomicBool::new(false),
            last_cap_report_ns: AtomicU64::new(0),
            nvml: Default::default(),
        }
    }

    /// Whether exactly one device is visible (so every allocation is on device 0).
    #[inline]
    pub fn single_device(&self) -> bool {
        let mut n = self.device_count.load(Relaxed);
        if n == 0 {
            // Asked once: a driver that cannot say (-1) is remembered too, so the
            // hot path never asks again.
            n = real::DRIVER.device_count().filter(|c| *c > 0).unwrap_or(-1);
            self.device_count.store(n, Relaxed);
        }
        n == 1
    }

    pub fn total(&self, device: i32) -> u64 {
        let t = usize::try_from(device)
            .ok()
            .and_then(|d| self.totals.get(d))
            .map_or(0, |t| t.load(Relaxed));
        if t == u64::MAX { 0 } else { t }
    }
}

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

/// The books, activating gpuguard on first use. `None` once disabled.
#[inline]
pub(crate) fn books() -> Option<&'static Books> {
    if STATE.load(Acquire) == ACTIVE {
        active_books()
    } else {
        activate()
    }
}

/// The books only if gpuguard is already active (never activates).
pub(crate) fn active_books() -> Option<&'static Books> {
    if STATE.load(Acquire) != ACTIVE {
        return None;
    }
    // SAFETY: BOOKS is set before STATE becomes ACTIVE and is never freed.
    unsafe { BOOKS.load(Acquire).as_ref() }
}

#[cold]
fn activate() -> Option<&'static Books> {
    loop {
        match STATE.load(Acquire) {
            ACTIVE => return active_books(),
            DISABLED => return None,
            _ => {}
        }
        if ACTIVATING
            .compare_exchange(false, true, AcqRel, Acquire)
            .is_ok()
        {
            if STATE.load(Acquire) == INERT {
                BOOKS.store(Box::into_raw(Box::new(Books::new())), Release);
                STATE.store(ACTIVE, Release);
                shielded(|| {
                    worker::signals_on_activation();
                    worker::start();
                    if let Some(b) = active_books() {
                        b.check_cap_devices();
                    }
                });
                log(LogLevel::Info, format_args!("active: first CUDA call seen"));
            }
            ACTIVATING.store(false, Release);
        } else {
            std::thread::yield_now();
        }
    }
}

/// Runs gpuguard's own logic; a panic in it disables gpuguard instead of unwinding
/// into the program (the real CUDA call has already happened, or will happen anyway).
pub(crate) fn shielded<R>(f: impl FnOnce() -> R) -> Option<R> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => Some(r),
        Err(_) => {
            if STATE.swap(DISABLED, AcqRel) != DISABLED {
                log(
                    LogLevel::Warn,
                    format_args!("internal error; tracking is off for the rest of this process"),
                );
            }
            None
        }
    }
}

/// One line on stderr, `gpuguard[<pid>]: ...`, written with one write(2).
pub(crate) fn log(level: LogLevel, args: std::fmt::Arguments<'_>) {
    if level > config().log || level == LogLevel::Off {
        return;
    }
    let line = format!("gpuguard[{}]: {}\n", std::process::id(), args);
    write_stderr(line.as_bytes());
}

pub(crate) fn write_stderr(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: writing a valid buffer to fd 2.
        let n = unsafe { libc::write(2, bytes.as_ptr() as *const c_void, bytes.len()) };
        if n <= 0 {
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

// ---- load, fork, exit -------------------------------------------------------------------

#[cfg(not(test))]
#[ctor::ctor(unsafe)]
fn on_load() {
    load();
}

#[cfg_attr(test, allow(dead_code))]
fn load() {
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("GPUGUARD_"))
        .collect();
    let parsed = Config::parse(names.iter().map(String::as_str), |k| {
        std::env::var_os(k).map(|v| v.to_string_lossy().into_owned())
    });
    let cfg = match parsed {
        Ok(c) => c,
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
    let _ = CONFIG.set(Settings {
        cfg,
        dir,
        ptds_default,
        launch,
    });
    real::find_own_range();
    let _ = real::real_dlsym();
    worker::install_signal_handler();
    // SAFETY: registering plain extern "C" callbacks.
    unsafe {
        libc::pthread_atfork(None, None, Some(after_fork_in_child));
        libc::atexit(at_exit);
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

/// The child forgets the parent's allocations; it starts INERT and gets fresh books
/// (and its own report) only if it uses CUDA itself.
extern "C" fn after_fork_in_child() {
    BOOKS.store(std::ptr::null_mut(), Release);
    ACTIVATING.store(false, Release);
    if STATE.load(Acquire) == ACTIVE {
        STATE.store(INERT, Release);
    }
    worker::after_fork_in_child();
}

/// The exit report: what is still live is the leak list.
extern "C" fn at_exit() {
    if let Some(books) = active_books() {
        // A refusal the helper thread had no time to report still gets its report.
        if worker::claim_cap_report(books) {
            shielded(|| worker::write_report("cap"));
        }
        worker::write_exit_report();
        log(
            LogLevel::Debug,
            format_args!(
                "stack captures: {} walked, {} full unwinds",
                unwind::WALKS.load(Relaxed),
                unwind::FULL_UNWINDS.load(Relaxed)
            ),
        );
    }
}
