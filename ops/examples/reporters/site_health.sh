#!/bin/sh
# crr periodic reporter: a site health flag an operator can flip.
#
# Reads one word from the flag file $CRR_SITE_FLAG (default: none, meaning
# "ok"): "ok" -> site_ok true; anything else (e.g. "drain", "maintenance")
# -> site_ok false with that word as site_state.
flag=${CRR_SITE_FLAG:-}
state=ok
if [ -n "$flag" ] && [ -r "$flag" ]; then
    read -r state < "$flag" || true
    state=${state:-ok}
fi
# keep the state a plain word so the JSON below stays valid
state=$(printf '%s' "$state" | tr -cd 'A-Za-z0-9_.-' | cut -c1-64)
[ -n "$state" ] || state=unknown
if [ "$state" = ok ]; then ok=true; else ok=false; fi
printf '{"values": {"site_ok": %s, "site_state": "%s"}}\n' "$ok" "$state"
