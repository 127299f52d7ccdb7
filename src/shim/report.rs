//! Reports: built from the books, symbolized, written atomically to the report
//! directory (or to stderr when it cannot be written), with one line on stderr.
//! Whoever asks for one supplies the frameworks' account, if it has one.

use super::books::Books;
use super::settings::{LogLevel, log, settings};
use super::state::{active_books, shielded};
use super::sys::{self, write_stderr};
use super::{real, table};
use gpuguard_core::classify::Answer;
use gpuguard_core::report::{ReportConfig, TrimReport, human_bytes};
use gpuguard_core::reporter::{self, FrameInfo, ReportInput};
use gpuguard_core::symbols::SymbolTable;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::*};

static DIR_WARNED: AtomicBool = AtomicBool::new(false);

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
            interpreter: false,
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
            interpreter: false,
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
    let internal = real::is_own_code(at)
        || module.starts_with("libcuda.so")
        || module.starts_with("libcudart.so");
    // CPython (a shared libpython or a python executable) and the foreign-function
    // layer ctypes calls C through.
    let interpreter = module.starts_with("libpython")
        || module.starts_with("python")
        || module.starts_with("libffi.so")
        || module.starts_with("_ctypes");
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
    FrameInfo {
        text,
        internal,
        interpreter,
    }
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
        let mut f = real::lookup(libc::RTLD_DEFAULT, c"__cxa_demangle");
        if f.is_null() {
            let h = libc::dlopen(
                c"libstdc++.so.6".as_ptr(),
                libc::RTLD_LAZY | libc::RTLD_NOLOAD,
            );
            if !h.is_null() {
                f = real::lookup(h, c"__cxa_demangle");
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

/// Set once the exit report is written (from Python's `atexit` in a Python process,
/// else from the C-level exit handler), so it is written once.
static EXIT_WRITTEN: AtomicBool = AtomicBool::new(false);

/// The exit report, the first time this is asked for in the process, with the
/// frameworks' account `at_exit_answer` gives (what Python's `atexit` handed over).
pub(crate) fn write_exit_report(at_exit_answer: impl FnOnce() -> Option<String>) {
    if let Some(books) = active_books()
        && !EXIT_WRITTEN.swap(true, AcqRel)
    {
        shielded(|| write(books, "exit", Extra::default(), at_exit_answer()));
    }
}

/// In a forked child: the parent's exit report is not the child's.
pub(crate) fn after_fork_in_child() {
    EXIT_WRITTEN.store(false, Relaxed);
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
    let _guard = books.report_lock.lock().unwrap_or_else(|e| e.into_inner());
    let s = settings();
    let seq = books.seq.fetch_add(1, Relaxed) + 1;
    let pid = std::process::id();
    let program = program_name();
    let now = sys::monotonic_ns();
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
        api_name: &table::api_name,
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
                Some(t) => announce(t, Some(&path)),
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
                announce(t, None);
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
fn denial(books: &Books, tables: &Tables) -> Option<gpuguard_core::report::DenialReport> {
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
    Some(gpuguard_core::report::DenialReport {
        device: d.device,
        bytes: d.bytes,
        api: table::api_name(d.api).to_string(),
        charged_bytes: d.charged,
        cap_bytes: d.cap,
        frames: reporter::site_frames(&infos.iter().collect::<Vec<_>>()),
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
    log(
        LogLevel::Warn,
        format_args!(
            "trim ({}): {} released ({}); {}; python {}{}",
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
