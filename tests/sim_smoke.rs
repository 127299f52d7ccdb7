//! Smoke tests of the simulated CUDA stack itself, run WITHOUT the shim: they
//! check that the sim's books, lookups and teardown behave, so that later
//! gpuguard tests can take the sim as the truth. None of them builds gpuguard.

mod common;

use common::*;

const MIB: u64 = 1 << 20;

/// The sim's books (the last SIM lines in `out`) match what the program says
/// it still holds at its end, device by device.
fn assert_books_match(r: &Run, out: Out<'_>, devices: u64) {
    let want = expected_device_books(r.out());
    for dev in 0..devices {
        let sim = out
            .sim(dev)
            .unwrap_or_else(|| panic!("no SIM line for dev {dev}\n{}", r.describe()));
        let (bytes, count) = want.get(&(dev as i32)).copied().unwrap_or((0, 0));
        assert_eq!(sim["live"], bytes, "dev {dev} live bytes\n{}", r.describe());
        assert_eq!(
            sim["count"],
            count,
            "dev {dev} live count\n{}",
            r.describe()
        );
    }
}

/// The LEAK lines name exactly the allocations never freed.
fn assert_leaks_are_outstanding(r: &Run) {
    let mut leaks: Vec<u64> = r.leaks().iter().map(|l| l.0).collect();
    let mut live: Vec<u64> = r.out().outstanding().iter().map(|a| a.addr).collect();
    leaks.sort();
    live.sort();
    assert_eq!(
        leaks,
        live,
        "LEAK lines vs outstanding ALLOCs\n{}",
        r.describe()
    );
}

#[test]
fn link_books_balance() {
    let r = run("gg", &["link"], &[], false);
    r.assert_ok();
    assert!(r.out().gg_absent());
    assert_leaks_are_outstanding(&r);
    assert_books_match(&r, r.out(), 2);
    // the legacy cuMemAlloc hands out 32-bit addresses
    let small = r
        .allocs()
        .iter()
        .filter(|a| a.bytes == 8192)
        .map(|a| a.addr)
        .next()
        .unwrap();
    assert!(small < 1 << 32, "legacy pointer {small:#x}");
}

#[test]
fn dlsym_path_without_shim() {
    let r = run("gg_dl", &["dlsym"], &[], false);
    r.assert_ok();
    // nothing exports cu* names globally when libcuda is not linked
    assert!(
        r.out().has_line("SYM RTLD_DEFAULT cuMemAlloc_v2 null"),
        "{}",
        r.describe()
    );
    assert!(
        r.out().has_line("SYM RTLD_NEXT cuMemAlloc_v2 null"),
        "{}",
        r.describe()
    );
    assert_leaks_are_outstanding(&r);
    assert_books_match(&r, r.out(), 2);
    assert_eq!(r.out().sim_host().unwrap()["live"], 0);
}

#[test]
fn procaddr_honours_versions_and_ptsz() {
    let r = run("gg_dl", &["procaddr"], &[], false);
    r.assert_ok();
    let procs = r.out().lines("PROC");
    let find = |name: &str, ver: &str| {
        procs
            .iter()
            .find(|w| w[0] == name && w[1] == ver)
            .unwrap_or_else(|| panic!("no PROC {name} {ver}\n{}", r.describe()))
            .clone()
    };
    assert_eq!(
        find("cuNoSuchFunction", "13000")[3..],
        ["rc=500", "status=1", "fn=null"]
    );
    assert_eq!(
        find("cuMemAllocAsync", "11000")[3..],
        ["rc=500", "status=2", "fn=null"]
    );
    assert_eq!(
        find("cuMemAlloc_v2", "13000")[3..],
        ["rc=500", "status=1", "fn=null"]
    );
    assert_eq!(find("cuMemAlloc", "2000")[3], "rc=0");

    let calls = r.out().calls();
    let expect = [
        ("cuMemAlloc", 1),
        ("cuMemAlloc_v2", 1),
        ("cuMemFree", 1),
        ("cuMemFree_v2", 2),
        ("cuMemAllocAsync", 1),
        ("cuMemAllocAsync_ptsz", 1),
        ("cuMemAllocFromPoolAsync", 0),
        ("cuMemAllocFromPoolAsync_ptsz", 1),
        ("cuMemFreeAsync", 0),
        ("cuMemFreeAsync_ptsz", 2),
        ("cuMemAllocPitch_v2", 1),
        ("cuGetProcAddress", 1),
    ];
    for (name, n) in expect {
        assert_eq!(calls[name], n, "calls of {name}\n{}", r.describe());
    }
    assert_leaks_are_outstanding(&r);
    assert_books_match(&r, r.out(), 2);
}

#[test]
fn runtime_books_balance() {
    let r = run("gg_rt", &["runtime"], &[], false);
    r.assert_ok();
    assert!(r.out().has_line("COPY ok"));
    assert_leaks_are_outstanding(&r);
    assert_books_match(&r, r.out(), 2);
    assert_eq!(r.out().sim_host().unwrap()["live"], 12345);
    let calls = r.out().calls();
    assert_eq!(calls["cuMemAllocAsync"], 2);
    assert_eq!(calls["cuMemAllocAsync_ptsz"], 0);
    assert_eq!(calls["cuMemAllocFromPoolAsync"], 1);
}

#[test]
fn runtime_ptds_uses_ptsz_variants() {
    let r = run("gg_rt", &["runtime"], &[("SIMCUDART_PTDS", "1")], false);
    r.assert_ok();
    let calls = r.out().calls();
    assert_eq!(calls["cuMemAllocAsync"], 0, "{}", r.describe());
    assert_eq!(calls["cuMemAllocAsync_ptsz"], 2);
    assert_eq!(calls["cuMemAllocFromPoolAsync_ptsz"], 1);
    assert_eq!(calls["cuMemFreeAsync_ptsz"], 1);
    assert_books_match(&r, r.out(), 2);
}

#[test]
fn runtime_error_codes() {
    let r = run("gg_rt", &["rt_errors"], &[], false);
    r.assert_ok();
    let rc = r.out().rcs();
    assert_eq!(rc["cudaSetDevice.bad"], 101);
    assert_eq!(rc["cudaMalloc.null"], 1);
    assert_eq!(rc["cudaMalloc.zero"], 0);
    assert_eq!(rc["cudaFree.bogus"], 1);
    assert_eq!(rc["cudaMalloc.huge"], 2);
}

#[test]
fn vmm_physical_memory_lives_until_released_and_unmapped() {
    let r = run("gg", &["vmm"], &[], false);
    r.assert_ok();
    let g = 2 * MIB;
    assert_eq!(
        r.section("released_while_mapped").sim(0).unwrap()["live"],
        3 * g
    );
    assert_eq!(r.section("unmapped").sim(0).unwrap()["live"], g);
    let end = r.section("end");
    assert_eq!(end.sim(0).unwrap()["live"], 0);
    assert_eq!(end.sim(1).unwrap()["live"], g);
    assert_leaks_are_outstanding(&r);
}

#[test]
fn pool_reserve_and_trim() {
    let r = run("gg", &["pool"], &[], false);
    r.assert_ok();
    // 1 MiB, 3 MiB and 100000 B blocks reserve 2 + 4 + 2 MiB; freeing keeps them
    let after_free = r.section("after_free");
    assert_eq!(after_free.sim(0).unwrap()["live"], 8 * MIB);
    assert_eq!(after_free.sim(0).unwrap()["pool_reserved"], 8 * MIB);
    assert!(after_free.has_line("POOL default0 reserved=8388608 used=3145728"));
    // trimming leaves only the chunks in use
    let trim = r.section("after_trim");
    assert!(
        trim.has_line("POOL default0 reserved=4194304 used=3145728"),
        "{}",
        r.describe()
    );
    assert!(
        trim.has_line("POOL created reserved=6291456 used=5242880"),
        "{}",
        r.describe()
    );
    assert_books_match(&r, r.section("end"), 2);
}

#[test]
fn pinned_host_books() {
    let r = run("gg", &["host"], &[], false);
    r.assert_ok();
    let h = r.out().sim_host().unwrap();
    assert_eq!((h["live"], h["count"]), (300000 + 4096, 2));
    assert_eq!(r.sim(0).unwrap()["live"], 0);
}

#[test]
fn array_books() {
    let r = run("gg", &["array"], &[], false);
    r.assert_ok();
    assert_books_match(&r, r.out(), 2);
    assert_eq!(r.sim(0).unwrap()["live"], 1000 + MIB);
}

#[test]
fn teardown_frees_everything() {
    let r = run("gg", &["teardown"], &[], false);
    r.assert_ok();
    for step in [
        "ctx_destroy",
        "primary_reset",
        "primary_release",
        "device_reset",
    ] {
        let s = r.section(step);
        for dev in 0..2 {
            let sim = s.sim(dev).unwrap();
            assert_eq!(
                (sim["live"], sim["count"]),
                (0, 0),
                "{step} dev {dev}\n{}",
                r.describe()
            );
        }
        assert_eq!(s.sim_host().unwrap()["live"], 0, "{step}");
    }
}

#[test]
fn fail_injection_by_call() {
    let r = run("gg", &["fail"], &[], false);
    r.assert_ok();
    for call in [
        "cuMemAlloc_v2",
        "cuMemCreate",
        "cuMemAllocAsync",
        "cudaMalloc",
    ] {
        assert_eq!(r.rc(call), Some(2), "{call}\n{}", r.describe());
    }
    assert!(r.out().has_line("UNTOUCHED 1"));
    assert_eq!(r.sim(0).unwrap()["live"], 0);
}

#[test]
fn fail_injection_by_env() {
    let r = run("gg", &["fail"], &[("SIMCUDA_FAIL_NEXT", "4")], false);
    r.assert_ok();
    assert_eq!(r.rc("cuMemAlloc_v2"), Some(2));
    assert_eq!(r.rc("cudaMalloc"), Some(2));
}

#[test]
fn null_out_pointers() {
    let r = run("gg", &["nullout"], &[], false);
    r.assert_ok();
    let rcs = r.out().rcs();
    assert_eq!(rcs.len(), 11, "{}", r.describe());
    assert!(rcs.values().all(|&c| c == 1), "{}", r.describe());
}

#[test]
fn bad_frees_get_driver_codes() {
    let r = run("gg", &["unknown_free"], &[], false);
    r.assert_ok();
    let rc = r.out().rcs();
    assert_eq!(rc["cuMemFree_v2"], 0);
    assert_eq!(rc["cuMemFree_v2.double"], 1);
    assert_eq!(rc["cuMemFree_v2.bogus"], 1);
    assert_eq!(rc["cuMemFree_v2.null"], 1);
    assert_eq!(rc["cuMemFreeHost.bogus"], 1);
    assert_eq!(rc["cuMemRelease.bogus"], 1);
    assert_eq!(rc["cuMemFreeAsync.bogus"], 1);
    assert_eq!(rc["cuArrayDestroy.bogus"], 400);
    assert_eq!(rc["cudaFree.bogus"], 1);
    assert_eq!(rc["cuMemFree_v2.untracked"], 0);
    assert_eq!(r.sim(0).unwrap()["live"], 0);
}

#[test]
fn capacity_and_device_count_from_env() {
    let env = [("SIMCUDA_MEM", "67108864"), ("SIMCUDA_DEVICES", "3")];
    let r = run("gg", &["oom", "8388608"], &env, false);
    r.assert_ok();
    assert!(r.out().has_line("OOMAT 8 67108864"), "{}", r.describe());
    assert_eq!(r.rc("cuMemAlloc_v2"), Some(2));
    assert_eq!(r.section("full").sim(0).unwrap()["live"], 64 * MIB);
    assert_eq!(r.section("end").sims().len(), 3);
    assert_eq!(r.section("end").sim(0).unwrap()["live"], 0);
}

#[test]
fn leak_mode() {
    let r = run("gg", &["leak", "4"], &[], false);
    r.assert_ok();
    assert_eq!(r.leaks().len(), 4);
    assert_eq!(r.sim(0).unwrap()["live"], (1 + 2 + 3 + 4) * MIB);
}

#[test]
fn threads_balance() {
    let r = run("gg", &["threads", "6", "400"], &[], false);
    r.assert_ok();
    for dev in 0..2 {
        let s = r.sim(dev).unwrap();
        assert_eq!((s["live"], s["count"]), (0, 0), "{}", r.describe());
    }
}

#[test]
fn fork_children() {
    let r = run("gg", &["fork"], &[], false);
    r.assert_ok();
    let kinds: Vec<&str> = r.out().lines("CHILD").iter().map(|w| w[1]).collect();
    assert_eq!(kinds, ["nocuda", "cuda"]);
    assert_eq!(r.out().lines("CHILD_ALLOC").len(), 1);
    assert_eq!(r.sim(0).unwrap()["live"], 0);
}

#[test]
fn own_handlers_see_every_signal() {
    for mode in ["own_handler", "own_handler_after"] {
        let r = run("gg", &[mode], &[], false);
        r.assert_ok();
        assert!(r.out().has_line("HANDLED 2"), "{}", r.describe());
        assert_eq!(r.stderr.matches("HANDLER").count(), 2, "{}", r.describe());
    }
}

#[test]
fn signals_kill_without_shim() {
    // Without gpuguard nothing handles SIGUSR1: these modes really raise it.
    for (prog, mode) in [
        ("gg_dl", "signal_before"),
        ("gg", "signal_after"),
        ("gg", "storm"),
    ] {
        let r = run(prog, &[mode], &[], false);
        assert_eq!(r.signal(), Some(10), "{prog} {mode}\n{}", r.describe());
    }
}

#[test]
fn inert_modes_and_demo() {
    for prog in ["gg", "gg_dl", "gg_rt"] {
        let r = run(prog, &["nocuda"], &[], false);
        r.assert_ok();
    }
    let r = run("gg", &["report_request"], &[], false);
    r.assert_ok();
    assert!(r.out().gg_absent());
    let r = run("hello_gpu", &["4"], &[], false);
    assert!(r.status.success(), "{}", r.describe());
    assert!(
        r.stdout
            .contains("done: 1 cache buffer(s) of 8 MiB were never freed"),
        "{}",
        r.describe()
    );
    assert!(r.reports().is_empty());
}

/// Stream capture as the real driver restricts it: begins through each variant and
/// lookup path, the legacy stream refused, a second begin refused, stream-ordered
/// allocation legal inside a capture, an unsafe call (a synchronization) refused and
/// the global capture it breaks ending with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
/// a relaxed capture left alone.
#[test]
fn stream_capture_rules() {
    let r = run("gg_graph", &["paths"], &[], false);
    r.assert_ok();
    let want: &[(&str, i64)] = &[
        ("begin_symbol_v2", 0),
        ("begin_dlsym_v1", 0),
        ("begin_proc_ptsz", 0),
        ("begin_proc_to_graph", 0),
        ("begin_legacy", 900),
        ("begin_again", 401),
        ("alloc_async_in_capture", 0),
        ("free_async_in_capture", 0),
        ("end_dlsym", 0),
        ("end_symbol_v1_stream", 0),
        ("end_proc_ptsz", 0),
        ("end_again", 401),
        ("begin_s4", 0),
        ("sync_in_capture", 900),
        ("end_invalidated", 901),
        ("end_to_graph", 0),
    ];
    let rcs = r.out().rcs();
    for (label, code) in want {
        assert_eq!(rcs.get(*label), Some(code), "{label}\n{}", r.describe());
    }
}
