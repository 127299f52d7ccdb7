//! Turns the ledger into a `Report` and writes it atomically. Safe Rust: everything the
//! process must be asked (symbol names, device sizes) comes in as closures.

use crate::ledger::{Kind, Ledger, MAX_DEVICES, NO_SITE};
use crate::report::{DeviceReport, HostReport, LiveAllocation, Report, ReportConfig, SCHEMA, Site};
use crate::sites::SiteTable;
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// One native frame as the symbolizer sees it.
pub struct FrameInfo {
    pub text: String,
    /// Inside gpuguard or a CUDA library: trimmed from the top of a site.
    pub internal: bool,
    /// Inside the Python interpreter (or the foreign-function layer it calls C
    /// through): in a site that has Python frames, these and the native frames after
    /// them are the interpreter's plumbing, which the Python frames say better.
    pub interpreter: bool,
}

/// A site's frames as reported: gpuguard's and CUDA's own frames trimmed off the
/// top (never to nothing), and where the site has Python frames, the interpreter's
/// native frames before them. Two captures of one place give the same frames even
/// when their raw stacks differ (one taken by a full unwind, one by the learned
/// walk, which can stop early in a frame of dynamic size such as libffi's).
pub fn site_frames(infos: &[&FrameInfo]) -> Vec<String> {
    use crate::report::PY_FRAME;
    let first_user = infos.iter().position(|f| !f.internal).unwrap_or(0);
    let rest = &infos[first_user..];
    let first_py = rest.iter().position(|f| f.text.starts_with(PY_FRAME));
    let native_end = match first_py {
        Some(p) => rest[..p].iter().position(|f| f.interpreter).unwrap_or(p),
        None => rest.len(),
    };
    rest[..native_end]
        .iter()
        .chain(first_py.map_or(&[][..], |p| &rest[p..]))
        .map(|f| f.text.clone())
        .collect()
}

pub struct ReportInput<'a> {
    pub reason: &'a str,
    pub seq: u64,
    pub pid: u32,
    pub program: &'a str,
    pub argv: Vec<String>,
    pub time_unix_ms: u64,
    pub uptime_s: f64,
    /// Monotonic now, in the clock records were stamped with.
    pub now_ns: u64,
    pub ledger: &'a Ledger,
    pub sites: &'a SiteTable,
    pub api_name: &'a dyn Fn(u8) -> &'static str,
    pub symbolize: &'a dyn Fn(usize) -> FrameInfo,
    pub device_total: &'a dyn Fn(i32) -> u64,
    pub config: ReportConfig,
    pub denial: Option<crate::report::DenialReport>,
    /// Keep only this many live allocations, the largest; `None`: all.
    pub max_live: Option<usize>,
    pub launch: &'a crate::config::Launch,
}

pub fn build(input: &ReportInput<'_>) -> Report {
    let ledger = input.ledger;
    let mut live = ledger.live();
    live.sort_unstable_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.value.cmp(&b.0.value)));

    // Per device: live count and bytes by kind, from the records themselves. Plain
    // arrays here: this loop runs once per live allocation.
    let slot = |d: i32| (d.max(0) as usize).min(MAX_DEVICES - 1);
    let mut per_dev = vec![(0u64, [0u64; Kind::ALL.len()]); MAX_DEVICES];
    let mut host_live = 0u64;
    let mut site_use: HashMap<u32, (u64, u64)> = HashMap::new();
    for (_, r) in &live {
        if r.kind == Kind::Host {
            host_live += 1;
        } else {
            let e = &mut per_dev[slot(r.device.into())];
            e.0 += 1;
            e.1[r.kind as usize] += r.bytes;
        }
        if r.site != NO_SITE {
            let s = site_use.entry(r.site).or_default();
            s.0 += r.bytes;
            s.1 += 1;
        }
    }

    let mut device_ids = ledger.seen_devices();
    for (d, e) in per_dev.iter().enumerate() {
        if e.0 > 0 && !device_ids.contains(&(d as i32)) {
            device_ids.push(d as i32);
        }
    }
    device_ids.sort_unstable();
    let devices = device_ids
        .into_iter()
        .map(|d| {
            let c = ledger.device(d).snapshot();
            let (live_count, bytes_by_kind) = per_dev[slot(d)];
            let by_kind = Kind::ALL
                .iter()
                .filter(|k| bytes_by_kind[**k as usize] > 0)
                .map(|k| (k.name().to_string(), bytes_by_kind[*k as usize]))
                .collect();
            DeviceReport {
                device: d,
                total_bytes: (input.device_total)(d),
                cap_bytes: ledger.device(d).cap(),
                pool_reserved_bytes: ledger
                    .device(d)
                    .pool_reserved
                    .load(std::sync::atomic::Ordering::Relaxed),
                current_bytes: c.current,
                peak_bytes: c.peak,
                allocs: c.allocs,
                frees: c.frees,
                failed: c.failed,
                denied: c.denied,
                unknown_frees: c.unknown_frees,
                by_kind,
                live_count,
                in_use_bytes: None,
                cached_bytes: None,
            }
        })
        .collect();

    let h = ledger.host().snapshot();
    let host_pinned = HostReport {
        current_bytes: h.current,
        peak_bytes: h.peak,
        allocs: h.allocs,
        frees: h.frees,
        live_count: host_live,
    };

    // Sites: symbolize only those that hold live memory, each address once. Stacks
    // that read the same are one site (the lowest id), whatever their raw addresses.
    let all_sites = input.sites.all();
    let mut names: HashMap<usize, FrameInfo> = HashMap::new();
    let mut ids: Vec<&u32> = site_use.keys().collect();
    ids.sort_unstable();
    let mut by_frames: HashMap<Vec<String>, usize> = HashMap::new();
    let mut merged_into: HashMap<u32, u32> = HashMap::new();
    let mut sites: Vec<Site> = Vec::new();
    for &id in ids {
        let Some(stack) = all_sites.get(id as usize) else {
            continue;
        };
        for &pc in stack.iter() {
            names.entry(pc).or_insert_with(|| (input.symbolize)(pc));
        }
        let infos: Vec<&FrameInfo> = stack.iter().map(|pc| &names[pc]).collect();
        let frames = site_frames(&infos);
        let (bytes, count) = site_use[&id];
        match by_frames.get(&frames) {
            Some(&i) => {
                sites[i].live_bytes += bytes;
                sites[i].live_count += count;
                merged_into.insert(id, sites[i].id);
            }
            None => {
                by_frames.insert(frames.clone(), sites.len());
                sites.push(Site {
                    id,
                    frames,
                    live_bytes: bytes,
                    live_count: count,
                });
            }
        }
    }
    sites.sort_unstable_by(|a, b| b.live_bytes.cmp(&a.live_bytes).then(a.id.cmp(&b.id)));

    // Counters and sites above cover every allocation; the list keeps the largest.
    let keep = input.max_live.unwrap_or(usize::MAX).min(live.len());
    let live_omitted = (live.len() - keep) as u64;
    live.truncate(keep);
    let live = live
        .into_iter()
        .map(|(k, r)| LiveAllocation {
            address: crate::report::Hex(k.value),
            bytes: r.bytes,
            device: r.device.into(),
            kind: r.kind.name().into(),
            api: (input.api_name)(r.api).into(),
            thread: r.thread,
            age_s: input.now_ns.saturating_sub(r.t_ns) as f64 / 1e9,
            site: (r.site != NO_SITE).then(|| merged_into.get(&r.site).copied().unwrap_or(r.site)),
            owner: None,
            in_use_bytes: None,
        })
        .collect();

    Report {
        schema: SCHEMA.to_string(),
        gpuguard_version: env!("CARGO_PKG_VERSION").to_string(),
        reason: input.reason.to_string(),
        seq: input.seq,
        pid: input.pid,
        program: input.program.to_string(),
        argv: input.argv.clone(),
        rank: input.launch.rank,
        local_rank: input.launch.local_rank,
        world_size: input.launch.world_size,
        host: input.launch.host.clone(),
        time_unix_ms: input.time_unix_ms,
        uptime_s: input.uptime_s,
        devices,
        host_pinned,
        live,
        live_omitted,
        sites,
        config: input.config.clone(),
        denial: input.denial.clone(),
        trim: None,
        classification: Vec::new(),
        python_sites: Vec::new(),
    }
}

/// `gpuguard.<program>.<pid>.<seq>.<reason>.json`, or with a known rank
/// `gpuguard.<program>.r<rank>.<pid>.<seq>.<reason>.json`, the program name reduced to
/// characters that are safe in a file name.
pub fn file_name(program: &str, rank: Option<u64>, pid: u32, seq: u64, reason: &str) -> String {
    let clean = |s: &str| -> String {
        let c: String = s
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-+".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if c.is_empty() { "unknown".into() } else { c }
    };
    let rank = rank.map_or(String::new(), |r| format!("r{r}."));
    format!(
        "gpuguard.{}.{rank}{pid}.{seq}.{}.json",
        clean(program),
        clean(reason)
    )
}

/// Writes `bytes` as `dir/name` so that a reader never sees a partial file: a private
/// temporary (mode 0600, created new, never through a symlink) renamed into place.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    write_atomic_with(dir, name, |w| w.write_all(bytes))
}

/// As `write_atomic`, with the content streamed by `fill` through a buffer (a report
/// with a million live allocations is never held whole in memory).
pub fn write_atomic_with(
    dir: &Path,
    name: &str,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<PathBuf> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
    let written = fill(&mut w).and_then(|_| w.flush());
    drop(w);
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let dest = dir.join(name);
    // rename() replaces a symlink at `dest` rather than writing through it.
    if let Err(e) = std::fs::rename(&tmp, &dest) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(dest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Key, Record};

    static NO_LAUNCH: crate::config::Launch = crate::config::Launch {
        rank: None,
        local_rank: None,
        world_size: None,
        host: None,
    };

    fn input<'a>(ledger: &'a Ledger, sites: &'a SiteTable) -> ReportInput<'a> {
        ReportInput {
            reason: "exit",
            seq: 1,
            pid: 42,
            program: "prog",
            argv: vec!["prog".into()],
            time_unix_ms: 1,
            uptime_s: 1.0,
            now_ns: 3_000_000_000,
            ledger,
            sites,
            api_name: &|_| "cuMemAlloc_v2",
            symbolize: &|pc| FrameInfo {
                text: if pc >= 1000 {
                    format!("python: p{pc}")
                } else {
                    format!("f{pc}")
                },
                internal: pc < 10,
                interpreter: (500..1000).contains(&pc),
            },
            device_total: &|_| 1 << 30,
            config: ReportConfig::default(),
            denial: None,
            max_live: None,
            launch: &NO_LAUNCH,
        }
    }

    #[test]
    fn live_list_sites_and_counters() {
        let ledger = Ledger::new();
        let sites = SiteTable::new();
        let s = sites.intern(&[1, 2, 100, 200]);
        let rec = |bytes, kind| Record {
            bytes,
            ctx: 0,
            t_ns: 1_000_000_000,
            site: s,
            thread: 7,
            device: 0,
            kind,
            api: 0,
        };
        ledger.insert(Key::device(0x1000), rec(10, Kind::Device));
        ledger.insert(Key::device(0x2000), rec(30, Kind::Pool));
        ledger.insert(Key::host(0x3000), rec(5, Kind::Host));
        let r = build(&input(&ledger, &sites));
        assert_eq!(r.schema, SCHEMA);
        assert_eq!(r.devices.len(), 1);
        assert_eq!(r.devices[0].current_bytes, 40);
        assert_eq!(r.devices[0].live_count, 2);
        assert_eq!(r.devices[0].by_kind["pool"], 30);
        assert_eq!(r.host_pinned.current_bytes, 5);
        assert_eq!(r.live.len(), 3);
        assert_eq!(r.live[0].address.to_string(), "0x2000");
        assert_eq!(r.live[0].bytes, 30);
        assert!((r.live[0].age_s - 2.0).abs() < 1e-9);
        assert_eq!(r.sites.len(), 1);
        // Internal frames (pc < 10 here) are trimmed from the top.
        assert_eq!(r.sites[0].frames, vec!["f100", "f200"]);
        assert_eq!(r.sites[0].live_bytes, 45);
        assert_eq!(r.sites[0].live_count, 3);
        assert_eq!(r.live_omitted, 0);
        assert_eq!(r.rank, None);

        // A limit keeps the largest; counters and sites still cover everything.
        let launch = crate::config::Launch {
            rank: Some(4),
            local_rank: Some(0),
            world_size: Some(8),
            host: Some("n".into()),
        };
        let capped = build(&ReportInput {
            max_live: Some(1),
            launch: &launch,
            ..input(&ledger, &sites)
        });
        assert_eq!(capped.live.len(), 1);
        assert_eq!(capped.live[0].bytes, 30);
        assert_eq!(capped.live_omitted, 2);
        assert_eq!(capped.devices, r.devices);
        assert_eq!(capped.host_pinned, r.host_pinned);
        assert_eq!(capped.sites, r.sites);
        assert_eq!((capped.rank, capped.world_size), (Some(4), Some(8)));
        assert_eq!(capped.host.as_deref(), Some("n"));
        let all = build(&ReportInput {
            max_live: Some(10),
            ..input(&ledger, &sites)
        });
        assert_eq!((all.live.len(), all.live_omitted), (3, 0));
    }

    #[test]
    fn stacks_that_read_the_same_are_one_site() {
        let ledger = Ledger::new();
        let sites = SiteTable::new();
        // Two raw stacks of one place: they differ only in gpuguard's/CUDA's own
        // frames at the top (trimmed), or in the interpreter's frames before the
        // Python ones (one capture walked further than the other).
        let a = sites.intern(&[1, 100, 200]);
        let b = sites.intern(&[2, 3, 100, 200]);
        let c = sites.intern(&[1, 100, 600, 601, 1001, 1002]);
        let d = sites.intern(&[1, 100, 600, 1001, 1002]);
        let other = sites.intern(&[1, 100, 1003]);
        let rec = |site| Record {
            bytes: 8,
            ctx: 0,
            t_ns: 0,
            site,
            thread: 1,
            device: 0,
            kind: Kind::Device,
            api: 0,
        };
        for (i, s) in [a, b, b, c, d, d, other].into_iter().enumerate() {
            ledger.insert(Key::device(0x1000 * (i as u64 + 1)), rec(s));
        }
        let r = build(&input(&ledger, &sites));
        assert_eq!(r.sites.len(), 3, "{:#?}", r.sites);
        let by = |f: &[&str]| r.sites.iter().find(|s| s.frames == f).unwrap();
        let native = by(&["f100", "f200"]);
        assert_eq!(
            (native.id, native.live_count, native.live_bytes),
            (a, 3, 24)
        );
        let py = by(&["f100", "python: p1001", "python: p1002"]);
        assert_eq!((py.id, py.live_count), (c, 3));
        assert_eq!(by(&["f100", "python: p1003"]).live_count, 1);
        // Every live allocation points at a site in the list.
        for l in &r.live {
            assert!(r.sites.iter().any(|s| Some(s.id) == l.site), "{l:?}");
        }
    }

    #[test]
    fn file_names_are_safe() {
        assert_eq!(
            file_name("python3", None, 12, 3, "exit"),
            "gpuguard.python3.12.3.exit.json"
        );
        assert_eq!(
            file_name("python3", Some(3), 12, 3, "snapshot"),
            "gpuguard.python3.r3.12.3.snapshot.json"
        );
        assert_eq!(
            file_name("a/b c", None, 1, 1, "x"),
            "gpuguard.a_b_c.1.1.x.json"
        );
    }

    #[test]
    fn atomic_write_is_private_and_replaces_symlinks() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("gg-write-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("r.json")).unwrap();
        let p = write_atomic(&dir, "r.json", b"{}").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"{}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
