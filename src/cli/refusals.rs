//! How `gpuguard show` answers a refusal: an `oom` report's answer first (the refused
//! call, this process's memory at the refusal and at writing, the other processes on
//! the device, the suggestion), and a cap report's refusal with its two moments.

use super::text::{FRAMES_SHOWN, clean, frames};
use gpuguard_core::report::{self, human_bytes};

/// An `oom` report's answer, before the rest of it: the refused call, this process's
/// memory at the refusal and at writing (with the frameworks' split), the other
/// processes on the device, and the first suggestion.
pub fn render_oom(out: &mut String, o: &report::OomReport) {
    use gpuguard_core::oom::{others_total, short_frame};
    let at = match (&o.python_line, o.frames.first()) {
        (Some(line), _) => format!(" at {}", clean(line)),
        (None, Some(f)) => format!(" at {}", clean(&short_frame(f))),
        (None, None) => String::new(),
    };
    put!(
        out,
        "out of memory on device {}: {} of {} refused{at}",
        o.device,
        clean(&o.api),
        human_bytes(o.bytes)
    );
    let of_total = if o.total_bytes > 0 {
        format!(" of the device's {}", human_bytes(o.total_bytes))
    } else {
        String::new()
    };
    put!(
        out,
        "  at the refusal: this process held {}{of_total} ({} live)",
        human_bytes(o.held_bytes),
        human_bytes(o.live_bytes)
    );
    if let Some(w) = &o.at_writing {
        let split = match (o.in_use_bytes, o.cached_bytes) {
            (Some(u), Some(c)) => format!(
                "; {} in use by {}, {} cached",
                human_bytes(u),
                if o.frameworks.is_empty() {
                    "frameworks".to_string()
                } else {
                    clean(&o.frameworks.join("+")).into_owned()
                },
                human_bytes(c)
            ),
            _ => "; no framework split".to_string(),
        };
        put!(
            out,
            "  at writing, {:.3} s later: {} live{split}",
            w.after_s,
            human_bytes(w.live_bytes)
        );
    }
    put!(
        out,
        "  other processes on the device: {} ({})",
        human_bytes(others_total(o)),
        clean(&o.others_source)
    );
    for p in &o.others {
        let mut line = format!(
            "    pid {} {}",
            p.pid,
            clean(p.program.as_deref().unwrap_or("?"))
        );
        if let Some(b) = p.nvml_used_bytes {
            line.push_str(&format!(": NVML {}", human_bytes(b)));
        }
        if p.guarded {
            line.push_str(&format!(
                "; gpuguard: {} live, peak {}, pools {}",
                human_bytes(p.live_bytes.unwrap_or(0)),
                human_bytes(p.peak_bytes.unwrap_or(0)),
                human_bytes(p.pool_held_bytes.unwrap_or(0))
            ));
            if let (Some(u), Some(c)) = (p.in_use_bytes, p.cached_bytes) {
                line.push_str(&format!(
                    ", {} in use, {} cached",
                    human_bytes(u),
                    human_bytes(c)
                ));
            }
        }
        put!(out, "{line}");
    }
    put!(out, "  suggestion: {}", clean(&o.suggestion));
    if let Some(r) = &o.retry {
        put!(out, "  {}", gpuguard_core::oom::retry_words(r));
    }
    put!(
        out,
        "  refusals for lack of memory in the process: {}",
        o.refusals
    );
    put!(out, "  refused call:");
    for f in frames(&o.frames).iter().take(FRAMES_SHOWN) {
        put!(out, "        {f}");
    }
    put!(out);
}

/// A cap refusal: its figures at the refusal, then the device's when the report was
/// written (the helper thread writes it later; the table above is of that moment).
pub fn render_refusal(out: &mut String, d: &report::DenialReport) {
    let by = match &d.group {
        Some(g) if gpuguard_core::oom::by_group(d) => format!("group {}'s budget", clean(&g.name)),
        _ => "cap".to_string(),
    };
    put!(
        out,
        "  {by} refused {} ({}) on device {}",
        human_bytes(d.bytes),
        clean(&d.api),
        d.device
    );
    let live = |b: Option<u64>| b.map_or(String::new(), |b| format!(" ({} live)", human_bytes(b)));
    if d.cap_bytes == 0 {
        // No cap of its own: the group's budget refused it.
        put!(
            out,
            "    at the refusal: {} in use{}",
            human_bytes(d.charged_bytes),
            live(d.live_bytes)
        );
    } else {
        put!(
            out,
            "    at the refusal: {} of its {} cap in use{}",
            human_bytes(d.charged_bytes),
            human_bytes(d.cap_bytes),
            live(d.live_bytes)
        );
    }
    if let Some(g) = &d.group {
        let members: Vec<String> = g
            .members
            .iter()
            .map(|m| format!("pid {} {}", m.pid, human_bytes(m.held_bytes)))
            .collect();
        put!(
            out,
            "    group {}: budget {}, its members hold {} ({})",
            clean(&g.name),
            g.budget_bytes.map_or("none".to_string(), human_bytes),
            human_bytes(g.used_bytes),
            members.join(", ")
        );
    }
    if let Some(w) = &d.at_writing {
        let of_cap = if d.cap_bytes == 0 {
            String::new()
        } else {
            format!(" of its {} cap", human_bytes(d.cap_bytes))
        };
        put!(
            out,
            "    at writing, {:.3} s later: {}{of_cap} in use{}",
            w.after_s,
            human_bytes(w.charged_bytes),
            live(Some(w.live_bytes))
        );
    }
    if !d.suggestion.is_empty() {
        put!(
            out,
            "    other processes on the device: {} ({})",
            human_bytes(gpuguard_core::oom::held_by(&d.others)),
            clean(&d.others_source)
        );
        put!(out, "    suggestion: {}", clean(&d.suggestion));
    }
}
