//! What the tests of the `gpuguard` command share: the command with a clean
//! environment, and what it did.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

pub fn cli() -> &'static str {
    env!("CARGO_BIN_EXE_gpuguard")
}

/// The command with a clean environment for gpuguard's own variables.
pub fn command(args: &[&str]) -> Command {
    let mut c = Command::new(cli());
    c.args(args).stdin(Stdio::null());
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("GPUGUARD_") || k == "LD_PRELOAD" {
            c.env_remove(&k);
        }
    }
    c
}

pub struct Done {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Done {
    pub fn describe(&self) -> String {
        format!(
            "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }

    /// `gpuguard run`'s summary on stderr.
    pub fn summary(&self) -> &str {
        let at = self
            .stderr
            .find("gpuguard run:")
            .unwrap_or_else(|| panic!("no summary\n{}", self.describe()));
        &self.stderr[at..]
    }
}

pub fn done(out: Output) -> Done {
    Done {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `gpuguard run --dir DIR` over a Python command that makes one CUDA allocation
/// (which activates gpuguard), prints READY and waits for a line on stdin; `sim` is
/// the simulated driver's folder; with `in_shell`, a shell runs it as its child.
/// Returns once READY was read: end it with [`finish_ready`].
pub fn start_ready(dir: &Path, sim: &Path, in_shell: bool) -> Child {
    let script = "import ctypes, sys\n\
                  rt = ctypes.CDLL('libcudart.so.13')\n\
                  p = ctypes.c_void_p()\n\
                  assert rt.cudaMalloc(ctypes.byref(p), 1 << 20) == 0\n\
                  print('READY', flush=True)\n\
                  sys.stdin.readline()\n";
    let dir = dir.to_str().expect("utf-8 path");
    let cmd: &[&str] = if in_shell {
        // A list, so the shell does not exec python in its own place.
        &["sh", "-c", "python3 -c \"$0\"; exit $?", script]
    } else {
        &["python3", "-c", script]
    };
    let mut args = vec!["run", "--dir", dir, "--"];
    args.extend_from_slice(cmd);
    let mut child = command(&args)
        .env("LD_LIBRARY_PATH", sim)
        .env("GPUGUARD_PYTHON", "off")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gpuguard run");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "READY");
    child
}

/// Lets the command of [`start_ready`] end; asserts that it ended well.
pub fn finish_ready(mut child: Child) {
    child.stdin.take().unwrap().write_all(b"\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
