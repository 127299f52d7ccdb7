//! `gpuguard diff A B`: what changed from one report to another, per device and per
//! call site, growth and shrinkage; `--fail-on-growth SIZE` makes it a CI check.

use super::growth::{SiteTrend, changed_sites};
use super::json;
use super::load::{load_keeping, shown};
use super::output::print;
use super::text::{clean, command_line, count};
use super::trend::{JsonGrowth, render_trend};
use super::{Failure, Outcome};
use gpuguard_core::report::{Report, human_bytes};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `gpuguard diff` options.
#[derive(clap::Args)]
pub struct DiffArgs {
    /// The earlier report
    #[arg(value_name = "A")]
    pub a: PathBuf,
    /// The later report
    #[arg(value_name = "B")]
    pub b: PathBuf,
    /// Exit with status 1 when the total live bytes (all devices) grew by more
    /// than SIZE from A to B (0 for any growth; 512MiB, 1GB, ...)
    #[arg(long, value_name = "SIZE", value_parser = parse_growth_limit)]
    pub fail_on_growth: Option<u64>,
    /// How many call sites to list each way
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub top: u32,
    /// A machine-readable diff (JSON)
    #[arg(long)]
    pub json: bool,
}

/// `--fail-on-growth`: a size as `GPUGUARD_CAP` takes one, or 0.
fn parse_growth_limit(text: &str) -> Result<u64, String> {
    if text.trim() == "0" {
        return Ok(0);
    }
    gpuguard_core::cap::parse_size(text)
        .ok_or_else(|| format!("{text:?} is not a size (0, 4096, 512MiB, 1.5GiB, 2GB)"))
}

/// One device's figures in one report (zeros where the report lacks the device).
#[derive(Clone, Copy, Default, Serialize)]
struct DeviceFigures {
    live_bytes: u64,
    peak_bytes: u64,
    live_count: u64,
}

impl DeviceFigures {
    /// Adds one of a report's device entries (a report may name a device twice).
    fn add(&mut self, d: &gpuguard_core::report::DeviceReport) {
        self.live_bytes = self.live_bytes.saturating_add(d.current_bytes);
        self.peak_bytes = self.peak_bytes.saturating_add(d.peak_bytes);
        self.live_count = self.live_count.saturating_add(d.live_count);
    }

    fn plus(self, o: DeviceFigures) -> DeviceFigures {
        DeviceFigures {
            live_bytes: self.live_bytes.saturating_add(o.live_bytes),
            peak_bytes: self.peak_bytes.saturating_add(o.peak_bytes),
            live_count: self.live_count.saturating_add(o.live_count),
        }
    }
}

#[derive(Serialize)]
struct DeviceChange {
    /// `null` for the total over all devices.
    device: Option<i32>,
    a: DeviceFigures,
    b: DeviceFigures,
}

#[derive(Serialize)]
struct Side<'a> {
    file: &'a str,
    program: &'a str,
    pid: u32,
    seq: u64,
    reason: &'a str,
    argv: &'a [String],
}

#[derive(Serialize)]
struct JsonDiff<'a> {
    a: Side<'a>,
    b: Side<'a>,
    different_programs: bool,
    /// B is an earlier report of the same process than A.
    written_backwards: bool,
    devices: Vec<DeviceChange>,
    total: DeviceChange,
    /// Total live bytes gained from A to B over all devices (0 if they fell).
    live_growth_bytes: u64,
    /// A's and B's live allocations without a stack (a signal handler's inside a
    /// hook; in reports before stacks were sampled by bytes, those past
    /// `GPUGUARD_STACK_RATE`).
    stackless: [gpuguard_core::report::Stackless; 2],
    /// A's and B's live allocations the stack sampler passed over (the sites'
    /// estimates stand for them).
    sampled_out: [gpuguard_core::report::Stackless; 2],
    #[serde(skip_serializing_if = "Option::is_none")]
    fail_on_growth_bytes: Option<u64>,
    grew: Vec<JsonGrowth>,
    shrank: Vec<JsonGrowth>,
}

/// Whether the two reports come from different programs: comparing them says
/// little about a leak.
fn different_programs(a: &Report, b: &Report) -> bool {
    a.program != b.program || a.argv != b.argv
}

/// Whether B is an earlier report of the same process than A.
fn written_backwards(a: &Report, b: &Report) -> bool {
    a.pid == b.pid && a.host == b.host && a.program == b.program && b.seq < a.seq
}

fn device_changes(a: &Report, b: &Report) -> (Vec<DeviceChange>, DeviceChange) {
    // One pass over each report's devices: looking each device up in both lists
    // was quadratic in devices.
    let mut by_device: BTreeMap<i32, (DeviceFigures, DeviceFigures)> = BTreeMap::new();
    for d in &a.devices {
        by_device.entry(d.device).or_default().0.add(d);
    }
    for d in &b.devices {
        by_device.entry(d.device).or_default().1.add(d);
    }
    let changes: Vec<DeviceChange> = by_device
        .into_iter()
        .map(|(d, (a, b))| DeviceChange {
            device: Some(d),
            a,
            b,
        })
        .collect();
    let total = changes.iter().fold(
        DeviceChange {
            device: None,
            a: DeviceFigures::default(),
            b: DeviceFigures::default(),
        },
        |acc, c| DeviceChange {
            device: None,
            a: acc.a.plus(c.a),
            b: acc.b.plus(c.b),
        },
    );
    (changes, total)
}

/// `1.0 KiB -> 3.0 KiB (+2.0 KiB)`.
fn bytes_change(a: u64, b: u64) -> String {
    let delta = if b >= a {
        format!("+{}", human_bytes(b - a))
    } else {
        format!("-{}", human_bytes(a - b))
    };
    format!("{} -> {} ({delta})", human_bytes(a), human_bytes(b))
}

fn count_change(a: u64, b: u64) -> String {
    let delta = if b >= a {
        format!("+{}", b - a)
    } else {
        format!("-{}", a - b)
    };
    format!("{a} -> {b} ({delta})")
}

fn describe(label: &str, file: &str, r: &Report) -> String {
    format!(
        "  {label}: {file}: {} (pid {}), reason {}, report #{}, {:.1} s",
        clean(&r.program),
        r.pid,
        clean(&r.reason),
        r.seq,
        r.uptime_s
    )
}

fn render_sites(out: &mut String, sites: &[SiteTrend], grew: bool, top: usize) {
    let labels = ["A".to_string(), "B".to_string()];
    let verb = if grew { "grew" } else { "shrank" };
    if sites.is_empty() {
        put!(out, "\n  no call site's live bytes {verb} from A to B");
        return;
    }
    put!(
        out,
        "\n  {} whose live bytes {verb} from A to B, Python lines first, most first:",
        count(sites.len() as u64, "call site")
    );
    for t in sites.iter().take(top) {
        if grew {
            render_trend(out, t, &labels, '+', t.grew());
        } else {
            render_trend(out, t, &labels, '-', t.shrank());
        }
    }
    if sites.len() > top {
        put!(
            out,
            "    ... {}",
            count((sites.len() - top) as u64, "more call site")
        );
    }
}

/// Live allocations no site holds, A to B, when either report has some: those the
/// stack sampler passed over (the sites' estimates stand for them), and those
/// without a stack (their change is in the totals but in no site's).
fn render_stackless(out: &mut String, a: &Report, b: &Report) {
    if !a.sampled_out.is_empty() || !b.sampled_out.is_empty() {
        put!(
            out,
            "\n  not captured (past GPUGUARD_STACK_RATE; the sites' ~ estimates stand for them): {}, {} allocations",
            bytes_change(a.sampled_out.bytes, b.sampled_out.bytes),
            count_change(a.sampled_out.count, b.sampled_out.count)
        );
    }
    if a.stackless.is_empty() && b.stackless.is_empty() {
        return;
    }
    put!(
        out,
        "\n  without a stack (in the totals, in no site): {}, {} allocations",
        bytes_change(a.stackless.bytes, b.stackless.bytes),
        count_change(a.stackless.count, b.stackless.count)
    );
}

pub fn main(args: DiffArgs) -> Outcome {
    // Sites and device totals only: no live allocation is kept.
    let ra = load_keeping(&args.a, 0)?;
    let rb = load_keeping(&args.b, 0)?;
    let (fa, fb) = (shown(&args.a), shown(&args.b));
    let (grown, shrunk) = changed_sites(&[&ra, &rb]);
    let (devices, total) = device_changes(&ra, &rb);
    let growth = total.b.live_bytes.saturating_sub(total.a.live_bytes);
    let different = different_programs(&ra, &rb);

    let text = if args.json {
        let summary = JsonDiff {
            a: Side {
                file: &fa,
                program: &ra.program,
                pid: ra.pid,
                seq: ra.seq,
                reason: &ra.reason,
                argv: &ra.argv,
            },
            b: Side {
                file: &fb,
                program: &rb.program,
                pid: rb.pid,
                seq: rb.seq,
                reason: &rb.reason,
                argv: &rb.argv,
            },
            different_programs: different,
            written_backwards: written_backwards(&ra, &rb),
            devices,
            total,
            live_growth_bytes: growth,
            stackless: [ra.stackless, rb.stackless],
            sampled_out: [ra.sampled_out, rb.sampled_out],
            fail_on_growth_bytes: args.fail_on_growth,
            grew: grown
                .iter()
                .take(args.top as usize)
                .map(|t| JsonGrowth::new(t, t.grew()))
                .collect(),
            shrank: shrunk
                .iter()
                .take(args.top as usize)
                .map(|t| JsonGrowth::new(t, t.shrank()))
                .collect(),
        };
        json::pretty(&summary)
            .map_err(|e| Failure::Input(format!("cannot encode the diff: {e}")))?
    } else {
        let mut out = String::new();
        put!(out, "gpuguard diff");
        put!(out, "{}", describe("A", &fa, &ra));
        put!(out, "{}", describe("B", &fb, &rb));
        if different {
            put!(
                out,
                "  warning: A and B come from different programs ({:?} and {:?}): their call sites are not the same code run twice",
                command_line(&ra.argv),
                command_line(&rb.argv)
            );
        }
        if written_backwards(&ra, &rb) {
            put!(
                out,
                "  warning: B (report #{}) was written before A (report #{}) by the same process: the changes read backwards (give the earlier report first)",
                rb.seq,
                ra.seq
            );
        }
        put!(out);
        put!(
            out,
            "  {:<7} {:<38} {:<38} {}",
            "device",
            "live A -> B",
            "peak A -> B",
            "live allocations A -> B"
        );
        for c in devices.iter().chain([&total]) {
            put!(
                out,
                "  {:<7} {:<38} {:<38} {}",
                c.device
                    .map_or_else(|| "total".to_string(), |d| d.to_string()),
                bytes_change(c.a.live_bytes, c.b.live_bytes),
                bytes_change(c.a.peak_bytes, c.b.peak_bytes),
                count_change(c.a.live_count, c.b.live_count)
            );
        }
        render_sites(&mut out, &grown, true, args.top as usize);
        render_sites(&mut out, &shrunk, false, args.top as usize);
        render_stackless(&mut out, &ra, &rb);
        out
    };
    print(&text)?;
    match args.fail_on_growth {
        Some(limit) if growth > limit => Err(Failure::Check(format!(
            "live memory grew by {} from A to B, more than --fail-on-growth {}",
            human_bytes(growth),
            human_bytes(limit)
        ))),
        _ => Ok(0),
    }
}
