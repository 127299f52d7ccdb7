//! Finding `libgpuguard.so`: at `GPUGUARD_LIB`, beside the `gpuguard` executable
//! (a build tree: `target/release/`), or in `../lib` (an installed prefix:
//! `PREFIX/bin/gpuguard`, `PREFIX/lib/libgpuguard.so`).

use super::Failure;
use super::Outcome;
use super::load::shown;
use super::output::print;
use std::path::PathBuf;

/// The variable that names the library when it lives elsewhere.
pub const LIB_VAR: &str = "GPUGUARD_LIB";
const LIB_NAME: &str = "libgpuguard.so";

/// The library's absolute path, or a message naming every place looked at.
pub fn find() -> Result<PathBuf, Failure> {
    let mut looked: Vec<String> = Vec::new();
    match std::env::var_os(LIB_VAR).filter(|v| !v.is_empty()) {
        Some(path) => {
            let path = PathBuf::from(path);
            if path.is_file() {
                return Ok(path.canonicalize().unwrap_or(path));
            }
            // Named explicitly: a wrong name is an error, not a reason to look elsewhere.
            return Err(Failure::Input(format!(
                "{LIB_VAR}={} is not a file; set it to the path of {LIB_NAME}",
                shown(&path)
            )));
        }
        None => looked.push(format!("{LIB_VAR} (not set)")),
    }
    match std::env::current_exe() {
        Ok(exe) => {
            let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
            for candidate in [dir.join(LIB_NAME), dir.join("../lib").join(LIB_NAME)] {
                if candidate.is_file() {
                    return Ok(candidate.canonicalize().unwrap_or(candidate));
                }
                looked.push(shown(&candidate));
            }
        }
        Err(e) => looked.push(format!("beside this executable (its path is unknown: {e})")),
    }
    Err(Failure::Input(format!(
        "cannot find {LIB_NAME}; looked at: {}. Install both with scripts/install.sh, or set {LIB_VAR} to its path",
        looked.join(", ")
    )))
}

/// `gpuguard lib`: the path, for `LD_PRELOAD=$(gpuguard lib) python train.py`.
pub fn main() -> Outcome {
    let path = find()?;
    print(&format!("{}\n", path.display()))?;
    Ok(0)
}
