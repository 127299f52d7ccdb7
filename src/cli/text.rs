//! Formatting helpers shared by the views: counts with their nouns, strings from
//! reports made safe for a terminal, and call-stack frames made readable.

use gpuguard_core::report::human_bytes;
use std::borrow::Cow;

/// Frames shown per site (and per refused call); the rest are counted.
pub const FRAMES_SHOWN: usize = 8;

/// `1 allocation`, `2 allocations`: `noun` is the singular; `s` is added otherwise.
pub fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Report strings made safe for a terminal: the library's own rule, so its stderr
/// lines and the command's output escape alike.
pub use gpuguard_core::escape::{clean, is_unsafe};

/// The longest text [`clip`] leaves whole, in bytes.
pub const MAX_LINE_TEXT: usize = 8 << 10;

/// Text for one line of output, cut past [`MAX_LINE_TEXT`] bytes (at a character)
/// and marked with `…`: a report's strings are each cut when read, but a command
/// line joins any number of them.
pub fn clip(s: &str) -> Cow<'_, str> {
    if s.len() <= MAX_LINE_TEXT {
        return Cow::Borrowed(s);
    }
    let mut end = MAX_LINE_TEXT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…", &s[..end]))
}

/// `args` joined by spaces for one line of output: cleaned, and cut as [`clip`]
/// says without joining more than it keeps.
pub fn command_line(args: &[String]) -> String {
    let mut line = String::new();
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            line.push(' ');
        }
        line.push_str(a);
        if line.len() > MAX_LINE_TEXT {
            break;
        }
    }
    clean(&clip(&line)).into_owned()
}

/// A frame with its function name demangled if it arrived mangled (the library
/// demangles C++ with libstdc++ when the program has it loaded, and Rust not at
/// all). Frames read `name+0x.. (module+0x..)`, `module+0x..` or
/// `python: file:line in function`.
pub fn readable_frame(f: &str) -> String {
    let (name, rest) = match f.find(['+', ' ']) {
        Some(at) => f.split_at(at),
        None => (f, ""),
    };
    match demangle(name) {
        Some(d) => format!("{d}{rest}"),
        None => f.to_string(),
    }
}

/// A frame ready for the terminal: demangled, control characters escaped.
pub fn frame(f: &str) -> String {
    clean(&readable_frame(f)).into_owned()
}

/// A mangled Rust (legacy `_ZN...17h<hash>E` or v0 `_R`) or C++ (`_Z`) name, read.
fn demangle(name: &str) -> Option<String> {
    if !name.starts_with("_Z") && !name.starts_with("_R") {
        return None;
    }
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        // `{:#}` leaves out the hash, which says nothing to a person.
        return Some(format!("{rust:#}"));
    }
    let symbol = cpp_demangle::Symbol::new(name).ok()?;
    symbol
        .demangle(&cpp_demangle::DemangleOptions::default())
        .ok()
}

/// The function name of a native frame (`main` of `main+0x1d (prog+0x8105d)`).
fn function(f: &str) -> &str {
    f.split(['+', ' ']).next().unwrap_or(f)
}

/// The module of a native frame (`prog` of `main+0x1d (prog+0x8105d)`,
/// `libc.so.6` of `libc.so.6+0x27249`).
fn module(f: &str) -> &str {
    let inner = match (f.find('('), f.rfind(')')) {
        (Some(open), Some(close)) if open < close => &f[open + 1..close],
        _ => f,
    };
    inner.split('+').next().unwrap_or(inner)
}

/// Frames that start every process rather than say anything about it: the C
/// library's and the dynamic loader's start-up code, and the Python interpreter's
/// `main` down to the point where it runs the script.
fn is_startup(f: &str) -> bool {
    const NAMES: &[&str] = &[
        "_start",
        "__libc_start_call_main",
        "Py_BytesMain",
        "Py_RunMain",
        "Py_Main",
        "pymain_main",
        "pymain_run_python",
    ];
    let name = function(f);
    let module = module(f);
    NAMES.contains(&name)
        || name.starts_with("__libc_start_main")
        // An unnamed libc frame at the outer end is __libc_start_call_main.
        || (name.starts_with("libc.so") && name == module)
        // The interpreter's own `main` (a program's `main` is its code: kept).
        || (name == "main" && module.starts_with("python"))
}

/// The frames worth showing, innermost first: start-up frames at the outer end cut.
pub fn trim_startup<S: AsRef<str>>(frames: &[S]) -> &[S] {
    let mut end = frames.len();
    while end > 0 && is_startup(frames[end - 1].as_ref()) {
        end -= 1;
    }
    // A stack made only of start-up code still says where: keep it.
    if end == 0 { frames } else { &frames[..end] }
}

/// Frames ready to print: start-up frames cut, names demangled, text escaped.
pub fn frames<S: AsRef<str>>(frames: &[S]) -> Vec<String> {
    trim_startup(frames)
        .iter()
        .map(|f| frame(f.as_ref()))
        .collect()
}

/// A site's frames under its line, indented: the first `FRAMES_SHOWN`, then how
/// many more there are.
pub fn put_frames<S: AsRef<str>>(out: &mut String, site_frames: &[S]) {
    let shown = frames(site_frames);
    for f in shown.iter().take(FRAMES_SHOWN) {
        put!(out, "        {f}");
    }
    if shown.len() > FRAMES_SHOWN {
        put!(
            out,
            "        ... {}",
            count((shown.len() - FRAMES_SHOWN) as u64, "more frame")
        );
    }
}

/// Frames for machine-readable output: start-up frames cut, names demangled (JSON
/// escapes control characters itself).
pub fn readable_frames<S: AsRef<str>>(frames: &[S]) -> Vec<String> {
    trim_startup(frames)
        .iter()
        .map(|f| readable_frame(f.as_ref()))
        .collect()
}

/// Byte counts in a message from a framework (`reserved 67108864 -> 4194304 bytes`)
/// in human sizes (`reserved 64.0 MiB -> 4.0 MiB`).
pub fn human_byte_counts(text: &str) -> String {
    let words: Vec<&str> = text.split(' ').collect();
    let mut out: Vec<String> = Vec::with_capacity(words.len());
    let mut i = 0;
    while i < words.len() {
        let word = words[i];
        let unit = words
            .get(i + 1)
            .map(|w| w.trim_end_matches([',', ';', ')', '.']));
        let is_number = !word.is_empty() && word.bytes().all(|b| b.is_ascii_digit());
        // `N bytes`, and `M -> N bytes` where the unit is said once.
        let stated = unit == Some("bytes")
            || (words.get(i + 1) == Some(&"->")
                && words
                    .get(i + 3)
                    .map(|w| w.trim_end_matches([',', ';', ')', '.']))
                    == Some("bytes"));
        match (is_number, word.parse::<u64>()) {
            (true, Ok(n)) if stated => {
                out.push(human_bytes(n));
                if unit == Some("bytes") {
                    // Keep what followed the unit (a comma, a parenthesis).
                    let tail = &words[i + 1]["bytes".len()..];
                    if let Some(last) = out.last_mut() {
                        last.push_str(tail);
                    }
                    i += 1;
                }
            }
            _ => out.push(word.to_string()),
        }
        i += 1;
    }
    out.join(" ")
}

/// Rows as columns: each cell padded to its column's width; the columns in
/// `right` right-aligned (numbers), the last one unpadded.
pub fn columns(rows: &[Vec<String>], right: &[usize]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0usize; cols];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            let pad = widths[i] - cell.chars().count();
            if i + 1 == row.len() && !right.contains(&i) {
                line.push_str(cell);
            } else if right.contains(&i) {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
                line.push_str("  ");
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A file's string for a terminal: control characters escaped (a program name is
/// whatever the process chose), cut to `max` characters.
pub fn printable(text: &str, max: usize) -> String {
    let text = clean(text);
    let mut out: String = text.chars().take(max).collect();
    if text.chars().count() > max {
        out.pop();
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_well() {
        assert_eq!(count(1, "allocation"), "1 allocation");
        assert_eq!(count(0, "call site"), "0 call sites");
        assert_eq!(count(2, "block"), "2 blocks");
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(clean("plain"), "plain");
        assert_eq!(clean("a\x1b[2Jb\n"), "a\\x1b[2Jb\\n");
        assert_eq!(clean("c1\u{9b}x"), "c1\\u{9b}x");
        assert_eq!(clean("del\u{7f}"), "del\\x7f");
        assert_eq!(clean("a\u{202e}txt.exe"), "a\\u{202e}txt.exe");
        assert_eq!(clean("\u{2066}x\u{2069}"), "\\u{2066}x\\u{2069}");
        assert_eq!(
            clean("\u{201c}quoted\u{201d} é"),
            "\u{201c}quoted\u{201d} é"
        );
    }

    #[test]
    fn long_text_is_clipped_at_a_character() {
        let short = "x".repeat(MAX_LINE_TEXT);
        assert_eq!(clip(&short), short);
        let long = format!("{}é{}", "x".repeat(MAX_LINE_TEXT - 1), "y".repeat(100));
        let c = clip(&long);
        assert!(
            c.ends_with('…') && c.len() <= MAX_LINE_TEXT + 3,
            "{}",
            c.len()
        );
        let args: Vec<String> = (0..10_000).map(|i| format!("--arg{i}")).collect();
        let line = command_line(&args);
        assert!(line.starts_with("--arg0 --arg1 ") && line.ends_with('…'));
        assert!(line.len() <= MAX_LINE_TEXT + 3);
    }

    #[test]
    fn rust_and_cpp_frames_are_demangled() {
        assert_eq!(
            frame("_ZN6cudarc6driver6result12malloc_async17h67cca8cdf474afacE+0x29"),
            "cudarc::driver::result::malloc_async+0x29"
        );
        assert_eq!(
            frame("_ZN3foo3barEi+0x10 (libfoo.so+0x1234)"),
            "foo::bar(int)+0x10 (libfoo.so+0x1234)"
        );
        assert_eq!(
            frame("main+0x1d (prog+0x8105d)"),
            "main+0x1d (prog+0x8105d)"
        );
        assert_eq!(frame("_Zgarbage+0x1"), "_Zgarbage+0x1");
        assert_eq!(
            frame("python: train.py:3 in <module>"),
            "python: train.py:3 in <module>"
        );
    }

    #[test]
    fn byte_counts_in_details_read_as_sizes() {
        assert_eq!(
            human_byte_counts(
                "empty_cache() (native allocator): reserved 67108864 -> 4194304 bytes"
            ),
            "empty_cache() (native allocator): reserved 64.0 MiB -> 4.0 MiB"
        );
        assert_eq!(
            human_byte_counts("freed 2048 bytes, 3 pools"),
            "freed 2.0 KiB, 3 pools"
        );
        assert_eq!(human_byte_counts("3 pools"), "3 pools");
    }

    #[test]
    fn startup_frames_are_cut_from_the_outer_end() {
        let c = [
            "leaky+0x3e (gg+0x7fe6)",
            "main+0xd8 (gg+0x81a9)",
            "libc.so.6+0x27249",
            "__libc_start_main+0x84 (libc.so.6+0x27304)",
            "_start+0x20 (gg+0x35e0)",
        ];
        assert_eq!(trim_startup(&c), &c[..2]);
        let py = [
            "_PyEval_EvalFrameDefault+0x2e52 (libpython3.11.so.1.0+0xfd9c2)",
            "Py_RunMain+0x82f (libpython3.11.so.1.0+0x2b9c5f)",
            "Py_BytesMain+0x46 (libpython3.11.so.1.0+0x2ba216)",
            "main+0x12 (python3.11+0x1000)",
            "libc.so.6+0x27249",
        ];
        assert_eq!(trim_startup(&py), &py[..1]);
        let only = ["_start+0x20 (gg+0x35e0)"];
        assert_eq!(trim_startup(&only), &only[..]);
    }
}
