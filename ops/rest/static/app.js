// crr status page. One paint, one fetch: /v1/page answers the host table's page (the server
// filters, sorts and pages), the summary, the failing reporters, the cluster values, what
// the bridges apply and the page's defaults, all judged at one server time (`at`); the
// page never judges freshness or failure itself, nor reads the browser's clock for it.
// Server-sent events only say that something changed: the page fetches again.
// Times: relative to the server's `at`, the ISO time (UTC, with its Z) on hover; or ISO.
// Views (by the URL's hash): #/ hosts, #/host/<name> one host, #/latency.
"use strict";
(() => {
  const ROW = 26;              // px per table row (fixed: the scroller computes offsets)
  const OVERSCAN = 20;         // rows fetched above and below the visible ones
  const MAX_EXPR = 8192;       // the server's limit (projections/select/compiled.py)
  const REFRESH_MS = 400;      // at most one table refresh per this, however many events
  const { getJSON, TIMEOUT_MS } = window.crrFetch;  // fetch.js

  const status = window.crrStatus = {
    loadId: Math.random().toString(36).slice(2), // unchanged unless the page reloads
    connected: false, loaded: false, updates: 0, liveness: null, view: "hosts", paints: 0,
    page: null,  // the last /v1/page answer painted
    judgement: null,  // the server's: judged_at, holding (the banner)
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
  const { valueCell, iso, when } = window.crrFormat;  // the page's one format (format.js)
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
  function log(at, text) {
    const ol = $("#log");
    const li = el("li");
    const t = el("time", iso(at));  // the server's time of the answer that showed it
    t.dateTime = t.title = iso(at);
    li.append(t, ` ${text}`);
    ol.prepend(li);
    while (ol.children.length > 200) ol.lastChild.remove();
  }
  function pageError(text) {
    const p = $("#page-error");
    p.hidden = !text;
    p.textContent = text || "";
  }

  // -- the health summary ------------------------------------------------------------
  function counts(obj, order) {
    const keys = Object.keys(obj || {}).sort((a, b) =>
      (order.indexOf(a) + 1 || 99) - (order.indexOf(b) + 1 || 99) || a.localeCompare(b));
    const span = el("span");
    for (const k of keys) {
      span.append(el("span", `${obj[k]} ${k}`, `count ${k} ${FAILING_STATES.has(k) ? "failing" : ""}`), " ");
    }
    if (!keys.length) span.append("none");
    return span;
  }
  // While the projector's watermark lags, values are judged at it (the server's
  // judged_at, never the browser's clock): a banner says so.
  function showJudgement(j) {
    const banner = $("#banner");
    if (!j || !j.detail) { banner.hidden = true; return; }
    banner.hidden = false;
    banner.className = j.expired ? "banner expired" : "banner";
    banner.textContent = j.holding
      ? `crr is holding values at the projector's watermark — ${j.detail}`
      : `values are expiring again — ${j.detail}`;
  }
  function paintSummary(s) {
    status.summary = s;
    showJudgement(s.judgement);
    $("#sum-hosts").textContent = s.hosts;
    $("#sum-status").replaceChildren(counts(s.host_status, ["failing", "stale", "unknown", "ok", "empty"]));
    $("#sum-values").replaceChildren(counts(s.values, ["fresh", "stale", "unknown"]));
    $("#sum-reporters").replaceChildren(counts(s.reporters, ["ok"]));
    const failing = $("#sum-failing");
    failing.textContent = `${s.failing_reporters} failing`;
    failing.className = s.failing_reporters ? "count failing" : "count";
    const live = s.liveness;
    $("#sum-projector").replaceChildren(
      el("span", live.state, `liveness ${live.state}`),
      ` lag ${live.lag ?? "-"}, events seq ${s.projector_position}`);
    // The header says the same, from the same answer.
    status.liveness = live;
    const span = $("#liveness");
    span.textContent = `projector ${live.detail}`;
    span.className = `liveness ${live.state}`;
  }
  function paintProjectors(all) {
    const n = all.length ? all[0].partitions ?? null : null;
    if (!all.length) {
      $("#projector").textContent = "";
    } else if (n === null) {
      $("#projector").textContent = `projector seq ${all[0].last_seq}, lag ${all[0].lag}`;
    } else {
      const covered = Math.min(...all.map((q) => q.covered_seq || 0));
      const lag = all.reduce((sum, q) => sum + q.lag, 0);
      $("#projector").textContent =
        `${all.length}/${n} partitions, covered to seq ${covered}, lag ${lag}`;
    }
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
    const bridges = el("th", "bridges apply");
    bridges.title = display.exports ? "features of the catalog's exports: that hold, and the drain rule that holds"
      : display.exports_error ? `exports: do not compile: ${display.exports_error}` : "the catalog has no exports:";
    tr.append(el("th", "inventory"), el("th", "reporters"), bridges);
    $("#hosts thead").replaceChildren(tr);
  }
  let marks = {}, display = { example: null, precision: {}, exports: false, failing_states: [] };
  let painted;  // resolves at the first paint (a host's page needs the catalog's defaults)
  const firstPaint = new Promise((resolve) => { painted = resolve; });
  let FAILING_STATES = new Set();  // the server's (a failing row also has `missing`)
  function reportersCell(mark) {
    const reps = (mark && mark.reporters) || [];
    const bad = reps.filter((m) => m.failing);
    if (bad.length) {
      return el("td", bad.map((m) => `${m.reporter}: ${m.state}` +
        (m.missing.length ? ` (missing ${m.missing.join(", ")})` : "")).join("; "), "reporters failing");
    }
    const by = {};
    for (const m of reps) by[m.state] = (by[m.state] || 0) + 1;
    const text = Object.keys(by).sort().map((k) => `${by[k]} ${k}`).join(", ");
    return el("td", text || "-", "reporters");
  }
  function bridgesCell(mark) {
    const td = el("td", undefined, "bridges");
    const b = mark && mark.bridges;
    if (!b) { td.textContent = "-"; return td; }
    if (b.drain !== null) td.append(el("span", `drain: ${b.drain}`, "drain failing"), " ");
    td.append(b.features.length ? b.features.join(", ") : (b.drain === null ? "no feature" : ""));
    td.title = td.textContent;
    return td;
  }
  function renderRow(row) {
    const snap = row.snapshot;
    const tr = el("tr");
    tr.dataset.host = row.host;
    const th = hostCell(row.host, "th");
    tr.append(th, el("td", row.status, `status ${row.status}`));
    for (const r of table.resources) {
      const c = valueCell(snap.values[r], r);
      const td = el("td", c.text, c.state);
      td.dataset.resource = r;
      td.dataset.state = c.state;
      td.title = c.text;
      tr.append(td);
    }
    const inv = Object.entries(snap.inventory || {}).map(
      ([rep, e]) => `${rep}: ${e.devices.length} device(s)${e.state === "stale" ? " ~stale" : ""}`);
    tr.append(el("td", inv.join("; ") || "-"));
    tr.append(reportersCell(marks[row.host]), bridgesCell(marks[row.host]));
    return tr;
  }
  function renderBody() {
    const tbody = $("#hosts tbody");
    const total = status.total || 0;
    const first = table.offset, rows = table.order;
    const spacer = (n) => {
      const tr = el("tr", undefined, "spacer"), td = el("td");
      td.colSpan = table.resources.length + 5;
      td.style.height = `${n * ROW}px`;
      tr.append(td);
      return tr;
    };
    const below = Math.max(0, total - first - rows.length);
    tbody.replaceChildren(...(first ? [spacer(first)] : []), ...rows.map(renderRow),
                          ...(below ? [spacer(below)] : []));
    $("#count").textContent = `${total} of ${status.hostsTotal ?? "?"} hosts`;
  }
  // Only what the page would show differently is a change (jitter below a resource's
  // display precision is not).
  function logChanges(at, old, snap) {
    for (const r of table.resources) {
      const a = valueCell(old && old.values[r], r), b = valueCell(snap.values[r], r);
      if (a.text !== b.text || a.state !== b.state) {
        log(at, `${snap.host} ${r}: ${a.text} → ${b.text} (${b.state})`);
      }
    }
  }
  function paintWhole(whole) {
    const page = whole.table;
    display = whole.display;
    window.crrFormat.setPrecision(display.precision);
    FAILING_STATES = new Set(display.failing_states);
    marks = whole.marks;
    $("#select").placeholder = display.example
      ? `${display.example}  — or a whole -R string: select[…] rusage[…]`
      : "no host-scope resource in the catalog yet";
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
      if (old) logChanges(whole.at, old.snapshot, r.snapshot);
    }
    table.rows = fresh;
    table.order = page.rows;
    table.offset = page.offset;
    status.total = page.total;
    status.hostsTotal = page.hosts_total;
    status.expression = page.expression;
    renderHead();
    renderBody();
    paintSummary(whole.summary);
    paintProjectors(whole.projectors);
    cluster = whole.cluster;
    renderCluster();
    paintFailures(whole);
    paintConn();
    status.page = whole;
    status.at = whole.at;
    status.loaded = true;
    status.refreshes++;
    status.paints++;
    painted();
    pageError(null);
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
      const whole = await getJSON("/v1/page", { ...q, offset: first,
                                                limit: visible + 2 * OVERSCAN });
      paintWhole(whole);
    } catch (e) {
      if (e.problem && (e.status === 400 || e.problem.column !== undefined) && q.select) {
        try {  // one answer for the last valid expression still paints the whole page
          paintWhole(await getJSON("/v1/page", { ...q, select: status.expression || "",
                                                 offset: first, limit: visible + 2 * OVERSCAN }));
        } catch (again) { pageError(`host table: ${again.message}`); }
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
      const c = valueCell(cluster.values[r], r);
      const td = el("td", c.text, c.state);
      td.dataset.resource = r;
      td.dataset.state = c.state;
      const tr = el("tr");
      tr.append(el("th", r), td);
      return tr;
    }));
  }
  function paintFailures(whole) {
    const trs = whole.failures.map((s) => {
      const tr = el("tr", undefined, "failing");
      tr.dataset.reporter = s.reporter;
      tr.dataset.host = s.host ?? "";
      const host = hostCell(s.host);
      const why = s.detail || (s.rejections || []).join("; ") ||
        (s.missing.length ? `missing ${s.missing.join(", ")}` : "");
      tr.append(el("td", s.reporter), host, el("td", s.state), when(s.since, whole.at),
                el("td", why));
      return tr;
    });
    $("#failures tbody").replaceChildren(...trs);
    const none = $("#no-failures");
    none.hidden = false;
    none.textContent = whole.failures_total > trs.length
      ? `${trs.length} of ${whole.failures_total} shown`
      : trs.length ? `${trs.length} failing` : "none";
    // A bridge whose guard holds changes (Health `held`, a failing row): a banner with
    // its numbers, as the server says them.
    const held = whole.failures.filter((s) => s.state === "held" && s.reporter.startsWith("bridge-"));
    const banner = $("#bridge-banner");
    banner.replaceChildren(...held.map((s) => el("div", `${s.reporter} is held: ${s.detail || ""}`)));
    banner.hidden = held.length === 0;
  }

  // -- a host's page -------------------------------------------------------------------
  async function loadHost(name) {
    status.host = name;
    status.timeline = null;
    $("#host-name").textContent = name;
    const err = $("#host-error");
    err.hidden = true;
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
    // Ages are relative to the server's time of this answer (the timeline's `until`).
    let data = null;
    try {
      data = await getJSON(`/v1/hosts/${encodeURIComponent(name)}/timeline`,
                           { window: $("#window").value });
    } catch (e) { data = { error: e }; }
    const now = data.error ? status.at : data.until;
    const values = Object.keys(snap.values).sort().map((r) => {
      const e = snap.values[r], c = valueCell(e, r);
      const tr = el("tr");
      tr.dataset.resource = r;
      tr.append(el("th", r), el("td", c.text, c.state), el("td", e.state, e.state),
                when(e.received_at, now), el("td", e.reporter), when(e.expires_at, now));
      return tr;
    });
    $("#host-values tbody").replaceChildren(...values);
    // The explain default is the catalog's own example (never another catalog's names).
    await Promise.race([firstPaint, new Promise((resolve) => setTimeout(resolve, TIMEOUT_MS))]);
    const expr = $("#select").value.trim() || display.example || "";
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
    paintTimeline(snap, data, now);
  }
  function paintTimeline(snap, data, now) {
    const note = $("#timeline-note");
    note.hidden = true;
    if (data.error) {
      const e = data.error;
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
      note.textContent = `history before ${iso(data.history_from)} has aged out of CRR_EVENTS`;
    }
    $("#timeline").replaceChildren(window.crrCharts.timeline(data));
    const restarts = Object.fromEntries(data.reporters.map((r) => [r.reporter, r.restarts]));
    const reps = Object.keys(snap.reporters).sort().map((n) => {
      const s = snap.reporters[n];
      const failing = FAILING_STATES.has(s.state) || (s.missing || []).length > 0;
      const tr = el("tr", undefined, failing ? "failing" : "");
      tr.append(el("th", n), el("td", s.state), when(s.since, now), when(s.last_report_at, now),
                el("td", s.detail || (s.rejections || []).join("; ") || ""),
                el("td", s.exit_code ?? ""), el("td", String(s.rejected)),
                el("td", String(restarts[n] ?? 0)));
      return tr;
    });
    $("#host-reporters tbody").replaceChildren(...reps);
    const items = data.happenings.map((h) => el("li",
      `${iso(h.time)} seq ${h.seq} ${h.reporter || ""} ${h.what}: ${h.detail}`, h.what));
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
    const ms = (v) => v === null || v === undefined ? "-" : `${(v * 1000).toFixed(1)} ms`;
    // The chart's numbers, as a table (the same answer, the same rounding).
    const LEGS = [["observed_to_stored", "observed → stored"],
                  ["stored_to_snapshot", "stored → snapshot"],
                  ["observed_to_snapshot", "observed → snapshot"]];
    $("#latency-figures tbody").replaceChildren(...data.reporters.flatMap((r) => LEGS.map(([k, label]) => {
      const p = r[k], tr = el("tr");
      tr.dataset.reporter = r.reporter;
      tr.dataset.leg = k;
      tr.append(el("th", r.reporter), el("td", label), el("td", String(p.n)), el("td", ms(p.p50)),
                el("td", ms(p.p95)), el("td", ms(p.p99)), el("td", ms(p.max)));
      return tr;
    })));
    const covered = data.reporters.reduce((n, r) => n + r.observed_to_snapshot.n, 0);
    const all = data.reporters.reduce((n, r) => n + r.reports, 0);
    $("#slowest-note").textContent = `by observed → snapshot, of the ${covered} of ${all} reports ` +
      "with a snapshot sample (the chart's observed → snapshot leg: the first row is its max); " +
      "CRR_SNAPSHOT keeps one record per host, so only a host's newest report has one";
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
    }
    scheduleRefresh(0);
  }
  window.addEventListener("hashchange", route);

  // -- live updates -------------------------------------------------------------------
  // Whether the event stream is open, painted with each answer (never before the first:
  // the header shows "loading…" until one paint has the whole picture).
  let streamOpen = false;
  function paintConn() {
    const conn = $("#conn");
    conn.textContent = streamOpen ? "live" : "reconnecting…";
    conn.className = streamOpen ? "conn up" : "conn down";
    $("#liveness").classList.toggle("dated", !streamOpen);
  }
  function connect() {
    const es = new EventSource("/v1/events");
    es.addEventListener("hello", async () => {
      // (Re)connected: catch up with anything missed while away, then follow live.
      streamOpen = true;
      await refresh();
      status.connected = true;
    });
    // Every event only says something changed: one fetch repaints everything together.
    for (const kind of ["host", "cluster", "catalog"]) {
      es.addEventListener(kind, () => {
        status.updates++;
        scheduleRefresh(kind === "catalog" ? 0 : undefined);
      });
    }
    // The projector's liveness changes, as the server derives it: repaint (while it is not
    // live nobody rewrites expired values, so the table is re-read, served as at now).
    es.addEventListener("liveness", (e) => {
      const live = JSON.parse(e.data);
      const shown = status.liveness;
      if (!shown || shown.state !== live.state || live.state !== "live") scheduleRefresh();
    });
    es.addEventListener("judgement", (e) => {
      const j = JSON.parse(e.data);
      const was = status.judgement;
      status.judgement = j;
      showJudgement(j);
      if (was && (was.holding !== j.holding || was.expired !== j.expired)) scheduleRefresh();
    });
    es.addEventListener("projector", () => scheduleRefresh());
    es.onerror = () => {
      status.connected = false;
      streamOpen = false;
      if (status.loaded) paintConn();
    };
  }
  route();
  connect();
})();
