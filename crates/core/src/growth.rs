//! Which call sites look like leaks across a series of reports of one process.
//!
//! The criterion (docs/command.md, "Suspected leaks"): over the reports in order, a site is
//! a suspect when its live bytes ended higher than they started and rose in most
//! intervals between consecutive reports (more than half, and at least two when
//! there are two or more intervals). A site that grew once (a warm-up, a new input
//! shape) and then stayed flat is not one. When the series ends in the exit report
//! and the site's bytes fell only there (the program freed its list as it returned,
//! just before exit), the judgment is on the series before that drop, and the
//! suspect says so. Suspects are ranked by how steadily they grew (the share of
//! intervals in which they rose); among equally steady ones, a framework's own lines
//! of its blocks first (block-exact, from its recorder, sampled or not), then lines
//! from the allocating thread's stack (the line that made the framework take memory
//! from the driver, which under a cache may be any allocation), then native sites
//! (a framework's are its allocator): sampled lines count only some blocks, so
//! speeds compare only within a kind; then by how fast (bytes a second over the
//! judged reports, or per interval without times). A site that held nothing in the
//! first reports is judged from the report before it first held memory, over at
//! least two intervals: one that appears in the last report only is not a suspect.
//! A framework's own lines are judged only over the reports that framework answered
//! for (a report taken while it could not answer, such as at interpreter teardown,
//! says nothing of them, rather than that they held nothing).

use crate::report::Report;
use std::collections::{HashMap, HashSet};

/// A site's identity across reports (ids differ from report to report).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SiteKey {
    /// `None`: a call site of the hooks (native frames, then Python ones); else the
    /// framework whose blocks in use a Python site counts (`pytorch`, `cupy`, ...).
    pub framework: Option<String>,
    pub frames: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Suspect {
    pub key: SiteKey,
    /// Live (bytes, count) in each report of the series, in order.
    pub live: Vec<(u64, u64)>,
    /// Of the intervals judged, how many it rose in.
    pub rose: usize,
    pub intervals: usize,
    /// Bytes it grew by over the judged reports.
    pub growth: u64,
    /// Bytes a second over the judged reports, when they carry times.
    pub per_second: Option<f64>,
    /// The exit report's drop was left out of the judgment.
    pub exit_drop_ignored: bool,
    /// Per report of the series: the site's framework did not answer for it (its
    /// figure there is unknown, not 0; the report was left out of the judgment).
    pub unanswered: Vec<bool>,
}

impl Suspect {
    /// The share of intervals it rose in, 0 to 1.
    pub fn steadiness(&self) -> f64 {
        self.rose as f64 / self.intervals.max(1) as f64
    }

    /// Bytes per second, else per interval.
    pub fn speed(&self) -> f64 {
        self.per_second
            .unwrap_or(self.growth as f64 / self.intervals.max(1) as f64)
    }

    pub fn is_python(&self) -> bool {
        self.key.framework.is_some()
    }

    /// 2: a framework's lines of its own blocks (a recorder's, sampled or not:
    /// block-exact); 1: lines from the allocating thread's stack (the line that made
    /// the framework take memory from the driver); 0: native call sites.
    pub fn precision(&self) -> u8 {
        match self.key.framework.as_deref() {
            None => 0,
            Some(crate::classify::FROM_STACK) => 1,
            Some(_) => 2,
        }
    }
}

/// A site's identity borrowed from a report: (framework, frames).
type Borrowed<'r> = (Option<&'r str>, &'r [String]);

/// Live (bytes, count) per site in one report, keyed by the report's own strings.
fn borrowed_site_map(r: &Report) -> HashMap<Borrowed<'_>, (u64, u64)> {
    let mut m: HashMap<Borrowed, (u64, u64)> = HashMap::new();
    let sites = r
        .sites
        .iter()
        .map(|s| (None, s.frames.as_slice(), s.live_bytes, s.live_count));
    let lines = r.python_sites.iter().map(|s| {
        (
            Some(s.framework.as_str()),
            s.frames.as_slice(),
            s.live_bytes,
            s.live_count,
        )
    });
    for (fw, frames, bytes, count) in sites.chain(lines) {
        let e = m.entry((fw, frames)).or_default();
        // Saturating: a report's figures are input like any other.
        e.0 = e.0.saturating_add(bytes);
        e.1 = e.1.saturating_add(count);
    }
    m
}

/// The frameworks that answered for a report: those classified there, and those it
/// has lines of. Gathered once per report: looked up per site, a search of the
/// report's lines made a series with many Python lines quadratic.
struct Answered<'r> {
    classified: HashSet<&'r str>,
    with_lines: HashSet<&'r str>,
}

impl<'r> Answered<'r> {
    fn of(r: &'r Report) -> Answered<'r> {
        Answered {
            classified: r
                .classification
                .iter()
                .filter(|c| c.status == "classified")
                .map(|c| c.framework.as_str())
                .collect(),
            with_lines: r
                .python_sites
                .iter()
                .map(|s| s.framework.as_str())
                .collect(),
        }
    }

    /// Whether the report has figures for the site `k`: the hooks' own sites always;
    /// a framework's lines where that framework answered for the report (it is
    /// classified there, or the report has lines of it).
    fn has_figures(&self, framework: Option<&str>) -> bool {
        let Some(fw) = framework else {
            return true;
        };
        if fw == crate::classify::FROM_STACK {
            return true;
        }
        let base = fw.strip_suffix(crate::classify::SAMPLED).unwrap_or(fw);
        self.classified.contains(base) || self.with_lines.contains(fw)
    }
}

/// The judgment on one series of live bytes: (rose, intervals, growth, first
/// report judged) if a suspect. A site that holds nothing in the first reports is
/// judged from the report before it first held memory, and needs two intervals
/// there (one when the whole series has only one).
fn judge(all: &[u64]) -> Option<(usize, usize, u64, usize)> {
    let start = all.iter().position(|b| *b > 0)?.saturating_sub(1);
    let bytes = &all[start..];
    let intervals = bytes.len().checked_sub(1).filter(|n| *n > 0)?;
    if intervals < 2 && all.len() > 2 {
        return None;
    }
    let rose = bytes.windows(2).filter(|w| w[1] > w[0]).count();
    let growth = bytes.last()?.checked_sub(bytes[0]).filter(|g| *g > 0)?;
    let most = rose * 2 > intervals && (intervals == 1 || rose >= 2);
    most.then_some((rose, intervals, growth, start))
}

/// The suspected leaks across `reports` of one process (any order; sorted by
/// `seq` here, duplicates dropped), most steady first, then fastest.
pub fn suspects(reports: &[&Report]) -> Vec<Suspect> {
    let mut series: Vec<&Report> = reports.to_vec();
    series.sort_by_key(|r| r.seq);
    series.dedup_by_key(|r| r.seq);
    if series.len() < 2 {
        return Vec::new();
    }
    // Keyed by the reports' own strings: a key is copied only for a suspect.
    let maps: Vec<_> = series.iter().map(|r| borrowed_site_map(r)).collect();
    let answered: Vec<Answered> = series.iter().map(|r| Answered::of(r)).collect();
    let keys: HashSet<&Borrowed> = maps.iter().flat_map(|m| m.keys()).collect();
    let ends_at_exit = series.last().is_some_and(|r| r.reason == "exit");
    let mut out: Vec<Suspect> = keys
        .into_iter()
        .filter_map(|k| {
            let live: Vec<(u64, u64)> = maps
                .iter()
                .map(|m| m.get(k).copied().unwrap_or_default())
                .collect();
            // The reports with figures for this site, and its bytes in each.
            let with: Vec<usize> = (0..series.len())
                .filter(|&i| answered[i].has_figures(k.0))
                .collect();
            let bytes: Vec<u64> = with.iter().map(|&i| live[i].0).collect();
            let n = bytes.len();
            let ends_at_exit = ends_at_exit && with.last() == Some(&(series.len() - 1));
            // A drop in the exit report is the program's teardown (its lists freed as
            // it returned): the judgment is on the series before it whenever that one
            // is a suspect, even where the whole series (which ends lower, but maybe
            // still above its start) would be one too, less steadily.
            let before_exit = (ends_at_exit && n >= 3 && bytes[n - 1] < bytes[n - 2])
                .then(|| judge(&bytes[..n - 1]))
                .flatten();
            let (judged, exit_drop_ignored) = match before_exit {
                Some(j) => (Some(j), true),
                None => (judge(&bytes), false),
            };
            let (rose, intervals, growth, first) = judged?;
            let last = if exit_drop_ignored { n - 2 } else { n - 1 };
            let secs = series[with[last]].uptime_s - series[with[first]].uptime_s;
            Some(Suspect {
                key: SiteKey {
                    framework: k.0.map(str::to_string),
                    frames: k.1.to_vec(),
                },
                live,
                rose,
                intervals,
                growth,
                per_second: (secs > 0.0).then(|| growth as f64 / secs),
                exit_drop_ignored,
                unanswered: {
                    let mut u = vec![true; series.len()];
                    for &i in &with {
                        u[i] = false;
                    }
                    u
                },
            })
        })
        .collect();
    out.sort_by(|a, b| {
        b.steadiness()
            .total_cmp(&a.steadiness())
            .then(b.precision().cmp(&a.precision()))
            .then(b.speed().total_cmp(&a.speed()))
            .then(a.key.cmp(&b.key))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Classification, PythonSite, Site};

    fn rep(seq: u64, reason: &str, t: f64, sites: &[(&str, u64)]) -> Report {
        Report {
            seq,
            reason: reason.into(),
            uptime_s: t,
            sites: sites
                .iter()
                .enumerate()
                .map(|(i, (f, b))| Site {
                    id: i as u32,
                    frames: vec![f.to_string()],
                    live_bytes: *b,
                    live_count: 1,
                    captured: None,
                    held_by: Vec::new(),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_drop_at_exit_is_left_out_even_where_the_whole_series_still_rose() {
        // Sampled blocks: nothing in the first two reports, steady growth, and at exit
        // most (not all) of it gone: judged on the series before the exit, it rose in
        // every interval; judged whole, in 4 of 5.
        let kib = [0u64, 0, 2048, 4544, 6592, 8704, 1024];
        let reps: Vec<Report> = kib
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let reason = if i + 1 == kib.len() {
                    "exit"
                } else {
                    "snapshot"
                };
                rep(i as u64 + 1, reason, i as f64, &[("sampled", b << 10)])
            })
            .collect();
        let refs: Vec<&Report> = reps.iter().collect();
        let s = suspects(&refs);
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].rose, s[0].intervals), (4, 4));
        assert!(s[0].exit_drop_ignored);
        assert_eq!(s[0].growth, 8704 << 10);
    }

    /// A Python site of `framework` at one line.
    fn site(framework: &str, line: &str, bytes: u64) -> PythonSite {
        PythonSite {
            id: 0,
            framework: framework.into(),
            frames: vec![line.into()],
            live_bytes: bytes,
            live_count: 1,
            captured: None,
        }
    }

    fn names(s: &[Suspect]) -> Vec<&str> {
        s.iter().map(|s| s.key.frames[0].as_str()).collect()
    }

    #[test]
    fn grew_once_then_flat_is_not_a_suspect() {
        let rs: Vec<Report> = (0..6u64)
            .map(|i| {
                rep(
                    i + 1,
                    "snapshot",
                    i as f64,
                    &[
                        ("warmup", if i == 0 { 10 } else { 106 }),
                        ("leak", 10 + i),
                        ("flat", 50),
                    ],
                )
            })
            .collect();
        let refs: Vec<&Report> = rs.iter().collect();
        let s = suspects(&refs);
        assert_eq!(names(&s), ["leak"]);
        assert_eq!((s[0].rose, s[0].intervals, s[0].growth), (5, 5, 5));
        assert_eq!(s[0].per_second, Some(1.0));
        assert!(!s[0].exit_drop_ignored);
    }

    #[test]
    fn late_sites_are_judged_from_their_start() {
        let series: [u64; 5] = [0, 0, 5, 10, 15];
        let rs: Vec<Report> = series
            .iter()
            .enumerate()
            .map(|(i, b)| {
                rep(
                    i as u64 + 1,
                    "snapshot",
                    i as f64,
                    &[("late", *b), ("new", if i == 4 { 9 } else { 0 })],
                )
            })
            .collect();
        let refs: Vec<&Report> = rs.iter().collect();
        let s = suspects(&refs);
        assert_eq!(names(&s), ["late"]);
        assert_eq!((s[0].rose, s[0].intervals), (3, 3));
        assert_eq!(s[0].per_second, Some(5.0));
    }

    #[test]
    fn steady_before_fast_and_most_intervals_needed() {
        // "bumpy" grows more but in only 2 of 4 intervals; "steady" in all 4;
        // "mostly" in 3 of 4 and fastest of the two that qualify after "steady".
        let series = [
            [("steady", 10), ("bumpy", 10), ("mostly", 0)],
            [("steady", 11), ("bumpy", 500), ("mostly", 100)],
            [("steady", 12), ("bumpy", 5), ("mostly", 50)],
            [("steady", 13), ("bumpy", 900), ("mostly", 200)],
            [("steady", 14), ("bumpy", 800), ("mostly", 300)],
        ];
        let rs: Vec<Report> = series
            .iter()
            .enumerate()
            .map(|(i, s)| rep(i as u64 + 1, "snapshot", i as f64, s))
            .collect();
        // Order given does not matter: seq does.
        let refs: Vec<&Report> = rs.iter().rev().collect();
        let s = suspects(&refs);
        assert_eq!(names(&s), ["steady", "mostly"]);
        assert!(s[0].steadiness() > s[1].steadiness());
    }

    #[test]
    fn a_drop_at_exit_after_steady_growth_still_counts_and_says_so() {
        let mut rs: Vec<Report> = (0..5u64)
            .map(|i| rep(i + 1, "snapshot", i as f64, &[("list", 100 * (i + 1))]))
            .collect();
        rs.push(rep(6, "exit", 5.0, &[("list", 0)]));
        let refs: Vec<&Report> = rs.iter().collect();
        let s = suspects(&refs);
        assert_eq!(names(&s), ["list"]);
        assert!(s[0].exit_drop_ignored);
        assert_eq!((s[0].rose, s[0].intervals, s[0].growth), (4, 4, 400));
        assert_eq!(s[0].live.len(), 6);
        // A drop in a report that is not the exit is judged as it is.
        rs[5].reason = "snapshot".into();
        let refs: Vec<&Report> = rs.iter().collect();
        assert!(suspects(&refs).is_empty());
    }

    #[test]
    fn sampled_block_lines_rank_above_the_stack_s_line_of_the_pool_s_growth() {
        // CuPy's pool grows at the temporaries' line (a stack site, fast) while the
        // windows sample the kept array's line (slower: only some of its blocks).
        let rs: Vec<Report> = (0..4u64)
            .map(|i| {
                let mut r = rep(i + 1, "snapshot", i as f64, &[]);
                r.python_sites = vec![
                    site(
                        crate::classify::FROM_STACK,
                        "t.py:28 in train",
                        1000 * (i + 1),
                    ),
                    site("cupy-sampled", "t.py:29 in train", 10 * (i + 1)),
                ];
                r
            })
            .collect();
        let refs: Vec<&Report> = rs.iter().collect();
        let s = suspects(&refs);
        assert_eq!(names(&s), ["t.py:29 in train", "t.py:28 in train"]);
        assert_eq!((s[0].precision(), s[1].precision()), (2, 1));
    }

    #[test]
    fn a_report_the_framework_did_not_answer_says_nothing_of_its_lines() {
        // A sampled line grows in every report CuPy answered; one report in the
        // middle was taken while it could not (no classification, no lines): the
        // line still rose in every interval judged, as steadily as the stack's.
        let rs: Vec<Report> = (0..6u64)
            .map(|i| {
                let mut r = rep(i + 1, "snapshot", i as f64, &[]);
                r.python_sites = vec![site(
                    crate::classify::FROM_STACK,
                    "t.py:28 in train",
                    1000 * (i + 1),
                )];
                if i != 3 {
                    r.python_sites
                        .push(site("cupy-sampled", "t.py:29 in train", 10 * (i + 1)));
                    r.classification = vec![Classification {
                        framework: "cupy".into(),
                        status: "classified".into(),
                        detail: None,
                    }];
                }
                r
            })
            .collect();
        let refs: Vec<&Report> = rs.iter().collect();
        let s = suspects(&refs);
        assert_eq!(names(&s), ["t.py:29 in train", "t.py:28 in train"]);
        assert_eq!((s[0].rose, s[0].intervals), (4, 4));
        assert_eq!((s[1].rose, s[1].intervals), (5, 5));
        assert_eq!(s[0].unanswered, [false, false, false, true, false, false]);
        assert!(!s[1].unanswered.contains(&true));
        // Answered, with nothing left: that is a fall.
        let mut rs = rs;
        rs[3].classification = rs[0].classification.clone();
        let refs: Vec<&Report> = rs.iter().collect();
        let s = suspects(&refs);
        assert_eq!(names(&s), ["t.py:28 in train", "t.py:29 in train"]);
        assert_eq!((s[1].rose, s[1].intervals), (4, 5));
    }

    #[test]
    fn two_reports_compare_directly_and_python_sites_are_keyed_by_framework() {
        let mut a = rep(1, "signal", 0.0, &[("x", 1)]);
        let mut b = rep(2, "signal", 0.0, &[("x", 1)]);
        for (r, bytes) in [(&mut a, 10), (&mut b, 30)] {
            r.python_sites.push(PythonSite {
                id: 0,
                framework: "pytorch".into(),
                frames: vec!["t.py:3 in f".into()],
                live_bytes: bytes,
                live_count: 1,
                captured: None,
            });
        }
        let s = suspects(&[&a, &b]);
        assert_eq!(s.len(), 1);
        assert!(s[0].is_python());
        // Equally steady: the Python line before a faster native site.
        b.sites[0].live_bytes = 1000;
        let s = suspects(&[&a, &b]);
        assert_eq!(s.len(), 2);
        assert!(s[0].is_python() && !s[1].is_python());
        assert_eq!(s[0].key.framework.as_deref(), Some("pytorch"));
        assert_eq!(s[0].per_second, None);
        assert_eq!(s[0].speed(), 20.0);
        assert!(suspects(&[&a]).is_empty());
    }
}
