#!/usr/bin/env bash
# Main job: install xsync and run the example kernels (and flash attention) on the
# default backend (CPU emulator when there is no GPU/NPU), checked against torch.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/env.sh" core
cd "$root"
exec "$root/.venv/core/bin/xsync" demo "$@"
