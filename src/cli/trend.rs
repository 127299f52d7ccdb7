//! A call site's live bytes across reports, as `diff` (grown, shrunk) and `show`
//! (suspected leaks) print them, in the text and in `--json`.

use super::growth::{PYTHON_STACK, SiteTrend, unit};
use super::text::{clean, count, put_frames, readable_frames};
use gpuguard_core::report::human_bytes;
use serde::Serialize;

/// A site's growth, with its live bytes in each report.
pub fn render_trend(out: &mut String, t: &SiteTrend, labels: &[String], sign: char, amount: u64) {
    put!(out, "    {sign}{}", human_bytes(amount));
    render_trend_rows(out, t, labels);
}

/// A site's live figures in each report, its framework and its frames.
fn render_trend_rows(out: &mut String, t: &SiteTrend, labels: &[String]) {
    render_rows_answered(out, t, labels, &[]);
}

/// `render_trend_rows`, where the reports whose framework did not answer (true in
/// `unanswered`) show no figure: it is unknown, not 0, and was left out.
pub fn render_rows_answered(
    out: &mut String,
    t: &SiteTrend,
    labels: &[String],
    unanswered: &[bool],
) {
    let unit = unit(t.key.python.as_deref());
    for (i, (label, live)) in labels.iter().zip(&t.live).enumerate() {
        if unanswered.get(i) == Some(&true) {
            put!(
                out,
                "      {label:<10} {:>11}    (the framework did not answer: left out)",
                "-"
            );
        } else {
            let approx = if live.estimated { "~" } else { "" };
            put!(
                out,
                "      {label:<10} {:>11} in {approx}{}",
                format!("{approx}{}", human_bytes(live.bytes)),
                count(live.count, unit)
            );
        }
    }
    match t.key.python.as_deref() {
        Some(PYTHON_STACK) => put!(out, "        [allocations, Python stack]"),
        Some(fw) => put!(out, "        [{} blocks, Python]", clean(fw)),
        None => {}
    }
    put_frames(out, &t.key.frames);
}

/// A site's growth in `--json`: an entry of `diff`'s `grew` or `shrank`, and (flattened)
/// of a suspected leak in `show`.
#[derive(Serialize)]
pub struct JsonGrowth {
    #[serde(skip_serializing_if = "Option::is_none")]
    python_framework: Option<String>,
    /// Live bytes gained (or, in `diff`'s `shrank`, lost) from first to last (for a
    /// suspected leak: over the reports judged).
    change_bytes: u64,
    /// Live bytes in each report compared, in order.
    live_bytes: Vec<u64>,
    frames: Vec<String>,
}

impl JsonGrowth {
    pub fn new(t: &SiteTrend, change_bytes: u64) -> JsonGrowth {
        JsonGrowth {
            python_framework: t.key.python.clone(),
            change_bytes,
            live_bytes: t.live.iter().map(|l| l.bytes).collect(),
            frames: readable_frames(&t.key.frames),
        }
    }
}
