//! What a trim gave back (a report's `trim`), as `show` and `trim` print it.

use super::text::{clean, count, human_byte_counts};
use gpuguard_core::report::{self, human_bytes};

/// What a trim gave back, per device and per mechanism, in human sizes.
pub fn render_trim(out: &mut String, t: &report::TrimReport) {
    put!(
        out,
        "\n  trim ({}, {}): {} released; Python side: {}",
        clean(&t.trigger),
        count(t.merged, "request"),
        human_bytes(t.released_bytes),
        clean(&t.python)
    );
    if let Some(d) = &t.deferred {
        put!(
            out,
            "    deferred {:.1} s by a CUDA graph capture, then {}: {}",
            d.waited_ms as f64 / 1000.0,
            clean(&d.outcome),
            clean(&d.detail)
        );
    }
    for d in &t.devices {
        put!(
            out,
            "    device {}: {} -> {}",
            d.device,
            human_bytes(d.before_bytes),
            human_bytes(d.after_bytes)
        );
    }
    for m in &t.mechanisms {
        put!(
            out,
            "    {:<11} {:<15} {:>11}  {}",
            clean(&m.name),
            clean(&m.status),
            human_bytes(m.released_bytes),
            clean(&human_byte_counts(m.detail.as_deref().unwrap_or("")))
        );
    }
}
