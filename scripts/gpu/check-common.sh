# Shared set-up of the GPU checks that run one Python validator (validate-sm-work.sh,
# validate-qos.sh, validate-freeze.sh, validate-sm-container.sh, validate-memory-figures.sh);
# sourced after the caller has set OUT (and MODULES: other Python packages whose versions to
# record, e.g. "jax cupy"). Defines BIN, writes the device, driver, commit, torch and MODULES'
# versions to $OUT/env.txt (and prints them), and `verdict`, which runs the validator under a time
# limit and exits with its status after printing PASS or FAIL.
set -u
mkdir -p "$OUT"
BIN=$PWD/.carry/bin
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  git rev-parse HEAD 2>/dev/null | sed 's/^/commit: /'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
  for m in ${MODULES:-}; do
    python3 -c "import $m; print(\"$m\", $m.__version__)" 2>&1 | tail -1
  done
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# verdict SECONDS COMMAND...: the validator's exit status is the script's (1 on a missed goal).
verdict() {
  local limit=$1
  shift
  timeout "$limit" "$@"
  local rc=$?
  [ $rc -eq 0 ] && echo PASS || echo FAIL
  exit $rc
}
