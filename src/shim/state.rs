//! The lifecycle state: INERT at load -> ACTIVE at the first CUDA call gpuguard
//! tracks -> DISABLED if gpuguard itself failed; and the books of the ACTIVE
//! process. What activation starts (the helper thread) belongs to the service above:
//! `lifecycle` registers it once at load (`on_activation`), so the hot path asks this
//! layer for the books and never imports the service.

use super::books::Books;
use super::hot::HOT;
use super::settings::{LogLevel, log};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering::*, fence};

const INERT: u8 = 0;
const ACTIVE: u8 = 1;
const DISABLED: u8 = 2;

// The state and the books' address are on the hot line (`hot`): `HOT.state`,
// `HOT.books` (a `Books`).
static ACTIVATING: AtomicBool = AtomicBool::new(false);
/// What activation starts, registered once at load by the service (`lifecycle`).
static ACTIVATION_ACTION: OnceLock<fn()> = OnceLock::new();
/// Whether this process's activation action has run (reset in a forked child).
static ACTION_RAN: AtomicBool = AtomicBool::new(false);

/// The books, activating gpuguard on first use: the thread that activates it runs
/// the registered activation action (shielded) once the books exist. `None` once
/// disabled.
#[inline]
pub(crate) fn books() -> Option<&'static Books> {
    if HOT.state.load(Acquire) == ACTIVE && !super::wake::helper_missing() {
        // SAFETY: HOT.books is set before HOT.state becomes ACTIVE and is never freed.
        return unsafe { HOT.books.load(Acquire).cast::<Books>().as_ref() };
    }
    books_slow()
}

/// `books` when gpuguard is not active yet, or its helper thread is missing: out of
/// line, so the hot path inlines only the two loads above.
#[cold]
#[inline(never)]
fn books_slow() -> Option<&'static Books> {
    if HOT.state.load(Acquire) == ACTIVE {
        if super::wake::helper_missing() {
            shielded(super::wake::retry);
        }
        active_books()
    } else {
        activate()
    }
}

/// Registers what activation starts; called once, at load, from the service layer
/// (cold path). Should a CUDA call have activated gpuguard before (another library's
/// constructor ran first), the action runs now.
pub(crate) fn on_activation(action: fn()) {
    let _ = ACTIVATION_ACTION.set(action);
    fence(SeqCst);
    run_activation_action();
}

/// Runs the activation action once per process, once both gpuguard is ACTIVE and the
/// action is registered. Called after each of the two happens, each side behind a
/// SeqCst fence, so at least one of them sees both.
fn run_activation_action() {
    if HOT.state.load(Acquire) != ACTIVE {
        return;
    }
    let Some(action) = ACTIVATION_ACTION.get() else {
        return;
    };
    if ACTION_RAN
        .compare_exchange(false, true, AcqRel, Acquire)
        .is_ok()
    {
        shielded(action);
    }
}

/// The books only if gpuguard is already active (never activates).
pub(crate) fn active_books() -> Option<&'static Books> {
    if HOT.state.load(Acquire) != ACTIVE {
        return None;
    }
    // SAFETY: HOT.books is set before HOT.state becomes ACTIVE and is never freed.
    unsafe { HOT.books.load(Acquire).cast::<Books>().as_ref() }
}

#[cold]
fn activate() -> Option<&'static Books> {
    loop {
        match HOT.state.load(Acquire) {
            ACTIVE => return active_books(),
            DISABLED => return None,
            _ => {}
        }
        if ACTIVATING
            .compare_exchange(false, true, AcqRel, Acquire)
            .is_ok()
        {
            if HOT.state.load(Acquire) == INERT {
                quiet_panics();
                super::sys::calibrate_clock();
                HOT.books
                    .store(Box::into_raw(Box::new(Books::new())).cast(), Release);
                // Before any thread sees the books active: a device's first use,
                // on whichever thread, must find the group joined.
                shielded(super::group::join_at_activation);
                // Not over a DISABLED that a panic in the join left.
                let _ = HOT.state.compare_exchange(INERT, ACTIVE, AcqRel, Acquire);
                fence(SeqCst);
                run_activation_action();
                log(LogLevel::Info, format_args!("active: first CUDA call seen"));
            }
            ACTIVATING.store(false, Release);
        } else {
            std::thread::yield_now();
        }
    }
}

/// Runs gpuguard's own logic; a panic in it disables gpuguard instead of unwinding
/// into the program (the real CUDA call has already happened, or will happen anyway).
pub(crate) fn shielded<R>(f: impl FnOnce() -> R) -> Option<R> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => Some(r),
        Err(_) => {
            if HOT.state.swap(DISABLED, AcqRel) != DISABLED {
                let what = PANIC_TEXT
                    .try_lock()
                    .ok()
                    .and_then(|mut t| t.take())
                    .unwrap_or_default();
                log(
                    LogLevel::Warn,
                    format_args!(
                        "internal error ({what}); tracking is off for the rest of this process, every CUDA call goes straight through"
                    ),
                );
            }
            None
        }
    }
}

/// In a forked child: the parent's books are forgotten and the child starts INERT
/// (a DISABLED parent stays disabled in the child).
pub(crate) fn forget_after_fork() {
    HOT.books.store(std::ptr::null_mut(), Release);
    ACTIVATING.store(false, Release);
    ACTION_RAN.store(false, Release);
    if HOT.state.load(Acquire) == ACTIVE {
        HOT.state.store(INERT, Release);
    }
}

/// The text of the last panic in gpuguard, for its one message.
static PANIC_TEXT: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Panics in gpuguard print nothing themselves: `shielded` says it once, in one
/// line. (The hook belongs to gpuguard's own copy of the Rust runtime, never the
/// program's.)
pub(crate) fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            if let Ok(mut t) = PANIC_TEXT.try_lock() {
                *t = Some(info.to_string().replace('\n', " "));
            }
        }));
    });
}
