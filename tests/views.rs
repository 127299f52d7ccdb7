//! The views of issue 13, driven through the real `gpuguard` binary: `plot` (a trace
//! as SVG), `flamegraph` (a report as an HTML page, loaded in headless Chromium) and
//! `ps` (status files as a table).

mod common;
mod core_support;

use common::*;
use core_support::*;
use gpuguard_core::status::{self, DeviceStatus, Status};
use gpuguard_core::trace::{TraceOptions, TraceWriter, event};
use serde_json::{Value, json};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;

fn cli() -> &'static str {
    env!("CARGO_BIN_EXE_gpuguard")
}

fn gpuguard(args: &[&str], env: &[(&str, &str)]) -> Run {
    run(cli(), args, env, false)
}

/// A fresh empty folder for one test.
fn scratch(name: &str) -> PathBuf {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let dir = profile_dir().join("views-tmp").join(format!(
        "{name}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `gpuguard` exited 0.
fn assert_success(r: &Run) {
    assert!(r.status.success(), "{}", r.describe());
}

/// A failure as users see it: exit status 2 and one `gpuguard:` line on stderr that
/// says `what`.
fn assert_one_line_failure(r: &Run, what: &str) {
    assert_eq!(r.status.code(), Some(2), "{}", r.describe());
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", r.describe());
    assert!(
        lines[0].starts_with("gpuguard: ") && lines[0].contains(what),
        "want a line saying {what:?}:\n{}",
        r.describe()
    );
    assert!(r.stdout.is_empty(), "{}", r.describe());
}

// ---------------------------------------------------------------------------
// plot
// ---------------------------------------------------------------------------

/// A trace of two devices, as the library's helper thread would write it: device 0
/// capped at 4 GiB, climbing until the cap refuses, then trimmed.
fn write_trace(path: &Path, finish: bool) {
    let mut w = TraceWriter::create(
        path,
        TraceOptions {
            pid: 4242,
            program: "train.py".into(),
            version: "test".into(),
            ..Default::default()
        },
    )
    .unwrap();
    for i in 0..200u64 {
        let t = i * 50_000;
        w.sample(t, 0, (i % 100) * GIB / 25, GIB / 4, Some(4 * GIB));
        w.sample(t, 1, i * GIB / 400, 0, None);
        if i == 99 {
            w.instant(
                t,
                event::CAP_REFUSAL,
                json!({"device": 0, "bytes": GIB, "charged": 4 * GIB, "cap": 4 * GIB}),
            );
        }
        if i == 120 {
            w.instant(
                t,
                event::TRIM,
                json!({"trigger": "cap", "released_bytes": GIB / 4}),
            );
        }
    }
    if finish {
        w.finish(10_000_000).unwrap();
    } else {
        w.flush().unwrap();
    }
}

/// Parses an SVG file and checks it stands alone (nothing it refers to outside).
fn parse_svg(text: &str) -> roxmltree::Document<'_> {
    let doc = roxmltree::Document::parse(text).expect("the SVG is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    for node in doc.descendants() {
        for a in node.attributes() {
            assert!(
                a.name() != "href" && !a.value().contains("url("),
                "refers to something outside: {a:?}"
            );
        }
    }
    doc
}

fn elements_with_class<'a>(
    doc: &'a roxmltree::Document<'a>,
    class: &str,
) -> Vec<roxmltree::Node<'a, 'a>> {
    doc.descendants()
        .filter(|n| {
            n.attribute("class")
                .is_some_and(|c| c.split(' ').any(|w| w == class))
        })
        .collect()
}

#[test]
fn plot_draws_a_line_per_device_with_cap_peak_and_marks() {
    let dir = scratch("plot");
    let trace = dir.join("mem.trace.json");
    write_trace(&trace, true);
    let svg_path = dir.join("mem.svg");
    let r = gpuguard(&["plot", s(&trace), "-o", s(&svg_path)], &[]);
    assert_success(&r);
    assert!(r.stderr.contains("wrote"), "{}", r.describe());
    let text = std::fs::read_to_string(&svg_path).unwrap();
    let doc = parse_svg(&text);

    let live = elements_with_class(&doc, "live");
    assert_eq!(live.len(), 2, "one line per device");
    let devices: Vec<&str> = live
        .iter()
        .filter_map(|n| n.attribute("data-device"))
        .collect();
    assert_eq!(devices, ["0", "1"]);
    for path in &live {
        assert!(path.tag_name().name() == "path" && path.attribute("d").unwrap().len() > 100);
    }
    let caps = elements_with_class(&doc, "cap");
    assert_eq!(caps.len(), 1, "only device 0 is capped");
    assert_eq!(caps[0].attribute("data-device"), Some("0"));
    assert_eq!(elements_with_class(&doc, "peak").len(), 2);
    // Device 0 pools hold memory: its live + held line is drawn too.
    assert_eq!(elements_with_class(&doc, "held").len(), 1);
    assert_eq!(elements_with_class(&doc, "refusal").len(), 1);
    assert_eq!(elements_with_class(&doc, "trim").len(), 1);
    // Axis labels in human sizes and seconds, the legend with the cap.
    let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
    assert!(texts.contains(&"2 GiB"), "{texts:?}");
    assert!(texts.contains(&"4 s"), "{texts:?}");
    assert!(texts.contains(&"cap 4.0 GiB"), "{texts:?}");
    assert!(texts.iter().any(|t| t.contains("train.py")), "{texts:?}");
}

/// A killed process leaves the trace without its closing `]`, maybe cut mid-line.
#[test]
fn plot_reads_a_trace_cut_short() {
    let dir = scratch("plot-cut");
    let trace = dir.join("t.json");
    write_trace(&trace, false);
    let mut bytes = std::fs::read(&trace).unwrap();
    bytes.truncate(bytes.len() - 7);
    std::fs::write(&trace, &bytes).unwrap();
    let r = gpuguard(&["plot", s(&trace)], &[]);
    assert_success(&r);
    let text = std::fs::read_to_string(dir.join("t.svg")).expect("default output: TRACE.svg");
    let doc = parse_svg(&text);
    assert_eq!(elements_with_class(&doc, "live").len(), 2);
    assert!(
        text.contains("the trace ends early"),
        "says it is unfinished"
    );
}

#[test]
fn plot_refuses_what_is_not_a_trace_in_one_line() {
    let dir = scratch("plot-bad");
    let garbage = dir.join("garbage.json");
    std::fs::write(&garbage, "[\n{\"name\":\"gpuguard_tr").unwrap();
    let binary = dir.join("binary.json");
    std::fs::write(&binary, [0x5b, 0x0a, 0xff, 0xfe, 0x00, 0x7b]).unwrap();
    let report = dir.join("report.json");
    std::fs::write(&report, r#"{"schema":"gpuguard-report/1","pid":1}"#).unwrap();
    let newer = dir.join("newer.json");
    std::fs::write(
        &newer,
        "[\n{\"name\":\"gpuguard_trace\",\"ph\":\"M\",\"pid\":1,\"args\":{\"schema\":\"gpuguard-trace/2\"}},\n",
    )
    .unwrap();
    let out = dir.join("out.svg");
    for (input, what) in [
        (garbage.as_path(), "not a gpuguard trace"),
        (binary.as_path(), "not UTF-8"),
        (report.as_path(), "not a gpuguard trace"),
        (newer.as_path(), "gpuguard-trace/2"),
        (dir.as_path(), "a directory"),
        (dir.join("missing.json").as_path(), "cannot read"),
    ] {
        let r = gpuguard(&["plot", s(input), "-o", s(&out)], &[]);
        assert_one_line_failure(&r, what);
        assert!(!out.exists(), "nothing written for {}", input.display());
    }
}

// ---------------------------------------------------------------------------
// flamegraph
// ---------------------------------------------------------------------------

/// Chromium from the distribution's packages, if installed.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| ["chromium", "chromium-browser"].map(|n| d.join(n)))
        .find(|p| p.is_file())
}

/// Loads `page` in headless Chromium and returns the DOM after its scripts ran (or a
/// PNG screenshot at `screenshot`, when given).
fn headless(browser: &Path, page: &Path, screenshot: Option<&Path>) -> String {
    let profile = scratch("chromium-profile");
    let mut cmd = Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    match screenshot {
        Some(png) => {
            cmd.arg(format!("--screenshot={}", png.display()))
                .arg("--window-size=1200,800");
        }
        None => {
            cmd.arg("--dump-dom");
        }
    }
    cmd.arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("starting chromium");
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let mut err = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish in 90 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let dom = reader.join().unwrap();
    let stderr = err_reader.join().unwrap();
    assert!(
        !stderr.contains("Uncaught"),
        "the page's script failed:\n{stderr}"
    );
    dom
}

/// The page loaded in a real browser ran its script to the end without an error and
/// shows `want` (a frame's text).
fn assert_page_shows(browser: &Path, page: &Path, want: &str) -> String {
    let dom = headless(browser, page, None);
    assert!(
        dom.contains("data-rendered=\"yes\""),
        "the script did not finish:\n{dom}"
    );
    assert!(!dom.contains(" data-error=\""), "script error:\n{dom}");
    assert!(
        dom.contains(want),
        "the page does not show {want:?}:\n{dom}"
    );
    dom
}

#[test]
fn flamegraph_of_a_native_leak_loads_in_a_browser_and_shows_the_leaking_function() {
    let r = gg_run("gg", &["leak", "3"], &[]);
    r.assert_ok();
    let (report, value) = exit_report(&r);
    let page = r.dir.join("leaks.html");
    assert_success(&gpuguard(&["flamegraph", s(&report), "-o", s(&page)], &[]));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(!html.contains("http://") && !html.contains("https://") && !html.contains(" src="));
    assert!(html.contains("leaky_function"));
    let Some(browser) = chromium() else {
        println!("SKIPPED the browser check: no chromium on PATH (apt-get install chromium)");
        return;
    };
    // `>`: in a rendered frame, not in the page's data.
    let dom = assert_page_shows(&browser, &page, ">leaky_function");
    // The report's live bytes are the root frame's, and the native view is shown (the
    // report has no Python lines).
    let live: u64 = value["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| u(&s["live_bytes"]))
        .sum();
    assert!(live > 0);
    assert!(dom.contains("class=\"on\">native ("), "{dom}");
}

#[test]
fn flamegraph_of_python_lines_shows_the_leaking_line() {
    let r = run_trainer(
        &["torch", "installed", "cache:16", "leak:2", "leak:3"],
        &[("GPUGUARD_PYTHON", "lines")],
        true,
    );
    r.assert_ok();
    let (report, value) = exit_report(&r);
    assert!(
        value["python_sites"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    );
    let page = r.dir.join("py.html");
    assert_success(&gpuguard(&["flamegraph", s(&report), "-o", s(&page)], &[]));
    let Some(browser) = chromium() else {
        println!("SKIPPED the browser check: no chromium on PATH (apt-get install chromium)");
        return;
    };
    // In the table of innermost frames the page's script fills in.
    let leak_line = format!("trainer.py:{} in &lt;module&gt;</td>", trainer_leak_line());
    let dom = assert_page_shows(&browser, &page, &leak_line);
    assert!(dom.contains("class=\"on\">Python ("), "{dom}");
    // The screenshot in the README is made from this page.
    if let Some(png) = std::env::var_os("GPUGUARD_VIEWS_SCREENSHOT") {
        headless(&browser, &page, Some(Path::new(&png)));
    }
}

#[test]
fn flamegraph_refuses_what_is_not_a_report_in_one_line() {
    let dir = scratch("flame-bad");
    let cut = dir.join("cut.json");
    std::fs::write(&cut, r#"{"schema":"gpuguard-report/1","pid":1,"si"#).unwrap();
    let trace = dir.join("trace.json");
    write_trace(&trace, true);
    let out = dir.join("out.html");
    for (input, what) in [
        (cut.as_path(), "truncated"),
        (trace.as_path(), "not a gpuguard report"),
        (dir.as_path(), "a directory"),
        (dir.join("missing.json").as_path(), "cannot read"),
    ] {
        let r = gpuguard(&["flamegraph", s(input), "-o", s(&out)], &[]);
        assert_one_line_failure(&r, what);
        assert!(!out.exists());
    }
}

// ---------------------------------------------------------------------------
// ps
// ---------------------------------------------------------------------------

fn status_of(pid: u32, start_ticks: u64, program: &str) -> Status {
    Status {
        schema: status::SCHEMA.into(),
        gpuguard_version: "test".into(),
        pid,
        program: program.into(),
        argv: vec![program.into(), "--epochs".into(), "3".into()],
        start_ticks,
        started_unix_ms: 1,
        report_dir: "/data/reports".into(),
        report_dir_hex: None,
        updated_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
        devices: vec![
            DeviceStatus {
                device: 0,
                live_bytes: 3 * GIB,
                peak_bytes: 5 * GIB,
                cap_bytes: Some(8 * GIB),
                pool_held_bytes: GIB / 2,
                ..Default::default()
            },
            DeviceStatus {
                device: 1,
                live_bytes: GIB / 4,
                peak_bytes: GIB,
                cap_bytes: None,
                pool_held_bytes: 0,
                ..Default::default()
            },
        ],
    }
}

/// A status directory (as the library lays it out under `$XDG_RUNTIME_DIR`) with the
/// files of a running process (a `sleep` of ours) and of one that has ended.
struct PsFixture {
    runtime: PathBuf,
    dir: PathBuf,
    sleeper: std::process::Child,
    dead_pid: u32,
}

impl PsFixture {
    fn new(name: &str) -> PsFixture {
        let runtime = scratch(name);
        let dir = runtime.join("gpuguard");
        status::ensure_dir(&dir).unwrap();
        let sleeper = Command::new("sleep").arg("60").spawn().unwrap();
        let ticks = status::process_start_ticks(Path::new("/proc"), sleeper.id()).unwrap();
        status::write_status(&dir, &status_of(sleeper.id(), ticks, "sleepy-trainer")).unwrap();
        let mut ended = Command::new("true").spawn().unwrap();
        let dead_pid = ended.id();
        ended.wait().unwrap();
        status::write_status(&dir, &status_of(dead_pid, 1, "gone-trainer")).unwrap();
        PsFixture {
            runtime,
            dir,
            sleeper,
            dead_pid,
        }
    }

    fn env(&self) -> [(&str, &str); 1] {
        [("XDG_RUNTIME_DIR", s(&self.runtime))]
    }
}

impl Drop for PsFixture {
    fn drop(&mut self) {
        let _ = self.sleeper.kill();
        let _ = self.sleeper.wait();
    }
}

#[test]
fn ps_lists_running_processes_and_removes_files_of_ended_ones() {
    let f = PsFixture::new("ps");
    let r = gpuguard(&["ps"], &f.env());
    assert_success(&r);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines.len(),
        3,
        "a heading and a line per device:\n{}",
        r.stdout
    );
    for h in [
        "PID", "PROGRAM", "DEV", "LIVE", "PEAK", "CAP", "UPDATED", "REPORTS",
    ] {
        assert!(lines[0].contains(h), "{}", lines[0]);
    }
    let pid = f.sleeper.id().to_string();
    let dev0: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(dev0[..3], [pid.as_str(), "sleepy-trainer", "0"]);
    assert!(
        lines[1].contains("3.0 GiB")
            && lines[1].contains("5.0 GiB")
            && lines[1].contains("8.0 GiB")
    );
    assert!(lines[1].ends_with("/data/reports"));
    assert!(lines[1].contains(" s ago"));
    assert!(
        lines[2].contains("none"),
        "device 1 is uncapped: {}",
        lines[2]
    );
    assert!(!r.stdout.contains("gone-trainer"));
    assert!(
        !f.dir.join(format!("{}.json", f.dead_pid)).exists(),
        "the ended process's file is removed"
    );
    assert!(f.dir.join(format!("{pid}.json")).exists());

    let j = gpuguard(&["ps", "--json"], &f.env());
    assert_success(&j);
    let v: Value = serde_json::from_str(&j.stdout).unwrap();
    let all = v.as_array().unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0]["pid"], f.sleeper.id());
    assert_eq!(all[0]["devices"][0]["cap_bytes"], 8 * GIB);
    assert_eq!(all[0]["report_dir"], "/data/reports");
}

#[test]
fn ps_without_processes_says_so() {
    let runtime = scratch("ps-none");
    let r = gpuguard(&["ps"], &[("XDG_RUNTIME_DIR", s(&runtime))]);
    assert_success(&r);
    assert!(
        r.stdout.starts_with("no process is running gpuguard"),
        "{}",
        r.stdout
    );
    let j = gpuguard(&["ps", "--json"], &[("XDG_RUNTIME_DIR", s(&runtime))]);
    assert_success(&j);
    assert_eq!(j.stdout.trim(), "[]");
}

/// `--watch` redraws until its reader goes away; into a pipe it never clears the
/// screen.
#[test]
fn ps_watch_refreshes_and_stops_when_stdout_closes() {
    let f = PsFixture::new("ps-watch");
    let mut child = Command::new(cli())
        .args(["ps", "--watch", "0.2"])
        .env("XDG_RUNTIME_DIR", &f.runtime)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let start = Instant::now();
    // Three tables: it refreshes.
    while String::from_utf8_lossy(&seen).matches("PID").count() < 3 {
        assert!(start.elapsed() < Duration::from_secs(20), "no refresh");
        let n = out.read(&mut buf).unwrap();
        assert!(n > 0, "ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(!text.contains('\u{1b}'), "no terminal codes into a pipe");
    assert!(text.contains("sleepy-trainer"));
    drop(out);
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "still running after its stdout closed"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success(), "{status:?}");
    assert_eq!(status.code(), Some(141));
}

#[test]
fn ps_watch_refuses_a_bad_interval() {
    let r = gpuguard(&["ps", "--watch", "0"], &[]);
    assert_eq!(r.status.code(), Some(2), "{}", r.describe());
    assert!(r.stderr.contains("--watch"), "{}", r.describe());
}
