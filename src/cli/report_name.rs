//! Report file names, `gpuguard.<program>[.r<rank>].<pid>.<seq>.<reason>.json` (the
//! library's `reporter::file_name`), read back: `run` tells its command's reports
//! by their writers' pids, `trim` finds a process's trim reports.

/// A report file's name, `gpuguard.<program>[.r<rank>].<pid>.<seq>.<reason>.json`,
/// read from the right (program names may hold dots): (pid, seq, reason).
pub fn report_name_parts(name: &str) -> Option<(u32, u64, &str)> {
    let stem = name.strip_prefix("gpuguard.")?.strip_suffix(".json")?;
    let mut parts = stem.rsplit('.');
    let reason = parts.next()?;
    let seq: u64 = parts.next()?.parse().ok()?;
    let pid: u32 = parts.next()?.parse().ok()?;
    Some((pid, seq, reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_names() {
        assert_eq!(
            report_name_parts("gpuguard.gg.12.3.trim.json"),
            Some((12, 3, "trim"))
        );
        assert_eq!(
            report_name_parts("gpuguard.my.prog.r1.12.3.exit.json"),
            Some((12, 3, "exit"))
        );
        assert_eq!(report_name_parts("gpuguard.gg.x.3.trim.json"), None);
    }
}
