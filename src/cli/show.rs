//! `gpuguard show`: the answer first (the suspected leaks across reports, then per
//! report, in `seq` order, a table per device and the lines holding the most live
//! memory), then the details.
//!
//! Why one file of about 800 lines before its tests: the text and the `--json` output
//! are built from the same pieces side by side, so that both always say the same; the
//! site and trend logic they share is in `growth.rs`, a refusal's answer (`oom` and
//! cap reports) in `refusals.rs`; what `diff`, `trim` and `run` print too is in
//! `trend.rs`, `trim_report.rs` and `words.rs`.

use super::growth::{
    Live, MergedSite, PYTHON_STACK, SiteKey, SiteTrend, live_allocations, native_sites,
    python_sites,
};
use super::holders;
use super::json;
use super::load::{load_all_keeping, shown};
use super::output::print;
use super::refusals::{render_oom, render_refusal};
use super::text::{FRAMES_SHOWN, clean, command_line, count, frames, put_frames, readable_frames};
use super::trend::{JsonGrowth, render_rows_answered};
use super::trim_report::render_trim;
use super::words::{holding, pinned_line, rank_words};
use super::{Failure, Outcome};
use gpuguard_core::growth::{Suspect, suspects};
use gpuguard_core::report::{self, Report, human_bytes};
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;

/// `gpuguard show` options.
#[derive(clap::Args)]
pub struct ShowArgs {
    /// Report files (gpuguard.*.json); several of one process show suspected leaks
    #[arg(required = true, value_name = "REPORT")]
    pub files: Vec<PathBuf>,
    /// Only the suspected leaks and the lines holding the most live memory
    #[arg(long = "leaks")]
    pub leaks_only: bool,
    /// How many call sites and allocations to list
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub top: u32,
    /// A machine-readable summary (JSON) of what the text shows
    #[arg(long)]
    pub json: bool,
}

pub fn main(args: ShowArgs) -> Outcome {
    // Only the first `top` live allocations are ever shown: the rest are counted.
    let reports = load_all_keeping(&args.files, args.top as usize)?;
    let mut named: Vec<(String, &Report)> =
        args.files.iter().map(|f| shown(f)).zip(&reports).collect();
    in_seq_order(&mut named);
    let text = if args.json {
        let summary = json_summary(&named, &args);
        json::pretty(&summary)
            .map_err(|e| Failure::Input(format!("cannot encode the summary: {e}")))?
    } else {
        render(&named, &args)
    };
    print(&text)?;
    Ok(0)
}

/// Each process's reports in `seq` order (a shell's glob gives #1, #10, #11, #2), the
/// processes in the order of their first file given.
fn in_seq_order<'a>(named: &mut [(String, &'a Report)]) {
    let process = |r: &'a Report| (r.host.as_deref(), r.pid);
    let mut first: HashMap<(Option<&str>, u32), usize> = HashMap::new();
    for (i, (_, r)) in named.iter().enumerate() {
        first.entry(process(r)).or_insert(i);
    }
    // Stable: a report given twice stays twice.
    named.sort_by_key(|(_, r)| (first[&process(r)], r.seq));
}

/// The answer first (the suspected leaks, where several reports of a process give
/// them), then what supports it: each report's figures and top lines, then details.
fn render(named: &[(String, &Report)], args: &ShowArgs) -> String {
    let mut out = String::new();
    let reports: Vec<&Report> = named.iter().map(|(_, r)| *r).collect();
    render_suspected(&mut out, &reports, args.top as usize);
    for (file, r) in named {
        if !out.is_empty() && !out.ends_with("\n\n") {
            put!(out);
        }
        if let Some(o) = r.oom.as_ref().filter(|_| !args.leaks_only) {
            render_oom(&mut out, o);
        }
        render_header(&mut out, file, r);
        if !args.leaks_only {
            render_devices(&mut out, r);
        }
        render_top_sites(&mut out, r, args.top as usize);
    }
    if args.leaks_only {
        return out;
    }
    render_ranks(&mut out, &reports);
    for (file, r) in named {
        render_details(&mut out, file, r, args.top as usize);
    }
    out
}

/// Who wrote the report, when and why.
fn render_header(out: &mut String, file: &str, r: &Report) {
    put!(out, "gpuguard report {file}");
    put!(
        out,
        "  {} (pid {}{}), reason: {}, report #{}, {:.1} s after the first CUDA call",
        clean(&r.program),
        r.pid,
        rank_words(r),
        clean(&r.reason),
        r.seq,
        r.uptime_s
    );
    if !r.argv.is_empty() {
        put!(out, "  command: {}", command_line(&r.argv));
    }
}

/// Bytes for a table cell; `-` where nobody could say.
fn cell(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "-".into(), human_bytes)
}

/// One line per device, in the spirit of `torch.cuda.memory_summary()`.
fn render_devices(out: &mut String, r: &Report) {
    put!(out);
    put!(
        out,
        "  {:<6} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9} {:>7} {:>7} {:>8}",
        "device",
        "live",
        "peak",
        "in use",
        "cached",
        "cap",
        "total",
        "allocs",
        "frees",
        "failed",
        "denied",
        "unknown"
    );
    for d in &r.devices {
        put!(
            out,
            "  {:<6} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9} {:>7} {:>7} {:>8}",
            d.device,
            human_bytes(d.current_bytes),
            human_bytes(d.peak_bytes),
            cell(d.in_use_bytes),
            cell(d.cached_bytes),
            d.cap_bytes.map_or_else(|| "none".into(), human_bytes),
            if d.total_bytes > 0 {
                human_bytes(d.total_bytes)
            } else {
                "?".into()
            },
            d.allocs,
            d.frees,
            d.failed,
            d.denied,
            d.unknown_frees
        );
    }
    if r.devices.is_empty() {
        put!(out, "  (no device memory was used)");
    }
    if let Some(line) = pinned_line(r) {
        put!(out, "  {line}");
    }
    if let Some(d) = &r.denial {
        render_refusal(out, d);
    }
}

/// A site's figures and frames, as the top lists and the details show them.
/// One site: its label, bytes (`~` before an estimate), what holds them, frames.
fn render_site(
    out: &mut String,
    label: &str,
    bytes: u64,
    estimated: bool,
    what: &str,
    site_frames: &[String],
) {
    let approx = if estimated { "~" } else { "" };
    put!(
        out,
        "    {label:<12} {:>11} in {what}",
        format!("{approx}{}", human_bytes(bytes))
    );
    put_frames(out, site_frames);
}

/// The heading over a report's Python lines: framework blocks in use, or (for lines
/// read from the allocating thread's stack) the allocations the lines made.
fn python_heading(sites: &[MergedSite]) -> &'static str {
    let stack = sites
        .iter()
        .filter(|s| s.python == Some(PYTHON_STACK))
        .count();
    if stack == 0 {
        "Python lines holding framework memory in use, most first:"
    } else if stack == sites.len() {
        "Python lines whose allocations hold the live memory, most first:"
    } else {
        "Python lines holding the most live memory, most first:"
    }
}

/// The live allocations, then the lines holding the most: Python lines where the
/// report has them (the program's own code), else the native call sites.
fn render_top_sites(out: &mut String, r: &Report, top: usize) {
    let what = if r.reason == "exit" {
        "still live at exit (leaks, or memory freed only by process teardown)"
    } else {
        "live"
    };
    put!(out);
    put!(out, "  {} {what}", count(live_allocations(r), "allocation"));
    let py = python_sites(r);
    if !py.is_empty() {
        put!(out, "  {}", python_heading(&py));
        render_merged(out, &py, top, "more Python line", None);
    } else if !r.sites.is_empty() {
        put!(out, "  call sites holding the most live bytes:");
        render_native_sites(out, r, top);
    }
    render_stackless(out, r);
}

/// Live allocations no site holds, though stacks are on, and why; and those the
/// sampler passed over, which the sites' estimates stand for.
fn render_stackless(out: &mut String, r: &Report) {
    if r.config.stack_depth == 0 {
        return;
    }
    let s = r.sampled_out;
    if !s.is_empty() {
        let rate = r.config.stack_rate.unwrap_or(0);
        put!(
            out,
            "  {} ({}) not captured: past {rate} stack captures a second per thread, \
             stacks are sampled by bytes; the figures marked ~ are estimates that stand \
             for them (GPUGUARD_STACK_RATE=all: every stack)",
            count(s.count, "live allocation"),
            human_bytes(s.bytes)
        );
    }
    let s = r.stackless;
    if s.is_empty() {
        return;
    }
    // Reports made before stacks were sampled by bytes listed the sampled-out
    // allocations here, with no estimates.
    let older = r.config.stack_rate.is_some() && !r.config.sampled_by_bytes;
    let why = match r.config.stack_rate {
        Some(rate) if older => format!(
            "past {rate} stack captures a second per thread only some allocations get one \
             (GPUGUARD_STACK_RATE=all: every one)"
        ),
        _ => "made by signal handlers inside a hook, or their stack could not be read".to_string(),
    };
    put!(
        out,
        "  {} ({}) without a stack: {why}",
        count(s.count, "live allocation"),
        human_bytes(s.bytes)
    );
}

/// Up to `top` merged sites, then how many were left out; with `holders_in`, under
/// each the Python lines whose framework blocks fill its allocations (native sites).
fn render_merged(
    out: &mut String,
    sites: &[MergedSite],
    top: usize,
    more: &str,
    holders_in: Option<&Report>,
) {
    for s in sites.iter().take(top) {
        render_site(
            out,
            &s.label(),
            s.live_bytes,
            s.captured.is_some(),
            &holding(s),
            s.frames,
        );
        for line in holders_in
            .map(|r| holders::lines(r, &s.ids))
            .unwrap_or_default()
        {
            put!(out, "        held by {line}");
        }
    }
    if sites.len() > top {
        put!(out, "    ... {}", count((sites.len() - top) as u64, more));
    }
}

/// The native call sites, each with the Python lines whose framework blocks fill
/// its allocations, where the report knows them.
fn render_native_sites(out: &mut String, r: &Report, top: usize) {
    render_merged(out, &native_sites(r), top, "more call site", Some(r));
}

/// The reports of each process (host and pid) with 2 or more of them, by `seq`.
fn processes<'a>(reports: &[&'a Report]) -> Vec<Vec<&'a Report>> {
    // A process is its host and pid.
    type Process<'r> = (Option<&'r str>, u32);
    // In the order of their first report; found by a hash lookup, not a search.
    let mut groups: Vec<Vec<&Report>> = Vec::new();
    let mut at: HashMap<Process, usize> = HashMap::new();
    for r in reports {
        let key = (r.host.as_deref(), r.pid);
        let i = *at.entry(key).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[i].push(r);
    }
    groups
        .into_iter()
        .filter_map(|mut group| {
            group.sort_by_key(|r| r.seq);
            group.dedup_by_key(|r| r.seq);
            (group.len() >= 2).then_some(group)
        })
        .collect()
}

/// A suspect as a trend over its reports (for the rows and the JSON).
fn suspect_trend(s: &Suspect) -> SiteTrend {
    SiteTrend {
        key: SiteKey {
            python: s.key.framework.clone(),
            frames: s.key.frames.clone(),
        },
        live: s
            .live
            .iter()
            .map(|&(bytes, count)| Live {
                bytes,
                count,
                estimated: false,
            })
            .collect(),
    }
}

/// Marks the figures of `t` that are estimates in the reports of `group` (its
/// series, in order): where the site's stacks or blocks were sampled there.
fn mark_estimates(t: &mut SiteTrend, group: &[&Report]) {
    for (live, r) in t.live.iter_mut().zip(group) {
        live.estimated = match t.key.python.as_deref() {
            None => r
                .sites
                .iter()
                .any(|s| s.captured.is_some() && s.frames == t.key.frames),
            Some(fw) => r
                .python_sites
                .iter()
                .any(|s| s.captured.is_some() && s.framework == fw && s.frames == t.key.frames),
        };
    }
}

/// For each process with 2 or more reports: its suspected leaks, by
/// `gpuguard_core::growth::suspects` (the criterion is there and in docs/command.md).
/// Each section ends with a blank line.
fn render_suspected(out: &mut String, reports: &[&Report], top: usize) {
    for group in processes(reports) {
        let grown = suspects(&group);
        let labels: Vec<String> = group.iter().map(|r| format!("#{}", r.seq)).collect();
        // A rank's process is named by its rank too: that is how its job knows it.
        let rank = group[0].rank.map_or(String::new(), |r| {
            let of = group[0]
                .world_size
                .map_or(String::new(), |w| format!("/{w}"));
            format!("rank {r}{of}, ")
        });
        put!(
            out,
            "suspected leaks in {} ({rank}pid {}), across reports {}:",
            clean(&group[0].program),
            group[0].pid,
            labels.join(", ")
        );
        if grown.is_empty() {
            put!(
                out,
                "  none: no call site's live bytes kept rising (in both halves of the series, by at least as much as they fell back)"
            );
            put!(out);
            continue;
        }
        // Kinds are told apart only where there are several (see growth.rs).
        let kinds = grown.iter().any(|g| g.precision() != grown[0].precision());
        put!(
            out,
            "  call sites whose live bytes kept rising, {}most bytes grown first:",
            if kinds {
                "a framework's block lines, then Python stack lines, then native sites; "
            } else {
                ""
            }
        );
        for g in grown.iter().take(top) {
            put!(
                out,
                "    +{}{}: rose in {} of {}, {}{}",
                human_bytes(g.growth),
                g.per_second
                    .map_or(String::new(), |r| format!(", {}/s", human_bytes(r as u64))),
                g.rose,
                count(g.intervals as u64, "interval"),
                if g.fell == 0 {
                    "never fell".to_string()
                } else {
                    format!(
                        "fell in {} (at most {} below an earlier figure)",
                        g.fell,
                        human_bytes(g.fell_back)
                    )
                },
                if g.exit_drop_ignored {
                    "; then fell at exit (judged before that drop)"
                } else {
                    ""
                }
            );
            let mut trend = suspect_trend(g);
            mark_estimates(&mut trend, &group);
            render_rows_answered(out, &trend, &labels, &g.unanswered);
            if g.key.framework.is_none() {
                // A framework's segments: the lines whose blocks fill them, as the
                // latest report that knows them says.
                let held = group
                    .iter()
                    .rev()
                    .map(|r| holders::of_frames(r, &g.key.frames))
                    .find(|h| !h.is_empty())
                    .unwrap_or_default();
                for line in held {
                    put!(out, "      held by {line}");
                }
            }
        }
        if grown.len() > top {
            put!(
                out,
                "    ... {}",
                count((grown.len() - top) as u64, "more call site")
            );
        }
        put!(out);
    }
}

/// One line per rank (its latest report) when the reports carry ranks.
fn render_ranks(out: &mut String, reports: &[&Report]) {
    type Rank<'r> = (Option<u64>, Option<&'r str>, u32);
    let mut by_rank: HashMap<Rank, &Report> = HashMap::new();
    for r in reports.iter().filter(|r| r.rank.is_some()) {
        let slot = by_rank
            .entry((r.rank, r.host.as_deref(), r.pid))
            .or_insert(r);
        if slot.seq < r.seq {
            *slot = r;
        }
    }
    let mut latest: Vec<&Report> = by_rank.into_values().collect();
    if latest.is_empty() {
        return;
    }
    latest.sort_by_key(|r| (r.rank, r.host.clone(), r.pid));
    put!(out, "\nper rank (latest report of each):");
    for r in latest {
        let devs: Vec<String> = r
            .devices
            .iter()
            .map(|d| {
                format!(
                    "device {} {} live, peak {}",
                    d.device,
                    human_bytes(d.current_bytes),
                    human_bytes(d.peak_bytes)
                )
            })
            .collect();
        put!(
            out,
            "  rank {}{} host {} pid {} (#{} {}): {}",
            r.rank.unwrap_or_default(),
            r.world_size.map_or(String::new(), |w| format!("/{w}")),
            clean(r.host.as_deref().unwrap_or("?")),
            r.pid,
            r.seq,
            clean(&r.reason),
            if devs.is_empty() {
                "no device memory used".into()
            } else {
                devs.join("; ")
            }
        );
    }
}

/// What the answer left out: memory by kind, the frameworks' split, the trim, the
/// native sites behind Python lines, the largest live allocations.
fn render_details(out: &mut String, file: &str, r: &Report, top: usize) {
    put!(out, "\ndetails of {file}");
    for d in &r.devices {
        if d.by_kind.is_empty() {
            continue;
        }
        let kinds: Vec<String> = d
            .by_kind
            .iter()
            .map(|(k, b)| format!("{} {}", clean(k), human_bytes(*b)))
            .collect();
        put!(
            out,
            "  device {} live by kind: {}",
            d.device,
            kinds.join(", ")
        );
    }
    render_classes(out, r);
    if let Some(c) = &r.capture {
        put!(out, "  CUDA graph capture: {}", clean(&c.detail));
    }
    if let Some(d) = &r.denial {
        put!(out, "  refused call:");
        for f in frames(&d.frames).iter().take(FRAMES_SHOWN) {
            put!(out, "        {f}");
        }
    }
    if let Some(t) = &r.trim {
        render_trim(out, t);
    }
    if !r.python_sites.is_empty() && !r.sites.is_empty() {
        put!(out, "\n  native call sites by live bytes:");
        render_native_sites(out, r, top);
    }
    if !r.live.is_empty() {
        put!(out, "\n  largest live allocations:");
        put!(
            out,
            "    {:<18} {:>11} {:>4} {:<8} {:<24} {:>9} {:>5}",
            "address",
            "bytes",
            "dev",
            "kind",
            "api",
            "age",
            "site"
        );
        for a in r.live.iter().take(top) {
            put!(
                out,
                "    {:<18} {:>11} {:>4} {:<8} {:<24} {:>8.1}s {:>5}",
                a.address.to_string(),
                human_bytes(a.bytes),
                // Pinned host memory belongs to no device.
                if a.kind == "host" {
                    "-".to_string()
                } else {
                    a.device.to_string()
                },
                clean(&a.kind),
                clean(&a.api),
                a.age_s,
                a.site.map_or("-".into(), |s| s.to_string())
            );
        }
        let total = live_allocations(r);
        if total > top as u64 {
            put!(out, "    ... {} more", total - top as u64);
        }
    }
}

/// In use, cached and unclassified bytes per device, and where the split came from.
fn render_classes(out: &mut String, r: &Report) {
    for d in &r.devices {
        if let (Some(u), Some(c)) = (d.in_use_bytes, d.cached_bytes) {
            put!(
                out,
                "  device {}: {} in use by live tensors/arrays, {} cached by frameworks, {} unclassified",
                d.device,
                human_bytes(u),
                human_bytes(c),
                human_bytes(d.current_bytes.saturating_sub(u.saturating_add(c)))
            );
        }
    }
    for c in &r.classification {
        put!(
            out,
            "  {}: {}{}",
            clean(&c.framework),
            clean(&c.status),
            c.detail
                .as_deref()
                .map_or(String::new(), |d| format!(" ({})", clean(d)))
        );
    }
    if let Some(c) = &r.python_cost {
        let windows: Vec<String> = c
            .windows
            .iter()
            .map(|w| {
                format!(
                    "; last {} window {:.0} ms{}",
                    clean(&w.framework),
                    w.ms,
                    w.allocations
                        .map_or(String::new(), |n| format!(", {}", count(n, "allocation")))
                )
            })
            .collect();
        put!(
            out,
            "  gpuguard's Python side: {:.1} ms of the main thread for this report{}",
            c.main_thread_ms,
            windows.concat()
        );
    }
}

// ---------------------------------------------------------------------------
// --json: the same summary for programs
// ---------------------------------------------------------------------------

#[derive(Serialize)]
struct JsonShow<'a> {
    reports: Vec<JsonReport<'a>>,
    suspected_leaks: Vec<JsonSuspect>,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    file: &'a str,
    program: &'a str,
    pid: u32,
    seq: u64,
    reason: &'a str,
    argv: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    rank: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<&'a str>,
    live_allocations: u64,
    /// Left out with `--leaks`, as in the text.
    #[serde(skip_serializing_if = "Option::is_none")]
    devices: Option<Vec<JsonDevice>>,
    /// Left out with `--leaks`, as in the text.
    #[serde(skip_serializing_if = "Option::is_none")]
    host_pinned: Option<&'a report::HostReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    denial: Option<&'a report::DenialReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    oom: Option<&'a report::OomReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trim: Option<&'a report::TrimReport>,
    /// Python lines where the report has them, else native call sites; most first.
    top_sites: Vec<JsonSite>,
    /// Live allocations no site holds though stacks are on (see the report's field).
    #[serde(skip_serializing_if = "report::Stackless::is_empty")]
    stackless: report::Stackless,
    /// Live allocations the stack sampler passed over (see the report's field).
    #[serde(skip_serializing_if = "report::Stackless::is_empty")]
    sampled_out: report::Stackless,
}

#[derive(Serialize)]
struct JsonDevice {
    device: i32,
    live_bytes: u64,
    peak_bytes: u64,
    in_use_bytes: Option<u64>,
    cached_bytes: Option<u64>,
    cap_bytes: Option<u64>,
    total_bytes: u64,
    allocs: u64,
    frees: u64,
    failed: u64,
    denied: u64,
    unknown_frees: u64,
    live_count: u64,
}

#[derive(Serialize)]
struct JsonSite {
    /// The framework whose blocks a Python line holds; absent for a native site.
    #[serde(skip_serializing_if = "Option::is_none")]
    python_framework: Option<String>,
    live_bytes: u64,
    live_count: u64,
    /// Where the figures are estimates: how many allocations were captured.
    #[serde(skip_serializing_if = "Option::is_none")]
    captured: Option<u64>,
    frames: Vec<String>,
}

#[derive(Serialize)]
struct JsonSuspect {
    program: String,
    pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    rank: Option<u64>,
    seqs: Vec<u64>,
    sites: Vec<JsonLeak>,
}

/// A suspected leak: its growth over the reports judged, and how it rose and fell.
#[derive(Serialize)]
struct JsonLeak {
    #[serde(flatten)]
    growth: JsonGrowth,
    /// Intervals between consecutive reports judged, and how many it rose and fell in.
    rose: usize,
    fell: usize,
    intervals: usize,
    /// The deepest it fell below an earlier figure of its own over the reports judged.
    fell_back_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes_per_second: Option<f64>,
    /// The exit report's drop was left out of the judgment.
    exit_drop_ignored: bool,
    /// Reports its framework did not answer for: its figure there is unknown (not
    /// 0), and they were left out of the judgment.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unanswered_seqs: Vec<u64>,
}

fn top_sites(r: &Report, top: usize) -> Vec<JsonSite> {
    let py = python_sites(r);
    let sites = if py.is_empty() { native_sites(r) } else { py };
    sites
        .iter()
        .take(top)
        .map(|s| JsonSite {
            python_framework: s.python.map(str::to_string),
            live_bytes: s.live_bytes,
            live_count: s.live_count,
            captured: s.captured,
            frames: readable_frames(s.frames),
        })
        .collect()
}

fn json_summary<'a>(named: &'a [(String, &'a Report)], args: &ShowArgs) -> JsonShow<'a> {
    let reports = named
        .iter()
        .map(|(file, r)| JsonReport {
            file,
            program: &r.program,
            pid: r.pid,
            seq: r.seq,
            reason: &r.reason,
            argv: &r.argv,
            rank: r.rank,
            host: r.host.as_deref(),
            live_allocations: live_allocations(r),
            devices: (!args.leaks_only).then(|| {
                r.devices
                    .iter()
                    .map(|d| JsonDevice {
                        device: d.device,
                        live_bytes: d.current_bytes,
                        peak_bytes: d.peak_bytes,
                        in_use_bytes: d.in_use_bytes,
                        cached_bytes: d.cached_bytes,
                        cap_bytes: d.cap_bytes,
                        total_bytes: d.total_bytes,
                        allocs: d.allocs,
                        frees: d.frees,
                        failed: d.failed,
                        denied: d.denied,
                        unknown_frees: d.unknown_frees,
                        live_count: d.live_count,
                    })
                    .collect()
            }),
            host_pinned: (!args.leaks_only).then_some(&r.host_pinned),
            denial: r.denial.as_ref().filter(|_| !args.leaks_only),
            oom: r.oom.as_ref().filter(|_| !args.leaks_only),
            trim: r.trim.as_ref().filter(|_| !args.leaks_only),
            top_sites: top_sites(r, args.top as usize),
            stackless: r.stackless,
            sampled_out: r.sampled_out,
        })
        .collect();
    let all: Vec<&Report> = named.iter().map(|(_, r)| *r).collect();
    let suspected_leaks = processes(&all)
        .into_iter()
        .map(|group| JsonSuspect {
            program: group[0].program.clone(),
            pid: group[0].pid,
            rank: group[0].rank,
            seqs: group.iter().map(|r| r.seq).collect(),
            sites: suspects(&group)
                .iter()
                .take(args.top as usize)
                .map(|g| JsonLeak {
                    growth: JsonGrowth::new(&suspect_trend(g), g.growth),
                    rose: g.rose,
                    fell: g.fell,
                    intervals: g.intervals,
                    fell_back_bytes: g.fell_back,
                    bytes_per_second: g.per_second,
                    exit_drop_ignored: g.exit_drop_ignored,
                    unanswered_seqs: group
                        .iter()
                        .zip(&g.unanswered)
                        .filter(|(_, u)| **u)
                        .map(|(r, _)| r.seq)
                        .collect(),
                })
                .collect(),
        })
        .collect();
    JsonShow {
        reports,
        suspected_leaks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuguard_core::report::Site;

    fn rep(pid: u32, seq: u64, sites: &[(&str, u64)]) -> Report {
        Report {
            pid,
            seq,
            sites: sites
                .iter()
                .enumerate()
                .map(|(i, (f, b))| Site {
                    id: i as u32,
                    frames: vec![f.to_string(), "main".into()],
                    live_bytes: *b,
                    live_count: 1,
                    captured: None,
                    held_by: Vec::new(),
                    captured_bytes: 0,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn suspected_leaks_per_process_in_seq_order() {
        let r1 = rep(7, 1, &[("leak", 10), ("bumpy", 10)]);
        let r2 = rep(7, 2, &[("leak", 20), ("bumpy", 5)]);
        let r3 = rep(7, 3, &[("leak", 30), ("bumpy", 40)]);
        let other = rep(8, 1, &[("leak", 1)]);
        let mut out = String::new();
        render_suspected(&mut out, &[&r3, &other, &r1, &r2], 10);
        assert!(out.contains("across reports #1, #2, #3"), "{out}");
        assert!(out.contains("leak") && !out.contains("bumpy"), "{out}");
        assert_eq!(out.matches("suspected leaks").count(), 1, "{out}");
    }

    #[test]
    fn the_answer_comes_first_and_reports_in_seq_order() {
        // Twelve snapshots of one process given in file-name order (#1, #10, #11, #12,
        // #2, ...), a leak stepping every third one, and another process's report.
        let mut reps: Vec<Report> = (1..=12u64)
            .map(|seq| rep(7, seq, &[("leak", 100 + (seq / 3) * 10), ("flat", 5)]))
            .collect();
        reps.push(rep(8, 1, &[("other", 1)]));
        let mut names: Vec<String> = (1..=12).map(|seq| format!("r.7.{seq}.json")).collect();
        names.push("r.8.1.json".into());
        let mut order: Vec<usize> = (0..names.len()).collect();
        order.sort_by(|a, b| names[*a].cmp(&names[*b]));
        let mut named: Vec<(String, &Report)> = order
            .iter()
            .map(|&i| (names[i].clone(), &reps[i]))
            .collect();
        assert_eq!(named[1].0, "r.7.10.json");
        in_seq_order(&mut named);
        let seqs: Vec<(u32, u64)> = named.iter().map(|(_, r)| (r.pid, r.seq)).collect();
        let want: Vec<(u32, u64)> = (1..=12).map(|s| (7, s)).chain([(8, 1)]).collect();
        assert_eq!(seqs, want);
        for leaks_only in [true, false] {
            let args = ShowArgs {
                files: Vec::new(),
                leaks_only,
                top: 10,
                json: false,
            };
            let out = render(&named, &args);
            assert!(out.starts_with("suspected leaks in"), "{out}");
            let first_report = out.find("gpuguard report ").unwrap();
            let section = &out[..first_report];
            assert!(
                section.contains("    +40 B: rose in 4 of 11 intervals, never fell\n"),
                "{out}"
            );
            assert!(!section.contains("flat"), "{out}");
            let headers: Vec<&str> = out
                .lines()
                .filter_map(|l| l.strip_prefix("gpuguard report "))
                .collect();
            let want: Vec<String> = (1..=12)
                .map(|s| format!("r.7.{s}.json"))
                .chain(["r.8.1.json".to_string()])
                .collect();
            assert_eq!(headers, want, "{out}");
        }
        // The JSON's reports too.
        let args = ShowArgs {
            files: Vec::new(),
            leaks_only: true,
            top: 10,
            json: true,
        };
        let summary = json_summary(&named, &args);
        let files: Vec<&str> = summary.reports.iter().map(|r| r.file).collect();
        assert_eq!(files[..3], ["r.7.1.json", "r.7.2.json", "r.7.3.json"]);
        assert_eq!(summary.suspected_leaks[0].sites[0].fell, 0);
    }

    #[test]
    fn a_report_the_framework_did_not_answer_shows_no_figure_for_its_line() {
        // A sampled CuPy line rising in the reports CuPy answered; report #3 was taken
        // while it could not: its figure there is unknown, not 0 B.
        let reps: Vec<Report> = (1..=5u64)
            .map(|seq| {
                let mut r = rep(7, seq, &[]);
                if seq != 3 {
                    r.classification = vec![report::Classification {
                        framework: "cupy".into(),
                        status: "classified".into(),
                        detail: None,
                    }];
                    r.python_sites = vec![report::PythonSite {
                        id: 0,
                        framework: "cupy-sampled".into(),
                        frames: vec!["t.py:9 in train".into()],
                        live_bytes: seq << 20,
                        live_count: seq,
                        captured: None,
                    }];
                }
                r
            })
            .collect();
        let refs: Vec<&Report> = reps.iter().collect();
        let mut out = String::new();
        render_suspected(&mut out, &refs, 10);
        assert!(out.contains("rose in 3 of 3 intervals"), "{out}");
        let row = |label: &str| {
            out.lines()
                .find(|l| l.trim_start().starts_with(label))
                .unwrap_or_else(|| panic!("{out}"))
                .to_string()
        };
        assert!(
            row("#3 ").contains("-    (the framework did not answer: left out)"),
            "{out}"
        );
        assert!(!row("#3 ").contains("0 B"), "{out}");
        assert!(row("#4 ").contains("4.0 MiB in 4 blocks"), "{out}");
    }

    #[test]
    fn rank_lines_only_with_ranks() {
        let mut out = String::new();
        render_ranks(&mut out, &[&rep(1, 1, &[])]);
        assert!(out.is_empty());
        let mut a = rep(1, 1, &[]);
        a.rank = Some(1);
        a.host = Some("n1".into());
        let mut b = rep(2, 4, &[]);
        b.rank = Some(0);
        b.world_size = Some(2);
        b.host = Some("n0".into());
        let mut a2 = a.clone();
        a2.seq = 2;
        render_ranks(&mut out, &[&a, &a2, &b]);
        let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("  rank ")).collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(lines[0].contains("rank 0/2 host n0 pid 2"), "{out}");
        assert!(lines[1].contains("rank 1 host n1 pid 1 (#2"), "{out}");
    }
}
