//! Native frames as people read them: `function+0x.. (module+0x..) at file:line`.
//! The function comes from the module's ELF symbols (`gpuguard_core::symbols`) or the
//! loader's, demangled in every program with `rustc-demangle` (Rust) and
//! `cpp_demangle` (C++), never through the C++ runtime the program may not have; the
//! file and line from the module's DWARF (`addr2line`), read lazily the first time a
//! report needs a module and kept for the thread's later reports. Functions the
//! compiler inlined at an address become frames of their own before it,
//! `name (inlined) at file:line`, and the frame of the function that holds the code
//! then gives the line of the call.
//! Report time only (a report writer's thread), never a hook.

use super::real;
use gpuguard_core::reporter::FrameInfo;
use gpuguard_core::symbols::SymbolTable;
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, OsStr, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What one report has read so far, by module path (as the loader holds it, bytes
/// and all: a path need not be UTF-8): symbol tables, and DWARF where the thread's
/// own cache is gone (a thread exiting).
#[derive(Default)]
pub(crate) struct Modules {
    symbols: HashMap<PathBuf, Option<SymbolTable>>,
    lines: Lines,
}

pub(crate) type Tables = RefCell<Modules>;

type Lines = HashMap<PathBuf, Option<addr2line::Loader>>;

thread_local! {
    /// DWARF of each module this thread symbolized, by path (None: none readable).
    /// Built on first need and kept: the helper thread writes most reports.
    static LINES: RefCell<Lines> = RefCell::new(HashMap::new());
}

/// Modules whose DWARF is not read: the CUDA libraries (huge, internal, no lines).
fn skip_lines(module: &str) -> bool {
    module.starts_with("libcuda.so") || module.starts_with("libcudart.so")
}

/// The most functions inlined at one address a frame lists (the innermost):
/// DWARF read from a file is input like any other.
const MAX_INLINED: usize = 64;

/// What DWARF says of one address: the functions inlined there as frames,
/// innermost first, and the `file:line` of the function that holds the code (the
/// line of the call when something was inlined there).
#[derive(Default)]
struct Placed {
    inlined: Vec<String>,
    line: Option<String>,
}

/// An inlined function's frame: `name (inlined) at file:line`. It has no address
/// of its own; the frame after it (the function that holds the code) has.
fn inlined_frame(name: Option<String>, line: Option<String>) -> String {
    let mut text = name.unwrap_or_else(|| "(unnamed)".into());
    text.push_str(INLINED);
    if let Some(fl) = line {
        text.push_str(" at ");
        text.push_str(&fl);
    }
    text
}

/// What marks an inlined function's frame, after its name.
const INLINED: &str = " (inlined)";

/// Address `probe` (the module's own addresses) of `file` in its DWARF: the frames
/// `addr2line` gives there, innermost first; all but the last are inlined.
fn placed(file: &Path, probe: u64, tables: &Tables) -> Placed {
    let look = |cache: &mut Lines| {
        let loader = cache.entry(file.to_path_buf()).or_insert_with(|| {
            // addr2line opens the file itself: never a FIFO or device put in its place.
            gpuguard_core::regular_file::is_regular(file)
                .then(|| addr2line::Loader::new(file).ok())
                .flatten()
        });
        let Some(loader) = loader.as_ref() else {
            return Placed::default();
        };
        let file_line = |loc: Option<addr2line::Location<'_>>| {
            loc.and_then(|l| Some(format!("{}:{}", l.file?, l.line?)))
        };
        // (function, file:line) from the innermost out; the outermost is kept apart.
        let mut found: Vec<(Option<String>, Option<String>)> = Vec::new();
        let mut outermost = None;
        if let Ok(mut frames) = loader.find_frames(probe) {
            while let Ok(Some(f)) = frames.next() {
                let name = f
                    .function
                    .as_ref()
                    .and_then(|n| n.raw_name().ok())
                    .map(|n| shortened(&demangle(&n)).into_owned());
                if let Some(prev) = outermost.replace((name, file_line(f.location)))
                    && found.len() < MAX_INLINED
                {
                    found.push(prev);
                }
            }
        }
        match outermost {
            Some((_, line)) => Placed {
                inlined: found
                    .into_iter()
                    .map(|(name, line)| inlined_frame(name, line))
                    .collect(),
                line,
            },
            // No function there: the line table alone.
            None => Placed {
                inlined: Vec::new(),
                line: file_line(loader.find_location(probe).ok().flatten()),
            },
        }
    };
    // At exit the thread's own storage may be gone: the report's cache then.
    LINES
        .try_with(|cache| look(&mut cache.borrow_mut()))
        .unwrap_or_else(|_| look(&mut tables.borrow_mut().lines))
}

fn program_name() -> String {
    super::sys::program_name()
}

/// `function+0x.. (module+0x..) at file:line`, each part as far as known (else
/// `module+0x..`). Frames of gpuguard and the CUDA libraries are marked internal, so
/// a site starts at the caller.
pub(crate) fn symbolize(pc: usize, tables: &Tables) -> FrameInfo {
    use super::python::frames;
    use super::python::names;
    if super::tags::is_tag(pc) {
        return FrameInfo {
            text: super::tags::text(pc),
            inlined: Vec::new(),
            internal: false,
            interpreter: false,
        };
    }
    if frames::is_python(pc) {
        return FrameInfo {
            text: match names::text(pc) {
                Some(t) => format!("{}{t}", gpuguard_core::report::PY_FRAME),
                None => format!("{}(code no longer alive)", gpuguard_core::report::PY_FRAME),
            },
            inlined: Vec::new(),
            internal: false,
            interpreter: false,
        };
    }
    // A return address points after the call; look up the call itself.
    let at = pc.saturating_sub(1);
    // SAFETY: dladdr only reads the loader's tables.
    let mut dl: libc::Dl_info = unsafe { std::mem::zeroed() };
    if unsafe { libc::dladdr(at as *const c_void, &mut dl) } == 0 || dl.dli_fname.is_null() {
        return FrameInfo {
            text: format!("{pc:#x}"),
            inlined: Vec::new(),
            internal: false,
            interpreter: false,
        };
    }
    // SAFETY: dladdr filled these with C strings owned by the loader.
    let path = PathBuf::from(OsStr::from_bytes(
        unsafe { CStr::from_ptr(dl.dli_fname) }.to_bytes(),
    ));
    let base = dl.dli_fbase as usize;
    // The name only shows; the file is opened by its exact bytes.
    let module = match path.file_name() {
        Some(m) => m.to_string_lossy().into_owned(),
        None => program_name(),
    };
    let off = at - base;
    let internal = real::is_own_code(at) || skip_lines(&module);
    // CPython (a shared libpython or a python executable) and the foreign-function
    // layer ctypes calls C through.
    let interpreter = module.starts_with("libpython")
        || module.starts_with("python")
        || module.starts_with("libffi.so")
        || module.starts_with("_ctypes");
    let file = if path.as_os_str().is_empty() {
        PathBuf::from("/proc/self/exe")
    } else {
        path
    };
    let (from_elf, probe) = {
        let mut tables = tables.borrow_mut();
        let table = tables
            .symbols
            .entry(file.clone())
            .or_insert_with(|| SymbolTable::load(&file));
        let absolute = table.as_ref().is_some_and(|t| t.absolute);
        let probe = if absolute { at } else { off } as u64;
        let named = table
            .as_ref()
            .and_then(|t| t.lookup(probe).map(|(n, o)| (demangle(n), o)));
        (named, probe)
    };
    let from_loader = || {
        (!dl.dli_sname.is_null()).then(|| {
            // SAFETY: as above.
            let n = unsafe { CStr::from_ptr(dl.dli_sname) }.to_string_lossy();
            (demangle(&n), (at - dl.dli_saddr as usize) as u64)
        })
    };
    let mut text = match from_elf.or_else(from_loader) {
        Some((name, o)) => format!("{}+{o:#x} ({module}+{off:#x})", shortened(&name)),
        None => format!("{module}+{off:#x}"),
    };
    let mut inlined = Vec::new();
    if !internal {
        let at = placed(&file, probe, tables);
        inlined = at.inlined;
        if let Some(fl) = at.line {
            text.push_str(" at ");
            text.push_str(&fl);
        }
    }
    FrameInfo {
        text,
        inlined,
        internal,
        interpreter,
    }
}

/// The longest function name a frame carries, in bytes. A demangled C++ template
/// name (Thrust, CUB, XLA, a lambda in libtorch) can run to many kilobytes, and the
/// command cuts a report's strings at 4 KiB: cut there, the frame would lose its
/// offset and line, and two places in one function would read as one site.
const MAX_NAME_BYTES: usize = 1024;

/// `name` within [`MAX_NAME_BYTES`]: its start and its end (where the function's own
/// name and arguments are), joined by `…`.
fn shortened(name: &str) -> Cow<'_, str> {
    if name.len() <= MAX_NAME_BYTES {
        return Cow::Borrowed(name);
    }
    let mut head = MAX_NAME_BYTES / 2;
    while !name.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = name.len() - MAX_NAME_BYTES / 2 + '…'.len_utf8();
    while !name.is_char_boundary(tail) {
        tail += 1;
    }
    Cow::Owned(format!("{}…{}", &name[..head], &name[tail..]))
}

/// A mangled Rust (legacy `_ZN...17h<hash>E`, or v0 `_R...`) or C++ (`_Z...`) name,
/// readable; any other name as it is.
pub(crate) fn demangle(name: &str) -> String {
    if !name.starts_with("_Z") && !name.starts_with("_R") {
        return name.to_string();
    }
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        // `{:#}` leaves out the hash, which says nothing to a person.
        return format!("{rust:#}");
    }
    cpp_demangle::Symbol::new(name)
        .ok()
        .and_then(|s| s.demangle(&cpp_demangle::DemangleOptions::default()).ok())
        .unwrap_or_else(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::{MAX_NAME_BYTES, demangle, shortened};

    #[test]
    fn long_names_keep_their_start_and_end() {
        assert_eq!(shortened("main"), "main");
        let long = format!("thrust::detail::{}::launch(é)", "vector<int>, ".repeat(400));
        let short = shortened(&long);
        assert!(short.len() <= MAX_NAME_BYTES, "{}", short.len());
        assert!(short.starts_with("thrust::detail::") && short.ends_with("::launch(é)"));
        assert!(short.contains('…'));
    }

    #[test]
    fn rust_and_cpp_names_are_demangled_without_the_cpp_runtime() {
        assert_eq!(
            demangle("_ZN6cudarc6driver6result12malloc_async17h67cca8cdf474afacE"),
            "cudarc::driver::result::malloc_async"
        );
        assert_eq!(
            demangle("_ZN2at6detail10empty_cudaEv"),
            "at::detail::empty_cuda()"
        );
        assert_eq!(demangle("main"), "main");
        assert_eq!(demangle("_Znot-a-name"), "_Znot-a-name");
    }
}
