#!/bin/sh
# Textfile-collector script (run from cron): the datasets and model weights cached on
# this node, as node_exporter's textfile convention wants them — written to a temporary
# name and renamed into place, so neither node_exporter nor crr's `type: textfile`
# reporter ever reads half a file.
#
# A cache entry counts once its download finished: a directory with a `.complete`
# file in it (a half-downloaded model must not attract jobs).
#   CRR_DATASET_DIR (default /scratch/datasets), CRR_MODEL_DIR (/scratch/models),
#   TEXTFILE_DIR (/var/lib/prometheus/node-exporter).
set -eu
datasets=${CRR_DATASET_DIR:-/scratch/datasets}
models=${CRR_MODEL_DIR:-/scratch/models}
out=${TEXTFILE_DIR:-/var/lib/prometheus/node-exporter}/crr_cache.prom
tmp="$out.$$"
{
    echo "# HELP crr_cached A dataset or model cached complete on this node."
    echo "# TYPE crr_cached gauge"
    for kind in dataset model; do
        if [ "$kind" = dataset ]; then dir=$datasets; else dir=$models; fi
        [ -d "$dir" ] || continue
        for entry in "$dir"/*/; do
            [ -f "$entry.complete" ] || continue
            name=$(basename "$entry" | sed 's/\\/\\\\/g; s/"/\\"/g')  # label escaping
            printf 'crr_cached{kind="%s",name="%s"} 1\n' "$kind" "$name"
        done
    done
} > "$tmp"
mv "$tmp" "$out"
