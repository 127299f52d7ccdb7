//! gpuguard: loaded with `LD_PRELOAD=libgpuguard.so` into a CUDA process, it sees every
//! device allocation and free, keeps the books, and writes leak reports.
//!
//! This crate is the preload library: `shim` holds every piece of unsafe FFI (hooks,
//! signals, fork, exit). The books, caps, configuration and report model are safe
//! Rust in the `gpuguard-core` crate (`crates/core`), shared with the `gpuguard`
//! command.

pub mod shim;
