//! Trims: framework caches and CUDA pools handed back to the driver, on the trim
//! signal, `GPUGUARD_TRIM_AT`, a cap refusal or the C API. Runs on the helper thread
//! (or, without its Python part, on a main thread that asked through the C API).
//!
//! Order: the Python side first (PyTorch's `empty_cache()`, CuPy's `free_all_blocks()`:
//! what they free may land in a CUDA pool), then every known pool trimmed to zero.
//! Before and after are gpuguard's own count of what the process holds from the
//! driver (live bytes plus pools' unused bytes), measured on every device it has seen.
//!
//! Never while a stream of the process is in CUDA graph capture: `empty_cache()`
//! synchronizes the device and a pool trim is no stream-ordered call, and either
//! breaks the capture. `attempt` then does nothing and says so; the helper thread
//! holds the trim until no stream captures (`worker`), at most `CAPTURE_WAIT`, after
//! which `skipped` writes its account.

use super::books::Books;
use super::capture;
use super::python::{self, Outcome};
use gpuguard_core::report::{TrimDeferral, TrimDevice, TrimMechanism, TrimReport};
use serde::Deserialize;
use std::time::Duration;

/// How long a trim waits for the main thread to run its Python part.
const PYTHON_WAIT: Duration = Duration::from_secs(10);

/// The longest a trim waits for the program's CUDA graph captures to end.
pub(super) const CAPTURE_WAIT: Duration = Duration::from_secs(5);

#[derive(Deserialize)]
struct PyMechanism {
    name: String,
    status: String,
    #[serde(default)]
    released_bytes: u64,
    #[serde(default)]
    detail: Option<String>,
}

/// What an attempt at a trim came to.
pub(super) enum Attempt {
    Done(TrimReport),
    /// A stream was in CUDA graph capture: nothing was trimmed; try again later.
    Capturing,
}

/// Runs one trim unless a stream is in CUDA graph capture, and returns its account
/// (`merged` is filled in by the caller). Without `python`, CUDA pools only (the main
/// thread waits for this trim, so it cannot run the Python side). `waited`: how long
/// it was held for captures to end, if it was.
pub(super) fn attempt(
    books: &Books,
    trigger: &str,
    python: bool,
    waited: Option<Duration>,
) -> Attempt {
    if capture::active() > 0 {
        return Attempt::Capturing;
    }
    let devices = books.ledger.seen_devices();
    let before: Vec<u64> = devices.iter().map(|&d| books.held(d)).collect();
    let mut mechanisms = Vec::new();

    let outcome = if python {
        python::run_guarded(&python::call("_gg_trim", &devices), Some(PYTHON_WAIT))
    } else {
        Outcome::Absent
    };
    if outcome == Outcome::Capturing {
        // A capture began before the Python part could run: nothing was done.
        return Attempt::Capturing;
    }
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
    let (pools, skipped) = devices
        .iter()
        .map(|&d| books.trim_pools(d))
        .fold((0, 0), |(t, s), (dt, ds)| (t + dt, s + ds));
    let after: Vec<u64> = devices.iter().map(|&d| books.held(d)).collect();
    let pool_released: u64 = mid
        .iter()
        .zip(&after)
        .map(|(m, a)| m.saturating_sub(*a))
        .sum();
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    mechanisms.insert(
        0,
        TrimMechanism {
            name: "cuda_pools".into(),
            status: if skipped > 0 {
                "skipped"
            } else if pools > 0 {
                "trimmed"
            } else {
                "none"
            }
            .into(),
            released_bytes: pool_released,
            detail: Some(if skipped > 0 {
                format!(
                    "{pools} stream-ordered pool{} trimmed to 0 (cuMemPoolTrimTo); {skipped} left alone: a CUDA graph capture began",
                    plural(pools)
                )
            } else if pools > 0 {
                format!(
                    "{pools} stream-ordered pool{} trimmed to 0 (cuMemPoolTrimTo)",
                    plural(pools)
                )
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
    Attempt::Done(TrimReport {
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
        deferred: waited.map(|w| TrimDeferral {
            waited_ms: w.as_millis() as u64,
            outcome: "ran".into(),
            detail: format!(
                "waited {:.1} s for a CUDA graph capture to end (a trim's calls would have broken it), then ran",
                w.as_secs_f64()
            ),
        }),
    })
}

/// Why a held trim was given up.
pub(super) enum GaveUp {
    /// Still capturing after `CAPTURE_WAIT`.
    Waited,
    /// The process is ending.
    Ending,
    /// Asked from a main thread that waits for it (the C API), which may be the very
    /// thread capturing: it cannot wait.
    MainThread,
}

/// The account of a trim given up because a stream was in CUDA graph capture: nothing
/// trimmed, no CUDA call made; the devices' figures are gpuguard's count as it stands
/// (pools as last measured).
pub(super) fn skipped(books: &Books, trigger: &str, waited: Duration, why: GaveUp) -> TrimReport {
    let devices = books.ledger.seen_devices();
    let now: Vec<u64> = devices
        .iter()
        .map(|&d| books.ledger.device(d).charged())
        .collect();
    let detail = match why {
        GaveUp::Waited => format!(
            "a CUDA graph capture was in progress for {:.1} s, the longest a trim waits; nothing was trimmed (ask again once it ended)",
            waited.as_secs_f64()
        ),
        GaveUp::Ending => {
            "a CUDA graph capture was in progress when the process ended; nothing was trimmed"
                .into()
        }
        GaveUp::MainThread => {
            "a CUDA graph capture was in progress, and the trim was asked from the main thread, which cannot wait for it; nothing was trimmed"
                .into()
        }
    };
    TrimReport {
        trigger: trigger.into(),
        merged: 1,
        python: "skipped (deferred: a CUDA graph capture was in progress)".into(),
        devices: devices
            .iter()
            .zip(&now)
            .map(|(&device, &b)| TrimDevice {
                device,
                before_bytes: b,
                after_bytes: b,
            })
            .collect(),
        released_bytes: 0,
        mechanisms: vec![TrimMechanism {
            name: "cuda_pools".into(),
            status: "skipped".into(),
            released_bytes: 0,
            detail: Some("deferred: a CUDA graph capture was in progress".into()),
        }],
        deferred: Some(TrimDeferral {
            waited_ms: waited.as_millis() as u64,
            outcome: "skipped".into(),
            detail,
        }),
    }
}
