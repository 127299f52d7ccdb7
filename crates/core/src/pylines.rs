//! Python line numbers from a copy of a code object's line table, for frames whose
//! code object is gone by the time a report names them. The hook copies the table
//! (`co_linetable`, an immutable bytes object) while the code runs; this turns a
//! bytecode offset into the line CPython's own `co_lines()` gives for it.
//!
//! Two formats, as CPython documents them: 3.10's pairs of (bytes advanced, line
//! delta), and the location table of 3.11 and later (`Objects/locations.md`).

/// Which line table format a code object has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// 3.10: `(start delta: u8, line delta: i8)` pairs; -128 means no line.
    Pairs310,
    /// 3.11+: location entries, each covering 1 to 8 code units of 2 bytes.
    Locations311,
}

/// The line of the instruction at byte offset `offset`, or `None` when the table
/// gives it none (or does not reach it).
pub fn line_at(format: Format, first_line: i32, table: &[u8], offset: usize) -> Option<i32> {
    match format {
        Format::Pairs310 => pairs_310(first_line, table, offset),
        Format::Locations311 => locations_311(first_line, table, offset),
    }
}

fn pairs_310(first_line: i32, table: &[u8], offset: usize) -> Option<i32> {
    let mut line = first_line;
    let mut end = 0usize;
    for pair in table.chunks_exact(2) {
        let start = end;
        end = start + pair[0] as usize;
        let delta = pair[1] as i8;
        let this = if delta == -128 {
            None
        } else {
            line += i32::from(delta);
            Some(line)
        };
        if start <= offset && offset < end {
            return this;
        }
    }
    None
}

fn locations_311(first_line: i32, table: &[u8], offset: usize) -> Option<i32> {
    let mut i = 0usize;
    let mut line = first_line;
    let mut addr = 0usize;
    let varint = |i: &mut usize| -> Option<u32> {
        let mut v: u32 = 0;
        let mut shift = 0;
        loop {
            let b = *table.get(*i)?;
            *i += 1;
            v |= u32::from(b & 63) << shift;
            if b & 64 == 0 {
                return Some(v);
            }
            shift += 6;
            if shift > 30 {
                return None;
            }
        }
    };
    let svarint = |i: &mut usize| -> Option<i32> {
        let v = varint(i)?;
        Some(if v & 1 != 0 {
            -((v >> 1) as i32)
        } else {
            (v >> 1) as i32
        })
    };
    while i < table.len() {
        let head = table[i];
        if head & 0x80 == 0 {
            return None; // not at an entry's start: a corrupt copy
        }
        i += 1;
        let code = (head >> 3) & 15;
        let start = addr;
        addr += 2 * ((head & 7) as usize + 1);
        let this = match code {
            15 => None,
            14 => {
                line += svarint(&mut i)?;
                varint(&mut i)?; // end line delta
                varint(&mut i)?; // column + 1
                varint(&mut i)?; // end column + 1
                Some(line)
            }
            13 => {
                line += svarint(&mut i)?;
                Some(line)
            }
            10..=12 => {
                line += i32::from(code) - 10;
                i += 2; // column, end column
                Some(line)
            }
            _ => {
                i += 1; // short form: columns
                Some(line)
            }
        };
        if start <= offset && offset < addr {
            return this;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_of_3_10() {
        // Lines 5 (bytes 0..6), none (6..8), 7 (8..12).
        let t = [6u8, 0, 2, 0x80, 4, 2];
        assert_eq!(line_at(Format::Pairs310, 5, &t, 0), Some(5));
        assert_eq!(line_at(Format::Pairs310, 5, &t, 5), Some(5));
        assert_eq!(line_at(Format::Pairs310, 5, &t, 6), None);
        assert_eq!(line_at(Format::Pairs310, 5, &t, 10), Some(7));
        assert_eq!(line_at(Format::Pairs310, 5, &t, 12), None);
    }

    #[test]
    fn locations_of_3_11() {
        // One short-form entry (code 0, 1 unit) at the first line, one "one line"
        // form (code 11: +1) of 2 units, a "no column" entry (13) with +3 of 1 unit,
        // a long form (14) of -2, and a "no location" entry.
        let t = [
            0x80,
            0x05, // code 0, length 1
            0x80 | (11 << 3) | 1,
            4,
            9, // code 11, length 2: line +1
            0x80 | (13 << 3),
            6, // code 13: svarint 6 -> +3
            0x80 | (14 << 3),
            5,
            0,
            1,
            2,                // code 14: svarint 5 -> -2
            0x80 | (15 << 3), // no location
        ];
        let at = |o| line_at(Format::Locations311, 10, &t, o);
        assert_eq!(at(0), Some(10));
        assert_eq!(at(2), Some(11));
        assert_eq!(at(5), Some(11));
        assert_eq!(at(6), Some(14));
        assert_eq!(at(8), Some(12));
        assert_eq!(at(10), None);
        assert_eq!(at(12), None);
        // A truncated copy gives no answer rather than a wrong one.
        assert_eq!(line_at(Format::Locations311, 10, &t[..6], 6), None);
    }
}
