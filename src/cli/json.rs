//! `--json` output: pretty JSON in which the characters a terminal must not see raw
//! are escaped. serde_json escapes only C0 controls, `"` and `\`; a report's strings
//! can also carry DEL, C1 controls (`U+009B` starts an escape sequence on some
//! terminals) and bidirectional overrides, which reach a terminal when the output
//! is read there. Here they are written `\u007f`, `\u009b`, `\u202e`: the same JSON
//! value, parsed, as before.

use super::text::is_unsafe;
use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter};
use std::io::{self, Write};

/// `value` as pretty JSON (two spaces, as `serde_json::to_string_pretty`) with a
/// newline at the end, the characters of [`is_unsafe`] escaped.
pub fn pretty<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<String> {
    let mut out = Vec::with_capacity(4096);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Safe(PrettyFormatter::new()));
    value.serialize(&mut ser)?;
    out.push(b'\n');
    // Only whole UTF-8 text was written (serde_json's own output, and escapes).
    String::from_utf8(out).map_err(|e| serde::ser::Error::custom(e.to_string()))
}

/// serde_json's pretty formatter, with the unsafe characters of a string's text
/// escaped as `\uXXXX`.
struct Safe<'a>(PrettyFormatter<'a>);

impl Formatter for Safe<'_> {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            // C0 controls never get here: serde_json escapes them itself.
            if is_unsafe(c) {
                w.write_all(&fragment.as_bytes()[start..i])?;
                // All of them are in the Basic Multilingual Plane: one `\u` each.
                write!(w, "\\u{:04x}", c as u32)?;
                start = i + c.len_utf8();
            }
        }
        w.write_all(&fragment.as_bytes()[start..])
    }

    // The layout is the pretty formatter's.
    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object_value(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_characters_are_escaped_and_read_back_the_same() {
        let value = serde_json::json!({
            "program": "a\u{7f}b\u{9b}c\u{202e}d\u{2066}e\x1bf",
            "frames": ["plain", "é \u{201c}ok\u{201d}"],
            "nested": {"n": 1, "empty": [], "o": {}}
        });
        let text = pretty(&value).unwrap();
        assert!(text.ends_with("}\n"));
        assert!(
            text.contains(r#""a\u007fb\u009bc\u202ed\u2066e\u001bf""#),
            "{text}"
        );
        assert!(text.contains("é \u{201c}ok\u{201d}"), "{text}");
        assert!(!text.chars().any(|c| c != '\n' && is_unsafe(c)), "{text}");
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, value);
        // The layout is serde_json's own pretty one.
        let plain = serde_json::json!({"a": [1, {"b": "c"}], "d": {}});
        assert_eq!(
            pretty(&plain).unwrap(),
            serde_json::to_string_pretty(&plain).unwrap() + "\n"
        );
    }
}
