//! Every byte the command writes goes through here, so a closed pipe or a full disk
//! ends the command with a status instead of a panic (Rust ignores SIGPIPE, and
//! `print!` panics on a failed write, which the release profile turns into an abort).

use super::{EXIT_BROKEN_PIPE, EXIT_USAGE, Failure};
use std::io::Write;

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
