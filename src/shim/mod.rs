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
// - `sys`, `real`, `table`, `wake`: the C library, the real CUDA functions, the list
//   of hooked functions, the helper thread's doorbell; no state of gpuguard's.
// - `line`, `events`, `control`, `tags`: heap-free log lines (a threshold crossing),
//   what the timeline learns from reports and warnings, the C API's requests to the
//   helper, the threads' phase labels.
// - `settings`, `unwind`, `python::api`, `python::frames`: configuration and log
//   lines; stack capture; the CPython functions, and the Python frames hooks read.
// - `books`, `caps`: the process's books and the cap logic on them.
// - `state`: the lifecycle state and the books of the active process.
// - `symbolize`, `report`: frames as text (symbols, DWARF lines, demangling);
//   building and writing reports.
// - `python`, `trim`, `observe`, `worker`: the bridge to the Python side, trims, the
//   timeline, status file and memory line, the helper thread and its signals.
// - `lifecycle`: load, activation (which starts the helper thread), fork, exit.
// - `track`: what a hook does around the real call (the hot path).
// - `hooks`, `capi`: the FFI surface (the exports).
mod books;
pub mod capi;
mod caps;
mod control;
mod events;
pub mod hooks;
mod lifecycle;
mod line;
mod observe;
mod python;
mod real;
mod report;
mod settings;
mod state;
mod symbolize;
mod sys;
mod table;
mod tags;
mod track;
mod trim;
mod unwind;
mod wake;
mod worker;
