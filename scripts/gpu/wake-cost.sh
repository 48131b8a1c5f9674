#!/usr/bin/env bash
# The cost of code run right after a sleep: scripts/gpu/wake-cost.c, one copy
# and eight copies at once, each sleeping 400 us between timed runs (as a process does that waits
# in the driver for other processes' calls). A C program, built here with cc (0.1 s) if
# .carry/bin/wake-cost is missing.
#   bash scripts/gpu/wake-cost.sh        # output on stdout and in $OUT/wake-cost.txt
set -euo pipefail
OUT=${OUT:-/tmp/out-wake-cost}
mkdir -p "$OUT"
BIN=$PWD/.carry/bin/wake-cost
if [ ! -x "$BIN" ]; then
  BIN=$(mktemp)
  cc -O2 -o "$BIN" "$(dirname "$0")/wake-cost.c"
fi
REPS=${REPS:-3000}
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  lscpu | grep -E "Model name|Hypervisor" || true
  echo "one process:"
  "$BIN" "$REPS" 400
  echo "eight processes at once (the first one's figures):"
  for _ in 1 2 3 4 5 6 7; do "$BIN" "$REPS" 400 > /dev/null & done
  "$BIN" "$REPS" 400
  wait
} | tee "$OUT/wake-cost.txt"
