#!/usr/bin/env bash
# Install the environments and run every test matrix:
#   core          (.venv/core)           API, verifier, allocation, CPU emulator numerics, CLI,
#                                        the wheel (built, installed in a fresh venv, run)
#   nvidia        (.venv/nvidia)         Gluon lowering compiled to sm_90a PTX/cubin with the
#                                        oldest supported triton (3.6); GPU tests skip without one
#   nvidia-newest (.venv/nvidia-newest)  the same tests/nvidia with the newest supported triton (3.9)
#   ascend        (.venv/ascend)         triton-ascend lowering compiled to HIVM; NPU tests skip
#                                        without one
# Usage: scripts/test.sh [core|nvidia|nvidia-newest|ascend ...] [-- pytest args]
# Ends with one line per matrix (counts, seconds) and a total.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
matrices=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do matrices+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#matrices[@]} -eq 0 ] && matrices=(core nvidia nvidia-newest ascend)
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$root/.venv/triton-cache}"
export XSYNC_CACHE_DIR="${XSYNC_CACHE_DIR:-$root/.venv/xsync-cache}"
status=0
summary=()
totals=(0 0 0)
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
count() {  # count WORD: the number before WORD in pytest's closing line (0 if absent)
  grep -E "^(=+ )?[0-9]+ [a-z]+.* in [0-9.]+s" "$log" | tail -1 | grep -Eo "[0-9]+ $1" | grep -Eo "^[0-9]+" \
    | awk '{s+=$1} END {print s+0}'
}
for m in "${matrices[@]}"; do
  case "$m" in
    nvidia-newest) tests="tests/nvidia" ;;   # same tests, other triton
    *)             tests="tests/$m" ;;
  esac
  echo "================ matrix: $m ================"
  start=$SECONDS
  if ! bash scripts/env.sh "$m"; then
    echo "matrix $m: environment setup failed" >&2; status=1
    summary+=("$(printf '%-14s environment setup failed' "$m")"); continue
  fi
  ".venv/$m/bin/python" -m pytest "$tests" -q -p no:cacheprovider "$@" 2>&1 | tee "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  n=("$(count passed)" "$(( $(count failed) + $(count 'errors?') ))" "$(count skipped)")
  for i in 0 1 2; do totals[i]=$(( totals[i] + n[i] )); done
  summary+=("$(printf '%-14s %4d passed, %d failed, %3d skipped  %4d s (environment + tests)' \
               "$m" "${n[0]}" "${n[1]}" "${n[2]}" $((SECONDS - start)))")
done
echo
echo "================ summary ================"
printf '%s\n' "${summary[@]}"
echo "total: ${totals[0]} passed, ${totals[1]} failed, ${totals[2]} skipped"
exit $status
