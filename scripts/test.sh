#!/usr/bin/env bash
# Install the three environments and run every test matrix:
#   core   (.venv/core)    API, verifier, allocation, CPU emulator numerics, CLI
#   nvidia (.venv/nvidia)  Gluon lowering compiled to sm_90a PTX/cubin; GPU tests skip without one
#   ascend (.venv/ascend)  triton-ascend lowering compiled to HIVM; NPU tests skip without one
# Usage: scripts/test.sh [core|nvidia|ascend ...] [-- pytest args]
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
matrices=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do matrices+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#matrices[@]} -eq 0 ] && matrices=(core nvidia ascend)
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$root/.venv/triton-cache}"
export XSYNC_CACHE_DIR="${XSYNC_CACHE_DIR:-$root/.venv/xsync-cache}"
status=0
for m in "${matrices[@]}"; do
  echo "================ matrix: $m ================"
  if ! bash scripts/env.sh "$m"; then
    echo "matrix $m: environment setup failed" >&2; status=1; continue
  fi
  ".venv/$m/bin/python" -m pytest "tests/$m" -q -p no:cacheprovider "$@" || status=1
done
exit $status
