//! Python frames in call sites (issue 12), on every interpreter of
//! `GG_TEST_PYTHONS` (else `python3`): the allocating thread's frames from
//! its first allocation on, without the interpreter's own entry frames, each named
//! even when its code is gone by the time the report is written.

mod common;
mod core_support;

use common::{marked_line, pythons, remembered_captures, run_python};
use serde_json::Value;
use std::path::Path;

const MIB: u64 = 1 << 20;

fn exit_report(r: &common::Run) -> Value {
    r.reports()
        .into_iter()
        .map(|(_, v)| v)
        .find(|v| v["reason"] == "exit")
        .unwrap_or_else(|| panic!("no exit report\n{}", r.describe()))
}

/// The frames of the site of each live allocation, by size.
fn frames_by_size(rep: &Value) -> Vec<(u64, Vec<String>)> {
    let sites = rep["sites"].as_array().unwrap();
    rep["live"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let id = &a["site"];
            let frames = sites
                .iter()
                .find(|s| &s["id"] == id)
                .map(core_support::frame_list)
                .unwrap_or_default();
            (a["bytes"].as_u64().unwrap(), frames)
        })
        .collect()
}

fn version(py: &Path) -> String {
    let out = std::process::Command::new(py)
        .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        .output()
        .expect("python runs");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn every_allocation_from_the_first_names_its_frames() {
    let s = "first_alloc.py";
    let (malloc, lp, comp, method) = (
        marked_line(s, "MALLOC-LINE"),
        marked_line(s, "LOOP-LINE"),
        marked_line(s, "COMP-LINE"),
        marked_line(s, "METHOD-LINE"),
    );
    let (init, init_call) = (
        marked_line(s, "INIT-LINE"),
        marked_line(s, "INIT-CALL-LINE"),
    );
    for py in pythons() {
        let v = version(&py);
        let r = run_python(&py, s, &[], &[], true);
        r.assert_ok();
        let rep = exit_report(&r);
        let text = rep.to_string();
        assert!(
            !text.contains("no longer alive"),
            "python {v}: a frame lost its name\n{text}"
        );
        let live = frames_by_size(&rep);
        assert_eq!(live.len(), 11, "python {v}: {text}");
        let py_frames = |f: &Vec<String>| -> Vec<String> {
            f.iter()
                .filter_map(|x| x.strip_prefix("python: ").map(str::to_string))
                .collect()
        };
        let mut sites = std::collections::BTreeSet::new();
        for (bytes, frames) in &live {
            let p = py_frames(frames);
            assert!(
                p.first()
                    .is_some_and(|f| f.ends_with(&format!("{s}:{malloc} in malloc"))),
                "python {v}: {bytes} bytes: {frames:#?}"
            );
            let want = match bytes / MIB {
                1 => format!("{s}:{lp} in <module>"),
                2 => format!("{s}:{comp} in "),
                3 => format!("{s}:{method} in "),
                _ => format!("{s}:{init_call} in <module>"),
            };
            assert!(
                p.iter().any(|f| f.contains(&want)),
                "python {v}: {bytes} bytes, no {want:?}: {frames:#?}"
            );
            if *bytes == 3 * MIB {
                let m = p.iter().find(|f| f.contains(&want)).unwrap();
                let name = if v == "3.10" {
                    "forward"
                } else {
                    "Model.forward"
                };
                assert!(m.ends_with(&format!(" in {name}")), "python {v}: {m}");
            }
            // The module's frame is the outermost and is there exactly once: no
            // frame of the interpreter's own between the program's.
            assert_eq!(
                p.iter().filter(|f| f.contains(" in <module>")).count(),
                1,
                "python {v}: {frames:#?}"
            );
            if *bytes == 4 * MIB {
                // Between the class call and its __init__ no frame of the
                // interpreter's own (3.13 runs a shim there once specialized).
                let name = if v == "3.10" {
                    "__init__"
                } else {
                    "Holder.__init__"
                };
                assert!(
                    p.len() == 3
                        && p[1].ends_with(&format!("/{s}:{init} in {name}"))
                        && p[2].ends_with(&format!("/{s}:{init_call} in <module>")),
                    "python {v}: {frames:#?}"
                );
            }
            if *bytes == MIB || *bytes == 4 * MIB {
                sites.insert((*bytes, frames.clone()));
            }
        }
        // Each loop's four allocations, the first among them, are one site.
        assert_eq!(sites.len(), 2, "python {v}: {sites:#?}");
    }
}

#[test]
fn copied_line_tables_give_the_lines_python_gives() {
    use gpuguard_core::pylines::{Format, line_at};
    // Every code object of a few standard modules: the line table, the first line,
    // and co_lines()'s ranges; each range's start offset must decode to its line.
    let script = r#"
import json, sys, types, argparse, email.message
out = []
def walk(c):
    out.append([c.co_linetable.hex(), c.co_firstlineno, [[s, e, l] for s, e, l in c.co_lines()]])
    for k in c.co_consts:
        if isinstance(k, types.CodeType):
            walk(k)
for m in (argparse, email.message, json.decoder):
    walk(compile(open(m.__file__).read(), m.__file__, "exec"))
print(json.dumps([sys.version_info[1], out]))
"#;
    for py in pythons() {
        let out = std::process::Command::new(&py)
            .args(["-c", script])
            .output()
            .expect("python runs");
        let v: Value = serde_json::from_slice(&out.stdout).expect("json");
        let format = if v[0].as_u64().unwrap() == 10 {
            Format::Pairs310
        } else {
            Format::Locations311
        };
        let mut checked = 0;
        for c in v[1].as_array().unwrap() {
            let hex = c[0].as_str().unwrap();
            let table: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            let first = c[1].as_i64().unwrap() as i32;
            for r in c[2].as_array().unwrap() {
                let (start, end) = (r[0].as_u64().unwrap() as usize, r[1].as_u64().unwrap());
                if start as u64 == end {
                    continue;
                }
                let want = r[2].as_i64().map(|l| l as i32);
                assert_eq!(
                    line_at(format, first, &table, start),
                    want,
                    "{}: offset {start} of a code object at line {first}",
                    py.display()
                );
                checked += 1;
            }
        }
        assert!(checked > 1000, "{checked}");
    }
}

#[test]
fn a_thread_with_a_thread_state_but_no_python_keeps_its_native_frames() {
    // PyTorch's autograd engine gives its worker threads a Python thread state and
    // releases the GIL; their allocations (which may be the ones that make the cache
    // take a new segment) run no Python. Such a capture has no Python frames, so its
    // native frames are not cut to the few kept before Python frames: the deep
    // caller is there.
    let script = "import sysconfig, os; d = sysconfig.get_config_var('LIBDIR'); \
                  n = sysconfig.get_config_var('INSTSONAME') or ''; \
                  p = os.path.join(d or '', n); print(p if n.endswith(('.so', '.so.1.0')) and os.path.exists(p) else '')";
    for py in pythons() {
        let out = std::process::Command::new(&py)
            .args(["-c", script])
            .output()
            .expect("python runs");
        let lib = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if lib.is_empty() {
            eprintln!("{}: no shared libpython to embed; skipped", py.display());
            continue;
        }
        let r = common::run("gg_pyembed", &[&lib], &[], true);
        r.assert_ok();
        let rep = exit_report(&r);
        let live = frames_by_size(&rep);
        assert_eq!(live.len(), 1, "{}: {rep:#}", py.display());
        let frames = &live[0].1;
        assert!(
            frames.iter().any(|f| f.starts_with("engine_thread_main+")),
            "{}: {frames:#?}",
            py.display()
        );
        assert!(
            !frames.iter().any(|f| f.starts_with("python: ")),
            "{frames:#?}"
        );
    }
}

/// One allocating line reached three ways at one stack depth (so one memo key):
/// each allocation is named by its own outer frames, and after the first of each
/// way the capture is answered by its memo (`GPUGUARD_LOG=debug` counts them).
#[test]
fn stacks_that_differ_only_in_outer_frames_keep_their_own_sites() {
    let s = "two_callers.py";
    let line = |m: &str| format!("{s}:{} in ", marked_line(s, m));
    let (leaf, a, b) = (line("LEAF-LINE"), line("A-LINE"), line("B-LINE"));
    let (a1, bc, a3) = (line("A1-CALL"), line("B-CALL"), line("A3-CALL"));
    let n = 40u64;
    for py in pythons() {
        let v = version(&py);
        let r = run_python(
            &py,
            s,
            &[&n.to_string()],
            &[("GPUGUARD_LOG", "debug")],
            true,
        );
        r.assert_ok();
        let live = frames_by_size(&exit_report(&r));
        assert_eq!(live.len() as u64, 3 * n, "python {v}");
        for (bytes, frames) in &live {
            let want: [&str; 3] = match bytes / MIB {
                1 => [&leaf, &a, &a1],
                2 => [&leaf, &b, &bc],
                _ => [&leaf, &a, &a3],
            };
            let py_frames: Vec<&String> = frames
                .iter()
                .filter(|f| f.starts_with("python: "))
                .collect();
            // The simulated runtime's `malloc` (tests/python/fakefw/simrt.py), then
            // the three frames that tell the ways apart.
            assert_eq!(py_frames.len(), 4, "python {v}: {frames:#?}");
            assert!(
                py_frames[0].contains("simrt.py:"),
                "python {v}: {frames:#?}"
            );
            for (f, w) in py_frames[1..].iter().zip(want) {
                assert!(
                    f.contains(w),
                    "python {v}: {bytes} bytes, {w:?}: {frames:#?}"
                );
            }
        }
        // Each way's first capture walks (and the first few learn); all the
        // others are answered by their memos.
        let remembered = remembered_captures(&r);
        assert!(
            remembered >= 3 * n - 12,
            "python {v}: {remembered} remembered"
        );
    }
}
