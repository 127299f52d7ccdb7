//! Opening the files gpuguard writes or reads for itself (the trace, a trace's
//! owner check, a module's symbols) so that no open can block and nothing but a
//! regular file is used. `open(2)` of a FIFO waits for the other end: a
//! `GPUGUARD_TRACE` naming a FIFO nobody reads would stop the helper thread there
//! for ever, holding what the exit then waits for. So every open is `O_NONBLOCK`
//! (a FIFO opens at once, or fails with `ENXIO` when written to without a reader),
//! the file's type is looked at before the open (a device is never opened at all)
//! and again on the descriptor (the name may change in between), and anything but a
//! regular file is refused with an error that says what it is.
//!
//! `O_NONBLOCK` stays set: it changes nothing for a regular file.

use std::fs::{File, FileType, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Opens `path` for writing, creating it (mode 0600) if absent, never through a
/// symlink; emptied when `truncate`. Refused unless it is a regular file.
pub fn create(path: &Path, truncate: bool) -> io::Result<File> {
    refuse_if_not_regular(std::fs::symlink_metadata(path).map(|m| m.file_type()))?;
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            // Swapped for a FIFO without a reader (or a socket) since the look.
            Some(libc::ENXIO) => {
                match refuse_if_not_regular(std::fs::symlink_metadata(path).map(|m| m.file_type()))
                {
                    Err(not_regular) => not_regular,
                    Ok(()) => e,
                }
            }
            _ => e,
        })?;
    let meta = file.metadata()?;
    refuse_if_not_regular(Ok(meta.file_type()))?;
    // Written in place, so only a file of this user's with no other name: another
    // user's file (a name planted in a shared directory) would receive the program's
    // paths and argv, and a hard link would carry the writing to a file elsewhere.
    use std::os::unix::fs::MetadataExt;
    if meta.uid() != std::fs::metadata("/proc/self")?.uid() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "it belongs to another user",
        ));
    }
    if meta.nlink() > 1 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "it has other hard links",
        ));
    }
    if truncate {
        // After the check: O_TRUNC would have emptied whatever the name was then.
        file.set_len(0)?;
    }
    Ok(file)
}

/// Opens `path` for reading, following symlinks, refused unless it is a regular
/// file.
pub fn open(path: &Path) -> io::Result<File> {
    refuse_if_not_regular(std::fs::metadata(path).map(|m| m.file_type()))?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    refuse_if_not_regular(file.metadata().map(|m| m.file_type()))?;
    Ok(file)
}

/// Whether `path` names a regular file (following symlinks); asks nothing that
/// could block.
pub fn is_regular(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// `Ok` for a regular file or a name that does not exist yet; the refusal for
/// anything else (`ty` is the file's type as looked up).
fn refuse_if_not_regular(ty: io::Result<FileType>) -> io::Result<()> {
    match ty {
        Ok(t) if t.is_file() => Ok(()),
        Ok(t) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("it is {}, not a regular file", kind(t)),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// What a file that is not a regular one is, for a message (`a FIFO`).
pub fn kind(t: FileType) -> &'static str {
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "a special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::path::PathBuf;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "gpuguard-regular-test-{}-{tag}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn fifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    }

    #[test]
    fn a_fifo_without_a_reader_is_refused_at_once_and_said() {
        let dir = scratch("fifo");
        let p = dir.join("t.json");
        fifo(&p);
        for e in [create(&p, true).unwrap_err(), open(&p).unwrap_err()] {
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert_eq!(e.to_string(), "it is a FIFO, not a regular file");
        }
        let e = create(Path::new("/dev/null"), false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "it is a character device, not a regular file"
        );
        assert!(open(&dir).is_err());
        assert!(!is_regular(&p));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn regular_files_are_created_truncated_and_read() {
        let dir = scratch("file");
        let p = dir.join("t.json");
        create(&p, true)
            .unwrap()
            .write_all(b"first, longer")
            .unwrap();
        create(&p, true).unwrap().write_all(b"second").unwrap();
        let mut text = String::new();
        open(&p).unwrap().read_to_string(&mut text).unwrap();
        assert_eq!(text, "second");
        assert!(is_regular(&p));
        // Never written through a symlink.
        let link = dir.join("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(create(&link, true).is_err());
        assert_eq!(std::fs::read(&p).unwrap(), b"second");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_with_another_name_or_of_another_user_is_not_written() {
        let dir = scratch("owner");
        let victim = dir.join("victim");
        std::fs::write(&victim, b"VICTIM").unwrap();
        let hard = dir.join("trace.json");
        std::fs::hard_link(&victim, &hard).unwrap();
        let e = create(&hard, true).unwrap_err();
        assert!(e.to_string().contains("other hard links"), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"VICTIM");
        use std::os::unix::fs::MetadataExt;
        if std::fs::metadata("/proc/self").unwrap().uid() == 0 {
            let theirs = dir.join("theirs.json");
            std::fs::write(&theirs, b"THEIRS").unwrap();
            std::os::unix::fs::chown(&theirs, Some(4242), Some(4242)).unwrap();
            let e = create(&theirs, true).unwrap_err();
            assert!(e.to_string().contains("another user"), "{e}");
            assert_eq!(std::fs::read(&theirs).unwrap(), b"THEIRS");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
