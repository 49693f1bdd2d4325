#!/usr/bin/env bash
# Creates (once) and prints the project's virtualenv, cached outside the repo.
# Keyed by the pyproject hash and the checkout path, so two clones never share an
# editable install; uv's own download cache makes a new key cheap.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cache=${KVQ_CACHE:-$HOME/.cache/kvq}
py=${PYTHON:-python3}
key=$( (cat "$here/pyproject.toml"; echo "$here"; "$py" --version) | sha256sum | cut -c1-12)
venv="$cache/venv-$key"
mkdir -p "$cache"
# One builder at a time: parallel make targets (and people) share the cache.
exec 9>"$cache/.venv.lock"
flock 9
if [ ! -x "$venv/bin/kvq" ] || [ ! -f "$venv/.complete" ]; then
  rm -rf "$venv"
  # Progress on stderr (stdout is the venv's path, read by make).
  echo "[venv] creating $venv with kvq and its test tools (once per pyproject; 1-4 minutes)" >&2
  started=$SECONDS
  "$py" -m venv "$venv" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "uv>=0.5" >&2
  "$venv/bin/uv" pip install -q --python "$venv/bin/python" -e "$here[dev]" >&2
  touch "$venv/.complete"
  echo "[venv] ready in $((SECONDS - started)) s" >&2
fi
echo "$venv"
