//! gpuguard on each interception path: exported symbols (`gg`), the `dlsym`
//! override (`gg_dl dlsym`, the JAX pattern), `cuGetProcAddress` (`gg_dl procaddr`,
//! the runtime's way) and the sim runtime over the driver (`gg_rt runtime`), plus the
//! kinds of memory (VMM, pools, pinned host, arrays, managed, pitch).
//!
//! Each test compares gpuguard's counters (`GG`/`GGHOST`, read through its C API at
//! the program's end) with the sim's own books (`SIM`/`SIMHOST`) and the program's
//! `ALLOC`/`FREE`/`LEAK` lines, and the report's live records with the calls the
//! program made.

mod common;
mod core_support;

use common::*;
use core_support::*;

const MIDREPORT: (&str, &str) = ("GG_MIDREPORT", "1");

/// Counters and the exit report agree with the books; returns the exit report.
fn check_path(r: &Run) -> serde_json::Value {
    r.assert_ok();
    assert!(
        !r.out().gg_absent(),
        "gpuguard not loaded\n{}",
        r.describe()
    );
    assert_counters_match_books(r);
    assert_exit_report_matches(r)
}

/// The mid-run report lists exactly what the program held then, each allocation
/// under the API the program called.
fn check_mid_report(r: &Run, apis: &[&str]) {
    let (rep, before) = mid_report(r);
    assert_eq!(
        live_set(&rep),
        outstanding_set(before),
        "mid-run report's live[] vs the program's outstanding ALLOCs\n{}",
        r.describe()
    );
    assert_apis(&rep, before, apis, r);
}

// ---- exported symbols --------------------------------------------------------------

const LINK_APIS: &[&str] = &[
    "cuMemAlloc_v2",
    "cuMemAlloc_v2",
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemAlloc", // the legacy 32-bit entry point
    "cuMemAlloc_v2",
];

#[test]
fn link_counters_match_sim() {
    let r = gg_run("gg", &["link"], &[]);
    check_path(&r);
}

#[test]
fn link_records_name_the_called_api() {
    let r = gg_run("gg", &["link"], &[MIDREPORT]);
    r.assert_ok();
    check_mid_report(&r, LINK_APIS);
    let (_, rep) = exit_report(&r);
    assert_apis(&rep, r.out(), LINK_APIS, &r);
}

/// The legacy `cuMemAlloc`/`cuMemFree` (32-bit pointers) are distinct functions;
/// gpuguard must see both, so `allocs` and `frees` count them.
#[test]
fn link_legacy_v1_alloc_is_tracked() {
    let r = gg_run("gg", &["link"], &[MIDREPORT]);
    r.assert_ok();
    let legacy: Vec<Alloc> = r
        .allocs()
        .into_iter()
        .filter(|a| a.addr < 1 << 32)
        .collect();
    assert_eq!(
        legacy.len(),
        1,
        "one legacy (32-bit) ALLOC\n{}",
        r.describe()
    );
    let (rep, _) = mid_report(&r);
    let e = live_entry(&rep, legacy[0].addr).unwrap_or_else(|| {
        panic!(
            "legacy cuMemAlloc {:#x} missing from the mid-run report\n{}",
            legacy[0].addr,
            r.describe()
        )
    });
    assert_eq!(e["api"], "cuMemAlloc");
    assert_eq!(u(&e["bytes"]), legacy[0].bytes);
}

// ---- dlsym (JAX) ---------------------------------------------------------------------

#[test]
fn dlsym_counters_match_sim() {
    let r = gg_run("gg_dl", &["dlsym"], &[]);
    check_path(&r);
}

#[test]
fn dlsym_records_name_the_called_api() {
    let apis = [
        "cuMemAlloc_v2",
        "cuMemAlloc_v2",
        "cuMemAllocPitch_v2",
        "cuMemAllocManaged",
        "cuMemHostAlloc",
        "cuMemCreate",
        "cuMemCreate",
    ];
    let r = gg_run("gg_dl", &["dlsym"], &[MIDREPORT]);
    r.assert_ok();
    check_mid_report(&r, &apis);
}

/// A program that never linked libcuda must not find `cu*` names in the global
/// scope (RTLD_DEFAULT or RTLD_NEXT) just because gpuguard is preloaded: probing
/// code would take CUDA for present.
#[test]
fn dlsym_probe_finds_what_it_finds_without_gpuguard() {
    let with = gg_run("gg_dl", &["dlsym"], &[]);
    let without = bare_run("gg_dl", &["dlsym"], &[]);
    with.assert_ok();
    without.assert_ok();
    assert_eq!(
        tagged_lines(with.out(), &["SYM"]),
        tagged_lines(without.out(), &["SYM"]),
        "symbol probes differ under gpuguard\n--- with\n{}\n--- without\n{}",
        with.describe(),
        without.describe()
    );
}

// ---- cuGetProcAddress ------------------------------------------------------------

const PROCADDR_APIS: &[&str] = &[
    "cuMemAlloc_v2", // "cuMemAlloc" @3020
    "cuMemAlloc",    // "cuMemAlloc" @2000: the legacy v1
    "cuMemAllocManaged",
    "cuMemAllocHost_v2",
    "cuMemAllocPitch_v2", // through the v1 cuGetProcAddress
    "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemAllocAsync",
];

#[test]
fn procaddr_counters_match_sim() {
    let r = gg_run("gg_dl", &["procaddr"], &[]);
    check_path(&r);
}

#[test]
fn procaddr_records_name_the_version_asked_for() {
    let r = gg_run("gg_dl", &["procaddr"], &[MIDREPORT]);
    r.assert_ok();
    check_mid_report(&r, PROCADDR_APIS);
}

/// Every lookup answers as without gpuguard (rc, status, NULL or not), and the
/// functions handed out reach exactly the driver variants they would without it:
/// v1 below 3020, `_ptsz` when asked for.
#[test]
fn procaddr_lookups_reach_the_same_driver_variants() {
    let with = gg_run("gg_dl", &["procaddr"], &[]);
    let without = bare_run("gg_dl", &["procaddr"], &[]);
    with.assert_ok();
    without.assert_ok();
    assert_eq!(
        tagged_lines(with.out(), &["PROC", "CALLS"]),
        tagged_lines(without.out(), &["PROC", "CALLS"]),
        "--- with gpuguard\n{}\n--- without\n{}",
        with.describe(),
        without.describe()
    );
    // the v1 function really is the 32-bit one
    let small: Vec<Alloc> = with
        .allocs()
        .into_iter()
        .filter(|a| a.bytes == 12288)
        .collect();
    assert!(
        small.len() == 1 && small[0].addr < 1 << 32,
        "{}",
        with.describe()
    );
}

// ---- runtime over the driver ----------------------------------------------------

const RUNTIME_APIS: &[&str] = &[
    "cudaMalloc",
    "cudaMalloc",
    "cudaMallocPitch",
    "cudaMalloc3D",
    "cudaMallocManaged",
    "cudaMallocAsync",
    "cudaMallocAsync",
    "cudaMallocFromPoolAsync",
    "cudaMallocHost",
    "cudaHostAlloc",
    "cudaMalloc",
];

fn check_runtime(env: &[(&str, &str)]) {
    let r = gg_run("gg_rt", &["runtime"], env);
    let rep = check_path(&r);
    // pinned host allocations counted once too
    let host_allocs = allocs_per_dev(r.out()).get(&-1).copied().unwrap_or(0);
    assert_eq!(
        u(&rep["host_pinned"]["allocs"]),
        host_allocs,
        "host_pinned.allocs vs the program's host allocations\n{}",
        r.describe()
    );
    assert_apis(&rep, r.out(), RUNTIME_APIS, &r);
}

/// Each runtime allocation is counted once, not once for the runtime call and once
/// for the driver call beneath it.
#[test]
fn runtime_counted_once() {
    check_runtime(&[]);
}

#[test]
fn runtime_counted_once_with_per_thread_default_stream() {
    check_runtime(&[("SIMCUDART_PTDS", "1")]);
}

/// While everything is live, every record carries the runtime name, never the
/// driver call beneath it.
#[test]
fn runtime_records_carry_runtime_names() {
    for env in [vec![MIDREPORT], vec![MIDREPORT, ("SIMCUDART_PTDS", "1")]] {
        let r = gg_run("gg_rt", &["runtime"], &env);
        r.assert_ok();
        check_mid_report(&r, RUNTIME_APIS);
    }
}

/// The runtime's lookups pick the same driver variants under gpuguard.
#[test]
fn runtime_reaches_the_same_driver_variants() {
    for env in [vec![], vec![("SIMCUDART_PTDS", "1")]] {
        let with = gg_run("gg_rt", &["runtime"], &env);
        let without = bare_run("gg_rt", &["runtime"], &env);
        with.assert_ok();
        without.assert_ok();
        assert_eq!(
            tagged_lines(with.out(), &["CALLS", "COPY"]),
            tagged_lines(without.out(), &["CALLS", "COPY"]),
            "{env:?}\n--- with gpuguard\n{}\n--- without\n{}",
            with.describe(),
            without.describe()
        );
    }
}

// ---- kinds of memory --------------------------------------------------------------

#[test]
fn vmm_counters_match_sim() {
    let r = gg_run("gg", &["vmm"], &[]);
    let rep = check_path(&r);
    assert_apis(&rep, r.out(), &["cuMemCreate"; 3], &r);
}

/// Stream-ordered pools: gpuguard counts the requested bytes of live blocks, on the
/// device of the pool they came from (device 1's pool, used from device 0's context).
#[test]
fn pool_counters_match_blocks() {
    let r = gg_run("gg", &["pool"], &[]);
    let rep = check_path(&r);
    assert_apis(
        &rep,
        r.out(),
        &[
            "cuMemAllocAsync",
            "cuMemAllocAsync",
            "cuMemAllocAsync_ptsz",
            "cuMemAllocFromPoolAsync",
            "cuMemAllocFromPoolAsync_ptsz",
        ],
        &r,
    );
}

/// Pinned host memory shows only in the host counters, never in a device's.
#[test]
fn host_pinned_kept_apart() {
    let r = gg_run("gg", &["host"], &[]);
    let rep = check_path(&r);
    assert!(r.out().sim_host().unwrap()["live"] > 0);
    for dev in 0..device_count(&r) {
        let gg = r.gg(dev).unwrap();
        assert_eq!((gg["current"], gg["allocs"]), (0, 0), "{}", r.describe());
    }
    assert_eq!(
        u(&rep["host_pinned"]["allocs"]),
        r.allocs().len() as u64,
        "{rep:#}"
    );
    for e in live(&rep) {
        assert_eq!(e["kind"], "host", "{e}");
    }
    assert_apis(
        &rep,
        r.out(),
        &["cuMemHostAlloc", "cuMemAllocHost_v2", "cuMemHostAlloc"],
        &r,
    );
}

#[test]
fn array_counters_match_sim() {
    let r = gg_run("gg", &["array"], &[]);
    let rep = check_path(&r);
    assert_apis(
        &rep,
        r.out(),
        &[
            "cuArrayCreate_v2",
            "cuArrayCreate_v2",
            "cuArray3DCreate_v2",
            "cuMipmappedArrayCreate",
        ],
        &r,
    );
}

/// Managed and pitched memory, by kind, in the link and runtime programs' reports.
#[test]
fn managed_and_pitch_kinds_by_device() {
    for (prog, mode) in [("gg", "link"), ("gg_dl", "dlsym"), ("gg_rt", "runtime")] {
        let r = gg_run(prog, &[mode], &[]);
        r.assert_ok();
        let (_, rep) = exit_report(&r);
        for kind in ["managed", "pitch"] {
            let want: u64 = r
                .out()
                .outstanding()
                .iter()
                .filter(|a| a.kind == kind && a.dev == 0)
                .map(|a| a.bytes)
                .sum();
            let got = device_entry(&rep, 0)
                .and_then(|d| d["by_kind"].get(kind))
                .map_or(0, u);
            assert_eq!(got, want, "{prog} {mode}: device 0 by_kind.{kind}\n{rep:#}");
        }
    }
}
