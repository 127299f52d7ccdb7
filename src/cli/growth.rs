//! Matching call sites across reports (ids are per report; frames identify a site)
//! and measuring how their live bytes changed. Sums saturate: a report is input
//! like any other, and a wrapped sum would hide growth.

use gpuguard_core::report::Report;
use std::collections::HashMap;
use std::collections::hash_map::Entry;

/// A site's identity across reports.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SiteKey {
    /// The framework whose blocks a Python site holds; `None` for a native site.
    pub python: Option<String>,
    pub frames: Vec<String>,
}

/// Live bytes and allocations at one site in one report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Live {
    pub bytes: u64,
    pub count: u64,
    /// The figures are estimates (some of the site's stacks or blocks were sampled).
    pub estimated: bool,
}

impl Live {
    fn add(&mut self, bytes: u64, count: u64, captured: Option<u64>) {
        self.bytes = self.bytes.saturating_add(bytes);
        self.count = self.count.saturating_add(count);
        self.estimated |= captured.is_some();
    }
}

/// A site's identity borrowed from a report: (framework, frames).
type Borrowed<'r> = (Option<&'r str>, &'r [String]);

/// Live bytes and count per site of one report, native and Python sites both,
/// keyed by the report's own strings (nothing is copied).
fn site_map(r: &Report) -> HashMap<Borrowed<'_>, Live> {
    let mut map: HashMap<Borrowed, Live> = HashMap::new();
    for s in &r.sites {
        map.entry((None, s.frames.as_slice())).or_default().add(
            s.live_bytes,
            s.live_count,
            s.captured,
        );
    }
    for s in &r.python_sites {
        map.entry((Some(s.framework.as_str()), s.frames.as_slice()))
            .or_default()
            .add(s.live_bytes, s.live_count, s.captured);
    }
    map
}

/// One site across the reports compared, in their order.
#[derive(Clone, Debug, PartialEq)]
pub struct SiteTrend {
    pub key: SiteKey,
    pub live: Vec<Live>,
}

impl SiteTrend {
    pub fn is_python(&self) -> bool {
        self.key.python.is_some()
    }

    fn first(&self) -> u64 {
        self.live.first().map_or(0, |l| l.bytes)
    }

    fn last(&self) -> u64 {
        self.live.last().map_or(0, |l| l.bytes)
    }

    /// Live bytes gained from the first report to the last (0 if it shrank).
    pub fn grew(&self) -> u64 {
        self.last().saturating_sub(self.first())
    }

    /// Live bytes lost from the first report to the last (0 if it grew).
    pub fn shrank(&self) -> u64 {
        self.first().saturating_sub(self.last())
    }
}

/// The sites whose live bytes changed from the first report to the last: (grew,
/// shrank), with their live figures in each report. The site maps are built once
/// for both, and only the sites returned are copied out of the reports.
fn trends(reports: &[&Report]) -> (Vec<SiteTrend>, Vec<SiteTrend>) {
    let maps: Vec<_> = reports.iter().map(|r| site_map(r)).collect();
    let (mut grew, mut shrank) = (Vec::new(), Vec::new());
    let (Some(first), Some(last)) = (maps.first(), maps.last()) else {
        return (grew, shrank);
    };
    let figure = |m: &HashMap<Borrowed, Live>, k: &Borrowed| m.get(k).copied().unwrap_or_default();
    let trend = |k: &Borrowed| SiteTrend {
        key: SiteKey {
            python: k.0.map(str::to_string),
            frames: k.1.to_vec(),
        },
        live: maps.iter().map(|m| figure(m, k)).collect(),
    };
    // A site in neither the first report nor the last changed by nothing: the keys
    // of those two are all there is to judge.
    for (k, a) in first {
        let b = figure(last, k);
        if b.bytes > a.bytes {
            grew.push(trend(k));
        } else if b.bytes < a.bytes {
            shrank.push(trend(k));
        }
    }
    for (k, b) in last {
        if b.bytes > 0 && !first.contains_key(k) {
            grew.push(trend(k));
        }
    }
    (grew, shrank)
}

/// Python lines (the program's own code) first: in a framework process the native
/// sites are the framework's allocator, whose figures mix cache and leak. Then by
/// `amount`, largest first.
fn order(sites: &mut [SiteTrend], amount: fn(&SiteTrend) -> u64) {
    sites.sort_by(|a, b| {
        b.is_python()
            .cmp(&a.is_python())
            .then(amount(b).cmp(&amount(a)))
            .then(a.key.cmp(&b.key))
    });
}

/// Sites whose live bytes grew from the first report to the last, then those whose
/// live bytes fell (`diff`), each ordered. Which sites of a series are suspected
/// leaks is `gpuguard_core::growth::suspects`.
pub fn changed_sites(reports: &[&Report]) -> (Vec<SiteTrend>, Vec<SiteTrend>) {
    let (mut grew, mut shrank) = trends(reports);
    order(&mut grew, SiteTrend::grew);
    order(&mut shrank, SiteTrend::shrank);
    (grew, shrank)
}

/// The framework name the library gives Python lines read from the allocating
/// thread's own stack: its figures are allocations taken from the driver, not
/// framework blocks in use.
pub const PYTHON_STACK: &str = "python-stack";

/// What a Python line of `framework` counts: `block` (a framework's blocks in use)
/// or `allocation` (driver allocations, for `python-stack` and native sites).
pub fn unit(framework: Option<&str>) -> &'static str {
    match framework {
        Some(fw) if fw != PYTHON_STACK => "block",
        _ => "allocation",
    }
}

/// A report's sites with the same frames taken together: the library may give one
/// line of code several site ids, and a list that names the same frames twice
/// only hides how much that line holds.
#[derive(Clone, Debug, PartialEq)]
pub struct MergedSite<'r> {
    /// The report's ids for these frames, in the report's order.
    pub ids: Vec<u32>,
    /// The framework of a Python line; `None` for a native site.
    pub python: Option<&'r str>,
    pub frames: &'r [String],
    pub live_bytes: u64,
    pub live_count: u64,
    /// Where the figures are estimates (`Site::captured`): how many of the live
    /// allocations were captured.
    pub captured: Option<u64>,
}

/// Site ids named in a merged site's label; the rest are counted.
const IDS_SHOWN: usize = 8;

impl MergedSite<'_> {
    /// `site 3`, `sites 3, 7` (`py site`, `py sites` for Python lines).
    pub fn label(&self) -> String {
        let mut ids: Vec<String> = self
            .ids
            .iter()
            .take(IDS_SHOWN)
            .map(u32::to_string)
            .collect();
        if self.ids.len() > IDS_SHOWN {
            // Thousands of ids with the same frames would fill the screen.
            ids.push(format!("… ({} in all)", self.ids.len()));
        }
        let py = if self.python.is_some() { "py " } else { "" };
        let noun = if self.ids.len() == 1 { "site" } else { "sites" };
        format!("{py}{noun} {}", ids.join(", "))
    }
}

fn merge<'r>(
    sites: impl Iterator<Item = (u32, Option<&'r str>, &'r [String], u64, u64, Option<u64>)>,
) -> Vec<MergedSite<'r>> {
    let mut out: Vec<MergedSite<'r>> = Vec::new();
    // Where each identity's line is in `out`: a hash lookup per site, where a search
    // of `out` made a report of 200,000 sites take minutes.
    let mut at: HashMap<(Option<&'r str>, &'r [String]), usize> = HashMap::new();
    for (id, python, frames, bytes, count, captured) in sites {
        match at.entry((python, frames)) {
            Entry::Occupied(i) => {
                let m = &mut out[*i.get()];
                m.ids.push(id);
                // Estimated where either part is; an exact part was captured whole.
                m.captured = match (m.captured, captured) {
                    (None, None) => None,
                    (a, b) => Some(a.unwrap_or(m.live_count).saturating_add(b.unwrap_or(count))),
                };
                m.live_bytes = m.live_bytes.saturating_add(bytes);
                m.live_count = m.live_count.saturating_add(count);
            }
            Entry::Vacant(slot) => {
                slot.insert(out.len());
                out.push(MergedSite {
                    ids: vec![id],
                    python,
                    frames,
                    live_bytes: bytes,
                    live_count: count,
                    captured,
                });
            }
        }
    }
    // Stable: equal sums keep the report's order.
    out.sort_by_key(|m| std::cmp::Reverse(m.live_bytes));
    out
}

/// The report's native call sites, same frames merged, most live bytes first.
pub fn native_sites(r: &Report) -> Vec<MergedSite<'_>> {
    merge(r.sites.iter().map(|s| {
        (
            s.id,
            None,
            s.frames.as_slice(),
            s.live_bytes,
            s.live_count,
            s.captured,
        )
    }))
}

/// The report's Python lines, same framework and frames merged, most first.
pub fn python_sites(r: &Report) -> Vec<MergedSite<'_>> {
    merge(r.python_sites.iter().map(|s| {
        (
            s.id,
            Some(s.framework.as_str()),
            s.frames.as_slice(),
            s.live_bytes,
            s.live_count,
            s.captured,
        )
    }))
}

/// All live allocations of a report, counting those it left out.
pub fn live_allocations(r: &Report) -> u64 {
    (r.live.len() as u64).saturating_add(r.live_omitted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuguard_core::report::Site;

    fn rep(sites: &[(&str, u64)]) -> Report {
        Report {
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

    fn names(t: &[SiteTrend]) -> Vec<&str> {
        t.iter().map(|t| t.key.frames[0].as_str()).collect()
    }

    #[test]
    fn sites_match_by_frames_and_order_by_change() {
        let a = rep(&[("weights", 100), ("cache", 10), ("gone", 5)]);
        // Ids are reassigned between reports: only frames match sites.
        let b = rep(&[("cache", 50), ("new", 20), ("weights", 100)]);
        let (g, _) = changed_sites(&[&a, &b]);
        assert_eq!(names(&g), ["cache", "new"]);
        assert_eq!(g[0].grew(), 40);
        assert_eq!(g[1].live[0], Live::default());
        assert_eq!(names(&changed_sites(&[&a, &b]).1), ["gone"]);
    }

    #[test]
    fn sites_with_the_same_frames_are_one_line() {
        let mut r = rep(&[("once", 8), ("twice", 16), ("other", 20)]);
        r.sites[1].frames[0] = "once".into();
        let merged = native_sites(&r);
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0].ids, [0, 1]);
        assert_eq!(merged[0].live_bytes, 24);
        assert_eq!(merged[0].live_count, 2);
        assert_eq!(merged[0].label(), "sites 0, 1");
        assert_eq!(merged[1].label(), "site 2");
    }

    #[test]
    fn sums_saturate_instead_of_wrapping() {
        let a = rep(&[]);
        let mut b = rep(&[("huge", 1 << 63)]);
        b.sites.push(b.sites[0].clone());
        let (g, _) = changed_sites(&[&a, &b]);
        assert_eq!(g[0].grew(), u64::MAX);
        b.live_omitted = u64::MAX;
        assert_eq!(live_allocations(&b), u64::MAX);
    }
}
