//! Everything that touches the process: load-time setup, the lifecycle, signals, fork,
//! exit, and the hooks. All `unsafe` FFI of gpuguard lives under this module.
//!
//! Lifecycle: INERT at load (no thread, no file, no output) -> ACTIVE at the first CUDA
//! call that gpuguard tracks (books created, helper thread started) -> DISABLED if
//! gpuguard itself failed (every hook then passes straight through). A forked child
//! starts INERT again with fresh books.

// Under `cargo test` the exports are not exported (a test binary must not interpose
// on itself), so much of this module is unreachable there.
#![cfg_attr(test, allow(dead_code))]

// The layers, each using only those listed before it (`rust-import-cycles.py`
// finds no circle):
// - `fault`: test-only fault injection (a constant `false` in production builds).
// - `sys`, `real`, `table`, `wake`: the C library, the real CUDA functions, the list
//   of hooked functions, the helper thread's doorbell; no state of gpuguard's.
// - `endings`: the end of a process (ending signals' handler, waiting for the helper
//   thread to finish what it was asked before the exit report).
// - `settings`, `unwind`, `python::api`, `python::frames`: configuration and log
//   lines; stack capture; the CPython functions, and the Python frames hooks read.
// - `books`, `caps`: the process's books and the cap logic on them.
// - `state`: the lifecycle state and the books of the active process.
// - `report`: building and writing reports.
// - `python`, `trim`, `worker`: the bridge to the Python side, trims, the helper
//   thread and its signals.
// - `lifecycle`: load, activation (which starts the helper thread), fork, exit.
// - `track`: what a hook does around the real call (the hot path).
// - `hooks`, `capi`: the FFI surface (the exports).
mod books;
pub mod capi;
mod caps;
mod endings;
mod fault;
pub mod hooks;
mod lifecycle;
mod python;
mod real;
mod report;
mod settings;
mod state;
mod sys;
mod table;
mod track;
mod trim;
mod unwind;
mod wake;
mod worker;
