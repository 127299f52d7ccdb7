//! Report files: the exit report is the leak list, its fields, its file, its call
//! sites; reports on request through the C API; reports when the folder cannot be
//! written; the C API's device counters.

mod common;
mod core_support;

use common::*;
use core_support::*;
use serde_json::Value;
use std::time::{SystemTime, UNIX_EPOCH};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `v[key]` exists and satisfies `ok`.
fn field(v: &Value, key: &str, ok: fn(&Value) -> bool, problems: &mut Vec<String>, at: &str) {
    match v.get(key) {
        None => problems.push(format!("{at}: no field {key:?}")),
        Some(x) if !ok(x) => problems.push(format!("{at}: {key:?} has the wrong type: {x}")),
        _ => {}
    }
}

fn is_u64(v: &Value) -> bool {
    v.is_u64()
}
fn is_i64(v: &Value) -> bool {
    v.is_i64()
}
fn is_str(v: &Value) -> bool {
    v.is_string()
}
fn is_null(v: &Value) -> bool {
    v.is_null()
}
fn is_num(v: &Value) -> bool {
    v.is_number()
}
fn is_arr(v: &Value) -> bool {
    v.is_array()
}
fn is_obj(v: &Value) -> bool {
    v.is_object()
}
fn is_site(v: &Value) -> bool {
    v.is_null() || v.is_u64()
}

/// Every field the schema promises, with its JSON type.
fn assert_schema_fields(rep: &Value) {
    let mut p = Vec::new();
    let top = "report";
    field(rep, "schema", is_str, &mut p, top);
    assert_eq!(rep["schema"], "gpuguard-report/1");
    field(rep, "reason", is_str, &mut p, top);
    field(rep, "pid", is_u64, &mut p, top);
    field(rep, "program", is_str, &mut p, top);
    field(rep, "argv", is_arr, &mut p, top);
    field(rep, "time_unix_ms", is_u64, &mut p, top);
    field(rep, "devices", is_arr, &mut p, top);
    field(rep, "host_pinned", is_obj, &mut p, top);
    field(rep, "live", is_arr, &mut p, top);
    field(rep, "sites", is_arr, &mut p, top);
    for d in rep["devices"].as_array().into_iter().flatten() {
        let at = "devices[]";
        field(d, "device", is_i64, &mut p, at);
        field(d, "total_bytes", is_u64, &mut p, at);
        field(d, "cap_bytes", is_null, &mut p, at);
        for k in ["current_bytes", "peak_bytes", "allocs", "frees", "failed"] {
            field(d, k, is_u64, &mut p, at);
        }
    }
    for k in ["current_bytes", "peak_bytes"] {
        field(&rep["host_pinned"], k, is_u64, &mut p, "host_pinned");
    }
    for e in rep["live"].as_array().into_iter().flatten() {
        let at = "live[]";
        field(e, "address", is_str, &mut p, at);
        field(e, "bytes", is_u64, &mut p, at);
        field(e, "device", is_i64, &mut p, at);
        field(e, "kind", is_str, &mut p, at);
        field(e, "api", is_str, &mut p, at);
        field(e, "age_s", is_num, &mut p, at);
        field(e, "site", is_site, &mut p, at);
    }
    for s in rep["sites"].as_array().into_iter().flatten() {
        let at = "sites[]";
        field(s, "id", is_u64, &mut p, at);
        field(s, "frames", is_arr, &mut p, at);
        field(s, "live_bytes", is_u64, &mut p, at);
        field(s, "live_count", is_u64, &mut p, at);
    }
    assert!(p.is_empty(), "{}\n{rep:#}", p.join("\n"));
}

/// `sites[]` entries add up to the live records that point at them.
fn assert_sites_consistent(rep: &Value) {
    let sites = rep["sites"].as_array().unwrap();
    for s in sites {
        let id = u(&s["id"]);
        let mine: Vec<&Value> = live(rep)
            .into_iter()
            .filter(|e| e["site"].as_u64() == Some(id))
            .collect();
        assert_eq!(u(&s["live_count"]), mine.len() as u64, "site {id}\n{rep:#}");
        let bytes: u64 = mine.iter().map(|e| u(&e["bytes"])).sum();
        assert_eq!(u(&s["live_bytes"]), bytes, "site {id}\n{rep:#}");
    }
    for e in live(rep) {
        if let Some(id) = e["site"].as_u64() {
            assert!(
                sites.iter().any(|s| s["id"].as_u64() == Some(id)),
                "live record points at site {id}, which sites[] lacks\n{rep:#}"
            );
        }
    }
}

fn site_of<'a>(rep: &'a Value, entry: &Value) -> &'a Value {
    let id = entry["site"]
        .as_u64()
        .unwrap_or_else(|| panic!("no site for {entry}"));
    rep["sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"].as_u64() == Some(id))
        .unwrap_or_else(|| panic!("no site {id}\n{rep:#}"))
}

#[test]
fn exit_report_is_the_leak_list() {
    let t0 = now_ms();
    let r = gg_run("gg", &["leak", "3"], &[]);
    let t1 = now_ms();
    r.assert_ok();
    assert_eq!(r.leaks().len(), 3, "{}", r.describe());

    // exactly one file in the folder: the exit report, named after the process
    let (path, rep) = exit_report(&r);
    let name = file_name(&path);
    assert_eq!(dir_files(&r), vec![name.clone()], "{}", r.describe());
    assert_eq!(
        name,
        format!("gpuguard.gg.{}.{}.exit.json", r.pid, u(&rep["seq"]))
    );

    assert_schema_fields(&rep);
    assert_eq!(rep["reason"], "exit");
    assert_eq!(rep["program"], "gg");
    assert_eq!(u(&rep["pid"]), u64::from(r.pid));
    let exe = sim_dir().join("gg");
    assert_eq!(
        rep["argv"],
        serde_json::json!([exe.to_string_lossy(), "leak", "3"])
    );
    let t = u(&rep["time_unix_ms"]);
    assert!(t0 <= t && t <= t1, "time_unix_ms {t} outside [{t0}, {t1}]");

    // live[] is the LEAK list; counters add up
    assert_exit_report_matches(&r);
    for e in live(&rep) {
        assert_eq!(e["kind"], "device");
        assert_eq!(e["api"], "cuMemAlloc_v2");
        assert_eq!(e["device"], 0);
        assert!(e["age_s"].as_f64().unwrap() >= 0.0);
    }
    let dev0 = device_entry(&rep, 0).unwrap();
    assert_eq!(u(&dev0["allocs"]), r.allocs().len() as u64);
    assert_eq!(u(&dev0["frees"]), 0);
    assert!(u(&dev0["peak_bytes"]) >= u(&dev0["current_bytes"]));
    assert_sites_consistent(&rep);

    // private file
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{} has mode {mode:o}", path.display());

    // one stderr line names the file
    let lines = gg_stderr_lines(&r, r.pid);
    let want = format!("gpuguard[{}]: report {} (exit): ", r.pid, path.display());
    assert_eq!(
        lines.iter().filter(|l| l.starts_with(&want)).count(),
        1,
        "want one line starting {want:?}\n{}",
        r.describe()
    );
    assert_eq!(lines.len(), 1, "{}", r.describe());
}

/// The leak's call site starts in the function that leaked (gpuguard's and
/// libcuda's frames trimmed off the top), named from the program's symbols.
#[test]
fn exit_report_site_names_the_leaking_function() {
    let r = gg_run("gg", &["leak", "2"], &[]);
    r.assert_ok();
    let (_, rep) = exit_report(&r);
    assert_eq!(live(&rep).len(), 2);
    for e in live(&rep) {
        let site = site_of(&rep, e);
        let frames = site["frames"].as_array().unwrap();
        let first = frames.first().and_then(Value::as_str).unwrap_or("");
        assert!(
            first.contains("leaky_function"),
            "first frame {first:?} of {site:#}"
        );
        assert!(
            frames
                .iter()
                .any(|f| f.as_str().unwrap_or("").contains("mode_leak")),
            "caller frame missing from {site:#}"
        );
    }
}

/// The first allocation from a call path is captured by a full DWARF unwind, the
/// later ones by the learned walk: both must give the same frames, so every leak from
/// the same line lands in one site.
#[test]
fn repeated_allocations_from_one_path_share_one_site() {
    let r = gg_run("gg", &["leak", "8"], &[]);
    r.assert_ok();
    let (_, rep) = exit_report(&r);
    assert_eq!(live(&rep).len(), 8);
    let sites: std::collections::BTreeSet<u64> = live(&rep)
        .iter()
        .map(|e| e["site"].as_u64().expect("a site"))
        .collect();
    assert_eq!(sites.len(), 1, "leaks split over sites {sites:?}: {rep:#}");
    assert_eq!(rep["sites"].as_array().map(Vec::len), Some(1), "{rep:#}");
}

#[test]
fn stack_depth_zero_records_no_sites() {
    let r = gg_run("gg", &["leak", "2"], &[("GPUGUARD_STACK_DEPTH", "0")]);
    r.assert_ok();
    let (_, rep) = exit_report(&r);
    assert_eq!(live_set(&rep), leak_set(r.out()));
    for e in live(&rep) {
        assert!(e.get("site").is_some_and(Value::is_null), "{e}");
    }
    assert_eq!(rep["sites"], serde_json::json!([]), "{rep:#}");
}

#[test]
fn stack_depth_bounds_frames() {
    let r = gg_run("gg", &["leak", "2"], &[("GPUGUARD_STACK_DEPTH", "2")]);
    r.assert_ok();
    let (_, rep) = exit_report(&r);
    for e in live(&rep) {
        let frames = site_of(&rep, e)["frames"].as_array().unwrap();
        assert!(!frames.is_empty() && frames.len() <= 2, "{rep:#}");
        assert!(frames[0].as_str().unwrap().contains("leaky_function"));
    }
}

#[test]
fn request_report_through_c_api() {
    let r = gg_run("gg", &["report_request"], &[]);
    r.assert_ok();
    assert_eq!(r.rc("gpuguard_write_report"), Some(0), "{}", r.describe());
    let path = r.out().lines("REPORT")[0][0].to_string();
    let path = std::path::PathBuf::from(path);
    assert_eq!(path.parent(), Some(r.dir.as_path()), "{}", r.describe());
    let name = file_name(&path);
    assert!(
        name.starts_with(&format!("gpuguard.gg.{}.", r.pid)) && name.ends_with(".request.json"),
        "{name}"
    );
    let rep: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_schema_fields(&rep);
    assert_eq!(rep["reason"], "request");
    assert_eq!(live_set(&rep), leak_set(r.out()), "{rep:#}");
    // and the exit report still follows, with a later sequence number
    let (_, exit) = exit_report(&r);
    assert!(u(&exit["seq"]) > u(&rep["seq"]));
    assert_eq!(live_set(&exit), leak_set(r.out()));
}

/// The reasons of the run's report files, in `seq` order.
fn reasons(r: &Run) -> Vec<String> {
    let mut v: Vec<(u64, String)> = r
        .reports()
        .iter()
        .map(|(_, rep)| (u(&rep["seq"]), rep["reason"].as_str().unwrap_or("?").into()))
        .collect();
    v.sort();
    v.into_iter().map(|(_, reason)| reason).collect()
}

/// A process that initialized CUDA and asked about memory but allocated nothing (a
/// framework's compile worker) writes no exit report and no snapshots: they would
/// say nothing. What it asks for it still gets.
#[test]
fn a_process_that_allocated_nothing_writes_only_the_reports_it_asks_for() {
    let r = gg_run("gg", &["quiet"], &[]);
    r.assert_ok();
    assert!(r.out().lines("MEMINFO").len() == 1, "{}", r.describe());
    assert_eq!(reasons(&r), Vec::<String>::new(), "{}", r.describe());
    assert!(gg_stderr_lines(&r, r.pid).is_empty(), "{}", r.describe());

    // Snapshots due every 1 ms, passed while the report signals were answered.
    let r = gg_run(
        "gg",
        &["quiet", "signal"],
        &[("GPUGUARD_SNAPSHOT_EVERY", "1ms")],
    );
    r.assert_ok();
    assert_eq!(reasons(&r), ["signal"; 3], "{}", r.describe());
    for (_, rep) in r.reports() {
        assert_eq!(rep["devices"], serde_json::json!([]), "{rep:#}");
    }

    let r = gg_run("gg", &["quiet", "request"], &[]);
    r.assert_ok();
    assert_eq!(r.rc("gpuguard_write_report"), Some(0), "{}", r.describe());
    assert_eq!(reasons(&r), ["request"], "{}", r.describe());

    // A refusal is something to report: the cap report, and the exit report after
    // (the trim a refusal asks for writes its own when it runs before the exit).
    let r = gg_run("gg", &["quiet", "refused"], &[("GPUGUARD_CAP", "0:1GiB")]);
    r.assert_ok();
    assert_eq!(r.rc("refused"), Some(2), "{}", r.describe());
    let mut got = reasons(&r);
    got.retain(|x| x != "trim");
    assert_eq!(got, ["cap", "exit"], "{}", r.describe());
}

/// `gpuguard_device_counters` answers -1 for negative devices and, once CUDA is
/// up, for devices at or past the driver's device count; 0 below it.
#[test]
fn device_counters_refuse_devices_past_the_count() {
    for devices in [None, Some("3"), Some("1")] {
        let env: Vec<(&str, &str)> = devices
            .map(|d| ("SIMCUDA_DEVICES", d))
            .into_iter()
            .collect();
        let r = gg_run("gg", &["capi"], &env);
        r.assert_ok();
        let n = device_count(&r) as i64;
        if let Some(d) = devices {
            assert_eq!(n, d.parse::<i64>().unwrap());
        }
        let mut checked = 0;
        for w in r.out().lines("CAPI") {
            let (phase, dev, rc): (&str, i64, i64) =
                (w[0], w[1].parse().unwrap(), w[2].parse().unwrap());
            let want = if dev < 0 {
                -1
            } else if phase == "after" {
                if dev < n { 0 } else { -1 }
            } else if dev == 0 {
                0 // before CUDA: zeros (include/gpuguard.h)
            } else {
                continue; // before CUDA the device count is not known yet
            };
            assert_eq!(
                rc,
                want,
                "CAPI {phase} {dev} with {n} devices\n{}",
                r.describe()
            );
            checked += 1;
        }
        assert!(checked >= 6, "{}", r.describe());
    }
}

#[test]
fn log_off_is_silent_but_writes_reports() {
    let r = gg_run("gg", &["leak", "2"], &[("GPUGUARD_LOG", "off")]);
    r.assert_ok();
    assert_eq!(r.stderr, "", "{}", r.describe());
    let (_, rep) = exit_report(&r);
    assert_eq!(live_set(&rep), leak_set(r.out()));
}

/// When the folder cannot be written the program still runs to its end; gpuguard
/// warns once and puts the report on stderr instead.
#[test]
fn unwritable_dir_reports_to_stderr() {
    let r = gg_run(
        "gg",
        &["leak", "2"],
        &[("GPUGUARD_DIR", "/proc/nonexistent")],
    );
    r.assert_ok();
    assert_eq!(
        r.stderr.matches("cannot write reports").count(),
        1,
        "{}",
        r.describe()
    );
    let start = r
        .stderr
        .find("\n{\n")
        .map(|i| i + 1)
        .or_else(|| r.stderr.starts_with("{\n").then_some(0))
        .unwrap_or_else(|| panic!("no JSON report on stderr\n{}", r.describe()));
    let rep: Value = serde_json::Deserializer::from_str(&r.stderr[start..])
        .into_iter::<Value>()
        .next()
        .expect("a JSON value")
        .unwrap_or_else(|e| panic!("report on stderr does not parse: {e}\n{}", r.describe()));
    assert_schema_fields(&rep);
    assert_eq!(rep["reason"], "exit");
    assert_eq!(u(&rep["pid"]), u64::from(r.pid));
    assert_eq!(live_set(&rep), leak_set(r.out()), "{rep:#}");
    assert!(dir_files(&r).is_empty());
}
