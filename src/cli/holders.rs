//! Which Python lines hold a call site's memory (`Site::held_by`): a framework's
//! segment is requested by whichever operation needed a new one, so its native call
//! site says little; the lines whose blocks fill it say who holds it.

use super::text::{clean, frames};
use gpuguard_core::report::{Report, human_bytes};
use std::collections::HashMap;

/// How many holders a site lists in `show`.
pub const SHOWN: usize = 3;

/// The lines holding the sites `ids` of `r` (merged by line), most bytes first, as
/// `~460.0 MiB by trainer.py:42 in <module>`; at most `SHOWN`.
pub fn lines(r: &Report, ids: &[u32]) -> Vec<String> {
    let mut by_line: HashMap<u32, u64> = HashMap::new();
    for s in r.sites.iter().filter(|s| ids.contains(&s.id)) {
        for h in &s.held_by {
            let e = by_line.entry(h.python_site).or_default();
            *e = e.saturating_add(h.bytes);
        }
    }
    let mut held: Vec<(u32, u64)> = by_line.into_iter().collect();
    held.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    held.iter()
        .take(SHOWN)
        .filter_map(|&(line, bytes)| {
            let py = r.python_sites.iter().find(|p| p.id == line)?;
            let at = frames(&py.frames).into_iter().next()?;
            let approx = if py.captured.is_some() { "~" } else { "" };
            Some(format!("{approx}{} by {}", human_bytes(bytes), clean(&at)))
        })
        .collect()
}

/// `lines` for the call sites of `r` with these frames (a site's identity across
/// reports: ids differ from report to report).
pub fn of_frames(r: &Report, site_frames: &[String]) -> Vec<String> {
    let ids: Vec<u32> = r
        .sites
        .iter()
        .filter(|s| s.frames == site_frames)
        .map(|s| s.id)
        .collect();
    lines(r, &ids)
}
