//! Turns the ledger into a `Report` and writes it atomically. Safe Rust: everything the
//! process must be asked (symbol names, device sizes) comes in as closures.
//!
//! Why one file of about 710 lines before its tests: building the report, streaming
//! `live[]` and the atomic write share the entry type and its order; the write is the
//! build's last step.

use crate::ledger::{Key, Kind, Ledger, MAX_DEVICES, NO_SITE, Record};
use crate::report::{
    DeviceReport, HostReport, LiveAllocation, Report, ReportConfig, SCHEMA, Site, Stackless,
};
use crate::sampler;
use crate::sites::SiteTable;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock, TryLockError};

/// One native frame as the symbolizer sees it.
pub struct FrameInfo {
    pub text: String,
    /// The functions the compiler inlined at this address, innermost first, each
    /// its own frame (`name (inlined) at file:line`): a site lists them before
    /// `text`, the function that holds the code.
    pub inlined: Vec<String>,
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
        .flat_map(|f| f.inlined.iter().chain(std::iter::once(&f.text)).cloned())
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

/// One live allocation in the report's order, 40 bytes: what the report shows of a
/// record (not its context), so writing the list needs no lookup in the ledger (a
/// random access into a map of ~100 MB per entry) and shows one consistent moment.
/// Ordered as the report lists them: largest first, then by space and address.
#[derive(Clone, Copy, Debug)]
struct LiveEntry {
    /// `(MAX62 - bytes) << 2 | space`: no allocation comes near 2^62 bytes.
    rank: u64,
    value: u64,
    t_ns: u64,
    site: u32,
    thread: u32,
    device: i16,
    kind: Kind,
    api: u8,
}

impl PartialEq for LiveEntry {
    fn eq(&self, o: &Self) -> bool {
        (self.rank, self.value) == (o.rank, o.value)
    }
}

impl Eq for LiveEntry {}

impl Ord for LiveEntry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.rank, self.value).cmp(&(o.rank, o.value))
    }
}

impl PartialOrd for LiveEntry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

const MAX62: u64 = u64::MAX >> 2;

impl LiveEntry {
    fn new(key: Key, r: &Record) -> LiveEntry {
        LiveEntry {
            rank: ((MAX62 - r.bytes.min(MAX62)) << 2) | key.space as u64,
            value: key.value,
            t_ns: r.t_ns,
            site: r.site,
            thread: r.thread,
            device: r.device,
            kind: r.kind,
            api: r.api,
        }
    }

    fn bytes(&self) -> u64 {
        MAX62 - (self.rank >> 2)
    }
}

/// The live allocations a report lists, in order, 40 bytes each: written by
/// `write_json` (streamed) or turned into `Report::live` by `materialize`.
pub struct LiveList {
    entries: Vec<LiveEntry>,
}

impl LiveList {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The whole report, `live` included (held in memory: fine for tests and small
/// ledgers; a million live allocations take ~130 MB this way, see `build_parts`).
pub fn build(input: &ReportInput<'_>) -> Report {
    let (mut report, live) = build_parts(input);
    materialize(&mut report, &live, input);
    report
}

/// What one site's live records hold: exact sums, and the sums weighted by what
/// each capture stood for (`sampler`), which are the site's figures where any record
/// was sampled.
#[derive(Clone, Copy, Default)]
struct SiteUse {
    bytes: u64,
    captured: u64,
    weighted_bytes: f64,
    weighted_count: f64,
    /// Some record's weight was not one.
    sampled: bool,
}

impl SiteUse {
    fn add(&mut self, r: &Record) {
        let w = sampler::weight_value(r.weight).max(1.0);
        self.bytes = self.bytes.saturating_add(r.bytes);
        self.captured += 1;
        self.weighted_bytes += r.bytes as f64 * w;
        self.weighted_count += w;
        self.sampled |= r.weight != sampler::ONE;
    }

    fn merge(&mut self, o: &SiteUse) {
        self.bytes = self.bytes.saturating_add(o.bytes);
        self.captured += o.captured;
        self.weighted_bytes += o.weighted_bytes;
        self.weighted_count += o.weighted_count;
        self.sampled |= o.sampled;
    }

    /// (live bytes, live count, captured): exact where no record was sampled.
    fn figures(&self) -> (u64, u64, Option<u64>) {
        if !self.sampled {
            return (self.bytes, self.captured, None);
        }
        (
            self.weighted_bytes.round() as u64,
            (self.weighted_count.round() as u64).max(self.captured),
            Some(self.captured),
        )
    }
}

/// The report without its `live` list (empty), and that list as 40-byte entries in
/// order (a million take 40 MB, a third of the ledger's own memory), which
/// `write_json` streams into the file. One pass over the ledger; with `max_live` only
/// that many entries are kept (a bounded heap).
pub fn build_parts(input: &ReportInput<'_>) -> (Report, LiveList) {
    let ledger = input.ledger;
    let all_sites = input.sites.all();

    // Per device: live count and bytes by kind, from the records themselves; per
    // site: bytes and count. Plain arrays: this runs once per live allocation.
    let slot = |d: i32| (d.max(0) as usize).min(MAX_DEVICES - 1);
    let mut per_dev = vec![(0u64, [0u64; Kind::ALL.len()]); MAX_DEVICES];
    let mut host_live = 0u64;
    let mut site_use: Vec<SiteUse> = vec![SiteUse::default(); all_sites.len()];
    let cap = input.max_live.unwrap_or(usize::MAX);
    let mut entries: Vec<LiveEntry> = Vec::new();
    let mut heap: std::collections::BinaryHeap<LiveEntry> = std::collections::BinaryHeap::new();
    let mut total = 0u64;
    let mut stackless = Stackless::default();
    let mut sampled_out = Stackless::default();
    if input.max_live.is_none() {
        entries.reserve(ledger.len() + 1024);
    }
    ledger.for_each_live(|k, r| {
        total += 1;
        if r.kind == Kind::Host {
            host_live += 1;
        } else {
            let e = &mut per_dev[slot(r.device.into())];
            e.0 += 1;
            e.1[r.kind as usize] += r.bytes;
        }
        if r.site == NO_SITE {
            let s = if r.weight == sampler::NONE {
                &mut sampled_out
            } else {
                &mut stackless
            };
            s.count += 1;
            s.bytes += r.bytes;
        } else {
            let i = r.site as usize;
            if i >= site_use.len() {
                site_use.resize(i + 1, SiteUse::default());
            }
            site_use[i].add(r);
        }
        let e = LiveEntry::new(k, r);
        if input.max_live.is_none() {
            entries.push(e);
        } else if heap.len() < cap {
            heap.push(e);
        } else if heap.peek().is_some_and(|top| e < *top) {
            heap.pop();
            heap.push(e);
        }
    });
    if input.max_live.is_some() {
        entries = heap.into_vec();
    }
    entries.sort_unstable();

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
    let mut names: HashMap<usize, FrameInfo> = HashMap::new();
    let mut by_frames: HashMap<Vec<String>, usize> = HashMap::new();
    // Site id -> the id it was merged into (only for merged ones).
    let mut merged_into: HashMap<u32, u32> = HashMap::new();
    let mut sites: Vec<Site> = Vec::new();
    // What each of `sites` holds, merged sites included.
    let mut uses: Vec<SiteUse> = Vec::new();
    for (id, u) in site_use.iter().enumerate() {
        if u.captured == 0 {
            continue;
        }
        let Some(stack) = all_sites.get(id) else {
            continue;
        };
        for &pc in stack.iter() {
            names.entry(pc).or_insert_with(|| (input.symbolize)(pc));
        }
        let infos: Vec<&FrameInfo> = stack.iter().map(|pc| &names[pc]).collect();
        let frames = site_frames(&infos);
        match by_frames.get(&frames) {
            Some(&i) => {
                uses[i].merge(u);
                merged_into.insert(id as u32, sites[i].id);
            }
            None => {
                by_frames.insert(frames.clone(), sites.len());
                uses.push(*u);
                sites.push(Site {
                    id: id as u32,
                    frames,
                    ..Site::default()
                });
            }
        }
    }
    for (s, u) in sites.iter_mut().zip(&uses) {
        (s.live_bytes, s.live_count, s.captured) = u.figures();
        if s.captured.is_some() {
            s.captured_bytes = u.bytes;
        }
    }
    sites.sort_unstable_by(|a, b| b.live_bytes.cmp(&a.live_bytes).then(a.id.cmp(&b.id)));
    // The list's entries point at the merged ids, streamed or materialized alike.
    if !merged_into.is_empty() {
        for e in entries.iter_mut() {
            if let Some(&to) = merged_into.get(&e.site) {
                e.site = to;
            }
        }
    }

    // Counters and sites above cover every allocation; the list keeps the largest.
    let live_omitted = total.saturating_sub(entries.len() as u64);

    let report = Report {
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
        live: Vec::new(),
        live_omitted,
        sites,
        stackless: if input.config.stack_depth > 0 {
            stackless
        } else {
            Stackless::default()
        },
        sampled_out,
        config: input.config.clone(),
        denial: input.denial.clone(),
        oom: None,
        trim: None,
        ending: None,
        classification: Vec::new(),
        python_sites: Vec::new(),
        python_cost: None,
        capture: None,
    };
    (report, LiveList { entries })
}

/// A list entry as the report model has it.
fn live_allocation(input: &ReportInput<'_>, e: &LiveEntry) -> LiveAllocation {
    LiveAllocation {
        address: crate::report::Hex(e.value),
        bytes: e.bytes(),
        device: e.device.into(),
        kind: e.kind.name().into(),
        api: (input.api_name)(e.api).into(),
        thread: e.thread,
        age_s: input.now_ns.saturating_sub(e.t_ns) as f64 / 1e9,
        site: (e.site != NO_SITE).then_some(e.site),
        owner: None,
        in_use_bytes: None,
    }
}

/// Appends `v` in decimal, two digits at a time.
fn push_u64(buf: &mut Vec<u8>, mut v: u64) {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    let mut d = [0u8; 20];
    let mut i = d.len();
    while v >= 100 {
        let r = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        d[i..i + 2].copy_from_slice(&PAIRS[r..r + 2]);
    }
    if v >= 10 {
        let r = v as usize * 2;
        i -= 2;
        d[i..i + 2].copy_from_slice(&PAIRS[r..r + 2]);
    } else {
        i -= 1;
        d[i] = b'0' + v as u8;
    }
    buf.extend_from_slice(&d[i..]);
}

/// A name as a JSON string, escaped by serde only where it needs to be.
fn json_str(s: &str) -> Vec<u8> {
    serde_json::to_vec(s).unwrap_or_else(|_| b"\"\"".to_vec())
}

/// Writes `live[]` entries straight from ledger records: the fields and their order
/// as `LiveAllocation`'s derived `Serialize` (a test holds the two equal), with the
/// names (kinds, APIs) escaped once, not once per entry.
struct LiveWriter<'a> {
    input: &'a ReportInput<'a>,
    kinds: Vec<Vec<u8>>,
    apis: Vec<Option<Vec<u8>>>,
}

impl<'a> LiveWriter<'a> {
    fn new(input: &'a ReportInput<'a>) -> Self {
        LiveWriter {
            input,
            kinds: Kind::ALL.iter().map(|k| json_str(k.name())).collect(),
            apis: vec![None; 256],
        }
    }

    /// Appends the entry for `e`.
    fn entry(&mut self, buf: &mut Vec<u8>, e: &LiveEntry) {
        let r = e;
        buf.extend_from_slice(b"{\"address\":\"0x");
        let v = e.value;
        let digits = (64 - v.leading_zeros()).div_ceil(4).max(1);
        for i in (0..digits).rev() {
            buf.push(b"0123456789abcdef"[((v >> (4 * i)) & 0xf) as usize]);
        }
        buf.extend_from_slice(b"\",\"bytes\":");
        push_u64(buf, e.bytes());
        buf.extend_from_slice(b",\"device\":");
        if r.device < 0 {
            buf.push(b'-');
        }
        push_u64(buf, r.device.unsigned_abs().into());
        buf.extend_from_slice(b",\"kind\":");
        buf.extend_from_slice(&self.kinds[r.kind as usize]);
        buf.extend_from_slice(b",\"api\":");
        let api_name = self.input.api_name;
        let api = self.apis[r.api as usize].get_or_insert_with(|| json_str(api_name(r.api)));
        buf.extend_from_slice(api);
        buf.extend_from_slice(b",\"thread\":");
        push_u64(buf, r.thread.into());
        buf.extend_from_slice(b",\"age_s\":");
        let age = self.input.now_ns.saturating_sub(r.t_ns) as f64 / 1e9;
        if serde_json::to_writer(&mut *buf, &age).is_err() {
            buf.push(b'0');
        }
        buf.extend_from_slice(b",\"site\":");
        if r.site == NO_SITE {
            buf.extend_from_slice(b"null}");
        } else {
            push_u64(buf, r.site.into());
            buf.push(b'}');
        }
    }
}

/// Fills `report.live` from the list (for a framework classification, which annotates
/// the entries, or a reader that wants the whole document).
pub fn materialize(report: &mut Report, live: &LiveList, input: &ReportInput<'_>) {
    report.live = live
        .entries
        .iter()
        .map(|e| live_allocation(input, e))
        .collect();
}

/// Writes `report` as compact JSON with its `live` list streamed from the ledger, one
/// entry at a time (nothing the size of the list is built). A report whose `live` is
/// already filled (`materialize`) is written as it is.
pub fn write_json(
    w: &mut dyn Write,
    report: &Report,
    live: &LiveList,
    input: &ReportInput<'_>,
) -> std::io::Result<()> {
    if !report.live.is_empty() || live.entries.is_empty() {
        return serde_json::to_writer(w, report).map_err(std::io::Error::other);
    }
    // Everything but the list is small: serialize it with `live` empty and write the
    // entries where the empty list stands. `"live":[]` cannot occur inside a JSON
    // string (its quotes would be escaped), so the first one is the field.
    let head = serde_json::to_vec(report).map_err(std::io::Error::other)?;
    const MARK: &[u8] = b"\"live\":[]";
    let at = head
        .windows(MARK.len())
        .position(|x| x == MARK)
        .ok_or_else(|| std::io::Error::other("report without a live field"))?
        + MARK.len()
        - 1;
    w.write_all(&head[..at])?;
    // Entries are formatted into a local buffer and handed on in large writes: one
    // call through `dyn Write` per 256 KiB, not one per JSON token.
    let mut buf: Vec<u8> = Vec::with_capacity(256 << 10);
    let mut lw = LiveWriter::new(input);
    let mut first = true;
    for e in &live.entries {
        if !first {
            buf.push(b',');
        }
        first = false;
        lw.entry(&mut buf, e);
        if buf.len() >= 255 << 10 {
            w.write_all(&buf)?;
            buf.clear();
        }
    }
    w.write_all(&buf)?;
    w.write_all(&head[at..])
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
    // The reason is the last field before `.json`: a dot in it (a C API reason such
    // as `epoch.3`) would make the name ambiguous.
    format!(
        "gpuguard.{}.{rank}{pid}.{seq}.{}.json",
        clean(program),
        clean(reason).replace('.', "_")
    )
}

/// Writes `bytes` as `dir/name` so that a reader never sees a partial file: a private
/// temporary (see `write_atomic_with`) renamed into place.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    write_atomic_with(dir, name, |w| w.write_all(bytes))
}

/// As `write_atomic`, with the content streamed by `fill` through a buffer (a report
/// with a million live allocations is never held whole in memory).
///
/// The temporary file has a name of its own (`temp_file_name`: host, pid, a sequence
/// number and 64 random bits), is created new (`O_EXCL`: never through a symlink or
/// onto anything already there) with mode 0600, and a fresh name is tried when one is
/// taken, so nothing placed in the directory by someone else can block a report. The
/// rename replaces a symlink at `dir/name` rather than writing through it. The first
/// report a process writes into a directory first removes the temporaries that writers
/// killed mid-write left there (`remove_stale_temps`).
pub fn write_atomic_with(
    dir: &Path,
    name: &str,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<PathBuf> {
    clean_once(dir);
    let pid = std::process::id();
    write_atomic_named(dir, name, fill, || {
        temp_file_name(pid, TEMP_SEQ.fetch_add(1, Relaxed), random_u64())
    })
}

/// How many names are tried before giving up: each is 64 random bits, so only someone
/// who can read this process's memory could have taken them all.
const TEMP_ATTEMPTS: usize = 32;

static TEMP_SEQ: AtomicU64 = AtomicU64::new(1);

/// `write_atomic_with`, the temporary's names coming from `next_name`.
fn write_atomic_named(
    dir: &Path,
    name: &str,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    mut next_name: impl FnMut() -> String,
) -> std::io::Result<PathBuf> {
    let (tmp, f) = {
        let mut attempt = 0;
        loop {
            let tmp = dir.join(next_name());
            let opened = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp);
            match opened {
                Ok(f) => break (tmp, f),
                Err(e) if e.kind() == ErrorKind::AlreadyExists && attempt + 1 < TEMP_ATTEMPTS => {
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    };
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

const TEMP_PREFIX: &str = ".gpuguard-";
const TEMP_SUFFIX: &str = ".tmp";

/// A temporary report file's name: `.gpuguard-<host>-<pid>-<seq>-<random>.tmp`, where
/// `<host>` is 8 hex digits hashed from this machine's host name (so a report directory
/// shared between machines never has one machine judge another's writers) and
/// `<random>` 16 hex digits.
pub fn temp_file_name(pid: u32, seq: u64, random: u64) -> String {
    format!(
        "{TEMP_PREFIX}{:08x}-{pid}-{seq}-{random:016x}{TEMP_SUFFIX}",
        host_tag()
    )
}

/// The writer pid of a temporary file name made by `temp_file_name` on this machine;
/// `None` for any other name, including another machine's temporaries.
pub fn temp_file_writer(file_name: &str) -> Option<u32> {
    let body = file_name
        .strip_prefix(TEMP_PREFIX)?
        .strip_suffix(TEMP_SUFFIX)?;
    let mut parts = body.split('-');
    let (host, pid, seq, random) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    let dec = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let ok = parts.next().is_none()
        && hex(host, 8)
        && u32::from_str_radix(host, 16) == Ok(host_tag())
        && dec(pid)
        && dec(seq)
        && hex(random, 16);
    if ok { pid.parse().ok() } else { None }
}

/// 32 bits of FNV-1a over this machine's host name (its UTS namespace's, as `uname`
/// says), read once.
fn host_tag() -> u32 {
    static TAG: OnceLock<u32> = OnceLock::new();
    *TAG.get_or_init(|| {
        let name = std::fs::read("/proc/sys/kernel/hostname").unwrap_or_default();
        let name = name.trim_ascii_end();
        name.iter().fold(0x811c_9dc5u32, |h, &b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        })
    })
}

/// 64 bits nobody outside this process can predict: std's hasher keys come from the
/// operating system's random source once per process, and the time and a counter make
/// each value new.
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Relaxed));
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

/// Runs `remove_stale_temps` for `dir` the first time this process writes there. The
/// list of directories is only ever held for a moment; if it stays taken (held by a
/// thread when the process forked), the cleaning is left to a later report rather
/// than waited for.
fn clean_once(dir: &Path) {
    static CLEANED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let mut tries = 0;
    let mut cleaned = loop {
        match CLEANED.try_lock() {
            Ok(guard) => break guard,
            Err(TryLockError::Poisoned(p)) => break p.into_inner(),
            Err(_) if tries < 1000 => {
                tries += 1;
                std::thread::yield_now();
            }
            Err(_) => return,
        }
    };
    if cleaned.iter().any(|d| d == dir) {
        return;
    }
    cleaned.push(dir.to_path_buf());
    drop(cleaned);
    remove_stale_temps(dir);
}

/// Removes from `dir` the temporary report files whose writer died mid-write: names
/// made by `temp_file_name` on this machine, regular files owned by this user, whose
/// writer pid has no `/proc/<pid>`. Nothing else is touched; without `/proc` nothing
/// is. Returns how many were removed.
pub fn remove_stale_temps(dir: &Path) -> usize {
    let Ok(me) = std::fs::metadata("/proc/self") else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name.to_str().and_then(temp_file_writer) else {
            continue;
        };
        let ours = entry
            .metadata() // of the entry itself, never a symlink's target
            .is_ok_and(|m| m.file_type().is_file() && m.uid() == me.uid());
        let writer_gone = || {
            matches!(
                std::fs::symlink_metadata(format!("/proc/{pid}")),
                Err(e) if e.kind() == ErrorKind::NotFound
            )
        };
        if ours && writer_gone() && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
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
                inlined: Vec::new(),
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
            weight: crate::sampler::ONE,
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
            weight: crate::sampler::ONE,
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
    fn streamed_report_reads_back_as_the_built_one() {
        let ledger = Ledger::new();
        let sites = SiteTable::new();
        let s = sites.intern(&[1, 2, 100]);
        // Stacks that read as `s` does (differing only in trimmed internal frames):
        // merged into `s`, in the streamed list as in the built one.
        let dup = sites.intern(&[3, 100]);
        let dup2 = sites.intern(&[4, 5, 100]);
        let other = sites.intern(&[1, 101]);
        let mut n = 0u64;
        let mut put = |key: Key, bytes: u64, device: i16, kind: Kind, site: u32| {
            n += 1;
            ledger.insert(
                key,
                Record {
                    bytes,
                    ctx: 0,
                    t_ns: n * 123_456_789,
                    site,
                    thread: n as u32,
                    device,
                    kind,
                    api: (n % 3) as u8,
                    weight: crate::sampler::ONE,
                },
            );
        };
        put(Key::device(0x1000), 10, 0, Kind::Device, s);
        put(
            Key::device(0xffff_ffff_ffff_fff0),
            30,
            1,
            Kind::Pool,
            NO_SITE,
        );
        put(Key::vmm(0x1000), 30, 0, Kind::Vmm, s);
        put(Key::array(7), 30, 2, Kind::Array, s);
        put(Key::host(0x1000), 5, -1, Kind::Host, NO_SITE);
        put(Key::device(0), 1 << 40, 0, Kind::Managed, s);
        put(Key::device(0x2000), 20, 0, Kind::Device, dup);
        put(Key::device(0x3000), 3, 1, Kind::Device, dup2);
        put(Key::device(0x4000), 7, 0, Kind::Device, other);
        for max_live in [None, Some(0), Some(2), Some(100)] {
            let base = ReportInput {
                max_live,
                api_name: &|a| ["cuMemAlloc_v2", "we\"ird\\name\n", "cuMemCreate"][a as usize],
                ..input(&ledger, &sites)
            };
            let built = build(&base);
            let (report, live) = build_parts(&base);
            assert!(report.live.is_empty());
            let mut out = Vec::new();
            write_json(&mut out, &report, &live, &base).unwrap();
            let back: Report = serde_json::from_slice(&out).unwrap();
            assert_eq!(back, built, "max_live {max_live:?}");
            // One site per place; every entry points at a listed (merged) site.
            assert_eq!(back.sites.len(), 2, "{:#?}", back.sites);
            let merged = back.sites.iter().find(|x| x.frames == ["f100"]).unwrap();
            assert_eq!((merged.id, merged.live_count), (s, 6));
            assert_eq!(merged.live_bytes, (1 << 40) + 10 + 30 + 30 + 20 + 3);
            for l in &back.live {
                assert!(l.site.is_none_or(|id| id == s || id == other), "{l:?}");
                assert!(
                    l.site
                        .is_none_or(|id| back.sites.iter().any(|x| x.id == id))
                );
            }
            if max_live.is_none() {
                let to_merged = back.live.iter().filter(|l| l.site == Some(s)).count();
                assert_eq!(to_merged, 6);
            }
            assert_eq!(
                serde_json::to_string(&back).unwrap().len(),
                out.len(),
                "compact like serde's"
            );
            if max_live.is_none() {
                // Largest first; ties by space, then address.
                let order: Vec<(u64, String)> = back
                    .live
                    .iter()
                    .map(|a| (a.bytes, a.address.to_string()))
                    .collect();
                assert_eq!(order[0].0, 1 << 40);
                assert_eq!(
                    order[1..4].iter().map(|o| o.1.as_str()).collect::<Vec<_>>(),
                    ["0xfffffffffffffff0", "0x1000", "0x7"]
                );
            }
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
        // A reason with dots (the C API's own words) stays one field.
        assert_eq!(
            file_name("python3.12", None, 5, 2, "epoch.3"),
            "gpuguard.python3.12.5.2.epoch_3.json"
        );
    }

    /// A fresh, empty directory for one test.
    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gg-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A pid that no process has: a child that has been waited for.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        pid
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn anything_placed_at_a_temporary_name_is_passed_over() {
        use std::os::unix::fs::symlink;
        let dir = scratch("squat");
        let victim = dir.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        // Someone who can write the directory took the names tried first: a file, a
        // symlink to a file of theirs, a dangling symlink, a directory.
        let taken = ["t-file", "t-link", "t-dangling", "t-dir"];
        std::fs::write(dir.join("t-file"), b"theirs").unwrap();
        symlink(&victim, dir.join("t-link")).unwrap();
        symlink(dir.join("nowhere"), dir.join("t-dangling")).unwrap();
        std::fs::create_dir(dir.join("t-dir")).unwrap();
        let mut tried = Vec::new();
        let mut pending = taken
            .iter()
            .map(|t| t.to_string())
            .chain(["t-free".to_string()]);
        let p = write_atomic_named(
            &dir,
            "r.json",
            |w| w.write_all(b"{}"),
            || {
                let n = pending.next().unwrap();
                tried.push(n.clone());
                n
            },
        )
        .unwrap();
        assert_eq!(tried, ["t-file", "t-link", "t-dangling", "t-dir", "t-free"]);
        assert_eq!(std::fs::read(&p).unwrap(), b"{}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read(dir.join("t-file")).unwrap(), b"theirs");
        assert!(
            !dir.join("nowhere").exists(),
            "a dangling symlink was followed"
        );
        assert_eq!(
            names(&dir),
            [
                "r.json",
                "t-dangling",
                "t-dir",
                "t-file",
                "t-link",
                "victim"
            ]
        );

        // With every name taken the write fails (bounded), leaving nothing behind.
        let e = write_atomic_named(&dir, "s.json", |w| w.write_all(b"{}"), || "t-file".into())
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists);
        assert!(!dir.join("s.json").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn plausible_temporary_names_do_not_block_reports() {
        use std::os::unix::fs::symlink;
        let dir = scratch("plausible");
        let victim = dir.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let name = "gpuguard.prog.42.1.exit.json";
        let pid = std::process::id();
        let seq = TEMP_SEQ.load(Relaxed);
        // The fixed name earlier versions used, and this process's next names with
        // guessable random parts.
        let mut squat = vec![format!(".{name}.tmp")];
        for s in seq..seq + 64 {
            for r in [0, 1, u64::MAX, u64::from(pid), s] {
                squat.push(temp_file_name(pid, s, r));
            }
        }
        for (i, n) in squat.iter().enumerate() {
            if i % 2 == 0 {
                symlink(&victim, dir.join(n)).unwrap();
            } else {
                std::fs::write(dir.join(n), b"theirs").unwrap();
            }
        }
        let p = write_atomic(&dir, name, b"{\"ok\":1}").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"{\"ok\":1}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        // Two writers of the same report name at once both succeed.
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..50 {
                        write_atomic(&dir, "same.json", &[b'x'; 4096]).unwrap();
                    }
                });
            }
        });
        assert_eq!(std::fs::read(dir.join("same.json")).unwrap(), [b'x'; 4096]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn temporary_names_are_unique_and_recognised() {
        let pid = std::process::id();
        let n = temp_file_name(pid, 7, 0xabc);
        assert!(
            n.starts_with(".gpuguard-") && n.ends_with(&format!("-{pid}-7-0000000000000abc.tmp"))
        );
        assert_eq!(temp_file_writer(&n), Some(pid));
        let all: std::collections::HashSet<u64> = (0..1000).map(|_| random_u64()).collect();
        assert_eq!(all.len(), 1000);
        let other_host = format!(
            ".gpuguard-{:08x}-{pid}-7-0000000000000abc.tmp",
            host_tag() ^ 1
        );
        for other in [
            other_host.as_str(),
            ".gpuguard.prog.42.1.exit.json.tmp",
            "gpuguard.prog.42.1.exit.json",
            &n[1..],
            &n[..n.len() - 4],
            &n.replace("-7-", "-x-"),
            &n.replace("-7-", "--"),
            &n.replace(".tmp", "-1.tmp"),
            &n.replace("0000000000000abc", "abc"),
        ] {
            assert_eq!(temp_file_writer(other), None, "{other}");
        }
    }

    #[test]
    fn temporaries_of_dead_writers_are_removed_and_nothing_else() {
        use std::os::unix::fs::symlink;
        let dir = scratch("stale");
        let dead = dead_pid();
        let live = std::process::id();
        let stale = temp_file_name(dead, 3, 1);
        let stale_link = temp_file_name(dead, 4, 2);
        let stale_dir = temp_file_name(dead, 5, 3);
        let in_progress = temp_file_name(live, 3, 4);
        let other_host = format!(
            ".gpuguard-{:08x}-{dead}-3-0000000000000001.tmp",
            host_tag() ^ 1
        );
        std::fs::write(dir.join(&stale), vec![b'x'; 1 << 20]).unwrap();
        symlink("/etc/hostname", dir.join(&stale_link)).unwrap();
        std::fs::create_dir(dir.join(&stale_dir)).unwrap();
        for keep in [
            in_progress.as_str(),
            other_host.as_str(),
            ".gpuguard.prog.42.1.exit.json.tmp",
            "notes.tmp",
        ] {
            std::fs::write(dir.join(keep), b"x").unwrap();
        }
        let before = names(&dir);
        assert_eq!(remove_stale_temps(&dir), 1);
        let after = names(&dir);
        assert_eq!(
            before
                .into_iter()
                .filter(|n| *n != stale)
                .collect::<Vec<_>>(),
            after
        );

        // The first report written into a directory cleans it; later ones do not look.
        std::fs::write(dir.join(&stale), b"x").unwrap();
        write_atomic(&dir, "a.json", b"{}").unwrap();
        assert!(!dir.join(&stale).exists(), "the first report cleans");
        std::fs::write(dir.join(&stale), b"x").unwrap();
        write_atomic(&dir, "b.json", b"{}").unwrap();
        assert!(
            dir.join(&stale).exists(),
            "later reports do not list the directory"
        );
        let _ = std::fs::remove_dir_all(&dir);
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

    #[test]
    fn inlined_frames_come_before_the_function_that_holds_them() {
        let f = |text: &str, inlined: &[&str], internal| FrameInfo {
            text: text.into(),
            inlined: inlined.iter().map(|s| s.to_string()).collect(),
            internal,
            interpreter: false,
        };
        // gpuguard's own frame is cut with what was inlined into it.
        let own = f("hook+0x1 (libgpuguard.so+0x1)", &["inner (inlined)"], true);
        let load = f(
            "load+0x9 (p+0x9) at p.c:20",
            &["paths (inlined) at p.c:8", "open (inlined) at p.c:14"],
            false,
        );
        let main = f("main+0x5 (p+0x5) at p.c:30", &[], false);
        assert_eq!(
            site_frames(&[&own, &load, &main]),
            [
                "paths (inlined) at p.c:8",
                "open (inlined) at p.c:14",
                "load+0x9 (p+0x9) at p.c:20",
                "main+0x5 (p+0x5) at p.c:30"
            ]
        );
    }
}
