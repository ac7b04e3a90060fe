"""The dashboard page: one self-contained HTML document (no CDN, no build step).

It reads ``/api/events`` (server-sent events; ``/api/status`` once first) with the token of
its own URL and draws everything with the DOM and inline SVG.  Text from the job is inserted
with ``textContent`` only, never as HTML.
"""

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>byteps dashboard</title>
<style>
body{font:13px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#222}
header{background:#1f2d3d;color:#fff;padding:8px 16px;display:flex;gap:24px;flex-wrap:wrap}
header b{font-weight:600} main{padding:12px 16px;display:grid;gap:12px}
section{background:#fff;border:1px solid #dde;border-radius:6px;padding:8px 12px}
h2{font-size:14px;margin:2px 0 6px} table{border-collapse:collapse;width:100%}
th,td{text-align:right;padding:2px 8px;border-bottom:1px solid #eee;white-space:nowrap}
th:first-child,td:first-child,td.l,th.l{text-align:left}
tr.gone td{color:#999;text-decoration:line-through} tr.stuck td{background:#ffd9d0}
tr.stalled td{background:#fff8e0}
#warnings li{color:#a40} pre{white-space:pre-wrap;margin:4px 0;font-size:12px}
.plots{display:grid;grid-template-columns:1fr 1fr;gap:12px} svg{width:100%;height:180px}
#conn{margin-left:auto} .ok{color:#8f8} .bad{color:#f88}
</style></head><body>
<header><span><b>byteps</b> <span id="job">-</span></span>
<span>epoch <b id="epoch">-</b></span><span>workers <b id="nworkers">-</b></span>
<span>servers <b id="nservers">-</b></span><span>mode <b id="mode">-</b></span>
<span>compression <b id="comp">-</b> (ratio <b id="ratio">-</b>)</span>
<span>autotune <b id="tune">-</b></span><span>up <b id="uptime">-</b> s</span>
<span id="conn" class="bad">connecting</span></header>
<main>
<section><h2>Warnings</h2><ul id="warnings"><li>none</li></ul>
<div id="straggler"></div></section>
<section><h2>Workers</h2><table id="ranks"><thead><tr><th>rank</th><th class="l">host</th>
<th>pid</th><th class="l">state</th><th>step</th><th>step ms</th><th>compute ms</th>
<th>comm wait ms</th><th>MB/s</th><th>bytes/step</th><th>round ms</th><th>push ms</th>
<th class="l">last completed</th></tr></thead><tbody></tbody></table></section>
<section><h2>Servers</h2><table id="servers"><thead><tr><th>server</th>
<th class="l">host</th><th class="l">address</th><th class="l">state</th><th>keys</th>
<th>MB/s in</th><th>rounds</th><th>open rounds</th><th>queue</th>
<th>round ms (workers' view)</th><th class="l">replica</th></tr></thead><tbody></tbody>
</table></section>
<div class="plots"><section><h2>Step time (ms) per rank</h2><svg id="plot_step"></svg></section>
<section><h2>push_pull throughput (MB/s) per rank</h2><svg id="plot_mbps"></svg></section></div>
<section><h2>Timelines</h2><ul id="traces"><li>no timeline (BYTEPS_TRACE_ON=1, with
BYTEPS_TRACE_SAMPLE=N for a long job)</li></ul><div>Open a written file in Perfetto
(ui.perfetto.dev, "Open trace file") or chrome://tracing.</div></section>
<section><h2>Hang doctor</h2><div id="doctor">no stall reported</div></section>
<section><h2>Events</h2><ul id="events"></ul></section>
</main>
<script>
"use strict";
const tok = new URLSearchParams(location.search).get("token");
const q = tok ? "?token=" + encodeURIComponent(tok) : "";
const COLORS = ["#1f77b4","#d62728","#2ca02c","#ff7f0e","#9467bd","#8c564b","#e377c2",
                "#7f7f7f","#bcbd22","#17becf"];
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function num(v, d) { return (typeof v === "number") ? v.toFixed(d) : "-"; }
function set(id, v) { document.getElementById(id).textContent = v; }
function fillList(id, items, empty) {
  const ul = document.getElementById(id); ul.replaceChildren();
  if (!items.length && empty) ul.appendChild(el("li", empty));
  for (const t of items) ul.appendChild(el("li", t));
}
function rows(id, list, cells, rowClass, key) {
  const tb = document.querySelector("#" + id + " tbody"); tb.replaceChildren();
  for (const item of list) {
    const tr = el("tr", null, rowClass(item));
    tr.dataset[key] = item[key === "rank" ? "rank" : "index"];
    for (const [v, cls] of cells(item)) tr.appendChild(el("td", v, cls));
    tb.appendChild(tr);
  }
}
function plot(id, series, idx) {
  const svg = document.getElementById(id), W = 600, H = 180, P = 30;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`); svg.replaceChildren();
  const NS = "http://www.w3.org/2000/svg", lines = {};
  let tmax = 1, vmax = 0;
  for (const [t, per] of series) {
    tmax = Math.max(tmax, t);
    for (const r in per) { const v = per[r][idx];
      if (typeof v === "number") { (lines[r] = lines[r] || []).push([t, v]);
        vmax = Math.max(vmax, v); } }
  }
  vmax = vmax > 0 ? vmax * 1.1 : 1;
  const ax = document.createElementNS(NS, "path");
  ax.setAttribute("d", `M${P},5 V${H - P} H${W - 5}`);
  ax.setAttribute("stroke", "#999"); ax.setAttribute("fill", "none"); svg.appendChild(ax);
  for (const [txt, x, y] of [[vmax.toFixed(1), 2, 12], ["0", 2, H - P],
                             [tmax.toFixed(0) + " s", W - 40, H - 12]]) {
    const t = document.createElementNS(NS, "text"); t.textContent = txt;
    t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("font-size", "10");
    svg.appendChild(t);
  }
  let i = 0;
  const order = k => isNaN(k) ? ["min", "median", "max"].indexOf(k) - 10 : Number(k);
  for (const r of Object.keys(lines).sort((a, b) => order(a) - order(b))) {
    const pts = lines[r].map(([t, v]) =>
      `${(P + (W - P - 5) * t / tmax).toFixed(1)},${(H - P - (H - P - 5) * v / vmax).toFixed(1)}`);
    const pl = document.createElementNS(NS, "polyline");
    pl.setAttribute("points", pts.join(" ")); pl.setAttribute("fill", "none");
    pl.setAttribute("stroke", COLORS[i % COLORS.length]); pl.setAttribute("stroke-width", "1.5");
    pl.dataset.rank = r; svg.appendChild(pl);
    const lab = document.createElementNS(NS, "text");
    lab.textContent = isNaN(r) ? r + " of the ranks" : "rank " + r;
    lab.setAttribute("x", W - 90); lab.setAttribute("y", 14 + 12 * i);
    lab.setAttribute("font-size", "10"); lab.setAttribute("fill", COLORS[i % COLORS.length]);
    svg.appendChild(lab); i++;
  }
}
function render(s) {
  set("job", s.job); set("epoch", s.epoch); set("uptime", num(s.uptime_s, 0));
  set("nworkers", s.workers.length); set("nservers", s.servers.length);
  const c = s.config || {};
  set("mode", c.mode || "-"); set("comp", c.compression || "-"); set("ratio", num(c.ratio, 2));
  const t = c.autotune;
  set("tune", t ? `${t.state || ""} partition ${t.partition_bytes} B, credit ${t.credit_bytes} B`
                : "off");
  fillList("warnings", s.warnings, "none");
  set("straggler", s.straggler ? "slowest rank: " + s.straggler.text : "");
  rows("ranks", s.workers, w => [[w.rank], [w.host, "l"], [w.pid], [w.state, "l"],
       [w.step === undefined ? "-" : w.step], [num(w.step_ms, 1)], [num(w.compute_ms, 1)],
       [num(w.wait_ms, 1)], [num(w.MBps, 1)], [w.bytes_step === undefined ? "-" : w.bytes_step],
       [num(w.round_ms, 2)], [typeof w.push_ms === "number" && w.push_ms >= 0 ?
       w.push_ms.toFixed(2) : "-"], [w.last || "-", "l"]],
       w => w.state !== "running" ? "gone" : (w.stuck ? "stuck" : (w.stalled ? "stalled" : "")),
       "rank");
  const dash = v => (v === undefined || v === null) ? "-" : v;
  rows("servers", s.servers, v => [[v.index], [v.host, "l"], [v.address, "l"],
       [v.state, "l"], [dash(v.keys)], [num(v.MBps, 2)], [dash(v.rounds)], [dash(v.open)],
       [dash(v.queue)], [num(v.round_ms, 2)], [dash(v.replica), "l"]],
       v => v.state.startsWith("running") ? "" : "gone", "index");
  plot("plot_step", s.series, 0); plot("plot_mbps", s.series, 1);
  const doc = document.getElementById("doctor"); doc.replaceChildren();
  if (!s.doctor.length) doc.textContent = "no stall reported";
  for (const d of s.doctor.slice().reverse()) {
    doc.appendChild(el("p", d.text));
    const lines = [];
    for (const [name, frames] of d.stacks) {
      lines.push("thread " + name + ":");
      for (const [f, ln, fn] of frames.slice().reverse()) lines.push(`  ${f}:${ln} in ${fn}()`);
    }
    if (lines.length) doc.appendChild(el("pre", lines.join("\n")));
  }
  const tr = s.workers.filter(w => w.trace).map(w => `rank ${w.rank}: ${w.trace} ` +
    (w.trace_written ? "(written)" : "(written at the end of its window or at shutdown)"));
  if (tr.length) fillList("traces", tr, "");
  fillList("events", s.events.slice().reverse().map(
    ([t, txt]) => new Date(t * 1000).toLocaleTimeString() + "  " + txt), "");
}
function connect() {
  fetch("api/status" + q).then(r => r.json()).then(render).catch(() => {});
  const es = new EventSource("api/events" + q);
  es.onopen = () => { set("conn", "live"); document.getElementById("conn").className = "ok"; };
  es.onmessage = m => { try { render(JSON.parse(m.data)); } catch (e) {} };
  es.onerror = () => { set("conn", "disconnected: retrying");
                       document.getElementById("conn").className = "bad"; };
}
connect();
</script></body></html>
"""
