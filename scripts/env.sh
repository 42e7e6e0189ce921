#!/usr/bin/env bash
# Create (or reuse) the virtual environment of one test matrix and install xsync in it.
#   scripts/env.sh core           torch + xsync + transformers           -> .venv/core
#   scripts/env.sh nvidia         + the oldest supported triton (3.6.x)  -> .venv/nvidia
#   scripts/env.sh nvidia-newest  + the newest supported triton (3.9.x)  -> .venv/nvidia-newest
#   scripts/env.sh ascend         + triton-ascend 3.2.0 + ascendnpu-ir   -> .venv/ascend
#                                 (the HIVM compiler bishengir-compile)
# Upstream Triton and triton-ascend both install a package named `triton`, so each
# vendor matrix gets its own environment; the two nvidia environments bracket the range
# the `nvidia` extra allows (pyproject.toml), so a change that breaks either end shows.
# `nvidia` keeps the oldest version because that is what the H200 runs.
set -euo pipefail
name="${1:?usage: scripts/env.sh core|nvidia|nvidia-newest|ascend}"
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv/$name"
python="${XSYNC_PYTHON:-$(command -v python3.11 || command -v python3)}"
triton_oldest="3.6.*"
triton_newest="3.9.*"
# extra requirements installed together with xsync (e.g. a pin inside an extra's range)
extra_reqs=()
own_triton=1   # the environment installs a triton of its own (not torch's)
case "$name" in
  core)          extras="test,trace,models"; own_triton=0 ;;
  nvidia)        extras="test,nvidia"; extra_reqs+=("triton==$triton_oldest") ;;
  nvidia-newest) extras="test,nvidia"; extra_reqs+=("triton==$triton_newest") ;;
  # the HIVM compiler that runs after triton-ascend (bishengir-compile, to the CANN-only hivmc
  # stage): the ascend matrix compiles every lowered kernel with it (x86_64 CPython 3.11 wheel)
  ascend)        extras="test,ascend"; extra_reqs+=("ascendnpu-ir==1.2.0") ;;
  *) echo "scripts/env.sh: unknown environment '$name' (core, nvidia, nvidia-newest, ascend)" >&2; exit 2 ;;
esac
stamp="$venv/.xsync-installed"
want="$(cat "$root/pyproject.toml" "$0" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "== creating $venv ($extras${extra_reqs[*]:+, ${extra_reqs[*]}}) with $python"
rm -rf "$venv"
"$python" -m venv "$venv"
pip() {
  # this machine's pip config names index folders that may be absent: drop those warnings
  "$venv/bin/python" -m pip --disable-pip-version-check -q "$@" 2>&1 \
    | { grep -v "^WARNING: Location 'file:" || true; }
  return "${PIPESTATUS[0]}"
}
# torch first and pinned: 2.13.0 is the CPU build on these machines' local index; the
# second install repeats the pin so that resolving a triton pin can never move torch.
torch="torch==2.13.0"
pip install "$torch"
if [ "$own_triton" = 1 ]; then
  # PyPI's Linux torch is the CUDA build, which pins its own triton (2.13.0: 3.7.1), so no
  # other triton (nor triton-ascend, which installs a package named triton too) can sit
  # beside it; the CPU build pins none.
  torch_triton="$("$venv/bin/python" -c 'import importlib.metadata as m
print(" ".join(r.split(";")[0] for r in m.requires("torch") or [] if r.startswith("triton")))')"
  if [ -n "$torch_triton" ]; then
    echo "scripts/env.sh: the torch installed in $venv is a CUDA build that pins $torch_triton;" \
         "the $name environment installs a triton of its own beside torch's CPU build. Point pip at PyTorch's" \
         "CPU wheels (export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu) and rerun." >&2
    exit 1
  fi
fi
pip install -e "$root[$extras]" "$torch" ${extra_reqs[@]+"${extra_reqs[@]}"}
echo "$want" > "$stamp"
