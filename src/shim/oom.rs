//! What an `oom` report says beyond the books: the refusal the hook kept (its
//! figures of the moment), the device as the report found it, the frameworks'
//! split, the other processes on the device (NVML's per-process list, and the status
//! files of those running gpuguard) and the first suggestion. Helper thread only:
//! it reads files and asks NVML.

use super::books::{Books, Denial, RETRY_SUCCEEDED};
use super::real;
use super::sys;
use gpuguard_core::report::{AtWriting, OomReport, OomRetry, OtherProcess, Report};
use gpuguard_core::status::{self, Status};

/// The `oom` section of a report already built (`report`: its device table and
/// classification), for the refusal `d` whose stack is `frames`.
pub(super) fn describe(
    books: &Books,
    report: &Report,
    d: &Denial,
    frames: Vec<String>,
) -> OomReport {
    let dev = report.devices.iter().find(|x| x.device == d.device);
    let python_line = gpuguard_core::oom::program_line(&frames);
    let frameworks = report
        .classification
        .iter()
        .filter(|c| c.status == "classified")
        .map(|c| c.framework.clone())
        .collect();
    let (others, others_source) = others_on(books, d.device);
    // While hooks journal, the hook's own figure trails the program: the drain kept
    // the moment's (`Ledger::mark`).
    let live = if books.ledger.direct() {
        d.live
    } else {
        books.ledger.live_at_mark().unwrap_or(d.live)
    };
    let pools = d.charged.saturating_sub(d.live);
    let mut o = OomReport {
        device: d.device,
        bytes: d.bytes,
        api: super::table::api_name(d.api).to_string(),
        live_bytes: live,
        held_bytes: live + pools,
        total_bytes: books.total(d.device),
        frames,
        python_line,
        refusals: books.oom_counts[d.device as usize].load(std::sync::atomic::Ordering::Relaxed),
        at_writing: Some(AtWriting {
            after_s: sys::monotonic_ns().saturating_sub(d.t_ns) as f64 / 1e9,
            live_bytes: dev.map_or(0, |x| x.current_bytes),
            charged_bytes: books.ledger.device(d.device).charged(),
        }),
        in_use_bytes: dev.and_then(|x| x.in_use_bytes),
        cached_bytes: dev.and_then(|x| x.cached_bytes),
        frameworks,
        others,
        others_source,
        suggestion: String::new(),
        retry: (d.retry != 0).then(|| OomRetry {
            pools_trimmed: u64::from(d.pools_trimmed),
            outcome: if d.retry == RETRY_SUCCEEDED {
                "succeeded"
            } else {
                "refused"
            }
            .into(),
        }),
    };
    o.suggestion = gpuguard_core::oom::suggest(&o);
    o
}

/// The other processes on `device`: NVML's list joined with the status files of the
/// processes running gpuguard on the same device (by UUID), most memory first; and
/// where that came from.
pub(super) fn others_on(books: &Books, device: i32) -> (Vec<OtherProcess>, String) {
    let me = std::process::id();
    let uuid = books.device_uuid(device);
    let mut sources = Vec::new();
    let mut out: Vec<OtherProcess> = Vec::new();
    match uuid.as_deref().map(real::nvml_processes) {
        Some(Ok(list)) => {
            sources.push("NVML".to_string());
            for (pid, bytes) in list.into_iter().filter(|(p, _)| *p != me) {
                out.push(OtherProcess {
                    pid,
                    program: comm(pid),
                    nvml_used_bytes: Some(bytes),
                    ..OtherProcess::default()
                });
            }
        }
        Some(Err(why)) => sources.push(format!("no NVML list ({why})")),
        None => sources.push("no NVML list (the driver gave no UUID for the device)".into()),
    }
    // Only a directory the library itself would use (this user's, mode 0700), as
    // `gpuguard ps` reads it: files another user could plant are not believed.
    let statuses = status::status_dir_here().and_then(|dir| {
        use std::os::unix::fs::MetadataExt;
        let me = std::fs::metadata("/proc/self")?.uid();
        status::check_dir(&dir, me)?;
        status::read_all(&dir)
    });
    match statuses {
        Ok(all) => {
            sources.push("status files".into());
            for s in all.iter().filter(|s| s.pid != me) {
                join_status(&mut out, s, device, uuid.as_deref());
            }
        }
        Err(e) => sources.push(format!("no status files ({e})")),
    }
    out.sort_by_key(|p| std::cmp::Reverse(p.held()));
    (out, sources.join(", "))
}

/// A guarded process's own figures for the device, joined to its NVML entry (or
/// added): matched by UUID, or by ordinal when either side has no UUID.
fn join_status(out: &mut Vec<OtherProcess>, s: &Status, device: i32, uuid: Option<&str>) {
    let Some(d) = s.devices.iter().find(|x| match (uuid, x.uuid.as_deref()) {
        (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
        _ => x.device == device,
    }) else {
        return;
    };
    let at = match out.iter().position(|p| p.pid == s.pid) {
        Some(i) => i,
        None => {
            out.push(OtherProcess {
                pid: s.pid,
                ..OtherProcess::default()
            });
            out.len() - 1
        }
    };
    let p = &mut out[at];
    p.guarded = true;
    p.program = Some(s.program.clone());
    p.live_bytes = Some(d.live_bytes);
    p.peak_bytes = Some(d.peak_bytes);
    p.pool_held_bytes = Some(d.pool_held_bytes);
    p.cap_bytes = d.cap_bytes;
    p.in_use_bytes = d.framework_in_use_bytes;
    p.cached_bytes = d.framework_cached_bytes;
}

/// A process's command name (`/proc/PID/comm`), if it is there to read.
fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
        .filter(|s| !s.is_empty())
}
