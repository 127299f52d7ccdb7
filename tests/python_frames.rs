//! Python frames in call sites (issue 12), on every interpreter of
//! `GPUGUARD_TEST_PYTHONS` (else `python3`): the allocating thread's frames from
//! its first allocation on, without the interpreter's own entry frames, each named
//! even when its code is gone by the time the report is written.

mod common;

use common::{marked_line, pythons, run_python};
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
                .map(|s| {
                    s["frames"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|f| f.as_str().unwrap().to_string())
                        .collect()
                })
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
        assert_eq!(live.len(), 7, "python {v}: {text}");
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
                _ => format!("{s}:{method} in "),
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
            if *bytes == MIB {
                sites.insert(frames.clone());
            }
        }
        // The loop's four allocations, the first among them, are one site.
        assert_eq!(sites.len(), 1, "python {v}: {sites:#?}");
    }
}
