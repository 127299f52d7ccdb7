//! Every byte the command writes goes through here, so a closed pipe or a full disk
//! ends the command with a status instead of a panic (Rust ignores SIGPIPE, and
//! `print!` panics on a failed write, which the release profile turns into an abort),
//! and an output file is only ever a regular file replaced whole, never a link,
//! FIFO or device written through.

use super::load::shown;
use super::{EXIT_BROKEN_PIPE, EXIT_USAGE, Failure};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Writes `text` to stdout and flushes it.
pub fn print(text: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        // The reader is gone (`| head -1`): nothing left to say to anyone.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            Err(Failure::Output(EXIT_BROKEN_PIPE))
        }
        Err(e) => {
            warn(&format!("cannot write the output: {e}"));
            Err(Failure::Output(EXIT_USAGE))
        }
    }
}

/// One `gpuguard: ...` line on stderr. A failure to write it is ignored: there is
/// nowhere left to say so.
pub fn warn(message: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "gpuguard: {message}");
}

/// Text on stderr as it is (clap's usage errors carry their own layout).
pub fn print_err(text: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(text.as_bytes());
}

/// Writes a rendered view to `out`: `-` is stdout, anything else a file written by
/// [`write_file`], never the view's own `input`; says on stderr where it went.
pub fn write_view(out: &Path, input: &Path, text: &str) -> Result<(), Failure> {
    if out == Path::new("-") {
        return print(text);
    }
    refuse_unless_file(out)?;
    let same = match (std::fs::canonicalize(out), std::fs::canonicalize(input)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same {
        return Err(Failure::Input(format!(
            "{}: the output would replace the input; choose another with -o",
            shown(out)
        )));
    }
    write_file(out, text.as_bytes())?;
    warn(&format!("wrote {}", shown(out)));
    Ok(())
}

/// Puts `bytes` at `path` as a new regular file, the way the library writes its
/// reports: into a private temporary beside it (created new, never through a link,
/// mode 0600), synced, given its final mode and renamed into place, so a reader
/// never sees half a file and nothing already at `path` is written through. A
/// symbolic link, FIFO, socket, device or directory at `path` is refused without
/// being opened ([`refuse_unless_file`]); a regular file is replaced and keeps its
/// permission bits; a new file gets 0666 less the umask, as a shell redirection
/// would. The temporary is removed on any failure.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    write_with(path, |f| f.write_all(bytes))
}

/// [`write_file`] with the content written by `fill`.
fn write_with(
    path: &Path,
    fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> Result<(), Failure> {
    let kept_mode = refuse_unless_file(path)?;
    let cannot = |e: std::io::Error| Failure::Input(format!("{}: cannot write: {e}", shown(path)));
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let (temp, mut file) = create_temp(dir).map_err(cannot)?;
    let mode = kept_mode.unwrap_or(0o666 & !umask());
    let written = fill(&mut file)
        .and_then(|()| file.set_permissions(std::fs::Permissions::from_mode(mode)))
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&temp, path));
    drop(file);
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(cannot(e));
    }
    // The rename itself lasts once the directory is synced; a failure here loses
    // nothing written, so it is not one.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Refuses an output path that is not a regular file or absent, looked at without
/// following a link; the permission bits of a regular file there.
fn refuse_unless_file(path: &Path) -> Result<Option<u32>, Failure> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Failure::Input(format!(
                "{}: cannot write: {e}",
                shown(path)
            )));
        }
    };
    let kind = meta.file_type();
    if kind.is_file() {
        return Ok(Some(meta.permissions().mode() & 0o777));
    }
    if kind.is_symlink() {
        return Err(Failure::Input(format!(
            "{}: a symbolic link; gpuguard does not write through links (remove it or choose another output)",
            shown(path)
        )));
    }
    let what = gpuguard_core::regular_file::kind(kind);
    Err(Failure::Input(format!(
        "{}: {what}; gpuguard writes its output to regular files only (choose another output, or -o - for stdout)",
        shown(path)
    )))
}

/// How many temporary names are tried: each has 64 random bits, so a clash means
/// something is wrong with the directory, not bad luck.
const TEMP_ATTEMPTS: usize = 16;

/// A new private file in `dir`, `.gpuguard-out-<pid>-<random>.tmp`: created new
/// (`O_EXCL`: never onto or through anything already there), mode 0600, closed on exec.
fn create_temp(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let mut attempt = 0;
    loop {
        let temp = dir.join(format!(
            ".gpuguard-out-{}-{:016x}.tmp",
            std::process::id(),
            random_u64()
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&temp)
        {
            Ok(f) => return Ok((temp, f)),
            Err(e)
                if e.kind() == std::io::ErrorKind::AlreadyExists && attempt + 1 < TEMP_ATTEMPTS =>
            {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// 64 bits from the kernel's random source; the clock when it has none to give
/// (the name is then still unlikely to be taken, and `O_EXCL` guards it anyway).
fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into `bytes`.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got == bytes.len() as isize {
        return u64::from_ne_bytes(bytes);
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The process's umask, read from `/proc/self/status` (calling umask(2) would change
/// it, if only for a moment); 022, the usual one, when it cannot be read.
fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|m| u32::from_str_radix(m.trim(), 8).ok())
        })
        .map_or(0o022, |m| m & 0o777)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "gpuguard-output-test-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let dir = temp_dir("fail");
        let out = dir.join("page.html");
        std::fs::write(&out, "old").unwrap();
        let failed = write_with(&out, |f| {
            f.write_all(b"half")?;
            Err(std::io::Error::other("disk full"))
        });
        match failed {
            Err(Failure::Input(m)) => assert!(m.contains("cannot write: disk full"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "old");
        assert_eq!(names(&dir), ["page.html"]);
        // Into a folder that is not there: nothing made.
        assert!(write_file(&dir.join("no/page.html"), b"x").is_err());
        assert_eq!(names(&dir), ["page.html"]);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_new_file_gets_the_mode_a_shell_redirection_gives() {
        let dir = temp_dir("mode");
        let out = dir.join("plot.svg");
        write_file(&out, b"<svg/>").unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"<svg/>");
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o666 & !umask());
        assert_eq!(names(&dir), ["plot.svg"]);
        let _ = std::fs::remove_dir_all(dir);
    }
}
