// The prefix-router dashboard: polls /dashboard/data every second and draws it. Text goes in through
// textContent only; charts are SVG drawn here. No library, nothing fetched from anywhere else.
"use strict";

const POLL_MS = 1000;
const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function pct(x) { return x === null || x === undefined ? "–" : (100 * x).toFixed(1) + " %"; }
function ms(x) { return x === null || x === undefined ? "–" : x.toFixed(1) + " ms"; }
function num(x) { return x === null || x === undefined ? "–" : String(x); }

function cell(row, text, cls) {
  const td = el("td", cls ? { class: cls } : {}, text);
  row.appendChild(td);
  return td;
}

function replaceRows(tbody, rows) {
  const fragment = document.createDocumentFragment();
  rows.forEach((r) => fragment.appendChild(r));
  tbody.replaceChildren(fragment);
}

function drawWorkers(doc) {
  const rows = doc.workers.map((w) => {
    const tr = el("tr", { "data-worker": w.name, class: "health-" + w.health + (w.draining ? " draining" : "") });
    const name = el("td");
    name.appendChild(el("span", { class: "dot" }));
    name.appendChild(document.createTextNode(w.name));
    tr.appendChild(name);
    cell(tr, w.draining ? w.health + ", draining" : w.health, "health");
    cell(tr, num(w.in_flight), "num");
    cell(tr, num(w.queue), "num");
    cell(tr, pct(w.kv_usage), "num");
    cell(tr, num(w.indexed_tokens), "num");
    cell(tr, pct(w.hit_predicted), "num");
    cell(tr, pct(w.hit_reported), "num");
    cell(tr, w.precise ? w.precise.state : "–");
    cell(tr, w.precise ? ms(w.precise.lag_ms) : "–", "num");
    return tr;
  });
  replaceRows(document.querySelector("#workers tbody"), rows);
  document.getElementById("workers-count").textContent = "(" + doc.workers.length + ")";
}

function candidates(list) {
  return list.map((c) => c.worker + " " + ms(c.ttft_ms) + " (wait " + ms(c.wait_ms) + ", prefill " +
    ms(c.prefill_ms) + ", decode " + ms(c.decode_ms) + "; adds " + ms(c.added_ms) + ", cache " +
    ms(c.cache_ms) + ")").join(" · ");
}

function drawFeed(doc) {
  const rows = doc.decisions.slice().reverse().map((d) => {
    const tr = el("tr", { "data-seq": d.seq });
    cell(tr, d.seq, "num");
    cell(tr, d.t.toFixed(2), "num");
    cell(tr, d.worker, "worker");
    cell(tr, d.branch);
    cell(tr, d.tenant || "–");
    cell(tr, d.prefix || "–");
    cell(tr, num(d.predicted_tokens) + " / " + num(d.prompt_tokens), "num");
    cell(tr, num(d.cached_tokens), "num");
    cell(tr, ms(d.predicted_ttft_ms), "num");
    cell(tr, ms(d.observed_ttft_ms), "num");
    cell(tr, d.candidates.length ? candidates(d.candidates) : "–", "cands");
    return tr;
  });
  replaceRows(document.querySelector("#feed tbody"), rows);
}

function drawPrefixes(doc) {
  const top = Math.max(1, ...doc.prefixes.flatMap((p) => p.holders.map((h) => h.tokens)));
  const rows = doc.prefixes.map((p) => {
    const tr = el("tr", { "data-prefix": p.prefix, "data-tenant": p.tenant || "" });
    cell(tr, p.prefix);
    cell(tr, p.tenant || "–");
    cell(tr, p.requests, "num");
    cell(tr, p.holders.length ? p.holders[0].worker : "nowhere", "main-holder");
    const held = el("td");
    p.holders.forEach((h) => {
      const span = el("span", { class: "holder", "data-worker": h.worker });
      const bar = el("span", { class: "bar" });
      bar.style.width = Math.max(2, Math.round(80 * h.tokens / top)) + "px";
      span.appendChild(bar);
      span.appendChild(document.createTextNode(h.worker + " " + h.tokens));
      held.appendChild(span);
    });
    tr.appendChild(held);
    return tr;
  });
  replaceRows(document.querySelector("#prefixes tbody"), rows);
  const moves = doc.moves.slice().reverse().map((m) =>
    el("li", { "data-prefix": m.prefix }, "t=" + m.t.toFixed(1) + "s " + m.prefix +
      (m.tenant ? " (" + m.tenant + ")" : "") + ": " + m.from + " → " + m.to));
  replaceRows(document.getElementById("moves"), moves);
}

function drawReplication(doc) {
  const dl = document.getElementById("replication");
  if (!doc.replication) {
    dl.replaceChildren(el("dt", {}, "off"), el("dd", {}, "this router does not replicate its index"));
    return;
  }
  const items = [];
  for (const [k, v] of Object.entries(doc.replication)) {
    items.push(el("dt", {}, k), el("dd", {}, num(v)));
  }
  dl.replaceChildren(...items);
}

function chart(id, points, lines, scale) {
  const svg = document.getElementById(id);
  const W = 600, H = 160, pad = 4;
  const ts = points.map((p) => p.t);
  const t0 = Math.min(...ts), t1 = Math.max(t0 + 1, ...ts);
  const values = points.flatMap((p) => lines.map((l) => p[l.key])).filter((v) => v !== null && v !== undefined);
  const top = scale || Math.max(1e-9, ...values) * 1.1;
  const nodes = [el2("line", { x1: 0, y1: H - pad, x2: W, y2: H - pad, class: "axis" })];
  const label = el2("text", { x: 4, y: 12 });
  label.textContent = scale ? "100 %" : top.toFixed(1);
  nodes.push(label);
  for (const line of lines) {
    const xy = points.filter((p) => p[line.key] !== null && p[line.key] !== undefined).map((p) =>
      ((p.t - t0) / (t1 - t0) * (W - 2 * pad) + pad).toFixed(1) + "," +
      (H - pad - (p[line.key] / top) * (H - 2 * pad)).toFixed(1));
    nodes.push(el2("polyline", { points: xy.join(" "), class: line.cls, "data-points": xy.length }));
  }
  svg.replaceChildren(...nodes);
}

function el2(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function draw(doc) {
  document.getElementById("badge").hidden = !doc.simulated;
  document.getElementById("summary").textContent = "policy " + doc.policy + " · " + doc.decisions_total +
    " decisions · t=" + doc.t.toFixed(1) + " s";
  drawWorkers(doc);
  chart("chart-hit", doc.series, [{ key: "hit_predicted", cls: "pred" }, { key: "hit_reported", cls: "obs" }], 1);
  chart("chart-ttft", doc.series, [{ key: "ttft_ms", cls: "obs" }, { key: "predicted_ttft_ms", cls: "pred" }]);
  drawFeed(doc);
  drawPrefixes(doc);
  drawReplication(doc);
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const response = await fetch("/dashboard/data", { credentials: "same-origin", cache: "no-store" });
    if (response.status === 401) {
      window.location.assign("/dashboard");
      return;
    }
    if (!response.ok) throw new Error("HTTP " + response.status);
    draw(await response.json());
    status.textContent = "updated " + new Date().toLocaleTimeString();
    status.className = "";
  } catch (err) {
    status.textContent = "not updating (" + err.message + ")";
    status.className = "stale";
  }
  setTimeout(poll, POLL_MS);
}

document.addEventListener("DOMContentLoaded", poll);
