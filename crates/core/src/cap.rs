//! `GPUGUARD_CAP`: how much device memory a process may hold, per device.
//!
//! Forms: one size for every device (`20GiB`, `512MiB`, `1.5GB`, plain bytes), a
//! fraction of each device's memory (`0.5`), or per device (`0:20GiB,1:0.25`; devices
//! not named are uncapped; a bare value among them is the default for the rest). A
//! device is named by its CUDA ordinal (as the process sees it, after
//! `CUDA_VISIBLE_DEVICES`) or by its UUID (`GPU-3b…:4GiB`, the physical GPU whatever
//! its ordinal; a prefix names every GPU whose UUID begins with it).
//! Pure parsing and arithmetic; enforcement lives with the ledger's counters.

use std::collections::BTreeMap;

/// A limit before the device's size is known.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    Bytes(u64),
    /// Of the device's total memory, in (0, 1].
    Fraction(f64),
}

impl Limit {
    /// Bytes allowed on a device of `total` bytes (0 when the size is unknown, then
    /// a fraction cannot be applied and the device stays uncapped). A fraction is
    /// rounded down to the driver's 2 MiB page, so allocations filling it cannot take
    /// a page past it; a size is taken as given.
    pub fn resolve(self, total: u64) -> Option<u64> {
        const PAGE: u64 = 2 << 20;
        match self {
            Limit::Bytes(b) => Some(b),
            Limit::Fraction(_) if total == 0 => None,
            Limit::Fraction(f) => {
                let exact = ((total as f64) * f) as u64;
                Some(if exact >= PAGE {
                    exact / PAGE * PAGE
                } else {
                    exact
                })
            }
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct CapSpec {
    /// For devices not named.
    pub default: Option<Limit>,
    pub per_device: BTreeMap<u32, Limit>,
    /// By UUID or a prefix of one (`gpu-…`, lower case); ahead of the ordinals.
    pub per_uuid: BTreeMap<String, Limit>,
}

pub const ACCEPTED: &str = "a size (20GiB, 512MiB, 1.5GB, bytes), a fraction of device memory in (0, 1] (0.5), or per device by ordinal or UUID (0:20GiB,1:0.25,GPU-3b2f…:8GiB)";

impl CapSpec {
    pub fn parse(text: &str) -> Option<CapSpec> {
        let mut spec = CapSpec::default();
        let text = text.trim();
        if text.is_empty() {
            return None;
        }
        for part in text.split(',').map(str::trim) {
            match part.split_once(':') {
                Some((dev, value)) => {
                    let dev = dev.trim();
                    let limit = parse_limit(value.trim())?;
                    let again = if let Ok(d) = dev.parse::<u32>() {
                        spec.per_device.insert(d, limit).is_some()
                    } else if uuid_name(dev) {
                        spec.per_uuid
                            .insert(dev.to_ascii_lowercase(), limit)
                            .is_some()
                    } else {
                        return None;
                    };
                    if again {
                        return None; // the same device twice
                    }
                }
                None => {
                    if spec.default.replace(parse_limit(part)?).is_some() {
                        return None; // two defaults
                    }
                }
            }
        }
        Some(spec)
    }

    /// The limit of the device with this ordinal, by ordinal or the default.
    pub fn limit_for(&self, device: u32) -> Option<Limit> {
        self.per_device.get(&device).copied().or(self.default)
    }

    /// The limit of the device with this ordinal and UUID (`GPU-…`, as
    /// `uuid_string` writes it; `None` if unknown): a UUID named first, then as
    /// `limit_for`.
    pub fn limit_for_gpu(&self, device: u32, uuid: Option<&str>) -> Option<Limit> {
        uuid.and_then(|u| self.uuid_limit(u))
            .or_else(|| self.limit_for(device))
    }

    /// The limit a UUID named here gives the GPU with this UUID (the longest name
    /// it begins with).
    pub fn uuid_limit(&self, uuid: &str) -> Option<Limit> {
        let u = uuid.to_ascii_lowercase();
        self.per_uuid
            .iter()
            .filter(|(name, _)| u.starts_with(name.as_str()))
            .max_by_key(|(name, _)| name.len())
            .map(|(_, l)| *l)
    }

    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.per_device.is_empty() && self.per_uuid.is_empty()
    }
}

/// `GPU-` and hex digits or dashes: a device UUID or a prefix of one. Any text (the
/// settings are the user's): no slicing inside a character.
pub fn uuid_name(s: &str) -> bool {
    s.len() > 4
        && s.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("gpu-"))
        && s[4..].bytes().all(|c| c.is_ascii_hexdigit() || c == b'-')
}

/// The text form `CapSpec::parse` reads back to the same spec: the default first, then
/// each device in order (`8GiB,0:20GiB,1:0.25`).
impl std::fmt::Display for CapSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        let mut sep = |f: &mut std::fmt::Formatter<'_>| {
            let s = if first { "" } else { "," };
            first = false;
            f.write_str(s)
        };
        if let Some(d) = self.default {
            sep(f)?;
            write!(f, "{d}")?;
        }
        for (dev, limit) in &self.per_device {
            sep(f)?;
            write!(f, "{dev}:{limit}")?;
        }
        for (uuid, limit) in &self.per_uuid {
            sep(f)?;
            write!(f, "{uuid}:{limit}")?;
        }
        Ok(())
    }
}

/// A size in the largest binary unit that holds it exactly (`20GiB`, `1536KiB`, else
/// plain bytes); a fraction with its decimal point (`0.25`, `1.0`). `parse_limit` reads
/// either back to the same limit.
impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Limit::Bytes(b) => f.write_str(&exact_size(b)),
            Limit::Fraction(x) if x.fract() == 0.0 => write!(f, "{x:.1}"),
            Limit::Fraction(x) => write!(f, "{x}"),
        }
    }
}

/// `bytes` as `parse_size` reads it back exactly: the largest binary unit dividing it
/// (`20GiB`, `1536KiB`), or the plain number.
pub fn exact_size(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (unit, shift) in UNITS {
        // Within the range `parse_size` takes with a unit, and exactly so in an f64.
        if bytes != 0 && bytes.trailing_zeros() >= shift && (bytes as f64) < 1.8e19 {
            let n = bytes >> shift;
            if n < 1 << 53 {
                return format!("{n}{unit}");
            }
        }
    }
    bytes.to_string()
}

/// One value: a size with a unit, a fraction (has a decimal point, no unit), or
/// plain bytes.
pub fn parse_limit(s: &str) -> Option<Limit> {
    // Digits or a point first: no sign (`+0.5`), as the documentation shows.
    if !s
        .bytes()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || c == b'.')
    {
        return None;
    }
    if s.bytes().any(|c| c.is_ascii_alphabetic()) {
        return parse_size(s).map(Limit::Bytes);
    }
    if s.contains('.') {
        let f: f64 = s.parse().ok()?;
        return (f > 0.0 && f <= 1.0 && f.is_finite()).then_some(Limit::Fraction(f));
    }
    let b: u64 = s.parse().ok()?;
    (b > 0).then_some(Limit::Bytes(b))
}

/// `20GiB`, `512MiB`, `1.5GB`, `64k`: IEC (KiB, MiB, GiB, TiB, PiB, and the bare K, M,
/// G, T, P) and SI (KB, MB, GB, TB, PB) units, any case; `B` or no unit is bytes. Every
/// size `report::human_bytes` prints reads back (to its one decimal).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let mult: f64 = match unit.as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "p" | "pib" => 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "pb" => 1e15,
        _ => return None,
    };
    if num.is_empty() || num.chars().filter(|&c| c == '.').count() > 1 {
        return None;
    }
    let v: f64 = num.parse().ok()?;
    let bytes = (v * mult).round();
    (1.0..1.8e19).contains(&bytes).then_some(bytes as u64)
}

/// A CUDA device UUID in NVML's text form, `GPU-` and 8-4-4-4-12 hex digits, so a
/// device seen through NVML can be matched with its CUDA ordinal.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_name_with_a_wide_character_is_refused_not_a_panic() {
        for text in ["aaaé:1GiB", "GPUé:1GiB", "é:1GiB", "GPU-é:1GiB"] {
            assert!(CapSpec::parse(text).is_none(), "{text}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("20GiB"), Some(20 << 30));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("512mib"), Some(512 << 20));
        assert_eq!(parse_size("1.5GB"), Some(1_500_000_000));
        assert_eq!(parse_size("4g"), Some(4 << 30));
        assert_eq!(parse_size("100"), Some(100));
        assert_eq!(parse_size("7B"), Some(7));
        for bad in ["12XB", "GiB", "1.2.3GB", "", "0GB", "-1GB"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn single_values() {
        assert_eq!(
            CapSpec::parse("20GiB").unwrap().limit_for(3),
            Some(Limit::Bytes(20 << 30))
        );
        assert_eq!(
            CapSpec::parse("0.5").unwrap().limit_for(0),
            Some(Limit::Fraction(0.5))
        );
        assert_eq!(
            CapSpec::parse("1.0").unwrap().limit_for(0),
            Some(Limit::Fraction(1.0))
        );
        assert_eq!(
            CapSpec::parse("4096").unwrap().limit_for(0),
            Some(Limit::Bytes(4096))
        );
        for bad in ["abc", "0", "-1", "1.5", "12XB", "", "0.0", "nan", "inf"] {
            assert_eq!(CapSpec::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn per_device() {
        let s = CapSpec::parse("0:20GiB, 1:0.25").unwrap();
        assert_eq!(s.limit_for(0), Some(Limit::Bytes(20 << 30)));
        assert_eq!(s.limit_for(1), Some(Limit::Fraction(0.25)));
        assert_eq!(s.limit_for(2), None, "devices not named are uncapped");
        let s = CapSpec::parse("8GiB,1:1GiB").unwrap();
        assert_eq!(s.limit_for(1), Some(Limit::Bytes(1 << 30)));
        assert_eq!(s.limit_for(5), Some(Limit::Bytes(8 << 30)));
        for bad in [
            "0:",
            ":1GiB",
            "x:1GiB",
            "0:1GiB,0:2GiB",
            "1GiB,2GiB",
            "0:1.5",
        ] {
            assert_eq!(CapSpec::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn per_uuid() {
        let u1 = "GPU-3b000000-0000-0000-0000-0000000000a7";
        let u0 = "GPU-11000000-0000-0000-0000-000000000001";
        let s = CapSpec::parse(&format!("{u1}:4GiB, 0:8GiB")).unwrap();
        // The UUID's GPU, whatever its ordinal; the ordinal for the others.
        assert_eq!(s.limit_for_gpu(0, Some(u1)), Some(Limit::Bytes(4 << 30)));
        assert_eq!(s.limit_for_gpu(1, Some(u1)), Some(Limit::Bytes(4 << 30)));
        assert_eq!(s.limit_for_gpu(0, Some(u0)), Some(Limit::Bytes(8 << 30)));
        assert_eq!(s.limit_for_gpu(1, Some(u0)), None);
        assert_eq!(s.limit_for_gpu(0, None), Some(Limit::Bytes(8 << 30)));
        // Any case; a prefix names every GPU it begins.
        let s = CapSpec::parse("gpu-3B:0.5").unwrap();
        assert_eq!(s.limit_for_gpu(5, Some(u1)), Some(Limit::Fraction(0.5)));
        assert_eq!(s.limit_for_gpu(5, Some(u0)), None);
        assert!(!s.is_empty());
        // The longest name a UUID begins with.
        let s = CapSpec::parse(&format!("gpu-3b:1GiB,{u1}:2GiB,gpu-3b0000:3GiB")).unwrap();
        assert_eq!(s.uuid_limit(u1), Some(Limit::Bytes(2 << 30)));
        assert_eq!(
            s.uuid_limit("GPU-3b000011-0000-0000-0000-000000000000"),
            Some(Limit::Bytes(3 << 30))
        );
        assert_eq!(
            s.uuid_limit("GPU-3b110000-0000-0000-0000-000000000000"),
            Some(Limit::Bytes(1 << 30))
        );
        // Reads back from its text.
        let s = CapSpec::parse(&format!("1GiB,{u1}:4GiB,2:0.25")).unwrap();
        assert_eq!(CapSpec::parse(&s.to_string()), Some(s));
        for bad in [
            "GPU-:1GiB",
            "GPU-xyz:1GiB",
            "MIG-3b:1GiB",
            &format!("{u1}:1GiB,{}:2GiB", u1.to_lowercase()),
            &format!("{u1}:"),
        ] {
            assert_eq!(CapSpec::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn uuid_text() {
        let mut u = [0u8; 16];
        u[0] = 0x3b;
        u[15] = 0xa7;
        assert_eq!(uuid_string(&u), "GPU-3b000000-0000-0000-0000-0000000000a7");
    }

    #[test]
    fn resolving() {
        assert_eq!(Limit::Fraction(0.5).resolve(1000), Some(500));
        // Fractions land on 2 MiB pages: 3% of 139.8 GiB.
        let total = 150_109_782_016u64;
        let cap = Limit::Fraction(0.03).resolve(total).unwrap();
        assert_eq!(cap % (2 << 20), 0);
        assert!(
            cap <= (total as f64 * 0.03) as u64 && cap + (2 << 20) > (total as f64 * 0.03) as u64
        );
        assert_eq!(Limit::Fraction(0.5).resolve(0), None);
        assert_eq!(Limit::Bytes(7).resolve(0), Some(7));
    }
}
