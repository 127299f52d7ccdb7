//! Log lines built without the heap, for the rare moments a hook itself must say
//! something at once (a `GPUGUARD_WARN_AT` crossing): a fixed buffer on the stack,
//! filled with `core::fmt` (no allocation, bounded work) and written with one
//! write(2), so the line is out before the program can die of its next call.

use super::sys::write_stderr;
use std::fmt::{self, Write};

/// A line of at most `N` bytes; what does not fit is cut (the newline is kept).
pub(crate) struct StackLine<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> StackLine<N> {
    pub(crate) fn new() -> Self {
        StackLine {
            buf: [0; N],
            len: 0,
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Ends the line with a newline (replacing the last byte when full) and writes
    /// it to stderr in one call.
    pub(crate) fn emit(mut self) {
        if self.len == N {
            self.len -= 1;
        }
        self.buf[self.len] = b'\n';
        self.len += 1;
        write_stderr(self.as_bytes());
    }
}

impl<const N: usize> Write for StackLine<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // One byte is kept for the newline.
        let room = (N - 1).saturating_sub(self.len);
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// A size as `gpuguard_core::report::human_bytes` writes it ("1023 B", "1.5 KiB"),
/// without allocating.
pub(crate) struct HumanBytes(pub u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
        let mut v = self.0 as f64;
        let mut i = 0;
        while v >= 1024.0 && i + 1 < UNITS.len() {
            v /= 1024.0;
            i += 1;
        }
        if i == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{v:.1} {}", UNITS[i])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuguard_core::report::human_bytes;

    #[test]
    fn sizes_read_as_the_reports_write_them() {
        for b in [
            0,
            1,
            1023,
            1024,
            1536,
            36 << 20,
            (4 << 30) + 12345,
            u64::MAX,
        ] {
            assert_eq!(HumanBytes(b).to_string(), human_bytes(b), "{b}");
        }
    }

    #[test]
    fn long_lines_are_cut_and_end_in_a_newline() {
        let mut l = StackLine::<8>::new();
        l.write_str("abcdefghijkl").unwrap();
        assert_eq!(l.as_bytes(), b"abcdefg");
        let mut l = StackLine::<16>::new();
        write!(l, "x={}", HumanBytes(2048)).unwrap();
        assert_eq!(l.as_bytes(), b"x=2.0 KiB");
    }
}
