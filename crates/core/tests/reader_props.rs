//! Fuzzing the readers of what gpuguard writes, in process: reports
//! (`report_stream`: the plain parse and the spliced one the command uses), traces
//! (`trace::read`) and status files (`status::read_all_with`, and the `/proc` stat
//! line it checks them against). Arbitrary bytes, and valid documents mutated byte by
//! byte, never make a reader panic: each takes the input or returns an error. Valid
//! documents read back to what was written; the spliced report reader takes only what
//! the plain parse takes, and reads it the same, whether the text comes in one read
//! or a few bytes at a time. Case counts are bounded so the file runs in seconds in a
//! debug build (`tests/fuzz_reports.rs` fuzzes the command itself, out of process).
//!
//! Hostile inputs found here are kept as plain tests at the end of the file.

use gpuguard_core::report::{DeviceReport, Hex, LiveAllocation, Report, SCHEMA, Site};
use gpuguard_core::report_stream::{self, Unread};
use gpuguard_core::status::{self, DeviceStatus, Status};
use gpuguard_core::trace::{self, TraceOptions, TraceWriter};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::json;
use std::io::Read;
use std::path::PathBuf;

/// `n` cases from a fixed seed, so a run of the suite is the same run every time
/// (a test that passes once passes always); `PROPTEST_RNG_SEED=N` explores others.
fn cases(n: u32) -> ProptestConfig {
    let mut config = ProptestConfig {
        cases: n,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(0x6770_7567_7561_7264);
    }
    config
}

// ---- inputs ------------------------------------------------------------------------

/// Text with what the writers put in strings: quotes, backslashes, control
/// characters, non-ASCII, `live` itself.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_./:0-9 ]{0,12}",
        any::<String>(),
        Just("\"live\":[{\"a\"}]".to_string()),
        Just("\\\u{0}\u{7f}\u{2028}é😀".to_string()),
    ]
}

/// One change to a document: (where, what, a byte).
type Edit = (Index, u8, u8);

/// Byte strings a hostile or damaged file could hold in place of a token.
const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\"",
    b"\\",
    b"\"live\":",
    b"null",
    b"-",
    b"1e999",
    b"18446744073709551616",
    b"\"\\ud800\"",
    b"[[[[[[[[",
    b"\n",
    b"\xff",
    b"\xc3",
];

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    prop::collection::vec((any::<Index>(), 0u8..6, any::<u8>()), 1..8)
}

/// Applies `edits` to `doc`: replace, insert or delete a byte, cut the rest off,
/// insert a token, or repeat a slice.
fn mutate(doc: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut d = doc.to_vec();
    for (at, kind, byte) in edits {
        let i = if d.is_empty() { 0 } else { at.index(d.len()) };
        match kind {
            0 if !d.is_empty() => d[i] = *byte,
            1 => d.insert(i, *byte),
            2 if !d.is_empty() => {
                let end = (i + 1 + usize::from(*byte % 16)).min(d.len());
                d.drain(i..end);
            }
            3 => d.truncate(i),
            4 => {
                let t = TOKENS[usize::from(*byte) % TOKENS.len()];
                d.splice(i..i, t.iter().copied());
            }
            _ => {
                let end = (i + usize::from(*byte)).min(d.len());
                let piece: Vec<u8> = d[i..end].to_vec();
                d.splice(i..i, piece);
            }
        }
    }
    d
}

/// A reader that hands out at most `step` bytes a read, so that the spliced reader's
/// entries are cut by the end of its buffer.
struct Dribble<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Dribble<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

// ---- reports -----------------------------------------------------------------------

/// Seconds in quarters: their decimal text reads back to the very same f64.
fn seconds() -> impl Strategy<Value = f64> {
    (0u32..40_000_000).prop_map(|n| f64::from(n) / 4.0)
}

fn live_entry() -> impl Strategy<Value = LiveAllocation> {
    (
        any::<u64>(),
        any::<u64>(),
        -1i32..8,
        text(),
        (0u32..1000, seconds(), proptest::option::of(0u32..40)),
        proptest::option::of(text()),
    )
        .prop_map(
            |(address, bytes, device, kind, (thread, age_s, site), owner)| LiveAllocation {
                address: Hex(address),
                bytes,
                device,
                kind: kind.into(),
                api: "cuMemAlloc_v2".into(),
                thread,
                age_s,
                site,
                in_use_bytes: owner.as_ref().map(|_| bytes / 2),
                owner,
            },
        )
}

fn site() -> impl Strategy<Value = Site> {
    (
        any::<u32>(),
        prop::collection::vec(text(), 0..4),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(id, frames, live_bytes, live_count)| Site {
            id,
            frames,
            live_bytes,
            live_count,
            captured: None,
            held_by: Vec::new(),
        })
}

fn report() -> impl Strategy<Value = Report> {
    (
        (text(), any::<u64>(), any::<u32>(), seconds()),
        prop::collection::vec(live_entry(), 0..12),
        prop::collection::vec(site(), 0..4),
        (0u64..1000, proptest::option::of(0u64..64), -1i32..8),
    )
        .prop_map(
            |((program, seq, pid, uptime_s), live, sites, (omitted, rank, dev))| Report {
                schema: SCHEMA.into(),
                gpuguard_version: "0.1.0".into(),
                reason: "exit".into(),
                seq,
                pid,
                argv: vec![program.clone(), "--x".into()],
                program,
                rank,
                uptime_s,
                devices: vec![DeviceReport {
                    device: dev,
                    current_bytes: live.iter().fold(0u64, |a, e| a.wrapping_add(e.bytes)),
                    live_count: live.len() as u64,
                    ..Default::default()
                }],
                live,
                live_omitted: omitted,
                sites,
                ..Default::default()
            },
        )
}

/// `full` as a reader keeping `keep` entries of `live[]` must read it.
fn kept(full: &Report, keep: usize) -> Report {
    let mut r = full.clone();
    let n = r.live.len().min(keep);
    r.live_omitted += (r.live.len() - n) as u64;
    r.live.truncate(n);
    r
}

/// Every report reader on `bytes`; none may panic. The spliced reader (in one read
/// and in pieces of `step` bytes) takes only what the plain parse takes, and reads it
/// the same. Returns the plain parse.
fn read_report_every_way(bytes: &[u8], keep: usize, step: usize) -> Option<Report> {
    let plain = report_stream::from_slice_keeping(bytes, keep).ok();
    let from_reader = report_stream::from_reader_keeping(bytes, keep).ok();
    assert_eq!(
        from_reader, plain,
        "from_reader_keeping and from_slice_keeping differ"
    );
    for (how, spliced) in [
        (
            "in one read",
            report_stream::from_reader_spliced(bytes, keep),
        ),
        (
            "in pieces",
            report_stream::from_reader_spliced(Dribble { data: bytes, step }, keep),
        ),
    ] {
        match spliced {
            Ok(r) => assert_eq!(
                Some(&r),
                plain.as_ref(),
                "the spliced reader ({how}) took a document the plain parse reads otherwise"
            ),
            // Refused past a stated limit (an entry over 64 KiB): taken by no reader.
            Err(Unread::Whole | Unread::Limit(_)) => {}
            Err(Unread::Io(e)) => panic!("no read fails here: {e}"),
        }
    }
    plain
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic_a_report_reader(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        keep in prop_oneof![0usize..4, Just(usize::MAX)],
        step in 1usize..9,
    ) {
        read_report_every_way(&bytes, keep, step);
    }

    #[test]
    fn valid_reports_read_back_whole_or_kept(
        r in report(),
        keep in prop_oneof![0usize..14, Just(usize::MAX)],
        step in 1usize..40,
        pretty in any::<bool>(),
    ) {
        let bytes = if pretty {
            serde_json::to_vec_pretty(&r).unwrap()
        } else {
            serde_json::to_vec(&r).unwrap()
        };
        let got = read_report_every_way(&bytes, keep, step);
        prop_assert_eq!(got, Some(kept(&r, keep)));
        // The spliced reader takes every document the writer makes.
        let spliced = report_stream::from_reader_spliced(Dribble { data: &bytes, step }, keep);
        prop_assert!(spliced.is_ok(), "a valid report was not taken in pieces");
    }

    #[test]
    fn mutated_reports_are_read_or_refused(
        r in report(),
        e in edits(),
        keep in prop_oneof![0usize..4, Just(usize::MAX)],
        step in 1usize..40,
    ) {
        let bytes = mutate(&serde_json::to_vec(&r).unwrap(), &e);
        read_report_every_way(&bytes, keep, step);
    }
}

// ---- traces ------------------------------------------------------------------------

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "gpuguard-reader-props-{}-{name}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One thing a trace records: a counter sample or an instant event.
#[derive(Clone, Debug)]
enum Ev {
    Sample(i32, u64, u64, Option<u64>),
    Instant(String, i64),
}

fn events() -> impl Strategy<Value = Vec<(u64, Ev)>> {
    let ev = prop_oneof![
        3 => (0i32..3, any::<u64>(), 0u64..1 << 40, proptest::option::of(any::<u64>()))
            .prop_map(|(d, l, p, c)| Ev::Sample(d, l, p, c)),
        1 => (
            prop_oneof![text(), prop::sample::select(trace::KEPT_EVENTS.to_vec()).prop_map(String::from)],
            any::<i64>()
        )
            .prop_map(|(n, v)| Ev::Instant(n, v)),
    ];
    prop::collection::vec((0u64..50_000, ev), 0..40)
}

/// The text of a trace the writer makes of `evs` (finished or not).
fn trace_text(program: &str, evs: &[(u64, Ev)], finish: bool) -> Vec<u8> {
    let dir = scratch("trace");
    let path = dir.join("t.json");
    let mut w = TraceWriter::create(
        &path,
        TraceOptions {
            pid: 42,
            program: program.into(),
            version: "0.1.0".into(),
            start_unix_ms: 1_700_000_000_000,
            min_interval_us: 1_000,
            ..Default::default()
        },
    )
    .unwrap();
    let mut t = 0;
    for (dt, e) in evs {
        t += dt;
        match e {
            Ev::Sample(d, live, pool, cap) => w.sample(t, *d, *live, *pool, *cap),
            Ev::Instant(name, v) => w.instant(t, name, json!({ "v": v, "device": 0 })),
        }
    }
    if finish {
        w.finish(t + 1).unwrap();
    } else {
        w.flush().unwrap();
    }
    drop(w);
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}

/// The end of the trace's first event line (the header), after its newline.
fn header_end(bytes: &[u8]) -> usize {
    let first = bytes.iter().position(|b| *b == b'\n').unwrap() + 1;
    first + bytes[first..].iter().position(|b| *b == b'\n').unwrap() + 1
}

proptest! {
    #![proptest_config(cases(128))]

    #[test]
    fn arbitrary_bytes_never_panic_the_trace_reader(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        let _ = trace::read(&bytes[..]);
        // Behind a valid opening too, where the reader gets further.
        let mut doc = b"[\n".to_vec();
        doc.extend_from_slice(&bytes);
        let _ = trace::read(&doc[..]);
    }

    #[test]
    fn traces_read_back_and_any_cut_after_the_header_still_reads(
        program in text(),
        evs in events(),
        finish in any::<bool>(),
        cut in any::<Index>(),
    ) {
        let bytes = trace_text(&program, &evs, finish);
        let full = trace::read(&bytes[..]).expect("the writer's trace reads");
        prop_assert_eq!(&full.program, &program);
        prop_assert_eq!(full.pid, 42);
        prop_assert_eq!(full.unfinished, !finish);
        // The reader keeps the kinds it names (a plot draws those), no other.
        let instants = evs
            .iter()
            .filter(|(_, e)| {
                matches!(e, Ev::Instant(n, _)
                    if n != trace::event::END && trace::KEPT_EVENTS.contains(&n.as_str()))
            })
            .count();
        prop_assert_eq!(
            full.instants.iter().filter(|i| i.name != trace::event::END).count(),
            instants
        );
        // Cut anywhere after the header (a process killed mid-write): read, and what it
        // holds is some of what the whole trace holds.
        let h = header_end(&bytes);
        let at = h + cut.index(bytes.len() - h + 1);
        let part = trace::read(&bytes[..at]).expect("a trace cut short reads");
        prop_assert!(part.instants.len() <= full.instants.len());
        for (d, samples) in &part.devices {
            let all = &full.devices[d];
            prop_assert!(samples.len() <= all.len());
            for s in samples {
                prop_assert!(all.contains(s), "{:?} is not in the whole trace", s);
            }
        }
    }

    #[test]
    fn mutated_traces_are_read_or_refused(
        evs in events(),
        finish in any::<bool>(),
        e in edits(),
    ) {
        let bytes = mutate(&trace_text("train.py", &evs, finish), &e);
        let _ = trace::read(&bytes[..]);
    }
}

// ---- status files --------------------------------------------------------------------

/// A status directory holding `bytes` as `<pid>.json`, and a process table where
/// that pid runs with start time `ticks`.
struct StatusScene {
    root: PathBuf,
}

impl StatusScene {
    fn new(pid: u32, ticks: u64, bytes: &[u8]) -> StatusScene {
        let root = scratch("status");
        std::fs::create_dir_all(root.join("dir")).unwrap();
        std::fs::create_dir_all(root.join("proc").join(pid.to_string())).unwrap();
        std::fs::write(root.join("dir").join(status::file_name(pid)), bytes).unwrap();
        std::fs::write(
            root.join("proc").join(pid.to_string()).join("stat"),
            stat_line(pid, "python (train) x", ticks),
        )
        .unwrap();
        StatusScene { root }
    }

    fn read(&self) -> Vec<Status> {
        status::read_all_with(&self.root.join("dir"), &self.root.join("proc"))
            .expect("a readable status directory")
    }
}

impl Drop for StatusScene {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A `/proc/<pid>/stat` line with start time `ticks` (field 22).
fn stat_line(pid: u32, comm: &str, ticks: u64) -> String {
    let mut fields: Vec<String> = (3..=21).map(|i| i.to_string()).collect();
    fields[0] = "S".into();
    fields.push(ticks.to_string());
    fields.push("99".into());
    format!("{pid} ({comm}) {}\n", fields.join(" "))
}

fn status_doc() -> impl Strategy<Value = Status> {
    (
        (
            1u32..1 << 22,
            any::<u64>(),
            text(),
            prop::collection::vec(text(), 0..3),
        ),
        prop::collection::vec(
            (
                -1i32..8,
                any::<u64>(),
                any::<u64>(),
                proptest::option::of(any::<u64>()),
            ),
            0..3,
        ),
    )
        .prop_map(|((pid, start_ticks, program, argv), devs)| Status {
            schema: status::SCHEMA.into(),
            gpuguard_version: "0.1.0".into(),
            pid,
            program,
            argv,
            start_ticks,
            started_unix_ms: 1,
            report_dir: "/tmp/r".into(),
            report_dir_hex: None,
            updated_unix_ms: 2,
            devices: devs
                .into_iter()
                .map(|(device, live_bytes, peak_bytes, cap_bytes)| DeviceStatus {
                    device,
                    live_bytes,
                    peak_bytes,
                    cap_bytes,
                    pool_held_bytes: 0,
                    ..Default::default()
                })
                .collect(),
        })
}

/// What `read_all_with` must list for a file of `bytes` named for `pid`, whose
/// process started at `ticks`: the file parsed, if it is a status of this schema, of
/// that pid and that start.
fn status_oracle(bytes: &[u8], pid: u32, ticks: u64) -> Vec<Status> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Vec::new();
    };
    serde_json::from_str::<Status>(text)
        .ok()
        .filter(|s| s.schema == status::SCHEMA && s.pid == pid && s.start_ticks == ticks)
        .into_iter()
        .collect()
}

fn check_status_file(bytes: &[u8], pid: u32, ticks: u64) -> Vec<Status> {
    let scene = StatusScene::new(pid, ticks, bytes);
    let got = scene.read();
    assert_eq!(got, status_oracle(bytes, pid, ticks));
    got
}

proptest! {
    #![proptest_config(cases(128))]

    #[test]
    fn arbitrary_status_files_are_skipped_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        pid in 1u32..1000,
    ) {
        prop_assert!(check_status_file(&bytes, pid, 7).is_empty());
    }

    #[test]
    fn status_files_read_back(s in status_doc()) {
        let bytes = serde_json::to_vec(&s).unwrap();
        let got = check_status_file(&bytes, s.pid, s.start_ticks);
        prop_assert_eq!(got, vec![s]);
    }

    #[test]
    fn mutated_status_files_are_read_or_skipped(s in status_doc(), e in edits()) {
        let bytes = mutate(&serde_json::to_vec(&s).unwrap(), &e);
        check_status_file(&bytes, s.pid, s.start_ticks);
    }

    #[test]
    fn any_stat_line_gives_a_start_time_or_none(
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        comm in "[ -~]{0,20}",
        ticks in any::<u64>(),
    ) {
        let root = scratch("stat");
        let proc_dir = root.join("7");
        std::fs::create_dir_all(&proc_dir).unwrap();
        std::fs::write(proc_dir.join("stat"), &bytes).unwrap();
        let _ = status::process_start_ticks(&root, 7);
        // A well-formed line, whatever the command name holds (spaces, parentheses).
        std::fs::write(proc_dir.join("stat"), stat_line(7, &comm, ticks)).unwrap();
        prop_assert_eq!(status::process_start_ticks(&root, 7), Some(ticks));
        let _ = std::fs::remove_dir_all(&root);
    }
}

// ---- regressions: hostile inputs kept as plain tests -----------------------------------

/// A report whose `live` is deeper than serde_json's nesting limit: refused by every
/// reader, never a stack overflow.
#[test]
fn deeply_nested_live_is_refused() {
    let mut doc = br#"{"schema":"gpuguard-report/1","live":"#.to_vec();
    doc.extend(std::iter::repeat_n(b'[', 100_000));
    assert_eq!(read_report_every_way(&doc, usize::MAX, 7), None);
}

/// A status file that names another pid than its file name is not that process's.
#[test]
fn a_status_file_of_another_pid_is_skipped() {
    let s = Status {
        schema: status::SCHEMA.into(),
        pid: 5,
        start_ticks: 9,
        ..Default::default()
    };
    let bytes = serde_json::to_vec(&s).unwrap();
    assert!(check_status_file(&bytes, 6, 9).is_empty());
    assert_eq!(check_status_file(&bytes, 5, 9), vec![s]);
}

/// A trace whose writer was killed in the middle of a character (a phase label in
/// another script): the cut last line is dropped, as any cut line is; the trace
/// before it reads. (Found by `traces_read_back_and_any_cut_after_the_header_still_reads`:
/// the reader refused such a trace as "not UTF-8".)
#[test]
fn a_trace_cut_inside_a_character_reads() {
    let evs = vec![
        (10, Ev::Sample(0, 100, 0, None)),
        (20_000, Ev::Instant("époque 2".into(), 1)),
    ];
    let bytes = trace_text("train.py", &evs, false);
    let at = bytes.windows(2).position(|w| w == "é".as_bytes()).unwrap() + 1;
    let part = trace::read(&bytes[..at]).expect("a trace cut inside a character reads");
    assert!(part.unfinished);
    assert_eq!(part.devices[&0].len(), 1);
    assert!(part.instants.is_empty());
    // A line that is not UTF-8 before its end is still refused.
    let mut bad = bytes[..at].to_vec();
    bad.extend_from_slice(b"\n");
    assert!(trace::read(&bad[..]).is_err());
}
