#!/usr/bin/env bash
# GPU validation of the QoS tiers (docs/qos.md) by completed work. Run on the GPU machine from the
# repo root after `cargo xtask bundle` (needs .carry/bin/libvgpu_limiter.so); builds nothing;
# needs PyTorch. Four parts (validate_qos.py): guaranteed 30/70 shares of each tenant's solo work
# (3 rotated rounds), the burst when one tenant idles and resumes (per-100 ms work in
# $OUT/qos-burst.csv and .svg), and a batch-1 transformer's P99 in the latency tier beside a
# best-effort matmul, back to back and one request every 10 ms. Results: $OUT/qos.json, $OUT/qos.txt (default OUT=/tmp/out-qos). Takes ~9 min;
# QOS_PARTS (e.g. shares,burst) and QOS_ROUNDS change it. Exit status 1 if a verdict fails.
OUT=${OUT:-/tmp/out-qos}
. scripts/gpu/check-common.sh
verdict 590 python3 scripts/gpu/validate_qos.py "$BIN/libvgpu_limiter.so" "$OUT"
