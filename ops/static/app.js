// crr status page: loads the snapshot once over REST, then applies server-sent events in place.
"use strict";
(() => {
  const FAILING = new Set(["failed", "timeout", "bad_output", "crashed", "quarantined",
                           "silent", "rejecting"]);
  const status = window.crrStatus = {
    loadId: Math.random().toString(36).slice(2), // unchanged unless the page reloads
    connected: false, loaded: false, updates: 0, liveness: null,
    cell(host, resource) {  // what a test (or a curious operator) sees in one cell
      const td = document.querySelector(
        `#hosts tr[data-host="${CSS.escape(host)}"] td[data-resource="${CSS.escape(resource)}"]`);
      return td ? { text: td.textContent, state: td.dataset.state } : null;
    },
  };
  let resources = {};      // name -> ResourceSpec
  const hosts = new Map(); // host -> HostSnapshot
  let cluster = null;

  const $ = (sel) => document.querySelector(sel);
  const el = (tag, text, cls) => {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  };
  const hostResources = () => Object.keys(resources).filter((r) => resources[r].scope !== "cluster").sort();
  const clusterResources = () => Object.keys(resources).filter((r) => resources[r].scope === "cluster").sort();

  function show(v) {
    if (v === null || v === undefined) return "null";
    if (Array.isArray(v)) return v.length ? v.join(",") : "{}";
    if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(1);
    return String(v);
  }
  function valueCell(entry) {
    if (!entry) return { text: "-", state: "absent" };
    if (entry.state === "unknown") return { text: "?", state: "unknown" };
    if (entry.state === "stale") return { text: "~" + show(entry.last_value), state: "stale" };
    return { text: show(entry.value), state: "fresh" };
  }
  function log(text) {
    const li = el("li", `${new Date().toLocaleTimeString()} ${text}`);
    const ol = $("#log");
    ol.prepend(li);
    while (ol.children.length > 200) ol.lastChild.remove();
  }

  function renderHead() {
    const tr = $("#hosts thead tr");
    tr.replaceChildren(el("th", "host"), ...hostResources().map((r) => el("th", r)),
                       el("th", "inventory"), el("th", "reporters"));
  }
  function renderRow(snap) {
    let tr = document.querySelector(`#hosts tr[data-host="${CSS.escape(snap.host)}"]`);
    if (!tr) {
      tr = el("tr");
      tr.dataset.host = snap.host;
      const rows = [...$("#hosts tbody").children];
      const after = rows.find((r) => r.dataset.host > snap.host);
      $("#hosts tbody").insertBefore(tr, after || null);
    }
    const cells = [el("th", snap.host)];
    for (const r of hostResources()) {
      const c = valueCell(snap.values[r]);
      const td = el("td", c.text, c.state);
      td.dataset.resource = r;
      td.dataset.state = c.state;
      cells.push(td);
    }
    const inv = Object.entries(snap.inventory || {}).map(
      ([rep, e]) => `${rep}: ${e.devices.length} device(s)${e.state === "stale" ? " ~stale" : ""}`);
    cells.push(el("td", inv.join("; ") || "-"));
    const reps = Object.entries(snap.reporters || {});
    const bad = reps.filter(([, s]) => FAILING.has(s.state));
    cells.push(el("td", bad.length ? bad.map(([n, s]) => `${n}: ${s.state}`).join("; ")
                                  : `${reps.length} ok`, bad.length ? "failing" : ""));
    tr.replaceChildren(...cells);
  }
  function renderCluster() {
    const tbody = $("#cluster tbody");
    tbody.replaceChildren(...clusterResources().map((r) => {
      const c = valueCell(cluster && cluster.values[r]);
      const td = el("td", c.text, c.state);
      td.dataset.resource = r;
      td.dataset.state = c.state;
      const tr = el("tr");
      tr.append(el("th", r), td);
      return tr;
    }));
  }
  function renderFailures() {
    const rows = [];
    const add = (host, reps) => {
      for (const [name, s] of Object.entries(reps || {})) {
        if (!FAILING.has(s.state)) continue;
        const tr = el("tr", undefined, "failing");
        tr.append(el("td", name), el("td", host), el("td", s.state), el("td", s.since || "-"),
                  el("td", s.detail || (s.rejections || []).join("; ") || ""));
        rows.push(tr);
      }
    };
    for (const [host, snap] of [...hosts.entries()].sort()) add(host, snap.reporters);
    if (cluster) add("(cluster)", cluster.reporters);
    $("#failures tbody").replaceChildren(...rows);
    $("#no-failures").hidden = rows.length > 0;
  }
  function renderAll() {
    renderHead();
    $("#hosts tbody").replaceChildren();
    for (const h of [...hosts.keys()].sort()) renderRow(hosts.get(h));
    renderCluster();
    renderFailures();
  }

  function applyHost(snap) {
    if (snap.removed) {
      hosts.delete(snap.host);
      const tr = document.querySelector(`#hosts tr[data-host="${CSS.escape(snap.host)}"]`);
      if (tr) tr.remove();
      log(`${snap.host} removed`);
    } else {
      const old = hosts.get(snap.host);
      for (const r of hostResources()) {
        const a = valueCell(old && old.values[r]), b = valueCell(snap.values[r]);
        if (a.text !== b.text || a.state !== b.state) {
          log(`${snap.host} ${r}: ${a.text} → ${b.text} (${b.state})`);
        }
      }
      hosts.set(snap.host, snap);
      renderRow(snap);
    }
    renderFailures();
  }

  async function getJSON(path, optional) {
    const r = await fetch(path, { headers: { Accept: "application/json" } });
    if (optional && r.status === 404) return null;
    if (!r.ok) throw new Error(`${path}: ${r.status}`);
    return r.json();
  }
  async function load() {
    const [res, list, cl] = await Promise.all([
      getJSON("/v1/resources"), getJSON("/v1/hosts"), getJSON("/v1/cluster", true)]);
    resources = res;
    hosts.clear();
    for (const h of list) hosts.set(h.host, h);
    cluster = cl;
    renderAll();
    status.loaded = true;
  }

  function connect() {
    const es = new EventSource("/v1/events");
    const conn = $("#conn");
    es.addEventListener("hello", async () => {
      // (Re)connected: catch up with anything missed while away, then follow live.
      try { await load(); } catch (e) { log(`reload failed: ${e.message}`); }
      status.connected = true;
      conn.textContent = "live";
      conn.className = "conn up";
    });
    es.addEventListener("host", (e) => { status.updates++; applyHost(JSON.parse(e.data)); });
    es.addEventListener("cluster", (e) => {
      status.updates++;
      cluster = JSON.parse(e.data);
      renderCluster();
      renderFailures();
    });
    es.addEventListener("catalog", (e) => {
      status.updates++;
      resources = JSON.parse(e.data);
      renderAll();
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
    // The projector's liveness, as the server derives it (projections/freshness.py): shown
    // as is; while it is not live nobody rewrites expired values, so the table is reloaded
    // from /v1/hosts, which serves every value as it is now.
    es.addEventListener("liveness", async (e) => {
      const live = JSON.parse(e.data);
      status.liveness = live;
      const span = $("#liveness");
      span.textContent = `projector ${live.detail}`;
      span.className = `liveness ${live.state}`;
      if (live.state !== "live" && status.loaded) {
        try { await load(); } catch (err) { log(`reload failed: ${err.message}`); }
      }
    });
    es.onerror = () => {
      status.connected = false;
      conn.textContent = "reconnecting…";
      conn.className = "conn down";
    };
  }
  connect();
})();
