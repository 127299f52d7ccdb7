//! Native frames in reports: file:line from DWARF, names demangled in every program
//! (C on the sim; a Rust cudarc program).

mod common;
mod core_support;

use common::*;
use core_support::*;
use serde_json::Value;

/// The line of `gg.c` holding `needle` (after the line holding `after`).
fn line_of(after: &str, needle: &str) -> usize {
    let src = std::fs::read_to_string(manifest_dir().join("tests/progs/gg.c")).unwrap();
    let start = src.lines().position(|l| l.contains(after)).unwrap();
    start
        + 1
        + src
            .lines()
            .skip(start)
            .position(|l| l.contains(needle))
            .unwrap()
}

fn site_of<'a>(rep: &'a Value, e: &Value) -> &'a Value {
    let id = e["site"].as_u64().unwrap();
    rep["sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"].as_u64() == Some(id))
        .unwrap()
}

#[test]
fn leak_site_has_file_and_line_from_dwarf() {
    let r = gg_run("gg", &["leak", "2"], &[]);
    r.assert_ok();
    let (_, rep) = exit_report(&r);
    let want = format!(
        "gg.c:{}",
        line_of(
            "void leaky_function(int k)",
            "MUST(cuMemAlloc_v2(&p, bytes));"
        )
    );
    for e in live(&rep) {
        let frames = site_of(&rep, e)["frames"].as_array().unwrap();
        let first = frames[0].as_str().unwrap();
        assert!(first.starts_with("leaky_function+0x"), "{first}");
        assert!(first.ends_with(&want), "{first} should end with {want}");
        // The shape stays `name+0x.. (module+0x..)`, with ` at file:line` after it.
        assert!(
            first.contains(" (gg+0x") && first.contains(") at /"),
            "{first}"
        );
    }
    // `gpuguard show` prints it.
    let (path, _) = exit_report(&r);
    let show = run(
        env!("CARGO_BIN_EXE_gpuguard"),
        &["show", path.to_str().unwrap()],
        &[],
        false,
    );
    assert!(show.status.success(), "{}", show.describe());
    assert!(show.stdout.contains(&want), "{}", show.stdout);
}
