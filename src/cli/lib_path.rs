//! Finding `libgpuguard.so`: at `GPUGUARD_LIB`, beside the `gpuguard` executable
//! (a build tree: `target/release/`), or in `../lib` (an installed prefix:
//! `PREFIX/bin/gpuguard`, `PREFIX/lib/libgpuguard.so`).

use super::Failure;
use super::Outcome;
use super::load::shown;
use super::output::print;
use std::path::{Path, PathBuf};

/// The variable that names the library when it lives elsewhere.
pub const LIB_VAR: &str = "GPUGUARD_LIB";
const LIB_NAME: &str = "libgpuguard.so";

/// The library's absolute path, checked to be a shared library ([`check`]), or a
/// message naming every place looked at.
pub fn find() -> Result<PathBuf, Failure> {
    let lib = locate()?;
    check(&lib)?;
    Ok(lib)
}

/// Where the library is, or a message naming every place looked at.
fn locate() -> Result<PathBuf, Failure> {
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

/// The library, checked wherever it was found: the loader skips a preload that is
/// not a shared object of this machine with one line of its own, and `run`'s COMMAND
/// (or `LD_PRELOAD=$(gpuguard lib)`'s) would run unguarded while this says nothing
/// is wrong. A readable ELF file of this
/// machine's class, byte order and architecture, of the shared-object type
/// (`ET_DYN`), passes; the file is opened without blocking and only if it is a
/// regular one.
fn check(lib: &Path) -> Result<(), Failure> {
    use std::io::Read;
    let refuse = |why: &str| {
        Failure::Input(format!(
            "{} is not a shared library ({why}); set {LIB_VAR} to the path of libgpuguard.so",
            shown(lib)
        ))
    };
    let mut head = Vec::with_capacity(64);
    gpuguard_core::regular_file::open(lib)
        .and_then(|f| f.take(64).read_to_end(&mut head))
        .map_err(|e| refuse(&format!("cannot read it: {e}")))?;
    if head.len() < 20 || &head[..4] != b"\x7fELF" {
        return Err(refuse("no ELF header"));
    }
    const ELFCLASS: u8 = if cfg!(target_pointer_width = "64") {
        2
    } else {
        1
    };
    const ELFDATA: u8 = if cfg!(target_endian = "little") { 1 } else { 2 };
    if head[4] != ELFCLASS || head[5] != ELFDATA {
        return Err(refuse("built for another kind of machine"));
    }
    let half = |at: usize| {
        let b = [head[at], head[at + 1]];
        if ELFDATA == 1 {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        }
    };
    const ET_DYN: u16 = 3;
    if half(16) != ET_DYN {
        return Err(refuse("an ELF file of another type"));
    }
    let machine: Option<u16> = if cfg!(target_arch = "x86_64") {
        Some(62)
    } else if cfg!(target_arch = "aarch64") {
        Some(183)
    } else {
        None
    };
    if machine.is_some_and(|m| half(18) != m) {
        return Err(refuse("built for another architecture"));
    }
    // Any other library (`libm.so.6`) would load and guard nothing: gpuguard's own
    // exports name it, in its dynamic string table.
    let mut all = Vec::new();
    gpuguard_core::regular_file::open(lib)
        .and_then(|f| f.take(MAX_LIB_BYTES).read_to_end(&mut all))
        .map_err(|e| refuse(&format!("cannot read it: {e}")))?;
    if !all.windows(EXPORT.len()).any(|w| w == EXPORT) {
        return Err(Failure::Input(format!(
            "{} is a shared library but not gpuguard's (it exports no gpuguard_version); set {LIB_VAR} to the path of libgpuguard.so",
            shown(lib)
        )));
    }
    Ok(())
}

/// A name only gpuguard's library exports, as its dynamic string table holds it.
const EXPORT: &[u8] = b"\0gpuguard_version\0";
/// The most of a library read for that name (gpuguard's, with debug lines, is ~14 MB).
const MAX_LIB_BYTES: u64 = 256 << 20;

/// `gpuguard lib`: the path, for `LD_PRELOAD=$(gpuguard lib) python train.py`.
pub fn main() -> Outcome {
    let path = find()?;
    print(&format!("{}\n", path.display()))?;
    Ok(0)
}
