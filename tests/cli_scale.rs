//! `show`, `diff`, `flamegraph` and `plot` stay near linear in time and bounded in
//! memory on absurd input (issue 30): 200,000 call sites, 100,000 devices, a
//! million live allocations, a 64 MiB program name, a long trace. The inputs are
//! generated here and written piece by piece (this process never holds them: a
//! child's peak memory is measured alone, with `wait4`). Time bounds are generous
//! for a loaded 2-core machine running a debug build, and still far below what the
//! quadratic code took (200k sites: 170 s in a release build, far more in debug).

use gpuguard_core::report::{DeviceReport, Hex, LiveAllocation, Report, SCHEMA, Site};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn cli() -> &'static str {
    env!("CARGO_BIN_EXE_gpuguard")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gg-cli-scale-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What a child did, and its own peak resident memory.
struct Measured {
    /// `None` when it was killed at the time limit.
    status: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
    max_rss: u64,
    secs: f64,
}

impl Measured {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// Runs `gpuguard args`, killed past `limit`; its peak memory from `wait4` (its own,
/// not that of other tests' children).
fn measured(args: &[&str], limit: Duration) -> Measured {
    let start = Instant::now();
    // Reaped below by wait4, which alone gives the child's own rusage.
    #[allow(clippy::zombie_processes)]
    let mut child = Command::new(cli())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = String::new();
        let _ = err.read_to_string(&mut v);
        v
    });
    let mut status = 0;
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    let mut killed = false;
    loop {
        // SAFETY: waits for our own child, filling the two out-parameters.
        let rc = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, usage.as_mut_ptr()) };
        if rc == pid {
            break;
        }
        assert_eq!(rc, 0, "wait4: {}", std::io::Error::last_os_error());
        if !killed && start.elapsed() > limit {
            // SAFETY: a signal to our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let secs = start.elapsed().as_secs_f64();
    // SAFETY: filled by the successful wait4 above.
    let usage = unsafe { usage.assume_init() };
    Measured {
        status: (!killed && libc::WIFEXITED(status)).then(|| libc::WEXITSTATUS(status)),
        stdout: reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
        max_rss: usage.ru_maxrss as u64 * 1024,
        secs,
    }
}

/// `measured`, which must have succeeded within `limit`.
fn ok_within(args: &[&str], limit: Duration) -> Measured {
    let m = measured(args, limit);
    assert_eq!(
        m.status,
        Some(0),
        "{args:?} after {:.1} s (limit {limit:?}): {}",
        m.secs,
        m.stderr
    );
    m
}

fn device(d: i32, live: u64) -> DeviceReport {
    DeviceReport {
        device: d,
        total_bytes: 80 << 30,
        current_bytes: live,
        peak_bytes: live,
        allocs: 1,
        live_count: 1,
        ..Default::default()
    }
}

fn shell(seq: u64) -> Report {
    Report {
        schema: SCHEMA.into(),
        gpuguard_version: "test".into(),
        reason: if seq == 1 { "snapshot" } else { "exit" }.into(),
        seq,
        pid: 77,
        program: "big".into(),
        argv: vec!["big".into()],
        uptime_s: seq as f64,
        ..Default::default()
    }
}

fn write_json(path: &Path, r: &Report) {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    serde_json::to_writer(&mut w, r).unwrap();
    w.flush().unwrap();
}

const SITES: u32 = 200_000;
/// Quadratic code took minutes on these inputs; the new code seconds.
const LIMIT: Duration = Duration::from_secs(60);

/// Writes `r` with its empty `field` (`"sites":[]`, `"live":[]`) filled by `items`,
/// one by one: this process holds none of them (a child's peak memory counts the
/// parent's as it starts, so the parent stays small).
fn write_spliced<T: serde::Serialize>(
    path: &Path,
    r: &Report,
    field: &str,
    items: impl Iterator<Item = T>,
) {
    let text = serde_json::to_string(r).unwrap();
    let (head, tail) = text.split_once(&format!("\"{field}\":[]")).unwrap();
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    write!(w, "{head}\"{field}\":[").unwrap();
    for (i, item) in items.enumerate() {
        if i > 0 {
            w.write_all(b",").unwrap();
        }
        serde_json::to_writer(&mut w, &item).unwrap();
    }
    write!(w, "]{tail}").unwrap();
    w.flush().unwrap();
}

/// A report of `SITES` distinct sites (distinct innermost frames under shared outer
/// ones: one flame-graph frame with 200k children), the even ones grown in `seq` 2.
fn many_sites(dir: &Path, seq: u64) -> PathBuf {
    let site = |i: u32| {
        let grow = if seq > 1 && i.is_multiple_of(2) {
            4096
        } else {
            0
        };
        Site {
            id: i,
            frames: vec![
                format!("alloc_{i}+0x1d (libapp.so+0x{:x})", 0x1000 + i),
                "layer+0x40 (libapp.so+0x2000)".into(),
                "main+0x1d (prog+0x8105d)".into(),
            ],
            live_bytes: u64::from(SITES - i) * 4096 + grow,
            live_count: 1,
            captured: None,
            held_by: Vec::new(),
            captured_bytes: 0,
        }
    };
    let mut r = shell(seq);
    r.devices = vec![device(0, (0..SITES).map(|i| site(i).live_bytes).sum())];
    let path = dir.join(format!("sites{seq}.json"));
    write_spliced(&path, &r, "sites", (0..SITES).map(site));
    path
}

#[test]
fn two_hundred_thousand_sites_show_diff_and_flamegraph_in_linear_time() {
    let dir = scratch("sites");
    let (a, b) = (many_sites(&dir, 1), many_sites(&dir, 2));
    let shown = ok_within(&["show", s(&a)], LIMIT).stdout();
    assert!(
        shown.contains(&format!("... {} more call sites", SITES - 10)),
        "{shown}"
    );
    let diff = ok_within(&["diff", s(&a), s(&b)], LIMIT).stdout();
    assert!(
        diff.contains(&format!("{} call sites whose live bytes grew", SITES / 2)),
        "{diff}"
    );
    let html = dir.join("f.html");
    ok_within(&["flamegraph", s(&a), "-o", s(&html)], LIMIT);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("alloc_199999+0x1d"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn diff_is_linear_in_devices() {
    let dir = scratch("devices");
    let n = 100_000;
    let write = |seq: u64| {
        let mut r = shell(seq);
        r.devices = (0..n).map(|d| device(d, seq << 20)).collect();
        let path = dir.join(format!("d{seq}.json"));
        write_json(&path, &r);
        path
    };
    let (a, b) = (write(1), write(2));
    let diff = ok_within(&["diff", s(&a), s(&b)], LIMIT).stdout();
    assert!(
        diff.contains(&format!("\n  {:<7} 1.0 MiB -> 2.0 MiB", n - 1)),
        "{}",
        &diff[..2000]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A report of `live` allocations, largest first, written entry by entry.
fn many_live(path: &Path, live: u64) {
    let mut r = shell(1);
    r.devices = vec![device(0, live << 12)];
    r.sites = vec![Site {
        id: 0,
        frames: vec!["alloc+0x1 (libapp.so+0x1)".into()],
        live_bytes: live << 12,
        live_count: live,
        captured: None,
        held_by: Vec::new(),
        captured_bytes: 0,
    }];
    let entry = |i: u64| LiveAllocation {
        address: Hex(0x7f00_0000_0000 + (i << 12)),
        bytes: (live - i) * 64,
        kind: "device".into(),
        api: "cuMemAlloc_v2".into(),
        site: Some(0),
        ..Default::default()
    };
    write_spliced(path, &r, "live", (0..live).map(entry));
}

#[test]
fn a_million_live_allocations_show_in_bounded_memory() {
    let dir = scratch("live");
    let path = dir.join("live.json");
    let live = 1_000_000;
    many_live(&path, live);
    let size = std::fs::metadata(&path).unwrap().len();
    let m = ok_within(&["show", s(&path)], LIMIT);
    assert!(m.stdout().contains(&format!("... {} more", live - 10)));
    // The target is 300 MB for a release build; a debug one holds no more data.
    assert!(
        m.max_rss < 300 << 20,
        "show held {} MB for a {} MB report",
        m.max_rss >> 20,
        size >> 20
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Holding a 64 MiB string once would pass this; the old code held it 2-8 times.
const NAME: usize = 64 << 20;
const MEMORY: u64 = 48 << 20;

#[test]
fn a_huge_program_name_is_cut_in_show_and_the_flame_graph() {
    let dir = scratch("name");
    // Placeholders, replaced by long runs as the file is written.
    let mut r = shell(1);
    r.program = "@P@".into();
    r.argv = vec!["@A@".into(); 4];
    r.sites = vec![Site {
        id: 0,
        frames: vec!["@F@+0x1 (lib.so+0x1)".into()],
        live_bytes: 1 << 20,
        live_count: 1,
        captured: None,
        held_by: Vec::new(),
        captured_bytes: 0,
    }];
    r.devices = vec![device(0, 1 << 20)];
    let path = dir.join("name.json");
    let text = serde_json::to_string(&r).unwrap();
    let mut w = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut rest = text.as_str();
    while let Some(at) = rest.find('@') {
        w.write_all(&rest.as_bytes()[..at]).unwrap();
        let (c, len) = match &rest[at + 1..at + 2] {
            "P" => (b'P', NAME),
            "A" => (b'A', 1 << 20),
            _ => (b'F', 8 << 20),
        };
        let chunk = vec![c; 1 << 20];
        for _ in 0..len >> 20 {
            w.write_all(&chunk).unwrap();
        }
        rest = &rest[at + 3..];
    }
    w.write_all(rest.as_bytes()).unwrap();
    w.flush().unwrap();
    drop(w);
    for args in [&["show"][..], &["show", "--json"], &["diff"]] {
        let mut args = args.to_vec();
        args.push(s(&path));
        if args[0] == "diff" {
            args.push(s(&path));
        }
        let m = ok_within(&args, LIMIT);
        let out = m.stdout();
        assert!(
            out.len() < 64 << 10,
            "{args:?}: {} bytes of output",
            out.len()
        );
        assert!(
            out.contains("PPPP…"),
            "{args:?}: {}",
            &out[..out.len().min(300)]
        );
        assert!(m.max_rss < MEMORY, "{args:?}: {} MB", m.max_rss >> 20);
    }
    let shown = measured(&["show", s(&path)], LIMIT).stdout();
    assert!(shown.contains("FFFF…"), "the frame is cut too");
    let html = dir.join("name.html");
    let m = ok_within(&["flamegraph", s(&path), "-o", s(&html)], LIMIT);
    let page = std::fs::metadata(&html).unwrap().len();
    assert!(page < 256 << 10, "a page of {page} bytes");
    assert!(m.max_rss < MEMORY, "flamegraph: {} MB", m.max_rss >> 20);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_long_trace_plots_in_bounded_memory() {
    let dir = scratch("trace");
    let path = dir.join("trace.json");
    let mut w = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    writeln!(w, "[").unwrap();
    writeln!(
        w,
        r#"{{"name":"gpuguard_trace","ph":"M","pid":7,"tid":7,"args":{{"schema":"gpuguard-trace/1","program":"long","start_unix_ms":0}}}},"#
    )
    .unwrap();
    let mut written = 0usize;
    let mut i = 0u64;
    // Half counters, half warnings: each warning cost the old reader a map.
    while written < 48 << 20 {
        let line = if i.is_multiple_of(2) {
            format!(
                "{{\"name\":\"device 0\",\"ph\":\"C\",\"ts\":{i},\"pid\":7,\"tid\":7,\"args\":{{\"live\":{},\"pool_held\":0}}}},\n",
                (i * 4096) % (1 << 34)
            )
        } else {
            format!(
                "{{\"name\":\"warning\",\"ph\":\"i\",\"ts\":{i},\"pid\":7,\"tid\":7,\"s\":\"p\",\"args\":{{\"device\":0,\"message\":\"near the cap\"}}}},\n"
            )
        };
        w.write_all(line.as_bytes()).unwrap();
        written += line.len();
        i += 1;
    }
    w.flush().unwrap();
    drop(w);
    let svg = dir.join("trace.svg");
    let m = ok_within(&["plot", s(&path), "-o", s(&svg)], LIMIT);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains(&format!("warning (400 shown of {})", i / 2)),
        "{}",
        &text[..2000]
    );
    assert!(m.max_rss < MEMORY, "plot: {} MB", m.max_rss >> 20);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_deep_stack_draws_without_overflowing() {
    // The flame graph's tree is built, sorted and encoded by recursion: a site of
    // 200,000 frames overflowed the stack (SIGABRT) before it kept 512.
    let dir = scratch("deep");
    let mut r = shell(1);
    r.sites = vec![Site {
        id: 0,
        frames: (0..200_000).map(|i| format!("f{i}")).collect(),
        live_bytes: 1 << 20,
        live_count: 1,
        captured: None,
        held_by: Vec::new(),
        captured_bytes: 0,
    }];
    r.devices = vec![device(0, 1 << 20)];
    let path = dir.join("deep.json");
    write_json(&path, &r);
    let html = dir.join("deep.html");
    ok_within(&["flamegraph", s(&path), "-o", s(&html)], LIMIT);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("(199489 outer frames left out)"),
        "{}",
        page.len()
    );
    assert!(page.contains("\"f0\""), "the innermost frame is kept");
    let _ = std::fs::remove_dir_all(&dir);
}
