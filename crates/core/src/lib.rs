//! gpuguard's safe core, shared by the preload library (`libgpuguard.so`) and the
//! `gpuguard` command. No FFI and no `unsafe` here: every module is plain Rust with
//! unit tests.
//!
//! - `config` (the `GPUGUARD_*` variables), `cap` (`GPUGUARD_CAP`);
//! - `ledger` (live allocations and per-device counters), `sites` (interned call
//!   stacks), `sampler` (which allocations get a stack), `vmm` (mappings of VMM
//!   handles);
//! - `report` (the JSON model the library writes and the command reads), `reporter`
//!   (ledger -> report -> file), `report_stream` (reading a report keeping a few of
//!   its live allocations), `classify` (frameworks' blocks joined to a report),
//!   `symbols` (ELF function names), `pylines` (Python line tables), `growth`
//!   (which call sites look like leaks across a series of reports), `oom` (an
//!   `oom` report's answer and suggestion);
//! - `trace` (the memory timeline file, `GPUGUARD_TRACE`), `status` (the per-process
//!   status files `gpuguard ps` lists), `regular_file` (opening files without
//!   blocking, regular files only);
//! - `escape` (control characters escaped for the terminal);
//! - `group` (one budget shared by a group of processes: a file mapped by each).
//!
//! No unsafe code, but in `group`: mapping the shared file (`mmap`) and reading it
//! as atomics is the one thing safe Rust cannot say.

#![deny(unsafe_code)]

pub mod cap;
pub mod classify;
pub mod config;
pub mod escape;
#[allow(unsafe_code)]
pub mod group;
pub mod group_name;
pub mod growth;
pub mod ledger;
pub mod oom;
pub mod pylines;
pub mod regular_file;
pub mod report;
pub mod report_stream;
pub mod reporter;
pub mod sampler;
pub mod sites;
pub mod status;
pub mod symbols;
pub mod trace;
pub mod vmm;
