// crr status page: plain SVG charts (no library, nothing fetched): a host's timeline and
// the reporter latency chart.
"use strict";
window.crrCharts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const svg = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const STATE_FILL = { fresh: "#cfe9d6", stale: "url(#stale-hatch)", unknown: "#e4e4e4",
                       ok: "#cfe9d6", not_applicable: "#e4e4e4", stopped: "#e4e4e4",
                       restarting: "#fff1c2" };
  const FAILING_FILL = "#f7c4cb";
  const short = (v) => {
    if (v === null || v === undefined) return "null";
    if (Array.isArray(v)) return v.length ? v.join(",") : "{}";
    if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(1);
    return String(v);
  };
  function defs() {
    const d = svg("defs");
    const p = svg("pattern", { id: "stale-hatch", width: 8, height: 8,
                               patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" });
    p.append(svg("rect", { width: 8, height: 8, fill: "#fff3cd" }),
             svg("line", { x1: 0, y1: 0, x2: 0, y2: 8, stroke: "#d9a400", "stroke-width": 3 }));
    d.append(p);
    return d;
  }
  function timeTicks(g, x, t0, t1, y, height) {
    const span = t1 - t0;
    const steps = [60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
    const step = steps.find((s) => span / s <= 8) || 86400;
    for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
      const px = x(t);
      g.append(svg("line", { x1: px, x2: px, y1: 0, y2: y + height, stroke: "#eee" }));
      const d = new Date(t * 1000);  // the page's one format: ISO, UTC (Z)
      g.append(svg("text", { x: px, y: y + height + 12, "text-anchor": "middle",
                             class: "tick" }, d.toISOString().slice(11, 16) + "Z"));
    }
  }

  // A host's timeline: one lane per value (numeric values also as a step line), one per
  // reporter; stale spans are hatched.
  function timeline(data) {
    const W = 960, LABEL = 130, LANE = 26, NUM = 54, GAP = 6;
    const t0 = data.since, t1 = data.until;
    const x = (t) => LABEL + ((t - t0) / (t1 - t0)) * (W - LABEL - 10);
    const lanes = [];
    for (const v of data.values) {
      const numeric = v.spans.some((s) => typeof s.value === "number");
      lanes.push({ kind: "value", name: v.resource, spans: v.spans, numeric,
                   height: numeric ? NUM : LANE });
    }
    for (const r of data.reporters) {
      lanes.push({ kind: "reporter", name: `reporter ${r.reporter}`, spans: r.spans,
                   height: LANE });
    }
    let y = 4;
    const height = lanes.reduce((h, l) => h + l.height + GAP, 0) + 4;
    const root = svg("svg", { width: W, height: height + 20, viewBox: `0 0 ${W} ${height + 20}`,
                              class: "timeline", role: "img",
                              "aria-label": `timeline of ${data.host}` });
    root.append(defs());
    const grid = svg("g");
    root.append(grid);
    timeTicks(grid, x, t0, t1, 0, height);
    for (const lane of lanes) {
      const g = svg("g", { class: `lane ${lane.kind}`, "data-name": lane.name });
      g.append(svg("text", { x: 4, y: y + lane.height / 2 + 4, class: "lane-label" }, lane.name));
      const nums = lane.spans.filter((s) => typeof s.value === "number").map((s) => s.value);
      const lo = Math.min(...nums), hi = Math.max(...nums);
      const yv = (v) => y + lane.height - 4 - (hi === lo ? 0.5 : (v - lo) / (hi - lo))
        * (lane.height - 14);
      let path = "";
      for (const s of lane.spans) {
        const a = x(Math.max(s.start, t0)), b = x(Math.min(s.end, t1));
        const failing = lane.kind === "reporter" && !(s.state in STATE_FILL);
        const rect = svg("rect", { x: a, y, width: Math.max(1, b - a), height: lane.height,
                                   fill: failing ? FAILING_FILL : STATE_FILL[s.state] || "#eee",
                                   class: `span ${s.state}`, "data-state": s.state });
        rect.append(svg("title", {}, `${lane.name}: ${s.state} ${short(s.value)}\n` +
          `${new Date(s.start * 1000).toISOString()} – ${new Date(s.end * 1000).toISOString()}`));
        g.append(rect);
        if (lane.numeric && typeof s.value === "number") {
          path += `${path ? "L" : "M"}${a},${yv(s.value)}L${b},${yv(s.value)}`;
        } else if (b - a > 40) {
          const label = lane.kind === "reporter" ? s.state : short(s.value);
          g.append(svg("text", { x: a + 4, y: y + lane.height / 2 + 4, class: "span-label" },
                       label.length > (b - a) / 7 ? label.slice(0, Math.floor((b - a) / 7)) + "…"
                         : label));
        }
      }
      if (path) {
        g.append(svg("path", { d: path, fill: "none", stroke: "#1f5fa8", "stroke-width": 1.5 }));
        g.append(svg("text", { x: W - 12, y: y + 10, "text-anchor": "end", class: "tick" },
                     `${short(lo)} – ${short(hi)}`));
      }
      root.append(g);
      y += lane.height + GAP;
    }
    if (!lanes.length) {
      root.append(svg("text", { x: LABEL, y: 20 }, "no events of this host in the window"));
    }
    return root;
  }

  // Latency: per reporter, one row per leg with p50 / p95 / p99 bars (milliseconds).
  function latency(rows) {
    const LEGS = [["observed_to_stored", "observed → stored"],
                  ["stored_to_snapshot", "stored → snapshot"],
                  ["observed_to_snapshot", "observed → snapshot"]];
    const W = 960, LABEL = 260, ROW = 22, HEAD = 24;
    let max = 0;
    for (const r of rows) for (const [k] of LEGS) max = Math.max(max, r[k].p99 || 0);
    max = max > 0 ? max * 1000 : 1;
    const x = (ms) => LABEL + (Math.max(0, ms) / max) * (W - LABEL - 150);
    const height = HEAD + rows.length * (LEGS.length * ROW + 12) + 8;
    const root = svg("svg", { width: W, height, viewBox: `0 0 ${W} ${height}`,
                              class: "latency", role: "img", "aria-label": "reporter latency" });
    const legend = [["p99", "#bcd3ee"], ["p95", "#7aa6dc"], ["p50", "#1f5fa8"]];
    legend.forEach(([name, color], i) => {
      root.append(svg("rect", { x: LABEL + i * 70, y: 4, width: 12, height: 12, fill: color }),
                  svg("text", { x: LABEL + i * 70 + 16, y: 14, class: "tick" }, name));
    });
    root.append(svg("text", { x: W - 10, y: 14, "text-anchor": "end", class: "tick" },
                    `0 – ${max.toFixed(1)} ms`));
    let y = HEAD;
    for (const r of rows) {
      root.append(svg("text", { x: 4, y: y + 14, class: "lane-label" },
                      `${r.reporter} (${r.reports})`));
      for (const [k, label] of LEGS) {
        const p = r[k];
        const g = svg("g", { class: "bar", "data-reporter": r.reporter, "data-leg": k });
        g.append(svg("text", { x: 120, y: y + 14, class: "tick" }, label));
        if (p.n) {
          for (const [q, color] of [["p99", "#bcd3ee"], ["p95", "#7aa6dc"], ["p50", "#1f5fa8"]]) {
            const w = Math.max(1, x(p[q] * 1000) - LABEL);
            const rect = svg("rect", { x: LABEL, y: y + 3, width: w, height: ROW - 6,
                                       fill: color, "data-q": q });
            rect.append(svg("title", {}, `${r.reporter} ${label} ${q}: ${(p[q] * 1000).toFixed(1)} ms (n=${p.n})`));
            g.append(rect);
          }
          if (p.max !== null && p.max !== undefined) {  // the slowest sample: a tick
            const mx = Math.min(x(p.max * 1000), W - 150);
            g.append(svg("line", { x1: mx, x2: mx, y1: y + 2, y2: y + ROW - 2, stroke: "#b00020",
                                   "stroke-width": 2, "data-q": "max" },
                         undefined));
          }
          g.append(svg("text", { x: x(p.p99 * 1000) + 4, y: y + 14, class: "tick" },
                       `${(p.p50 * 1000).toFixed(1)} / ${(p.p95 * 1000).toFixed(1)} / ${(p.p99 * 1000).toFixed(1)}` +
                       (p.max !== null && p.max !== undefined ? ` (max ${(p.max * 1000).toFixed(1)})` : "")));
        } else {
          g.append(svg("text", { x: LABEL, y: y + 14, class: "tick" }, "no samples"));
        }
        root.append(g);
        y += ROW;
      }
      y += 12;
    }
    return root;
  }
  return { timeline, latency, short };
})();
