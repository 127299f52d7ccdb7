//! Function names for addresses, from a module's ELF symbol table (`.symtab`, else
//! `.dynsym`). `dladdr` only knows exported symbols; most functions of a program
//! (`main`, static helpers) are in `.symtab` alone. Read at report time, off the hot
//! path, and only the few sections needed, so a 1 GB library costs a few reads.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;
const STT_FUNC: u8 = 2;
const ET_EXEC: u16 = 2;

/// Function symbols of one module, sorted by address.
pub struct SymbolTable {
    /// (start, size, name); addresses as the file states them.
    funcs: Vec<(u64, u64, String)>,
    /// Non-PIE executables use absolute addresses; everything else is relative to
    /// the load base.
    pub absolute: bool,
}

fn read_at(f: &mut File, off: u64, len: usize) -> Option<Vec<u8>> {
    // Refuse absurd sizes from a corrupt header rather than allocating them.
    if len > 512 << 20 {
        return None;
    }
    f.seek(SeekFrom::Start(off)).ok()?;
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf).ok()?;
    Some(buf)
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

impl SymbolTable {
    /// Reads a 64-bit little-endian ELF file's function symbols; `None` for anything
    /// else (a FIFO or device put at a module's path is never opened to wait) or a
    /// file without symbols.
    pub fn load(path: &Path) -> Option<SymbolTable> {
        let mut f = crate::regular_file::open(path).ok()?;
        let eh = read_at(&mut f, 0, 64)?;
        if &eh[0..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
            return None;
        }
        let e_type = u16_at(&eh, 16)?;
        let shoff = u64_at(&eh, 40)?;
        let shentsize = u16_at(&eh, 58)? as usize;
        let shnum = u16_at(&eh, 60)? as usize;
        if shentsize < 64 || shnum == 0 {
            return None;
        }
        let sh = read_at(&mut f, shoff, shentsize * shnum)?;
        let section = |i: usize| -> Option<(u32, u64, u64, u32, u64)> {
            let b = sh.get(i * shentsize..(i + 1) * shentsize)?;
            // (type, offset, size, link, entsize)
            Some((
                u32_at(b, 4)?,
                u64_at(b, 24)?,
                u64_at(b, 32)?,
                u32_at(b, 40)?,
                u64_at(b, 56)?,
            ))
        };
        let pick = |want: u32| (0..shnum).find(|&i| section(i).is_some_and(|s| s.0 == want));
        let idx = pick(SHT_SYMTAB).or_else(|| pick(SHT_DYNSYM))?;
        let (_, off, size, link, entsize) = section(idx)?;
        let (_, str_off, str_size, _, _) = section(link as usize)?;
        let syms = read_at(&mut f, off, size as usize)?;
        let strs = read_at(&mut f, str_off, str_size as usize)?;
        let entsize = if entsize >= 24 { entsize as usize } else { 24 };
        let mut funcs = Vec::new();
        for s in syms.chunks_exact(entsize) {
            let name_off = u32_at(s, 0)? as usize;
            let info = s[4];
            let value = u64_at(s, 8)?;
            let sz = u64_at(s, 16)?;
            if info & 0xf != STT_FUNC || value == 0 {
                continue;
            }
            let name = strs.get(name_off..).and_then(|t| {
                let end = t.iter().position(|&c| c == 0)?;
                std::str::from_utf8(&t[..end]).ok()
            });
            if let Some(n) = name.filter(|n| !n.is_empty()) {
                funcs.push((value, sz, n.to_string()));
            }
        }
        funcs.sort_unstable_by_key(|f| f.0);
        Some(SymbolTable {
            funcs,
            absolute: e_type == ET_EXEC,
        })
    }

    /// The function containing `addr` (in the file's address space) and the offset
    /// into it.
    pub fn lookup(&self, addr: u64) -> Option<(&str, u64)> {
        let i = self.funcs.partition_point(|f| f.0 <= addr);
        let (start, size, name) = self.funcs.get(i.checked_sub(1)?)?;
        // Size 0 (hand-written assembly): accept, it is the nearest preceding symbol.
        (*size == 0 || addr < start + size).then(|| (name.as_str(), addr - start))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_functions_in_this_test_binary() {
        let exe = std::env::current_exe().unwrap();
        let t = SymbolTable::load(&exe).expect("test binary has symbols");
        assert!(!t.funcs.is_empty());
        // The first function's own start resolves to itself at offset 0.
        let (start, _, name) = t.funcs[t.funcs.len() / 2].clone();
        let (n, off) = t.lookup(start).unwrap();
        assert_eq!((n, off), (name.as_str(), 0));
        assert!(t.lookup(0).is_none());
    }

    #[test]
    fn rejects_non_elf() {
        let p = std::env::temp_dir().join(format!("gg-notelf-{}", std::process::id()));
        std::fs::write(&p, b"#!/bin/sh\n").unwrap();
        assert!(SymbolTable::load(&p).is_none());
        let _ = std::fs::remove_file(&p);
    }
}
