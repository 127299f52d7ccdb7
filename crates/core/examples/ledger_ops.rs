//! The ledger's hot operations in isolation, for callgrind (instructions are exact and
//! repeatable where wall time on a shared machine is not).
//!
//!   cargo build --release -p gpuguard-core --example ledger_ops
//!   valgrind --tool=callgrind target/release/examples/ledger_ops <op> <pairs> <live>
//!
//! Run it twice with different `<pairs>` and divide the difference of the totals by
//! the difference of the pairs: the instructions of one pair, start-up and prefill
//! cancelled out (`scripts/bench/ledger_ops.sh` does that for every op).
//!
//! Ops (one "pair" each, as the shim makes them for one allocation and its free):
//! - `pair`: reserve, commit, take, confirm_free on an uncapped device;
//! - `capped`: the same on a capped device (the reservation is a compare-and-swap);
//! - `insert`: insert (no reservation), take, confirm_free;
//! - `get`: one lookup of a live address;
//! - `mem`: no loop; prints the process's resident bytes per live record.

use gpuguard_core::ledger::{Key, Kind, Ledger, NO_SITE, Record};
use std::hint::black_box;

fn rec(bytes: u64, thread: u32) -> Record {
    Record {
        bytes,
        ctx: 1,
        t_ns: 0,
        site: NO_SITE,
        thread,
        device: 0,
        kind: Kind::Device,
        api: 0,
        weight: gpuguard_core::sampler::ONE,
    }
}

/// Addresses the way a driver hands them out: aligned, spread over a large range.
fn addr(i: u64) -> u64 {
    0x7f00_0000_0000 + (i << 12)
}

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let op = args.get(1).map_or("pair", String::as_str);
    let pairs: u64 = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let live: u64 = args.get(3).and_then(|v| v.parse().ok()).unwrap_or(0);
    let ledger = Ledger::new();
    if op == "capped" {
        ledger
            .device(0)
            .limit
            .store(1 << 50, std::sync::atomic::Ordering::Relaxed);
    }
    let before = rss_bytes();
    // Prefill: live records at addresses the loop below never uses.
    for i in 0..live {
        let k = Key::device(addr(1 << 24 | i));
        assert!(ledger.reserve(0, false, 256));
        ledger.commit(k, rec(256, 1));
    }
    if op == "mem" {
        let after = rss_bytes();
        println!(
            "live={live} rss_delta={} per_record={:.1} B",
            after - before,
            (after - before) as f64 / live.max(1) as f64
        );
        return;
    }
    let l = black_box(&ledger);
    for i in 0..pairs {
        let k = Key::device(addr(i & 63));
        match op {
            "pair" | "capped" => {
                assert!(l.reserve(0, false, 4096));
                l.commit(k, rec(4096, 7));
                let r = l.take(black_box(k)).unwrap();
                l.confirm_free(&r);
            }
            "insert" => {
                l.insert(k, rec(4096, 7));
                let r = l.take(black_box(k)).unwrap();
                l.confirm_free(&r);
            }
            "get" => {
                black_box(l.get(&Key::device(addr(1 << 24 | (i % live.max(1))))));
            }
            _ => panic!("unknown op {op}"),
        }
    }
    black_box(ledger.device(0).snapshot());
}
