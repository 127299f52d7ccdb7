//! Short phrases about a report and its call sites that `show` and `run`'s summary
//! both print, so that the two say the same.

use super::growth::{MergedSite, unit};
use super::text::{clean, count};
use gpuguard_core::report::{Report, human_bytes};

/// `, rank 1/2 on host n0` for a report of a distributed run; empty otherwise.
pub fn rank_words(r: &Report) -> String {
    let Some(rank) = r.rank else {
        return String::new();
    };
    format!(
        ", rank {rank}{}{}",
        r.world_size.map_or(String::new(), |w| format!("/{w}")),
        r.host
            .as_deref()
            .map_or(String::new(), |h| format!(" on host {}", clean(h)))
    )
}

/// Pinned host memory, counted apart from device memory; `None` when the process
/// never pinned any.
pub fn pinned_line(r: &Report) -> Option<String> {
    let h = &r.host_pinned;
    (h.allocs > 0 || h.peak_bytes > 0).then(|| {
        format!(
            "pinned host memory: {} live in {}, peak {} ({} made, {} freed)",
            human_bytes(h.current_bytes),
            count(h.live_count, "allocation"),
            human_bytes(h.peak_bytes),
            h.allocs,
            h.frees
        )
    })
}

/// What a merged site holds: `34 allocations`, `5 blocks (pytorch)`,
/// `34 allocations (python-stack)`; an estimate says how many were captured:
/// `~3,200 allocations (est. from 25 captured)`.
pub fn holding(s: &MergedSite) -> String {
    let mut n = count(s.live_count, unit(s.python));
    if let Some(c) = s.captured {
        n = format!("~{n} (est. from {c} captured)");
    }
    match s.python {
        Some(fw) => format!("{n} ({})", clean(fw)),
        None => n,
    }
}
