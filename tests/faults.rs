//! Faults injected into the simulated driver (`SIMCUDA_FAULTS`, `simcuda_set_faults`):
//! out of memory, invalid value, illegal address and a destroyed context, on the
//! allocation and the free of every path (linked symbol, `dlsym`, `cuGetProcAddress`,
//! runtime, stream-ordered pools, VMM, managed, pinned host). The program must get the
//! driver's code unchanged, a failed allocation must leave nothing on the books, a
//! failed free must keep its record, and the books must equal the driver's at exit.

mod common;
mod core_support;
mod proof_support;

use common::*;
use core_support::*;
use proof_support::proof_prog;

/// Paths of `gg_proof faults` and the codes each one is made to fail with.
const PATHS: usize = 10;
const DEVICE_PATHS: u64 = 9; // all but pinned host memory
const CODES: [i64; 4] = [2, 1, 700, 709];

/// `RC` lines in output order.
fn rc_lines(out: Out<'_>) -> Vec<(String, i64)> {
    out.lines("RC")
        .into_iter()
        .map(|w| (w[0].to_string(), w[1].parse().unwrap()))
        .collect()
}

#[test]
fn every_path_returns_the_drivers_code_and_keeps_exact_books() {
    let prog = proof_prog();
    let r = gg_run(&prog, &["faults"], &[]);
    r.assert_ok();
    let bare = bare_run(&prog, &["faults"], &[]);
    bare.assert_ok();

    // 1. the code the driver was told to return reached the program, on every path,
    //    exactly as it does without gpuguard
    let want: Vec<(String, i64)> = r
        .out()
        .lines("WANT")
        .into_iter()
        .map(|w| (w[0].to_string(), w[1].parse().unwrap()))
        .collect();
    assert_eq!(want.len(), PATHS * (CODES.len() * 2 + 2));
    assert_eq!(rc_lines(r.out()), want, "{}", r.describe());
    assert_eq!(rc_lines(r.out()), rc_lines(bare.out()));

    // 2. after each failed free (and each lost context) the memory is still held:
    //    gpuguard's current is what the program holds, and the sim agrees
    let mut checked = 0;
    for line in r.stdout.lines().filter_map(|l| l.strip_prefix("STEP ")) {
        if line == "end" {
            continue;
        }
        let upto = &r.stdout[..r.stdout.find(&format!("STEP {line}\n")).unwrap()];
        let before = Out(upto);
        let step = r.section(line);
        let held: u64 = before
            .outstanding()
            .iter()
            .filter(|a| a.dev == 0)
            .map(|a| a.bytes)
            .sum();
        let gg = step.gg(0).expect("GG line");
        assert_eq!(gg["current"], held, "after {line}\n{}", r.describe());
        assert_eq!(
            expected_current(before, step, 0),
            held,
            "after {line}: the sim's books\n{}",
            r.describe()
        );
        let host: u64 = before
            .outstanding()
            .iter()
            .filter(|a| a.dev < 0)
            .map(|a| a.bytes)
            .sum();
        assert_eq!(step.gg_host().unwrap()["current"], host, "after {line}");
        assert_eq!(step.sim_host().unwrap()["live"], host, "after {line}");
        checked += 1;
    }
    assert_eq!(checked, PATHS * (CODES.len() + 1));

    // 3. counters: a failed allocation is counted as failed, never as an allocation;
    //    a failed free is not a free
    let random = &r.out().kv("RANDOM")[0];
    assert!(random["failed"] > 50 && random["ok"] > 50, "{random:?}");
    let end = r.section("end");
    let gg = end.gg(0).unwrap();
    let allocs = allocs_per_dev(r.out())[&0] + random["ok"];
    let frees = frees_per_dev(r.out())[&0] + random["ok"];
    assert_eq!(gg["allocs"], allocs, "{}", r.describe());
    assert_eq!(gg["frees"], frees, "{}", r.describe());
    // every injected allocation failure on a device path, except the runtime's under
    // a lost context (cudaMalloc fails before it reaches the driver's allocation)
    let injected = DEVICE_PATHS * CODES.len() as u64 + (DEVICE_PATHS - 1) + random["failed"];
    assert_eq!(gg["failed"], injected, "{}", r.describe());

    // 4. the exit report: what the program left, nothing else, device and host
    let rep = assert_exit_report_matches(&r);
    let d0 = device_entry(&rep, 0).unwrap();
    assert_eq!(u(&d0["allocs"]), allocs);
    assert_eq!(u(&d0["frees"]), frees);
    assert_eq!(u(&d0["failed"]), injected);
    assert_eq!(
        u(&d0["current_bytes"]),
        expected_current(r.out(), end, 0),
        "exit report vs the sim's books"
    );
}

/// Rules given by the environment, counted from the first call: the program stops
/// at the first call that must succeed and fails (`MUST`: status 3, the code on
/// stderr). With gpuguard it stops at the same call with the same code, and its exit
/// report is still written.
#[test]
fn environment_rules_strike_the_same_calls_with_and_without_gpuguard() {
    let prog = proof_prog();
    let strip = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| !l.starts_with("gpuguard["))
            .map(String::from)
            .collect()
    };
    for (rules, code) in [
        ("cuMemAlloc_v2=2@3", "failed with 2"),
        ("cuMemFree_v2=1@2", "failed with 1"),
        ("cuMemAllocAsync=700@2", "failed with 700"),
        ("*=709@60+", "failed with 709"),
    ] {
        let env = [("SIMCUDA_FAULTS", rules)];
        let args = ["stress", "1", "400", "7", "0", "0"];
        let r = gg_run(&prog, &args, &env);
        let bare = bare_run(&prog, &args, &env);
        assert_eq!(bare.status.code(), Some(3), "{rules}: {}", bare.describe());
        assert!(bare.stderr.contains(code), "{rules}: {}", bare.describe());
        assert_eq!(r.status.code(), Some(3), "{rules}: {}", r.describe());
        if rules.starts_with('*') {
            // `*` counts gpuguard's own driver calls too: the loss comes a few calls
            // earlier with it, but the program sees the same code
            assert!(strip(&r.stderr).concat().contains(code), "{}", r.describe());
        } else {
            assert_eq!(strip(&r.stderr), strip(&bare.stderr), "{rules}");
        }
        exit_report(&r);
    }
}
