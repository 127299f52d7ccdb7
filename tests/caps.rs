//! Memory caps end to end: `GPUGUARD_CAP` and its thresholds on the simulated
//! driver, runtime and NVML. Every number is checked against the sim's own books
//! (`SIM`, `SIMPEAK`, `SIMREAL`, `NVMLREAL` lines), the program's requests, or the
//! cap the test set; never against numbers gpuguard printed.

mod common;
mod core_support;

use common::*;
use core_support::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Instant;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn cap_run(args: &[&str], env: &[(&str, &str)]) -> Run {
    gg_run("gg_cap", args, env)
}

fn num(m: &BTreeMap<String, String>, key: &str) -> u64 {
    m.get(key)
        .unwrap_or_else(|| panic!("no {key}= in {m:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("{key}= is not a number in {m:?}"))
}

fn int(m: &BTreeMap<String, String>, key: &str) -> i64 {
    m.get(key)
        .unwrap_or_else(|| panic!("no {key}= in {m:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("{key}= is not a number in {m:?}"))
}

/// The one line tagged `tag` whose `key` is `value`.
fn line_where(
    out: Out<'_>,
    tag: &str,
    key: &str,
    value: &str,
    r: &Run,
) -> BTreeMap<String, String> {
    let mut v: Vec<_> = fields(out, tag)
        .into_iter()
        .filter(|m| m.get(key).is_some_and(|x| x == value))
        .collect();
    assert_eq!(
        v.len(),
        1,
        "want one {tag} line with {key}={value}\n{}",
        r.describe()
    );
    v.pop().unwrap()
}

/// The value of `key=` on the last line tagged `tag`.
fn last(out: Out<'_>, tag: &str, key: &str, r: &Run) -> u64 {
    let m = out
        .kv(tag)
        .pop()
        .unwrap_or_else(|| panic!("no {tag} line\n{}", r.describe()));
    *m.get(key)
        .unwrap_or_else(|| panic!("no {key}= on {tag}\n{}", r.describe()))
}

fn gg_of(out: Out<'_>, dev: u64, r: &Run) -> BTreeMap<String, u64> {
    out.gg(dev)
        .unwrap_or_else(|| panic!("no GG line for dev {dev}\n{}", r.describe()))
}

fn sim_of(out: Out<'_>, dev: u64, r: &Run) -> BTreeMap<String, u64> {
    out.sim(dev)
        .unwrap_or_else(|| panic!("no SIM line for dev {dev}\n{}", r.describe()))
}

/// The sim's memory per device, as the program read it from the sim.
fn sim_mem(r: &Run) -> u64 {
    last(r.out(), "SIMMEM", "bytes", r)
}

/// gpuguard's stderr lines of this run that contain `needle`.
fn gg_lines_with<'a>(r: &'a Run, needle: &str) -> Vec<&'a str> {
    gg_stderr_lines(r, r.pid)
        .into_iter()
        .filter(|l| l.contains(needle))
        .collect()
}

/// `1.5 GiB`-style, as gpuguard writes sizes for people.
fn human(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// A line names a size either in bytes or the way gpuguard writes sizes.
fn mentions_size(line: &str, bytes: u64) -> bool {
    line.contains(&bytes.to_string()) || line.contains(&human(bytes))
}

/// Panics unless the program was stopped before it ran: status 2, nothing on
/// stdout, one stderr line naming `var` and then `value`, no report files.
fn assert_refused(r: &Run, var: &str, value: &str) -> String {
    assert_eq!(
        r.status.code(),
        Some(2),
        "{var}={value:?} must stop the program with status 2\n{}",
        r.describe()
    );
    assert_eq!(r.stdout, "", "{var}={value:?}: the program must not run");
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{var}={value:?}: want one line on stderr\n{}",
        r.describe()
    );
    let at = lines[0]
        .find(var)
        .unwrap_or_else(|| panic!("the line does not name {var}: {:?}", lines[0]));
    let rest = &lines[0][at + var.len()..];
    let after = rest
        .find(value)
        .unwrap_or_else(|| panic!("the line does not name the value {value:?}: {:?}", lines[0]));
    assert!(dir_files(r).is_empty(), "{:?}", dir_files(r));
    rest[after + value.len()..].to_string()
}

// ---- the forms of GPUGUARD_CAP ---------------------------------------------------------

/// Each accepted form sets the cap of each device (seen through the C API's
/// `cap_bytes` and `cuDeviceTotalMem_v2`); devices it does not cover stay uncapped.
#[test]
fn cap_forms_set_each_devices_cap() {
    enum Want {
        Bytes(u64),
        Fraction(f64),
        None,
    }
    use Want::*;
    let cases: [(&str, &str, [Want; 3]); 8] = [
        (
            "512MiB",
            "",
            [Bytes(512 * MIB), Bytes(512 * MIB), Bytes(512 * MIB)],
        ),
        (
            "1.5GB",
            "",
            [
                Bytes(1_500_000_000),
                Bytes(1_500_000_000),
                Bytes(1_500_000_000),
            ],
        ),
        (
            "20GiB",
            "68719476736",
            [Bytes(20 * GIB), Bytes(20 * GIB), Bytes(20 * GIB)],
        ),
        (
            "4096000",
            "",
            [Bytes(4_096_000), Bytes(4_096_000), Bytes(4_096_000)],
        ),
        ("0.5", "", [Fraction(0.5), Fraction(0.5), Fraction(0.5)]),
        (
            "0:64MiB,1:0.25",
            "",
            [Bytes(64 * MIB), Fraction(0.25), None],
        ),
        (
            "256MiB,1:1GiB",
            "",
            [Bytes(256 * MIB), Bytes(GIB), Bytes(256 * MIB)],
        ),
        ("2:3MiB", "", [None, None, Bytes(3 * MIB)]),
    ];
    for (cap, mem, want) in cases {
        let mut env = vec![("GPUGUARD_CAP", cap), ("SIMCUDA_DEVICES", "3")];
        if !mem.is_empty() {
            env.push(("SIMCUDA_MEM", mem));
        }
        let r = cap_run(&["probe", "0", "1", "2"], &env);
        r.assert_ok();
        let total = sim_mem(&r);
        for (dev, w) in want.iter().enumerate() {
            let expected = match w {
                Bytes(b) => Some(*b),
                Fraction(f) => Some((total as f64 * f) as u64),
                None => Option::None,
            };
            let gg = gg_of(r.out(), dev as u64, &r);
            assert_eq!(
                gg["cap"],
                expected.unwrap_or(0),
                "GPUGUARD_CAP={cap}: device {dev}'s cap_bytes\n{}",
                r.describe()
            );
            let tm = line_where(r.out(), "TOTALMEM", "dev", &dev.to_string(), &r);
            assert_eq!(int(&tm, "rc"), 0);
            assert_eq!(
                num(&tm, "bytes"),
                expected.unwrap_or(total),
                "GPUGUARD_CAP={cap}: cuDeviceTotalMem_v2 of device {dev} (the cap, or the real size)\n{}",
                r.describe()
            );
        }
        assert!(
            gg_lines_with(&r, "capping at").is_empty(),
            "GPUGUARD_CAP={cap}: no cap is above the device's memory\n{}",
            r.describe()
        );
    }
}

/// A malformed cap stops the program before it runs, naming the variable, the value
/// and the accepted forms.
#[test]
fn malformed_cap_stops_the_program() {
    for bad in ["abc", "0", "-1", "1.5", "12XB", "0:", "0:1GiB,0:2GiB"] {
        let r = cap_run(&["probe", "0"], &[("GPUGUARD_CAP", bad)]);
        let rest = assert_refused(&r, "GPUGUARD_CAP", bad);
        assert!(
            rest.contains("GiB") && rest.contains("0.5") && rest.contains("0:"),
            "GPUGUARD_CAP={bad:?}: the line must show the accepted forms (a size, a fraction, \
             per device) after the value: {rest:?}"
        );
    }
    // Also in a program that never touches CUDA: the check is at load time.
    let r = gg_run("/bin/true", &[], &[("GPUGUARD_CAP", "12XB")]);
    assert_refused(&r, "GPUGUARD_CAP", "12XB");
}

#[test]
fn malformed_thresholds_stop_the_program() {
    for var in ["GPUGUARD_WARN_AT", "GPUGUARD_TRIM_AT"] {
        for bad in ["0", "1.5", "x", "150%", "-1", "0%"] {
            let r = cap_run(&["probe", "0"], &[("GPUGUARD_CAP", "64MiB"), (var, bad)]);
            assert_refused(&r, var, bad);
        }
    }
}

/// Accepted threshold spellings run the program normally.
#[test]
fn accepted_thresholds_run() {
    for (var, value) in [
        ("GPUGUARD_WARN_AT", "off"),
        ("GPUGUARD_WARN_AT", "50%"),
        ("GPUGUARD_WARN_AT", "1"),
        ("GPUGUARD_TRIM_AT", "0.7"),
        ("GPUGUARD_TRIM_AT", "off"),
    ] {
        let r = cap_run(&["probe", "0"], &[("GPUGUARD_CAP", "64MiB"), (var, value)]);
        r.assert_ok();
        assert_eq!(gg_of(r.out(), 0, &r)["cap"], 64 * MIB, "{var}={value}");
    }
}

/// A cap above the device's memory is clamped to it, with one warning.
#[test]
fn cap_above_device_memory_is_clamped_with_one_warning() {
    let r = cap_run(&["probe", "0"], &[("GPUGUARD_CAP", "20GiB")]);
    r.assert_ok();
    let total = sim_mem(&r);
    assert!(
        total < 20 * GIB,
        "the sim's default memory must be below the cap"
    );
    assert_eq!(gg_of(r.out(), 0, &r)["cap"], total, "{}", r.describe());
    let tm = line_where(r.out(), "TOTALMEM", "dev", "0", &r);
    assert_eq!(num(&tm, "bytes"), total, "{}", r.describe());
    let warned = gg_lines_with(&r, "capping at");
    assert_eq!(
        warned.len(),
        1,
        "want one `capping at` warning for device 0\n{}",
        r.describe()
    );
}

/// With the cap clamped to a small device, what the program is told never exceeds
/// what the device really has.
#[test]
fn clamped_cap_never_reports_more_than_the_device_has() {
    let r = cap_run(
        &["meminfo"],
        &[("GPUGUARD_CAP", "1GiB"), ("SIMCUDA_MEM", "268435456")],
    );
    r.assert_ok();
    // meminfo uses both devices: one warning for each.
    assert_eq!(gg_lines_with(&r, "capping at").len(), 2, "{}", r.describe());
    for step in ["fresh", "used", "squeezed"] {
        let s = r.section(step);
        let real = line_where(s, "SIMREAL", "dev", "0", &r);
        let mi = line_where(s, "MEMINFO", "dev", "0", &r);
        assert_eq!(
            num(&mi, "total"),
            num(&real, "total"),
            "{step}: total is the clamped cap, the device's size\n{}",
            r.describe()
        );
        assert_eq!(
            num(&mi, "free"),
            num(&real, "free"),
            "{step}: free is the device's real free memory\n{}",
            r.describe()
        );
    }
}

/// A device the per-device form names but the process does not have: one warning,
/// and the rest of the cap applies.
#[test]
fn cap_for_a_missing_device_is_ignored_with_one_warning() {
    let r = cap_run(&["probe", "0", "1"], &[("GPUGUARD_CAP", "0:64MiB,7:1GiB")]);
    r.assert_ok();
    let own: Vec<&str> = gg_stderr_lines(&r, r.pid)
        .into_iter()
        .filter(|l| !l.contains("report "))
        .collect();
    assert_eq!(own.len(), 1, "want one warning\n{}", r.describe());
    assert!(
        own[0].contains("GPUGUARD_CAP") && own[0].contains('7'),
        "the warning names the variable and the device: {:?}",
        own[0]
    );
    assert_eq!(gg_of(r.out(), 0, &r)["cap"], 64 * MIB, "{}", r.describe());
    assert_eq!(gg_of(r.out(), 1, &r)["cap"], 0, "{}", r.describe());
}

// ---- enforcement -----------------------------------------------------------------------

/// Every allocation path the program named in its `DENY`/`FIT` lines.
const PATHS: &[&str] = &[
    "cuMemAlloc_v2",
    "cuMemAlloc",
    "dlsym.cuMemAlloc_v2",
    "procaddr.cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemCreate",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuArrayCreate_v2",
    "cuArray3DCreate_v2",
    "cuMipmappedArrayCreate",
    "cudaMalloc",
    "cudaMallocManaged",
    "cudaMallocPitch",
    "cudaMalloc3D",
    "cudaMallocAsync",
    "cudaMallocFromPoolAsync",
];

/// With 4 MiB left under a 32 MiB cap on device 0, every path refuses 6 MiB before
/// the driver sees it: the API's out-of-memory code (2 for the driver and the
/// runtime alike), the out-pointer untouched, nothing on the sim's books, nothing
/// recorded, one denial counted; and 2 MiB still fits. Pinned host memory and the
/// uncapped device are not capped.
#[test]
fn every_path_is_refused_before_the_driver() {
    let cap = 32 * MIB;
    let r = cap_run(&["paths", "32"], &[("GPUGUARD_CAP", "0:32MiB")]);
    r.assert_ok();
    let out = r.out();
    let mut problems = Vec::new();
    for &p in PATHS {
        let d = line_where(out, "DENY", "path", p, &r);
        if int(&d, "rc") != 2 {
            problems.push(format!("{p}: rc {} instead of 2 (out of memory)", d["rc"]));
        }
        if num(&d, "kept") != 1 {
            problems.push(format!("{p}: the out-pointer was written"));
        }
        for (what, a, b) in [
            ("the sim's live bytes", "live0", "live1"),
            ("the sim's allocation count", "count0", "count1"),
            ("the sim's pool reserve", "pool0", "pool1"),
            ("gpuguard's allocs", "allocs0", "allocs1"),
            ("gpuguard's current bytes", "current0", "current1"),
        ] {
            if num(&d, a) != num(&d, b) {
                problems.push(format!("{p}: {what} changed: {} -> {}", d[a], d[b]));
            }
        }
        if num(&d, "denied1") != num(&d, "denied0") + 1 {
            problems.push(format!(
                "{p}: denied went {} -> {}, want one more",
                d["denied0"], d["denied1"]
            ));
        }
        let f = line_where(out, "FIT", "path", p, &r);
        if int(&f, "rc") != 0 || num(&f, "live1") <= num(&f, "live0") {
            problems.push(format!(
                "{p}: what fits under the cap was not allocated (rc {}, sim {} -> {})",
                f["rc"], f["live0"], f["live1"]
            ));
        }
        if num(&f, "live1") > cap {
            problems.push(format!("{p}: the sim holds {} past the cap", f["live1"]));
        }
    }
    for h in fields(out, "HOST") {
        if int(&h, "rc") != 0 || h["denied0"] != h["denied1"] {
            problems.push(format!("pinned host memory was capped: {h:?}"));
        }
    }
    assert_eq!(fields(out, "HOST").len(), 3, "{}", r.describe());
    let other = line_where(out, "OTHER", "rc", "0", &r);
    assert_eq!(num(&other, "dev"), 1, "{}", r.describe());
    assert!(
        problems.is_empty(),
        "refusals at the cap:\n  {}\n{}",
        problems.join("\n  "),
        r.describe()
    );

    // The C API and the exit report count every refusal, on device 0 only.
    let n = PATHS.len() as u64;
    let gg0 = gg_of(out, 0, &r);
    assert_eq!((gg0["cap"], gg0["denied"]), (cap, n), "{}", r.describe());
    let gg1 = gg_of(out, 1, &r);
    assert_eq!((gg1["cap"], gg1["denied"]), (0, 0), "{}", r.describe());
    let (path, rep) = exit_report(&r);
    let d0 = device_entry(&rep, 0).expect("device 0 in the exit report");
    assert_eq!(u(&d0["cap_bytes"]), cap, "{}", path.display());
    assert_eq!(u(&d0["denied"]), n, "{}", path.display());
    let d1 = device_entry(&rep, 1).expect("device 1 in the exit report");
    assert!(d1["cap_bytes"].is_null(), "{}: {d1}", path.display());
    assert_eq!(u(&d1["denied"]), 0, "{}", path.display());

    // Without gpuguard the sim has room for every one of those calls: the refusals
    // above were gpuguard's.
    let bare = bare_run("gg_cap", &["paths", "32"], &[]);
    bare.assert_ok();
    for d in fields(bare.out(), "DENY") {
        assert_eq!(int(&d, "rc"), 0, "without gpuguard: {d:?}");
    }
}

/// Threads allocating and freeing at the cap at once, through four paths: the sim's
/// live bytes on the device never pass the cap (its high-water mark), and when all
/// threads hold what they could get, the device is full up to less than one request.
#[test]
fn racing_threads_never_pass_the_cap() {
    let cap = 64 * MIB;
    let r = cap_run(&["race", "16", "1000"], &[("GPUGUARD_CAP", "0:64MiB")]);
    r.assert_ok();
    let largest = last(r.out(), "RACE", "largest", &r);
    let full = r.section("full");
    let live = sim_of(full, 0, &r)["live"];
    assert!(
        live <= cap,
        "at the barrier the sim holds {live} > cap {cap}\n{}",
        r.describe()
    );
    assert!(
        live >= cap - largest,
        "at the barrier the sim holds {live}: allocations stopped short of the cap \
         ({cap}) by more than the largest request ({largest})\n{}",
        r.describe()
    );
    assert_eq!(gg_of(full, 0, &r)["current"], live, "{}", r.describe());
    let peak = last(r.out(), "SIMPEAK", "peak", &r);
    assert!(
        peak <= cap,
        "the sim held {peak} bytes on the device at some point, past the cap {cap} \
         (by {})\n{}",
        peak - cap,
        r.describe()
    );
    let end = r.section("end");
    assert_eq!(
        gg_of(end, 0, &r)["denied"],
        last(end, "REFUSED", "n", &r),
        "every refusal the threads saw is one denial\n{}",
        r.describe()
    );
    assert_eq!(sim_of(end, 0, &r)["live"], 0, "{}", r.describe());
    assert_eq!(gg_of(end, 0, &r)["current"], 0, "{}", r.describe());
}

/// Memory that is being freed is the driver's until the free returns: a thread
/// asking for it meanwhile must not get it past the cap. (The sim's free sleeps
/// 200 ms before giving the memory back; another thread asks as soon as the sim says
/// the free is in that sleep.)
#[test]
fn memory_being_freed_counts_until_the_driver_frees_it() {
    let cap = 10 * MIB;
    let r = cap_run(
        &["free_race"],
        &[
            ("GPUGUARD_CAP", "0:10MiB"),
            ("SIMCUDA_FREE_DELAY_MS", "200"),
        ],
    );
    r.assert_ok();
    assert!(
        last(r.out(), "DURING", "live", &r) > 0,
        "the free must still be under way when the other thread asks\n{}",
        r.describe()
    );
    let peak = last(r.out(), "SIMPEAK", "peak", &r);
    assert!(
        peak <= cap,
        "while the sim still held the memory being freed, gpuguard let another \
         allocation through: the device held {peak} bytes under a cap of {cap} \
         (alloc_during_free rc {:?})\n{}",
        r.rc("alloc_during_free"),
        r.describe()
    );
}

// ---- pools -----------------------------------------------------------------------------

/// What stream-ordered pools hold from the driver counts: 1 MiB requests take
/// 2 MiB chunks in the sim, so a 10 MiB cap admits 5.
#[test]
fn pool_reserve_counts_against_the_cap() {
    let cap = 10 * MIB;
    let r = cap_run(
        &["pool_fill", "1048576", "20"],
        &[("GPUGUARD_CAP", "0:10MiB")],
    );
    r.assert_ok();
    let fill = line_where(r.out(), "POOLFILL", "rc", "2", &r);
    assert_eq!(
        num(&fill, "ok"),
        cap / pool_chunk(MIB),
        "allocations admitted\n{}",
        r.describe()
    );
    let full = sim_of(r.section("full"), 0, &r);
    assert!(full["live"] <= cap, "{}", r.describe());
    assert_eq!(full["pool_reserved"], num(&fill, "ok") * pool_chunk(MIB));
    assert_eq!(gg_of(r.section("full"), 0, &r)["denied"], 1);
}

/// The same with a cap that is not a whole number of chunks: the chunk a request
/// makes the pool reserve must fit under the cap too, or the call is refused.
#[test]
fn pool_rounding_never_takes_the_device_past_the_cap() {
    let cap = 11 * MIB;
    let r = cap_run(
        &["pool_fill", "1048576", "20"],
        &[("GPUGUARD_CAP", "0:11MiB")],
    );
    r.assert_ok();
    let peak = last(r.out(), "SIMPEAK", "peak", &r);
    let ok = num(&fields(r.out(), "POOLFILL")[0], "ok");
    assert!(
        peak <= cap,
        "after {ok} pool allocations of 1 MiB the sim's pools hold {peak} bytes on the \
         device, past its cap of {cap}\n{}",
        r.describe()
    );
    assert_eq!(ok, cap / pool_chunk(MIB), "{}", r.describe());
}

/// Freed blocks a pool still reserves do not block an allocation: at the cap,
/// gpuguard trims the pools (`cuMemPoolTrimTo(pool, 0)`) and tries again. Without a
/// cap nothing is trimmed.
#[test]
fn freed_pool_memory_is_trimmed_before_a_refusal() {
    let cap = 10 * MIB;
    let r = cap_run(&["pool_trim"], &[("GPUGUARD_CAP", "0:10MiB")]);
    r.assert_ok();
    let freed = r.section("freed");
    let reserved = sim_of(freed, 0, &r)["pool_reserved"];
    assert_eq!(reserved, 4 * pool_chunk(MIB), "{}", r.describe());
    assert!(
        reserved + 6 * MIB > cap,
        "the test needs the reserve to block the 6 MiB allocation"
    );
    assert_eq!(r.rc("fits_after_trim"), Some(0), "{}", r.describe());
    let after = r.section("after");
    let s = sim_of(after, 0, &r);
    assert_eq!(s["pool_reserved"], 0, "{}", r.describe());
    assert!(s["live"] <= cap, "{}", r.describe());
    assert_eq!(gg_of(after, 0, &r)["denied"], 0, "{}", r.describe());
    assert!(
        after.calls()["cuMemPoolTrimTo"] > freed.calls()["cuMemPoolTrimTo"],
        "{}",
        r.describe()
    );
    // What does not fit even after a trim is refused.
    assert_eq!(r.rc("too_big"), Some(2), "{}", r.describe());

    let r = cap_run(&["pool_trim"], &[]);
    r.assert_ok();
    assert_eq!(
        sim_of(r.section("after"), 0, &r)["pool_reserved"],
        4 * pool_chunk(MIB),
        "without a cap gpuguard leaves the pools alone\n{}",
        r.describe()
    );
    assert_eq!(r.section("after").calls()["cuMemPoolTrimTo"], 0);
}

/// The `MIDREPORT` of each step of `pool_fill`, by step.
fn mid_reports(r: &Run, steps: &[&str]) -> Vec<Value> {
    steps
        .iter()
        .map(|step| {
            let s = r.section(step);
            let line = s
                .lines("MIDREPORT")
                .pop()
                .unwrap_or_else(|| panic!("no MIDREPORT in {step}\n{}", r.describe()));
            assert_ne!(line[0], "failed", "{}", r.describe());
            let text = std::fs::read_to_string(line[0]).expect("mid report");
            serde_json::from_str(&text).expect("mid report JSON")
        })
        .collect()
}

/// A report's `pool_reserved_bytes` is what the pools hold at the time of the report:
/// with blocks live, with blocks freed but kept, and after the pool gave them back.
#[test]
fn report_pool_reserved_matches_the_sim() {
    let r = cap_run(
        &["pool_fill", "1048576", "3"],
        &[("GPUGUARD_CAP", "0:64MiB"), ("GG_MIDREPORT", "1")],
    );
    r.assert_ok();
    let steps = ["full", "freed", "synced"];
    for (step, rep) in steps.iter().zip(mid_reports(&r, &steps)) {
        let want = sim_of(r.section(step), 0, &r)["pool_reserved"];
        let d0 = device_entry(&rep, 0).expect("device 0");
        assert_eq!(
            u(&d0["pool_reserved_bytes"]),
            want,
            "step {step}: the report's pool_reserved_bytes vs the sim's pool reserve\n{}",
            r.describe()
        );
    }
}

// ---- what the program is told ----------------------------------------------------------

/// `cuMemGetInfo_v2` and `cudaMemGetInfo` say total = cap and free = min(the
/// device's real free memory, cap - used); `cuDeviceTotalMem_v2` says the cap; the
/// uncapped device sees the real numbers.
#[test]
fn mem_get_info_reports_the_cap() {
    let cap = 64 * MIB;
    let r = cap_run(&["meminfo"], &[("GPUGUARD_CAP", "0:64MiB")]);
    r.assert_ok();
    for step in ["fresh", "used", "squeezed"] {
        let s = r.section(step);
        let real = line_where(s, "SIMREAL", "dev", "0", &r);
        let used = gg_of(s, 0, &r)["current"];
        let want_free = num(&real, "free").min(cap - used);
        let mut seen = vec![line_where(s, "MEMINFO", "dev", "0", &r)];
        if step == "used" {
            seen.push(line_where(s, "RTMEMINFO", "dev", "0", &r));
        }
        for mi in seen {
            assert_eq!(int(&mi, "rc"), 0);
            assert_eq!(num(&mi, "total"), cap, "{step}: total\n{}", r.describe());
            assert_eq!(
                num(&mi, "free"),
                want_free,
                "{step}: free\n{}",
                r.describe()
            );
            assert!(num(&mi, "free") <= num(&real, "free"));
        }
    }
    // The squeeze leaves the device less than the cap does, so the real bound shows.
    let s = r.section("squeezed");
    let real_free = num(&line_where(s, "SIMREAL", "dev", "0", &r), "free");
    assert!(real_free < cap - gg_of(s, 0, &r)["current"]);
    // In the used step gpuguard's charge is what the sim holds: the cap was the bound.
    let s = r.section("used");
    let real = line_where(s, "SIMREAL", "dev", "0", &r);
    assert_eq!(
        num(&real, "total") - num(&real, "free"),
        gg_of(s, 0, &r)["current"]
    );

    let total = sim_mem(&r);
    let used = r.section("used");
    assert_eq!(
        num(&line_where(used, "TOTALMEM", "dev", "0", &r), "bytes"),
        cap
    );
    assert_eq!(
        num(&line_where(used, "TOTALMEM", "dev", "1", &r), "bytes"),
        total
    );
    let other = r.section("other");
    let real = line_where(other, "SIMREAL", "dev", "1", &r);
    let mi = line_where(other, "MEMINFO", "dev", "1", &r);
    assert_eq!(
        (num(&mi, "free"), num(&mi, "total")),
        (num(&real, "free"), num(&real, "total")),
        "the uncapped device sees the real numbers\n{}",
        r.describe()
    );
}

/// NULL out-pointers to `cuMemGetInfo_v2` get the driver's own answer, as without
/// gpuguard.
#[test]
fn null_mem_get_info_pointers_get_the_driver_answer() {
    let with = cap_run(&["meminfo"], &[("GPUGUARD_CAP", "0:64MiB")]);
    with.assert_ok();
    let without = bare_run("gg_cap", &["meminfo"], &[]);
    without.assert_ok();
    let pick = |r: &Run| tagged_lines(r.section("null"), &["RC", "NULLOUT"]).join("\n");
    assert_eq!(pick(&with), pick(&without), "{}", with.describe());
}

// ---- NVML ------------------------------------------------------------------------------

/// Checks every NVML line of a run that uses CUDA on two devices: matched to CUDA
/// devices by UUID, a capped device shows total = cap, used = gpuguard's charge,
/// free = min(real free, cap - used); any other device shows the sim's books.
fn check_nvml(r: &Run, caps: &[Option<u64>]) {
    let out = r.out();
    let cuda: BTreeMap<String, u64> = fields(out, "CUUUID")
        .into_iter()
        .map(|m| (m["uuid"].clone(), num(&m, "dev")))
        .collect();
    assert_eq!(cuda.len(), 2, "{}", r.describe());
    let real: BTreeMap<u64, BTreeMap<String, String>> = fields(out, "NVMLREAL")
        .into_iter()
        .map(|m| (num(&m, "idx"), m))
        .collect();
    let mut problems = Vec::new();
    let mut reordered = false;
    for (tag, v2) in [("NVML1", false), ("NVML2", true)] {
        let lines = fields(out, tag);
        assert_eq!(
            lines.len(),
            2 * real.len(),
            "{tag}: link and dl\n{}",
            r.describe()
        );
        for m in lines {
            let what = format!("{tag} path={} idx={}", m["path"], m["idx"]);
            if int(&m, "rc") != 0 {
                problems.push(format!("{what}: rc {}", m["rc"]));
                continue;
            }
            let b = &real[&num(&m, "idx")];
            let (total, reserved, used) = (num(b, "total"), num(b, "reserved"), num(b, "used"));
            let real_free = total - reserved - used;
            let dev = cuda.get(&m["uuid"]).copied();
            reordered |= dev.is_some_and(|d| d != num(&m, "idx"));
            let cap = dev.and_then(|d| caps[d as usize]);
            let got = (num(&m, "total"), num(&m, "free"), num(&m, "used"));
            match (dev, cap) {
                (Some(d), Some(cap)) => {
                    let charge = gg_of(out, d, r)["current"];
                    let want = (cap, real_free.min(cap - charge), charge);
                    if got != want {
                        problems.push(format!(
                            "{what} (CUDA device {d}, cap {cap}): (total, free, used) {got:?}, want {want:?}"
                        ));
                    }
                    if v2 && got.1 + got.2 + num(&m, "reserved") > cap {
                        problems.push(format!("{what}: free + used + reserved past the cap"));
                    }
                }
                _ => {
                    let want = if v2 {
                        (total, real_free, used)
                    } else {
                        (total, real_free, reserved + used)
                    };
                    if got != want || (v2 && num(&m, "reserved") != reserved) {
                        problems.push(format!(
                            "{what} (CUDA device {dev:?}, uncapped): {m:?} differs from the sim's books {b:?}"
                        ));
                    }
                }
            }
        }
    }
    assert!(reordered, "the sim's NVML must order devices unlike CUDA");
    assert!(
        problems.is_empty(),
        "NVML under a cap:\n  {}\n{}",
        problems.join("\n  "),
        r.describe()
    );
}

/// NVML, reached by linked symbol and by `dlopen` + `dlsym`, shows the cap of the
/// capped device (found by UUID, NVML's order being the reverse of CUDA's) and the
/// real numbers of the other.
#[test]
fn nvml_reports_the_cap_by_uuid() {
    let r = cap_run(&["nvml"], &[("GPUGUARD_CAP", "0:64MiB")]);
    r.assert_ok();
    check_nvml(&r, &[Some(64 * MIB), None]);
}

/// A cap on every device covers both CUDA devices; a device NVML lists that this
/// process's CUDA does not show is left alone.
#[test]
fn nvml_leaves_devices_cuda_does_not_show_alone() {
    let r = cap_run(
        &["nvml"],
        &[("GPUGUARD_CAP", "64MiB"), ("SIMNVML_EXTRA", "1")],
    );
    r.assert_ok();
    assert_eq!(fields(r.out(), "NVMLREAL").len(), 6, "3 devices, 2 paths");
    check_nvml(&r, &[Some(64 * MIB), Some(64 * MIB)]);
}

/// A process that only uses NVML, like nvidia-smi: NVML's answers are untouched and
/// gpuguard stays inert (no report, nothing on stderr, no thread).
#[test]
fn nvml_only_process_is_untouched() {
    let env = [("GPUGUARD_CAP", "0:64MiB"), ("SIMNVML_EXTRA", "1")];
    let with = gg_run("gg_nvml", &["smi"], &env);
    with.assert_ok();
    let without = bare_run("gg_nvml", &["smi"], &env);
    without.assert_ok();
    assert_eq!(with.stdout, without.stdout, "{}", with.describe());
    assert_eq!(with.stderr, "", "{}", with.describe());
    assert!(dir_files(&with).is_empty(), "{:?}", dir_files(&with));
    assert!(!fields(with.out(), "NVML2").is_empty());
}

// ---- cap reports -----------------------------------------------------------------------

fn cap_reports(r: &Run) -> Vec<(std::path::PathBuf, Value)> {
    reports_with_reason(r, "cap")
}

/// Every report of the run lists each device's `cap_bytes` (null when uncapped) and
/// `denied`, as the C API counts them at the end.
fn assert_caps_in_every_report(r: &Run, caps: &[Option<u64>]) {
    for (p, rep) in r.reports() {
        for (dev, cap) in caps.iter().enumerate() {
            let d = device_entry(&rep, dev as i64)
                .unwrap_or_else(|| panic!("{}: no device {dev}", p.display()));
            match cap {
                Some(c) => assert_eq!(u(&d["cap_bytes"]), *c, "{}", p.display()),
                None => assert!(d["cap_bytes"].is_null(), "{}: {d}", p.display()),
            }
            assert!(d["denied"].is_u64(), "{}: {d}", p.display());
        }
    }
}

/// The report written at a refusal: reason `cap`, what was refused, on which device,
/// how much was charged against which cap, and the refused call's stack from the
/// program's function; one line on stderr per cap report; the exit report counts
/// every refusal.
#[test]
fn cap_report_names_the_refused_call() {
    let cap = 16 * MIB;
    // `wait`: the program goes on once the helper thread wrote the first refusal's
    // report (it waits for the file).
    let r = cap_run(
        &["deny_loop", "1000", "wait"],
        &[("GPUGUARD_CAP", "0:16MiB")],
    );
    r.assert_ok();
    assert_eq!(
        last(r.out(), "CAPWAIT", "written", &r),
        1,
        "{}",
        r.describe()
    );
    let reports = cap_reports(&r);
    assert!(!reports.is_empty(), "no cap report\n{}", r.describe());
    let (path, rep) = reports
        .iter()
        .min_by_key(|(_, v)| u(&v["seq"]))
        .expect("a cap report");
    assert_eq!(rep["reason"], "cap", "{}", path.display());
    let d = &rep["denial"];
    let before = sim_of(r.section("before"), 0, &r)["live"];
    assert_eq!(d["device"], 0, "{d}");
    assert_eq!(u(&d["bytes"]), 10 * MIB, "{d}");
    assert_eq!(d["api"], "cuMemAlloc_v2", "{d}");
    assert_eq!(u(&d["charged_bytes"]), before, "{d}");
    assert_eq!(u(&d["cap_bytes"]), cap, "{d}");
    let frames = d["frames"].as_array().expect("frames");
    assert!(
        frames
            .first()
            .and_then(Value::as_str)
            .is_some_and(|f| f.starts_with("refuse_here")),
        "the refused call's stack starts at the program's function: {frames:?}"
    );
    assert_caps_in_every_report(&r, &[Some(cap), None]);

    // One line on stderr per cap report, naming its file.
    for (p, _) in &reports {
        assert_eq!(
            gg_lines_with(&r, &file_name(p)).len(),
            1,
            "{}\n{}",
            p.display(),
            r.describe()
        );
    }
    assert_eq!(
        gg_lines_with(&r, ".cap.json").len(),
        reports.len(),
        "{}",
        r.describe()
    );

    let refused = last(r.out(), "LOOP", "refused", &r);
    assert_eq!(refused, 1000);
    let (p, exit) = exit_report(&r);
    let d0 = device_entry(&exit, 0).unwrap();
    assert_eq!(u(&d0["denied"]), refused, "{}", p.display());
    assert_eq!(u(&device_entry(&exit, 1).unwrap()["denied"]), 0);
}

/// A cap report is written by the helper thread after the refusal: it says the
/// refusal's figures (what was asked, charged, live, the cap) and the device's when
/// it was written, each labelled, in the JSON, `gpuguard show` (text and `--json`)
/// and the stderr line. Here the program frees everything in between (the helper
/// thread held in a driver call of the report by the sim's gate). Before, the report
/// read `12.0 MiB of its 16.0 MiB cap in use` above a device table saying `0 B`
/// live, with nothing to say which moment each was.
#[test]
fn cap_report_says_the_refusal_and_the_writing_apart() {
    let r = cap_run(&["refuse_then_free"], &[("GPUGUARD_CAP", "0:16MiB")]);
    r.assert_ok();
    assert_eq!(last(r.out(), "GATE", "held", &r), 1, "{}", r.describe());
    assert_eq!(
        r.rc("refused"),
        Some(2),
        "CUDA_ERROR_OUT_OF_MEMORY\n{}",
        r.describe()
    );
    let held = sim_of(r.section("refusal"), 0, &r)["live"];
    assert_eq!(held, 12 * MIB);
    assert_eq!(sim_of(r.section("end"), 0, &r)["live"], 0);
    let reports = cap_reports(&r);
    assert_eq!(reports.len(), 1, "{}", r.describe());
    let (path, rep) = &reports[0];
    let d = &rep["denial"];
    // At the refusal.
    assert_eq!(u(&d["bytes"]), 10 * MIB, "{d}");
    assert_eq!(u(&d["charged_bytes"]), held, "{d}");
    assert_eq!(u(&d["live_bytes"]), held, "{d}");
    assert_eq!(u(&d["cap_bytes"]), 16 * MIB, "{d}");
    // At writing, after the free; as the report's device table says.
    let w = &d["at_writing"];
    assert_eq!(u(&w["live_bytes"]), 0, "{d}");
    assert_eq!(u(&w["charged_bytes"]), 0, "{d}");
    assert_eq!(u(&device_entry(rep, 0).unwrap()["current_bytes"]), 0);
    let after = w["after_s"].as_f64().expect("after_s");
    assert!(after > 0.0 && after < 60.0, "{d}");

    let cli = cli();
    let p = path.to_str().unwrap();
    let show = run(cli, &["show", p], &[], false);
    assert!(show.status.success(), "{}", show.describe());
    let lines: Vec<&str> = show.stdout.lines().map(str::trim).collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("cap refused 10.0 MiB (cuMemAlloc_v2) on device 0"))
        .unwrap_or_else(|| panic!("{}", show.stdout));
    assert_eq!(
        lines[at + 1],
        "at the refusal: 12.0 MiB of its 16.0 MiB cap in use (12.0 MiB live)",
        "{}",
        show.stdout
    );
    assert_eq!(
        lines[at + 2],
        format!("at writing, {after:.3} s later: 0 B of its 16.0 MiB cap in use (0 B live)"),
        "{}",
        show.stdout
    );
    let json = run(cli, &["show", "--json", p], &[], false);
    assert!(json.status.success(), "{}", json.describe());
    let v: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["reports"][0]["denial"], *d, "{v:#}");

    // The stderr line of the report: the refusal first, then the writing.
    let line = gg_lines_with(&r, &file_name(path));
    assert_eq!(line.len(), 1, "{}", r.describe());
    let refusal = line[0]
        .find("at the refusal 12.0 MiB of 16.0 MiB in use (12.0 MiB live)")
        .unwrap_or_else(|| panic!("{}", line[0]));
    let writing = line[0]
        .find(&format!(
            "at writing, {after:.3} s later: device 0: 0 B live"
        ))
        .unwrap_or_else(|| panic!("{}", line[0]));
    assert!(refusal < writing, "{}", line[0]);
}

/// A refusal inside a runtime call: the stack still starts at the program's function
/// (the runtime's and the driver's frames are trimmed).
#[test]
fn runtime_refusal_report_starts_at_the_program() {
    let r = cap_run(
        &["deny_loop", "3", "nowait", "rt"],
        &[("GPUGUARD_CAP", "0:16MiB")],
    );
    r.assert_ok();
    assert_eq!(last(r.out(), "LOOP", "refused", &r), 3, "{}", r.describe());
    let reports = cap_reports(&r);
    assert!(!reports.is_empty(), "{}", r.describe());
    for (p, rep) in reports {
        let d = &rep["denial"];
        assert_eq!(u(&d["bytes"]), 10 * MIB, "{}", p.display());
        let first = d["frames"][0].as_str().unwrap_or_default();
        assert!(
            first.starts_with("refuse_rt_here"),
            "{}: frames {}",
            p.display(),
            d["frames"]
        );
    }
    // The cap refused beneath cudaMalloc: the driver refused nothing.
    assert!(
        reports_with_reason(&r, "oom").is_empty(),
        "a cap's refusal of a runtime call is no refusal by the driver\n{}",
        r.describe()
    );
    let g = gg_of(r.out(), 0, &r);
    assert_eq!((g["failed"], g["denied"]), (0, 3), "{}", r.describe());
}

/// A fork while the helper thread initializes NVML for a cap report (the sim's NVML
/// holds the initialization until the child has ended): the child's helper thread
/// must not wait for an initialization only the parent's thread was making. The
/// child writes its own cap and exit reports, and its exit waits for nothing.
#[test]
fn a_fork_during_nvmls_initialization_leaves_the_child_its_reports() {
    let r = cap_run(
        &["fork_in_nvml_init"],
        &[("GPUGUARD_CAP", "0:16MiB"), ("SIMNVML_INIT_HOLD", "1")],
    );
    r.assert_ok();
    assert_eq!(
        last(r.out(), "NVMLWAIT", "waiting", &r),
        1,
        "the parent's helper thread was inside nvmlInit when it forked\n{}",
        r.describe()
    );
    let child = last(r.out(), "CHILD", "pid", &r);
    assert_eq!(last(r.out(), "CHILD", "status", &r), 0, "{}", r.describe());
    let reasons: Vec<String> = r
        .reports()
        .iter()
        .filter_map(|(p, _)| {
            let name = p.file_name()?.to_str()?;
            let mut parts = name.split('.');
            (parts.nth(2)? == child.to_string()).then(|| parts.nth(1).unwrap_or("").to_string())
        })
        .collect();
    for want in ["cap", "exit"] {
        assert!(
            reasons.iter().any(|x| x == want),
            "the child ({child}) wrote no {want} report: {reasons:?}\n{}",
            r.describe()
        );
    }
    assert!(
        !r.stderr
            .lines()
            .any(|l| l.starts_with(&format!("gpuguard[{child}]")) && l.contains("did not finish")),
        "the child's exit waited for its helper thread\n{}",
        r.describe()
    );
}

/// Cap reports are written at the first refusal and at most once a second after:
/// a refusal, its report written (the program waits for the file), 999 refusals
/// more in a few milliseconds and an exit within the second give one (one more per
/// second the run lasted, should it straddle a boundary).
#[test]
fn cap_reports_are_rate_limited() {
    let start = Instant::now();
    let r = cap_run(
        &["deny_loop", "1000", "wait"],
        &[("GPUGUARD_CAP", "0:16MiB")],
    );
    let elapsed = start.elapsed().as_secs_f64();
    r.assert_ok();
    assert_eq!(
        last(r.out(), "CAPWAIT", "written", &r),
        1,
        "{}",
        r.describe()
    );
    let n = cap_reports(&r).len();
    let allowed = 1 + elapsed.floor() as usize;
    assert!(
        (1..=allowed).contains(&n),
        "{n} cap reports for 1000 refusals in a run of {elapsed:.2} s (at most {allowed}): {:?}\n{}",
        dir_files(&r),
        r.describe()
    );
}

/// A refusal just before the program exits still gets its report.
#[test]
fn a_refusal_just_before_exit_gets_a_report() {
    let r = cap_run(
        &["deny_loop", "1", "nowait"],
        &[("GPUGUARD_CAP", "0:16MiB")],
    );
    r.assert_ok();
    assert_eq!(
        cap_reports(&r).len(),
        1,
        "{:?}\n{}",
        dir_files(&r),
        r.describe()
    );
}

// ---- thresholds ------------------------------------------------------------------------

/// `gg_cap warn` (20, 36, 40, 20, 36 MiB on device 0): with a threshold between 20
/// and 36 MiB, one warning at each upward crossing, none while above, each naming
/// the charge and the peak at that point. The crossing thread writes the line inside
/// the allocation call, so it comes before the program's next MARK with no waiting.
fn check_warn(cap: &str, warn_at: Option<&str>) {
    let mut env = vec![("GPUGUARD_CAP", cap)];
    if let Some(w) = warn_at {
        env.push(("GPUGUARD_WARN_AT", w));
    }
    let r = cap_run(&["warn"], &env);
    r.assert_ok();
    let prefix = format!("gpuguard[{}]:", r.pid);
    let lines: Vec<&str> = r.stderr.lines().collect();
    let at = |m: &str| {
        lines
            .iter()
            .position(|l| *l == format!("MARK {m}"))
            .unwrap_or_else(|| panic!("no MARK {m}\n{}", r.describe()))
    };
    let warnings: Vec<(usize, &str)> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with(&prefix) && l.contains("GPUGUARD_WARN_AT"))
        .map(|(i, l)| (i, *l))
        .collect();
    assert_eq!(
        warnings.len(),
        2,
        "{cap} {warn_at:?}: want a warning at each of the two crossings\n{}",
        r.describe()
    );
    let mut peak = 0;
    let mut seen = Vec::new();
    for step in ["below1", "cross1", "above", "below2", "cross2"] {
        let live = sim_of(r.section(step), 0, &r)["live"];
        peak = peak.max(live);
        seen.push((step, live, peak));
    }
    for ((i, line), (from, to, step)) in warnings
        .iter()
        .zip([("below1", "cross1", 1usize), ("below2", "cross2", 4usize)])
    {
        assert!(
            at(from) < *i && *i < at(to),
            "{cap} {warn_at:?}: the warning {line:?} must come between MARK {from} and MARK {to}\n{}",
            r.describe()
        );
        let (_, live, peak) = seen[step];
        assert!(
            mentions_size(line, live) && mentions_size(line, peak) && line.contains("peak"),
            "{cap} {warn_at:?}: {line:?} must name the charge ({live}) and the peak ({peak})"
        );
    }
}

#[test]
fn warn_at_logs_each_upward_crossing_once() {
    check_warn("0:64MiB", Some("0.5"));
}

#[test]
fn warn_at_accepts_a_percentage() {
    check_warn("0:64MiB", Some("50%"));
}

/// The default threshold is 0.8 of the cap: 32 of 40 MiB.
#[test]
fn warn_at_defaults_to_80_percent() {
    check_warn("0:40MiB", None);
}

#[test]
fn warn_at_off_says_nothing() {
    let r = cap_run(
        &["warn"],
        &[("GPUGUARD_CAP", "0:40MiB"), ("GPUGUARD_WARN_AT", "off")],
    );
    r.assert_ok();
    assert!(
        gg_lines_with(&r, "GPUGUARD_WARN_AT").is_empty(),
        "{}",
        r.describe()
    );
}

/// Crossing `GPUGUARD_TRIM_AT` trims the device's pools down to their live blocks;
/// without it the pools keep what they reserved.
#[test]
fn trim_at_trims_pools_when_crossed() {
    // `wait`: the program reads the pools once the trim's report is written.
    let r = cap_run(
        &["trim_at", "wait"],
        &[("GPUGUARD_CAP", "0:64MiB"), ("GPUGUARD_TRIM_AT", "0.5")],
    );
    r.assert_ok();
    let before = sim_of(r.section("before"), 0, &r)["pool_reserved"];
    assert_eq!(before, 8 * pool_chunk(2 * MIB), "{}", r.describe());
    let program = Out(&r.stdout[..r.stdout.find("STEP after").unwrap()]);
    let live_blocks: u64 = program
        .outstanding()
        .iter()
        .filter(|a| a.kind == "pool")
        .map(|a| pool_chunk(a.bytes))
        .sum();
    assert_eq!(
        sim_of(r.section("after"), 0, &r)["pool_reserved"],
        live_blocks,
        "past GPUGUARD_TRIM_AT the pools keep only their live blocks\n{}",
        r.describe()
    );

    // `settle`: the program reads the pools once the helper thread has finished a
    // round of its work begun after the allocation (two report signals answered):
    // a trim the allocation asked for would be done by then.
    let r = cap_run(&["trim_at", "settle"], &[("GPUGUARD_CAP", "0:64MiB")]);
    r.assert_ok();
    assert_eq!(last(r.out(), "SETTLED", "ok", &r), 1, "{}", r.describe());
    assert_eq!(reports_with_reason(&r, "trim").len(), 0, "{}", r.describe());
    assert_eq!(
        sim_of(r.section("after"), 0, &r)["pool_reserved"],
        before,
        "GPUGUARD_TRIM_AT is off by default\n{}",
        r.describe()
    );
}

// ---- programs living with a cap --------------------------------------------------------

/// A framework's way with OOM: allocate until the runtime says
/// `cudaErrorMemoryAllocation`, free cached blocks, try again, and succeed.
#[test]
fn framework_retry_after_oom_succeeds() {
    let cap = 32 * MIB;
    let r = cap_run(&["retry"], &[("GPUGUARD_CAP", "0:32MiB")]);
    r.assert_ok();
    let fill = &fields(r.out(), "FILL")[0];
    assert_eq!(
        int(fill, "rc"),
        2,
        "cudaErrorMemoryAllocation\n{}",
        r.describe()
    );
    assert_eq!(num(fill, "ok"), cap / (4 * MIB), "{}", r.describe());
    assert!(sim_of(r.section("full"), 0, &r)["live"] <= cap);
    assert_eq!(gg_of(r.section("full"), 0, &r)["denied"], 1);
    assert_eq!(r.rc("retry"), Some(0), "{}", r.describe());
    let s = sim_of(r.section("retried"), 0, &r);
    assert!(s["live"] <= cap, "{}", r.describe());
    assert_eq!(gg_of(r.section("retried"), 0, &r)["current"], s["live"]);
}

// ---- gpuguard run ----------------------------------------------------------------------

fn cli() -> &'static str {
    env!("CARGO_BIN_EXE_gpuguard")
}

/// `gpuguard run --cap --warn-at --dir` sets the variables for the child.
#[test]
fn gpuguard_run_sets_cap_warn_and_dir() {
    shim(); // gpuguard run finds libgpuguard.so next to itself
    let dir = profile_dir()
        .join("gg-tmp")
        .join(format!("caps-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let prog = sim_dir().join("gg_cap");
    let r = run(
        cli(),
        &[
            "run",
            "--cap",
            "64MiB",
            "--warn-at",
            "0.5",
            "--dir",
            dir.to_str().unwrap(),
            "--",
            prog.to_str().unwrap(),
            "warn",
        ],
        &[],
        false,
    );
    r.assert_ok();
    assert_eq!(gg_of(r.out(), 0, &r)["cap"], 64 * MIB, "{}", r.describe());
    let warnings = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("gpuguard[") && l.contains("GPUGUARD_WARN_AT"))
        .count();
    assert_eq!(warnings, 2, "{}", r.describe());
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        files.iter().any(|f| f.ends_with(".exit.json")),
        "the exit report goes to --dir: {files:?}\n{}",
        r.describe()
    );
    assert!(dir_files(&r).is_empty(), "{:?}", dir_files(&r));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gpuguard_run_refuses_a_malformed_cap() {
    shim();
    let prog = sim_dir().join("gg_cap");
    let r = run(
        cli(),
        &[
            "run",
            "--cap",
            "abc",
            "--",
            prog.to_str().unwrap(),
            "probe",
            "0",
        ],
        &[],
        false,
    );
    assert_eq!(r.status.code(), Some(2), "{}", r.describe());
    assert_eq!(r.stdout, "", "{}", r.describe());
    assert!(
        r.stderr.contains("--cap") && r.stderr.contains("abc"),
        "the command names its own option\n{}",
        r.describe()
    );
    // Refused before starting anything: the program wrote no line.
    assert!(!r.stderr.contains("OK"), "{}", r.describe());
}
