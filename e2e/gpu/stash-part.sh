#!/usr/bin/env bash
# On the device: keep one carried bundle part in the machine's /tmp (it outlives the call
# while the machine stays warm), after checking its SHA-256.
#   e2e/gpu/stash-part.sh e2e/gpu/.bundle/part-N
set -euo pipefail
src=${1:?usage: stash-part.sh e2e/gpu/.bundle/part-N}
dest=${KVQ_GPU_BUNDLE_DIR:-/tmp/kvq-gpu-bundle}
mkdir -p "$dest"
cp "$src"/manifest.json "$src"/SHA256SUMS "$dest"/
for part in "$src"/*.tar.[0-9][0-9]; do
  name=$(basename "$part")
  cp "$part" "$dest/$name.partial"
  want=$(awk -v f="$name" '$2 == f {print $1}' "$dest/SHA256SUMS")
  got=$(sha256sum "$dest/$name.partial" | cut -d' ' -f1)
  if [ "$want" != "$got" ]; then
    echo "stash-part: $name checksum mismatch (want $want, got $got)" >&2
    exit 1
  fi
  mv "$dest/$name.partial" "$dest/$name"
  echo "stashed $name in $dest"
done
echo "parts present: $(cd "$dest" && ls ./*.tar.[0-9][0-9] 2>/dev/null | wc -l) of $(wc -l <"$dest/SHA256SUMS")"
