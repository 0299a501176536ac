// The sparseps status page: polls /api/status and redraws (no library, works offline).
"use strict";

const REFRESH_MS = 1000;

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
}

function drawRoles(roles) {
  const body = document.querySelector("#roles tbody");
  body.textContent = "";
  for (const r of roles) {
    const tr = document.createElement("tr");
    const state = r.alive ? "running" : "exited " + r.exit_code;
    tr.className = r.alive ? "alive" : (r.exit_code === 0 ? "exited" : "failed");
    tr.dataset.role = r.role + "-" + r.rank;
    cell(tr, r.role);
    cell(tr, String(r.rank));
    cell(tr, state, "state");
    cell(tr, String(r.pid));
    cell(tr, String(r.attempt));
    cell(tr, r.last_line, "log");
    body.appendChild(tr);
  }
}

function drawPlot(svg, points) {
  const NS = "http://www.w3.org/2000/svg";
  svg.textContent = "";
  svg.dataset.points = String(points.length);
  if (points.length === 0) {
    const t = document.createElementNS(NS, "text");
    t.setAttribute("x", "10"); t.setAttribute("y", "80");
    t.textContent = "no data yet";
    svg.appendChild(t);
    return;
  }
  const W = 400, H = 160, P = 24;
  const xs = points.map(p => p[0]), ys = points.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs);
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (y1 === y0) { const d = 0.05 * (Math.abs(y0) || 1); y0 -= d; y1 += d; }
  const sx = x => P + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (W - 2 * P);
  const sy = y => H - P - (y - y0) / (y1 - y0) * (H - 2 * P);
  const line = document.createElementNS(NS, "polyline");
  line.setAttribute("points", points.map(p => sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1)).join(" "));
  svg.appendChild(line);
  for (const [y, label] of [[y1, y1], [y0, y0]]) {
    const t = document.createElementNS(NS, "text");
    t.setAttribute("x", "2"); t.setAttribute("y", String(sy(y) + 3));
    t.textContent = Number(label).toPrecision(4);
    svg.appendChild(t);
  }
}

function drawTables(tables) {
  const body = document.querySelector("#tables tbody");
  body.textContent = "";
  for (const server of Object.keys(tables).sort()) {
    for (const [name, t] of Object.entries(tables[server])) {
      const tr = document.createElement("tr");
      tr.dataset.server = server;
      cell(tr, server); cell(tr, name); cell(tr, String(t.rows)); cell(tr, String(t.bytes));
      body.appendChild(tr);
    }
  }
}

function drawHeter(heter) {
  const body = document.querySelector("#heter tbody");
  body.textContent = "";
  const num = (v, digits) => (v === null || v === undefined) ? "-" : Number(v).toFixed(digits);
  for (const rank of Object.keys(heter || {}).sort()) {
    const h = heter[rank];
    const tr = document.createElement("tr");
    tr.dataset.heter = rank;
    cell(tr, rank); cell(tr, num(h.utilisation, 3));
    cell(tr, num(h.mean_batch_rows, 1)); cell(tr, num(h.mean_batch_requests, 2));
    body.appendChild(tr);
  }
}

async function refresh() {
  try {
    const reply = await fetch("/api/status", {cache: "no-store"});
    const s = await reply.json();
    document.getElementById("job-id").textContent = s.job_id;
    document.getElementById("updated").textContent = "updated " + new Date(s.time * 1000).toLocaleTimeString();
    drawRoles(s.roles);
    drawPlot(document.getElementById("plot-samples"), s.series.map(p => [p.t, p.samples_per_s]));
    drawPlot(document.getElementById("plot-auc"), s.series.filter(p => p.train !== undefined).map(p => [p.t, p.train]));
    drawTables(s.tables);
    drawHeter(s.heter_workers);
    if (s.online && s.online.pass_seq !== undefined) {
      document.getElementById("online").textContent = "running pass seq " + s.online.pass_seq;
    }
    document.body.dataset.loaded = "1";
  } catch (e) {
    document.getElementById("updated").textContent = "status unavailable: " + e;
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
