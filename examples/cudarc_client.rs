//! A small CUDA client written with cudarc's safe driver API, used to validate
//! gpuguard from a Rust program (cudarc loads libcuda with `dlopen` and
//! resolves every entry point with `dlsym`, the path JAX also takes).
//!
//! What it does, on device 0's default stream:
//! 1. allocates a few buffers of different sizes (`alloc_zeros`, `clone_htod`),
//!    reads two back (`clone_dtoh`) and checks their contents;
//! 2. frees some, churns 64 short-lived buffers of assorted sizes;
//! 3. leaks one buffer with `std::mem::forget` (prints `LEAK 0x.. bytes N`)
//!    and keeps another alive until just before exit;
//! 4. mid-run prints `GGV_MIDRUN pid=N` and, when asked (`GGV_EXPECT_SIGNAL=1`
//!    or `GGV_SIGNAL_SELF=1`), waits for gpuguard's signal report;
//! 5. writes a `request` report through the C API.
//!
//! At each checkpoint it prints one JSON line comparing its own books (bytes
//! and alloc/free counts since the start) with gpuguard's counters, which it
//! finds with `dlsym(RTLD_DEFAULT, "gpuguard_device_counters")`: without the
//! preloaded shim the gpuguard fields are null. Driver free memory
//! (`cuMemGetInfo`) deltas are printed as information only.
//!
//! Only common driver calls are used (cuInit, cuDeviceGet, primary context,
//! cuDeviceGetAttribute, cuMemAlloc(Async), cuMemFree(Async), cuMemsetD8Async,
//! cuMemcpyHtoDAsync/DtoHAsync, cuStreamSynchronize, cuMemGetInfo): event
//! tracking is switched off because only the default stream is used, so it
//! also runs on a simulated libcuda.
//!
//! Exit status: 0 when every CUDA call succeeded and the data read back was
//! right (verdicts are reported, not enforced); 1 on a CUDA error; 2 when
//! libcuda cannot be loaded.

use std::collections::BTreeMap;
use std::ffi::{CStr, c_char, c_void};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DriverError};
use serde_json::{Value, json};

/// Mirrors the C API's `struct gpuguard_device_counters`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct DeviceCounters {
    device: i32,
    reserved0: u32,
    total_bytes: u64,
    cap_bytes: u64,
    current_bytes: u64,
    peak_bytes: u64,
    allocs: u64,
    frees: u64,
    failed: u64,
    denied: u64,
    unknown_frees: u64,
}

type CountersFn = unsafe extern "C" fn(i32, *mut DeviceCounters) -> i32;
type WriteReportFn = unsafe extern "C" fn(*const c_char, *mut c_char, usize) -> i32;
type VersionFn = unsafe extern "C" fn() -> *const c_char;

/// The gpuguard C API, when the shim is loaded in this process.
struct Guard {
    counters: Option<CountersFn>,
    write_report: Option<WriteReportFn>,
    version: Option<String>,
}

fn lookup(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name has no preconditions.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

impl Guard {
    fn resolve() -> Self {
        let c = lookup(c"gpuguard_device_counters");
        let w = lookup(c"gpuguard_write_report");
        let v = lookup(c"gpuguard_version");
        // SAFETY: each symbol, when present, has the C signature declared above.
        unsafe {
            let counters =
                (!c.is_null()).then(|| std::mem::transmute::<*mut c_void, CountersFn>(c));
            let write_report =
                (!w.is_null()).then(|| std::mem::transmute::<*mut c_void, WriteReportFn>(w));
            let version = (!v.is_null()).then(|| {
                let f = std::mem::transmute::<*mut c_void, VersionFn>(v);
                let p = f();
                if p.is_null() {
                    String::from("?")
                } else {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            });
            Guard {
                counters,
                write_report,
                version,
            }
        }
    }

    fn counters(&self) -> Option<DeviceCounters> {
        let f = self.counters?;
        let mut out = DeviceCounters::default();
        // SAFETY: `out` is a valid, writable struct of the layout the API expects.
        let rc = unsafe { f(0, &mut out) };
        (rc == 0).then_some(out)
    }

    fn write_report(&self, reason: &CStr) -> Option<(i32, String)> {
        let f = self.write_report?;
        let mut buf = vec![0u8; 4096];
        // SAFETY: reason is NUL-terminated; buf is writable for buf.len() bytes.
        let rc = unsafe {
            f(
                reason.as_ptr(),
                buf.as_mut_ptr().cast::<c_char>(),
                buf.len(),
            )
        };
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Some((rc, String::from_utf8_lossy(&buf[..end]).into_owned()))
    }
}

/// The program's own books: bytes and calls it made since the baseline.
#[derive(Default)]
struct Books {
    live_bytes: i64,
    allocs: u64,
    frees: u64,
}

impl Books {
    fn alloc(&mut self, bytes: usize) {
        self.live_bytes += bytes as i64;
        self.allocs += 1;
    }
    fn free(&mut self, bytes: usize) {
        self.live_bytes -= bytes as i64;
        self.frees += 1;
    }
}

struct Run {
    guard: Guard,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    base: Option<DeviceCounters>,
    base_free: Option<usize>,
    books: Books,
    mismatches: u32,
}

fn err(what: &str, e: DriverError) -> String {
    // Format the raw code only: DriverError's Debug asks the driver for a string.
    format!("{what}: CUDA driver error {:?}", e.0)
}

impl Run {
    fn free_mem(&self) -> Option<usize> {
        self.ctx.mem_get_info().ok().map(|(free, _total)| free)
    }

    fn check(&mut self, name: &str, note: &str) -> Result<(), String> {
        self.stream
            .synchronize()
            .map_err(|e| err("stream synchronize", e))?;
        let now = self.guard.counters();
        let free = self.free_mem();
        let driver_used_delta = match (self.base_free, free) {
            (Some(a), Some(b)) => Some(a as i64 - b as i64),
            _ => None,
        };
        let mut line = json!({
            "check": name,
            "framework": "cudarc",
            "mode": if self.ctx.has_async_alloc() { "cuMemAllocAsync" } else { "cuMemAlloc" },
            "expected_delta": self.books.live_bytes,
            "expected_allocs": self.books.allocs,
            "expected_frees": self.books.frees,
            "driver_used_delta": driver_used_delta,
            "note": note,
        });
        match (self.base, now) {
            (Some(b), Some(n)) => {
                let d_bytes = n.current_bytes as i64 - b.current_bytes as i64;
                let d_allocs = n.allocs as i64 - b.allocs as i64;
                let d_frees = n.frees as i64 - b.frees as i64;
                let bytes_ok = d_bytes == self.books.live_bytes;
                let counts_ok =
                    d_allocs == self.books.allocs as i64 && d_frees == self.books.frees as i64;
                let verdict = if bytes_ok && counts_ok {
                    "agree"
                } else {
                    "mismatch"
                };
                if verdict == "mismatch" {
                    self.mismatches += 1;
                }
                let why = match (bytes_ok, counts_ok) {
                    (true, true) => {
                        "bytes and alloc/free counts since the start equal the client's own books"
                    }
                    (false, true) => "device bytes differ from the client's books",
                    (true, false) => "alloc/free counts differ from the client's books",
                    (false, false) => "bytes and counts differ from the client's books",
                };
                line["gpuguard_delta"] = json!(d_bytes);
                line["diff"] = json!(d_bytes - self.books.live_bytes);
                line["gpuguard_allocs"] = json!(d_allocs);
                line["gpuguard_frees"] = json!(d_frees);
                line["gpuguard_current"] = json!(n.current_bytes);
                line["gpuguard_peak"] = json!(n.peak_bytes);
                line["gpuguard_failed"] = json!(n.failed);
                line["gpuguard_unknown_frees"] = json!(n.unknown_frees);
                line["gpuguard_counters"] = json!({
                    "device": n.device, "total_bytes": n.total_bytes, "cap_bytes": n.cap_bytes,
                    "current_bytes": n.current_bytes, "peak_bytes": n.peak_bytes, "allocs": n.allocs,
                    "frees": n.frees, "failed": n.failed, "denied": n.denied, "unknown_frees": n.unknown_frees,
                });
                line["verdict"] = json!(verdict);
                line["explanation"] = json!(why);
            }
            _ => {
                line["gpuguard_current"] = Value::Null;
                line["verdict"] = json!("no-gpuguard");
                line["explanation"] = json!("gpuguard C API not found (shim not preloaded?)");
            }
        }
        println!("{line}");
        Ok(())
    }
}

fn report_dir() -> Option<PathBuf> {
    std::env::var_os("GPUGUARD_DIR").map(PathBuf::from)
}

/// Finds this process's report with the given reason in GPUGUARD_DIR.
fn find_report(reason: &str) -> Option<PathBuf> {
    let dir = report_dir()?;
    let pid = std::process::id();
    let mid = format!(".{pid}.");
    let suffix = format!(".{reason}.json");
    let entries = std::fs::read_dir(&dir).ok()?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("gpuguard.") && name.contains(&mid) && name.ends_with(&suffix) {
            return Some(e.path());
        }
    }
    None
}

fn report_current(path: &PathBuf) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v.get("devices")?
        .as_array()?
        .iter()
        .find(|d| d.get("device").and_then(Value::as_i64) == Some(0))?
        .get("current_bytes")?
        .as_u64()
}

fn env_is(name: &str, want: &str) -> bool {
    std::env::var(name).map(|v| v == want).unwrap_or(false)
}

fn midrun(run: &Run) {
    let want_self = env_is("GGV_SIGNAL_SELF", "1");
    let expect = want_self || env_is("GGV_EXPECT_SIGNAL", "1");
    let present = run.guard.counters.is_some();
    if !present {
        // No shim, so nothing handles SIGUSR1: ignore it so that the runner's
        // kill does not end a bare run.
        // SAFETY: installing SIG_IGN for SIGUSR1 is always sound.
        unsafe { libc::signal(libc::SIGUSR1, libc::SIG_IGN) };
    }
    println!("GGV_MIDRUN pid={}", std::process::id());
    if !expect || !present {
        return;
    }
    let wait_s: f64 = std::env::var("GGV_SIGNAL_WAIT_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20.0);
    let t0 = Instant::now();
    if want_self {
        // SAFETY: raise has no memory-safety preconditions.
        unsafe { libc::raise(libc::SIGUSR1) };
    }
    let mut found = None;
    let mut rep_cur = None;
    while t0.elapsed() < Duration::from_secs_f64(wait_s) {
        if let Some(p) = find_report("signal") {
            // The file may still be being written: retry until it parses.
            if let Some(c) = report_current(&p) {
                rep_cur = Some(c);
                found = Some(p);
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let now = run.guard.counters().map(|c| c.current_bytes);
    let (verdict, why) = match (rep_cur, now) {
        (Some(r), Some(n)) if r == n => (
            "agree",
            "signal report's device-0 current_bytes equals the C API's",
        ),
        (Some(_), Some(_)) => (
            "mismatch",
            "signal report's current_bytes differs from the C API's",
        ),
        _ => (
            "mismatch",
            "no readable signal report appeared within the wait",
        ),
    };
    println!(
        "{}",
        json!({
            "check": "signal_report",
            "framework": "cudarc",
            "sent_by": if want_self { "self" } else { "runner" },
            "report": found.map(|p| p.display().to_string()),
            "report_current": rep_cur,
            "gpuguard_current": now,
            "waited_s": t0.elapsed().as_secs_f64(),
            "verdict": verdict,
            "explanation": why,
        })
    );
}

fn libcuda_loadable() -> bool {
    for name in [c"libcuda.so.1", c"libcuda.so"] {
        // SAFETY: dlopen with a NUL-terminated name; the handle is kept open on purpose.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY) };
        if !h.is_null() {
            return true;
        }
    }
    false
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn run() -> Result<u32, String> {
    const MIB: usize = 1 << 20;
    let guard = Guard::resolve();
    println!(
        "{}",
        json!({"check": "gpuguard_present", "framework": "cudarc", "present": guard.counters.is_some(),
               "version": guard.version, "pid": std::process::id(), "verdict": "info"})
    );

    let ctx = CudaContext::new(0).map_err(|e| err("CudaContext::new(0)", e))?;
    // Only the default stream is used, so cudarc's per-buffer events are not
    // needed; without them the client needs no event API from the driver.
    // SAFETY: every buffer lives on the one default stream.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.default_stream();
    let mut run = Run {
        base: guard.counters(),
        guard,
        ctx: ctx.clone(),
        stream: stream.clone(),
        base_free: None,
        books: Books::default(),
        mismatches: 0,
    };
    run.base_free = run.free_mem();

    // 1. allocations of a few sizes, two read back
    let a = stream
        .alloc_zeros::<f32>(256 * 1024)
        .map_err(|e| err("alloc_zeros 1 MiB", e))?;
    run.books.alloc(a.num_bytes());
    let b_host = pattern(16 * MIB + 3, 7);
    let b = stream
        .clone_htod(&b_host)
        .map_err(|e| err("clone_htod 16 MiB", e))?;
    run.books.alloc(b.num_bytes());
    let c = stream
        .alloc_zeros::<u64>(8 * MIB)
        .map_err(|e| err("alloc_zeros 64 MiB", e))?;
    run.books.alloc(c.num_bytes());
    let keep = stream
        .alloc_zeros::<u32>(MIB)
        .map_err(|e| err("alloc_zeros 4 MiB (kept)", e))?;
    run.books.alloc(keep.num_bytes());
    let leak_host = pattern(3 * MIB + 12345, 1);
    let leak = stream
        .clone_htod(&leak_host)
        .map_err(|e| err("clone_htod 3 MiB (leaked)", e))?;
    run.books.alloc(leak.num_bytes());

    let b_back = stream
        .clone_dtoh(&b)
        .map_err(|e| err("clone_dtoh 16 MiB", e))?;
    let a_back = stream
        .clone_dtoh(&a)
        .map_err(|e| err("clone_dtoh 1 MiB", e))?;
    let data_ok = b_back == b_host && a_back.iter().all(|&x| x == 0.0);
    if !data_ok {
        return Err(String::from(
            "data read back from the device differs from what was written",
        ));
    }
    run.check(
        "after_allocs",
        "5 live buffers: 1 MiB, 16 MiB+3, 64 MiB, 4 MiB (kept), 3 MiB+12345 (to leak)",
    )?;

    // 2. frees and churn
    for s in [a.num_bytes(), b.num_bytes(), c.num_bytes()] {
        run.books.free(s);
    }
    drop(a);
    drop(b);
    drop(c);
    run.check("after_frees", "1 MiB, 16 MiB+3 and 64 MiB freed")?;

    let mut sizes = BTreeMap::new();
    for i in 0..64usize {
        let n = 1 + (i * i * 7919) % (2 * MIB) + i * 4096;
        let buf = stream
            .alloc_zeros::<u8>(n)
            .map_err(|e| err("churn alloc_zeros", e))?;
        run.books.alloc(buf.num_bytes());
        *sizes.entry(n.next_power_of_two()).or_insert(0u32) += 1;
        run.books.free(buf.num_bytes());
        drop(buf);
    }
    run.check(
        "after_churn",
        "64 short-lived buffers of assorted sizes allocated and freed",
    )?;

    // 3. leak one buffer
    let (ptr, sync) = leak.device_ptr(&stream);
    drop(sync);
    let leak_bytes = leak.num_bytes();
    std::mem::forget(leak);
    println!("LEAK 0x{ptr:x} bytes {leak_bytes} api=cudarc::CudaStream::clone_htod kind=device");
    run.check(
        "after_leak",
        "the 3 MiB+12345 buffer forgotten: still live, never freed",
    )?;

    // 4. mid-run signal, 5. request report
    midrun(&run);
    if let Some((rc, path)) = run.guard.write_report(c"request") {
        let rep_cur = report_current(&PathBuf::from(&path));
        let now = run.guard.counters().map(|c| c.current_bytes);
        let ok = rc == 0 && rep_cur.is_some() && rep_cur == now;
        println!(
            "{}",
            json!({"check": "request_report", "framework": "cudarc", "rc": rc, "report": path,
                   "report_current": rep_cur, "gpuguard_current": now,
                   "verdict": if ok { "agree" } else { "mismatch" },
                   "explanation": "gpuguard_write_report(\"request\") vs the C API's current_bytes"})
        );
    }

    // The kept buffer is freed last: the exit report must show only the leak.
    run.books.free(keep.num_bytes());
    drop(keep);
    run.check("final", "kept buffer freed: only the leaked buffer is live")?;
    ctx.check_err()
        .map_err(|e| err("deferred error (drop)", e))?;
    println!(
        "{}",
        json!({"check": "summary", "framework": "cudarc", "verdict": "info", "data_ok": data_ok,
               "async_alloc": ctx.has_async_alloc(), "churn_size_classes": sizes.len(),
               "mismatches": run.mismatches})
    );
    Ok(run.mismatches)
}

fn main() {
    if !libcuda_loadable() {
        eprintln!(
            "cudarc_client: libcuda.so.1 / libcuda.so cannot be loaded (no driver, or LD_LIBRARY_PATH?)"
        );
        std::process::exit(2);
    }
    match run() {
        Ok(_) => {}
        Err(e) => {
            eprintln!("cudarc_client: {e}");
            std::process::exit(1);
        }
    }
}
