//! Shared harness for gpuguard's integration tests.
//!
//! * [`shim`] builds the gpuguard cdylib once per test process.
//! * [`sim_dir`] compiles the simulated CUDA stack (`tests/sim`) and the test
//!   programs (`tests/progs`) once per test process, into a folder keyed by a
//!   hash of their sources, built atomically so parallel test processes share it.
//! * [`run`] runs one program on the sim, with or without the shim preloaded,
//!   in a fresh `GPUGUARD_DIR`, and parses the programs' line protocol
//!   (documented in `tests/progs/gg_common.h`).
#![allow(dead_code)]

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs;
use std::hash::{Hash, Hasher};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long [`run`] lets a program run before killing it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Programs built into [`sim_dir`].
pub const PROGRAMS: &[&str] = &[
    "gg",
    "gg_dl",
    "gg_rt",
    "hello_gpu",
    "gg_cap",
    "gg_nvml",
    "gg_obs",
    "gg_rel",
    "gg_multi",
    "gg_pyembed",
    "gg_graph",
    "gg_group",
];

pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `target/<profile>` of the running test executable
/// (`.../target/debug/deps/sim_smoke-<hash>` gives `.../target/debug`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("test executable has a folder");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().expect("deps has a parent").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

fn is_release() -> bool {
    profile_dir().file_name().is_some_and(|n| n == "release")
}

/// A fresh, unique name component: pid, a per-process counter and the clock.
fn unique() -> String {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed),
        nanos
    )
}

/// libgpuguard.so built with the cargo `features` (e.g. `fault-injection`) in the
/// `fault` profile (the release profile's panic strategy, built quickly), into
/// `target/<dir>`; for a test's own OnceLock (once per test process).
pub fn feature_lib(features: &str, dir: &str) -> PathBuf {
    let target = profile_dir().parent().expect("target dir").join(dir);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "build",
            "--lib",
            "--features",
            features,
            "--profile",
            "fault",
        ])
        .arg("--manifest-path")
        .arg(manifest_dir().join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .stdin(Stdio::null())
        .output()
        .expect("running cargo build");
    assert!(
        out.status.success(),
        "building the library with {features} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lib = target.join("fault").join("libgpuguard.so");
    assert!(lib.exists(), "{} missing", lib.display());
    lib
}

/// Builds the gpuguard cdylib (`cargo build --lib`, same profile and target
/// folder as the tests) once per test process and returns its path. A failed
/// build is remembered too, so the other tests of the process fail at once.
pub fn shim() -> PathBuf {
    static SHIM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = SHIM.get_or_init(|| {
        std::panic::catch_unwind(build_shim).map_err(|e| {
            e.downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "building the shim failed".into())
        })
    });
    match built {
        Ok(lib) => lib.clone(),
        Err(msg) => panic!("{msg}"),
    }
}

fn build_shim() -> PathBuf {
    let profile = profile_dir();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.arg("build")
        .arg("--lib")
        .arg("--manifest-path")
        .arg(manifest_dir().join("Cargo.toml"))
        .env(
            "CARGO_TARGET_DIR",
            profile.parent().expect("profile dir has a parent"),
        )
        .stdin(Stdio::null());
    if is_release() {
        cmd.arg("--release");
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cargo:?} build --lib: {e}"));
    if !out.status.success() {
        panic!(
            "cargo build --lib failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let lib = profile.join("libgpuguard.so");
    assert!(
        lib.exists(),
        "cargo build --lib did not produce {}",
        lib.display()
    );
    lib
}

// ---------------------------------------------------------------------------
// The simulated CUDA stack
// ---------------------------------------------------------------------------

/// Changes whenever the build recipe below changes, so old builds are not reused.
const RECIPE: &str = "sim-recipe-2";

fn c_compiler() -> OsString {
    std::env::var_os("CC").unwrap_or_else(|| "cc".into())
}

fn sources() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for sub in ["tests/sim", "tests/progs"] {
        let dir = manifest_dir().join(sub);
        let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for e in entries {
            let p = e.expect("read_dir entry").path();
            if p.extension().is_some_and(|x| x == "c" || x == "h") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// The folder holding `libcuda.so.1`, `libcuda.so`, `libcudart.so.13`,
/// `libcudart.so`, `libnvidia-ml.so.1`, `libnvidia-ml.so` and the programs in
/// [`PROGRAMS`]; compiled once per test
/// process, reused across processes while the sources are unchanged.
pub fn sim_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(build_sim).clone()
}

fn build_sim() -> PathBuf {
    let cc = c_compiler();
    match Command::new(&cc)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => {}
        _ => panic!(
            "no working C compiler ({cc:?}): the simulated CUDA stack in tests/sim needs one \
             (install gcc, e.g. `apt-get install gcc`, or set CC)"
        ),
    }
    // Key the build by what goes into it: sources, recipe and compiler.
    let mut h = DefaultHasher::new();
    RECIPE.hash(&mut h);
    cc.hash(&mut h);
    for src in sources() {
        src.file_name().hash(&mut h);
        fs::read(&src)
            .unwrap_or_else(|e| panic!("{}: {e}", src.display()))
            .hash(&mut h);
    }
    let base = profile_dir().join("simcuda");
    fs::create_dir_all(&base).expect("create simcuda folder");
    let dir = base.join(format!("{:016x}", h.finish()));
    let stamp = ".complete";
    if dir.join(stamp).exists() {
        return dir;
    }

    // Build aside, then rename into place: a concurrent process either wins
    // the rename (and we use its copy) or loses it to us.
    let tmp = base.join(format!(".tmp-{}", unique()));
    fs::create_dir_all(&tmp).expect("create temporary build folder");
    compile_all(&cc, &tmp);
    fs::write(tmp.join(stamp), b"").expect("write build stamp");
    match fs::rename(&tmp, &dir) {
        Ok(()) => dir,
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            assert!(
                dir.join(stamp).exists(),
                "installing {}: {e}",
                dir.display()
            );
            dir
        }
    }
}

fn compile_all(cc: &OsString, out: &Path) {
    let sim = manifest_dir().join("tests/sim");
    let progs = manifest_dir().join("tests/progs");
    let o = |name: &str| out.join(name).into_os_string();
    let cflags: Vec<OsString> = vec![
        "-O1".into(),
        "-g".into(),
        "-Wall".into(),
        "-fno-omit-frame-pointer".into(),
        format!("-I{}", sim.display()).into(),
    ];
    let lib = |extra: &[OsString]| {
        let mut v = cflags.clone();
        v.extend(["-fPIC".into(), "-shared".into()]);
        v.extend_from_slice(extra);
        v
    };
    // $ORIGIN keeps the folder relocatable (it is built under a temporary
    // name) and lets libcudart's dlopen("libcuda.so.1") find its neighbour.
    let link = |extra: &[&str]| {
        let mut v = cflags.clone();
        v.extend(["-rdynamic".into(), format!("-L{}", out.display()).into()]);
        v.push("-Wl,-rpath,$ORIGIN".into());
        v.extend(extra.iter().map(OsString::from));
        v
    };
    let cc_run = |args: Vec<OsString>| {
        let res = Command::new(cc)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {cc:?}: {e}"));
        if !res.status.success() {
            panic!(
                "{cc:?} {:?} failed:\n{}",
                args,
                String::from_utf8_lossy(&res.stderr)
            );
        }
    };

    let mut a = lib(&[
        "-Wl,-soname,libcuda.so.1".into(),
        "-o".into(),
        o("libcuda.so.1"),
    ]);
    a.extend([sim.join("cuda_sim.c").into(), "-lpthread".into()]);
    cc_run(a);
    std::os::unix::fs::symlink("libcuda.so.1", out.join("libcuda.so")).expect("symlink libcuda.so");

    let mut a = lib(&[
        "-Wl,-soname,libcudart.so.13".into(),
        "-Wl,-rpath,$ORIGIN".into(),
        "-o".into(),
        o("libcudart.so.13"),
    ]);
    a.extend([
        sim.join("cudart_sim.c").into(),
        "-ldl".into(),
        "-lpthread".into(),
    ]);
    cc_run(a);
    std::os::unix::fs::symlink("libcudart.so.13", out.join("libcudart.so"))
        .expect("symlink libcudart.so");

    let mut a = lib(&[
        "-Wl,-soname,libnvidia-ml.so.1".into(),
        "-o".into(),
        o("libnvidia-ml.so.1"),
    ]);
    a.extend([
        sim.join("nvml_sim.c").into(),
        "-ldl".into(),
        "-lpthread".into(),
    ]);
    cc_run(a);
    std::os::unix::fs::symlink("libnvidia-ml.so.1", out.join("libnvidia-ml.so"))
        .expect("symlink libnvidia-ml.so");

    // A library whose constructor calls CUDA (before gpuguard's constructor runs).
    let mut a = lib(&[
        "-Wl,-soname,libgg_early.so".into(),
        format!("-L{}", out.display()).into(),
        "-o".into(),
        o("libgg_early.so"),
    ]);
    a.extend([progs.join("gg_early_lib.c").into(), "-lcuda".into()]);
    cc_run(a);

    let programs: [(&str, &[&str]); 13] = [
        ("gg", &["-lcuda", "-lcudart", "-ldl", "-lpthread"]),
        ("gg_dl", &["-ldl", "-lpthread"]),
        ("gg_rt", &["-lcudart", "-ldl", "-lpthread"]),
        ("hello_gpu", &["-lcudart"]),
        (
            "gg_cap",
            &["-lcuda", "-lcudart", "-lnvidia-ml", "-ldl", "-lpthread"],
        ),
        ("gg_nvml", &["-lnvidia-ml", "-ldl"]),
        ("gg_pyembed", &["-lcudart", "-ldl", "-lpthread"]),
        ("gg_obs", &["-lcuda", "-ldl", "-lpthread"]),
        ("gg_rel", &["-lcuda", "-lcudart", "-ldl", "-lpthread"]),
        ("gg_early", &["-lgg_early", "-lcuda", "-ldl"]),
        (
            "gg_multi",
            &["-lcuda", "-lcudart", "-lnvidia-ml", "-ldl", "-lpthread"],
        ),
        ("gg_graph", &["-lcuda", "-ldl", "-lpthread"]),
        ("gg_group", &["-lcuda", "-lcudart", "-ldl", "-lpthread"]),
    ];
    for (name, libs) in programs {
        let mut a = link(&[]);
        a.extend(["-o".into(), o(name), progs.join(format!("{name}.c")).into()]);
        a.extend(libs.iter().map(OsString::from));
        cc_run(a);
    }
}

// ---------------------------------------------------------------------------
// Running programs
// ---------------------------------------------------------------------------

/// The outcome of one program run.
#[derive(Debug)]
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// The `GPUGUARD_DIR` the program ran with (fresh, empty at start).
    pub dir: PathBuf,
    /// The process id the program ran as.
    pub pid: u32,
}

/// Runs `prog` (a name in [`sim_dir`], or a path) with `args`, on the sim,
/// with `LD_PRELOAD=<shim>` when `preload`, in a fresh `GPUGUARD_DIR`, plus
/// `env` (applied last, so it may override anything). Inherited `GPUGUARD_*`,
/// `SIMCUDA*` and `LD_PRELOAD` variables are dropped. Killed after 60 s.
pub fn run(prog: &str, args: &[&str], env: &[(&str, &str)], preload: bool) -> Run {
    run_timeout(prog, args, env, preload, DEFAULT_TIMEOUT)
}

pub fn run_timeout(
    prog: &str,
    args: &[&str],
    env: &[(&str, &str)],
    preload: bool,
    timeout: Duration,
) -> Run {
    let sim = sim_dir();
    let exe = if prog.contains('/') {
        PathBuf::from(prog)
    } else {
        sim.join(prog)
    };
    let dir = profile_dir().join("gg-tmp").join(unique());
    fs::create_dir_all(&dir).expect("create GPUGUARD_DIR");

    let mut cmd = Command::new(&exe);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    clear_gpuguard_env(&mut cmd);
    cmd.env("LD_LIBRARY_PATH", &sim).env("GPUGUARD_DIR", &dir);
    if preload {
        cmd.env("LD_PRELOAD", shim());
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    // The program starts with the dispositions a job gets from a terminal, whatever
    // this test process inherited: a background job of a non-interactive shell
    // ignores SIGINT, and a Python started so never raises KeyboardInterrupt.
    // SAFETY: between fork and exec only `signal`, which is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }

    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {}: {e}", exe.display()));
    let pid = child.id();
    // Drain both pipes on threads so a chatty program cannot block on a full pipe.
    let mut so = child.stdout.take().expect("stdout pipe");
    let mut se = child.stderr.take().expect("stderr pipe");
    let t_out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = so.read_to_end(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = se.read_to_end(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break Some(st);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stdout = String::from_utf8_lossy(&t_out.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&t_err.join().unwrap_or_default()).into_owned();
    let Some(status) = status else {
        panic!(
            "{} {:?} timed out after {:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            exe.display(),
            args,
            timeout
        );
    };
    Run {
        status,
        stdout,
        stderr,
        dir,
        pid,
    }
}

// ---------------------------------------------------------------------------
// Python processes
// ---------------------------------------------------------------------------

/// The Python interpreter the Python tests run: `$PYTHON`, else `python3` on PATH.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("PYTHON") {
        return PathBuf::from(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("python3"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("the Python tests need python3 (install it, e.g. `apt-get install python3`, or set PYTHON)")
        })
}

/// The interpreters the version-sensitive Python tests run on: the paths in
/// `GG_TEST_PYTHONS` (separated by `:`), else [`python`] alone.
pub fn pythons() -> Vec<PathBuf> {
    match std::env::var("GG_TEST_PYTHONS") {
        Ok(v) if !v.trim().is_empty() => v
            .split(':')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect(),
        _ => vec![python()],
    }
}

/// `tests/python/SCRIPT ARGS` under the interpreter `py`, as [`run_trainer`] runs
/// `trainer.py`.
pub fn run_python(
    py: &Path,
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
    preload: bool,
) -> Run {
    let dir = manifest_dir().join("tests/python");
    let script = dir.join(script).display().to_string();
    let fakefw = dir.join("fakefw").display().to_string();
    let mut all: Vec<&str> = vec![&script];
    all.extend_from_slice(args);
    let mut e: Vec<(&str, &str)> = vec![("PYTHONPATH", &fakefw), ("PYTHONDONTWRITEBYTECODE", "1")];
    e.extend_from_slice(env);
    run(&py.display().to_string(), &all, &e, preload)
}

/// The 1-based line of `tests/python/SCRIPT` that carries `marker`.
pub fn marked_line(script: &str, marker: &str) -> usize {
    let text = fs::read_to_string(manifest_dir().join("tests/python").join(script))
        .unwrap_or_else(|e| panic!("{script}: {e}"));
    text.lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("{marker} in {script}"))
        + 1
}

/// `tests/python/trainer.py ARGS` under [`python`], on the sim, with the stand-in
/// frameworks of `tests/python/fakefw` importable (see [`run`] for the rest).
pub fn run_trainer(args: &[&str], env: &[(&str, &str)], preload: bool) -> Run {
    run_python(&python(), "trainer.py", args, env, preload)
}

/// The line of `tests/python/trainer.py` that leaks (marked `# LEAK-LINE`).
pub fn trainer_leak_line() -> usize {
    let text =
        fs::read_to_string(manifest_dir().join("tests/python/trainer.py")).expect("trainer.py");
    text.lines()
        .position(|l| l.contains("# LEAK-LINE"))
        .expect("LEAK-LINE marker")
        + 1
}

/// One `ALLOC` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alloc {
    pub addr: u64,
    pub bytes: u64,
    pub dev: i32,
    pub kind: String,
}

/// A view of program output (whole stdout or one `STEP` section) with parsers
/// for the line protocol.
#[derive(Debug, Clone, Copy)]
pub struct Out<'a>(pub &'a str);

/// `key=value` words of each line tagged `tag` in `out`, values as text.
pub fn fields(out: Out<'_>, tag: &str) -> Vec<BTreeMap<String, String>> {
    out.lines(tag)
        .into_iter()
        .map(|w| {
            w.iter()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

pub fn parse_hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|_| panic!("bad hex {s:?}"))
}

impl<'a> Out<'a> {
    /// Lines starting with `tag`, split into the words after it.
    pub fn lines(&self, tag: &str) -> Vec<Vec<&'a str>> {
        self.0
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some(tag)).then(|| w.collect())
            })
            .collect()
    }

    pub fn has_line(&self, line: &str) -> bool {
        self.0.lines().any(|l| l.trim() == line)
    }

    pub fn ok(&self) -> bool {
        self.has_line("OK")
    }

    pub fn gg_absent(&self) -> bool {
        self.has_line("GG absent")
    }

    pub fn allocs(&self) -> Vec<Alloc> {
        self.lines("ALLOC")
            .into_iter()
            .map(|w| Alloc {
                addr: parse_hex(w[0]),
                bytes: w[1].parse().expect("ALLOC bytes"),
                dev: w[2].parse().expect("ALLOC dev"),
                kind: w[3].to_string(),
            })
            .collect()
    }

    pub fn frees(&self) -> Vec<u64> {
        self.lines("FREE")
            .into_iter()
            .map(|w| parse_hex(w[0]))
            .collect()
    }

    /// `(address, bytes)` of each `LEAK` line.
    pub fn leaks(&self) -> Vec<(u64, u64)> {
        self.lines("LEAK")
            .into_iter()
            .map(|w| (parse_hex(w[0]), w[1].parse().expect("LEAK bytes")))
            .collect()
    }

    /// ALLOCs not followed by a FREE of the same address, in output order
    /// (an address freed and reused counts once per ALLOC).
    pub fn outstanding(&self) -> Vec<Alloc> {
        let mut live: Vec<Alloc> = Vec::new();
        for l in self.0.lines() {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.first() {
                Some(&"ALLOC") => live.extend(Out(l).allocs()),
                Some(&"FREE") => {
                    let a = parse_hex(w[1]);
                    if let Some(i) = live.iter().position(|x| x.addr == a) {
                        live.remove(i);
                    }
                }
                _ => {}
            }
        }
        live
    }

    /// `key=value` words of each line tagged `tag`, numeric values only.
    pub fn kv(&self, tag: &str) -> Vec<BTreeMap<String, u64>> {
        self.lines(tag)
            .into_iter()
            .map(|w| {
                w.iter()
                    .filter_map(|kv| {
                        let (k, v) = kv.split_once('=')?;
                        Some((k.to_string(), v.parse().ok()?))
                    })
                    .collect()
            })
            .collect()
    }

    /// The last `GG` line for `dev` (keys: dev current peak allocs frees failed
    /// denied unknown_frees cap total).
    pub fn gg(&self, dev: u64) -> Option<BTreeMap<String, u64>> {
        self.kv("GG")
            .into_iter()
            .rev()
            .find(|m| m.get("dev") == Some(&dev))
    }

    /// The last `GGHOST` line (keys: current peak).
    pub fn gg_host(&self) -> Option<BTreeMap<String, u64>> {
        self.kv("GGHOST").pop()
    }

    /// The last `SIM` line for `dev` (keys: dev live count pool_reserved).
    pub fn sim(&self, dev: u64) -> Option<BTreeMap<String, u64>> {
        self.kv("SIM")
            .into_iter()
            .rev()
            .find(|m| m.get("dev") == Some(&dev))
    }

    /// Every `SIM` line of the last block, by device.
    pub fn sims(&self) -> HashMap<u64, BTreeMap<String, u64>> {
        self.kv("SIM").into_iter().map(|m| (m["dev"], m)).collect()
    }

    /// The last `SIMHOST` line (keys: live count).
    pub fn sim_host(&self) -> Option<BTreeMap<String, u64>> {
        self.kv("SIMHOST").pop()
    }

    /// The code of the last `RC <label> <code>` line.
    pub fn rc(&self, label: &str) -> Option<i64> {
        self.lines("RC")
            .into_iter()
            .rev()
            .filter(|w| w.first() == Some(&label))
            .find_map(|w| w.get(1)?.parse().ok())
    }

    /// All `RC` lines as label -> code.
    pub fn rcs(&self) -> BTreeMap<String, i64> {
        self.lines("RC")
            .into_iter()
            .filter_map(|w| Some((w.first()?.to_string(), w.get(1)?.parse().ok()?)))
            .collect()
    }

    /// `CALLS <export> <n>` as export -> n.
    pub fn calls(&self) -> BTreeMap<String, u64> {
        self.lines("CALLS")
            .into_iter()
            .filter_map(|w| Some((w.first()?.to_string(), w.get(1)?.parse().ok()?)))
            .collect()
    }
}

impl Run {
    pub fn out(&self) -> Out<'_> {
        Out(&self.stdout)
    }

    /// The output between `STEP <name>` and the next `STEP` line (or the end).
    pub fn section(&self, name: &str) -> Out<'_> {
        let marker = format!("STEP {name}\n");
        let start = self
            .stdout
            .find(&marker)
            .unwrap_or_else(|| panic!("no `STEP {name}` in output:\n{}", self.describe()))
            + marker.len();
        let rest = &self.stdout[start..];
        let end = if rest.starts_with("STEP ") {
            0
        } else {
            rest.find("\nSTEP ").map_or(rest.len(), |i| i + 1)
        };
        Out(&rest[..end])
    }

    pub fn describe(&self) -> String {
        format!(
            "status: {}\n--- stdout\n{}--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }

    /// Panics unless the program exited 0 and printed `OK`.
    pub fn assert_ok(&self) -> &Self {
        assert!(
            self.status.success() && self.out().ok(),
            "program did not finish cleanly\n{}",
            self.describe()
        );
        self
    }

    /// The signal that ended the program, if one did.
    pub fn signal(&self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.status.signal()
    }

    // Shorthands for the whole output.
    pub fn allocs(&self) -> Vec<Alloc> {
        self.out().allocs()
    }
    pub fn leaks(&self) -> Vec<(u64, u64)> {
        self.out().leaks()
    }
    pub fn gg(&self, dev: u64) -> Option<BTreeMap<String, u64>> {
        self.out().gg(dev)
    }
    pub fn sim(&self, dev: u64) -> Option<BTreeMap<String, u64>> {
        self.out().sim(dev)
    }
    pub fn rc(&self, label: &str) -> Option<i64> {
        self.out().rc(label)
    }
    /// How many allocations a `burst` mode made (its `BURST n=` line).
    pub fn burst_count(&self) -> u64 {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix("BURST n="))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no BURST line\n{}", self.describe()))
    }

    /// The report files gpuguard wrote into [`Run::dir`]
    /// (`gpuguard.*.json`), sorted by name, parsed.
    pub fn reports(&self) -> Vec<(PathBuf, serde_json::Value)> {
        let mut files: Vec<PathBuf> = fs::read_dir(&self.dir)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.retain(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            name.starts_with("gpuguard.") && name.ends_with(".json")
        });
        files.sort();
        files
            .into_iter()
            .map(|p| {
                let text = fs::read_to_string(&p)
                    .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
                let v = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{} is not JSON ({e}):\n{text}", p.display()));
                (p, v)
            })
            .collect()
    }
}

/// The size the sim reserves for a pool allocation of `bytes` (2 MiB chunks).
pub fn pool_chunk(bytes: u64) -> u64 {
    const CHUNK: u64 = 2 << 20;
    bytes.div_ceil(CHUNK) * CHUNK
}

/// What the sim's books should hold per device for the allocations `out`
/// still holds: (bytes, count). Host allocations (device -1) are left out;
/// pool allocations count their 2 MiB-rounded chunk.
pub fn expected_device_books(out: Out<'_>) -> HashMap<i32, (u64, u64)> {
    let mut m: HashMap<i32, (u64, u64)> = HashMap::new();
    for a in out.outstanding() {
        if a.dev < 0 {
            continue;
        }
        let bytes = if a.kind == "pool" {
            pool_chunk(a.bytes)
        } else {
            a.bytes
        };
        let e = m.entry(a.dev).or_default();
        e.0 += bytes;
        e.1 += 1;
    }
    m
}

/// How many stack captures a run's memos answered (`GPUGUARD_LOG=debug`'s
/// "stack captures: N remembered, …" line at exit).
pub fn remembered_captures(r: &Run) -> u64 {
    r.stderr
        .lines()
        .find_map(|l| l.split("stack captures: ").nth(1))
        .and_then(|t| t.split(' ').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no count of stack captures\n{}", r.stderr))
}

/// Removes from `cmd` the test runner's own `GPUGUARD_*`, `SIMCUDA*` and
/// `LD_PRELOAD` variables: each test gives its program exactly the ones it means.
pub fn clear_gpuguard_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("GPUGUARD_") || k.starts_with("SIMCUDA") || k == "LD_PRELOAD" {
            cmd.env_remove(&k);
        }
    }
}
