//! gpuguard: loaded with `LD_PRELOAD=libgpuguard.so` into a CUDA process, it sees every
//! device allocation and free, keeps the books, and writes leak reports.
//!
//! Layout: `shim` holds every piece of unsafe FFI (hooks, signals, fork, exit); the
//! rest is safe Rust with unit tests: `config` (variables), `cap` (`GPUGUARD_CAP`), `ledger` (live allocations
//! and counters), `sites` (interned call stacks), `symbols` (ELF function names), `vmm` (mappings of VMM handles), `report` (the JSON model shared with
//! the CLI) and `reporter` (ledger -> report -> file).

pub mod cap;
pub mod classify;
pub mod config;
pub mod ledger;
pub mod report;
pub mod reporter;
pub mod shim;
pub mod sites;
pub mod symbols;
pub mod vmm;
