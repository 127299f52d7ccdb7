//! Helpers of the reliability tests (`tests/faults.rs`, `tests/stress.rs`,
//! `tests/fuzz_reports.rs`): builds `tests/progs/gg_proof.c` against the simulated
//! CUDA stack of [`sim_dir`] (declare `mod common;` before `mod proof_support;`).
#![allow(dead_code)]

use crate::common::*;
use std::collections::hash_map::DefaultHasher;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// `gg_proof`, compiled once per test process into a folder keyed by its sources and
/// the sim folder (built aside and renamed into place, so parallel processes share it).
pub fn proof_prog() -> String {
    static PROG: OnceLock<PathBuf> = OnceLock::new();
    PROG.get_or_init(build).display().to_string()
}

fn build() -> PathBuf {
    let sim = sim_dir();
    let root = manifest_dir();
    let src = root.join("tests/progs/gg_proof.c");
    let mut h = DefaultHasher::new();
    sim.hash(&mut h);
    for f in ["tests/progs/gg_proof.c", "tests/progs/gg_common.h"] {
        fs::read(root.join(f)).expect(f).hash(&mut h);
    }
    let base = profile_dir().join("simcuda-proof");
    let dir = base.join(format!("{:016x}", h.finish()));
    let exe = dir.join("gg_proof");
    if exe.exists() {
        return exe;
    }
    let tmp = base.join(format!(
        ".tmp-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    fs::create_dir_all(&tmp).expect("create build folder");
    let out = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
        .args([
            "-O1",
            "-g",
            "-Wall",
            "-Wextra",
            "-fno-omit-frame-pointer",
            "-rdynamic",
        ])
        .arg(format!("-I{}", root.join("tests/sim").display()))
        .arg(format!("-L{}", sim.display()))
        .arg(format!("-Wl,-rpath,{}", sim.display()))
        .arg("-o")
        .arg(tmp.join("gg_proof"))
        .arg(&src)
        .args(["-lcuda", "-lcudart", "-ldl", "-lpthread"])
        .stdin(Stdio::null())
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "compiling gg_proof.c failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if fs::rename(&tmp, &dir).is_err() {
        let _ = fs::remove_dir_all(&tmp);
        assert!(exe.exists(), "installing {}", dir.display());
    }
    exe
}
