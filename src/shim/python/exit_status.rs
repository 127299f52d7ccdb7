//! The interpreter's note that the program ended by an unhandled KeyboardInterrupt,
//! kept across gpuguard's Python code.
//!
//! CPython, after an unhandled KeyboardInterrupt, finalizes and then ends the process
//! by SIGINT (as Ctrl-C would have), if the note is still set then. It clears the
//! note whenever code runs from a string (`PyRun_*`, so `exec` and `eval` of a
//! string, as `collections.namedtuple` does at the first import of a module that
//! defines one). gpuguard's Python code runs after the program's end too (Python's
//! `atexit`, a call queued before the end), so what it imports must not turn the
//! SIGINT ending into exit status 1.

use super::api::Api;
use super::layout;
use std::ffi::c_int;
use std::sync::OnceLock;

/// The note, if it is set and known, kept while gpuguard's Python code runs.
pub(super) struct ExitStatusKept {
    flag: Option<*mut c_int>,
}

/// Where the note is, for this interpreter (None: not known, left alone).
static INTERRUPT_FLAG: OnceLock<Option<usize>> = OnceLock::new();

impl ExitStatusKept {
    /// GIL held. Keeps the note only where it is set and Python agrees that the
    /// program's last unhandled exception was a KeyboardInterrupt.
    pub(super) fn new(a: &Api) -> ExitStatusKept {
        // SAFETY: Python is initialized (the GIL is held); reads of an int the
        // interpreter owns, and of `sys.last_type` (a borrowed reference).
        let flag = unsafe {
            INTERRUPT_FLAG
                .get_or_init(|| layout::interrupt_flag().map(|p| p as usize))
                .map(|p| p as *mut c_int)
                .filter(|&p| {
                    std::ptr::read_volatile(p) == 1
                        && (a.sys_get)(c"last_type".as_ptr()) == a.keyboard_interrupt
                })
        };
        ExitStatusKept { flag }
    }

    /// Runs `f`, then sets the note again if `f` cleared it.
    pub(super) fn run<R>(self, f: impl FnOnce() -> R) -> R {
        let r = f();
        if let Some(p) = self.flag {
            // SAFETY: the interpreter's own int, found set before `f` ran; the GIL
            // is held.
            unsafe {
                if std::ptr::read_volatile(p) == 0 {
                    std::ptr::write_volatile(p, 1);
                }
            }
        }
        r
    }
}
