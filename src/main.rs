//! The `gpuguard` command: read reports, and run programs under the library.
//!
//! This file holds the command line (clap definitions) and the dispatch; each
//! subcommand lives in its own module under `src/cli/`. Adding a subcommand: one
//! variant in [`Command`] and one module. The report model and the parsing of
//! `GPUGUARD_*` variables are shared with the library through `gpuguard-core`.

mod cli;

use clap::{Parser, Subcommand};
use cli::output::{print, print_err, warn};
use cli::{EXIT_USAGE, Failure, Outcome};
use std::process::ExitCode;

const EXIT_CODES: &str = "\
Exit status:
  0    success
  1    a check failed (diff --fail-on-growth)
  2    wrong usage, or input that cannot be read as a report (or trace),
       or a group (gpuguard group) that does not exist or cannot be used
  141  stdout was closed early (e.g. piped into head)
  run ends with its command's status (128+N when signal N ended it)";

/// Guard CUDA memory: run programs under libgpuguard.so, read its reports.
#[derive(Parser)]
#[command(name = "gpuguard", version, after_help = EXIT_CODES, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run COMMAND with libgpuguard.so preloaded; summarise its reports when it ends
    Run(cli::run::RunArgs),
    /// Render reports: a table per device, the lines holding the most, suspected leaks
    Show(cli::show::ShowArgs),
    /// Compare two reports: per device totals and call sites that grew or shrank
    Diff(cli::diff::DiffArgs),
    /// Trim a running process's framework caches and CUDA pools; print what came back
    Trim(cli::trim::TrimArgs),
    /// Print the path of libgpuguard.so (LD_PRELOAD=$(gpuguard lib) python train.py)
    Lib,
    /// Draw a trace (GPUGUARD_TRACE) as memory over time per device, in an SVG file
    Plot(cli::plot::PlotArgs),
    /// Show a report's live memory as a flame graph, in one self-contained HTML page
    Flamegraph(cli::flamegraph::FlamegraphArgs),
    /// List this user's processes running gpuguard: devices, live, peak, caps
    Ps(cli::ps::PsArgs),
    /// Export every guarded process's memory, caps, trims and leaks to Prometheus
    Metrics(cli::metrics::MetricsArgs),
    /// Show a group's shared budget (GPUGUARD_GROUP) and its members; change it with --cap
    Group(cli::group::GroupArgs),
}

/// clap's help and version go to stdout, its usage errors to stderr; both through
/// the checked writers, so a closed pipe ends the command quietly.
fn clap_exit(e: clap::Error) -> ExitCode {
    let text = e.render().to_string();
    if e.use_stderr() {
        print_err(&text);
        return ExitCode::from(EXIT_USAGE);
    }
    match print(&text) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => ExitCode::from(failure.status()),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_exit(e),
    };
    let outcome: Outcome = match cli.command {
        Command::Run(args) => cli::run::main(args),
        Command::Show(args) => cli::show::main(args),
        Command::Diff(args) => cli::diff::main(args),
        Command::Trim(args) => cli::trim::main(args),
        Command::Lib => cli::lib_path::main(),
        Command::Plot(args) => cli::plot::main(args),
        Command::Flamegraph(args) => cli::flamegraph::main(args),
        Command::Ps(args) => cli::ps::main(args),
        Command::Metrics(args) => cli::metrics::main(args),
        Command::Group(args) => cli::group::main(args),
    };
    match outcome {
        Ok(status) => ExitCode::from(status),
        Err(failure) => {
            if let Failure::Input(message) | Failure::Check(message) = &failure {
                warn(message);
            }
            ExitCode::from(failure.status())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
