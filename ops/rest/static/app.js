// crr status page. The server filters, sorts and pages the hosts (/v1/host-table); the page
// renders only the rows in view and refreshes them when server-sent events say something
// changed. Views (by the URL's hash): #/ hosts, #/host/<name> one host, #/latency.
"use strict";
(() => {
  const FAILING = new Set(["failed", "timeout", "bad_output", "crashed", "quarantined",
                           "silent", "rejecting"]);
  const ROW = 26;              // px per table row (fixed: the scroller computes offsets)
  const OVERSCAN = 20;         // rows fetched above and below the visible ones
  const MAX_EXPR = 8192;       // the server's limit (projections/select/compiled.py)
  const REFRESH_MS = 400;      // at most one table refresh per this, however many events
  const TIMEOUT_MS = 20000;

  const status = window.crrStatus = {
    loadId: Math.random().toString(36).slice(2), // unchanged unless the page reloads
    connected: false, loaded: false, updates: 0, liveness: null, judgement: null, view: "hosts",
    total: null, refreshes: 0, selectError: null, timeline: null, latency: null, host: null,
    cell(host, resource) {  // what a test (or a curious operator) sees in one cell
      const td = document.querySelector(
        `#hosts tr[data-host="${CSS.escape(host)}"] td[data-resource="${CSS.escape(resource)}"]`);
      return td ? { text: td.textContent, state: td.dataset.state } : null;
    },
    rows() { return [...document.querySelectorAll("#hosts tbody tr[data-host]")].map((t) => t.dataset.host); },
  };
  const $ = (sel) => document.querySelector(sel);
  const el = (tag, text, cls) => {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  };
  const show = window.crrCharts.short;
  function valueCell(entry) {
    if (!entry) return { text: "-", state: "absent" };
    if (entry.state === "unknown") return { text: "?", state: "unknown" };
    if (entry.state === "stale") return { text: "~" + show(entry.last_value), state: "stale" };
    return { text: show(entry.value), state: "fresh" };
  }
  function age(iso, now) {
    if (!iso) return "-";
    const s = Math.max(0, now - Date.parse(iso) / 1000);
    return s < 90 ? `${s.toFixed(1)} s` : s < 5400 ? `${(s / 60).toFixed(1)} min`
      : `${(s / 3600).toFixed(1)} h`;
  }
  // A cell linking to a host's page (the name percent-encoded), or "(cluster)" for null.
  function hostCell(host, tag = "td") {
    const cell = el(tag);
    if (host === null) {
      cell.textContent = "(cluster)";
      return cell;
    }
    const a = el("a", host);
    a.href = `#/host/${encodeURIComponent(host)}`;
    cell.append(a);
    return cell;
  }
  function log(text) {
    const ol = $("#log");
    ol.prepend(el("li", `${new Date().toLocaleTimeString()} ${text}`));
    while (ol.children.length > 200) ol.lastChild.remove();
  }
  function pageError(text) {
    const p = $("#page-error");
    p.hidden = !text;
    p.textContent = text || "";
  }

  // GET a JSON document; a problem detail (4xx/5xx) becomes an Error with .problem.
  async function getJSON(path, params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params || {})) {
      if (v !== null && v !== undefined && v !== "") q.set(k, v);
    }
    const url = q.toString() ? `${path}?${q}` : path;
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), TIMEOUT_MS);
    let r;
    try {
      r = await fetch(url, { headers: { Accept: "application/json" }, signal: ctl.signal });
    } catch (e) {
      throw new Error(e.name === "AbortError" ? `${path}: no answer in ${TIMEOUT_MS / 1000} s`
        : `${path}: cannot reach the server (${e.message})`);
    } finally {
      clearTimeout(timer);
    }
    let body = null;
    try { body = await r.json(); } catch (e) { body = null; }
    if (!r.ok) {
      const err = new Error((body && (body.detail || body.title)) || `${path}: HTTP ${r.status}`);
      err.problem = body || { status: r.status };
      err.status = r.status;
      throw err;
    }
    return body;
  }

  // -- the health summary ------------------------------------------------------------
  function counts(obj, order) {
    const keys = Object.keys(obj || {}).sort((a, b) =>
      (order.indexOf(a) + 1 || 99) - (order.indexOf(b) + 1 || 99) || a.localeCompare(b));
    const span = el("span");
    for (const k of keys) {
      span.append(el("span", `${obj[k]} ${k}`, `count ${k} ${FAILING.has(k) ? "failing" : ""}`), " ");
    }
    if (!keys.length) span.append("none");
    return span;
  }
  // While the projector's watermark lags, values are judged at it (the server's
  // judged_at, never the browser's clock): a banner says so.
  function showJudgement(j) {
    const banner = $("#holding");
    if (!j || !j.detail) { banner.hidden = true; return; }
    banner.hidden = false;
    banner.className = j.expired ? "holding expired" : "holding";
    banner.textContent = j.holding
      ? `crr is holding values at the projector's watermark — ${j.detail}`
      : `values are expiring again — ${j.detail}`;
  }
  async function loadSummary() {
    const s = await getJSON("/v1/summary");
    status.summary = s;
    showJudgement(s.judgement);
    $("#sum-hosts").textContent = s.hosts;
    $("#sum-status").replaceChildren(counts(s.host_status, ["failing", "stale", "unknown", "ok", "empty"]));
    $("#sum-values").replaceChildren(counts(s.values, ["fresh", "stale", "unknown"]));
    $("#sum-reporters").replaceChildren(counts(s.reporters, ["ok"]));
    const live = s.liveness;
    $("#sum-projector").replaceChildren(
      el("span", live.state, `liveness ${live.state}`),
      ` lag ${live.lag ?? "-"}, events seq ${s.projector_position}`);
  }

  // -- the host table (virtual: only rows in view are in the DOM) --------------------
  const table = { resources: [], rows: new Map(), order: [], offset: 0, sort: "host",
                  inflight: false, again: false, timer: null, last: 0 };
  function query() {
    const expr = $("#select").value;
    return { match: $("#match").value.trim(), status: $("#status-filter").value,
             reporter_state: $("#reporter-filter").value, sort: table.sort,
             select: expr.trim() ? expr : "" };
  }
  function renderHead() {
    const tr = el("tr");
    const cols = ["host", "status", ...table.resources];
    for (const c of cols) {
      const mark = table.sort === c ? " ▲" : table.sort === `-${c}` ? " ▼" : "";
      const th = el("th", c + mark, "sortable");
      th.dataset.column = c;
      th.title = `sort by ${c}`;
      th.onclick = () => {
        table.sort = table.sort === c ? `-${c}` : c;
        scheduleRefresh(0);
      };
      tr.append(th);
    }
    tr.append(el("th", "inventory"), el("th", "reporters"));
    $("#hosts thead").replaceChildren(tr);
  }
  function renderRow(row) {
    const snap = row.snapshot;
    const tr = el("tr");
    tr.dataset.host = row.host;
    const th = hostCell(row.host, "th");
    tr.append(th, el("td", row.status, `status ${row.status}`));
    for (const r of table.resources) {
      const c = valueCell(snap.values[r]);
      const td = el("td", c.text, c.state);
      td.dataset.resource = r;
      td.dataset.state = c.state;
      td.title = c.text;
      tr.append(td);
    }
    const inv = Object.entries(snap.inventory || {}).map(
      ([rep, e]) => `${rep}: ${e.devices.length} device(s)${e.state === "stale" ? " ~stale" : ""}`);
    tr.append(el("td", inv.join("; ") || "-"));
    const reps = Object.entries(snap.reporters || {});
    const bad = reps.filter(([, s]) => FAILING.has(s.state));
    tr.append(el("td", bad.length ? bad.map(([n, s]) => `${n}: ${s.state}`).join("; ")
                                  : `${reps.length} ok`, bad.length ? "failing" : ""));
    return tr;
  }
  function renderBody() {
    const tbody = $("#hosts tbody");
    const total = status.total || 0;
    const first = table.offset, rows = table.order;
    const spacer = (n) => {
      const tr = el("tr", undefined, "spacer"), td = el("td");
      td.colSpan = table.resources.length + 4;
      td.style.height = `${n * ROW}px`;
      tr.append(td);
      return tr;
    };
    const below = Math.max(0, total - first - rows.length);
    tbody.replaceChildren(...(first ? [spacer(first)] : []), ...rows.map(renderRow),
                          ...(below ? [spacer(below)] : []));
    $("#count").textContent = `${total} of ${status.hostsTotal ?? "?"} hosts`;
  }
  function logChanges(old, snap) {
    for (const r of table.resources) {
      const a = valueCell(old && old.values[r]), b = valueCell(snap.values[r]);
      if (a.text !== b.text || a.state !== b.state) {
        log(`${snap.host} ${r}: ${a.text} → ${b.text} (${b.state})`);
      }
    }
  }
  async function refresh() {
    if (table.inflight) { table.again = true; return; }
    table.inflight = true;
    table.last = Date.now();
    const scroller = $("#table-scroll");
    const visible = Math.ceil(scroller.clientHeight / ROW) + 1;
    const first = Math.max(0, Math.floor(scroller.scrollTop / ROW) - OVERSCAN);
    const q = query();
    try {
      if (q.select.length > MAX_EXPR) {
        throw Object.assign(new Error(`expression too long: ${q.select.length} characters (at most ${MAX_EXPR})`),
                            { problem: { column: null } });
      }
      const page = await getJSON("/v1/host-table", { ...q, offset: first,
                                                     limit: visible + 2 * OVERSCAN });
      status.selectError = null;
      $("#select-error").hidden = true;
      $("#table-scroll").classList.remove("invalid");
      const note = $("#select-note");
      note.hidden = !page.note;
      note.textContent = page.note || "";
      if (page.resources.join() !== table.resources.join()) {
        table.resources = page.resources;
      }
      const fresh = new Map(page.rows.map((r) => [r.host, r]));
      for (const [h, r] of fresh) {
        const old = table.rows.get(h);
        if (old) logChanges(old.snapshot, r.snapshot);
      }
      table.rows = fresh;
      table.order = page.rows;
      table.offset = page.offset;
      status.total = page.total;
      status.hostsTotal = page.hosts_total;
      status.expression = page.expression;
      renderHead();
      renderBody();
      status.loaded = true;
      status.refreshes++;
      pageError(null);
    } catch (e) {
      if (e.problem && (e.status === 400 || e.problem.column !== undefined) && q.select) {
        status.selectError = { text: e.message, column: e.problem.column ?? null };
        const pre = $("#select-error");
        pre.hidden = false;
        pre.textContent = e.message;  // the message, the expression and a caret under the token
        $("#table-scroll").classList.add("invalid");  // still the last valid expression's hosts
      } else {
        pageError(`host table: ${e.message}`);
      }
    } finally {
      table.inflight = false;
      if (table.again) { table.again = false; scheduleRefresh(REFRESH_MS); }
    }
  }
  function scheduleRefresh(ms) {
    if (table.timer) return;
    const wait = ms === 0 ? 0 : Math.max(0, REFRESH_MS - (Date.now() - table.last));
    table.timer = setTimeout(() => { table.timer = null; refresh(); }, wait);
  }
  let typing = null;
  for (const id of ["#select", "#match"]) {
    $(id).addEventListener("input", () => {
      clearTimeout(typing);
      typing = setTimeout(() => { $("#table-scroll").scrollTop = 0; scheduleRefresh(0); }, 200);
    });
  }
  for (const id of ["#status-filter", "#reporter-filter"]) {
    $(id).addEventListener("change", () => { $("#table-scroll").scrollTop = 0; scheduleRefresh(0); });
  }
  let scrolling = false;
  $("#table-scroll").addEventListener("scroll", () => {
    if (scrolling) return;
    scrolling = true;
    requestAnimationFrame(() => { scrolling = false; scheduleRefresh(0); });
  });

  // -- cluster values and failing reporters (small: all of them) ----------------------
  let cluster = null;
  function renderCluster() {
    const tbody = $("#cluster tbody");
    const names = Object.keys((cluster && cluster.values) || {}).sort();
    tbody.replaceChildren(...names.map((r) => {
      const c = valueCell(cluster.values[r]);
      const td = el("td", c.text, c.state);
      td.dataset.resource = r;
      td.dataset.state = c.state;
      const tr = el("tr");
      tr.append(el("th", r), td);
      return tr;
    }));
  }
  async function loadFailures() {
    const rows = await getJSON("/v1/reporters", { failing: "true" });
    const trs = rows.slice(0, 500).map((s) => {
      const tr = el("tr", undefined, "failing");
      const host = hostCell(s.host);
      tr.append(el("td", s.reporter), host, el("td", s.state), el("td", s.since || "-"),
                el("td", s.detail || (s.rejections || []).join("; ") || ""));
      return tr;
    });
    $("#failures tbody").replaceChildren(...trs);
    $("#no-failures").hidden = trs.length > 0;
  }
  async function loadCluster() {
    try { cluster = await getJSON("/v1/cluster"); } catch (e) { if (e.status !== 404) throw e; }
    renderCluster();
  }

  // -- a host's page -------------------------------------------------------------------
  async function loadHost(name) {
    status.host = name;
    status.timeline = null;
    $("#host-name").textContent = name;
    const err = $("#host-error");
    err.hidden = true;
    const now = Date.now() / 1000;
    let snap;
    try {
      snap = await getJSON(`/v1/hosts/${encodeURIComponent(name)}`);
    } catch (e) {
      err.hidden = false;
      err.textContent = e.status === 404 ? `no host named ${JSON.stringify(name)} in the snapshot`
        : e.message;
      $("#host-values tbody").replaceChildren();
      $("#host-reporters tbody").replaceChildren();
      $("#timeline").replaceChildren();
      $("#happenings").replaceChildren();
      $("#explain").hidden = true;
      return;
    }
    const values = Object.keys(snap.values).sort().map((r) => {
      const e = snap.values[r], c = valueCell(e);
      const tr = el("tr");
      tr.dataset.resource = r;
      tr.append(el("th", r), el("td", c.text, c.state), el("td", e.state, e.state),
                el("td", age(e.received_at, now)), el("td", e.reporter), el("td", e.expires_at));
      return tr;
    });
    $("#host-values tbody").replaceChildren(...values);
    const expr = $("#select").value.trim();
    $("#explain").hidden = !expr;
    if (expr) {
      $("#explain-expr").textContent = expr;
      try {
        const r = await getJSON("/v1/explain", { expr, host: name });
        $("#explain-text").textContent = r.text;
      } catch (e) {
        $("#explain-text").textContent = e.message;
      }
    }
    await loadTimeline(name, snap, now);
  }
  async function loadTimeline(name, snap, now) {
    const note = $("#timeline-note");
    note.hidden = true;
    let data;
    try {
      data = await getJSON(`/v1/hosts/${encodeURIComponent(name)}/timeline`,
                           { window: $("#window").value });
    } catch (e) {
      note.hidden = false;
      note.textContent = `timeline: ${e.message}`;
      note.className = "error";
      $("#timeline").replaceChildren();
      status.timeline = { error: e.message };
      return;
    }
    if (data.history_from) {
      note.hidden = false;
      note.className = "note";
      note.textContent = `history before ${new Date(data.history_from * 1000).toISOString()} has aged out of CRR_EVENTS`;
    }
    $("#timeline").replaceChildren(window.crrCharts.timeline(data));
    const restarts = Object.fromEntries(data.reporters.map((r) => [r.reporter, r.restarts]));
    const reps = Object.keys(snap.reporters).sort().map((n) => {
      const s = snap.reporters[n];
      const tr = el("tr", undefined, FAILING.has(s.state) ? "failing" : "");
      tr.append(el("th", n), el("td", s.state), el("td", s.since || "-"),
                el("td", s.last_report_at ? age(s.last_report_at, now) + " ago" : "-"),
                el("td", s.detail || (s.rejections || []).join("; ") || ""),
                el("td", s.exit_code ?? ""), el("td", String(s.rejected)),
                el("td", String(restarts[n] ?? 0)));
      return tr;
    });
    $("#host-reporters tbody").replaceChildren(...reps);
    const items = data.happenings.map((h) => el("li",
      `${h.time} seq ${h.seq} ${h.reporter || ""} ${h.what}: ${h.detail}`, h.what));
    $("#happenings").replaceChildren(...(items.length ? items : [el("li", "none")]));
    status.timeline = data;
  }
  $("#window").addEventListener("change", () => { if (status.host) loadHost(status.host); });

  // -- reporter latency ---------------------------------------------------------------
  async function loadLatency() {
    const err = $("#latency-error");
    err.hidden = true;
    let data;
    try {
      data = await getJSON("/v1/latency", { since: $("#latency-window").value });
    } catch (e) {
      err.hidden = false;
      err.textContent = `latency: ${e.message}`;
      status.latency = { error: e.message };
      return;
    }
    const chart = $("#latency-chart");
    chart.replaceChildren(data.reporters.length ? window.crrCharts.latency(data.reporters)
      : el("p", `no reports stored in the last ${$("#latency-window").value}`));
    if (data.left_out) {
      err.hidden = false;
      err.textContent = `only the first ${data.reporters.reduce((n, r) => n + r.reports, 0)} reports of the window were timed (${data.left_out} more left out): choose a shorter window`;
    }
    const ms = (v) => `${(v * 1000).toFixed(1)} ms`;
    $("#slowest tbody").replaceChildren(...data.slowest.map((s) => {
      const tr = el("tr");
      const host = hostCell(s.host);
      const trace = el("td");
      if (s.trace_id && data.trace_url) {
        const a = el("a", s.trace_id.slice(0, 12) + "…");
        a.href = data.trace_url.replace("{trace_id}", s.trace_id);
        a.target = "_blank";
        a.rel = "noopener";
        trace.append(a);
      } else trace.textContent = s.trace_id || "not traced";
      tr.append(host, el("td", s.reporter), el("td", String(s.seq)),
                el("td", ms(s.observed_to_stored)), el("td", ms(s.stored_to_snapshot)),
                el("td", ms(s.observed_to_snapshot)), trace);
      return tr;
    }));
    status.latency = data;
  }
  $("#latency-window").addEventListener("change", loadLatency);

  // -- routing ------------------------------------------------------------------------
  function route() {
    const h = location.hash || "#/";
    let view = "hosts";
    if (h.startsWith("#/host/")) view = "host";
    else if (h === "#/latency") view = "latency";
    status.view = view;
    for (const v of ["hosts", "host", "latency"]) $(`#view-${v}`).hidden = v !== view;
    if (view === "host") {
      let name;
      try { name = decodeURIComponent(h.slice("#/host/".length)); } catch (e) {
        $("#host-error").hidden = false;
        $("#host-error").textContent = "the host name in the URL is not valid percent-encoding";
        return;
      }
      loadHost(name);
    } else if (view === "latency") {
      loadLatency();
    } else {
      scheduleRefresh(0);
    }
  }
  window.addEventListener("hashchange", route);

  // -- live updates -------------------------------------------------------------------
  let summaryTimer = null;
  function scheduleSummary() {
    if (summaryTimer) return;
    summaryTimer = setTimeout(async () => {
      summaryTimer = null;
      try { await loadSummary(); await loadFailures(); } catch (e) { pageError(e.message); }
    }, 1000);
  }
  async function catchUp() {
    try {
      await Promise.all([loadSummary(), loadCluster(), loadFailures()]);
      if (status.view === "hosts") await refresh();
    } catch (e) { pageError(`reload failed: ${e.message}`); }
  }
  function connect() {
    const es = new EventSource("/v1/events");
    const conn = $("#conn");
    es.addEventListener("hello", async () => {
      // (Re)connected: catch up with anything missed while away, then follow live.
      await catchUp();
      status.connected = true;
      conn.textContent = "live";
      conn.className = "conn up";
    });
    es.addEventListener("host", (e) => {
      status.updates++;
      const snap = JSON.parse(e.data);
      const shown = table.rows.get(snap.host);
      if (shown && !snap.removed && status.view === "hosts") {
        // Shown now: update the row at once; the refresh re-checks filters and order.
        logChanges(shown.snapshot, snap);
        shown.snapshot = snap;
        const tr = document.querySelector(`#hosts tr[data-host="${CSS.escape(snap.host)}"]`);
        if (tr) tr.replaceWith(renderRow(shown));
      }
      if (status.view === "hosts") scheduleRefresh();
      scheduleSummary();
    });
    es.addEventListener("cluster", (e) => {
      status.updates++;
      cluster = JSON.parse(e.data);
      renderCluster();
      scheduleSummary();
    });
    es.addEventListener("catalog", () => {
      status.updates++;
      scheduleRefresh(0);
      scheduleSummary();
    });
    const projectors = {};  // partition (or "-") -> its status, of the newest layout
    es.addEventListener("projector", (e) => {
      const p = JSON.parse(e.data);
      const n = p.partitions ?? null;
      for (const k of Object.keys(projectors)) {
        if ((projectors[k].partitions ?? null) !== n) delete projectors[k];
      }
      projectors[p.partition ?? "-"] = p;
      if (n === null) {
        $("#projector").textContent = `projector seq ${p.last_seq}, lag ${p.lag}`;
        return;
      }
      const all = Object.values(projectors);
      const covered = Math.min(...all.map((q) => q.covered_seq || 0));
      const lag = all.reduce((sum, q) => sum + q.lag, 0);
      $("#projector").textContent =
        `${all.length}/${n} partitions, covered to seq ${covered}, lag ${lag}`;
    });
    // The projector's liveness, as the server derives it: shown as is; while it is not
    // live nobody rewrites expired values, so the table is re-read (served as at now).
    es.addEventListener("liveness", (e) => {
      const live = JSON.parse(e.data);
      status.liveness = live;
      const span = $("#liveness");
      span.textContent = `projector ${live.detail}`;
      span.className = `liveness ${live.state}`;
      if (live.state !== "live" && status.loaded) {
        scheduleRefresh();
        scheduleSummary();
      }
    });
    es.addEventListener("judgement", (e) => {
      const j = JSON.parse(e.data);
      const was = status.judgement;
      status.judgement = j;
      showJudgement(j);
      if (status.loaded && was && (was.holding !== j.holding || was.expired !== j.expired)) {
        scheduleRefresh();
        scheduleSummary();
      }
    });
    es.onerror = () => {
      status.connected = false;
      conn.textContent = "reconnecting…";
      conn.className = "conn down";
    };
  }
  route();
  connect();
})();
