//! Trims: framework caches and CUDA pools handed back to the driver, on the trim
//! signal, `GPUGUARD_TRIM_AT`, or a cap refusal. Runs on the helper thread only.
//!
//! Order: the Python side first (PyTorch's `empty_cache()`, CuPy's `free_all_blocks()`:
//! what they free may land in a CUDA pool), then every known pool trimmed to zero.
//! Before and after are gpuguard's own count of what the process holds from the
//! driver (live bytes plus pools' unused bytes), measured on every device it has seen.

use super::books::Books;
use super::python::{self, Outcome};
use gpuguard_core::report::{TrimDevice, TrimMechanism, TrimReport};
use serde::Deserialize;
use std::time::Duration;

/// How long a trim waits for the main thread to run its Python part.
const PYTHON_WAIT: Duration = Duration::from_secs(10);

#[derive(Deserialize)]
struct PyMechanism {
    name: String,
    status: String,
    #[serde(default)]
    released_bytes: u64,
    #[serde(default)]
    detail: Option<String>,
}

/// Runs one trim and returns its account (`merged` is filled in by the caller).
pub(super) fn perform(books: &Books, trigger: &str) -> TrimReport {
    perform_with(books, trigger, true)
}

/// A trim; without `python`, CUDA pools only (the main thread waits for this trim,
/// so it cannot run the Python side).
pub(super) fn perform_with(books: &Books, trigger: &str, python: bool) -> TrimReport {
    let devices = books.ledger.seen_devices();
    let before: Vec<u64> = devices.iter().map(|&d| books.held(d)).collect();
    let mut mechanisms = Vec::new();

    let outcome = if python {
        python::run(&python::call("_gg_trim", &devices), Some(PYTHON_WAIT))
    } else {
        Outcome::Absent
    };
    if let Outcome::Answer(text) = &outcome {
        match serde_json::from_str::<Vec<PyMechanism>>(text) {
            Ok(ms) => mechanisms.extend(ms.into_iter().map(|m| TrimMechanism {
                name: m.name,
                status: m.status,
                released_bytes: m.released_bytes,
                detail: m.detail,
            })),
            Err(e) => mechanisms.push(TrimMechanism {
                name: "python".into(),
                status: "error".into(),
                released_bytes: 0,
                detail: Some(format!("unreadable answer: {e}")),
            }),
        }
    }

    let has_framework = !mechanisms.is_empty();
    let mid: Vec<u64> = devices.iter().map(|&d| books.held(d)).collect();
    let pools: usize = devices.iter().map(|&d| books.trim_pools(d)).sum();
    let after: Vec<u64> = devices.iter().map(|&d| books.held(d)).collect();
    let pool_released: u64 = mid
        .iter()
        .zip(&after)
        .map(|(m, a)| m.saturating_sub(*a))
        .sum();
    mechanisms.insert(
        0,
        TrimMechanism {
            name: "cuda_pools".into(),
            status: if pools > 0 { "trimmed" } else { "none" }.into(),
            released_bytes: pool_released,
            detail: Some(if pools > 0 {
                format!("{pools} stream-ordered pool(s) trimmed to 0 (cuMemPoolTrimTo)")
            } else {
                "no stream-ordered memory pool in use".into()
            }),
        },
    );

    let released = before
        .iter()
        .zip(&after)
        .map(|(b, a)| b.saturating_sub(*a))
        .sum();
    TrimReport {
        trigger: trigger.into(),
        merged: 1,
        python: match outcome {
            _ if !python => {
                "skipped (asked from the main thread, which waits for the trim: CUDA pools only)"
                    .into()
            }
            Outcome::Absent => "absent (no Python in this process: CUDA pools only)".into(),
            Outcome::NotRunning => "not running (no interpreter: CUDA pools only)".into(),
            Outcome::Finalizing => "finalizing (the interpreter is shutting down: skipped)".into(),
            Outcome::Answer(_) if !has_framework => {
                "ran (no PyTorch, CuPy, JAX or TensorFlow in this process: CUDA pools only)".into()
            }
            o => o.status(),
        },
        devices: devices
            .iter()
            .zip(before.iter().zip(&after))
            .map(|(&device, (&b, &a))| TrimDevice {
                device,
                before_bytes: b,
                after_bytes: a,
            })
            .collect(),
        released_bytes: released,
        mechanisms,
    }
}
