#!/usr/bin/env bash
# Create (or reuse) the virtual environment of one test matrix and install xsync in it.
#   scripts/env.sh core     torch + xsync                  -> .venv/core
#   scripts/env.sh nvidia   + upstream triton 3.6 (Gluon)  -> .venv/nvidia
#   scripts/env.sh ascend   + triton-ascend 3.2.0 + ascendnpu-ir (HIVM compiler) -> .venv/ascend
# Upstream Triton and triton-ascend both install a package named `triton`, so each
# vendor matrix gets its own environment.
set -euo pipefail
name="${1:?usage: scripts/env.sh core|nvidia|ascend}"
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv/$name"
python="${XSYNC_PYTHON:-$(command -v python3.11 || command -v python3)}"
case "$name" in
  core)   extras="test,trace" ;;
  nvidia) extras="test,nvidia" ;;
  ascend) extras="test,ascend" ;;
  *) echo "scripts/env.sh: unknown environment '$name' (core, nvidia, ascend)" >&2; exit 2 ;;
esac
stamp="$venv/.xsync-installed"
want="$(cat "$root/pyproject.toml" "$0" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "== creating $venv ($extras) with $python"
rm -rf "$venv"
"$python" -m venv "$venv"
pip() {
  # this machine's pip config names index folders that may be absent: drop those warnings
  "$venv/bin/python" -m pip --disable-pip-version-check -q "$@" 2>&1 \
    | { grep -v "^WARNING: Location 'file:" || true; }
  return "${PIPESTATUS[0]}"
}
# torch first and pinned: 2.13.0 is the CPU build on these machines' local index.
pip install "torch==2.13.0"
pip install -e "$root[$extras]"
if [ "$name" = ascend ]; then
  # The HIVM compiler that runs after triton-ascend (bishengir-compile, to the CANN-only hivmc
  # stage): the ascend matrix compiles every lowered kernel with it. x86_64 CPython 3.11 wheel.
  pip install "ascendnpu-ir==1.2.0"
fi
echo "$want" > "$stamp"
