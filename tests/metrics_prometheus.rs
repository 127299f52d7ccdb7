//! `gpuguard metrics` (issue 28) scraped by a real Prometheus server on loopback:
//! guarded processes on the simulated driver allocate, are refused by their cap,
//! trim and leak, and the figures are asserted through Prometheus's query API;
//! `promtool` checks the exporter's output and the rules the project ships; hostile
//! status files never stop the exporter and are counted in its health families.
//!
//! Synchronised by handshakes only: the exporter's "serving" line, Prometheus's
//! readiness endpoint, and polling its query API (with a deadline) until a scrape
//! carried the figure. Prometheus is Debian's `prometheus` package (`.ci/run`
//! installs it); outside CI, a machine without it skips these tests with a message.

mod common;

use common::{manifest_dir, python, shim, sim_dir};
use gpuguard_core::status::{self, Status};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const DEADLINE: Duration = Duration::from_secs(60);

/// `prometheus` and `promtool`, or `None` (said once) where they are not installed
/// outside CI; in CI their absence fails the test.
fn tools() -> Option<(PathBuf, PathBuf)> {
    let find = |name: &str| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join(name))
                .find(|p| p.is_file())
        })
    };
    match (find("prometheus"), find("promtool")) {
        (Some(a), Some(b)) => Some((a, b)),
        _ if std::env::var_os("CI").is_some() => {
            panic!("prometheus and promtool are needed here (.ci/run installs Debian's prometheus)")
        }
        _ => {
            eprintln!(
                "SKIPPED: prometheus/promtool not installed (apt-get install prometheus; .ci/run does)"
            );
            None
        }
    }
}

fn scratch(name: &str) -> PathBuf {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let dir = common::profile_dir().join("metrics-tmp").join(format!(
        "{name}-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A child ended when dropped.
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.0 GET on loopback (the test's client; the exporter's server is
/// tiny_http): (status, content type, body).
fn get(port: u16, path: &str, accept: Option<&str>) -> std::io::Result<(u16, String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n{accept}Connection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let kind = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    Ok((code, kind, body.to_string()))
}

fn percent(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The exporter, serving on an ephemeral port of loopback; returns once it said where.
fn start_exporter(option: &str, dirs: &[&Path], grace: &str) -> (Kid, u16) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuguard"));
    c.args(["metrics", "--listen", "127.0.0.1:0", "--grace", grace]);
    for d in dirs {
        c.arg(option).arg(d);
    }
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gpuguard metrics");
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    (Kid(child), port)
}

struct Prometheus {
    _kid: Kid,
    port: u16,
}

impl Prometheus {
    /// A Prometheus server on loopback scraping `target` every second, with its own
    /// configuration and storage under `dir`; returns once it is ready.
    fn start(bin: &Path, dir: &Path, target: u16) -> Prometheus {
        std::fs::create_dir_all(dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: gpuguard\n    honor_labels: true\n\
                 \x20   static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
            ),
        )
        .unwrap();
        let start = Instant::now();
        loop {
            // An ephemeral port: taken from the kernel, given back, handed on.
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let child = Command::new(bin)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .arg("--log.level=warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start prometheus");
            let mut kid = Kid(child);
            loop {
                if let Ok((200, _, _)) = get(port, "/-/ready", None) {
                    return Prometheus { _kid: kid, port };
                }
                if kid.0.try_wait().unwrap().is_some() {
                    break; // the port was taken meanwhile: another one
                }
                assert!(start.elapsed() < DEADLINE, "prometheus never became ready");
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(start.elapsed() < DEADLINE, "prometheus never started");
        }
    }

    /// The instant query's result vector.
    fn query(&self, q: &str) -> Vec<Value> {
        let (code, _, body) = get(
            self.port,
            &format!("/api/v1/query?query={}", percent(q)),
            None,
        )
        .expect("query prometheus");
        assert_eq!(code, 200, "{q}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The one value of `q`, once a scrape made it satisfy `ok`; fails at the deadline.
    fn wait_value(&self, q: &str, ok: impl Fn(f64) -> bool) -> (f64, Value) {
        let start = Instant::now();
        loop {
            let r = self.query(q);
            if let [one] = r.as_slice()
                && let Some(v) = one["value"][1].as_str().and_then(|v| v.parse::<f64>().ok())
                && ok(v)
            {
                return (v, one["metric"].clone());
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{q}: never as wanted; last {r:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_gone(&self, q: &str) {
        let start = Instant::now();
        while !self.query(q).is_empty() {
            assert!(start.elapsed() < DEADLINE, "{q}: never dropped out");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A guarded Python process on the simulated driver, reading commands on stdin:
/// `alloc N` (cudaMalloc, prints its code), `pool N` (N bytes through the default
/// pool, freed and kept there), `trim` (asks gpuguard to trim and waits for the trim
/// report), `leak N` (from now on N bytes more after each snapshot report, from a
/// thread; prints LEAKING after the first two), `quit`.
const WORKER: &str = r#"
import ctypes, os, signal, sys, time, glob, threading
rt = ctypes.CDLL('libcudart.so.13')
drv = ctypes.CDLL('libcuda.so.1')
held = []
def alloc(n):
    p = ctypes.c_void_p()
    rc = rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n))
    if rc == 0:
        held.append(p)
    return rc
def reports(tail):
    return len(glob.glob(os.path.join(os.environ['GPUGUARD_DIR'], '*' + tail)))
print('READY', flush=True)
for line in sys.stdin:
    w = line.split()
    if not w:
        continue
    if w[0] == 'alloc':
        print('RC', alloc(int(w[1])), flush=True)
    elif w[0] == 'pool':
        pool = ctypes.c_void_p()
        assert rt.cudaDeviceGetDefaultMemPool(ctypes.byref(pool), 0) == 0
        keep = ctypes.c_uint64(2**64 - 1)
        assert drv.cuMemPoolSetAttribute(pool, 4, ctypes.byref(keep)) == 0
        s = ctypes.c_void_p()
        assert rt.cudaStreamCreate(ctypes.byref(s)) == 0
        p = ctypes.c_void_p()
        assert rt.cudaMallocAsync(ctypes.byref(p), ctypes.c_size_t(int(w[1])), s) == 0
        assert rt.cudaFreeAsync(p, s) == 0
        assert rt.cudaStreamSynchronize(s) == 0
        print('POOLED', flush=True)
    elif w[0] == 'trim':
        n = reports('.trim.json')
        os.kill(os.getpid(), signal.SIGUSR2)
        while reports('.trim.json') <= n:
            time.sleep(0.01)
        print('TRIMMED', flush=True)
    elif w[0] == 'leak':
        def leak(size):
            i = 0
            while True:
                n = reports('.snapshot.json')
                assert alloc(size) == 0
                i += 1
                if i == 2:
                    print('LEAKING', flush=True)
                while reports('.snapshot.json') <= n:
                    time.sleep(0.01)
        threading.Thread(target=leak, args=(int(w[1]),), daemon=True).start()
    elif w[0] == 'quit':
        break
"#;

struct Worker {
    kid: Kid,
    out: BufReader<std::process::ChildStdout>,
    reports: PathBuf,
}

impl Worker {
    fn start(status_dir: &Path, reports: &Path, env: &[(&str, &str)]) -> Worker {
        let mut c = Command::new(python());
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("GPUGUARD_") || k.starts_with("SLURM_") || k.starts_with("POD_") {
                c.env_remove(&k);
            }
        }
        let mut child = c
            .arg("-c")
            .arg(WORKER)
            .env("LD_PRELOAD", shim())
            .env("LD_LIBRARY_PATH", sim_dir())
            .env("GPUGUARD_PYTHON", "off")
            .env("GPUGUARD_STATUS_DIR", status_dir)
            .env("GPUGUARD_DIR", reports)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start python3");
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut w = Worker {
            kid: Kid(child),
            out,
            reports: reports.to_path_buf(),
        };
        w.expect("READY");
        w
    }

    fn pid(&self) -> u32 {
        self.kid.0.id()
    }

    fn say(&mut self, line: &str) {
        let stdin = self.kid.0.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn expect(&mut self, word: &str) -> String {
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert!(line.starts_with(word), "want {word}, got {line:?}");
        line.trim().to_string()
    }

    /// This process's reports whose names end in `tail`.
    fn reports(&self, tail: &str) -> Vec<Value> {
        std::fs::read_dir(&self.reports)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().ends_with(tail))
            .map(|p| serde_json::from_slice::<Value>(&std::fs::read(p).unwrap()).unwrap())
            .filter(|r| r["pid"].as_u64() == Some(u64::from(self.pid())))
            .collect()
    }

    fn quit(mut self) {
        self.say("quit");
        let _ = self.kid.0.wait();
    }
}

/// The status file of `pid`, once it shows `ok`.
fn status_when(dir: &Path, pid: u32, ok: impl Fn(&Status) -> bool) -> Status {
    let start = Instant::now();
    loop {
        if let Some(s) = status::read_of(dir, pid)
            && ok(&s)
        {
            return s;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "status of {pid} never as wanted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn promtool_check(promtool: &Path, args: &[&str], input: Option<&str>) {
    let mut c = Command::new(promtool);
    c.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("run promtool");
    if let Some(text) = input {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool {args:?} failed\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The names of the families in a scrape (`# TYPE` lines).
fn family_names(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn prometheus_scrapes_caps_refusals_trims_and_leaks() {
    let Some((prometheus, promtool)) = tools() else {
        return;
    };
    let root = scratch("fleet");
    // Two jobs' status directories under one shared root, as containers would
    // have them; the library makes each (GPUGUARD_STATUS_DIR).
    let shared = root.join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let status_dir = shared.join("job-a");
    let status_b = shared.join("job-b");
    let reports = root.join("reports");
    std::fs::create_dir_all(&reports).unwrap();
    let (_exporter, port) = start_exporter("--status-root", &[&shared], "5s");
    let prom = Prometheus::start(&prometheus, &root.join("prom"), port);

    // A capped process: 16 MiB held, one allocation refused, a pool trimmed.
    let mut capped = Worker::start(
        &status_dir,
        &reports,
        &[
            ("GPUGUARD_CAP", "64MiB"),
            ("SLURM_JOB_ID", "4711"),
            ("GPUGUARD_LABELS", "team=vision"),
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
        ],
    );
    let a = capped.pid();
    capped.say(&format!("alloc {}", 16 * MIB));
    assert_eq!(capped.expect("RC"), "RC 0");
    capped.say(&format!("alloc {}", 128 * MIB));
    assert_ne!(capped.expect("RC"), "RC 0", "over the cap");
    // The refusal trims on its own (the cap's trim report): waited for, so that
    // the pool below is trimmed by the signal's trim only.
    let start = Instant::now();
    while !capped
        .reports(".trim.json")
        .iter()
        .any(|r| r["trim"]["trigger"] == "cap")
    {
        assert!(start.elapsed() < DEADLINE, "no trim after the refusal");
        std::thread::sleep(Duration::from_millis(20));
    }
    capped.say(&format!("pool {}", 8 * MIB));
    capped.expect("POOLED");
    capped.say("trim");
    capped.expect("TRIMMED");
    // The refusal's own trim and the one asked for: the figures are those of the
    // trim reports.
    let trims = capped.reports(".trim.json");
    assert_eq!(trims.len(), 2);
    let released: u64 = trims
        .iter()
        .map(|t| t["trim"]["released_bytes"].as_u64().unwrap())
        .sum();
    assert!(released >= 4 * MIB, "{trims:?}");
    // A process whose memory grows at one line, report after report.
    let mut leaky = Worker::start(&status_b, &reports, &[("GPUGUARD_SNAPSHOT_EVERY", "200ms")]);
    let b = leaky.pid();
    leaky.say(&format!("leak {MIB}"));
    leaky.expect("LEAKING");

    // A PyTorch stand-in: 16 MiB cached, 5 MiB of it in use, split by its report.
    let fakefw = manifest_dir().join("tests/python/fakefw");
    let mut torch = Command::new(python());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GPUGUARD_") {
            torch.env_remove(&k);
        }
    }
    let mut torch = torch
        .arg(manifest_dir().join("tests/python/trainer.py"))
        .args(["torch", "installed", "cache:16", "leak:2", "leak:3"])
        .args(["signal:USR1", "ready:300"])
        .env("PYTHONPATH", &fakefw)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("LD_PRELOAD", shim())
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("GPUGUARD_STATUS_DIR", shared.join("job-c"))
        .env("GPUGUARD_DIR", &reports)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map(Kid)
        .expect("start trainer.py");
    let mut torch_out = BufReader::new(torch.0.stdout.take().unwrap());
    let mut report_path = None;
    loop {
        let mut line = String::new();
        assert!(
            torch_out.read_line(&mut line).unwrap() > 0,
            "trainer.py ended"
        );
        if let Some(p) = line.trim().strip_prefix("REPORT ") {
            report_path = Some(PathBuf::from(p));
        }
        if line.starts_with("READY") {
            break;
        }
    }
    let signal_report: Value =
        serde_json::from_slice(&std::fs::read(report_path.expect("a report")).unwrap()).unwrap();
    let c = torch.0.id();

    let sel = |family: &str, pid: u32| format!("{family}{{pid=\"{pid}\"}}");
    let (live, labels) =
        prom.wait_value(&sel("gpuguard_live_bytes", a), |v| v == (16 * MIB) as f64);
    assert_eq!(live, (16 * MIB) as f64);
    assert_eq!(labels["job"], "4711", "{labels}");
    assert_eq!(labels["team"], "vision", "{labels}");
    assert_eq!(labels["rank"], "3", "{labels}");
    assert_eq!(labels["device"], "0", "{labels}");
    assert!(
        labels["uuid"]
            .as_str()
            .is_some_and(|u| u.starts_with("GPU-")),
        "{labels}"
    );
    assert_eq!(labels["program"], "python3", "{labels}");
    prom.wait_value(&sel("gpuguard_cap_bytes", a), |v| v == (64 * MIB) as f64);
    prom.wait_value(&sel("gpuguard_cap_refusals_total", a), |v| v == 1.0);
    prom.wait_value(&sel("gpuguard_trims_total", a), |v| v == trims.len() as f64);
    prom.wait_value(&sel("gpuguard_trim_released_bytes_total", a), |v| {
        v == released as f64
    });
    // Its reports: the cap's and the trim's.
    let st = status_when(&status_dir, a, |s| s.reports >= 2);
    prom.wait_value(&sel("gpuguard_reports_total", a), |v| {
        v == st.reports as f64
    });
    prom.wait_value(&sel("gpuguard_peak_bytes", a), |v| v >= (16 * MIB) as f64);
    // The leak: growing in every interval, its line named.
    let st = status_when(&status_b, b, |s| s.top_suspect.is_some());
    let top = st.top_suspect.unwrap();
    assert!(top.bytes_per_second > 0.0, "{top:?}");
    prom.wait_value(
        &sel("gpuguard_leak_suspect_growth_bytes_per_second", b),
        |v| v > 0.0,
    );
    let (_, info) = prom.wait_value(&sel("gpuguard_leak_suspect_info", b), |v| v == 1.0);
    assert_eq!(info["line"].as_str(), Some(top.line.as_str()), "{info}");
    prom.wait_value(&sel("gpuguard_live_bytes", b), |v| v >= (2 * MIB) as f64);
    // The framework's split at its last report, as that report says.
    let dev = &signal_report["devices"][0];
    assert_eq!(dev["in_use_bytes"], 5 * MIB, "{dev}");
    assert_eq!(dev["cached_bytes"], 11 * MIB, "{dev}");
    prom.wait_value(&sel("gpuguard_framework_in_use_bytes", c), |v| {
        v == (5 * MIB) as f64
    });
    prom.wait_value(&sel("gpuguard_framework_cached_bytes", c), |v| {
        v == (11 * MIB) as f64
    });
    prom.wait_value(&sel("gpuguard_live_bytes", c), |v| v == (16 * MIB) as f64);
    // The exporter's health, as Prometheus saw it.
    prom.wait_value("gpuguard_exporter_status_files_read", |v| v == 3.0);
    prom.wait_value("gpuguard_exporter_status_dirs_read", |v| v == 3.0);
    prom.wait_value("gpuguard_exporter_processes", |v| v == 3.0);
    prom.wait_value("up{job=\"gpuguard\"}", |v| v == 1.0);

    // What the exporter serves: the Prometheus text format for promtool, OpenMetrics
    // when asked; the shipped rules and dashboard name only families it has.
    let (code, kind, text) = get(port, "/metrics", None).unwrap();
    assert_eq!(code, 200);
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    promtool_check(&promtool, &["check", "metrics"], Some(&text));
    let (_, kind, om) = get(
        port,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
    )
    .unwrap();
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    assert!(om.ends_with("# EOF\n"), "{om}");
    let names = family_names(&text);
    for shipped in [
        "deploy/prometheus/gpuguard-rules.yml",
        "deploy/grafana/gpuguard-fleet.json",
    ] {
        let body = std::fs::read_to_string(manifest_dir().join(shipped)).unwrap();
        let mut used: Vec<&str> = body
            .match_indices("gpuguard_")
            .map(|(at, _)| {
                let rest = &body[at..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                &rest[..end]
            })
            .filter(|n| !n.ends_with('_'))
            .collect();
        used.sort();
        used.dedup();
        assert!(!used.is_empty());
        for n in used {
            assert!(
                names.iter().any(|f| f == n),
                "{shipped} names {n}, which the exporter does not expose: {names:?}"
            );
        }
    }
    assert_eq!(get(port, "/nothing", None).unwrap().0, 404);

    // A process that ended drops out, after the grace period: still served just
    // after it ended, gone from Prometheus once the grace period passed.
    capped.quit();
    assert!(!status_dir.join(format!("{a}.json")).exists());
    let (_, _, just_after) = get(port, "/metrics", None).unwrap();
    assert!(
        just_after.contains(&format!("pid=\"{a}\"")),
        "dropped before the grace period"
    );
    prom.wait_gone(&sel("gpuguard_live_bytes", a));
    prom.wait_value("gpuguard_exporter_processes", |v| v == 2.0);
    leaky.quit();
    drop(torch);
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn shipped_alerting_rules_pass_promtool() {
    let Some((_, promtool)) = tools() else {
        return;
    };
    let rules = manifest_dir().join("deploy/prometheus/gpuguard-rules.yml");
    promtool_check(
        &promtool,
        &["check", "rules", rules.to_str().unwrap()],
        None,
    );
    let dashboard: Value = serde_json::from_slice(
        &std::fs::read(manifest_dir().join("deploy/grafana/gpuguard-fleet.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    assert!(dashboard["panels"].as_array().is_some_and(|p| p.len() >= 4));
}

/// Hostile status files: garbage, half-written, huge, links out of the directory,
/// a FIFO, a directory, another user's file. Each is skipped and counted by why; the
/// exporter answers every scrape (a good file beside them is still read).
#[test]
fn hostile_status_files_are_counted_and_never_stop_the_exporter() {
    let Some((_, promtool)) = tools() else {
        return;
    };
    let root = scratch("hostile");
    let dir = root.join("status");
    status::ensure_dir(&dir).unwrap();
    // A good one: a process of this test, running.
    let sleeper = Kid(Command::new("sleep").arg("120").spawn().unwrap());
    let pid = sleeper.0.id();
    let good = Status {
        schema: status::SCHEMA.into(),
        pid,
        program: "good".into(),
        start_ticks: status::process_start_ticks(Path::new("/proc"), pid).unwrap(),
        updated_unix_ms: 1,
        devices: vec![status::DeviceStatus {
            device: 0,
            live_bytes: 7 * MIB,
            ..Default::default()
        }],
        ..Default::default()
    };
    status::write_status(&dir, &good).unwrap();
    let full = serde_json::to_string(&good).unwrap();
    std::fs::write(dir.join("101.json"), b"\x00\xffnot json at all").unwrap();
    std::fs::write(dir.join("102.json"), &full[..full.len() / 2]).unwrap();
    std::fs::write(
        dir.join("103.json"),
        vec![b'{'; (status::MAX_FILE_BYTES + 10) as usize],
    )
    .unwrap();
    std::os::unix::fs::symlink("/etc/shadow", dir.join("104.json")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.join("105.json")).unwrap();
    let fifo = std::ffi::CString::new(dir.join("106.json").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::fs::create_dir(dir.join("107.json")).unwrap();
    // A label name the library would refuse, and a huge program name: read, with
    // the label dropped and the name cut.
    let mut odd = good.clone();
    odd.program = "x".repeat(10_000);
    odd.labels.insert("bad\"label".into(), "v".into());
    let odd_path = dir.join(format!("{pid}.json"));
    let root_user = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap();
    if root_user {
        std::fs::write(dir.join("108.json"), serde_json::to_vec(&good).unwrap()).unwrap();
        std::os::unix::fs::chown(dir.join("108.json"), Some(4242), None).unwrap();
    } else {
        eprintln!("not root: the file of another user is not made");
    }
    std::fs::write(&odd_path, serde_json::to_vec(&odd).unwrap()).unwrap();

    let (exporter, port) = start_exporter("--status-dir", &[&dir], "60s");
    let value = |text: &str, series: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    };
    for _ in 0..3 {
        let (code, _, text) = get(port, "/metrics", None).expect("the exporter answers");
        assert_eq!(code, 200);
        let skipped = |why: &str| {
            value(
                &text,
                &format!("gpuguard_exporter_status_files_skipped{{reason=\"{why}\"}}"),
            )
        };
        assert_eq!(skipped("garbage"), Some(2.0), "{text}");
        assert_eq!(skipped("too_big"), Some(1.0), "{text}");
        assert_eq!(skipped("symlink"), Some(2.0), "{text}");
        assert_eq!(skipped("not_regular"), Some(2.0), "{text}");
        assert_eq!(
            skipped("other_user"),
            Some(if root_user { 1.0 } else { 0.0 }),
            "{text}"
        );
        assert_eq!(
            value(&text, "gpuguard_exporter_status_files_read"),
            Some(1.0)
        );
        let live = text
            .lines()
            .find(|l| l.starts_with("gpuguard_live_bytes{"))
            .expect("the good file is read");
        assert!(live.ends_with(&format!(" {}", 7 * MIB)), "{live}");
        assert!(!live.contains("bad") && live.len() < 400, "{live}");
        promtool_check(&promtool, &["check", "metrics"], Some(&text));
    }
    // A directory others can reach is not read at all.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (_, _, text) = get(port, "/metrics", None).unwrap();
    assert_eq!(
        value(
            &text,
            "gpuguard_exporter_status_files_skipped{reason=\"unsafe_dir\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "gpuguard_exporter_status_files_read"),
        Some(0.0)
    );
    drop(exporter);
    // Nothing was removed or changed: the exporter only reads.
    assert!(dir.join("101.json").exists() && odd_path.exists());
    drop(sleeper);
    let _ = std::fs::remove_dir_all(root);
}

/// `--textfile` writes the same once, as a regular file replaced whole; a link in
/// its place is refused, not written through.
#[test]
fn textfile_is_written_once_and_never_through_a_link() {
    let Some((_, promtool)) = tools() else {
        return;
    };
    let root = scratch("textfile");
    let dir = root.join("status");
    status::ensure_dir(&dir).unwrap();
    let out = root.join("gpuguard.prom");
    let run = |file: &Path| {
        Command::new(env!("CARGO_BIN_EXE_gpuguard"))
            .args(["metrics", "--status-dir"])
            .arg(&dir)
            .arg("--textfile")
            .arg(file)
            .output()
            .unwrap()
    };
    let r = run(&out);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.contains("gpuguard_exporter_status_dirs_read 1"),
        "{text}"
    );
    promtool_check(&promtool, &["check", "metrics"], Some(&text));
    let target = root.join("target");
    std::fs::write(&target, "keep").unwrap();
    let link = root.join("link.prom");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let r = run(&link);
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stderr).contains("symbolic link"));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    let _ = std::fs::remove_dir_all(root);
}

/// The preloaded library does not carry the exporter's crates.
#[test]
fn the_library_does_not_link_the_exporter_crates() {
    let lib = std::fs::read(shim()).unwrap();
    for name in [&b"prometheus_client"[..], b"tiny_http"] {
        assert!(
            !lib.windows(name.len()).any(|w| w == name),
            "libgpuguard.so holds {}",
            String::from_utf8_lossy(name)
        );
    }
}

/// `--textfile FILE --every 200ms` keeps the file fresh: a change in a status file
/// reaches it without another command.
#[test]
fn textfile_every_keeps_the_file_fresh() {
    let Some((_, promtool)) = tools() else {
        return;
    };
    let root = scratch("every");
    let dir = root.join("status");
    status::ensure_dir(&dir).unwrap();
    let sleeper = Kid(Command::new("sleep").arg("120").spawn().unwrap());
    let pid = sleeper.0.id();
    let mut st = Status {
        schema: status::SCHEMA.into(),
        pid,
        program: "every".into(),
        start_ticks: status::process_start_ticks(Path::new("/proc"), pid).unwrap(),
        updated_unix_ms: 1,
        devices: vec![status::DeviceStatus {
            device: 0,
            live_bytes: MIB,
            ..Default::default()
        }],
        ..Default::default()
    };
    status::write_status(&dir, &st).unwrap();
    let out = root.join("gpuguard.prom");
    let _exporter = Kid(Command::new(env!("CARGO_BIN_EXE_gpuguard"))
        .args(["metrics", "--every", "200ms", "--status-dir"])
        .arg(&dir)
        .arg("--textfile")
        .arg(&out)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap());
    let wait_for = |want: &str| {
        let start = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&out)
                && text.contains(want)
            {
                return text;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{} never showed {want}",
                out.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let text = wait_for(&format!(
        "pid=\"{pid}\",program=\"every\",device=\"0\"}} {MIB}\n"
    ));
    promtool_check(&promtool, &["check", "metrics"], Some(&text));
    st.devices[0].live_bytes = 3 * MIB;
    status::write_status(&dir, &st).unwrap();
    wait_for(&format!("device=\"0\"}} {}\n", 3 * MIB));
    drop(sleeper);
    let _ = std::fs::remove_dir_all(root);
}
