//! Text for a terminal. The library's lines on stderr and the command's output carry
//! names and paths from the environment, the program and its reports (an unknown
//! variable's name, `GPUGUARD_DIR`, a program's argv, frames, file names), which
//! anyone can fill with terminal escape sequences or with characters that reorder a
//! line. Those are written as escapes: `\n`, `\t`, `\r`, `\x1b`, `\u{202e}`.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Characters never sent raw to a terminal: C0 controls, DEL and C1 controls (a C1
/// `U+009B` is a CSI on some terminals), the bidirectional overrides, embeddings,
/// isolates and marks, which reorder what follows them on the line (`U+202E` shows
/// `exe.txt` as `txt.exe`), and the line and paragraph separators, which some
/// viewers break a line at.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        || matches!(
            c,
            '\u{200e}' | '\u{200f}' | '\u{061c}' | '\u{2028}' | '\u{2029}'
        )
}

/// `s` with the characters of [`is_unsafe`] escaped; borrowed when there is none.
pub fn clean(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_unsafe) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if is_unsafe(c) && (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_unsafe(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::clean;

    #[test]
    fn unsafe_characters_are_escaped_and_the_rest_kept() {
        assert!(matches!(
            clean("GPUGUARD_CAPP"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            clean("GPUGUARD_\x1b[31mX\x07\u{9b}é\n\t\r\x7f"),
            "GPUGUARD_\\x1b[31mX\\x07\\u{9b}é\\n\\t\\r\\x7f"
        );
        assert_eq!(clean("train\u{202e}gnp.py"), "train\\u{202e}gnp.py");
        assert_eq!(clean("a\u{2028}b"), "a\\u{2028}b");
    }
}
