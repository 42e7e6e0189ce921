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
for m in "${matrices[@]}"; do
  case "$m" in
    nvidia-newest) tests="tests/nvidia" ;;   # same tests, other triton
    *)             tests="tests/$m" ;;
  esac
  echo "================ matrix: $m ================"
  start=$SECONDS
  if ! bash scripts/env.sh "$m"; then
    echo "matrix $m: environment setup failed" >&2; status=1; continue
  fi
  ".venv/$m/bin/python" -m pytest "$tests" -q -p no:cacheprovider "$@" || status=1
  echo "matrix $m: $((SECONDS - start)) s (environment + tests)"
done
exit $status
