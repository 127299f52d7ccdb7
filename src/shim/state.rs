//! The lifecycle state: INERT at load -> ACTIVE at the first CUDA call gpuguard
//! tracks -> DISABLED if gpuguard itself failed; and the books of the ACTIVE
//! process. What activation starts (the helper thread) is `lifecycle`'s, which passes
//! it in, so this layer knows nothing above it.

use super::books::Books;
use super::settings::{LogLevel, log};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering::*};

const INERT: u8 = 0;
const ACTIVE: u8 = 1;
const DISABLED: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(INERT);
static ACTIVATING: AtomicBool = AtomicBool::new(false);
static BOOKS: AtomicPtr<Books> = AtomicPtr::new(std::ptr::null_mut());

/// The books, activating gpuguard on first use: the thread that activates it runs
/// `on_activation` (shielded) once the books exist. `None` once disabled.
#[inline]
pub(crate) fn books_or_activate(on_activation: fn()) -> Option<&'static Books> {
    if STATE.load(Acquire) == ACTIVE {
        active_books()
    } else {
        activate(on_activation)
    }
}

/// The books only if gpuguard is already active (never activates).
pub(crate) fn active_books() -> Option<&'static Books> {
    if STATE.load(Acquire) != ACTIVE {
        return None;
    }
    // SAFETY: BOOKS is set before STATE becomes ACTIVE and is never freed.
    unsafe { BOOKS.load(Acquire).as_ref() }
}

#[cold]
fn activate(on_activation: fn()) -> Option<&'static Books> {
    loop {
        match STATE.load(Acquire) {
            ACTIVE => return active_books(),
            DISABLED => return None,
            _ => {}
        }
        if ACTIVATING
            .compare_exchange(false, true, AcqRel, Acquire)
            .is_ok()
        {
            if STATE.load(Acquire) == INERT {
                quiet_panics();
                BOOKS.store(Box::into_raw(Box::new(Books::new())), Release);
                STATE.store(ACTIVE, Release);
                shielded(on_activation);
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
            if STATE.swap(DISABLED, AcqRel) != DISABLED {
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
    BOOKS.store(std::ptr::null_mut(), Release);
    ACTIVATING.store(false, Release);
    if STATE.load(Acquire) == ACTIVE {
        STATE.store(INERT, Release);
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
