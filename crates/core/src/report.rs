//! The report model, schema `gpuguard-report/1`: one set of types shared by the shim
//! (which writes reports), the `gpuguard` CLI (which reads them) and the tests.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;

pub const SCHEMA: &str = "gpuguard-report/1";

/// How a Python frame in a site's `frames` starts (`python: train.py:42 in step`).
pub const PY_FRAME: &str = "python: ";

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub schema: String,
    pub gpuguard_version: String,
    /// Why it was written: `exit`, `signal`, `request`, ...
    pub reason: String,
    /// Per-process sequence number, also in the file name.
    pub seq: u64,
    pub pid: u32,
    pub program: String,
    pub argv: Vec<String>,
    /// Distributed runs: the launcher's rank, local rank and world size, and the
    /// host name; absent when no launcher variable names a rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub time_unix_ms: u64,
    /// Seconds since gpuguard saw the first CUDA call.
    pub uptime_s: f64,
    pub devices: Vec<DeviceReport>,
    pub host_pinned: HostReport,
    /// Live allocations, largest first. `live_omitted` says how many were left out.
    /// (A reader may keep only the first few: `report_stream::from_reader_keeping`.)
    #[serde(deserialize_with = "crate::report_stream::live")]
    pub live: Vec<LiveAllocation>,
    #[serde(default)]
    pub live_omitted: u64,
    /// Call sites of live allocations, most bytes first.
    pub sites: Vec<Site>,
    /// Live allocations no site holds, though stacks are on: made by a signal
    /// handler inside a hook, or whose stack could not be read. Their bytes are in
    /// every total.
    #[serde(default, skip_serializing_if = "Stackless::is_empty")]
    pub stackless: Stackless,
    /// Live allocations whose stacks the sampler passed over (`config.stack_rate`):
    /// the sites' figures, estimates, stand for them. Their bytes are in every total.
    #[serde(default, skip_serializing_if = "Stackless::is_empty")]
    pub sampled_out: Stackless,
    #[serde(default)]
    pub config: ReportConfig,
    /// For a `cap` report: the allocation the cap refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denial: Option<DenialReport>,
    /// For an `oom` report: the allocation the driver refused for lack of memory,
    /// the figures of that moment, the other processes on the device and what would
    /// have helped (`crate::oom`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom: Option<OomReport>,
    /// For a `trim` report: what each mechanism gave back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trim: Option<TrimReport>,
    /// For an `exit` report written because a signal was about to end the process by
    /// its default action (SIGTERM, SIGINT, SIGHUP, SIGABRT): which signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ending: Option<Ending>,
    /// Which frameworks' memory was split into in-use and cached, and how; empty
    /// when no framework could be asked (the memory is then unclassified).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classification: Vec<Classification>,
    /// Python call sites of the framework blocks in use, most bytes first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub python_sites: Vec<PythonSite>,
    /// What gpuguard's Python side cost the program's main thread for this report
    /// (absent when it was not asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_cost: Option<PythonCost>,
    /// Present when a stream of the process was in CUDA graph capture as the report
    /// was written: gpuguard then makes no CUDA call a capture forbids, so some
    /// figures are older (see `CaptureNote`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<CaptureNote>,
}

/// The main thread's time in gpuguard's Python code (`Report::python_cost`): the
/// figure to hold against the program's step time.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PythonCost {
    /// Milliseconds the classification for this report took on the main thread (the
    /// frameworks' snapshots, pool and profile queries, the lines; not the encoding
    /// of the answer).
    pub main_thread_ms: f64,
    /// The last sampling window of each framework that has one (default mode), closed
    /// before this report.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<SampleWindow>,
}

/// One sampling window (`PythonCost::windows`): while it is open the framework's own
/// recorder (or gpuguard's hook) runs on each of its allocations.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SampleWindow {
    pub framework: String,
    /// How long it was open.
    pub ms: f64,
    /// The framework's allocations made while it was open (each one recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocations: Option<u64>,
}

/// A report written while the program was capturing a CUDA graph (`Report::capture`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CaptureNote {
    /// Streams of the process in capture when the report was written.
    pub streams: u64,
    /// What the report did without: pools not measured (their figures are the last
    /// measured), frameworks not asked.
    pub detail: String,
}

/// The signal that ended the process (see `Report::ending`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Ending {
    pub signal: i32,
    /// `SIGTERM`, `SIGINT`, `SIGHUP`, `SIGABRT`.
    pub name: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TrimReport {
    /// `signal`, `request`, `threshold` or `cap`.
    pub trigger: String,
    /// Requests answered by this one trim (signals in a burst merge).
    pub merged: u64,
    /// The Python side: `ran`, `absent`, `finalizing`, `timeout`, `error: ...`.
    pub python: String,
    pub devices: Vec<TrimDevice>,
    /// What the process holds from the driver, before minus after, all devices.
    pub released_bytes: u64,
    pub mechanisms: Vec<TrimMechanism>,
    /// Present when the trim was asked while a stream of the process was in CUDA
    /// graph capture: it waited for the capture to end (a trim's calls would break
    /// it), and then ran or was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deferred: Option<TrimDeferral>,
}

/// A trim held back by a CUDA graph capture (`TrimReport::deferred`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TrimDeferral {
    /// How long it waited for the program's captures to end.
    pub waited_ms: u64,
    /// `ran` (the captures ended and the trim ran) or `skipped` (a capture was still
    /// in progress at the end of the wait, or when the process ended: nothing was
    /// trimmed).
    pub outcome: String,
    pub detail: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TrimDevice {
    pub device: i32,
    /// Live bytes plus what pools hold unused, as gpuguard counts them.
    pub before_bytes: u64,
    pub after_bytes: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TrimMechanism {
    /// `cuda_pools`, `pytorch`, `cupy`, `jax`, `tensorflow`.
    pub name: String,
    /// `trimmed`, `released`, `not_releasable`, `error`, ...
    pub status: String,
    #[serde(default)]
    pub released_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Classification {
    pub framework: String,
    /// `classified` or `unavailable`.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PythonSite {
    pub id: u32,
    pub framework: String,
    /// `file:line in function`, innermost first.
    pub frames: Vec<String>,
    /// What the line's live blocks (or allocations) hold; where the framework's
    /// recorder saw only some of them (`captured` is present: a `-sampled`
    /// framework's windows, or sampled stacks), an estimate scaled by the share of
    /// allocations its windows saw.
    pub live_bytes: u64,
    pub live_count: u64,
    /// Where the figures are estimates: how many of the line's live blocks were
    /// seen. Absent where every one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub captured: Option<u64>,
}

/// A refusal by a cap. The figures are the refusal's own (`device` to
/// `live_bytes`); the report is written later, and `at_writing` says what the same
/// device held then.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DenialReport {
    pub device: i32,
    /// What the refused call asked for.
    pub bytes: u64,
    pub api: String,
    /// Charged against the cap at the refusal: live bytes plus what pools held.
    pub charged_bytes: u64,
    pub cap_bytes: u64,
    /// The device's live bytes at the refusal (absent in older reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_bytes: Option<u64>,
    /// The same device when the report was written (absent in older reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_writing: Option<AtWriting>,
    /// The refused call's stack, innermost first.
    pub frames: Vec<String>,
    /// The other processes on the device, most memory first, and where that comes
    /// from, as in an `oom` report (absent in older reports).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub others: Vec<OtherProcess>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub others_source: String,
    /// The first thing that would have helped (absent in older reports).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub suggestion: String,
    /// The process's group (`GPUGUARD_GROUP`), as its file stood when the report was
    /// written: absent outside a group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupFigures>,
}

/// A group's figures for one device, in a cap report.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GroupFigures {
    pub name: String,
    /// The device's budget (absent: none set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_bytes: Option<u64>,
    /// What the members hold of it together (their leases: reserved, not all live).
    pub used_bytes: u64,
    pub members: Vec<GroupMember>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GroupMember {
    pub pid: u32,
    pub held_bytes: u64,
}

/// A refusal by the driver for lack of memory (an `oom` report). The figures up to
/// `refusals` are the refusal's own; the report is written later by the helper
/// thread, and `at_writing` says what the same device held then.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct OomReport {
    pub device: i32,
    /// What the refused call asked for.
    pub bytes: u64,
    pub api: String,
    /// This process's live bytes on the device at the refusal.
    pub live_bytes: u64,
    /// Live bytes plus what its stream-ordered pools held (as last measured).
    pub held_bytes: u64,
    /// The device's memory as the driver states it (0: unknown).
    pub total_bytes: u64,
    /// The refused call's stack, innermost first.
    pub frames: Vec<String>,
    /// The refused call's innermost Python frame in the program's own code (past
    /// the frameworks' and the standard library's), `file:line in function`, when
    /// the stack has Python frames (`oom::program_line`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_line: Option<String>,
    /// Refusals for lack of memory in the process so far (this one included); the
    /// report names the first since the last `oom` report.
    pub refusals: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_writing: Option<AtWriting>,
    /// Of this process's memory on the device when the report was written: what the
    /// frameworks held behind live tensors and what they kept cached (`null` when no
    /// framework could be asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_use_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_bytes: Option<u64>,
    /// The frameworks whose split that is (`pytorch`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frameworks: Vec<String>,
    /// The other processes on the device, most memory first.
    #[serde(default)]
    pub others: Vec<OtherProcess>,
    /// Where `others` comes from, and what could not be asked.
    #[serde(default)]
    pub others_source: String,
    /// The first thing that would have helped, for people.
    pub suggestion: String,
    /// `GPUGUARD_OOM_TRIM`: the device's pools trimmed and the call retried once
    /// (absent when it was not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<OomRetry>,
}

/// The retry of a refused call after a trim (`GPUGUARD_OOM_TRIM`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct OomRetry {
    /// Stream-ordered pools of the device trimmed before the retry.
    pub pools_trimmed: u64,
    /// `succeeded` (the program got its memory) or `refused` (the driver refused
    /// again).
    pub outcome: String,
}

/// Another process on the refused device: NVML's figure for it, and for a process
/// running gpuguard its own books (from its status file).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct OtherProcess {
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    /// The device memory NVML says it uses (absent: NVML did not list it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvml_used_bytes: Option<u64>,
    /// Whether it runs gpuguard (its status file was found).
    pub guarded: bool,
    /// From its status file: its live bytes, peak, what its pools hold unused,
    /// its cap, and its framework split as of its last report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_held_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_use_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_bytes: Option<u64>,
}

impl OtherProcess {
    /// What it holds on the device: NVML's figure, else its own books (live plus
    /// pools).
    pub fn held(&self) -> u64 {
        self.nvml_used_bytes
            .unwrap_or_else(|| self.live_bytes.unwrap_or(0) + self.pool_held_bytes.unwrap_or(0))
    }
}

/// A capped device when a cap report was written, after its refusal.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct AtWriting {
    /// Seconds from the refusal to the writing.
    pub after_s: f64,
    pub live_bytes: u64,
    /// Charged against the cap: live bytes plus what pools held.
    pub charged_bytes: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DeviceReport {
    pub device: i32,
    /// The device's memory as the driver states it (0 when it could not be asked).
    pub total_bytes: u64,
    /// The cap on this device, `null` when uncapped.
    pub cap_bytes: Option<u64>,
    pub current_bytes: u64,
    pub peak_bytes: u64,
    pub allocs: u64,
    pub frees: u64,
    pub failed: u64,
    #[serde(default)]
    pub denied: u64,
    /// Frees of addresses gpuguard never saw allocated, passed to the driver untouched.
    #[serde(default)]
    pub unknown_frees: u64,
    /// What stream-ordered pools held from the driver at their last measurement
    /// (measured on capped devices; charged against the cap).
    #[serde(default)]
    pub pool_reserved_bytes: u64,
    /// Live bytes by kind (`device`, `managed`, `pitch`, `vmm`, `pool`, `array`).
    #[serde(default)]
    pub by_kind: std::collections::BTreeMap<String, u64>,
    #[serde(default)]
    pub live_count: u64,
    /// Of `current_bytes`: what frameworks hold behind live tensors/arrays, and what
    /// they keep cached; `null` when no framework could be asked. The rest of
    /// `current_bytes` is unclassified (libraries' workspaces, handles, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_use_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_bytes: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HostReport {
    pub current_bytes: u64,
    pub peak_bytes: u64,
    #[serde(default)]
    pub allocs: u64,
    #[serde(default)]
    pub frees: u64,
    #[serde(default)]
    pub live_count: u64,
}

/// An address or handle, written as a `0x...` string (JSON numbers lose precision
/// past 2^53 in many readers), without a heap allocation per value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hex(pub u64);

impl std::fmt::Display for Hex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl Serialize for Hex {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut buf = [0u8; 18];
        let mut i = buf.len();
        let mut v = self.0;
        loop {
            i -= 1;
            buf[i] = DIGITS[(v & 0xf) as usize];
            v >>= 4;
            if v == 0 {
                break;
            }
        }
        buf[i - 1] = b'x';
        buf[i - 2] = b'0';
        s.serialize_str(std::str::from_utf8(&buf[i - 2..]).unwrap_or("0x0"))
    }
}

impl<'de> Deserialize<'de> for Hex {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Hex, D::Error> {
        let text = String::deserialize(d)?;
        let digits = text.strip_prefix("0x").unwrap_or(&text);
        u64::from_str_radix(digits, 16)
            .map(Hex)
            .map_err(|_| serde::de::Error::custom(format!("not a hex address: {text:?}")))
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LiveAllocation {
    /// `0x...`: the device address, or the handle for VMM and arrays.
    pub address: Hex,
    pub bytes: u64,
    /// Device ordinal; for pinned host memory the device of its context.
    pub device: i32,
    pub kind: Cow<'static, str>,
    /// The API the program called (a runtime call labels the driver call beneath it).
    pub api: Cow<'static, str>,
    #[serde(default)]
    pub thread: u32,
    pub age_s: f64,
    /// Index into `sites`, `null` when stacks are off.
    pub site: Option<u32>,
    /// The framework whose blocks lie in it, and how many of its bytes those blocks
    /// use; absent when unclassified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_use_bytes: Option<u64>,
}

/// Live allocations without a stack (`Report::stackless`).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Stackless {
    pub count: u64,
    pub bytes: u64,
}

impl Stackless {
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Site {
    pub id: u32,
    /// Innermost first, gpuguard's and the CUDA libraries' own frames trimmed off.
    pub frames: Vec<String>,
    /// What the site's live allocations hold; where stacks were sampled
    /// (`captured` is present), an unbiased estimate: each captured allocation
    /// counts for the allocations its capture stood for (`sampler`).
    pub live_bytes: u64,
    pub live_count: u64,
    /// Where the figures are estimates: how many of the site's live allocations
    /// were captured. Absent where no capture stood for more than itself: the figures
    /// are then the captured allocations' own sums (past the rate, allocations of the
    /// site that were passed over can still be missing from them: `sampled_out`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub captured: Option<u64>,
    /// The Python lines whose framework blocks fill the site's live allocations
    /// (a framework's segments), with their bytes there, most first (at most
    /// `classify::HOLDERS_KEPT`): `python_site` is an id in `python_sites`. Scaled as
    /// those lines' own figures are. Absent where no block with a line lies in them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_by: Vec<SiteHolder>,
    /// In the library only (never written): where the figures are estimates, what
    /// the captured allocations hold, exactly, so `held_by` can be scaled as the
    /// site's own figures are (0 elsewhere).
    #[serde(skip)]
    pub captured_bytes: u64,
}

/// A Python line holding part of a call site's memory (`Site::held_by`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SiteHolder {
    pub python_site: u32,
    pub bytes: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ReportConfig {
    #[serde(default)]
    pub stack_depth: usize,
    /// `GPUGUARD_STACK_RATE`; `null` (and in reports of versions before it) every
    /// allocation's stack.
    #[serde(default)]
    pub stack_rate: Option<u32>,
    #[serde(default)]
    pub report_signal: Option<i32>,
    #[serde(default)]
    pub dir: String,
    /// `GPUGUARD_MAX_LIVE`, `null` when unlimited.
    #[serde(default)]
    pub max_live: Option<usize>,
    /// `GPUGUARD_SNAPSHOT_EVERY` in milliseconds, `null` when off.
    #[serde(default)]
    pub snapshot_every_ms: Option<u64>,
    /// Stacks past the rate are sampled by bytes and sites are estimates (`sampled_out`
    /// counts the allocations passed over); `false` in reports of versions before,
    /// whose `stackless` counted those allocations.
    #[serde(default)]
    pub sampled_by_bytes: bool,
}

/// `1.5 GiB`-style sizes for people.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_reads_well() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(4 << 30), "4.0 GiB");
    }

    #[test]
    fn hex_addresses() {
        for v in [0u64, 0x10, 0x7f12_3456_7890, u64::MAX] {
            let text = serde_json::to_string(&Hex(v)).unwrap();
            assert_eq!(text, format!("\"{v:#x}\""));
            assert_eq!(serde_json::from_str::<Hex>(&text).unwrap(), Hex(v));
        }
        assert!(serde_json::from_str::<Hex>("\"zz\"").is_err());
    }

    #[test]
    fn round_trips_through_json() {
        let r = Report {
            schema: SCHEMA.into(),
            reason: "exit".into(),
            devices: vec![DeviceReport {
                device: 0,
                cap_bytes: None,
                current_bytes: 5,
                ..Default::default()
            }],
            live: vec![LiveAllocation {
                address: Hex(0x10),
                bytes: 5,
                site: None,
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("\"cap_bytes\":null"));
        assert!(text.contains("\"site\":null"));
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        // No rank: the fields are left out, and files without them still parse.
        assert!(!text.contains("\"rank\""));
        let ranked = Report {
            rank: Some(2),
            host: Some("n1".into()),
            ..r.clone()
        };
        let text = serde_json::to_string(&ranked).unwrap();
        assert!(text.contains("\"rank\":2") && text.contains("\"host\":\"n1\""));
        assert_eq!(serde_json::from_str::<Report>(&text).unwrap(), ranked);
    }
}
