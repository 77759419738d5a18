// crr status page: how values and times are written, everywhere on the page.
// Values: numbers at their resource's display precision (the catalog's `precision:`, sent
// by the server), so a change below it is not a change. Times: ISO 8601 in UTC with its
// zone, or relative to the server's time (never the browser's clock) with the ISO on hover.
"use strict";
window.crrFormat = (() => {
  let precision = {};
  function show(v, resource) {
    const p = precision[resource];
    if (typeof v === "number" && p !== undefined) return String(Number(v.toFixed(p)));
    return window.crrCharts.short(v);
  }
  function valueCell(entry, resource) {
    if (!entry) return { text: "-", state: "absent" };
    if (entry.state === "unknown") return { text: "?", state: "unknown" };
    if (entry.state === "stale") return { text: "~" + show(entry.last_value, resource), state: "stale" };
    return { text: show(entry.value, resource), state: "fresh" };
  }
  function iso(t) {  // `2026-12-07T21:40:03Z`
    const ms = typeof t === "number" ? t * 1000 : Date.parse(t);
    return Number.isFinite(ms) ? new Date(ms).toISOString().replace(/\.\d+Z$/, "Z") : String(t);
  }
  // A <tag> holding `t` relative to the server's `now` (epoch s), the ISO time on hover.
  function when(t, now, tag = "td") {
    const cell = document.createElement(tag);
    if (t === null || t === undefined || t === "") { cell.textContent = "-"; return cell; }
    const at = typeof t === "number" ? t : Date.parse(t) / 1000;
    const d = now - at, a = Math.abs(d);
    const span = a < 90 ? `${a.toFixed(1)} s` : a < 5400 ? `${(a / 60).toFixed(1)} min`
      : `${(a / 3600).toFixed(1)} h`;
    const time = document.createElement("time");
    time.textContent = d >= 0 ? `${span} ago` : `in ${span}`;
    time.dateTime = time.title = iso(t);
    cell.append(time);
    return cell;
  }
  return { show, valueCell, iso, when, setPrecision(p) { precision = p || {}; } };
})();
