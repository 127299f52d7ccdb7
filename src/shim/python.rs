//! The Python bridge: runs gpuguard's Python side (`bridge/`, its files joined in order) inside a Python
//! process, on the interpreter's main thread, through `Py_AddPendingCall`.
//!
//! Why this way: the allocation hooks run with the GIL released and possibly under a
//! framework lock, so Python is never entered from a hook; and a helper thread that
//! takes the GIL itself can be killed by the interpreter during finalization. A
//! pending call runs at the main thread's next bytecode boundary, with the GIL held
//! and no framework lock taken, exactly where a user's own `empty_cache()` would run.
//! The helper thread queues the call and waits for its answer with a timeout; a main
//! thread that never returns to Python makes the request time out, never hang.
//!
//! The CPython functions it calls are found at run time (`api`); the Python frames
//! hooks read are in `frames`.
//!
//! Why one file of about 630 lines: the request exchange, the pending call that serves
//! it on the main thread, and the exit-time handover share one protocol (who waits, who
//! cancels, what the interpreter's state allows); apart, each half would have to
//! restate it.

use super::settings::{LogLevel, log, settings};
use super::state::{active_books, shielded};
use super::{capture, endings, report};
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering::*};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

mod api;
mod exit_status;
pub(crate) mod frames;
mod layout;
pub(crate) mod names;

use api::{Api, MethodDef, Obj, api, lock};
use exit_status::ExitStatusKept;

const METH_NOARGS: c_int = 0x0004;
const METH_O: c_int = 0x0008;
const PY_FILE_INPUT: c_int = 257;

static SUBMIT_DEF: MethodDef = MethodDef {
    name: c"_gg_submit".as_ptr(),
    meth: submit as *const c_void,
    flags: METH_O,
    doc: std::ptr::null(),
};
static DEVICES_DEF: MethodDef = MethodDef {
    name: c"_gg_devices".as_ptr(),
    meth: devices as *const c_void,
    flags: METH_NOARGS,
    doc: std::ptr::null(),
};
static KEEPING_DEF: MethodDef = MethodDef {
    name: c"_gg_keeping_status".as_ptr(),
    meth: keeping_status as *const c_void,
    flags: METH_O,
    doc: std::ptr::null(),
};
static PAIRS_DEF: MethodDef = MethodDef {
    name: c"_gg_pending_pairs".as_ptr(),
    meth: pending_pairs as *const c_void,
    flags: METH_NOARGS,
    doc: std::ptr::null(),
};
static CAPTURING_DEF: MethodDef = MethodDef {
    name: c"_gg_capturing".as_ptr(),
    meth: capturing as *const c_void,
    flags: METH_NOARGS,
    doc: std::ptr::null(),
};

/// What a request answers when a stream of the process was in CUDA graph capture.
const CAPTURING: &str = "capturing";

/// What a request to the Python side came to.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Outcome {
    /// No Python in this process (or gpuguard's Python side is off).
    Absent,
    /// Python is loaded but its interpreter is not running (not yet, or any more).
    NotRunning,
    /// The interpreter is shutting down: nothing was run.
    Finalizing,
    /// A stream of the process was in CUDA graph capture: nothing was run (a
    /// framework's call could break the capture).
    Capturing,
    /// Queued; not waited for.
    Queued,
    /// The main thread did not run Python within the time allowed.
    Timeout,
    /// It ran and raised, or could not be queued.
    Failed(String),
    /// It ran; the JSON it handed back.
    Answer(String),
}

impl Outcome {
    /// The word reports use for it.
    pub fn status(&self) -> String {
        match self {
            Outcome::Absent => "absent".into(),
            Outcome::NotRunning => "not running".into(),
            Outcome::Finalizing => "finalizing".into(),
            Outcome::Capturing => "capturing".into(),
            Outcome::Queued => "queued".into(),
            Outcome::Timeout => "timeout".into(),
            Outcome::Failed(e) => format!("error: {e}"),
            Outcome::Answer(_) => "ran".into(),
        }
    }
}

/// The one request in flight, shared by the helper thread and the main thread.
struct Exchange {
    /// The call waiting to run; taken by the main thread when it runs it.
    code: Option<CString>,
    /// It may touch CUDA in a way a capture forbids (a trim): it runs only while no
    /// stream captures, and a capture that begins meanwhile waits for it
    /// (`capture::outside_capture`).
    guarded: bool,
    /// Id of the request in `code` (or running), and of the last one finished.
    queued_id: u64,
    done_id: u64,
    /// A pending call is queued with the interpreter and has not finished.
    outstanding: bool,
    /// The last finished request's answer.
    reply: Option<Result<String, String>>,
    /// The last request given up on before it started: the pending call skips it.
    cancelled: u64,
}

static EXCHANGE: Mutex<Exchange> = Mutex::new(Exchange {
    code: None,
    guarded: false,
    queued_id: 0,
    done_id: 0,
    outstanding: false,
    reply: None,
    cancelled: 0,
});
static DONE: Condvar = Condvar::new();
/// What `_gg_submit("reply\n...")` handed back during the current call.
static ANSWER: Mutex<Option<String>> = Mutex::new(None);
/// The classification taken by Python's own `atexit`, for the exit report.
static AT_EXIT: Mutex<Option<String>> = Mutex::new(None);
/// The private namespace the bridge runs in (a dict, owned, never freed).
static NAMESPACE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

const BRIDGE_SOURCE: &str = concat!(
    include_str!("bridge/base.py"),
    include_str!("bridge/threads.py"),
    include_str!("bridge/frames.py"),
    include_str!("bridge/setup.py"),
    include_str!("bridge/trim.py"),
    include_str!("bridge/classify.py"),
    include_str!("bridge/torch_window.py"),
    include_str!("bridge/cupy_window.py"),
    include_str!("bridge/exit.py"),
    "\0"
);

/// Whether this process has a running interpreter gpuguard may use.
pub(crate) fn present() -> bool {
    settings().cfg.python
        && !BROKEN.load(Relaxed)
        && api().is_some_and(|a| {
            // SAFETY: both only read the runtime's state.
            unsafe { (a.is_initialized)() != 0 && a.is_finalizing.is_none_or(|f| f() == 0) }
        })
}

/// Runs `call` (Python statements over the bridge's functions) on the main thread.
/// With `wait`, blocks for at most that long for the answer. Never call it from a
/// hook, or from a thread that may hold the GIL. While a stream of the process is in
/// CUDA graph capture nothing runs (`Outcome::Capturing`): the main thread may be the
/// one capturing, and the frameworks' own calls may touch CUDA.
pub(crate) fn run(call: &str, wait: Option<Duration>) -> Outcome {
    queue(call, wait, false)
}

/// `run` for a call that makes calls a capture forbids (a trim's `empty_cache()`):
/// checked again on the main thread right before it runs, and a capture that begins
/// while it runs waits for it (bounded; see `capture`).
pub(crate) fn run_guarded(call: &str, wait: Option<Duration>) -> Outcome {
    queue(call, wait, true)
}

fn queue(call: &str, wait: Option<Duration>, guarded: bool) -> Outcome {
    if !settings().cfg.python || BROKEN.load(Relaxed) {
        return Outcome::Absent;
    }
    let Some(a) = api() else {
        return Outcome::Absent;
    };
    // SAFETY: these only read the runtime's state. Finalizing first: an interpreter
    // shutting down already says it is not initialized.
    unsafe {
        if endings::exiting() || a.is_finalizing.is_some_and(|f| f() != 0) {
            return Outcome::Finalizing;
        }
        if (a.is_initialized)() == 0 {
            return Outcome::NotRunning;
        }
    }
    if capture::active() > 0 {
        return Outcome::Capturing;
    }
    let Ok(code) = CString::new(call) else {
        return Outcome::Failed("NUL in call".into());
    };
    let deadline = wait.map(|w| Instant::now() + w);
    log(LogLevel::Debug, format_args!("python: queueing {call}"));
    let mut ex = lock(&EXCHANGE);
    // One pending call at a time: a queued call that has not started yet is taken
    // over (what it asked is asked again later); a running one is waited for.
    while ex.outstanding && ex.code.is_none() {
        let Some(d) = deadline else {
            return Outcome::Queued;
        };
        if endings::exiting() {
            return Outcome::Finalizing;
        }
        let left = d.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Outcome::Timeout;
        }
        ex = DONE
            .wait_timeout(ex, left.min(WAIT_SLICE))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    ex.queued_id += 1;
    let id = ex.queued_id;
    ex.code = Some(code);
    ex.guarded = guarded;
    if !ex.outstanding {
        // SAFETY: documented as callable from any thread without the GIL.
        if unsafe { (a.add_pending_call)(pending, std::ptr::null_mut()) } != 0 {
            ex.code = None;
            return Outcome::Failed("the interpreter's pending-call queue is full".into());
        }
        ex.outstanding = true;
    }
    let Some(d) = deadline else {
        return Outcome::Queued;
    };
    while ex.done_id < id {
        // A request given up on is cancelled if it has not started: it must not run
        // later, unreported (a trim's `empty_cache()` in the middle of a graph
        // capture).
        if endings::exiting() {
            cancel(&mut ex, id);
            return Outcome::Finalizing;
        }
        let left = d.saturating_duration_since(Instant::now());
        if left.is_zero() {
            cancel(&mut ex, id);
            return Outcome::Timeout;
        }
        ex = DONE
            .wait_timeout(ex, left.min(WAIT_SLICE))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    if ex.done_id != id {
        // A later request took the slot over; ours never ran.
        return Outcome::Timeout;
    }
    match ex.reply.take() {
        Some(Ok(s)) => Outcome::Answer(s),
        Some(Err(e)) if e == "finalizing" => Outcome::Finalizing,
        Some(Err(e)) if e == CAPTURING => Outcome::Capturing,
        Some(Err(e)) => Outcome::Failed(e),
        None => Outcome::Failed("no answer".into()),
    }
}

/// How often a wait for the main thread looks whether the process is ending.
const WAIT_SLICE: Duration = Duration::from_millis(50);

/// Gives up request `id` if it is still queued and has not started: the pending
/// call then runs nothing (the slot stays free for the next request to take over).
fn cancel(ex: &mut Exchange, id: u64) {
    if ex.queued_id == id && ex.code.is_some() {
        ex.cancelled = id;
    }
}

/// The Python statement that calls one of the bridge's entry points with what it
/// needs to know: the devices gpuguard has seen memory on, and the stack depth (0:
/// no recorders).
/// Python frames of call sites not resolved yet go along, so they are named while
/// their code objects are alive.
pub(crate) fn call(function: &str, devices: &[i32]) -> String {
    let devices = serde_json::to_string(devices).unwrap_or_else(|_| "[]".into());
    let depth = settings().cfg.stack_depth;
    let recorders = if settings().cfg.python_recorders {
        "True"
    } else {
        "False"
    };
    let pairs = active_books()
        .map(|b| names::pairs_json(&names::unresolved(&b.sites)))
        .unwrap_or_else(|| "[]".into());
    // The snapshot interval sizes the default mode's sampling windows.
    let every = settings()
        .cfg
        .snapshot_every_ms
        .map_or_else(|| "None".to_string(), |ms| ms.to_string());
    format!(
        "{function}({{\"devices\": {devices}, \"depth\": {depth}, \"recorders\": {recorders}, \"every_ms\": {every}, \"pairs\": {pairs}}})"
    )
}

/// The classification Python's `atexit` handed over, if it ran.
pub(crate) fn at_exit_answer() -> Option<String> {
    if BROKEN.load(Relaxed) {
        return None;
    }
    lock(&AT_EXIT).clone()
}

/// Set in a forked child whose copy of the bridge's locks was taken at the fork (by
/// a thread that does not exist in the child): the bridge stays off there.
static BROKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(super) fn after_fork_in_child() {
    names::after_fork_in_child();
    // The parent's queued call is not the child's; forget it. A lock held at the
    // fork would never be released here, so only try them.
    let ok = match (EXCHANGE.try_lock(), AT_EXIT.try_lock(), ANSWER.try_lock()) {
        (Ok(mut ex), Ok(mut at_exit), Ok(mut answer)) => {
            ex.code = None;
            ex.outstanding = false;
            ex.reply = None;
            ex.done_id = ex.queued_id;
            *at_exit = None;
            *answer = None;
            true
        }
        _ => false,
    };
    BROKEN.store(!ok, Relaxed);
}

/// Why gpuguard's Python code stopped.
enum Stop {
    /// It raised; the exception is cleared: its text.
    Error(String),
    /// A KeyboardInterrupt or SystemExit came while it ran (a signal handler of the
    /// program raised it: Ctrl-C): left set, for the program to get.
    Interrupt,
}

impl From<String> for Stop {
    fn from(e: String) -> Stop {
        Stop::Error(e)
    }
}

/// The pending call, on the main thread with the GIL held. Returns -1, with the
/// exception set, when the program's KeyboardInterrupt or SystemExit came while it
/// ran: CPython then raises it in the program's code where the call ran, as it
/// would have without gpuguard.
extern "C" fn pending(_arg: *mut c_void) -> c_int {
    let interrupted = shielded(|| {
        let (code, id, guarded) = {
            let mut ex = lock(&EXCHANGE);
            let code = ex.code.take();
            // Given up on by the thread that asked: run nothing.
            let code = code.filter(|_| ex.cancelled != ex.queued_id);
            (code, ex.queued_id, ex.guarded)
        };
        // A capture may have begun since the request was queued (on this thread,
        // even): then nothing runs inside it.
        let run = |a: &Api, code: &CStr| ExitStatusKept::new(a).run(|| run_here(a, code));
        let reply = match (code, api()) {
            (Some(code), Some(a)) if guarded => capture::outside_capture(|| run(a, &code))
                .unwrap_or_else(|| Err(Stop::Error(CAPTURING.into()))),
            (Some(_), Some(_)) if capture::active() > 0 => Err(Stop::Error(CAPTURING.into())),
            (Some(code), Some(a)) => run(a, &code),
            _ => Err(Stop::Error("gpuguard: nothing to run".into())),
        };
        let (reply, interrupted) = match reply {
            Ok(s) => (Ok(s), false),
            Err(Stop::Error(e)) => (Err(e), false),
            Err(Stop::Interrupt) => (Err(INTERRUPTED.into()), true),
        };
        let mut ex = lock(&EXCHANGE);
        ex.outstanding = false;
        ex.done_id = id;
        ex.reply = Some(reply);
        DONE.notify_all();
        interrupted
    });
    // Otherwise never leave an exception set: 0 tells the interpreter all went well.
    if interrupted == Some(true) { -1 } else { 0 }
}

/// The answer of a request whose Python code the program's interrupt stopped.
const INTERRUPTED: &str = "interrupted by the program's KeyboardInterrupt or SystemExit";

/// Runs `code` in the bridge's namespace. GIL held.
fn run_here(a: &Api, code: &CStr) -> Result<String, Stop> {
    // SAFETY: the GIL is held (pending calls run with it); objects are reference
    // counted by the rules of the C API, every new reference released.
    unsafe {
        if a.is_finalizing.is_some_and(|f| f() != 0) {
            return Err(Stop::Error("finalizing".into()));
        }
        let ns = namespace(a)?;
        *lock(&ANSWER) = None;
        exec(a, code, c"<gpuguard>", ns)?;
        lock(&ANSWER)
            .take()
            .ok_or_else(|| Stop::Error("the Python side gave no answer".into()))
    }
}

/// `_gg_keeping_status(f)`: calls `f()` keeping the program's exit status (see
/// `ExitStatusKept`); Python's `atexit` calls gpuguard's exit hook through it. GIL
/// held.
extern "C" fn keeping_status(_module: Obj, f: Obj) -> Obj {
    let Some(a) = api() else {
        return std::ptr::null_mut();
    };
    // SAFETY: GIL held; `f` is a borrowed reference; the call's result (a new
    // reference or NULL with the exception set) is handed to the caller.
    let r = ExitStatusKept::new(a).run(|| unsafe { (a.call_object)(f, std::ptr::null_mut()) });
    // The exit hook stops the hooks' frame reads when it hands its answer over; if it
    // failed before that, they stop here all the same: the interpreter frees its
    // thread states next, and a hook of a thread still running C (a daemon thread's
    // allocation) must not read them.
    frames::stop();
    r
}

/// The namespace with the bridge run in it, made on first use.
unsafe fn namespace(a: &Api) -> Result<Obj, Stop> {
    let ns = NAMESPACE.load(Acquire);
    if !ns.is_null() {
        return Ok(ns);
    }
    // SAFETY: GIL held (see run_here).
    unsafe {
        let ns = (a.dict_new)();
        if ns.is_null() {
            return Err(error_text(a).into());
        }
        let ok = (a.dict_set_item_string)(ns, c"__builtins__".as_ptr(), (a.get_builtins)()) == 0
            && set_function(a, ns, &SUBMIT_DEF)
            && set_function(a, ns, &DEVICES_DEF)
            && set_function(a, ns, &PAIRS_DEF)
            && set_function(a, ns, &CAPTURING_DEF)
            && set_function(a, ns, &KEEPING_DEF);
        if !ok {
            let e = error_text(a);
            (a.dec_ref)(ns);
            return Err(e.into());
        }
        let src = CStr::from_bytes_with_nul(BRIDGE_SOURCE.as_bytes())
            .map_err(|e| Stop::Error(e.to_string()))?;
        if let Err(e) = exec(a, src, c"<gpuguard bridge>", ns) {
            // The program's interrupt stays set across the namespace's release.
            let (mut t, mut v, mut tb) = (
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
            (a.err_fetch)(&mut t, &mut v, &mut tb);
            (a.dec_ref)(ns);
            (a.err_restore)(t, v, tb);
            return Err(e);
        }
        NAMESPACE.store(ns, Release);
        Ok(ns)
    }
}

unsafe fn set_function(a: &Api, ns: Obj, def: &'static MethodDef) -> bool {
    // SAFETY: GIL held; `def` lives forever, as CPython requires.
    unsafe {
        let f = (a.cfunction_new)(def, std::ptr::null_mut(), std::ptr::null_mut());
        if f.is_null() {
            return false;
        }
        let ok = (a.dict_set_item_string)(ns, def.name, f) == 0;
        (a.dec_ref)(f);
        ok
    }
}

unsafe fn exec(a: &Api, src: &CStr, file: &CStr, ns: Obj) -> Result<(), Stop> {
    // SAFETY: GIL held; new references released.
    unsafe {
        let code = (a.compile_string)(src.as_ptr(), file.as_ptr(), PY_FILE_INPUT);
        if code.is_null() {
            return Err(error_text(a).into());
        }
        let r = (a.eval_code)(code, ns, ns);
        (a.dec_ref)(code);
        if r.is_null() {
            // gpuguard's code raises only Exceptions (and catches its own): anything
            // else came from the program's signal handler while it ran.
            if !(a.err_occurred)().is_null() && (a.err_matches)(a.exception) == 0 {
                return Err(Stop::Interrupt);
            }
            return Err(error_text(a).into());
        }
        (a.dec_ref)(r);
        Ok(())
    }
}

/// The pending exception as text, clearing it.
unsafe fn error_text(a: &Api) -> String {
    // SAFETY: GIL held; PyErr_Fetch hands over (possibly NULL) new references.
    unsafe {
        let (mut t, mut v, mut tb) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        (a.err_fetch)(&mut t, &mut v, &mut tb);
        let what = if v.is_null() { t } else { v };
        let mut text = String::from("Python error");
        if !what.is_null() {
            let s = (a.object_str)(what);
            if !s.is_null() {
                if let Some(x) = utf8(a, s) {
                    text = x;
                }
                (a.dec_ref)(s);
            }
        }
        for o in [t, v, tb] {
            if !o.is_null() {
                (a.dec_ref)(o);
            }
        }
        // PyObject_Str may itself have failed: leave no exception behind.
        let (mut t2, mut v2, mut tb2) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        (a.err_fetch)(&mut t2, &mut v2, &mut tb2);
        for o in [t2, v2, tb2] {
            if !o.is_null() {
                (a.dec_ref)(o);
            }
        }
        text
    }
}

unsafe fn utf8(a: &Api, s: Obj) -> Option<String> {
    let mut n: isize = 0;
    // SAFETY: GIL held; the buffer belongs to `s` and is copied at once.
    unsafe {
        let p = (a.as_utf8)(s, &mut n);
        if p.is_null() || n < 0 {
            return None;
        }
        Some(
            String::from_utf8_lossy(std::slice::from_raw_parts(p as *const u8, n as usize))
                .into_owned(),
        )
    }
}

unsafe fn none(a: &Api) -> Obj {
    // SAFETY: GIL held.
    unsafe { (a.inc_ref)(a.none) };
    a.none
}

/// `_gg_submit(text)`: `"<tag>\n<json>"` from the Python side. GIL held.
extern "C" fn submit(_module: Obj, arg: Obj) -> Obj {
    let Some(a) = api() else {
        return std::ptr::null_mut();
    };
    shielded(|| {
        // SAFETY: GIL held; `arg` is a borrowed reference.
        let text = unsafe { utf8(a, arg) };
        if let Some(text) = text {
            let (tag, body) = text.split_once('\n').unwrap_or(("reply", &text));
            if tag == "frames" {
                frames::set_layout(body);
            } else if tag == "resolved" {
                names::resolved(body);
            } else if tag == "exit" {
                // The interpreter tears its thread states down next: from here on no
                // hook may read them.
                frames::stop();
                *lock(&AT_EXIT) = Some(body.to_string());
                // The program's own code is done and the interpreter is whole: what
                // is live now is what the program held at its end. Python's teardown
                // frees its globals next (and a framework without a cache hands their
                // memory straight back), so the exit report is written here.
                report::write_exit_report(at_exit_answer);
            } else {
                *lock(&ANSWER) = Some(body.to_string());
            }
        } else {
            // Not a str: clear the TypeError so `None` can be returned.
            // SAFETY: GIL held.
            unsafe { error_text(a) };
        }
    });
    // SAFETY: GIL held.
    unsafe { none(a) }
}

/// `_gg_devices()`: the devices gpuguard has seen memory on, as JSON. GIL held.
extern "C" fn devices(_module: Obj, _unused: Obj) -> Obj {
    let Some(a) = api() else {
        return std::ptr::null_mut();
    };
    let list = shielded(|| {
        active_books()
            .map(|b| b.ledger.seen_devices())
            .unwrap_or_default()
    })
    .unwrap_or_default();
    let text = serde_json::to_string(&list).unwrap_or_else(|_| "[]".into());
    // SAFETY: GIL held; a new str from a valid buffer.
    unsafe { (a.from_utf8)(text.as_ptr() as *const c_char, text.len() as isize) }
}

/// `_gg_pending_pairs()`: the Python frames in call sites not yet resolved, as JSON
/// `[[code address, offset], ...]`. GIL held.
extern "C" fn pending_pairs(_module: Obj, _unused: Obj) -> Obj {
    let Some(a) = api() else {
        return std::ptr::null_mut();
    };
    let text = shielded(|| {
        active_books()
            .map(|b| names::pairs_json(&names::unresolved(&b.sites)))
            .unwrap_or_else(|| "[]".into())
    })
    .unwrap_or_else(|| "[]".into());
    // SAFETY: GIL held; a new str from a valid buffer.
    unsafe { (a.from_utf8)(text.as_ptr() as *const c_char, text.len() as isize) }
}

/// `_gg_capturing()`: how many streams of the process are in CUDA graph capture now,
/// as a decimal string (the bridge checks it before each framework's trim). GIL held.
extern "C" fn capturing(_module: Obj, _unused: Obj) -> Obj {
    let Some(a) = api() else {
        return std::ptr::null_mut();
    };
    let text = capture::active().to_string();
    // SAFETY: GIL held; a new str from a valid buffer.
    unsafe { (a.from_utf8)(text.as_ptr() as *const c_char, text.len() as isize) }
}
