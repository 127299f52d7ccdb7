//! `oom` reports read for people: the one-line answer to "why out of memory" (the
//! library's stderr line and the first lines of `gpuguard show`), and the first
//! suggestion that would have helped, from the figures the report holds.

use crate::report::{OomReport, OtherProcess, PY_FRAME, human_bytes};

/// The refused call's line for people: the innermost Python frame of the program's
/// own code, past the frameworks' (`site-packages`, `dist-packages`) and the
/// standard library's frames: CuPy's and JAX's allocations are made inside their own
/// Python code, and the line to change is the caller's. The innermost Python frame
/// when every one is a library's; `None` without Python frames.
pub fn program_line(frames: &[String]) -> Option<String> {
    let py: Vec<&str> = frames
        .iter()
        .filter_map(|f| f.strip_prefix(PY_FRAME))
        .collect();
    let library = |f: &str| {
        f.starts_with('<')
            || f.starts_with('(')
            || f.contains("/site-packages/")
            || f.contains("/dist-packages/")
            || f.contains("/lib/python3.")
    };
    py.iter()
        .find(|f| !library(f))
        .or(py.first())
        .map(|f| f.to_string())
}

/// What the other processes on the device hold together.
pub fn others_total(o: &OomReport) -> u64 {
    held_by(&o.others)
}

/// The first thing that would have helped: another process holding most of the
/// device, then what a trim of the frameworks' caches would free, then
/// fragmentation, then this process's own memory in use.
pub fn suggest(o: &OomReport) -> String {
    let others = others_total(o);
    let held = o.held_bytes;
    let pytorch = o.frameworks.iter().any(|f| f.starts_with("pytorch"));
    if others >= o.bytes && others > held {
        let top = o.others.iter().max_by_key(|p| p.held());
        let who = top.map_or(String::new(), |p| {
            format!(
                " (pid {}{}: {})",
                p.pid,
                p.program
                    .as_deref()
                    .map_or(String::new(), |n| format!(" {n}")),
                human_bytes(p.held())
            )
        });
        return format!(
            "another process holds most of the GPU{who}: use another GPU, or wait for it"
        );
    }
    match o.cached_bytes {
        Some(c) if c >= o.bytes && c > 0 => {
            let mut s = format!(
                "a trim would free {}: `gpuguard trim`, GPUGUARD_TRIM_AT, or the framework's own (torch.cuda.empty_cache())",
                human_bytes(c)
            );
            if pytorch {
                s.push_str(
                    "; PyTorch trims and retries once itself: if it still failed, fragmentation: \
                     PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                );
            }
            s
        }
        Some(c) if c > 0 => format!(
            "fragmentation or too little memory: a trim would free only {}; \
             PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch), else a smaller batch",
            human_bytes(c)
        ),
        _ => {
            "this process's own memory fills the device: a smaller batch, or a GPU with more memory"
                .to_string()
        }
    }
}

/// The first thing that would have helped a refusal by a cap: a trim when the
/// frameworks' caches hold the refused bytes (`cached`, at writing), else a larger
/// cap or a smaller batch.
pub fn suggest_cap(bytes: u64, cached: Option<u64>, cap: u64) -> String {
    match cached {
        Some(c) if c >= bytes && c > 0 => format!(
            "a trim would free {}: GPUGUARD_TRIM_AT, `gpuguard trim`, or the framework's own (torch.cuda.empty_cache())",
            human_bytes(c)
        ),
        _ => format!(
            "this process's own memory fills its {} cap: a larger GPUGUARD_CAP, or a smaller batch",
            human_bytes(cap)
        ),
    }
}

/// The first thing that would have helped a refusal by a group's budget: a trim
/// when this process's frameworks cache the refused bytes, else a larger budget.
pub fn suggest_group(bytes: u64, cached: Option<u64>, g: &crate::report::GroupFigures) -> String {
    match cached {
        Some(c) if c >= bytes && c > 0 => format!(
            "a trim would free {}: GPUGUARD_TRIM_AT, `gpuguard trim`, or the framework's own (torch.cuda.empty_cache())",
            human_bytes(c)
        ),
        _ => format!(
            "the group's {} members hold {} of its {} budget: a larger budget (`gpuguard group {} --cap SIZE`), or a smaller batch",
            g.members.len(),
            human_bytes(g.used_bytes),
            g.budget_bytes.map_or("unlimited".to_string(), human_bytes),
            g.name
        ),
    }
}

/// Whether a cap report's refusal came from the group's budget rather than the
/// process's own cap.
pub fn by_group(d: &crate::report::DenialReport) -> bool {
    d.group.is_some()
        && (d.cap_bytes == 0 || d.charged_bytes.saturating_add(d.bytes) <= d.cap_bytes)
}

/// What the other processes in a list hold together.
pub fn held_by(others: &[OtherProcess]) -> u64 {
    others.iter().map(OtherProcess::held).sum()
}

/// A native frame as `function (file:line)` (`step+0x2f (prog+0x37a8) at
/// /src/prog.c:118` gives `step (prog.c:118)`); a frame without a source line is
/// kept whole.
pub fn short_frame(f: &str) -> String {
    match f.rsplit_once(" at ") {
        Some((head, place)) => {
            let name = head.split(['+', ' ']).next().unwrap_or(head);
            let file = place.rsplit('/').next().unwrap_or(place);
            format!("{name} ({file})")
        }
        None => f.to_string(),
    }
}

/// The answer in one line (without gpuguard's prefix or the report's path):
/// `out of memory on device 0: cuMemAlloc_v2 of 1.0 GiB refused at main.c:12 in
/// step; this process held 16.0 GiB (...); other processes 0 B; <suggestion>`.
pub fn answer(o: &OomReport) -> String {
    let mut s = format!(
        "out of memory on device {}: {} of {} refused",
        o.device,
        o.api,
        human_bytes(o.bytes)
    );
    match (&o.python_line, o.frames.first()) {
        (Some(line), _) => s.push_str(&format!(" at {line}")),
        (None, Some(f)) => s.push_str(&format!(" at {}", short_frame(f))),
        (None, None) => {}
    }
    s.push_str(&format!(
        "; this process held {}",
        human_bytes(o.held_bytes)
    ));
    if o.total_bytes > 0 {
        s.push_str(&format!(" of the device's {}", human_bytes(o.total_bytes)));
    }
    if let Some(w) = &o.at_writing {
        s.push_str(&format!(
            " at the refusal ({} at writing, {:.3} s later",
            human_bytes(w.live_bytes),
            w.after_s
        ));
        match (o.in_use_bytes, o.cached_bytes) {
            (Some(u), Some(c)) => s.push_str(&format!(
                ": {} in use by {}, {} cached",
                human_bytes(u),
                if o.frameworks.is_empty() {
                    "frameworks".to_string()
                } else {
                    o.frameworks.join("+")
                },
                human_bytes(c)
            )),
            _ => s.push_str(": no framework split"),
        }
        s.push(')');
    }
    let others = others_total(o);
    s.push_str(&format!("; other processes {}", human_bytes(others)));
    let n = o.others.len();
    if n > 0 {
        s.push_str(&format!(" ({n} process{})", if n == 1 { "" } else { "es" }));
    }
    s.push_str("; ");
    s.push_str(&o.suggestion);
    if let Some(r) = &o.retry {
        s.push_str(&format!("; {}", retry_words(r)));
    }
    s
}

/// `GPUGUARD_OOM_TRIM: 1 pool trimmed and the call retried: it succeeded`.
pub fn retry_words(r: &crate::report::OomRetry) -> String {
    format!(
        "GPUGUARD_OOM_TRIM: {} pool{} trimmed and the call retried: {}",
        r.pools_trimmed,
        if r.pools_trimmed == 1 { "" } else { "s" },
        if r.outcome == "succeeded" {
            "it succeeded"
        } else {
            "refused again"
        }
    )
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_line_is_the_programs_own_past_the_frameworks_and_the_standard_library() {
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cupy = f(&[
            "cuMemAlloc_v2+0x10 (libcuda.so+0x100)",
            "python: /venv/lib/python3.12/site-packages/cupy/_creation/basic.py:34 in empty",
            "python: /usr/lib/python3.12/contextlib.py:81 in inner",
            "python: /home/me/train.py:18 in step",
            "python: /home/me/train.py:40 in <module>",
        ]);
        assert_eq!(
            program_line(&cupy).as_deref(),
            Some("/home/me/train.py:18 in step")
        );
        let debian = f(&[
            "python: /usr/lib/python3/dist-packages/jax/_src/dispatch.py:88 in apply_primitive",
            "python: <frozen runpy>:88 in _run_code",
            "python: run.py:3 in <module>",
        ]);
        assert_eq!(
            program_line(&debian).as_deref(),
            Some("run.py:3 in <module>")
        );
        // Only a library's frames: the innermost of them.
        let lib = f(&["python: /venv/lib/python3.12/site-packages/x/y.py:1 in g"]);
        assert_eq!(
            program_line(&lib).as_deref(),
            Some("/venv/lib/python3.12/site-packages/x/y.py:1 in g")
        );
        assert_eq!(program_line(&f(&["main+0x1 (a.out+0x1)"])), None);
    }
    use super::*;
    use crate::report::AtWriting;

    const GIB: u64 = 1 << 30;

    fn base() -> OomReport {
        OomReport {
            device: 0,
            bytes: GIB,
            api: "cudaMalloc".into(),
            live_bytes: 15 * GIB,
            held_bytes: 15 * GIB,
            total_bytes: 16 * GIB,
            frames: vec!["step+0x2f (train+0x37a8) at /src/train.c:12".into()],
            refusals: 1,
            ..Default::default()
        }
    }

    #[test]
    fn another_process_holding_most_comes_first() {
        let mut o = base();
        o.held_bytes = 2 * GIB;
        o.cached_bytes = Some(2 * GIB);
        o.others = vec![OtherProcess {
            pid: 7,
            program: Some("big".into()),
            nvml_used_bytes: Some(13 * GIB),
            ..Default::default()
        }];
        let s = suggest(&o);
        assert!(
            s.starts_with("another process holds most of the GPU (pid 7 big: 13.0 GiB)"),
            "{s}"
        );
    }

    #[test]
    fn a_trim_then_fragmentation_then_own_memory() {
        let mut o = base();
        o.cached_bytes = Some(3 * GIB);
        o.frameworks = vec!["pytorch".into()];
        let s = suggest(&o);
        assert!(s.starts_with("a trim would free 3.0 GiB"), "{s}");
        assert!(s.contains("expandable_segments"), "{s}");
        o.cached_bytes = Some(GIB / 2);
        assert!(
            suggest(&o).starts_with(
                "fragmentation or too little memory: a trim would free only 512.0 MiB"
            )
        );
        o.cached_bytes = None;
        assert!(suggest(&o).starts_with("this process's own memory fills the device"));
    }

    #[test]
    fn the_line_states_both_moments_and_the_split() {
        let mut o = base();
        o.in_use_bytes = Some(12 * GIB);
        o.cached_bytes = Some(3 * GIB);
        o.frameworks = vec!["pytorch".into()];
        o.at_writing = Some(AtWriting {
            after_s: 0.25,
            live_bytes: 15 * GIB,
            charged_bytes: 15 * GIB,
        });
        o.suggestion = suggest(&o);
        assert_eq!(
            answer(&o),
            "out of memory on device 0: cudaMalloc of 1.0 GiB refused at step (train.c:12); \
             this process held 15.0 GiB of the device's 16.0 GiB at the refusal (15.0 GiB at \
             writing, 0.250 s later: 12.0 GiB in use by pytorch, 3.0 GiB cached); other \
             processes 0 B; a trim would free 3.0 GiB: `gpuguard trim`, GPUGUARD_TRIM_AT, or \
             the framework's own (torch.cuda.empty_cache()); PyTorch trims and retries once \
             itself: if it still failed, fragmentation: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        );
    }
}
