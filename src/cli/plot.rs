//! `gpuguard plot TRACE -o mem.svg`: memory over time per device, from a trace
//! (`GPUGUARD_TRACE`), as one standalone SVG file: a line of live bytes per device
//! (dashed: live plus what pools hold, when they hold any), bars where a device went
//! higher between two samples than either shows, each device's peak (the highest
//! level, between samples included: the reports' peak) and cap as lines, and marks
//! for cap refusals, trims, warnings and reports.

use super::load::{read_streamed, shown};
use super::output::{warn, write_view};
use super::{Failure, Outcome};
use gpuguard_core::report::human_bytes;
use gpuguard_core::trace::{self, Sample, Trace, event};
use std::fmt::Write as _;
use std::path::PathBuf;

/// `gpuguard plot` options.
#[derive(clap::Args)]
#[command(
    after_help = "TRACE is a file written by GPUGUARD_TRACE (or `gpuguard run --trace`), \
    whole or cut short by a killed process. The SVG has live bytes per device (dashed: \
    plus what CUDA pools hold; bars: higher between two samples), each device's peak \
    and cap, and marks for cap refusals, trims, warnings and reports (hover for details)."
)]
pub struct PlotArgs {
    /// A trace file
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,
    /// Where the SVG goes (`-` for stdout); default: TRACE with the extension .svg
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub fn main(args: PlotArgs) -> Outcome {
    // Streamed: the reader keeps what the plot draws, whatever the file's size.
    let trace = read_streamed(&args.trace, "trace", |r| trace::read(r))?
        .map_err(|e| Failure::Input(format!("{}: {e}", shown(&args.trace))))?;
    let out = args
        .output
        .unwrap_or_else(|| args.trace.with_extension("svg"));
    if trace.devices.is_empty() {
        warn(&format!(
            "{}: no device samples in the trace (no CUDA memory used yet?); the plot is empty",
            shown(&args.trace)
        ));
    }
    write_view(&out, &args.trace, &render_svg(&trace))?;
    Ok(0)
}

const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 540.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 60.0;
const BOTTOM: f64 = 50.0;

/// Device line colours, distinguishable and readable on white.
const COLOURS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
];

/// Marks drawn per kind of event; past this the file would grow without saying more.
const MAX_MARKS: usize = 400;

/// The plot area.
struct Frame {
    t_max_us: f64,
    y_max: f64,
}

impl Frame {
    fn x(&self, t_us: u64) -> f64 {
        LEFT + (t_us as f64 / self.t_max_us).min(1.0) * (WIDTH - LEFT - RIGHT)
    }

    fn y(&self, bytes: u64) -> f64 {
        HEIGHT - BOTTOM - (bytes as f64 / self.y_max).min(1.0) * (HEIGHT - TOP - BOTTOM)
    }
}

/// The SVG document.
pub fn render_svg(trace: &Trace) -> String {
    let highest = trace
        .devices
        .values()
        .flatten()
        .map(|s| {
            s.live
                .saturating_add(s.pool_held)
                .max(s.high)
                .max(s.cap.unwrap_or(0))
        })
        .max()
        .unwrap_or(0);
    let frame = Frame {
        t_max_us: trace.end_us().max(1_000_000) as f64,
        y_max: (highest as f64 * 1.08).max(1024.0 * 1024.0),
    };
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
"#
    );
    title(&mut svg, trace);
    axes(&mut svg, &frame);
    let mut legend_y = TOP;
    for (i, (device, samples)) in trace.devices.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        device_lines(&mut svg, &frame, *device, samples, colour, &mut legend_y);
    }
    marks(&mut svg, &frame, trace, legend_y);
    svg.push_str("</svg>\n");
    svg
}

fn title(svg: &mut String, trace: &Trace) {
    let program = if trace.program.is_empty() {
        "?".to_string()
    } else {
        trace.program.clone()
    };
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="24" font-size="16" font-weight="bold">GPU memory of {} (pid {})</text>"#,
        xml(&program),
        trace.pid
    );
    let mut sub = format!(
        "{} over {}",
        if trace.devices.len() == 1 {
            "1 device".to_string()
        } else {
            format!("{} devices", trace.devices.len())
        },
        duration(trace.end_us())
    );
    if trace.unfinished {
        sub.push_str("; the trace ends early (the process was killed or is still running)");
    }
    if trace.count(event::THINNED) > 0 {
        sub.push_str("; sampled less often as the trace grew");
    }
    if trace.samples_left_out > 0 {
        let _ = write!(
            sub,
            "; devices past the first {} not drawn",
            trace::MAX_DEVICES
        );
    }
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="42" fill="#555">{}</text>"##,
        xml(&sub)
    );
}

fn axes(svg: &mut String, frame: &Frame) {
    let (x0, x1) = (LEFT, WIDTH - RIGHT);
    let (y0, y1) = (HEIGHT - BOTTOM, TOP);
    // Bytes: ticks at round numbers of one binary unit.
    let unit = [1u64 << 40, 1 << 30, 1 << 20, 1 << 10, 1]
        .into_iter()
        .find(|u| frame.y_max >= *u as f64)
        .unwrap_or(1) as f64;
    let step = nice_step(frame.y_max / unit / 5.0) * unit;
    let mut v = 0.0;
    while v <= frame.y_max {
        let y = frame.y(v as u64);
        let _ = writeln!(
            svg,
            r##"<line class="grid" x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            x0 - 6.0,
            y + 4.0,
            xml(&size_label(v as u64))
        );
        v += step;
    }
    // Time: seconds, minutes or hours, at round numbers.
    let span_s = frame.t_max_us / 1e6;
    let (unit_s, unit_name) = if span_s < 300.0 {
        (1.0, "s")
    } else if span_s < 3.0 * 3600.0 {
        (60.0, "min")
    } else {
        (3600.0, "h")
    };
    let step = nice_step(span_s / unit_s / 8.0);
    let mut t = 0.0;
    while t * unit_s <= span_s * 1.0001 {
        let x = frame.x((t * unit_s * 1e6) as u64);
        let _ = writeln!(
            svg,
            r##"<line class="grid" x1="{x:.1}" y1="{y0}" x2="{x:.1}" y2="{y1}" stroke="#f0f0f0"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{} {unit_name}</text>"##,
            y0 + 18.0,
            trim_number(t)
        );
        t += step;
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="#333"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="#333"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#555">time since the first CUDA call</text>"##,
        (x0 + x1) / 2.0,
        y0 + 38.0
    );
}

/// A device's live line (and live + pool-held, when pools hold any), its peak and its
/// cap, and its legend entries.
fn device_lines(
    svg: &mut String,
    frame: &Frame,
    device: i32,
    samples: &[Sample],
    colour: &str,
    legend_y: &mut f64,
) {
    if samples.is_empty() {
        return;
    }
    let end_x = WIDTH - RIGHT;
    let points = thin_for_width(samples, frame);
    let live = step_path(frame, &points, |s| Some(s.live), end_x);
    let _ = writeln!(
        svg,
        r#"<path class="live" data-device="{device}" d="{live}" fill="none" stroke="{colour}" stroke-width="1.8"><title>device {device}: live bytes</title></path>"#
    );
    let pools_hold = samples.iter().any(|s| s.pool_held > 0);
    if pools_hold {
        let held = step_path(
            frame,
            &points,
            |s| Some(s.live.saturating_add(s.pool_held)),
            end_x,
        );
        let _ = writeln!(
            svg,
            r#"<path class="held" data-device="{device}" d="{held}" fill="none" stroke="{colour}" stroke-width="1" stroke-dasharray="5 3" opacity="0.8"><title>device {device}: live + held by pools (charged against the cap)</title></path>"#
        );
    }
    let between = highs_between(svg, frame, device, &points, colour);
    // The highest level, between samples included: what the reports call the peak.
    let peak = samples
        .iter()
        .map(|s| s.high.max(s.live))
        .max()
        .unwrap_or(0);
    let y = frame.y(peak);
    let _ = writeln!(
        svg,
        r#"<line class="peak" data-device="{device}" x1="{LEFT}" y1="{y:.1}" x2="{end_x}" y2="{y:.1}" stroke="{colour}" stroke-width="1" stroke-dasharray="1 3"><title>device {device}: peak {}</title></line>"#,
        xml(&human_bytes(peak))
    );
    let caps: Vec<u64> = samples.iter().filter_map(|s| s.cap).collect();
    if !caps.is_empty() {
        let cap = step_path(frame, &points, |s| s.cap, end_x);
        let _ = writeln!(
            svg,
            r##"<path class="cap" data-device="{device}" d="{cap}" fill="none" stroke="#d62728" stroke-width="1.5" stroke-dasharray="8 4"><title>device {device}: cap</title></path>"##
        );
    }
    // Legend: the device, its peak, its cap.
    let lx = WIDTH - RIGHT + 16.0;
    let mut line = |svg: &mut String, text: String, swatch: &str| {
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" y1="{:.1}" x2="{:.1}" y2="{:.1}" {swatch}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            *legend_y - 4.0,
            lx + 22.0,
            *legend_y - 4.0,
            lx + 28.0,
            *legend_y,
            xml(&text)
        );
        *legend_y += 17.0;
    };
    line(
        svg,
        format!("device {device} live"),
        &format!(r#"stroke="{colour}" stroke-width="2""#),
    );
    if pools_hold {
        line(
            svg,
            "live + held by pools".into(),
            &format!(r#"stroke="{colour}" stroke-dasharray="5 3""#),
        );
    }
    if between {
        line(
            svg,
            "higher between samples".into(),
            &format!(r#"stroke="{colour}" stroke-width="6" opacity="0.35""#),
        );
    }
    line(
        svg,
        format!("peak {}", human_bytes(peak)),
        &format!(r#"stroke="{colour}" stroke-dasharray="1 3""#),
    );
    if let (Some(lo), Some(hi)) = (caps.iter().min(), caps.iter().max()) {
        let text = if lo == hi {
            format!("cap {}", human_bytes(*hi))
        } else {
            format!("cap {}..{}", human_bytes(*lo), human_bytes(*hi))
        };
        line(
            svg,
            text,
            r##"stroke="#d62728" stroke-width="1.5" stroke-dasharray="8 4""##,
        );
    }
    *legend_y += 8.0;
}

/// Where a sample's `high` stands above the live line on both sides of the time it
/// covers (since the sample before), a bar over that time up to it: the device went
/// that high at some moment between the two samples. Whether any was drawn.
fn highs_between(
    svg: &mut String,
    frame: &Frame,
    device: i32,
    points: &[Sample],
    colour: &str,
) -> bool {
    let mut drawn = false;
    let mut before: Option<&Sample> = None;
    for s in points {
        let shown = before.map_or(s.live, |b| b.live.max(s.live));
        if s.high > shown {
            // At least two pixels wide, ending at the sample that reports it.
            let x1 = frame.x(s.t_us);
            let x0 = before.map_or(x1, |b| frame.x(b.t_us)).min(x1 - 2.0);
            let (top, bottom) = (frame.y(s.high), frame.y(shown));
            let since = before.map_or(String::new(), |b| format!(" after {}", duration(b.t_us)));
            let _ = writeln!(
                svg,
                r#"<rect class="high" data-device="{device}" x="{x0:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{colour}" opacity="0.35"><title>{}</title></rect>"#,
                x1 - x0,
                bottom - top,
                xml(&format!(
                    "device {device}: {} at a moment{since}, by {} (between two samples)",
                    human_bytes(s.high),
                    duration(s.t_us)
                ))
            );
            drawn = true;
        }
        before = Some(s);
    }
    drawn
}

/// Keeps, per pixel column, the samples with the lowest and the highest live bytes and
/// the last one, so that a long trace draws the same shape from a bounded path; the
/// last one kept carries the highest `high` of the column.
fn thin_for_width(samples: &[Sample], frame: &Frame) -> Vec<Sample> {
    let columns = (WIDTH - LEFT - RIGHT) as usize;
    if samples.len() <= columns * 3 {
        return samples.to_vec();
    }
    let mut out = Vec::with_capacity(columns * 3);
    let mut start = 0;
    while start < samples.len() {
        let column = frame.x(samples[start].t_us).floor();
        let end = samples[start..]
            .iter()
            .position(|s| frame.x(s.t_us).floor() != column)
            .map_or(samples.len(), |n| start + n);
        let bucket = &samples[start..end];
        let lowest = bucket.iter().enumerate().min_by_key(|(_, s)| s.live);
        let highest = bucket.iter().enumerate().max_by_key(|(_, s)| s.live);
        let mut keep: Vec<usize> = [lowest, highest]
            .into_iter()
            .flatten()
            .map(|(i, _)| i)
            .chain([bucket.len() - 1])
            .collect();
        keep.sort_unstable();
        keep.dedup();
        let column_high = bucket.iter().map(|s| s.high).max().unwrap_or(0);
        out.extend(keep.into_iter().map(|i| bucket[i]));
        if let Some(last) = out.last_mut() {
            last.high = last.high.max(column_high);
        }
        start = end;
    }
    out
}

/// A step line (a counter holds its value until the next sample) through the samples'
/// `value`, carried to `end_x`; where `value` is `None` the line breaks.
fn step_path(
    frame: &Frame,
    samples: &[Sample],
    value: impl Fn(&Sample) -> Option<u64>,
    end_x: f64,
) -> String {
    let mut d = String::new();
    let mut drawing = false;
    for s in samples {
        let x = frame.x(s.t_us);
        match value(s) {
            Some(v) => {
                let y = frame.y(v);
                if drawing {
                    let _ = write!(d, "H{x:.1}V{y:.1}");
                } else {
                    let _ = write!(d, "M{x:.1},{y:.1}");
                    drawing = true;
                }
            }
            None => {
                if drawing {
                    let _ = write!(d, "H{x:.1}");
                }
                drawing = false;
            }
        }
    }
    if drawing {
        let _ = write!(d, "H{end_x:.1}");
    }
    d
}

/// Cap refusals, trims and warnings as vertical marks across the plot, reports as ticks
/// on the time axis; each with a tooltip, and a key under the legend.
fn marks(svg: &mut String, frame: &Frame, trace: &Trace, legend_y: f64) {
    struct Kind {
        name: &'static str,
        class: &'static str,
        colour: &'static str,
        label: &'static str,
    }
    let kinds = [
        Kind {
            name: event::CAP_REFUSAL,
            class: "refusal",
            colour: "#d62728",
            label: "cap refusal",
        },
        Kind {
            name: event::TRIM,
            class: "trim",
            colour: "#2ca02c",
            label: "trim",
        },
        Kind {
            name: event::WARNING,
            class: "warning",
            colour: "#ff9900",
            label: "warning",
        },
        Kind {
            name: event::REPORT,
            class: "report",
            colour: "#555555",
            label: "report written",
        },
    ];
    let (top, bottom) = (TOP, HEIGHT - BOTTOM);
    let lx = WIDTH - RIGHT + 16.0;
    let mut key_y = legend_y + 6.0;
    for kind in &kinds {
        let events: Vec<_> = trace
            .instants
            .iter()
            .filter(|i| i.name == kind.name)
            .collect();
        if events.is_empty() {
            continue;
        }
        for e in events.iter().take(MAX_MARKS) {
            let x = frame.x(e.t_us);
            let tip = format!(
                "{} at {}{}: {}",
                kind.label,
                duration(e.t_us),
                e.device
                    .map(|d| format!(" on device {d}"))
                    .unwrap_or_default(),
                describe_args(&e.args)
            );
            let (y1, y2) = if kind.class == "report" {
                (bottom - 8.0, bottom)
            } else {
                (top, bottom)
            };
            let _ = writeln!(
                svg,
                r#"<g class="mark {}"><line x1="{x:.1}" y1="{y1:.1}" x2="{x:.1}" y2="{y2:.1}" stroke="{}" stroke-width="1.2" opacity="0.7"/><circle cx="{x:.1}" cy="{y1:.1}" r="3.5" fill="{}"/><title>{}</title></g>"#,
                kind.class,
                kind.colour,
                kind.colour,
                xml(&tip)
            );
        }
        // Counted by the reader: it keeps only the first few of each kind.
        let all = trace.count(kind.name).max(events.len() as u64);
        let more = if all > MAX_MARKS as u64 {
            format!(" ({MAX_MARKS} shown of {all})")
        } else if all > 1 {
            format!(" ({all})")
        } else {
            String::new()
        };
        let _ = writeln!(
            svg,
            r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{}"/><text x="{:.1}" y="{key_y:.1}">{}</text>"#,
            lx + 11.0,
            key_y - 4.0,
            kind.colour,
            lx + 28.0,
            xml(&format!("{}{more}", kind.label))
        );
        key_y += 17.0;
    }
}

/// An event's args in one line: `bytes=1.0 GiB, reason=cap`.
fn describe_args(args: &serde_json::Value) -> String {
    let Some(map) = args.as_object() else {
        return String::new();
    };
    map.iter()
        .filter(|(k, _)| k.as_str() != "device")
        .map(|(k, v)| match (v.as_u64(), v.as_str()) {
            (Some(n), _) if k.contains("bytes") || k == "cap" || k == "charged" => {
                format!("{k}={}", human_bytes(n))
            }
            (_, Some(s)) => format!("{k}={s}"),
            _ => format!("{k}={v}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let magnitude = 10f64.powf(raw.log10().floor());
    let r = raw / magnitude;
    let m = if r <= 1.0 {
        1.0
    } else if r <= 2.0 {
        2.0
    } else if r <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * magnitude
}

/// `1.5`, `2`, `0.25`: a tick value without trailing zeros.
fn trim_number(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// An axis size label: `512 MiB`, `1.5 GiB`, `0`.
fn size_label(b: u64) -> String {
    if b == 0 {
        return "0".into();
    }
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{} {}", trim_number((v * 100.0).round() / 100.0), UNITS[i])
}

/// `12.3 s`, `4.5 min`, `2.0 h`.
fn duration(t_us: u64) -> String {
    let s = t_us as f64 / 1e6;
    if s < 120.0 {
        format!("{s:.1} s")
    } else if s < 2.0 * 3600.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

/// Text for XML content and attribute values: markup characters escaped, characters
/// XML 1.0 forbids (most control characters) replaced.
pub fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_and_labels() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(1.3), 2.0);
        assert_eq!(nice_step(30.0), 50.0);
        assert_eq!(size_label(3 << 29), "1.5 GiB");
        assert_eq!(size_label(512 << 20), "512 MiB");
        assert_eq!(trim_number(0.25), "0.25");
        assert_eq!(trim_number(20.0), "20");
    }

    #[test]
    fn xml_escapes_markup_and_forbidden_characters() {
        assert_eq!(xml("a<b>&\"'\u{1}"), "a&lt;b&gt;&amp;&quot;&apos;\u{FFFD}");
    }

    /// The peak is the highest level, between samples included; a trace without
    /// highs (older, or nothing between samples) draws no bars.
    #[test]
    fn the_peak_counts_what_came_between_samples() {
        let sample = |t_us: u64, live: u64, high: u64| Sample {
            t_us,
            live,
            high,
            pool_held: 0,
            cap: None,
        };
        let mut trace = Trace::default();
        trace.devices.insert(
            0,
            vec![
                sample(0, 10 << 20, 10 << 20),
                sample(50_000, 10 << 20, 510 << 20),
            ],
        );
        let svg = render_svg(&trace);
        assert!(svg.contains(">peak 510.0 MiB<"), "{svg}");
        assert_eq!(svg.matches(r#"<rect class="high""#).count(), 1, "{svg}");
        assert!(svg.contains("higher between samples"), "{svg}");
        trace.devices.insert(0, vec![sample(0, 10 << 20, 10 << 20)]);
        let svg = render_svg(&trace);
        assert!(svg.contains(">peak 10.0 MiB<") && !svg.contains(r#"class="high""#));
    }

    #[test]
    fn thinning_keeps_the_extremes() {
        let frame = Frame {
            t_max_us: 1e6,
            y_max: 1e6,
        };
        let samples: Vec<Sample> = (0..100_000u64)
            .map(|i| Sample {
                t_us: i * 10,
                live: if i == 54_321 { 999_999 } else { i % 100 },
                high: if i == 12_345 { 5_000_000 } else { i % 100 },
                pool_held: 0,
                cap: None,
            })
            .collect();
        let thin = thin_for_width(&samples, &frame);
        assert!(thin.len() <= 3 * 730, "{}", thin.len());
        assert!(thin.iter().any(|s| s.live == 999_999));
        assert!(
            thin.iter().any(|s| s.high == 5_000_000),
            "a high between samples left out is kept"
        );
        assert_eq!(thin.last(), samples.last());
        assert!(thin.windows(2).all(|w| w[0].t_us <= w[1].t_us));
    }
}
