//! Which call sites look like leaks across a series of reports of one process.
//!
//! The criterion (docs/command.md, "Suspected leaks"). Leaked memory is never freed, so
//! a leaking site's live bytes are its leak, which only grows, plus whatever else it
//! holds for a while (temporaries, a cache), which comes and goes. Over the site's
//! reports in `seq` order, b_0 .. b_n with the middle report m = n/2 (rounded down)
//! in both halves, a site is a suspect when:
//! - after the middle it never went back as low as it was before: the lowest of
//!   b_m .. b_n is above the lowest of all (its floor rose);
//! - after the middle it went higher than it ever was before: the highest of all is
//!   above the highest of b_0 .. b_m (its high rose);
//! - each of those two rises is at least its noise: the deepest it ever fell below
//!   an earlier figure of its own (0 for a site that never fell).
//!
//! So how often it rose does not matter: a leak that steps every 2, 3 or 5 reports, or
//! every report, rises in both halves (any step period up to half the series), and
//! one that never falls needs no other margin. A site that grew in one step (a
//! warm-up, a new input shape), or in one half only, has no rise in the other; one
//! that goes up and down around a level falls about as far as it rises. Two reports
//! (one interval) compare directly: a suspect if it grew.
//!
//! When the series ends in the exit report and the site's bytes fell only there (the
//! program freed its list as it returned, just before exit), the judgment is on the
//! series before that drop, and the suspect says so. A site that held nothing in the
//! first reports is judged from the report before it first held memory, over at
//! least two intervals: one that appears in the last report only is not a suspect. A
//! framework's own lines are judged only over the reports that framework answered for
//! (a report taken while it could not answer, such as at interpreter teardown, says
//! nothing of them, rather than that they held nothing).
//!
//! Ranking: by kind, then by bytes grown over the judged reports (the sites' own
//! figures). The kinds are views of the same
//! memory at three precisions, not shares of it: a framework's own lines of its blocks
//! (block-exact, from its recorder, sampled or not) first, then lines from the
//! allocating thread's stack (the line that made the framework take memory from the
//! driver, which under a cache may be any allocation), then native sites (a
//! framework's are its allocator). One leak shows in all three, its pool's growth
//! (cache included) in the coarser two, so bytes compare only within a kind; a
//! process with native sites only is ranked by bytes alone.

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
    /// Of the intervals judged, how many it rose in and how many it fell in.
    pub rose: usize,
    pub fell: usize,
    pub intervals: usize,
    /// The deepest it fell below an earlier figure of its own over the judged
    /// reports: its noise (0 when it never fell).
    pub fell_back: u64,
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

/// The judgment on a suspect's series of live bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Judged {
    /// The first report judged (of the series given).
    first: usize,
    rose: usize,
    fell: usize,
    intervals: usize,
    fell_back: u64,
    growth: u64,
}

/// The judgment on one series of live bytes (the module's criterion): `Some` if a
/// suspect. A site that holds nothing in the first reports is judged from the report
/// before it first held memory, and needs two intervals there (one when the whole
/// series has only one).
fn judge(all: &[u64]) -> Option<Judged> {
    let first = all.iter().position(|b| *b > 0)?.saturating_sub(1);
    let b = &all[first..];
    let n = b.len().checked_sub(1).filter(|n| *n > 0)?;
    if n < 2 && all.len() > 2 {
        return None;
    }
    let growth = b[n].checked_sub(b[0]).filter(|g| *g > 0)?;
    // The deepest fall below the highest figure before it.
    let mut high = 0;
    let fell_back = b
        .iter()
        .map(|&x| {
            high = high.max(x);
            high - x
        })
        .max()
        .unwrap_or(0);
    if n >= 2 {
        let m = n / 2;
        let lowest = |s: &[u64]| s.iter().copied().min().unwrap_or(0);
        let highest = |s: &[u64]| s.iter().copied().max().unwrap_or(0);
        let floor_rose = lowest(&b[m..]) - lowest(b);
        let high_rose = highest(b) - highest(&b[..=m]);
        let clear = |rise: u64| rise > 0 && rise >= fell_back;
        if !(clear(floor_rose) && clear(high_rose)) {
            return None;
        }
    }
    let steps = || b.windows(2);
    Some(Judged {
        first,
        rose: steps().filter(|w| w[1] > w[0]).count(),
        fell: steps().filter(|w| w[1] < w[0]).count(),
        intervals: n,
        fell_back,
        growth,
    })
}

/// The suspected leaks across `reports` of one process (any order; sorted by
/// `seq` here, duplicates dropped): by kind, then most bytes grown (see the module).
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
            // still above its start) would be one too, with less growth.
            let before_exit = (ends_at_exit && n >= 3 && bytes[n - 1] < bytes[n - 2])
                .then(|| judge(&bytes[..n - 1]))
                .flatten();
            let (judged, exit_drop_ignored) = match before_exit {
                Some(j) => (Some(j), true),
                None => (judge(&bytes), false),
            };
            let j = judged?;
            let last = if exit_drop_ignored { n - 2 } else { n - 1 };
            let secs = series[with[last]].uptime_s - series[with[j.first]].uptime_s;
            Some(Suspect {
                key: SiteKey {
                    framework: k.0.map(str::to_string),
                    frames: k.1.to_vec(),
                },
                live,
                rose: j.rose,
                fell: j.fell,
                intervals: j.intervals,
                fell_back: j.fell_back,
                growth: j.growth,
                per_second: (secs > 0.0).then(|| j.growth as f64 / secs),
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
        b.precision()
            .cmp(&a.precision())
            .then(b.growth.cmp(&a.growth))
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
                    captured_bytes: 0,
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
    fn most_bytes_grown_first_and_a_site_that_falls_back_is_not_one() {
        // "bumpy" grows most but falls back almost to its start in the middle: no
        // suspect. "mostly" falls once, by less than it rises after: a suspect that
        // grew more than "steady", so first (the steadier site came first before).
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
        assert_eq!(names(&s), ["mostly", "steady"]);
        assert_eq!((s[0].rose, s[0].fell, s[0].fell_back), (3, 1, 50));
        assert_eq!((s[1].rose, s[1].fell, s[1].fell_back), (4, 0, 0));
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
        // Answered, with nothing left: that is a fall, to below its start, so the
        // line is no suspect (its floor did not rise).
        let mut rs = rs;
        rs[3].classification = rs[0].classification.clone();
        let refs: Vec<&Report> = rs.iter().collect();
        let s = suspects(&refs);
        assert_eq!(names(&s), ["t.py:28 in train"]);
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
        // Kinds first: the Python line before a native site that grew more.
        b.sites[0].live_bytes = 1000;
        let s = suspects(&[&a, &b]);
        assert_eq!(s.len(), 2);
        assert!(s[0].is_python() && !s[1].is_python());
        assert_eq!(s[0].key.framework.as_deref(), Some("pytorch"));
        assert_eq!(s[0].per_second, None);
        assert_eq!((s[0].growth, s[1].growth), (20, 999));
        assert!(suspects(&[&a]).is_empty());
    }

    // ---- the criterion's shapes: one site's live bytes over a series of snapshots ----

    const MIB: u64 = 1 << 20;

    /// The suspects among sites given as (name, bytes in each report), one report a
    /// second.
    fn judged(sites: &[(&str, Vec<u64>)]) -> Vec<Suspect> {
        let n = sites[0].1.len();
        let rs: Vec<Report> = (0..n)
            .map(|i| {
                let figures: Vec<(&str, u64)> = sites.iter().map(|(f, b)| (*f, b[i])).collect();
                rep(i as u64 + 1, "snapshot", i as f64, &figures)
            })
            .collect();
        let refs: Vec<&Report> = rs.iter().collect();
        suspects(&refs)
    }

    fn suspected(bytes: &[u64]) -> bool {
        !judged(&[("s", bytes.to_vec())]).is_empty()
    }

    /// From `base`, `step` more in each report `i` where `rises(i)` (n intervals).
    fn stairs(base: u64, step: u64, rises: impl Fn(usize) -> bool, n: usize) -> Vec<u64> {
        let mut b = base;
        (0..=n)
            .map(|i| {
                if i > 0 && rises(i) {
                    b += step;
                }
                b
            })
            .collect()
    }

    /// Pseudo-random numbers below `bound` (a fixed sequence per seed).
    fn noise(seed: u64, bound: u64) -> impl FnMut() -> u64 {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % bound
        }
    }

    #[test]
    fn a_slow_leak_that_never_falls_is_a_suspect_however_few_intervals_it_rose_in() {
        // 8 MiB kept every 120 ms, a snapshot every 100 ms, 17 reports: some intervals
        // see none kept. Rising in 9 of 16 intervals, and in 7 of 16 (a leak a little
        // slower than every other report).
        for pattern in ["1011010110101010", "1001010010100101"] {
            let b = stairs(256 * MIB, 8 * MIB, |i| &pattern[i - 1..i] == "1", 16);
            let s = judged(&[("slow", b)]);
            let rose = pattern.matches('1').count();
            assert_eq!(names(&s), ["slow"], "{pattern}");
            assert_eq!((s[0].rose, s[0].fell, s[0].intervals), (rose, 0, 16));
            assert_eq!(s[0].growth, rose as u64 * 8 * MIB);
        }
    }

    #[test]
    fn a_leak_that_steps_every_few_reports_is_a_suspect_at_any_phase() {
        // A leak per epoch read with a snapshot interval shorter than the epoch: one
        // step every k intervals, starting anywhere in the first k.
        for k in [2, 3, 5, 8] {
            for phase in 0..k {
                let b = stairs(64 * MIB, 8 * MIB, |i| (i + phase) % k == 0, 16);
                assert!(suspected(&b), "every {k} intervals, phase {phase}: {b:?}");
            }
        }
        // Also over a short series: steps in 2 of 4 intervals, one in each half.
        assert!(suspected(&[10, 20, 20, 30, 30]));
    }

    #[test]
    fn a_leak_faster_than_the_snapshots_is_a_suspect() {
        // A snapshot every 60 s, a leak every 25 s: two or three kept per interval.
        let b: Vec<u64> = (0..=12u64).map(|i| (i * 60 / 25) * 4 * MIB).collect();
        let s = judged(&[("fast", b)]);
        assert_eq!(names(&s), ["fast"]);
        assert_eq!(
            (s[0].rose, s[0].intervals, s[0].growth),
            (12, 12, 28 * 4 * MIB)
        );
    }

    #[test]
    fn a_warm_up_is_no_suspect_however_it_is_spread_over_the_first_half() {
        for steps in [
            &[1usize][..],
            &[1, 2],
            &[1, 3, 4],
            &[2, 5, 7],
            // One step only, wherever it falls.
            &[8],
            &[9],
            &[15],
        ] {
            let b = stairs(0, 32 * MIB, |i| steps.contains(&i), 16);
            assert!(!suspected(&b), "{steps:?}: {b:?}");
        }
        // Then up and down by a little around the level it reached.
        for seed in 0..200 {
            let mut wobble = noise(seed, MIB);
            let b: Vec<u64> = (0..=16)
                .map(|i| if i == 0 { 0 } else { 100 * MIB + wobble() })
                .collect();
            assert!(!suspected(&b), "seed {seed}: {b:?}");
        }
    }

    #[test]
    fn a_site_going_up_and_down_around_a_level_is_no_suspect() {
        for seed in 0..200 {
            // Noise of any shape around a level...
            let mut r = noise(seed, 16 * MIB);
            let b: Vec<u64> = (0..=16).map(|_| 64 * MIB + r()).collect();
            assert!(!suspected(&b), "seed {seed}: {b:?}");
            // ... or temporaries that are live in some reports and not in others.
            let mut r = noise(seed + 1000, 2);
            let b: Vec<u64> = (0..=16).map(|_| 64 * MIB + r() * 8 * MIB).collect();
            assert!(!suspected(&b), "seed {seed}: {b:?}");
        }
        // A cache that fills up, then goes up and down about the level it reached.
        assert!(!suspected(&[0, 50, 80, 90, 95, 92, 96, 94, 97, 95]));
        // A cache emptied now and then (a sawtooth).
        assert!(!suspected(&[0, 10, 20, 0, 10, 20, 0, 10, 20, 30]));
    }

    #[test]
    fn a_leak_under_noise_of_its_own_site_is_a_suspect() {
        // 1 MiB kept each interval at a site whose temporaries (up to 4 MiB) are live
        // in some reports and not in others: it falls in many intervals.
        for seed in 0..200 {
            let mut temps = noise(seed, 4 * MIB);
            let b: Vec<u64> = (0..=16u64).map(|i| 32 * MIB + i * MIB + temps()).collect();
            let s = judged(&[("leak", b.clone()), ("flat", vec![5 * MIB; 17])]);
            assert_eq!(names(&s), ["leak"], "seed {seed}: {b:?}");
            assert!(s[0].fell_back < 4 * MIB);
        }
    }
}
