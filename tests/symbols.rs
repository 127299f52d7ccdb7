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

/// A program started through a path that is not UTF-8 (`…/dir\xff/gg`): its frames
/// are named and placed as from any other path. Before, the path was made UTF-8
/// with U+FFFD in place of the byte, the file under that name did not exist, and
/// the frames read `gg+0x…` without a line.
#[test]
fn a_program_under_a_non_utf8_path_keeps_its_names_and_lines() {
    use std::os::unix::ffi::OsStringExt;
    let base = fresh_dir("non-utf8");
    let mut raw = base.clone().into_os_string().into_vec();
    raw.extend_from_slice(b"/dir\xff");
    let bin = std::path::PathBuf::from(std::ffi::OsString::from_vec(raw));
    std::fs::create_dir(&bin).unwrap();
    let exe = bin.join("gg");
    std::fs::copy(sim_dir().join("gg"), &exe).unwrap();
    let reports = base.join("reports");
    std::fs::create_dir(&reports).unwrap();
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(["leak", "2"])
        .stdin(std::process::Stdio::null())
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("LD_PRELOAD", shim())
        .env("GPUGUARD_DIR", &reports);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GPUGUARD_") && k != "GPUGUARD_DIR" {
            cmd.env_remove(k);
        }
    }
    // A freshly copied executable may be busy for a moment (another test thread
    // forked while it was open for writing).
    let out = (0..100)
        .find_map(|_| match cmd.output() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(std::time::Duration::from_millis(20));
                None
            }
            other => Some(other.expect("run the copy")),
        })
        .expect("the copy stayed busy");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files: Vec<_> = std::fs::read_dir(&reports)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".exit.json"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let rep: Value = serde_json::from_slice(&std::fs::read(&files[0]).unwrap()).unwrap();
    let leaky = format!(
        "gg.c:{}",
        line_of(
            "void leaky_function(int k)",
            "MUST(cuMemAlloc_v2(&p, bytes));"
        )
    );
    let sites = |rep: &Value| -> Vec<Vec<String>> {
        let mut v: Vec<_> = live(rep)
            .into_iter()
            .map(|e| frame_list(site_of(rep, e)))
            .collect();
        v.sort();
        v
    };
    let got = sites(&rep);
    assert_eq!(got.len(), 2, "{rep:#}");
    for frames in &got {
        assert!(
            frames[0].starts_with("leaky_function+0x") && frames[0].ends_with(&leaky),
            "{frames:#?}"
        );
        assert!(
            frames
                .iter()
                .any(|f| f.starts_with("main+0x") && f.contains(") at /")),
            "{frames:#?}"
        );
    }
    // Frame for frame what the same program says from its usual path.
    let usual = gg_run("gg", &["leak", "2"], &[]);
    usual.assert_ok();
    assert_eq!(got, sites(&exit_report(&usual).1));
    let _ = std::fs::remove_dir_all(&base);
}

/// The line of `tests/progs/<file>` that holds `needle`.
fn line_in(file: &str, needle: &str) -> usize {
    let src = std::fs::read_to_string(manifest_dir().join("tests/progs").join(file)).unwrap();
    1 + src.lines().position(|l| l.contains(needle)).unwrap()
}

/// `tests/progs/gg_inline.c` built with -O2 (the sim's programs are built with -O1,
/// where nothing need be inlined), against the sim's driver.
fn inline_prog() -> std::path::PathBuf {
    let sim = sim_dir();
    let out = fresh_dir("inline").join("gg_inline");
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let built = std::process::Command::new(&cc)
        .args(["-O2", "-g", "-Wall", "-fno-omit-frame-pointer", "-rdynamic"])
        .arg(format!("-I{}", manifest_dir().join("tests/sim").display()))
        .arg(format!("-L{}", sim.display()))
        .arg("-o")
        .arg(&out)
        .arg(manifest_dir().join("tests/progs/gg_inline.c"))
        .args(["-lcuda", "-ldl"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run the C compiler");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    out
}

/// The HTML page's data (the JSON in its `gg-data` script element).
fn page_data(page: &str) -> Value {
    let open = r#"<script type="application/json" id="gg-data">"#;
    let start = page.find(open).expect("the page's data") + open.len();
    let end = start + page[start..].find("</script>").unwrap();
    serde_json::from_str(&page[start..end]).unwrap()
}

/// Whether the flame graph node `node` or one under it is `outer` with `inner`
/// right under it (a stack is drawn outermost first).
fn has_child(node: &Value, outer: &str, inner: &str) -> bool {
    let children = node["ch"].as_array().unwrap();
    (node["n"] == outer && children.iter().any(|c| c["n"] == inner))
        || children.iter().any(|c| has_child(c, outer, inner))
}

/// A function the compiler inlined (always_inline, -O2) is a frame of its own, at
/// its own line, before the function it was inlined into, whose frame gives the line
/// of the call: in the report, in `gpuguard show` (text and JSON) and in the flame
/// graph. Before, the first frame was `load_table+0x.. at gg_inline.c:<the line in
/// open_table>`, and open_table was named nowhere.
#[test]
fn an_inlined_function_is_a_frame_of_its_own() {
    let exe = inline_prog();
    let r = gg_run(exe.to_str().unwrap(), &[], &[]);
    r.assert_ok();
    let (path, rep) = exit_report(&r);
    let inner = format!("gg_inline.c:{}", line_in("gg_inline.c", "GG-INLINED-ALLOC"));
    let call = format!("gg_inline.c:{}", line_in("gg_inline.c", "GG-INLINED-CALL"));
    let leaks = live(&rep);
    assert_eq!(leaks.len(), 1, "{rep:#}");
    let frames = frame_list(site_of(&rep, leaks[0]));
    assert!(
        frames[0].starts_with("open_table (inlined) at /") && frames[0].ends_with(&inner),
        "{frames:#?}"
    );
    assert!(
        frames[1].starts_with("load_table+0x")
            && frames[1].contains(" (gg_inline+0x")
            && frames[1].ends_with(&call),
        "{frames:#?}"
    );
    assert!(frames[2].starts_with("main+0x"), "{frames:#?}");

    let cli = env!("CARGO_BIN_EXE_gpuguard");
    let p = path.to_str().unwrap();
    // `show`: the two frames, in that order, on lines of their own.
    let show = run(cli, &["show", p], &[], false);
    assert!(show.status.success(), "{}", show.describe());
    let lines: Vec<&str> = show.stdout.lines().map(str::trim).collect();
    let at = lines
        .iter()
        .position(|l| *l == frames[0])
        .unwrap_or_else(|| panic!("{}", show.stdout));
    assert_eq!(lines[at + 1], frames[1], "{}", show.stdout);
    // `show --json`: the top site's frames.
    let json = run(cli, &["show", "--json", p], &[], false);
    assert!(json.status.success(), "{}", json.describe());
    let v: Value = serde_json::from_str(&json.stdout).unwrap();
    let top = &v["reports"][0]["top_sites"][0]["frames"];
    assert_eq!(top[0], frames[0].as_str(), "{v:#}");
    assert_eq!(top[1], frames[1].as_str(), "{v:#}");
    // The flame graph: the inlined function drawn under the function it is in.
    let page = path.with_extension("html");
    let fg = run(
        cli,
        &["flamegraph", p, "-o", page.to_str().unwrap()],
        &[],
        false,
    );
    assert!(fg.status.success(), "{}", fg.describe());
    let data = page_data(&std::fs::read_to_string(&page).unwrap());
    let native = data["views"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "native")
        .expect("a native view");
    assert!(
        has_child(&native["root"], &frames[1], &frames[0]),
        "{data:#}"
    );
}
