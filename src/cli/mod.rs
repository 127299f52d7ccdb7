//! The `gpuguard` command's subcommands, one module each, and what they share.
//!
//! Adding a subcommand: one variant in `main.rs`'s `Command` enum and one module here
//! with a `pub fn main(args) -> Outcome`.

/// `writeln!` into a `String`, which cannot fail.
macro_rules! put {
    ($out:expr) => {{
        $out.push('\n');
    }};
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}

pub mod diff;
pub mod flamegraph;
pub mod fleet;
pub mod group;
pub mod growth;
pub mod holders;
pub mod json;
pub mod lib_path;
pub mod load;
pub mod metrics;
pub mod output;
pub mod plot;
pub mod procs;
pub mod ps;
pub mod refusals;
pub mod report_name;
pub mod run;
pub mod show;
pub mod text;
pub mod trend;
pub mod trim;
pub mod trim_report;
pub mod words;

/// Exit status when a check the user asked for failed (`diff --fail-on-growth`).
pub const EXIT_CHECK_FAILED: u8 = 1;
/// Exit status for bad usage or input that cannot be read as a report.
pub const EXIT_USAGE: u8 = 2;
/// Exit status when stdout was closed under us (`gpuguard show r.json | head -1`):
/// what a shell shows for a program ended by SIGPIPE.
pub const EXIT_BROKEN_PIPE: u8 = 128 + 13;

/// Why a subcommand stopped short of its work.
#[derive(Debug)]
pub enum Failure {
    /// Bad usage or unreadable input: the message goes to stderr, status 2.
    Input(String),
    /// A check the user asked for failed: the message goes to stderr, status 1.
    Check(String),
    /// Writing the output failed; anything worth saying was said. The status to end with.
    Output(u8),
}

impl Failure {
    pub fn status(&self) -> u8 {
        match self {
            Failure::Input(_) => EXIT_USAGE,
            Failure::Check(_) => EXIT_CHECK_FAILED,
            Failure::Output(status) => *status,
        }
    }
}

/// What a subcommand returns: the exit status on success (`run` passes its command's
/// status through; the others return 0), else why it failed.
pub type Outcome = Result<u8, Failure>;
