//! A report with many live allocations (200k here; the library writes up to 1M) is
//! read as a stream: `show`, `diff` and `flamegraph` keep only the live allocations
//! they print. Checked without timing: each prints exactly what it prints for the
//! same report with `live[]` cut to the entries shown (the rest counted in
//! `live_omitted`), and `show` stays far below the file's size in memory.

use gpuguard_core::report::{DeviceReport, Hex, HostReport, LiveAllocation, Report, SCHEMA, Site};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

const LIVE: u64 = 200_000;
const SITES: u64 = 40;

fn cli() -> &'static str {
    env!("CARGO_BIN_EXE_gpuguard")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn entry(i: u64, grow: u64) -> LiveAllocation {
    LiveAllocation {
        address: Hex(0x7f00_0000_0000 + (i << 12)),
        bytes: (LIVE - i) * 64 + grow * (i % SITES),
        device: (i % 2) as i32,
        kind: if i.is_multiple_of(5) {
            "pool"
        } else {
            "device"
        }
        .into(),
        api: "cuMemAlloc_v2".into(),
        thread: 7,
        age_s: i as f64 / 1000.0,
        site: Some((i % SITES) as u32),
        ..Default::default()
    }
}

/// A report of two devices, 40 sites and `LIVE` allocations largest first, written
/// with its first `keep` entries of `live[]` (the others counted in `live_omitted`),
/// entry by entry: this process never holds them (a child's peak memory counts the
/// parent's at its start).
fn write(dir: &Path, name: &str, pid: u32, seq: u64, grow: u64, keep: u64) -> PathBuf {
    let mut site_bytes = vec![0u64; SITES as usize];
    let mut dev_bytes = [0u64; 2];
    for i in 0..LIVE {
        let a = entry(i, grow);
        site_bytes[(i % SITES) as usize] += a.bytes;
        dev_bytes[a.device as usize] += a.bytes;
    }
    let mut sites: Vec<Site> = (0..SITES)
        .map(|id| Site {
            id: id as u32,
            frames: vec![
                format!("alloc_{id} (libapp.so+0x{:x})", 0x1000 + id),
                "main".into(),
            ],
            live_bytes: site_bytes[id as usize],
            live_count: LIVE / SITES,
            captured: None,
            held_by: Vec::new(),
            captured_bytes: 0,
        })
        .collect();
    sites.sort_by_key(|s| std::cmp::Reverse(s.live_bytes));
    let devices = (0..2)
        .map(|d| DeviceReport {
            device: d as i32,
            total_bytes: 80 << 30,
            current_bytes: dev_bytes[d],
            peak_bytes: 80 << 29,
            allocs: LIVE / 2,
            live_count: LIVE / 2,
            ..Default::default()
        })
        .collect();
    let shell = Report {
        schema: SCHEMA.into(),
        gpuguard_version: "test".into(),
        reason: "exit".into(),
        seq,
        pid,
        program: "big".into(),
        argv: vec!["big".into()],
        devices,
        host_pinned: HostReport::default(),
        live: Vec::new(),
        live_omitted: 5 + LIVE - keep,
        sites,
        ..Default::default()
    };
    let text = serde_json::to_string(&shell).unwrap();
    let (head, tail) = text.split_once("\"live\":[]").unwrap();
    let path = dir.join(name);
    let mut w = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    write!(w, "{head}\"live\":[").unwrap();
    for i in 0..keep {
        if i > 0 {
            w.write_all(b",").unwrap();
        }
        serde_json::to_writer(&mut w, &entry(i, grow)).unwrap();
    }
    write!(w, "]{tail}").unwrap();
    w.flush().unwrap();
    path
}

/// stdout of a successful run, with the named files' paths replaced by `full`'s.
fn run(args: &[&str], rename: &[(&Path, &Path)]) -> String {
    let out = Command::new(cli()).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut text = String::from_utf8(out.stdout).unwrap();
    for (from, to) in rename {
        text = text.replace(s(from), s(to));
    }
    text
}

/// The largest resident size of the children waited for so far, in bytes.
fn children_max_rss() -> u64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, usage.as_mut_ptr()) };
    assert_eq!(rc, 0);
    // SAFETY: filled by the successful call above.
    let usage = unsafe { usage.assume_init() };
    usage.ru_maxrss as u64 * 1024
}

#[test]
fn many_live_allocations_stream_through_show_diff_and_flamegraph() {
    let dir = std::env::temp_dir().join(format!("gg-big-reports-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pa = write(&dir, "a.json", 41, 1, 0, LIVE);
    let pb = write(&dir, "b.json", 41, 2, 3, LIVE);
    let size = std::fs::metadata(&pa).unwrap().len();
    assert!(size > 20 << 20, "{size}");
    let ca = write(&dir, "ca.json", 41, 1, 0, 10);
    let cb = write(&dir, "cb.json", 41, 2, 3, 10);

    // Memory first, while no other child has run: the text is not held, nor the
    // 200k entries (reading them whole took more than the file's size).
    let shown = run(&["show", s(&pa)], &[]);
    let rss = children_max_rss();
    assert!(
        rss < size / 2,
        "gpuguard show held {rss} B for a {size} B report"
    );
    assert!(
        shown.contains(&format!("... {} more", LIVE + 5 - 10)),
        "{shown}"
    );

    // Each view prints what it prints for the report cut to the entries it shows.
    let names: &[(&Path, &Path)] = &[(&ca, &pa), (&cb, &pb)];
    assert_eq!(run(&["show", s(&ca)], names), shown);
    for extra in [&["--json"][..], &["--top", "3"], &["--leaks"]] {
        let args = |x: &Path, y: &Path| {
            let mut v = vec!["show".to_string()];
            v.extend(extra.iter().map(|e| e.to_string()));
            v.extend([s(x).to_string(), s(y).to_string()]);
            v
        };
        let full = args(&pa, &pb);
        let small = args(&ca, &cb);
        let full: Vec<&str> = full.iter().map(String::as_str).collect();
        let small: Vec<&str> = small.iter().map(String::as_str).collect();
        assert_eq!(run(&small, names), run(&full, &[]), "{extra:?}");
    }
    let three = run(&["show", "--top", "3", s(&pa)], &[]);
    assert!(
        three.contains(&format!("... {} more", LIVE + 5 - 3)),
        "{three}"
    );
    assert_eq!(
        run(&["diff", s(&ca), s(&cb)], names),
        run(&["diff", s(&pa), s(&pb)], &[])
    );
    let html = |input: &Path, out: &str| {
        let out = dir.join(out);
        run(&["flamegraph", s(input), "-o", s(&out)], &[]);
        std::fs::read_to_string(&out)
            .unwrap()
            .replace(s(input), s(&pa))
    };
    assert_eq!(html(&ca, "c.html"), html(&pa, "a.html"));
    let _ = std::fs::remove_dir_all(&dir);
}
