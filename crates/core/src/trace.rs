//! The memory timeline (`GPUGUARD_TRACE`), in the Chrome trace-event format that
//! Perfetto and chrome://tracing open, and the reader `gpuguard plot` uses.
//!
//! The file is the format's JSON array form, one event per line:
//!
//! ```text
//! [
//! {"name":"gpuguard_trace","ph":"M",...},
//! {"name":"device 0","ph":"C","ts":1234,"pid":7,"tid":7,"args":{"high":1048576,"live":1048576,"pool_held":0}},
//! ...
//! {"name":"trace end","ph":"i",...}
//! ]
//! ```
//!
//! Every event line ends in a comma and is handed to the kernel whole, so a process
//! that is killed leaves an array without its closing `]`, which the format allows
//! (readers drop the trailing comma and close the array). A writer that is finished
//! writes a last event without the comma and the `]`, so a whole file is also strict
//! JSON.
//!
//! The writer is driven by the library's helper thread, never by a hook: it samples the
//! books about as often as it likes and the writer keeps at most one counter event per
//! device and interval (the interval's highest value and its last), and skips samples
//! that repeat the last one written. Each counter event carries, beside the live bytes
//! at its time, `high`: the highest live bytes since the event before (the books'
//! high-water mark, which the helper reads and restarts at each sample), so a moment
//! between two samples is never lost; traces written before `high` read as if it
//! equalled `live`. Each time the file grows by a sixteenth of its
//! byte budget the interval doubles (recorded as a `trace thinned` event), so each
//! sixteenth covers twice the time of the one before: a 64 MiB budget lasts for weeks
//! of a busy process. At the budget only the closing event is written.
//!
//! Why one file of about 660 lines before its tests: the writer and the reader of one
//! file format stay together, so a change to the format changes both at once.

use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufWriter, Read, Write};
use std::path::Path;

/// Written in the first event's args; `gpuguard plot` refuses other values.
pub const SCHEMA: &str = "gpuguard-trace/1";

/// The name of the metadata event that opens a gpuguard trace.
pub const HEADER_EVENT: &str = "gpuguard_trace";

/// Names of the instant events, which `gpuguard plot` marks on the timeline. Their
/// args are free-form; `device` (a number), when present, says which device.
pub mod event {
    /// A cap refused an allocation: args `device`, `bytes`, `charged`, `cap`.
    pub const CAP_REFUSAL: &str = "cap refusal";
    /// Caches were trimmed: args `trigger`, `released_bytes`.
    pub const TRIM: &str = "trim";
    /// A `GPUGUARD_WARN_AT` warning: args `device`, `message`.
    pub const WARNING: &str = "warning";
    /// A report was written: args `reason`, `path`.
    pub const REPORT: &str = "report";
    /// The writer doubled its sampling interval to stay in budget: args `interval_ms`.
    pub const THINNED: &str = "trace thinned";
    /// The byte budget is spent: no more events but the closing one.
    pub const BUDGET_REACHED: &str = "trace budget reached";
    /// The last event of a trace whose writer was finished.
    pub const END: &str = "trace end";
}

/// How a trace is written.
#[derive(Clone, Debug)]
pub struct TraceOptions {
    /// The file never grows past this many bytes.
    pub max_bytes: u64,
    /// At most one counter event per device per this many microseconds (plus the
    /// interval's peak when it is higher than its last value).
    pub min_interval_us: u64,
    /// Named in the events (`pid`, `tid`) and the process-name metadata.
    pub pid: u32,
    pub program: String,
    /// When the first CUDA call was seen (timestamps count from it).
    pub start_unix_ms: u64,
    /// `gpuguard_version` in the header.
    pub version: String,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            max_bytes: 64 << 20,
            min_interval_us: 10_000,
            pid: 0,
            program: String::new(),
            start_unix_ms: 0,
            version: String::new(),
        }
    }
}

/// One device's counters at one time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Values {
    live: u64,
    /// The highest live bytes since the sample before (never below `live`).
    high: u64,
    pool_held: u64,
    cap: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
struct Timed {
    t_us: u64,
    values: Values,
}

/// A device's counter track: what was last written, and what the current interval
/// has seen since.
#[derive(Debug, Default)]
struct Track {
    written: Option<Timed>,
    /// The interval's highest `live` sample, kept so that thinning never hides a peak;
    /// its `high` covers every sample of the interval up to it.
    peak: Option<Timed>,
    /// The interval's last sample.
    latest: Option<Timed>,
    /// The highest `high` of the interval's samples after `peak`.
    high_after_peak: u64,
}

/// Bytes kept for the closing event and the `]`, which are always written.
const CLOSING_RESERVE: u64 = 512;

/// The budget is spent in this many steps, each at twice the interval of the last.
const THINNING_STEPS: u64 = 16;

/// Thinning stops doubling the interval here: a sample a minute still draws a timeline.
const MAX_INTERVAL_US: u64 = 60_000_000;

/// Writes a trace; see the module documentation. Write errors stop the writer; the
/// first one is returned by the next [`TraceWriter::flush`] or [`TraceWriter::finish`].
pub struct TraceWriter {
    out: BufWriter<File>,
    options: TraceOptions,
    interval_us: u64,
    written_bytes: u64,
    /// Thinning happens each time the file grows by `max_bytes / THINNING_STEPS`; this
    /// is the next mark.
    next_thinning_at: u64,
    tracks: BTreeMap<i32, Track>,
    budget_spent: bool,
    dropped_events: u64,
    error: Option<io::Error>,
    stopped: bool,
    last_t_us: u64,
}

impl TraceWriter {
    /// Creates (or truncates) `path`, mode 0600, never through a symlink, and writes the
    /// opening `[` and the metadata events. Anything but a regular file (a FIFO, a
    /// device) is refused without blocking (`regular_file`).
    pub fn create(path: &Path, options: TraceOptions) -> io::Result<TraceWriter> {
        let file = crate::regular_file::create(path, true)?;
        let max_bytes = options.max_bytes.max(4 * CLOSING_RESERVE);
        let mut w = TraceWriter {
            out: BufWriter::with_capacity(64 << 10, file),
            interval_us: options.min_interval_us,
            written_bytes: 0,
            next_thinning_at: max_bytes / THINNING_STEPS,
            tracks: BTreeMap::new(),
            budget_spent: false,
            dropped_events: 0,
            error: None,
            stopped: false,
            last_t_us: 0,
            options: TraceOptions {
                max_bytes,
                ..options
            },
        };
        w.put_line("[\n")?;
        let pid = w.options.pid;
        let header = json!({
            "name": HEADER_EVENT, "ph": "M", "pid": pid, "tid": pid,
            "args": {
                "schema": SCHEMA,
                "gpuguard_version": w.options.version,
                "program": w.options.program,
                "start_unix_ms": w.options.start_unix_ms,
                "min_interval_us": w.options.min_interval_us,
                "max_bytes": w.options.max_bytes,
            }
        });
        w.put_event(&header)?;
        let process_name = json!({
            "name": "process_name", "ph": "M", "pid": pid, "tid": pid,
            "args": {"name": format!("{} (gpuguard)", w.options.program)}
        });
        w.put_event(&process_name)?;
        let thread_name = json!({
            "name": "thread_name", "ph": "M", "pid": pid, "tid": pid,
            "args": {"name": "gpuguard"}
        });
        w.put_event(&thread_name)?;
        w.out.flush()?;
        Ok(w)
    }

    /// The current minimum interval between two counter events of one device.
    pub fn interval_us(&self) -> u64 {
        self.interval_us
    }

    /// Bytes written so far (the file's size once flushed).
    pub fn written_bytes(&self) -> u64 {
        self.written_bytes
    }

    /// Records device `device`'s books at `t_us` (µs since the first CUDA call), with
    /// nothing known about the time since the sample before (`high` is `live`).
    pub fn sample(&mut self, t_us: u64, device: i32, live: u64, pool_held: u64, cap: Option<u64>) {
        self.sample_high(t_us, device, live, live, pool_held, cap);
    }

    /// Records device `device`'s books at `t_us` (µs since the first CUDA call):
    /// `live` bytes now, and `high`, the highest live bytes since the sample before.
    /// Cheap when nothing changed; writes at most the interval's peak and last
    /// sample, and no `high` is lost to either.
    pub fn sample_high(
        &mut self,
        t_us: u64,
        device: i32,
        live: u64,
        high: u64,
        pool_held: u64,
        cap: Option<u64>,
    ) {
        if self.stopped {
            return;
        }
        let mut now = Timed {
            t_us,
            values: Values {
                live,
                high: high.max(live),
                pool_held,
                cap,
            },
        };
        let interval = self.interval_us;
        let track = self.tracks.entry(device).or_default();
        let unchanged = track.written.is_some_and(|w| w.values == now.values);
        if unchanged && track.latest.is_none() {
            return;
        }
        match track.peak {
            Some(p) if live <= p.values.live => {
                track.high_after_peak = track.high_after_peak.max(now.values.high);
            }
            before => {
                // The new peak answers for every high of the interval so far.
                let so_far = before.map_or(0, |p| p.values.high.max(track.high_after_peak));
                let mut p = now;
                p.values.high = p.values.high.max(so_far);
                track.peak = Some(p);
                track.high_after_peak = 0;
                now = p;
            }
        }
        track.latest = Some(now);
        let due = track
            .written
            .is_none_or(|w| t_us >= w.t_us.saturating_add(interval));
        if due {
            self.emit_track(device);
        }
    }

    /// Records an instant event (a cap refusal, a trim, a warning, a report: see
    /// [`event`]) at `t_us`. The devices' pending samples are written first, so the
    /// timeline shows the level the event happened at.
    pub fn instant(&mut self, t_us: u64, name: &str, args: Value) {
        if self.stopped {
            return;
        }
        self.emit_all_tracks();
        let pid = self.options.pid;
        let event = json!({
            "name": name, "ph": "i", "s": "p", "ts": t_us, "pid": pid, "tid": pid,
            "args": args
        });
        self.last_t_us = self.last_t_us.max(t_us);
        self.write_event(&event);
    }

    /// Hands what is buffered to the kernel (a killed process then leaves it on disk).
    /// Returns the first write error, once; the writer has stopped then.
    pub fn flush(&mut self) -> io::Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if self.stopped {
            return Ok(());
        }
        if let Err(e) = self.out.flush() {
            self.stopped = true;
            return Err(e);
        }
        Ok(())
    }

    /// Writes the pending samples, a closing event and the `]` (the file is then strict
    /// JSON), and flushes. `t_us` is the end of the timeline.
    pub fn finish(&mut self, t_us: u64) -> io::Result<()> {
        if let Some(e) = self.error.take() {
            self.stopped = true;
            return Err(e);
        }
        if self.stopped {
            return Ok(());
        }
        self.emit_all_tracks();
        let pid = self.options.pid;
        let end = json!({
            "name": event::END, "ph": "i", "s": "p", "ts": t_us.max(self.last_t_us),
            "pid": pid, "tid": pid,
            "args": {"dropped_events": self.dropped_events, "interval_us": self.interval_us}
        });
        self.stopped = true;
        let mut line = end.to_string();
        line.push_str("\n]\n");
        let result = self
            .out
            .write_all(line.as_bytes())
            .and_then(|_| self.out.flush());
        if result.is_ok() {
            self.written_bytes += line.len() as u64;
        }
        result
    }

    fn emit_all_tracks(&mut self) {
        let devices: Vec<i32> = self.tracks.keys().copied().collect();
        for d in devices {
            self.emit_track(d);
        }
    }

    /// Writes what the device's interval saw: its peak (when higher than its last
    /// value and earlier) and its last value, leaving out what repeats the last event.
    fn emit_track(&mut self, device: i32) {
        let Some(track) = self.tracks.get_mut(&device) else {
            return;
        };
        let peak = track.peak.take();
        let after_peak = std::mem::take(&mut track.high_after_peak);
        let Some(mut latest) = track.latest.take() else {
            return;
        };
        let mut out = Vec::with_capacity(2);
        match peak {
            Some(p) if p.values.live > latest.values.live && p.t_us < latest.t_us => {
                out.push(p);
                latest.values.high = latest.values.high.max(after_peak);
            }
            // The peak is not written apart: the last sample answers for its high.
            p => {
                let before = p.map_or(0, |p| p.values.high);
                latest.values.high = latest.values.high.max(before).max(after_peak);
            }
        }
        out.push(latest);
        for sample in out {
            let track = self.tracks.entry(device).or_default();
            if track.written.is_some_and(|w| w.values == sample.values) {
                continue;
            }
            track.written = Some(sample);
            let event = self.counter_event(device, sample);
            self.last_t_us = self.last_t_us.max(sample.t_us);
            self.write_event(&event);
        }
    }

    fn counter_event(&self, device: i32, s: Timed) -> Value {
        let mut args = json!({
            "live": s.values.live,
            "high": s.values.high,
            "pool_held": s.values.pool_held,
        });
        if let (Some(cap), Some(map)) = (s.values.cap, args.as_object_mut()) {
            map.insert("cap".into(), cap.into());
        }
        let pid = self.options.pid;
        json!({
            "name": device_track_name(device), "ph": "C", "ts": s.t_us,
            "pid": pid, "tid": pid, "args": args
        })
    }

    /// Writes one event within the budget: thins at the marks, stops at the budget.
    fn write_event(&mut self, event: &Value) {
        if self.stopped {
            return;
        }
        if self.budget_spent {
            self.dropped_events += 1;
            return;
        }
        let line = event_line(event);
        let limit = self.options.max_bytes - CLOSING_RESERVE;
        // Room for this event and the notice that the budget is spent.
        if self.written_bytes + line.len() as u64 + CLOSING_RESERVE / 2 > limit {
            self.budget_spent = true;
            self.dropped_events += 1;
            let pid = self.options.pid;
            let notice = json!({
                "name": event::BUDGET_REACHED, "ph": "i", "s": "p", "ts": self.last_t_us,
                "pid": pid, "tid": pid, "args": {"max_bytes": self.options.max_bytes}
            });
            let _ = self.put_event(&notice);
            return;
        }
        if self.put_line(&line).is_err() {
            return;
        }
        if self.written_bytes >= self.next_thinning_at {
            self.thin();
        }
    }

    /// Doubles the interval and says so in the trace.
    fn thin(&mut self) {
        self.next_thinning_at += self.options.max_bytes / THINNING_STEPS;
        let doubled = self
            .interval_us
            .saturating_mul(2)
            .clamp(1_000, MAX_INTERVAL_US);
        if doubled == self.interval_us {
            return;
        }
        self.interval_us = doubled;
        let pid = self.options.pid;
        let notice = json!({
            "name": event::THINNED, "ph": "i", "s": "p", "ts": self.last_t_us,
            "pid": pid, "tid": pid,
            "args": {"interval_ms": self.interval_us as f64 / 1000.0,
                     "written_bytes": self.written_bytes}
        });
        let _ = self.put_event(&notice);
    }

    fn put_event(&mut self, event: &Value) -> io::Result<()> {
        self.put_line(&event_line(event))
    }

    /// One whole line to the buffer (a BufWriter hands a line that fits its buffer to
    /// the kernel in one write, so a killed process leaves whole lines).
    fn put_line(&mut self, line: &str) -> io::Result<()> {
        match self.out.write_all(line.as_bytes()) {
            Ok(()) => {
                self.written_bytes += line.len() as u64;
                Ok(())
            }
            Err(e) => {
                self.stopped = true;
                let copy = io::Error::new(e.kind(), e.to_string());
                if self.error.is_none() {
                    self.error = Some(e);
                }
                Err(copy)
            }
        }
    }
}

fn event_line(event: &Value) -> String {
    let mut line = event.to_string();
    line.push_str(",\n");
    line
}

/// The counter track's name: `device 0`.
pub fn device_track_name(device: i32) -> String {
    format!("device {device}")
}

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

/// One counter sample as read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub t_us: u64,
    pub live: u64,
    /// The highest live bytes since the sample before (never below `live`; `live`
    /// in traces written before the field). Where the reader or a plot thins
    /// samples, a sample left out passes its `high` on to the next one kept.
    pub high: u64,
    pub pool_held: u64,
    pub cap: Option<u64>,
}

/// One instant event as read back.
#[derive(Clone, Debug, PartialEq)]
pub struct Instant {
    pub t_us: u64,
    pub name: String,
    pub device: Option<i32>,
    pub args: Value,
}

/// A trace as `gpuguard plot` needs it, bounded whatever the file's size: the
/// reader streams the file and keeps, per device, the samples that draw it (see
/// [`MAX_BUCKETS`]), and per kind of instant event the first
/// [`MAX_INSTANTS_PER_NAME`], counting all.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    pub program: String,
    pub pid: u32,
    pub start_unix_ms: u64,
    /// Samples per device, in time order (thinned past [`MAX_BUCKETS`] buckets).
    pub devices: BTreeMap<i32, Vec<Sample>>,
    /// Samples of devices past the first [`MAX_DEVICES`], left out.
    pub samples_left_out: u64,
    /// In time order: of each kind in [`event`], the first [`MAX_INSTANTS_PER_NAME`].
    pub instants: Vec<Instant>,
    /// How many instant events of each kind in [`event`] the trace has.
    pub instant_counts: BTreeMap<&'static str, u64>,
    /// The last timestamp read, kept or not.
    pub last_us: u64,
    /// The writer never finished (the process was killed or is still running).
    pub unfinished: bool,
}

impl Trace {
    /// The last timestamp in the trace.
    pub fn end_us(&self) -> u64 {
        let samples = self
            .devices
            .values()
            .filter_map(|s| s.last())
            .map(|s| s.t_us);
        let instants = self.instants.iter().map(|i| i.t_us);
        samples
            .chain(instants)
            .chain([self.last_us])
            .max()
            .unwrap_or(0)
    }

    /// How many instant events named `name` (one of [`event`]) the trace has.
    pub fn count(&self, name: &str) -> u64 {
        self.instant_counts.get(name).copied().unwrap_or(0)
    }
}

/// Devices whose samples are kept (more than any host has).
pub const MAX_DEVICES: usize = 64;

/// Time buckets kept per device: past them, the buckets double in width and merge.
/// Each keeps its samples of lowest and highest live bytes and its last, so a
/// plot a few thousand pixels wide draws the shape of any length of trace.
pub const MAX_BUCKETS: usize = 4096;

/// Instant events kept per kind (the plot marks at most a few hundred).
pub const MAX_INSTANTS_PER_NAME: usize = 400;

/// Keys of an instant's args kept, and the longest string value kept (bytes).
const MAX_ARGS: usize = 16;
const MAX_ARG_TEXT: usize = 1 << 10;

/// The instant events a trace reader keeps (those it names); others are skipped.
pub const KEPT_EVENTS: [&str; 7] = [
    event::CAP_REFUSAL,
    event::TRIM,
    event::WARNING,
    event::REPORT,
    event::THINNED,
    event::BUDGET_REACHED,
    event::END,
];

/// Up to three samples of one time bucket: the lowest and highest live bytes, and
/// the last (latest `t_us`, the later one read among equals); and the highest
/// `high` of all its samples, which the last one carries when they are written out.
#[derive(Clone, Copy)]
struct Bucket {
    low: Sample,
    high: Sample,
    last: Sample,
    max_high: u64,
}

impl Bucket {
    fn new(s: Sample) -> Bucket {
        Bucket {
            low: s,
            high: s,
            last: s,
            max_high: s.high,
        }
    }

    fn add(&mut self, s: Sample) {
        self.max_high = self.max_high.max(s.high);
        if s.live < self.low.live {
            self.low = s;
        }
        if s.live > self.high.live {
            self.high = s;
        }
        if s.t_us >= self.last.t_us {
            self.last = s;
        }
    }

    fn merge(&mut self, o: &Bucket) {
        // `o` comes later in time than `self` when buckets merge.
        for s in [o.low, o.high, o.last] {
            self.add(s);
        }
        self.max_high = self.max_high.max(o.max_high);
    }
}

/// A device's samples, thinned into at most [`MAX_BUCKETS`] buckets of `width` µs.
struct Thinned {
    width: u64,
    buckets: BTreeMap<u64, Bucket>,
}

impl Thinned {
    fn new() -> Thinned {
        Thinned {
            width: 1,
            buckets: BTreeMap::new(),
        }
    }

    fn add(&mut self, s: Sample) {
        match self.buckets.entry(s.t_us / self.width) {
            std::collections::btree_map::Entry::Occupied(mut b) => b.get_mut().add(s),
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(Bucket::new(s));
            }
        }
        while self.buckets.len() > MAX_BUCKETS {
            self.width = self.width.saturating_mul(2);
            let old = std::mem::take(&mut self.buckets);
            for (k, b) in old {
                match self.buckets.entry(k / 2) {
                    std::collections::btree_map::Entry::Occupied(mut m) => m.get_mut().merge(&b),
                    std::collections::btree_map::Entry::Vacant(v) => {
                        v.insert(b);
                    }
                }
            }
        }
    }

    /// The samples kept, in time order (a sample kept for two reasons once).
    fn samples(self) -> Vec<Sample> {
        let mut out = Vec::with_capacity(self.buckets.len() * 3);
        for mut b in self.buckets.into_values() {
            // What the samples left out reached, the bucket's last sample says.
            b.last.high = b.last.high.max(b.max_high);
            let mut three = [b.low, b.high, b.last];
            three.sort_by_key(|s| s.t_us);
            for s in three {
                match out.last_mut() {
                    Some(l) if Sample { high: s.high, ..*l } == s => l.high = l.high.max(s.high),
                    _ => out.push(s),
                }
            }
        }
        out
    }
}

/// An instant's args, bounded: at most [`MAX_ARGS`] keys, strings cut at
/// [`MAX_ARG_TEXT`] bytes, nested values named by their kind only.
fn bounded_args(args: Value) -> Value {
    let Value::Object(map) = args else {
        return Value::Null;
    };
    let kept = map.into_iter().take(MAX_ARGS).map(|(mut k, v)| {
        cut_text(&mut k, MAX_ARG_TEXT);
        let v = match v {
            Value::String(mut t) => {
                cut_text(&mut t, MAX_ARG_TEXT);
                Value::String(t)
            }
            Value::Array(_) => Value::String("[…]".into()),
            Value::Object(_) => Value::String("{…}".into()),
            other => other,
        };
        (k, v)
    });
    Value::Object(kept.collect())
}

fn cut_text(t: &mut String, max: usize) {
    if t.len() > max {
        let mut end = max;
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        t.truncate(end);
        t.push('…');
    }
}

/// Longest line the reader takes (the writer's lines are a few hundred bytes).
const MAX_LINE: usize = 1 << 20;

#[derive(Deserialize)]
struct RawEvent {
    name: String,
    ph: String,
    #[serde(default)]
    ts: Option<f64>,
    #[serde(default)]
    pid: Option<u32>,
    #[serde(default)]
    args: Value,
}

/// Reads a trace this module wrote, whole (ending in `]`) or cut short (no `]`, or a
/// last line cut mid-way, as a killed process leaves it). The error is one line for
/// people.
pub fn read(input: impl BufRead) -> Result<Trace, String> {
    let mut trace = Trace {
        unfinished: true,
        ..Default::default()
    };
    let mut thinned: BTreeMap<i32, Thinned> = BTreeMap::new();
    let mut lines = LineReader { input, line_no: 0 };
    let mut saw_header = false;
    let mut closed = false;
    while let Some((line_no, line, complete)) = lines.next_line()? {
        let text = line.trim();
        if line_no == 1 {
            if text != "[" {
                return Err(not_a_trace());
            }
            continue;
        }
        if closed {
            if text.is_empty() {
                continue;
            }
            return Err(format!("line {line_no}: text after the closing `]`"));
        }
        if text == "]" {
            closed = true;
            continue;
        }
        let (body, last) = match text.strip_suffix("\n]").or_else(|| text.strip_suffix(']')) {
            Some(b) if !b.trim_end().ends_with(',') => (b.trim_end(), true),
            _ => (text.strip_suffix(',').unwrap_or(text), false),
        };
        if body.is_empty() {
            continue;
        }
        let event: RawEvent = match serde_json::from_str(body) {
            Ok(e) => e,
            // A killed writer may leave its last line cut short.
            Err(_) if !complete => break,
            Err(e) if !saw_header => return Err(format!("{} ({e})", not_a_trace())),
            Err(e) => return Err(format!("line {line_no}: not a trace event ({e})")),
        };
        if !saw_header {
            check_header(&event)?;
            saw_header = true;
            trace.pid = event.pid.unwrap_or(0);
            trace.program = event.args["program"].as_str().unwrap_or("").to_string();
            // As a report's strings (`report_stream::MAX_STRING_BYTES`).
            cut_text(&mut trace.program, crate::report_stream::MAX_STRING_BYTES);
            trace.start_unix_ms = event.args["start_unix_ms"].as_u64().unwrap_or(0);
        } else {
            add_event(&mut trace, &mut thinned, event, line_no)?;
        }
        if last {
            closed = true;
        }
    }
    if !saw_header {
        return Err(not_a_trace());
    }
    if closed {
        trace.unfinished = trace.count(event::END) == 0;
    }
    trace.devices = thinned.into_iter().map(|(d, t)| (d, t.samples())).collect();
    keep_first_instants(&mut trace.instants);
    Ok(trace)
}

fn not_a_trace() -> String {
    format!("not a gpuguard trace (a JSON array opening with a \"{HEADER_EVENT}\" event)")
}

fn check_header(event: &RawEvent) -> Result<(), String> {
    if event.name != HEADER_EVENT || event.ph != "M" {
        return Err(not_a_trace());
    }
    match event.args["schema"].as_str() {
        Some(SCHEMA) => Ok(()),
        Some(other) => Err(format!(
            "trace schema {other} is not the one this gpuguard reads ({SCHEMA}); use a matching gpuguard"
        )),
        None => Err(not_a_trace()),
    }
}

/// The instants in time order (stable: equal times in the order read), of each
/// name the first [`MAX_INSTANTS_PER_NAME`].
fn keep_first_instants(instants: &mut Vec<Instant>) {
    instants.sort_by_key(|i| i.t_us);
    let mut kept: BTreeMap<String, usize> = BTreeMap::new();
    instants.retain(|i| {
        let n = kept.entry(i.name.clone()).or_default();
        *n += 1;
        *n <= MAX_INSTANTS_PER_NAME
    });
}

fn add_event(
    trace: &mut Trace,
    thinned: &mut BTreeMap<i32, Thinned>,
    event: RawEvent,
    line_no: u64,
) -> Result<(), String> {
    let ts = event.ts.filter(|t| t.is_finite() && *t >= 0.0);
    match event.ph.as_str() {
        "C" => {
            let Some(device) = event
                .name
                .strip_prefix("device ")
                .and_then(|d| d.parse::<i32>().ok())
            else {
                return Ok(()); // another tool's counter: not ours to draw
            };
            let (Some(ts), Some(live)) = (ts, event.args["live"].as_u64()) else {
                return Err(format!("line {line_no}: counter without ts or live bytes"));
            };
            trace.last_us = trace.last_us.max(ts as u64);
            if !thinned.contains_key(&device) && thinned.len() >= MAX_DEVICES {
                trace.samples_left_out += 1;
                return Ok(());
            }
            thinned
                .entry(device)
                .or_insert_with(Thinned::new)
                .add(Sample {
                    t_us: ts as u64,
                    live,
                    high: event.args["high"].as_u64().unwrap_or(live).max(live),
                    pool_held: event.args["pool_held"].as_u64().unwrap_or(0),
                    cap: event.args["cap"].as_u64(),
                });
        }
        "i" | "I" => {
            let Some(ts) = ts else {
                return Err(format!("line {line_no}: instant event without ts"));
            };
            trace.last_us = trace.last_us.max(ts as u64);
            // Only the kinds a plot draws or reads are kept, and of each a bounded
            // number (the earliest, the plot's order): all are counted.
            let Some(name) = KEPT_EVENTS.into_iter().find(|n| *n == event.name) else {
                return Ok(());
            };
            *trace.instant_counts.entry(name).or_default() += 1;
            let device = event.args["device"]
                .as_i64()
                .and_then(|d| i32::try_from(d).ok());
            trace.instants.push(Instant {
                t_us: ts as u64,
                name: event.name,
                device,
                args: bounded_args(event.args),
            });
            if trace.instants.len() > 2 * KEPT_EVENTS.len() * MAX_INSTANTS_PER_NAME {
                keep_first_instants(&mut trace.instants);
            }
        }
        _ => {}
    }
    Ok(())
}

/// Lines of at most [`MAX_LINE`] bytes; the flag says whether the line ended in a
/// newline (a last line without one may be cut short).
struct LineReader<R> {
    input: R,
    line_no: u64,
}

impl<R: BufRead> LineReader<R> {
    fn next_line(&mut self) -> Result<Option<(u64, String, bool)>, String> {
        let mut buf = Vec::new();
        let mut limited = self.input.by_ref().take(MAX_LINE as u64 + 1);
        let n = limited
            .read_until(b'\n', &mut buf)
            .map_err(|e| format!("cannot read: {e}"))?;
        if n == 0 {
            return Ok(None);
        }
        self.line_no += 1;
        let complete = buf.last() == Some(&b'\n');
        if !complete && buf.len() > MAX_LINE {
            return Err(format!(
                "line {}: longer than {MAX_LINE} bytes; not a gpuguard trace",
                self.line_no
            ));
        }
        let text = match String::from_utf8(buf) {
            Ok(t) => t,
            // A last line cut inside a character (a killed writer): the whole
            // characters before the cut, a line cut short like any other.
            Err(e) if !complete && e.utf8_error().error_len().is_none() => {
                let valid = e.utf8_error().valid_up_to();
                String::from_utf8_lossy(&e.as_bytes()[..valid]).into_owned()
            }
            Err(_) => {
                return Err(format!(
                    "line {}: not UTF-8; not a gpuguard trace",
                    self.line_no
                ));
            }
        };
        Ok(Some((self.line_no, text, complete)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_path(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("gpuguard-trace-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("t.json")
    }

    fn options() -> TraceOptions {
        TraceOptions {
            pid: 42,
            program: "train.py".into(),
            version: "0.1.0".into(),
            start_unix_ms: 1_700_000_000_000,
            ..Default::default()
        }
    }

    /// The array form with a missing `]` as trace viewers read it: trailing whitespace
    /// and comma dropped, the array closed.
    fn close_array(text: &str) -> Value {
        let body = text.trim_end().trim_end_matches(',');
        serde_json::from_str(&format!("{body}]")).expect("a closed array parses")
    }

    fn counters(events: &Value, device: i32) -> Vec<(u64, u64)> {
        events
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == device_track_name(device))
            .map(|e| {
                (
                    e["ts"].as_u64().unwrap(),
                    e["args"]["live"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn finished_trace_is_strict_json_with_counters_and_events() {
        let path = temp_path("finished");
        let mut w = TraceWriter::create(&path, options()).unwrap();
        w.sample(0, 0, 100, 0, Some(1000));
        w.sample(20_000, 0, 300, 50, Some(1000));
        w.sample(20_000, 1, 7, 0, None);
        w.instant(
            25_000,
            event::CAP_REFUSAL,
            json!({"device": 0, "bytes": 900}),
        );
        w.finish(30_000).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let events: Value = serde_json::from_str(&text).expect("strict JSON");
        let all = events.as_array().unwrap();
        assert_eq!(all[0]["name"], HEADER_EVENT);
        assert!(all.iter().any(|e| e["ph"] == "M"
            && e["name"] == "process_name"
            && e["args"]["name"].as_str().unwrap().contains("train.py")));
        assert_eq!(counters(&events, 0), vec![(0, 100), (20_000, 300)]);
        let c = all
            .iter()
            .find(|e| e["ph"] == "C" && e["ts"] == 20_000 && e["name"] == "device 0")
            .unwrap();
        assert_eq!(
            c["args"],
            json!({"live": 300, "high": 300, "pool_held": 50, "cap": 1000})
        );
        let d1 = all.iter().find(|e| e["name"] == "device 1").unwrap();
        assert!(d1["args"].get("cap").is_none(), "uncapped: no cap counter");
        let refusal = all
            .iter()
            .find(|e| e["name"] == event::CAP_REFUSAL)
            .unwrap();
        assert_eq!(
            (refusal["ph"].as_str(), refusal["s"].as_str()),
            (Some("i"), Some("p"))
        );
        assert_eq!(refusal["args"]["bytes"], 900);
        assert_eq!(all.last().unwrap()["name"], event::END);

        let trace = read(text.as_bytes()).unwrap();
        assert!(!trace.unfinished);
        assert_eq!(trace.program, "train.py");
        assert_eq!(trace.devices[&0].len(), 2);
        assert_eq!(trace.devices[&0][1].cap, Some(1000));
        assert_eq!(trace.instants[0].device, Some(0));
    }

    /// A killed process: only what was flushed, no `]`, maybe a last line cut short.
    #[test]
    fn unfinished_trace_loads_with_the_array_left_open() {
        let path = temp_path("killed");
        let mut w = TraceWriter::create(&path, options()).unwrap();
        w.sample(0, 0, 100, 0, None);
        w.sample(50_000, 0, 200, 0, None);
        w.instant(60_000, event::TRIM, json!({"released_bytes": 100}));
        w.flush().unwrap();
        drop(w); // no finish: as if killed
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.trim_end().ends_with(']'));
        assert!(serde_json::from_str::<Value>(&text).is_err());
        let events = close_array(&text);
        assert_eq!(counters(&events, 0), vec![(0, 100), (50_000, 200)]);

        let trace = read(text.as_bytes()).unwrap();
        assert!(trace.unfinished);
        assert_eq!(trace.devices[&0].len(), 2);
        assert_eq!(trace.instants.len(), 1);
        // Cut mid-line: the whole lines before it still read.
        let cut = &text[..text.len() - 10];
        let trace = read(cut.as_bytes()).unwrap();
        assert_eq!(trace.devices[&0].len(), 2);
        assert!(trace.instants.is_empty());
    }

    #[test]
    fn samples_within_the_interval_keep_peak_and_last() {
        let path = temp_path("interval");
        let mut w = TraceWriter::create(&path, options()).unwrap();
        w.sample(0, 0, 10, 0, None);
        // A burst within 10 ms: only its peak and last value are kept.
        for (i, live) in [50u64, 900, 40, 30].iter().enumerate() {
            w.sample(1_000 + i as u64 * 1_000, 0, *live, 0, None);
        }
        // The 40 after the peak rides on the interval's last sample as its high; the
        // next sample says the high is back at the level; unchanged ones after it
        // write nothing.
        w.sample(10_000, 0, 30, 0, None);
        w.sample(30_000, 0, 30, 0, None);
        w.sample(40_000, 0, 30, 0, None);
        w.finish(50_000).unwrap();
        let events: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            highs(&events),
            vec![
                (0, 10, 10),
                (2_000, 900, 900),
                (10_000, 30, 40),
                (30_000, 30, 30)
            ]
        );
    }

    fn highs(events: &Value) -> Vec<(u64, u64, u64)> {
        events
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "C")
            .map(|e| {
                let a = &e["args"];
                let n = |k: &str| a[k].as_u64().unwrap();
                (e["ts"].as_u64().unwrap(), n("live"), n("high"))
            })
            .collect()
    }

    /// What the books' high-water mark saw between samples reaches the file, whether
    /// the interval's peak is written apart or folded into its last sample.
    #[test]
    fn highs_between_samples_survive_the_interval() {
        let path = temp_path("highs");
        let mut w = TraceWriter::create(&path, options()).unwrap();
        w.sample_high(0, 0, 10, 10, 0, None);
        // Within 10 ms: the peak sample (900) is written apart; the 950 seen after
        // it goes to the interval's last sample, the 500 before it to the peak.
        w.sample_high(1_000, 0, 20, 500, 0, None);
        w.sample_high(2_000, 0, 900, 900, 0, None);
        w.sample_high(3_000, 0, 40, 950, 0, None);
        w.sample_high(4_000, 0, 30, 30, 0, None);
        w.sample_high(10_000, 0, 30, 30, 0, None);
        // The level unchanged but for a spike between two samples: written.
        w.sample_high(20_000, 0, 30, 4_000, 0, None);
        w.sample_high(30_000, 0, 30, 30, 0, None);
        // The interval's peak is its last sample: a high before it is carried.
        w.sample_high(31_000, 0, 25, 700, 0, None);
        w.sample_high(32_000, 0, 60, 60, 0, None);
        w.finish(50_000).unwrap();
        let events: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            highs(&events),
            vec![
                (0, 10, 10),
                (2_000, 900, 900),
                (10_000, 30, 950),
                (20_000, 30, 4_000),
                (30_000, 30, 30),
                (32_000, 60, 700)
            ]
        );
        let trace = read(std::fs::read_to_string(&path).unwrap().as_bytes()).unwrap();
        let high: Vec<u64> = trace.devices[&0].iter().map(|s| s.high).collect();
        assert_eq!(high, vec![10, 900, 950, 4_000, 30, 700]);
    }

    #[test]
    fn a_trace_without_highs_reads_its_live_bytes_as_highs() {
        let text = "[\n{\"name\":\"gpuguard_trace\",\"ph\":\"M\",\"pid\":7,\"args\":{\"schema\":\"gpuguard-trace/1\"}},\n\
            {\"name\":\"device 0\",\"ph\":\"C\",\"ts\":5,\"args\":{\"live\":100,\"pool_held\":0}},\n\
            {\"name\":\"device 0\",\"ph\":\"C\",\"ts\":9,\"args\":{\"live\":40,\"high\":7}},\n";
        let trace = read(text.as_bytes()).unwrap();
        let got: Vec<(u64, u64)> = trace.devices[&0].iter().map(|s| (s.live, s.high)).collect();
        assert_eq!(got, vec![(100, 100), (40, 40)], "a high below live is live");
    }

    #[test]
    fn pending_samples_are_written_before_an_instant_and_at_finish() {
        let path = temp_path("pending");
        let mut w = TraceWriter::create(&path, options()).unwrap();
        w.sample(0, 0, 10, 0, None);
        w.sample(1_000, 0, 20, 0, None); // within the interval: pending
        w.instant(2_000, event::WARNING, json!({"device": 0, "message": "x"}));
        w.sample(3_000, 0, 30, 0, None); // pending until finish
        w.finish(4_000).unwrap();
        let events: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            counters(&events, 0),
            vec![(0, 10), (1_000, 20), (3_000, 30)]
        );
    }

    #[test]
    fn stays_in_budget_thinning_as_it_goes() {
        let path = temp_path("budget");
        let budget = 64 << 10;
        let mut w = TraceWriter::create(
            &path,
            TraceOptions {
                max_bytes: budget,
                min_interval_us: 1_000,
                ..options()
            },
        )
        .unwrap();
        // A sample every ms, always changing, for a long time.
        let mut t = 0;
        for i in 0..200_000u64 {
            t = i * 1_000;
            w.sample(t, 0, i * 4096 % 1_000_003, 0, Some(1 << 30));
        }
        assert!(w.interval_us() > 1_000, "the interval grew");
        w.instant(t, event::CAP_REFUSAL, json!({"device": 0}));
        w.finish(t).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.len() as u64 <= budget, "{} > {budget}", text.len());
        let events: Value = serde_json::from_str(&text).expect("still strict JSON");
        let all = events.as_array().unwrap();
        assert!(all.iter().any(|e| e["name"] == event::THINNED));
        assert_eq!(all.last().unwrap()["name"], event::END);
        // Thinning spreads the budget over the whole run, not only its start.
        let c = counters(&events, 0);
        assert!(c.len() > 100);
        assert!(c.last().unwrap().0 >= t - 1_000_000, "{:?}", c.last());
    }

    #[test]
    fn a_long_trace_is_read_into_bounded_memory_keeping_its_shape() {
        let mut text = String::from("[\n");
        text.push_str(r#"{"name":"gpuguard_trace","ph":"M","pid":7,"args":{"schema":"gpuguard-trace/1","program":"p"}},"#);
        text.push('\n');
        let n = 200_000u64;
        for i in 0..n {
            let live = if i == 123_457 { 1 << 40 } else { i % 1000 };
            // One moment between samples higher than any sample: its sample is
            // an ordinary one, which thinning leaves out.
            let high = if i == 77_777 { 1 << 41 } else { live };
            text.push_str(&format!(
                "{{\"name\":\"device 0\",\"ph\":\"C\",\"ts\":{},\"args\":{{\"live\":{live},\"high\":{high}}}}},\n",
                i * 10
            ));
            if i % 20 == 0 {
                let long = "m".repeat(5000);
                text.push_str(&format!(
                    "{{\"name\":\"warning\",\"ph\":\"i\",\"ts\":{},\"args\":{{\"device\":0,\"message\":\"{long}\"}}}},\n",
                    i * 10
                ));
            }
        }
        let trace = read(text.as_bytes()).unwrap();
        let samples = &trace.devices[&0];
        assert!(samples.len() <= 3 * MAX_BUCKETS, "{}", samples.len());
        assert!(samples.len() > MAX_BUCKETS, "{}", samples.len());
        assert!(samples.windows(2).all(|w| w[0].t_us <= w[1].t_us));
        assert!(
            samples.iter().any(|s| s.live == 1 << 40),
            "the peak is kept"
        );
        let spike: Vec<&Sample> = samples.iter().filter(|s| s.high == 1 << 41).collect();
        assert_eq!(spike.len(), 1, "the high between samples is kept once");
        assert!(
            spike[0].t_us >= 77_777 * 10,
            "{spike:?}: not before its moment"
        );
        assert!(samples.iter().all(|s| s.high >= s.live));
        assert_eq!(
            samples.last().unwrap().t_us,
            (n - 1) * 10,
            "the last is kept"
        );
        assert_eq!(trace.count(event::WARNING), n / 20);
        assert_eq!(trace.instants.len(), MAX_INSTANTS_PER_NAME);
        assert_eq!(trace.instants[0].t_us, 0, "the first are kept");
        let message = trace.instants[0].args["message"].as_str().unwrap();
        assert!(message.len() <= MAX_ARG_TEXT + 3 && message.ends_with('…'));
        assert_eq!(trace.end_us(), (n - 1) * 10);
    }

    #[test]
    fn reader_refuses_foreign_and_newer_files() {
        let report = r#"{"schema":"gpuguard-report/1","pid":1}"#;
        assert!(
            read(report.as_bytes())
                .unwrap_err()
                .contains("not a gpuguard trace")
        );
        let other = "[\n{\"name\":\"x\",\"ph\":\"B\",\"ts\":1,\"pid\":1},\n";
        assert!(
            read(other.as_bytes())
                .unwrap_err()
                .contains("not a gpuguard trace")
        );
        let newer = format!(
            "[\n{{\"name\":\"{HEADER_EVENT}\",\"ph\":\"M\",\"pid\":1,\"args\":{{\"schema\":\"gpuguard-trace/9\"}}}},\n"
        );
        assert!(
            read(newer.as_bytes())
                .unwrap_err()
                .contains("gpuguard-trace/9")
        );
        assert!(read(&b""[..]).unwrap_err().contains("not a gpuguard trace"));
        let garbage = "[\n{\"name\":\"gpuguard_trace\",\"ph\":\"M\",\"args\":{\"schema\":\"gpuguard-trace/1\"}},\n@@@\n{}\n";
        assert!(read(garbage.as_bytes()).unwrap_err().contains("line 3"));
    }

    #[test]
    fn unwritable_path_is_an_error_not_a_panic() {
        let path = temp_path("unwritable");
        let dir = path.parent().unwrap();
        assert!(TraceWriter::create(dir, options()).is_err());
        assert!(TraceWriter::create(&dir.join("no/such/dir/t.json"), options()).is_err());
    }
}
