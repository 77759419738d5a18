// crr status page: how it asks the server. GET a JSON document within TIMEOUT_MS; a
// problem detail (4xx/5xx) becomes an Error with .problem and .status.
"use strict";
window.crrFetch = (() => {
  const TIMEOUT_MS = 20000;
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
  return { getJSON, TIMEOUT_MS };
})();
