//! `gpuguard flamegraph REPORT -o leaks.html`: the live memory of a report as a flame
//! graph in one self-contained HTML page (inline style and script, nothing fetched).
//!
//! Call stacks are stacked from the outermost frame (top row) to the innermost, each
//! frame as wide as the live bytes allocated under it. Two views: the Python lines of
//! framework blocks in use (`python_sites`, grouped by framework) and the native call
//! sites of every live allocation (`sites`). Hovering a frame shows its bytes and
//! allocation count; clicking zooms into it; the search box highlights matching frames
//! and sums their bytes.
//!
//! Report strings are untrusted: the data travels as JSON in a non-executed script
//! element with `<`, `>` and `&` escaped, and the page's script puts text in the page
//! only through `textContent`.

use super::Outcome;
use super::growth::PYTHON_STACK;
use super::load::load_keeping;
use super::output::write_view;
use super::plot::xml;
use super::text::readable_frames;
use gpuguard_core::report::{PY_FRAME, Report, human_bytes};
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;

/// `gpuguard flamegraph` options.
#[derive(clap::Args)]
#[command(
    after_help = "The page needs no network: open it in any browser. Frames are \
    stacked outermost on top; width is live bytes. Views: Python lines of framework \
    blocks in use (when the report has them) and native call stacks."
)]
pub struct FlamegraphArgs {
    /// A report file (gpuguard.*.json), e.g. the one written at exit
    #[arg(value_name = "REPORT")]
    pub report: PathBuf,
    /// Where the HTML page goes (`-` for stdout); default: REPORT with the extension .html
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub fn main(args: FlamegraphArgs) -> Outcome {
    // Drawn from the sites: no live allocation is kept.
    let report = load_keeping(&args.report, 0)?;
    let out = args
        .output
        .unwrap_or_else(|| args.report.with_extension("html"));
    write_view(&out, &args.report, &render_html(&report))?;
    Ok(0)
}

/// A frame and what was allocated under it.
#[derive(Debug, Default, Serialize, PartialEq)]
struct Node {
    /// The frame's text.
    n: String,
    /// Live bytes and allocations under it.
    b: u64,
    c: u64,
    /// `root`, `group` (a framework), `py` (a Python line) or `native`.
    k: &'static str,
    ch: Vec<Node>,
    /// Where each child is in `ch`, by its text, while stacks are added: a hash
    /// lookup per frame, where a search of `ch` was quadratic in a frame's children.
    /// Dropped once the tree is built.
    #[serde(skip)]
    at: HashMap<String, usize>,
}

impl Node {
    fn new(name: String, kind: &'static str) -> Node {
        Node {
            n: name,
            k: kind,
            ..Default::default()
        }
    }

    /// Adds a stack, outermost frame first, with its bytes and count.
    fn add<'a>(
        &mut self,
        stack: impl Iterator<Item = (&'a str, &'static str)>,
        bytes: u64,
        count: u64,
    ) {
        // Saturating: a report's figures are input like any other.
        self.b = self.b.saturating_add(bytes);
        self.c = self.c.saturating_add(count);
        let mut node = self;
        for (frame, kind) in stack {
            let i = match node.at.get(frame) {
                Some(&i) => i,
                None => {
                    node.at.insert(frame.to_string(), node.ch.len());
                    node.ch.push(Node::new(frame.to_string(), kind));
                    node.ch.len() - 1
                }
            };
            node = &mut node.ch[i];
            node.b = node.b.saturating_add(bytes);
            node.c = node.c.saturating_add(count);
        }
    }

    /// Children widest first, all the way down.
    fn sort(&mut self) {
        self.at = HashMap::new();
        self.ch
            .sort_by(|a, b| b.b.cmp(&a.b).then_with(|| a.n.cmp(&b.n)));
        for c in &mut self.ch {
            c.sort();
        }
    }
}

#[derive(Serialize)]
struct View {
    name: &'static str,
    about: &'static str,
    root: Node,
}

#[derive(Serialize)]
struct PageData {
    title: String,
    subtitle: String,
    views: Vec<View>,
}

fn frame_kind(frame: &str) -> &'static str {
    if frame.starts_with(PY_FRAME) {
        "py"
    } else {
        "native"
    }
}

/// What the Python view holds: a framework's lines count its blocks in use;
/// `python-stack` lines (read from the allocating thread's own stack) count the
/// allocations they made, cached memory included. (root name, about)
fn python_words(report: &Report) -> (&'static str, &'static str) {
    let stack = report
        .python_sites
        .iter()
        .filter(|s| s.framework == PYTHON_STACK)
        .count();
    if stack == 0 {
        (
            "all framework blocks in use",
            "framework blocks in use, by the Python line that allocated them",
        )
    } else if stack == report.python_sites.len() {
        (
            "all live allocations with a Python line",
            "live allocations, by the Python line that made them (python-stack)",
        )
    } else {
        (
            "all Python lines",
            "framework blocks in use and python-stack allocations, by Python line",
        )
    }
}

/// Frames a stack keeps in the page: the tree is built, sorted, encoded and drawn
/// by recursion as deep as its stacks, and a report is input like any other.
const MAX_DEPTH: usize = 512;

/// A stack's frames, innermost first, bounded to [`MAX_DEPTH`]: the innermost are
/// kept (they say where), the outer ones left out are named by one frame.
fn bounded<S: AsRef<str>>(frames: &[S]) -> (Option<String>, &[S]) {
    if frames.len() <= MAX_DEPTH {
        return (None, frames);
    }
    let left_out = frames.len() - (MAX_DEPTH - 1);
    (
        Some(format!("({left_out} outer frames left out)")),
        &frames[..MAX_DEPTH - 1],
    )
}

/// The Python view: framework blocks in use (and python-stack allocations), by
/// framework, then Python line.
fn python_view(report: &Report) -> Node {
    let mut root = Node::new(python_words(report).0.into(), "root");
    for site in &report.python_sites {
        let group = format!("[{}]", site.framework);
        let (cut, frames) = bounded(&site.frames);
        let stack = std::iter::once((group.as_str(), "group"))
            .chain(cut.as_deref().map(|c| (c, "py")))
            .chain(frames.iter().rev().map(|f| (f.as_str(), "py")));
        root.add(stack, site.live_bytes, site.live_count);
    }
    root.sort();
    root
}

/// The native view: every live allocation, by call stack.
fn native_view(report: &Report) -> Node {
    let mut root = Node::new("all live allocations".into(), "root");
    for site in &report.sites {
        if site.frames.is_empty() {
            root.add(
                std::iter::once(("(no stack)", "native")),
                site.live_bytes,
                site.live_count,
            );
        } else {
            // Start-up frames cut and names demangled, as `show` prints them.
            let frames = readable_frames(&site.frames);
            let (cut, frames) = bounded(&frames);
            let stack = cut
                .as_deref()
                .map(|c| (c, "native"))
                .into_iter()
                .chain(frames.iter().rev().map(|f| (f.as_str(), frame_kind(f))));
            root.add(stack, site.live_bytes, site.live_count);
        }
    }
    // Live allocations without a site (stacks off) still count in the total.
    let sited = report
        .sites
        .iter()
        .fold(0u64, |a, s| a.saturating_add(s.live_bytes));
    let total = report
        .devices
        .iter()
        .fold(0u64, |a, d| a.saturating_add(d.current_bytes));
    if total > sited && report.sites.is_empty() {
        root.add(
            std::iter::once(("(no stacks recorded)", "native")),
            total - sited,
            0,
        );
    }
    root.sort();
    root
}

/// The HTML page for `report`.
pub fn render_html(report: &Report) -> String {
    let title = format!("{} (pid {})", report.program, report.pid);
    let devices: Vec<String> = report
        .devices
        .iter()
        .map(|d| format!("device {}: {} live", d.device, human_bytes(d.current_bytes)))
        .collect();
    let mut subtitle = format!(
        "{} report #{} after {:.1} s; {}",
        report.reason,
        report.seq,
        report.uptime_s,
        if devices.is_empty() {
            "no device".to_string()
        } else {
            devices.join(", ")
        }
    );
    if let Some(o) = &report.oom {
        // The graph is the books as the report was written; say how they stood
        // against the refusal's moment.
        subtitle.push_str(&format!(
            "; out of memory on device {}: {} of {} refused with {} live{}",
            o.device,
            o.api,
            human_bytes(o.bytes),
            human_bytes(o.live_bytes),
            o.at_writing.as_ref().map_or(String::new(), |w| format!(
                " (the graph: what was live {:.3} s later, as the report was written)",
                w.after_s
            ))
        ));
    }
    let data = PageData {
        title: title.clone(),
        subtitle,
        views: vec![
            View {
                name: "Python",
                about: python_words(report).1,
                root: python_view(report),
            },
            View {
                name: "native",
                about: "live allocations, by native call stack",
                root: native_view(report),
            },
        ],
    };
    let json = serde_json::to_string(&data).unwrap_or_else(|_| "{}".into());
    // Inside a script element, `</script>` or `<!--` in a string would end or change
    // it: escape the characters of markup (JSON reads the escapes back as they were).
    let json = json
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026");
    let mut page = String::with_capacity(PAGE_HEAD.len() + PAGE_TAIL.len() + json.len() + 200);
    page.push_str(PAGE_HEAD);
    page.push_str(&xml(&format!("gpuguard flame graph: {title}")));
    page.push_str(PAGE_MIDDLE);
    page.push_str(&json);
    page.push_str(PAGE_TAIL);
    page
}

const PAGE_HEAD: &str = r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>"#;

const PAGE_MIDDLE: &str = r#"</title>
<style>
body { font: 13px/1.4 system-ui, sans-serif; margin: 0; color: #222; background: #fafafa; }
header { padding: 10px 16px 6px; background: #fff; border-bottom: 1px solid #ddd; }
h1 { font-size: 17px; margin: 0 0 2px; }
#subtitle, #about { color: #555; }
#bar { display: flex; gap: 8px; align-items: center; padding: 8px 16px; flex-wrap: wrap; }
#bar button { font: inherit; padding: 3px 10px; border: 1px solid #bbb; background: #fff; border-radius: 4px; cursor: pointer; }
#bar button.on { background: #333; color: #fff; border-color: #333; }
#bar button:disabled { opacity: .4; cursor: default; }
#search { font: inherit; padding: 3px 6px; width: 260px; }
#matched { color: #8e24aa; }
#info { padding: 4px 16px; min-height: 1.4em; font-family: ui-monospace, monospace; white-space: pre-wrap; word-break: break-all; background: #fff; border-top: 1px solid #eee; border-bottom: 1px solid #eee; }
#chart { position: relative; margin: 8px 16px 24px; }
.frame { position: absolute; height: 19px; box-sizing: border-box; border: 1px solid #fafafa; border-radius: 2px;
  overflow: hidden; white-space: nowrap; text-overflow: ellipsis; padding: 0 4px; font: 12px/17px ui-monospace, monospace; cursor: pointer; }
.frame:hover { border-color: #222; }
.frame.root { background: #d0d0d0; }
.frame.group { background: #b9c7d6; }
.frame.above { opacity: .55; }
.frame.match { background: #e040fb !important; color: #fff; }
#empty { margin: 16px; color: #555; }
#errors { color: #b00020; margin: 0 16px; }
#views button { margin-right: 4px; }
h2 { font-size: 14px; margin: 0 16px 4px; }
#top { margin: 0 16px 24px; border-collapse: collapse; font: 12px/1.5 ui-monospace, monospace; }
#top td, #top th { padding: 1px 10px 1px 0; text-align: right; vertical-align: top; }
#top td:last-child, #top th:last-child { text-align: left; word-break: break-all; }
#top tbody tr { cursor: pointer; }
#top tbody tr:hover { background: #eee; }
</style>
</head>
<body>
<script>
// Errors of the page's own script show on the page (and to a headless test).
window.addEventListener('error', function (e) {
  document.body.setAttribute('data-error', String(e.message));
  var box = document.getElementById('errors');
  if (box) box.textContent = 'script error: ' + e.message;
});
</script>
<header>
<h1 id="title"></h1>
<div id="subtitle"></div>
</header>
<div id="bar">
<span>view:</span><span id="views"></span>
<input id="search" type="search" placeholder="search frames (text or /regex/)" aria-label="search frames">
<button id="reset" type="button">reset zoom</button>
<span id="matched"></span>
<span id="about"></span>
</div>
<div id="info">hover a frame for its bytes; click to zoom; Esc resets</div>
<div id="errors"></div>
<div id="chart"></div>
<div id="empty" hidden>No live allocations in this view.</div>
<h2>Innermost frames holding the most</h2>
<table id="top"><thead><tr><th>live</th><th>share</th><th>allocations</th><th>frame</th></tr></thead><tbody></tbody></table>
<script type="application/json" id="gg-data">"#;

const PAGE_TAIL: &str = r#"</script>
<script>
(function () {
  'use strict';
  var ROW = 20;
  var MIN_WIDTH = 0.0008; // of the chart; narrower frames are left out
  var data = JSON.parse(document.getElementById('gg-data').textContent);
  var chart = document.getElementById('chart');
  var info = document.getElementById('info');
  var matched = document.getElementById('matched');
  var state = { view: 0, zoom: null, match: null };

  function human(b) {
    var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    var v = b, i = 0;
    while (v >= 1024 && i + 1 < units.length) { v /= 1024; i++; }
    return i === 0 ? b + ' B' : v.toFixed(1) + ' ' + units[i];
  }
  function plural(n, one, many) { return n + ' ' + (n === 1 ? one : many); }

  // Parent links, for the zoomed frame's ancestors.
  function link(node, parent) {
    node.p = parent;
    for (var i = 0; i < node.ch.length; i++) link(node.ch[i], node);
  }
  data.views.forEach(function (v) { link(v.root, null); });

  // Frame colours: warm for native code, green for Python lines, by a hash of the
  // text so a frame keeps its colour across views and zooms.
  function colour(node) {
    var h = 0;
    for (var i = 0; i < node.n.length; i++) h = (h * 31 + node.n.charCodeAt(i)) >>> 0;
    if (node.k === 'py') return 'hsl(' + (85 + h % 45) + ',55%,' + (62 + h % 12) + '%)';
    return 'hsl(' + (8 + h % 40) + ',85%,' + (60 + h % 12) + '%)';
  }

  function matcher(text) {
    if (!text) return null;
    var m = /^\/(.+)\/$/.exec(text);
    if (m) {
      try { var re = new RegExp(m[1], 'i'); return function (s) { return re.test(s); }; }
      catch (e) { return null; }
    }
    var needle = text.toLowerCase();
    return function (s) { return s.toLowerCase().indexOf(needle) >= 0; };
  }

  // A frame's label: a Python line as `function (file.py:line)`, the file without its
  // folder (the full frame shows on hover), then the bytes.
  function label(node) {
    var text = node.n;
    var py = /^(?:python: )?(.*?):(\d+) in (.*)$/.exec(text);
    if (node.k === 'py' && py) {
      text = py[3] + ' (' + py[1].replace(/^.*\//, '') + ':' + py[2] + ')';
    }
    return text + '  ' + human(node.b);
  }

  function describe(node, total) {
    var pct = total > 0 ? (100 * node.b / total).toFixed(1) : '0.0';
    return node.n + '\n' + human(node.b) + ' (' + pct + '%), ' +
      plural(node.c, 'allocation', 'allocations');
  }

  function place(node, depth, x, w, extra, total) {
    var el = document.createElement('div');
    el.className = 'frame ' + node.k + extra +
      (state.match && node.k !== 'root' && state.match(node.n) ? ' match' : '');
    el.style.left = (100 * x) + '%';
    el.style.width = (100 * w) + '%';
    el.style.top = (depth * ROW) + 'px';
    if (node.k === 'py' || node.k === 'native') el.style.background = colour(node);
    el.textContent = label(node);
    el.addEventListener('mouseenter', function () { info.textContent = describe(node, total); });
    el.addEventListener('click', function () {
      state.zoom = node.p === null ? null : node;
      render();
      info.textContent = describe(node, total);
    });
    chart.appendChild(el);
  }

  function layout(node, depth, x, w, total, out) {
    if (w < MIN_WIDTH || node.b === 0) return depth;
    place(node, depth, x, w, '', total);
    out.count++;
    var deepest = depth;
    var cx = x;
    for (var i = 0; i < node.ch.length; i++) {
      var c = node.ch[i];
      var cw = w * c.b / node.b;
      deepest = Math.max(deepest, layout(c, depth + 1, cx, cw, total, out));
      cx += cw;
    }
    return deepest;
  }

  // Bytes under frames that match, each counted once (not again under a match).
  function matchedBytes(node) {
    if (node.k !== 'root' && state.match(node.n)) return node.b;
    var sum = 0;
    for (var i = 0; i < node.ch.length; i++) sum += matchedBytes(node.ch[i]);
    return sum;
  }

  // The innermost frames (where the allocations were made), most bytes first; a click
  // searches for the frame.
  function topTable(root) {
    var leaves = {};
    (function walk(node) {
      if (node.ch.length === 0 && node.k !== 'root') {
        var e = leaves[node.n] || (leaves[node.n] = { n: node.n, b: 0, c: 0 });
        e.b += node.b; e.c += node.c;
      }
      node.ch.forEach(walk);
    })(root);
    var rows = Object.keys(leaves).map(function (k) { return leaves[k]; })
      .sort(function (a, b) { return b.b - a.b; }).slice(0, 15);
    var body = document.querySelector('#top tbody');
    body.textContent = '';
    rows.forEach(function (r) {
      var tr = document.createElement('tr');
      [human(r.b), (root.b > 0 ? (100 * r.b / root.b).toFixed(1) : '0.0') + '%', String(r.c), r.n]
        .forEach(function (text) {
          var td = document.createElement('td');
          td.textContent = text;
          tr.appendChild(td);
        });
      tr.addEventListener('click', function () {
        var box = document.getElementById('search');
        box.value = r.n;
        state.match = matcher(r.n);
        render();
      });
      body.appendChild(tr);
    });
  }

  function render() {
    var view = data.views[state.view];
    var root = view.root;
    var zoom = state.zoom || root;
    chart.textContent = '';
    var above = [];
    for (var n = zoom.p; n; n = n.p) above.unshift(n);
    above.forEach(function (a, i) { place(a, i, 0, 1, ' above', root.b); });
    var out = { count: above.length };
    var deepest = layout(zoom, above.length, 0, 1, root.b, out);
    chart.style.height = ((deepest + 1) * ROW + 4) + 'px';
    document.getElementById('empty').hidden = root.b > 0;
    document.getElementById('about').textContent = view.about;
    if (state.match) {
      var b = matchedBytes(root);
      matched.textContent = 'matched ' + human(b) + ' (' +
        (root.b > 0 ? (100 * b / root.b).toFixed(1) : '0.0') + '%)';
    } else {
      matched.textContent = '';
    }
    topTable(root);
    var buttons = document.querySelectorAll('#views button');
    for (var i = 0; i < buttons.length; i++) buttons[i].className = i === state.view ? 'on' : '';
    document.body.setAttribute('data-rendered', 'yes');
    document.body.setAttribute('data-frames', String(out.count));
  }

  document.getElementById('title').textContent = data.title;
  document.getElementById('subtitle').textContent = data.subtitle;
  var views = document.getElementById('views');
  data.views.forEach(function (v, i) {
    var b = document.createElement('button');
    b.type = 'button';
    b.textContent = v.name + ' (' + human(v.root.b) + ')';
    b.disabled = v.root.b === 0;
    b.addEventListener('click', function () { state.view = i; state.zoom = null; render(); });
    views.appendChild(b);
  });
  // Python lines first when the report has them: they name the program's own code.
  state.view = data.views[0].root.b > 0 ? 0 : 1;
  document.getElementById('search').addEventListener('input', function (e) {
    state.match = matcher(e.target.value.trim());
    render();
  });
  document.getElementById('reset').addEventListener('click', function () { state.zoom = null; render(); });
  document.addEventListener('keydown', function (e) {
    if (e.key === 'Escape') { state.zoom = null; render(); }
  });
  render();
})();
</script>
</body>
</html>
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use gpuguard_core::report::{PythonSite, Site};

    fn report() -> Report {
        Report {
            program: "train</title><script>alert(1)</script>".into(),
            sites: vec![
                Site {
                    id: 0,
                    frames: vec!["leaky_function+0x10".into(), "main+0x5".into()],
                    live_bytes: 300,
                    live_count: 3,
                    captured: None,
                    held_by: Vec::new(),
                    captured_bytes: 0,
                },
                Site {
                    id: 1,
                    frames: vec!["other+0x1".into(), "main+0x5".into()],
                    live_bytes: 100,
                    live_count: 1,
                    captured: None,
                    held_by: Vec::new(),
                    captured_bytes: 0,
                },
            ],
            python_sites: vec![PythonSite {
                id: 0,
                framework: "torch".into(),
                frames: vec![
                    "train.py:42 in step".into(),
                    "train.py:90 in <module>".into(),
                ],
                live_bytes: 64,
                live_count: 2,
                captured: None,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn stacks_merge_outermost_first() {
        let root = native_view(&report());
        assert_eq!((root.b, root.c), (400, 4));
        assert_eq!(root.ch.len(), 1);
        let main = &root.ch[0];
        assert_eq!((main.n.as_str(), main.b), ("main+0x5", 400));
        let names: Vec<_> = main.ch.iter().map(|c| (c.n.as_str(), c.b, c.c)).collect();
        assert_eq!(
            names,
            [("leaky_function+0x10", 300, 3), ("other+0x1", 100, 1)]
        );
        let py = python_view(&report());
        assert_eq!(py.ch[0].n, "[torch]");
        assert_eq!(py.ch[0].ch[0].n, "train.py:90 in <module>");
        assert_eq!(py.ch[0].ch[0].ch[0].k, "py");
    }

    #[test]
    fn report_text_cannot_break_out_of_the_page() {
        let page = render_html(&report());
        assert!(!page.contains("<script>alert"));
        assert_eq!(page.matches("</script>").count(), 3, "only the page's own");
        assert!(page.contains("<title>gpuguard flame graph: train&lt;/title&gt;"));
        // The data still reads back as it was.
        let start = page.find("id=\"gg-data\">").unwrap() + "id=\"gg-data\">".len();
        let end = start + page[start..].find("</script>").unwrap();
        let data: serde_json::Value = serde_json::from_str(&page[start..end]).unwrap();
        assert_eq!(
            data["title"],
            "train</title><script>alert(1)</script> (pid 0)"
        );
        assert!(
            !page.contains("http://") && !page.contains("https://"),
            "nothing fetched"
        );
    }
}
