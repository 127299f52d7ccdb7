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

// The layers, lowest first; each module uses only those of the layers below it and,
// in its own layer, those listed before it (`scripts/check-layers.py` checks it,
// `docs/architecture.md` draws it; `rust-import-cycles.py` finds no circle):
// - ffi: `fault`, `sys`, `cuda`, `wake`, `endings`, `capture`, `real`, `table`:
//   test-only fault injection (a constant `false` in production builds), the C
//   library, the CUDA/NVML types and codes (cudarc's), the helper thread's doorbell,
//   the end of a process (the ending signals' handler; waiting for the helper before
//   the exit report), the gauge of streams in CUDA graph capture, the real functions
//   (per lookup path, and gpuguard's own typed driver calls), the list of hooked
//   functions.
// - base: `line`, `events`, `control`, `tags`, `settings`, `unwind`, `python::api`,
//   `python::frames`: heap-free lines for a threshold crossing, what the timeline
//   learns from reports and warnings, the C API's requests to the helper, the threads'
//   phase labels; configuration and log lines; stack capture; the CPython functions,
//   and the Python frames hooks read.
// - books: `books`, `caps`: the process's books and the cap logic on them.
// - state: `state`: the lifecycle state, the books of the active process, and the
//   activation action the service registers at load.
// - track: `track`: what a hook does around the real call (the hot path).
// - hooks: `hooks`: the exports, the table expanded into wrappers and handlers.
// - service, beside the hot path (never imported by it, never importing it), reading
//   the books: `symbolize` (frames as text), `oom` (what an `oom` report adds: other
//   processes, the suggestion), `report`, `python` (the bridge), `trim`,
//   `observe` (trace, status file, memory line), `worker`, `lifecycle`.
// - capi: `capi`, the C API, at the top.
mod bench_switch;
mod books;
pub mod capi;
mod caps;
mod capture;
mod control;
mod cuda;
mod endings;
mod events;
mod fault;
mod group;
pub mod hooks;
mod hot;
mod lifecycle;
mod line;
mod observe;
mod oom;
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
