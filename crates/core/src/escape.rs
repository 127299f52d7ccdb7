//! Text for a terminal: the library's lines on stderr carry names and paths from the
//! environment and the program (an unknown variable's name, `GPUGUARD_DIR`, a
//! program's name), which anyone can fill with terminal escape sequences. Control
//! characters are written as escapes, in the style `gpuguard`'s own output uses
//! (`\n`, `\t`, `\r`, `\x1b`, `\u{9b}`).

use std::borrow::Cow;
use std::fmt::Write as _;

/// `s` with every control character escaped; borrowed when there is none.
pub fn controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() && (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::controls;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert!(matches!(
            controls("GPUGUARD_CAPP"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            controls("GPUGUARD_\x1b[31mX\x07\u{9b}é\n\t\r\x7f"),
            "GPUGUARD_\\x1b[31mX\\x07\\u{9b}é\\n\\t\\r\\x7f"
        );
    }
}
