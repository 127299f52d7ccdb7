//! Cache or leak: joins what the frameworks say about their own memory (the Python
//! side's answer, `bridge.py`) to a report. Safe Rust.
//!
//! Per device, `in_use_bytes` and `cached_bytes` come from the frameworks' totals
//! (PyTorch's allocated and reserved, CuPy's pool used and total). Per live
//! allocation, the frameworks' blocks are joined by address: a record that holds a
//! framework's blocks is owned by it, and the blocks in use give its `in_use_bytes`.
//! Python sites aggregate the in-use blocks by their Python stack.

use crate::report::{Classification, LiveAllocation, PythonCost, PythonSite, Report, SiteHolder};
use serde::Deserialize;

/// The Python side's answer to `_gg_classify`.
#[derive(Debug, Default, Deserialize, PartialEq)]
pub struct Answer {
    #[serde(default)]
    pub frameworks: Vec<Classification>,
    #[serde(default)]
    pub devices: Vec<FrameworkDevice>,
    /// `[device, address, size, in_use (0/1), framework]` for each framework block,
    /// and a sixth element, the index of its line in `sites`, where it has one.
    #[serde(default)]
    pub blocks: Vec<Block>,
    #[serde(default)]
    pub sites: Vec<AnswerSite>,
    /// What answering cost the main thread.
    #[serde(default)]
    pub cost: Option<PythonCost>,
}

/// One framework block, as the Python side lists it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(from = "BlockWire")]
pub struct Block {
    pub device: i32,
    pub address: u64,
    pub size: u64,
    pub in_use: bool,
    pub framework: String,
    /// Its line: an index into the answer's `sites`.
    pub line: Option<usize>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum BlockWire {
    Lined(i32, u64, u64, u8, String, usize),
    Plain(i32, u64, u64, u8, String),
}

impl From<BlockWire> for Block {
    fn from(w: BlockWire) -> Block {
        let (device, address, size, in_use, framework, line) = match w {
            BlockWire::Lined(d, a, s, u, f, l) => (d, a, s, u, f, Some(l)),
            BlockWire::Plain(d, a, s, u, f) => (d, a, s, u, f, None),
        };
        Block {
            device,
            address,
            size,
            in_use: in_use != 0,
            framework,
            line,
        }
    }
}

#[derive(Debug, Default, Deserialize, PartialEq)]
pub struct FrameworkDevice {
    pub framework: String,
    pub device: i32,
    pub in_use: u64,
    pub reserved: u64,
}

#[derive(Debug, Default, Deserialize, PartialEq)]
pub struct AnswerSite {
    pub framework: String,
    pub frames: Vec<String>,
    pub bytes: u64,
    pub count: u64,
    /// Where `bytes` and `count` are estimates (a sampled recorder's blocks, scaled
    /// up by the share of allocations its windows saw): the blocks it saw.
    #[serde(default)]
    pub captured: Option<u64>,
    /// The factor the seen blocks were scaled by (with `captured`).
    #[serde(default)]
    pub scale: Option<f64>,
}

impl Answer {
    pub fn parse(text: &str) -> Result<Answer, String> {
        serde_json::from_str(text).map_err(|e| format!("unreadable answer from Python: {e}"))
    }
}

/// Adds the classification to a report; returns whether a framework's recorder
/// gave Python lines (then its memory is better named by them than by stacks).
pub fn apply(report: &mut Report, answer: Answer) -> bool {
    // Sampled lines (a recorder on in short windows) name only some blocks: the
    // stacks' own sites stay.
    let recorded = answer.sites.iter().any(|s| !s.framework.ends_with(SAMPLED));
    report.classification = answer.frameworks;
    report.python_cost = answer.cost;
    for d in &mut report.devices {
        let mine: Vec<&FrameworkDevice> = answer
            .devices
            .iter()
            .filter(|f| f.device == d.device)
            .collect();
        if mine.is_empty() {
            continue;
        }
        let in_use: u64 = mine.iter().map(|f| f.in_use).sum();
        let cached: u64 = mine
            .iter()
            .map(|f| f.reserved.saturating_sub(f.in_use))
            .sum();
        d.in_use_bytes = Some(in_use);
        d.cached_bytes = Some(cached);
    }
    // What each line's seen blocks stand for (a sampled recorder's scale).
    let scale: Vec<f64> = answer
        .sites
        .iter()
        .map(|s| {
            s.scale
                .filter(|f| f.is_finite() && *f >= 1.0)
                .unwrap_or(1.0)
        })
        .collect();
    let credits = join_blocks(&mut report.live, answer.blocks);
    let mut sites: Vec<(usize, PythonSite)> = answer
        .sites
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            (
                i,
                PythonSite {
                    id: 0,
                    framework: s.framework,
                    frames: s.frames,
                    live_bytes: s.bytes,
                    live_count: s.count,
                    captured: s.captured,
                },
            )
        })
        .collect();
    sites.sort_by(|(_, a), (_, b)| {
        b.live_bytes
            .cmp(&a.live_bytes)
            .then_with(|| a.frames.cmp(&b.frames))
    });
    // The answer's index of each line -> its id in the report.
    let mut id_of = vec![0u32; sites.len()];
    for (id, (i, s)) in sites.iter_mut().enumerate() {
        s.id = id as u32;
        id_of[*i] = id as u32;
    }
    report.python_sites = sites.into_iter().map(|(_, s)| s).collect();
    credit_sites(report, &credits, &scale, &id_of);
    recorded
}

/// How many lines a call site names as holding it, most first.
pub const HOLDERS_KEPT: usize = 5;

/// Gives each call site whose allocations hold framework blocks with known lines
/// (`Site::held_by`) those lines and the bytes of their blocks in it, scaled as the
/// lines' own figures are: a framework's segment is requested by whichever operation
/// needed a new one, so its call site says little; the lines whose blocks fill it
/// say who holds it.
fn credit_sites(report: &mut Report, credits: &[(u32, usize, u64)], scale: &[f64], id_of: &[u32]) {
    use std::collections::HashMap;
    let mut by_site: HashMap<u32, HashMap<u32, f64>> = HashMap::new();
    for &(site, line, bytes) in credits {
        let (Some(&id), Some(&f)) = (id_of.get(line), scale.get(line)) else {
            continue;
        };
        *by_site.entry(site).or_default().entry(id).or_default() += bytes as f64 * f;
    }
    for s in &mut report.sites {
        let Some(lines) = by_site.remove(&s.id) else {
            continue;
        };
        // The site's own segments were sampled too (`Site::captured_bytes`): what
        // its captured ones hold stands for all of them.
        let site_scale = match (s.captured, s.captured_bytes) {
            (Some(_), c) if c > 0 => (s.live_bytes as f64 / c as f64).max(1.0),
            _ => 1.0,
        };
        let mut held: Vec<SiteHolder> = lines
            .into_iter()
            .map(|(line, bytes)| SiteHolder {
                python_site: line,
                bytes: (bytes * site_scale).round() as u64,
            })
            .collect();
        held.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then(a.python_site.cmp(&b.python_site))
        });
        held.truncate(HOLDERS_KEPT);
        s.held_by = held;
    }
}

/// How the framework name of Python sites from a sampled recorder ends
/// (`pytorch-sampled`; `cupy-sampled`, from a CuPy memory hook in windows).
pub const SAMPLED: &str = "-sampled";

/// The framework name of Python sites taken from the calling thread's own stack.
pub const FROM_STACK: &str = "python-stack";

/// Python sites from the call sites themselves: a site whose frames include Python
/// frames (read from the allocating thread) gives its Python part as a Python site:
/// the line whose allocation took that memory from the driver. For PyTorch's
/// `cudaMallocAsync` backend each tensor is one such allocation; for a caching
/// allocator it is the line that made the framework grow (a leak that keeps the cache
/// growing shows there).
///
/// When a framework's recorder gave block-exact lines (`recorded`), those are the
/// better answer for its memory; stacks then add only what no framework owns and
/// that is stream-ordered (one allocation per object).
pub fn python_sites_from_stacks(report: &mut Report, recorded: bool) {
    use crate::report::PY_FRAME;
    use std::collections::{BTreeMap, HashMap};
    // Per site: whether any of its live allocations is owned, and whether all are
    // stream-ordered.
    let mut seen: HashMap<u32, (bool, bool)> = HashMap::new();
    for a in &report.live {
        if let Some(id) = a.site {
            let e = seen.entry(id).or_insert((false, true));
            e.0 |= a.owner.is_some();
            e.1 &= a.kind == "pool";
        }
    }
    let mut by: BTreeMap<Vec<String>, (u64, u64)> = BTreeMap::new();
    for s in &report.sites {
        let keep = match seen.get(&s.id) {
            Some(&(owned, all_pool)) => !recorded || (!owned && all_pool),
            None => !recorded,
        };
        if !keep {
            continue;
        }
        let py: Vec<String> = s
            .frames
            .iter()
            .filter_map(|f| f.strip_prefix(PY_FRAME))
            .filter(|f| !f.starts_with('('))
            .map(str::to_string)
            .collect();
        if py.is_empty() {
            continue;
        }
        let e = by.entry(py).or_default();
        e.0 += s.live_bytes;
        e.1 += s.live_count;
    }
    if by.is_empty() {
        return;
    }
    let added = by.len();
    report
        .python_sites
        .extend(by.into_iter().map(|(frames, (bytes, count))| PythonSite {
            id: u32::MAX,
            framework: FROM_STACK.into(),
            frames,
            live_bytes: bytes,
            live_count: count,
            captured: None,
        }));
    // The lines from stacks are new (their ids are all u32::MAX until numbered).
    let n_before = report.python_sites.len() - added;
    report.python_sites.sort_by(|a, b| {
        b.live_bytes
            .cmp(&a.live_bytes)
            .then_with(|| a.frames.cmp(&b.frames))
    });
    // Renumbered in the new order; the call sites' holders follow their lines.
    let mut new_id = vec![0u32; n_before];
    for (i, s) in report.python_sites.iter_mut().enumerate() {
        if let Some(slot) = new_id.get_mut(s.id as usize) {
            *slot = i as u32;
        }
        s.id = i as u32;
    }
    for h in report.sites.iter_mut().flat_map(|s| s.held_by.iter_mut()) {
        if let Some(&id) = new_id.get(h.python_site as usize) {
            h.python_site = id;
        }
    }
}

/// Marks each live device allocation that framework blocks lie in: its owner and
/// the bytes of those blocks in use. Blocks are sorted and searched, so this is
/// O((live + blocks) log blocks). Returns (call site, line, bytes) for the blocks in
/// use with a line, in allocations with a call site.
fn join_blocks(live: &mut [LiveAllocation], mut blocks: Vec<Block>) -> Vec<(u32, usize, u64)> {
    let mut credits = Vec::new();
    blocks.retain(|b| b.size > 0);
    blocks.sort_unstable_by_key(|b| (b.device, b.address));
    for a in live.iter_mut() {
        if !matches!(a.kind.as_ref(), "device" | "pool" | "pitch" | "managed") {
            continue; // VMM handles and arrays have no address to join on
        }
        let (lo, hi) = (a.address.0, a.address.0.saturating_add(a.bytes));
        // First block that could overlap: the last one starting at or before `lo`.
        let start = blocks
            .partition_point(|b| (b.device, b.address) <= (a.device, lo))
            .saturating_sub(1);
        let mut owner: Option<&str> = None;
        let mut in_use = 0u64;
        for b in &blocks[start..] {
            if b.device > a.device || (b.device == a.device && b.address >= hi) {
                break;
            }
            let (blo, bhi) = (b.address, b.address.saturating_add(b.size));
            if b.device < a.device || bhi <= lo {
                continue;
            }
            owner.get_or_insert(&b.framework);
            if b.in_use {
                let inside = bhi.min(hi) - blo.max(lo);
                in_use += inside;
                if let (Some(site), Some(line)) = (a.site, b.line) {
                    credits.push((site, line, inside));
                }
            }
        }
        if let Some(fw) = owner {
            a.owner = Some(fw.to_string());
            a.in_use_bytes = Some(in_use);
        }
    }
    credits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{DeviceReport, Hex};

    fn live(addr: u64, bytes: u64, kind: &'static str) -> LiveAllocation {
        LiveAllocation {
            address: Hex(addr),
            bytes,
            kind: kind.into(),
            ..Default::default()
        }
    }

    #[test]
    fn splits_devices_and_joins_blocks() {
        let mut r = Report {
            devices: vec![DeviceReport {
                device: 0,
                current_bytes: 1000,
                ..Default::default()
            }],
            live: vec![
                live(0x1000, 0x400, "device"), // segment with two blocks, one in use
                live(0x2000, 0x100, "device"), // not the framework's
                live(0x9, 0x100, "vmm"),       // a handle: never joined
            ],
            ..Default::default()
        };
        let answer = Answer::parse(
            r#"{"frameworks":[{"framework":"pytorch","status":"classified"}],
                "devices":[{"framework":"pytorch","device":0,"in_use":300,"reserved":800}],
                "blocks":[[0,4096,256,1,"pytorch"],[0,4352,768,0,"pytorch"],[0,4096000,5,1,"pytorch"]],
                "sites":[{"framework":"pytorch","frames":["a.py:1 in f"],"bytes":10,"count":1},
                         {"framework":"pytorch","frames":["b.py:2 in g"],"bytes":300,"count":2}]}"#,
        )
        .unwrap();
        apply(&mut r, answer);
        assert_eq!(r.devices[0].in_use_bytes, Some(300));
        assert_eq!(r.devices[0].cached_bytes, Some(500));
        assert_eq!(r.live[0].owner.as_deref(), Some("pytorch"));
        assert_eq!(r.live[0].in_use_bytes, Some(256));
        assert_eq!(r.live[1].owner, None);
        assert_eq!(r.live[2].owner, None);
        assert_eq!(r.python_sites[0].frames, vec!["b.py:2 in g"]);
        assert_eq!((r.python_sites[0].id, r.python_sites[1].id), (0, 1));
    }

    #[test]
    fn blocks_on_another_device_do_not_join() {
        let mut r = Report {
            live: vec![LiveAllocation {
                device: 1,
                ..live(0x1000, 0x100, "device")
            }],
            ..Default::default()
        };
        let a = Answer::parse(
            r#"{"frameworks":[{"framework":"cupy","status":"classified"}],"blocks":[[0,4096,256,1,"cupy"]]}"#,
        )
        .unwrap();
        apply(&mut r, a);
        assert_eq!(r.live[0].owner, None);
        // A device no framework spoke of stays unclassified.
        assert!(r.devices.is_empty());
    }

    #[test]
    fn stack_python_frames_become_python_sites_unless_a_framework_owns_them() {
        use crate::report::Site;
        let site = |id: u32, frames: &[&str], bytes: u64| Site {
            id,
            frames: frames.iter().map(|f| f.to_string()).collect(),
            live_bytes: bytes,
            live_count: 1,
            captured: None,
            held_by: Vec::new(),
            captured_bytes: 0,
        };
        let mut r = Report {
            sites: vec![
                site(
                    0,
                    &[
                        "libtorch+0x1",
                        "python: a.py:3 in f",
                        "python: a.py:9 in <module>",
                    ],
                    300,
                ),
                site(1, &["libtorch+0x1", "python: a.py:4 in g"], 200),
                site(2, &["libtorch+0x1", "python: (code no longer alive)"], 50),
                site(3, &["main+0x1"], 10),
                site(
                    4,
                    &[
                        "libtorch+0x1",
                        "python: a.py:3 in f",
                        "python: a.py:9 in <module>",
                    ],
                    5,
                ),
            ],
            live: vec![
                LiveAllocation {
                    site: Some(1),
                    owner: Some("pytorch".into()),
                    kind: "device".into(),
                    ..Default::default()
                },
                LiveAllocation {
                    site: Some(4),
                    kind: "pool".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let mut plain = r.clone();
        python_sites_from_stacks(&mut plain, false);
        assert_eq!(plain.python_sites.len(), 2, "{:?}", plain.python_sites);
        let p = &plain.python_sites[0];
        assert_eq!(p.frames, vec!["a.py:3 in f", "a.py:9 in <module>"]);
        assert_eq!((p.live_bytes, p.live_count), (305, 2));
        assert_eq!(p.framework, FROM_STACK);
        assert_eq!(plain.python_sites[1].frames, vec!["a.py:4 in g"]);
        assert_eq!(plain.python_sites[1].id, 1);
        // With a recorder's blocks, only the stream-ordered allocations' sites.
        python_sites_from_stacks(&mut r, true);
        assert_eq!(r.python_sites.len(), 1);
        assert_eq!(
            (r.python_sites[0].live_bytes, r.python_sites[0].live_count),
            (5, 1)
        );
    }

    #[test]
    fn sampled_sites_are_not_block_exact() {
        // Sites of a framework sampled in windows name only some of its blocks: the
        // stacks' own sites stay (apply says no recorder gave block-exact lines).
        for fw in ["pytorch-sampled", "cupy-sampled"] {
            let mut r = Report::default();
            let a = Answer::parse(&format!(
                r#"{{"sites":[{{"framework":"{fw}","frames":["t.py:29 in train"],"bytes":65536,"count":1}}]}}"#
            ))
            .unwrap();
            assert!(!apply(&mut r, a), "{fw}");
            assert_eq!(r.python_sites[0].framework, fw);
        }
        let mut r = Report::default();
        let a = Answer::parse(
            r#"{"sites":[{"framework":"cupy","frames":["t.py:29 in train"],"bytes":1,"count":1}]}"#,
        )
        .unwrap();
        assert!(apply(&mut r, a));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(Answer::parse("not json").is_err());
        assert_eq!(Answer::parse("{}").unwrap(), Answer::default());
    }
}
