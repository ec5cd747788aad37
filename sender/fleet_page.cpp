// The fleet page (GET /): one HTML document, its style and script inline, nothing fetched but
// /fleet.json, every 5 s. Every value from the database goes in as text (textContent, attribute
// values): a device's error is written by the outside and is never read as markup.
#include "fleet.hpp"

namespace magic_sync::sender {

const char* const kFleetPage = R"html(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>magic_sync fleet</title>
<style>
  :root { --failing: #c62828; --lacking: #ef6c00; --repairing: #8e24aa; --catching: #1565c0;
          --waiting: #9e7b00; --insync: #2e7d32; --forgotten: #757575; }
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #222; background: #f6f7f9; }
  header { background: #263238; color: #fff; padding: 10px 20px; display: flex;
           align-items: baseline; gap: 20px; }
  header h1 { font-size: 18px; margin: 0; }
  header #updated { opacity: 0.8; }
  main { padding: 12px 20px; display: grid; gap: 16px; }
  section { background: #fff; border: 1px solid #dde1e6; border-radius: 6px; padding: 10px 14px; }
  h2 { font-size: 15px; margin: 0 0 8px 0; }
  #error { background: #ffebee; color: var(--failing); border-color: var(--failing); }
  #states { display: flex; flex-wrap: wrap; gap: 10px; }
  .tile { border-radius: 6px; padding: 8px 14px; min-width: 110px; color: #fff; }
  .tile .count { font-size: 24px; font-weight: 600; display: block; }
  .tile.zero { opacity: 0.35; }
  .state-failing { --c: var(--failing); } .state-lacking-rows { --c: var(--lacking); }
  .state-repairing { --c: var(--repairing); } .state-catching-up { --c: var(--catching); }
  .state-waiting-for-its-report { --c: var(--waiting); } .state-in-sync { --c: var(--insync); }
  .state-forgotten { --c: var(--forgotten); }
  .tile { background: var(--c, #555); }
  td.state { color: var(--c, #222); font-weight: 600; white-space: nowrap; }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #eceff1;
           vertical-align: top; }
  th { font-weight: 600; color: #546e7a; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
  td.replica { font-family: ui-monospace, monospace; font-size: 12px; white-space: nowrap; }
  td.error { color: var(--failing); word-break: break-word; }
  td.detail { color: #455a64; }
  .level-WARNING { color: var(--failing); font-weight: 600; }
  .level-LOG { color: #546e7a; font-weight: 600; }
  .none { color: #78909c; }
  #chart svg { width: 100%; height: 140px; display: block; }
  #relay span { margin-right: 18px; }
</style>
</head>
<body>
<header><h1>magic_sync fleet</h1><span id="updated">loading…</span></header>
<main>
  <section id="error" hidden></section>
  <section><h2>Devices by state</h2><div id="states"></div></section>
  <section><h2>Backlog over the last hour (messages unsent)</h2><div id="chart"></div></section>
  <section><h2>Slowest devices</h2><div id="slowest"></div></section>
  <section><h2>Alarms</h2><div id="alarms"></div><div id="relay"></div></section>
  <section><h2>Set aside</h2><div id="set-aside"></div></section>
</main>
<script>
"use strict";
const slug = (state) => "state-" + String(state).replace(/[^a-z]+/g, "-");

// An element with text: never markup.
function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}
function fill(id, ...children) {
  const node = document.getElementById(id);
  node.replaceChildren(...children);
}
function seconds(value) {
  if (value === null || value === undefined) return "";
  const s = Number(value);
  if (s < 90) return s.toFixed(1) + " s";
  if (s < 5400) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
function table(headers, rows) {
  const t = el("table");
  const head = el("tr");
  for (const h of headers) head.append(el("th", h));
  t.append(head);
  for (const r of rows) t.append(r);
  return t;
}

function drawStates(fleet) {
  const tiles = [];
  for (const s of fleet.states) {
    const tile = el("div", null, "tile " + slug(s.state) + (s.replicas === 0 ? " zero" : ""));
    tile.dataset.state = s.state;
    tile.append(el("span", s.replicas, "count"), el("span", s.state, "label"));
    tiles.push(tile);
  }
  fill("states", ...tiles);
}

function drawSlowest(fleet) {
  if (fleet.slowest.length === 0) { fill("slowest", el("p", "No live devices.", "none")); return; }
  const rows = fleet.slowest.map((d) => {
    const tr = el("tr", null, slug(d.state));
    tr.dataset.replica = d.replica;
    tr.append(el("td", d.replica, "replica"), el("td", d.state, "state " + slug(d.state)),
              el("td", seconds(d.lag_seconds), "num lag"), el("td", d.outbox, "num"),
              el("td", seconds(d.backoff_seconds), "num"),
              el("td", d.last_error || "", "error"), el("td", d.state_detail, "detail"));
    return tr;
  });
  fill("slowest", table(["device", "state", "lag", "unsent", "next try in", "last error",
                         "what it means"], rows));
}

function drawAlarms(fleet) {
  const list = fleet.alarms.map((a) => {
    const item = el("li");
    item.append(el("span", a.level, "level-" + (a.level === "WARNING" ? "WARNING" : "LOG")),
                document.createTextNode(" " + a.line));
    return item;
  });
  if (list.length === 0) fill("alarms", el("p", "None: nothing needs anyone.", "none"));
  else { const ul = el("ul"); ul.append(...list); fill("alarms", ul); }
  const r = fleet.relay;
  fill("relay", el("span", r.running ? "relay running" : "relay NOT running"),
       el("span", "last pass " + (r.last_pass_seconds === null ? "never" :
                                  seconds(r.last_pass_seconds) + " ago")),
       el("span", "changes waiting to be planned " + r.notes_backlog),
       el("span", r.horizon_seconds === null ? "no transaction holds the horizon back" :
                  "the horizon held back " + seconds(r.horizon_seconds)));
}

function drawSetAside(fleet) {
  const sa = fleet.set_aside;
  if (sa.items === 0) { fill("set-aside", el("p", "Nothing is set aside.", "none")); return; }
  const kinds = sa.kinds.map((k) => {
    const tr = el("tr");
    tr.append(el("td", k.kind), el("td", k.items, "num"), el("td", k.first_reason),
              el("td", k.fix, "detail"));
    return tr;
  });
  const latest = sa.latest.map((s) => {
    const tr = el("tr");
    tr.append(el("td", s.id, "num"), el("td", s.kind), el("td", s.replica || "", "replica"),
              el("td", s.table || ""), el("td", s.reason, "error"), el("td", s.tries, "num"),
              el("td", s.fix, "detail"));
    return tr;
  });
  fill("set-aside", el("p", sa.items + " items set aside, by kind:"),
       table(["kind", "items", "first reason", "fix"], kinds),
       el("p", "The latest:"),
       table(["id", "kind", "device", "table", "reason", "tries", "fix"], latest));
}

function drawBacklog(backlog, now) {
  const NS = "http://www.w3.org/2000/svg";
  const W = 1000, H = 140, L = 50, B = 20;
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", "0 0 " + W + " " + H);
  svg.setAttribute("preserveAspectRatio", "none");
  const line = (x1, y1, x2, y2, color) => {
    const l = document.createElementNS(NS, "line");
    for (const [k, v] of [["x1", x1], ["y1", y1], ["x2", x2], ["y2", y2]]) l.setAttribute(k, v);
    l.setAttribute("stroke", color);
    svg.append(l);
  };
  const text = (x, y, value, anchor) => {
    const t = document.createElementNS(NS, "text");
    t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("font-size", "12");
    t.setAttribute("fill", "#546e7a"); t.setAttribute("text-anchor", anchor || "start");
    t.textContent = String(value);
    svg.append(t);
  };
  const samples = backlog.samples;
  const top = Math.max(1, ...samples.map((s) => s[1]));
  const x = (t) => L + (W - L - 5) * (1 - Math.min(backlog.span, Math.max(0, now - t)) / backlog.span);
  const y = (n) => 5 + (H - B - 10) * (1 - n / top);
  line(L, y(0), W - 5, y(0), "#b0bec5");
  line(L, y(top), W - 5, y(top), "#eceff1");
  text(L - 6, y(top) + 4, top, "end");
  text(L - 6, y(0) + 4, 0, "end");
  text(L, H - 4, "1 h ago");
  text(W - 5, H - 4, "now", "end");
  if (samples.length > 0) {
    const path = document.createElementNS(NS, "polyline");
    path.setAttribute("points", samples.map((s) => x(s[0]) + "," + y(s[1])).join(" "));
    path.setAttribute("fill", "none");
    path.setAttribute("stroke", "#1565c0");
    path.setAttribute("stroke-width", "2");
    svg.append(path);
    const last = samples[samples.length - 1];
    const dot = document.createElementNS(NS, "circle");
    dot.setAttribute("cx", x(last[0])); dot.setAttribute("cy", y(last[1]));
    dot.setAttribute("r", "3"); dot.setAttribute("fill", "#1565c0");
    svg.append(dot);
    text(x(last[0]) - 6, y(last[1]) < 24 ? y(last[1]) + 16 : y(last[1]) - 6, last[1] + " unsent",
         "end");
  }
  fill("chart", svg);
}

function draw(data) {
  const error = document.getElementById("error");
  error.hidden = data.error === null;
  error.textContent = data.error === null ? "" :
      "The database could not be read: " + data.error;
  drawBacklog(data.backlog, data.read_at);
  if (data.fleet !== null) {
    drawStates(data.fleet);
    drawSlowest(data.fleet);
    drawAlarms(data.fleet);
    drawSetAside(data.fleet);
  }
  document.getElementById("updated").textContent =
      (data.fleet === null ? "not read" : data.fleet.replicas + " devices") + ", read at " +
      new Date(data.read_at * 1000).toLocaleTimeString();
}

async function refresh() {
  try {
    const answer = await fetch("fleet.json", { cache: "no-store" });
    if (!answer.ok) throw new Error("the sender answered " + answer.status);
    draw(await answer.json());
  } catch (e) {
    const error = document.getElementById("error");
    error.hidden = false;
    error.textContent = "The sender could not be read: " + e.message;
  }
  setTimeout(refresh, 5000);
}
refresh();
</script>
</body>
</html>
)html";

}  // namespace magic_sync::sender
