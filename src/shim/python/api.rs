//! The CPython functions the Python side uses, found with `dlsym` at run time: the
//! shim loads into processes without Python and must not link it.

use crate::shim::real::lookup;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Mutex, OnceLock};

pub(super) type Obj = *mut c_void;
pub(super) type PendingFn = extern "C" fn(*mut c_void) -> c_int;

/// The CPython functions gpuguard uses.
pub(super) struct Api {
    pub(super) is_initialized: unsafe extern "C" fn() -> c_int,
    /// `Py_IsFinalizing` (3.13+) or `_Py_IsFinalizing` (3.10 to 3.12).
    pub(super) is_finalizing: Option<unsafe extern "C" fn() -> c_int>,
    pub(super) add_pending_call: unsafe extern "C" fn(PendingFn, *mut c_void) -> c_int,
    pub(super) compile_string: unsafe extern "C" fn(*const c_char, *const c_char, c_int) -> Obj,
    pub(super) eval_code: unsafe extern "C" fn(Obj, Obj, Obj) -> Obj,
    pub(super) dict_new: unsafe extern "C" fn() -> Obj,
    pub(super) dict_set_item_string: unsafe extern "C" fn(Obj, *const c_char, Obj) -> c_int,
    pub(super) get_builtins: unsafe extern "C" fn() -> Obj,
    pub(super) as_utf8: unsafe extern "C" fn(Obj, *mut isize) -> *const c_char,
    pub(super) from_utf8: unsafe extern "C" fn(*const c_char, isize) -> Obj,
    pub(super) cfunction_new: unsafe extern "C" fn(*const MethodDef, Obj, Obj) -> Obj,
    pub(super) inc_ref: unsafe extern "C" fn(Obj),
    pub(super) dec_ref: unsafe extern "C" fn(Obj),
    pub(super) err_fetch: unsafe extern "C" fn(*mut Obj, *mut Obj, *mut Obj),
    pub(super) err_restore: unsafe extern "C" fn(Obj, Obj, Obj),
    pub(super) err_occurred: unsafe extern "C" fn() -> Obj,
    pub(super) err_matches: unsafe extern "C" fn(Obj) -> c_int,
    /// `PyExc_Exception`: what gpuguard's own Python code may raise (and is cleared);
    /// anything else (KeyboardInterrupt, SystemExit) is the program's.
    pub(super) exception: Obj,
    /// `PyExc_KeyboardInterrupt`.
    pub(super) keyboard_interrupt: Obj,
    /// `PySys_GetObject` (a borrowed reference, or NULL).
    pub(super) sys_get: unsafe extern "C" fn(*const c_char) -> Obj,
    pub(super) call_object: unsafe extern "C" fn(Obj, Obj) -> Obj,
    pub(super) object_str: unsafe extern "C" fn(Obj) -> Obj,
    /// `PyGILState_GetThisThreadState`: this thread's state, without the GIL.
    pub(super) this_thread_state: unsafe extern "C" fn() -> *const c_void,
    pub(super) none: Obj,
}

// SAFETY: plain function pointers and the addresses of the immortal `None` and
// exception classes.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

/// `PyMethodDef`, whose layout is part of CPython's stable ABI.
#[repr(C)]
pub(super) struct MethodDef {
    pub(super) name: *const c_char,
    pub(super) meth: *const c_void,
    pub(super) flags: c_int,
    pub(super) doc: *const c_char,
}
// SAFETY: constant data, never written.
unsafe impl Sync for MethodDef {}

static API: OnceLock<Option<Api>> = OnceLock::new();

pub(super) fn api() -> Option<&'static Api> {
    API.get_or_init(resolve).as_ref()
}

/// A looked-up address as the function pointer type the caller names.
///
/// # Safety
/// `p` is non-null and is a function of type `F`, a function pointer type.
unsafe fn fn_ptr<F: Copy>(p: *mut c_void) -> F {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    // SAFETY: same size; the caller vouches for the type.
    unsafe { std::mem::transmute_copy(&p) }
}

fn resolve() -> Option<Api> {
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: a lookup through glibc of a constant name.
            let p = unsafe { lookup(libc::RTLD_DEFAULT, $name) };
            if p.is_null() {
                return None;
            }
            // SAFETY: the CPython function of that name has the field's signature.
            unsafe { fn_ptr(p) }
        }};
    }
    // SAFETY: as above.
    let fin = unsafe {
        let p = lookup(libc::RTLD_DEFAULT, c"Py_IsFinalizing");
        if p.is_null() {
            lookup(libc::RTLD_DEFAULT, c"_Py_IsFinalizing")
        } else {
            p
        }
    };
    // SAFETY: as above; `_Py_NoneStruct` is the `None` object itself.
    let none = unsafe { lookup(libc::RTLD_DEFAULT, c"_Py_NoneStruct") };
    // SAFETY: as above; `PyExc_*` are variables holding the classes, set before the
    // interpreter runs.
    let class = |name: &std::ffi::CStr| unsafe {
        let p = lookup(libc::RTLD_DEFAULT, name) as *const Obj;
        if p.is_null() {
            std::ptr::null_mut()
        } else {
            *p
        }
    };
    let (exception, keyboard_interrupt) =
        (class(c"PyExc_Exception"), class(c"PyExc_KeyboardInterrupt"));
    if none.is_null() || exception.is_null() || keyboard_interrupt.is_null() {
        return None;
    }
    Some(Api {
        is_initialized: sym!(c"Py_IsInitialized"),
        // SAFETY: the function of that name takes nothing and returns an int.
        is_finalizing: (!fin.is_null()).then(|| unsafe { fn_ptr(fin) }),
        add_pending_call: sym!(c"Py_AddPendingCall"),
        compile_string: sym!(c"Py_CompileString"),
        eval_code: sym!(c"PyEval_EvalCode"),
        dict_new: sym!(c"PyDict_New"),
        dict_set_item_string: sym!(c"PyDict_SetItemString"),
        get_builtins: sym!(c"PyEval_GetBuiltins"),
        as_utf8: sym!(c"PyUnicode_AsUTF8AndSize"),
        from_utf8: sym!(c"PyUnicode_FromStringAndSize"),
        cfunction_new: sym!(c"PyCFunction_NewEx"),
        inc_ref: sym!(c"Py_IncRef"),
        dec_ref: sym!(c"Py_DecRef"),
        err_fetch: sym!(c"PyErr_Fetch"),
        err_restore: sym!(c"PyErr_Restore"),
        err_occurred: sym!(c"PyErr_Occurred"),
        err_matches: sym!(c"PyErr_ExceptionMatches"),
        exception,
        keyboard_interrupt,
        sys_get: sym!(c"PySys_GetObject"),
        call_object: sym!(c"PyObject_CallObject"),
        object_str: sym!(c"PyObject_Str"),
        this_thread_state: sym!(c"PyGILState_GetThisThreadState"),
        none,
    })
}

/// Takes a lock of the Python side even if a panic poisoned it.
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
