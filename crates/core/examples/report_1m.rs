//! The exit report at scale, core only: a ledger with N live records (default 1M)
//! from 1,000 interned call sites, then the report built and written to a file as
//! the shim writes it. Prints the wall time and the peak resident bytes added while
//! writing (VmHWM, reset before the report through /proc/self/clear_refs).
//!
//!   cargo build --release -p gpuguard-core --example report_1m
//!   target/release/examples/report_1m [live] [stream|build] [max_live]

use gpuguard_core::config::Launch;
use gpuguard_core::ledger::{Key, Kind, Ledger, Record};
use gpuguard_core::report::ReportConfig;
use gpuguard_core::reporter::{self, FrameInfo, ReportInput};
use gpuguard_core::sites::SiteTable;
use std::time::Instant;

fn status_kb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// User + system CPU seconds of this process so far (load on a shared machine
/// stretches wall time, much less this).
fn cpu_s() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = s.rsplit(')').next().unwrap_or("");
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the ")".
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args
        .get(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let mode = args.get(2).map_or("stream", String::as_str);
    let max_live: Option<usize> = args.get(3).and_then(|v| v.parse().ok());
    let ledger = Ledger::new();
    let sites = SiteTable::new();
    let ids: Vec<u32> = (0..1000usize)
        .map(|i| sites.intern(&(0..16).map(|f| 0x40_0000 + i * 64 + f).collect::<Vec<_>>()))
        .collect();
    for i in 0..n {
        let rec = Record {
            bytes: 256 + 64 * (i % 16),
            ctx: 1,
            t_ns: i,
            site: ids[(i % 1000) as usize],
            thread: 7,
            device: (i % 2) as i16,
            kind: if i % 5 == 0 { Kind::Pool } else { Kind::Device },
            api: 0,
            weight: gpuguard_core::sampler::ONE,
        };
        ledger.insert(Key::device(0x7f00_0000_0000 + (i << 12)), rec);
    }
    let launch = Launch {
        rank: None,
        local_rank: None,
        world_size: None,
        host: None,
    };
    let input = ReportInput {
        reason: "exit",
        seq: 1,
        pid: std::process::id(),
        program: "report_1m",
        argv: args.clone(),
        time_unix_ms: 0,
        uptime_s: 1.0,
        now_ns: 2_000_000_000,
        ledger: &ledger,
        sites: &sites,
        api_name: &|_| "cuMemAlloc_v2",
        symbolize: &|pc| FrameInfo {
            text: format!("frame_{pc:x} (libapp.so+0x{pc:x})"),
            inlined: Vec::new(),
            internal: false,
            interpreter: false,
        },
        device_total: &|_| 80 << 30,
        config: ReportConfig::default(),
        denial: None,
        max_live,
        launch: &launch,
    };
    let dir = std::env::temp_dir().join(format!("gg-report-1m-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rss0 = status_kb("VmRSS:");
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let t = Instant::now();
    let c0 = cpu_s();
    let path = if mode == "build" {
        let report = reporter::build(&input);
        reporter::write_atomic_with(&dir, "r.json", |w| {
            serde_json::to_writer(&mut *w, &report).map_err(std::io::Error::other)?;
            w.write_all(b"\n")
        })
    } else {
        let (report, live) = reporter::build_parts(&input);
        eprintln!(
            "build_parts: {:.3} s wall, {:.2} s CPU",
            t.elapsed().as_secs_f64(),
            cpu_s() - c0
        );
        reporter::write_atomic_with(&dir, "r.json", |w| {
            reporter::write_json(w, &report, &live, &input)?;
            w.write_all(b"\n")
        })
    }
    .unwrap();
    let secs = t.elapsed().as_secs_f64();
    let cpu = cpu_s() - c0;
    let hwm = status_kb("VmHWM:");
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "mode={mode} live={n} time_s={secs:.3} cpu_s={cpu:.2} rss_before_MB={:.1} peak_added_MB={:.1} ({:.0} B/live) file_MB={:.1}",
        rss0 as f64 / 1024.0,
        hwm.saturating_sub(rss0) as f64 / 1024.0,
        hwm.saturating_sub(rss0) as f64 * 1024.0 / n.max(1) as f64,
        size as f64 / 1e6
    );
    if std::env::var_os("KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("{}", path.display());
    }
}
