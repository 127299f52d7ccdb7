//! Where CPython keeps a thread's frames and a code object's names, for the running
//! interpreter, before any Python code of gpuguard's has run.
//!
//! - 3.13: the interpreter publishes its own offsets (`_Py_DebugOffsets`, at the
//!   start of `_PyRuntime`, behind the cookie `xdebugpy` and its version).
//! - 3.10 to 3.12: the offsets of x86-64 release builds, from CPython's headers
//!   (`PyThreadState`, `_PyCFrame`, `_PyInterpreterFrame` or `PyFrameObject`,
//!   `PyCodeObject`, the compact `str` and `bytes` objects), used only where the
//!   interpreter says it is that minor version (`Py_Version`, or `Py_GetVersion()`
//!   on 3.10) and not a debug build (no `_Py_NegativeRefcount`).
//!
//! What is found here is confirmed again at first use (a frame's code pointer must
//! point at an object whose type is `PyCode_Type`, see `frames::walk`) and by the
//! main thread's calibration (`bridge/frames.py`, `_gg_calibrate`), which turns frames off
//! if it disagrees. Other versions wait for the calibration alone.

use crate::shim::real::lookup;
use std::ffi::{CStr, c_char};

/// Everything the hooks read, as offsets in bytes (-1: not there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Layout {
    /// 1: interpreter frames (3.11+), 2: frame objects (3.10).
    pub mode: i64,
    /// Thread state -> current frame: `ts + ts_off`, then `+ ts_deref` unless -1.
    pub ts_off: i64,
    pub ts_deref: i64,
    pub code_off: i64,
    pub prev_off: i64,
    /// Mode 1: the instruction pointer; mode 2: `f_lasti` (an int, code units).
    pub instr_off: i64,
    /// Mode 1: where the bytecode starts in the code object.
    pub base: i64,
    /// The frame's `owner` byte (3.12+), whose value `cstack` marks the
    /// interpreter's own entry frames; -1 where there are none (3.10, 3.11).
    pub owner_off: i64,
    pub cstack: i64,
    /// `PyCodeObject` fields: file, name, qualified name (-1 on 3.10), first line
    /// (an int), line table (a bytes object); line table format (1: 3.10, 2: 3.11+).
    pub co_filename: i64,
    pub co_name: i64,
    pub co_qualname: i64,
    pub co_firstlineno: i64,
    pub co_linetable: i64,
    pub lines_format: i64,
    /// The interpreter puts frames of code of its own making, with no source
    /// (first line 0), in the chain (3.13: the shim between a class call and its
    /// `__init__`): a walk reads each code's first line to skip them. Not before.
    pub no_source_frames: bool,
    /// Where a compact ASCII `str`'s characters start, and a compact non-ASCII one's.
    pub str_ascii: i64,
    pub str_compact: i64,
    /// Where a `bytes` object's bytes start.
    pub bytes_sval: i64,
    /// `PyCode_Type`, `PyUnicode_Type`, `PyBytes_Type`.
    pub code_type: i64,
    pub str_type: i64,
    pub bytes_type: i64,
}

impl Layout {
    /// Whether names can be copied from code objects with this layout.
    pub(crate) fn names(&self) -> bool {
        self.co_filename >= 0
            && self.co_name >= 0
            && self.co_firstlineno >= 0
            && self.co_linetable >= 0
            && self.lines_format > 0
            && self.str_ascii > 0
            && self.bytes_sval > 0
            && self.str_type != 0
            && self.bytes_type != 0
    }

    /// The frame-walking part, which the calibration measures and compares.
    pub(crate) fn frame_part(&self) -> [i64; 8] {
        [
            self.mode,
            self.ts_off,
            self.ts_deref,
            self.code_off,
            self.prev_off,
            self.instr_off,
            self.base,
            self.owner_off,
        ]
    }
}

/// `0x030C0000`-style version of a minor release, from CPython's headers.
fn table(minor: u32) -> Option<Layout> {
    let common = Layout {
        mode: 1,
        owner_off: -1,
        cstack: 3,
        co_filename: 112,
        co_name: 120,
        co_qualname: 128,
        co_linetable: 136,
        lines_format: 2,
        bytes_sval: 32,
        ..Layout::default()
    };
    Some(match minor {
        // PyThreadState.frame (prev, next, interp, frame); PyFrameObject: f_back at
        // 24, f_code at 32, f_lasti at 96; PyCodeObject: co_firstlineno at 40,
        // co_filename 104, co_name 112, co_linetable 120; str: 48 / 72.
        10 => Layout {
            mode: 2,
            ts_off: 24,
            ts_deref: -1,
            code_off: 32,
            prev_off: 24,
            instr_off: 96,
            base: 0,
            co_filename: 104,
            co_name: 112,
            co_qualname: -1,
            co_firstlineno: 40,
            co_linetable: 120,
            lines_format: 1,
            str_ascii: 48,
            str_compact: 72,
            ..common
        },
        // PyThreadState.cframe at 56; _PyCFrame.current_frame at 8 (after
        // use_tracing); _PyInterpreterFrame: f_code 32, previous 48, prev_instr 56;
        // co_code_adaptive at 184, co_firstlineno at 72.
        11 => Layout {
            ts_off: 56,
            ts_deref: 8,
            code_off: 32,
            prev_off: 48,
            instr_off: 56,
            base: 184,
            co_firstlineno: 72,
            str_ascii: 48,
            str_compact: 72,
            ..common
        },
        // PyThreadState.cframe at 56; _PyCFrame.current_frame at 0;
        // _PyInterpreterFrame: f_code 0, previous 8, prev_instr 56, owner 70;
        // co_code_adaptive at 192, co_firstlineno at 68; str without wstr: 40 / 56.
        12 => Layout {
            ts_off: 56,
            ts_deref: 0,
            code_off: 0,
            prev_off: 8,
            instr_off: 56,
            base: 192,
            owner_off: 70,
            co_firstlineno: 68,
            str_ascii: 40,
            str_compact: 56,
            ..common
        },
        _ => return None,
    })
}

/// The offsets 3.13 publishes, read from `_PyRuntime`'s first bytes.
///
/// # Safety
/// `runtime` is the address of the interpreter's `_PyRuntime`.
unsafe fn debug_offsets(runtime: *const u64, version: u64) -> Option<Layout> {
    // SAFETY: `_PyRuntime` begins with `_Py_DebugOffsets` (3.13+), 73 words in 3.13;
    // the cookie is checked before anything else is read.
    unsafe {
        let cookie = std::slice::from_raw_parts(runtime as *const u8, 8);
        if cookie != b"xdebugpy" {
            return None;
        }
        let w = |i: usize| std::ptr::read_volatile(runtime.add(i));
        let v = w(1);
        // The struct's shape is that of 3.13; a free-threaded build lays objects
        // out differently.
        if v >> 16 != version >> 16 || v >> 16 != 0x030D || w(2) != 0 {
            return None;
        }
        let o = |i: usize| w(i) as i64;
        let ob_type = o(45);
        if ob_type != 8 {
            return None;
        }
        Some(Layout {
            mode: 1,
            ts_off: o(23),
            ts_deref: -1,
            code_off: o(30),
            prev_off: o(29),
            instr_off: o(31),
            base: o(43),
            owner_off: o(33),
            cstack: 3,
            co_filename: o(35),
            co_name: o(36),
            co_qualname: o(37),
            co_firstlineno: o(39),
            no_source_frames: true,
            co_linetable: o(38),
            lines_format: 2,
            str_ascii: o(70),
            // A compact non-ASCII str adds its UTF-8 length and pointer.
            str_compact: o(70) + 16,
            bytes_sval: o(66),
            ..Layout::default()
        })
    }
}

/// The running interpreter's version as `PY_VERSION_HEX`, if it says.
///
/// # Safety
/// Python is initialized.
unsafe fn version() -> Option<u64> {
    // SAFETY: lookups through glibc; `Py_Version` is a constant `unsigned long`;
    // `Py_GetVersion` returns a static C string (3.10 has no `Py_Version`).
    unsafe {
        let p = lookup(libc::RTLD_DEFAULT, c"Py_Version");
        if !p.is_null() {
            return Some(std::ptr::read_volatile(p as *const u64));
        }
        let f = lookup(libc::RTLD_DEFAULT, c"Py_GetVersion");
        if f.is_null() {
            return None;
        }
        let f: unsafe extern "C" fn() -> *const c_char = std::mem::transmute(f);
        let s = f();
        if s.is_null() {
            return None;
        }
        let text = CStr::from_ptr(s).to_str().ok()?;
        let mut parts = text.split(|c: char| !c.is_ascii_digit());
        let major: u64 = parts.next()?.parse().ok()?;
        let minor: u64 = parts.next()?.parse().ok()?;
        Some(major << 24 | minor << 16)
    }
}

/// The layout this interpreter is known to have, or why there is none.
///
/// # Safety
/// Python is initialized.
pub(crate) unsafe fn builtin() -> Result<Layout, &'static str> {
    // SAFETY: lookups through glibc, then reads per `version` / `debug_offsets`.
    unsafe {
        let Some(v) = version() else {
            return Err("the interpreter's version is unknown");
        };
        if v >> 24 != 3 {
            return Err("not CPython 3");
        }
        if !lookup(libc::RTLD_DEFAULT, c"_Py_NegativeRefcount").is_null() {
            return Err("a debug build of CPython");
        }
        let sym = |n: &CStr| lookup(libc::RTLD_DEFAULT, n) as i64;
        let (code_type, str_type, bytes_type) = (
            sym(c"PyCode_Type"),
            sym(c"PyUnicode_Type"),
            sym(c"PyBytes_Type"),
        );
        if code_type == 0 {
            return Err("PyCode_Type not found");
        }
        let minor = ((v >> 16) & 0xff) as u32;
        let found = if minor >= 13 {
            let rt = lookup(libc::RTLD_DEFAULT, c"_PyRuntime") as *const u64;
            if rt.is_null() || minor > 13 {
                None
            } else {
                debug_offsets(rt, v)
            }
        } else {
            table(minor)
        };
        let Some(l) = found else {
            return Err("no known layout for this CPython version");
        };
        Ok(Layout {
            code_type,
            str_type,
            bytes_type,
            ..l
        })
    }
}

/// Where the interpreter notes that the program ended by an unhandled
/// KeyboardInterrupt (CPython then ends the process by SIGINT after finalizing, as
/// Ctrl-C would have), if known for this interpreter: the exported
/// `_Py_UnhandledKeyboardInterrupt` (3.10, 3.11), or
/// `_PyRuntime.signals.unhandled_keyboard_interrupt` (3.12, 3.13, release builds
/// with the GIL; offsets from CPython's headers, 3.13's checked against the size of
/// `_PyRuntime` the interpreter publishes).
///
/// CPython clears the mark whenever code runs from a string (`PyRun_*`, so `exec`
/// and `eval` of a string: `collections.namedtuple` does, at a module's first
/// import), so Python code run after the program's end must leave it as it found it.
///
/// # Safety
/// Python is initialized.
pub(crate) unsafe fn interrupt_flag() -> Option<*mut std::ffi::c_int> {
    // SAFETY: lookups through glibc, then reads of `_PyRuntime`'s published header.
    unsafe {
        let v = version()?;
        if v >> 24 != 3 || !lookup(libc::RTLD_DEFAULT, c"_Py_NegativeRefcount").is_null() {
            return None;
        }
        let at = |name: &CStr, off: usize| {
            let p = lookup(libc::RTLD_DEFAULT, name) as *mut u8;
            (!p.is_null()).then(|| p.add(off) as *mut std::ffi::c_int)
        };
        match (v >> 16) & 0xff {
            10 | 11 => at(c"_Py_UnhandledKeyboardInterrupt", 0),
            12 => at(c"_PyRuntime", 1536),
            13 => {
                let rt = lookup(libc::RTLD_DEFAULT, c"_PyRuntime") as *const u64;
                // `_Py_DebugOffsets`: cookie, version, free-threaded, then the size of
                // `_PyRuntimeState` (283,320 bytes in 3.13's release builds).
                if rt.is_null()
                    || std::slice::from_raw_parts(rt as *const u8, 8) != b"xdebugpy"
                    || std::ptr::read_volatile(rt.add(2)) != 0
                    || std::ptr::read_volatile(rt.add(3)) != 283_320
                {
                    return None;
                }
                at(c"_PyRuntime", 2152)
            }
            _ => None,
        }
    }
}

// ---- reads of live objects' immutable fields ------------------------------------------

/// The word at `base + off`; 0 if `base` is null or misaligned.
///
/// # Safety
/// `base + off` is readable when `base` is a live object or frame of the layout.
pub(crate) unsafe fn word(base: usize, off: i64) -> usize {
    if base == 0 || base & 7 != 0 || off < 0 {
        return 0;
    }
    // SAFETY: per the caller.
    unsafe { std::ptr::read_volatile((base as isize + off as isize) as *const usize) }
}

/// A compact `str` as text (at most `max` characters), None for anything else.
///
/// # Safety
/// `s` is null or a live object.
pub(crate) unsafe fn string(l: &Layout, s: usize, max: usize) -> Option<String> {
    // SAFETY: `s` is a live object; its type is checked before the rest is read.
    unsafe {
        if s == 0 || s & 7 != 0 || word(s, 8) as i64 != l.str_type {
            return None;
        }
        let len = word(s, 16).min(max);
        let state = std::ptr::read_volatile((s + 32) as *const u32);
        let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
        if compact == 0 {
            return None;
        }
        let data = s + if ascii == 1 {
            l.str_ascii
        } else {
            l.str_compact
        } as usize;
        Some(match kind {
            1 => std::slice::from_raw_parts(data as *const u8, len)
                .iter()
                .map(|&b| b as char)
                .collect(),
            2 => String::from_utf16_lossy(std::slice::from_raw_parts(data as *const u16, len)),
            4 => std::slice::from_raw_parts(data as *const u32, len)
                .iter()
                .map(|&c| char::from_u32(c).unwrap_or('\u{fffd}'))
                .collect(),
            _ => return None,
        })
    }
}

/// A `bytes` object's first `max` bytes, None if it is not bytes.
///
/// # Safety
/// `b` is null or a live object.
pub(crate) unsafe fn bytes(l: &Layout, b: usize, max: usize) -> Option<Vec<u8>> {
    // SAFETY: as for `string`.
    unsafe {
        if b == 0 || b & 7 != 0 || word(b, 8) as i64 != l.bytes_type {
            return None;
        }
        let len = word(b, 16).min(max);
        Some(std::slice::from_raw_parts((b + l.bytes_sval as usize) as *const u8, len).to_vec())
    }
}
