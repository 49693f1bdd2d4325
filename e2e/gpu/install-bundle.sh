#!/usr/bin/env bash
# On the device: join the stashed parts, check them, and install every wheel with
#   pip install --no-index --no-deps --target $KVQ_GPU_SITE
# next to (not into) the image's Python. Idempotent: a finished install is kept.
# Prints the line to eval: export PYTHONPATH=<site>:<repo>/operator
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
dest=${KVQ_GPU_BUNDLE_DIR:-/tmp/kvq-gpu-bundle}
site=${KVQ_GPU_SITE:-/tmp/kvq-site}
py=${PYTHON:-python3}
if [ ! -f "$site/.complete" ]; then
  cd "$dest"
  sha256sum --quiet -c SHA256SUMS >&2
  rm -rf wheels "$site"
  cat $(awk '{print $2}' SHA256SUMS | sort) | tar -x
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --disable-pip-version-check --target "$site" wheels/*.whl >&2
  rm -rf wheels
  touch "$site/.complete"
fi
echo "export PYTHONPATH=$site:$repo/operator VLLM_USE_FLASHINFER_SAMPLER=0"
