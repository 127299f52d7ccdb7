//! `gpuguard metrics`: every guarded process and group of this machine in the
//! Prometheus text format (OpenMetrics when the scraper asks for it), from their
//! status and group files (`fleet`): `--listen ADDR:PORT` serves `/metrics`,
//! `--textfile FILE` writes it for node_exporter's textfile collector (`--every` to
//! keep it fresh). The families and labels are in docs/metrics.md.

use super::fleet::{Dir, Fleet, Skip, Source, View};
use super::output::{warn, write_file};
use super::{Failure, Outcome};
use gpuguard_core::status::{self, Status};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Metric;
use prometheus_client::registry::{Registry, Unit};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The Content-Type of OpenMetrics text.
pub const OPENMETRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How often the directories are read between scrapes, so that a process that lives
/// a second is still seen (and kept for the grace period).
const POLL: Duration = Duration::from_secs(1);

/// A label value is cut to this many characters (a program name is the process's).
const MAX_VALUE_CHARS: usize = 128;

/// `gpuguard metrics` options.
#[derive(clap::Args)]
#[command(
    group(clap::ArgGroup::new("target").required(true).args(["listen", "textfile"])),
    after_help = "Reads the status files of every guarded process it may read: this \
    user's status directory, or as root every user's (/dev/shm/gpuguard-UID, \
    /run/user/UID/gpuguard, and GPUGUARD_STATUS_DIR), and the group files \
    (groups/*.group) beside them. It only reads them: nothing is removed or written \
    there. Families and labels: docs/metrics.md."
)]
pub struct MetricsArgs {
    /// Serve /metrics over HTTP on ADDR:PORT (e.g. 127.0.0.1:9464)
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// Write the metrics to FILE once, atomically (node_exporter's textfile collector)
    #[arg(long, value_name = "FILE", conflicts_with = "listen")]
    pub textfile: Option<PathBuf>,
    /// With --textfile: rewrite it every DURATION (15s, 500ms, 2m) until stopped
    #[arg(long, value_name = "DURATION", requires = "textfile", value_parser = parse_duration)]
    pub every: Option<Duration>,
    /// Read this status directory instead of the default ones (repeatable)
    #[arg(long = "status-dir", value_name = "DIR")]
    pub status_dirs: Vec<PathBuf>,
    /// Read every subdirectory of DIR as a status directory, e.g. one per job under a
    /// shared host path (repeatable; instead of the default ones)
    #[arg(long = "status-root", value_name = "DIR")]
    pub status_roots: Vec<PathBuf>,
    /// Keep a process that ended listed for DURATION after its file was last read
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub grace: Duration,
}

/// `15s`, `500ms`, `2m`, `1h`, or plain seconds; from 100 ms to a day.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if (0.1..=86_400.0).contains(&(v * scale)) => Ok(Duration::from_secs_f64(v * scale)),
        _ => Err(format!(
            "{text:?}: give a duration from 100ms to 24h, such as 15s, 500ms or 2m"
        )),
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

type Labels = Vec<(String, String)>;

/// A label value from a status file, cut to `MAX_VALUE_CHARS` characters.
fn value(text: &str) -> String {
    text.chars().take(MAX_VALUE_CHARS).collect()
}

/// A process's labels: `pid`, `program`, `rank` and its fleet labels (names the
/// library would not accept are dropped: the file is input like any other).
fn process_labels(s: &Status) -> Labels {
    let mut l: Labels = vec![
        ("pid".into(), s.pid.to_string()),
        ("program".into(), value(&s.program)),
    ];
    if let Some(r) = s.rank {
        l.push(("rank".into(), r.to_string()));
    }
    for (k, v) in s.labels.iter().take(status::MAX_LABELS) {
        if status::good_label_name(k) {
            l.push((k.clone(), value(v)));
        }
    }
    l
}

/// Registers `family` under `name`, with `unit` when it has one.
fn add<M: Metric + Clone>(
    r: &mut Registry,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    family: &M,
) {
    match unit {
        Some(u) => r.register_with_unit(name, help, u, family.clone()),
        None => r.register(name, help, family.clone()),
    }
}

type GaugeFamily = Family<Labels, Gauge>;
type RateFamily = Family<Labels, Gauge<f64, AtomicU64>>;
type CounterFamily = Family<Labels, Counter>;

/// The registry of one scrape: the processes' families and the exporter's health.
pub fn registry(view: &View, spent: Duration, now_ms: u64) -> Registry {
    let mut r = Registry::default();
    let live = GaugeFamily::default();
    let peak = GaugeFamily::default();
    let cap = GaugeFamily::default();
    let pools = GaugeFamily::default();
    let fw_used = GaugeFamily::default();
    let fw_cached = GaugeFamily::default();
    let refusals = CounterFamily::default();
    let ooms = CounterFamily::default();
    let trims = CounterFamily::default();
    let released = CounterFamily::default();
    let reports = CounterFamily::default();
    let rate = RateFamily::default();
    let age = RateFamily::default();
    let suspect: Family<Labels, Info<Labels>, fn() -> Info<Labels>> =
        Family::new_with_constructor(|| Info::new(Vec::new()));
    let sat = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    for s in &view.statuses {
        let p = process_labels(s);
        for d in &s.devices {
            let mut l = p.clone();
            l.push(("device".into(), d.device.to_string()));
            if let Some(u) = &d.uuid {
                l.push(("uuid".into(), value(u)));
            }
            live.get_or_create(&l).set(sat(d.live_bytes));
            peak.get_or_create(&l).set(sat(d.peak_bytes));
            pools.get_or_create(&l).set(sat(d.pool_held_bytes));
            if let Some(c) = d.cap_bytes {
                cap.get_or_create(&l).set(sat(c));
            }
            if let Some(v) = d.framework_in_use_bytes {
                fw_used.get_or_create(&l).set(sat(v));
            }
            if let Some(v) = d.framework_cached_bytes {
                fw_cached.get_or_create(&l).set(sat(v));
            }
            refusals.get_or_create(&l).inc_by(d.cap_refusals);
            ooms.get_or_create(&l).inc_by(d.oom_refusals);
        }
        trims.get_or_create(&p).inc_by(s.trims);
        released.get_or_create(&p).inc_by(s.trim_released_bytes);
        reports.get_or_create(&p).inc_by(s.reports);
        age.get_or_create(&p)
            .set(now_ms.saturating_sub(s.updated_unix_ms) as f64 / 1000.0);
        if let Some(t) = &s.top_suspect {
            let rate_value = if t.bytes_per_second.is_finite() {
                t.bytes_per_second
            } else {
                0.0
            };
            rate.get_or_create(&p).set(rate_value);
            let mut l = p.clone();
            l.push(("line".into(), value(&t.line)));
            let _ = suspect.get_or_create(&l);
        }
    }
    let b = || Some(Unit::Bytes);
    add(
        &mut r,
        "gpuguard_live",
        "Device memory the process holds now",
        b(),
        &live,
    );
    add(
        &mut r,
        "gpuguard_peak",
        "Highest device memory the process held",
        b(),
        &peak,
    );
    add(
        &mut r,
        "gpuguard_cap",
        "The process's cap on the device (GPUGUARD_CAP); absent when uncapped",
        b(),
        &cap,
    );
    add(
        &mut r,
        "gpuguard_pool_held",
        "What stream-ordered pools hold unused (charged against the cap)",
        b(),
        &pools,
    );
    add(
        &mut r,
        "gpuguard_framework_in_use",
        "The frameworks' memory in use, at the last report that had their account",
        b(),
        &fw_used,
    );
    add(
        &mut r,
        "gpuguard_framework_cached",
        "The frameworks' cached memory (held in their pools, not in use), at the last report that had their account",
        b(),
        &fw_cached,
    );
    add(
        &mut r,
        "gpuguard_cap_refusals",
        "Allocations the cap refused",
        None,
        &refusals,
    );
    add(
        &mut r,
        "gpuguard_oom_refusals",
        "Allocations the driver refused for lack of memory (each has an oom report, at most one a second)",
        None,
        &ooms,
    );
    add(
        &mut r,
        "gpuguard_trims",
        "Trims of the framework caches and CUDA pools done",
        None,
        &trims,
    );
    add(
        &mut r,
        "gpuguard_trim_released",
        "Bytes the trims gave back",
        b(),
        &released,
    );
    add(
        &mut r,
        "gpuguard_reports",
        "Reports the process wrote",
        None,
        &reports,
    );
    add(
        &mut r,
        "gpuguard_leak_suspect_growth",
        "How fast the top suspected leak grew over the last reports (growth::suspects)",
        Some(Unit::Other("bytes_per_second".into())),
        &rate,
    );
    add(
        &mut r,
        "gpuguard_leak_suspect",
        "The line of the top suspected leak",
        None,
        &suspect,
    );
    add(
        &mut r,
        "gpuguard_status_age",
        "How old the process's figures are (its status file is rewritten every second)",
        Some(Unit::Seconds),
        &age,
    );
    // Groups sharing a budget: labelled by group (and device), no process labels.
    let group_budget = GaugeFamily::default();
    let group_used = GaugeFamily::default();
    let group_members = GaugeFamily::default();
    for g in &view.groups {
        let name = value(&g.name);
        for (uuid, budget, used) in &g.devices {
            let l: Labels = vec![("group".into(), name.clone()), ("uuid".into(), value(uuid))];
            if *budget != gpuguard_core::group::UNLIMITED {
                group_budget.get_or_create(&l).set(sat(*budget));
            }
            group_used.get_or_create(&l).set(sat(*used));
        }
        group_members
            .get_or_create(&vec![("group".into(), name)])
            .set(sat(g.members));
    }
    add(
        &mut r,
        "gpuguard_group_budget",
        "The group's budget on the device (GPUGUARD_GROUP_CAP, gpuguard group --cap); absent when unlimited",
        b(),
        &group_budget,
    );
    add(
        &mut r,
        "gpuguard_group_used",
        "Device memory the group's members hold, together",
        b(),
        &group_used,
    );
    add(
        &mut r,
        "gpuguard_group_members",
        "Members of the group (those gone but not yet taken out included)",
        None,
        &group_members,
    );
    // The exporter's own health.
    let groups_skipped = Gauge::<i64>::default();
    groups_skipped.set(sat(view.groups_skipped));
    let read = Gauge::<i64>::default();
    read.set(sat(view.look.read));
    let dirs = Gauge::<i64>::default();
    dirs.set(sat(view.look.dirs_read));
    let processes = Gauge::<i64>::default();
    processes.set(sat(view.statuses.len() as u64));
    let skipped = GaugeFamily::default();
    for why in Skip::ALL {
        let n = view.look.skipped.get(&why).copied().unwrap_or(0);
        skipped
            .get_or_create(&vec![("reason".into(), why.label().into())])
            .set(sat(n));
    }
    let duration = Gauge::<f64, AtomicU64>::default();
    duration.set(spent.as_secs_f64());
    add(
        &mut r,
        "gpuguard_exporter_status_files_read",
        "Status files read and used at this scrape",
        None,
        &read,
    );
    add(
        &mut r,
        "gpuguard_exporter_status_files_skipped",
        "Status files (and directories) skipped at this scrape, by why",
        None,
        &skipped,
    );
    add(
        &mut r,
        "gpuguard_exporter_group_files_skipped",
        "Group files that could not be used at this scrape (another user's, open to others, another layout, a name read twice)",
        None,
        &groups_skipped,
    );
    add(
        &mut r,
        "gpuguard_exporter_status_dirs_read",
        "Status directories read at this scrape",
        None,
        &dirs,
    );
    add(
        &mut r,
        "gpuguard_exporter_processes",
        "Processes exposed (those that ended within the grace period included)",
        None,
        &processes,
    );
    add(
        &mut r,
        "gpuguard_exporter_scrape_duration",
        "Time this scrape took to read the status files and build the metrics",
        Some(Unit::Seconds),
        &duration,
    );
    r
}

/// One scrape: the directories read now, rendered as OpenMetrics or as the
/// Prometheus text format.
pub fn scrape(fleet: &mut Fleet, openmetrics: bool) -> String {
    let start = Instant::now();
    let now = now_unix_ms();
    let view = fleet.refresh(now);
    let r = registry(&view, start.elapsed(), now);
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = if openmetrics {
        prometheus_client::encoding::text::encode(&mut out, &r)
    } else {
        prometheus_client::encoding::prometheus_text::encode(&mut out, &r)
    };
    out
}

/// Whether an `Accept` header asks for OpenMetrics.
pub fn wants_openmetrics(accept: &str) -> bool {
    accept
        .split(',')
        .filter_map(|part| {
            let mut fields = part.split(';').map(str::trim);
            let kind = fields.next()?;
            let q = fields
                .find_map(|f| f.strip_prefix("q="))
                .and_then(|q| q.parse::<f64>().ok())
                .unwrap_or(1.0);
            Some((kind.eq_ignore_ascii_case("application/openmetrics-text"), q))
        })
        .filter(|(_, q)| *q > 0.0)
        .max_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
        .is_some_and(|(om, _)| om)
}

/// The directories to read: `--status-dir` and `--status-root` ones, else the
/// default ones. As root, a given directory may be anyone's; else only this user's.
fn source(args: &MetricsArgs) -> Result<Source, Failure> {
    let me = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .map_err(|e| Failure::Input(format!("cannot find this process's user: {e}")))?;
    let owner = (me != 0).then_some(me);
    if args.status_dirs.is_empty() && args.status_roots.is_empty() {
        return Ok(Source {
            defaults: Some(me),
            ..Default::default()
        });
    }
    Ok(Source {
        defaults: None,
        dirs: args
            .status_dirs
            .iter()
            .map(|p| Dir {
                path: p.clone(),
                owner,
            })
            .collect(),
        roots: args
            .status_roots
            .iter()
            .map(|p| (p.clone(), owner))
            .collect(),
    })
}

pub fn main(args: MetricsArgs) -> Outcome {
    let grace_ms = args.grace.as_millis() as u64;
    let fleet = Fleet::new(source(&args)?, grace_ms);
    match (&args.listen, &args.textfile) {
        (Some(addr), _) => serve(addr, fleet),
        (None, Some(file)) => textfile(file, fleet, args.every),
        (None, None) => Err(Failure::Input("give --listen or --textfile".into())),
    }
}

fn textfile(file: &std::path::Path, mut fleet: Fleet, every: Option<Duration>) -> Outcome {
    let Some(every) = every else {
        write_file(file, scrape(&mut fleet, false).as_bytes())?;
        return Ok(0);
    };
    let mut next = Instant::now();
    loop {
        if Instant::now() >= next {
            write_file(file, scrape(&mut fleet, false).as_bytes())?;
            next += every;
            if next < Instant::now() {
                next = Instant::now() + every;
            }
        } else {
            fleet.refresh(now_unix_ms());
        }
        std::thread::sleep(POLL.min(next.saturating_duration_since(Instant::now())));
    }
}

fn serve(addr: &str, fleet: Fleet) -> Outcome {
    let server = tiny_http::Server::http(addr)
        .map_err(|e| Failure::Input(format!("--listen {addr}: cannot listen: {e}")))?;
    warn(&format!(
        "serving /metrics on http://{}",
        server.server_addr()
    ));
    let fleet = Arc::new(Mutex::new(fleet));
    // Between scrapes, the directories are read every second: a process that ends
    // between two scrapes is still in the next one (for the grace period).
    let poller = Arc::clone(&fleet);
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(POLL);
            poller
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .refresh(now_unix_ms());
        }
    });
    for request in server.incoming_requests() {
        let response = respond(&request, &fleet);
        // Written from a thread of its own: a client that reads slowly (or never)
        // holds only that thread, not the next scrape. A client gone before the
        // answer is its own business.
        std::thread::spawn(move || {
            let _ = request.respond(response);
        });
    }
    Err(Failure::Input(format!(
        "--listen {addr}: the server stopped"
    )))
}

fn respond(
    request: &tiny_http::Request,
    fleet: &Mutex<Fleet>,
) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    use tiny_http::{Method, Response};
    let path = request.url().split('?').next().unwrap_or("");
    if !matches!(request.method(), Method::Get | Method::Head) {
        return Response::from_string("only GET and HEAD\n").with_status_code(405);
    }
    match path {
        "/metrics" => {
            let accept = request
                .headers()
                .iter()
                .filter(|h| h.field.equiv("Accept"))
                .map(|h| h.value.as_str())
                .collect::<Vec<_>>()
                .join(",");
            let om = wants_openmetrics(&accept);
            let body = scrape(&mut fleet.lock().unwrap_or_else(|e| e.into_inner()), om);
            let kind = if om {
                OPENMETRICS_TYPE
            } else {
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE
            };
            let response = Response::from_string(body);
            // Both types are valid header values: the header is always there.
            match tiny_http::Header::from_bytes(&b"Content-Type"[..], kind.as_bytes()) {
                Ok(h) => response.with_header(h),
                Err(()) => response,
            }
        }
        "/" => Response::from_string("gpuguard metrics: see /metrics\n"),
        _ => Response::from_string("not found\n").with_status_code(404),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuguard_core::status::{DeviceStatus, SuspectStatus};

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15s").unwrap(), Duration::from_secs(15));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        for bad in ["0s", "-1", "x", "25h", "nan", ""] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn content_negotiation() {
        let prom2 = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(prom2));
        assert!(!wants_openmetrics("text/plain;version=0.0.4"));
        assert!(!wants_openmetrics(""));
        assert!(!wants_openmetrics("*/*"));
        assert!(!wants_openmetrics(
            "application/openmetrics-text;q=0.2,text/plain;q=0.9"
        ));
    }

    fn view() -> View {
        let mut s = Status {
            schema: status::SCHEMA.into(),
            pid: 42,
            program: "tra\"in\n.py".into(),
            rank: Some(3),
            reports: 5,
            trims: 2,
            trim_released_bytes: 1 << 20,
            top_suspect: Some(SuspectStatus {
                line: "train.py:10 in step".into(),
                bytes_per_second: 1024.0,
            }),
            devices: vec![DeviceStatus {
                device: 0,
                live_bytes: 300,
                peak_bytes: 400,
                cap_bytes: Some(1000),
                uuid: Some("GPU-abc".into()),
                cap_refusals: 7,
                framework_in_use_bytes: Some(200),
                framework_cached_bytes: Some(100),
                ..Default::default()
            }],
            ..Default::default()
        };
        s.labels.insert("job".into(), "1234".into());
        s.labels.insert("bad name".into(), "x".into());
        s.labels.insert("pid".into(), "1".into());
        View {
            statuses: vec![s],
            look: super::super::fleet::Look {
                read: 1,
                ..Default::default()
            },
            groups: vec![super::super::fleet::GroupFigures {
                name: "ddp".into(),
                devices: vec![
                    ("GPU-abc".into(), 1 << 30, 3 << 20),
                    ("GPU-def".into(), gpuguard_core::group::UNLIMITED, 0),
                ],
                members: 2,
            }],
            groups_skipped: 1,
        }
    }

    #[test]
    fn families_in_both_formats() {
        let r = registry(&view(), Duration::from_millis(3), 0);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &r).unwrap();
        for want in [
            "# TYPE gpuguard_live_bytes gauge\n",
            "gpuguard_live_bytes{pid=\"42\",program=\"tra\\\"in\\n.py\",rank=\"3\",job=\"1234\",device=\"0\",uuid=\"GPU-abc\"} 300\n",
            "# TYPE gpuguard_cap_refusals_total counter\n",
            "gpuguard_cap_refusals_total{pid=\"42\",program=\"tra\\\"in\\n.py\",rank=\"3\",job=\"1234\",device=\"0\",uuid=\"GPU-abc\"} 7\n",
            "gpuguard_trim_released_bytes_total{pid=\"42\",program=\"tra\\\"in\\n.py\",rank=\"3\",job=\"1234\"} 1048576\n",
            "gpuguard_leak_suspect_growth_bytes_per_second{pid=\"42\",program=\"tra\\\"in\\n.py\",rank=\"3\",job=\"1234\"} 1024.0\n",
            "gpuguard_leak_suspect_info{pid=\"42\",program=\"tra\\\"in\\n.py\",rank=\"3\",job=\"1234\",line=\"train.py:10 in step\"} 1\n",
            "gpuguard_exporter_status_files_skipped{reason=\"symlink\"} 0\n",
            "gpuguard_group_budget_bytes{group=\"ddp\",uuid=\"GPU-abc\"} 1073741824\n",
            "gpuguard_group_used_bytes{group=\"ddp\",uuid=\"GPU-abc\"} 3145728\n",
            "gpuguard_group_used_bytes{group=\"ddp\",uuid=\"GPU-def\"} 0\n",
            "gpuguard_group_members{group=\"ddp\"} 2\n",
            "gpuguard_exporter_group_files_skipped 1\n",
        ] {
            assert!(text.contains(want), "{want}\nin\n{text}");
        }
        assert!(!text.contains("bad name") && !text.contains("pid=\"1\""));
        assert!(!text.contains("budget_bytes{group=\"ddp\",uuid=\"GPU-def\""));
        // One HELP and one TYPE per family.
        let mut types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        let n = types.len();
        types.dedup();
        assert_eq!(types.len(), n);
        let mut om = String::new();
        prometheus_client::encoding::text::encode(&mut om, &r).unwrap();
        assert!(om.ends_with("# EOF\n"));
        assert!(om.contains("# UNIT gpuguard_live_bytes bytes\n"), "{om}");
        assert!(om.contains("# TYPE gpuguard_leak_suspect info\n"), "{om}");
    }
}
