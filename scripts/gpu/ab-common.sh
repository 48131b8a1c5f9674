# Shared set-up of the scripts that compare limiter builds side by side (pairs-self.sh,
# startup-ab.sh); sourced after the caller has set OUT, LIMITERS and SETTINGS (a line describing
# its own options). Defines BIN, XARGS (EXERCISE_ARGS split), T and TS (scratch and region
# directories, removed on exit), the builds array (names from LIMITERS, in order) and lib
# (name -> realpath of its libvgpu_limiter.so); writes $OUT/env.txt.
BIN=$PWD/.carry/bin
read -r -a XARGS <<< "${EXERCISE_ARGS:-}"
mkdir -p "$OUT/raw"
T=$(mktemp -d)
TS=$(mktemp -d -p /dev/shm)
# Scratch files and regions go when the script ends (a dry run must not leave them in /dev/shm).
trap 'rm -rf "$T" "$TS"' EXIT
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
  uname -r
  echo "$SETTINGS limiters=$LIMITERS"
} | tee "$OUT/env.txt"

builds=()
declare -A lib
for kv in $LIMITERS; do
  name=${kv%%=*}; path=${kv#*=}
  [ -f "$path" ] || { echo "no limiter build at $path" >&2; exit 1; }
  lib[$name]=$(realpath "$path")
  builds+=("$name")
done
