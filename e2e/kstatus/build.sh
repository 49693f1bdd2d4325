#!/usr/bin/env bash
# Builds e2e/kstatus (cli-utils' kstatus.Compute over JSON objects) into
# $KVQ_CACHE/bin/kstatus-<cli-utils version>/kstatus (default ~/.cache/kvq) and prints the
# binary's path on stdout. A binary already there, built from the same sources with the same
# Go, is not rebuilt. Shares the Go module and build caches with e2e/scripts/build-binaries.sh.
#
# Progress goes to stderr as `[kstatus] ...` lines; the go command's output goes to the log
# ($KVQ_CACHE/logs/kstatus-build.log), and its tail to stderr when the build fails.
set -euo pipefail
src=$(cd "$(dirname "$0")" && pwd)
cache=${KVQ_CACHE:-$HOME/.cache/kvq}
log_file="$cache/logs/kstatus-build.log"
heartbeat_s=${KVQ_BUILD_HEARTBEAT_S:-30}
export GOTOOLCHAIN=${GOTOOLCHAIN:-go1.27.3}
export GOCACHE="$cache/go-build"
export GOMODCACHE="$cache/go-mod"
# -mod=readonly: the committed go.sum pins every module; a mismatch fails instead of updating.
export GOFLAGS="-trimpath -mod=readonly -buildvcs=false"
export CGO_ENABLED=0
export GOMAXPROCS=${GOMAXPROCS:-2}
# Cold build measured on this project's 2-core machine (e2e/kstatus/README.md).
cold="about 2:30"

version=$(awk '$1 == "sigs.k8s.io/cli-utils" { print $2 }' "$src/go.mod")
[ -n "$version" ] || { echo "[kstatus] error: no sigs.k8s.io/cli-utils in $src/go.mod" >&2; exit 2; }
dest="$cache/bin/kstatus-$version"
# The recipe: Go, and the sources (a changed main.go or go.sum rebuilds).
recipe=$(printf '%s\n' "$GOTOOLCHAIN" "$(cd "$src" && sha256sum go.mod go.sum main.go)")

log() {
  echo "[kstatus] $*" >&2
  echo "[kstatus] $(date -u +%H:%M:%S) $*" >>"$log_file"
}
clock() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }
is_built() { [ -x "$dest/kstatus" ] && [ "$(cat "$dest/.recipe" 2>/dev/null)" = "$recipe" ]; }

mkdir -p "$cache/bin" "$cache/build" "$(dirname "$log_file")"
if is_built; then
  echo "$dest/kstatus"
  exit 0
fi
# One build at a time (make binaries and a test may both ask); a waiter finds it built.
exec {lock_fd}>"$cache/build/kstatus.lock"
flock "$lock_fd"
if is_built; then
  echo "$dest/kstatus"
  exit 0
fi

log "building kstatus (cli-utils $version) (cold build: $cold)"
began=$SECONDS
tmp="$dest.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
echo "[kstatus] $(date -u +%H:%M:%S) go build -o $tmp/kstatus ($src)" >>"$log_file"
(cd "$src" && go build -ldflags "-s -w" -o "$tmp/kstatus" .) >>"$log_file" 2>&1 &
pid=$!
next=$((began + heartbeat_s))
while kill -0 "$pid" 2>/dev/null; do
  if [ "$SECONDS" -ge "$next" ]; then
    log "still building, $(clock $((SECONDS - began))) elapsed (cold build: $cold)"
    next=$((next + heartbeat_s))
  fi
  sleep 1
done
rc=0
wait "$pid" || rc=$?
if [ "$rc" -ne 0 ]; then
  tail -n 20 "$log_file" >&2
  rm -rf "$tmp"
  log "error: building kstatus failed (exit $rc) after $(clock $((SECONDS - began))); read $log_file"
  exit "$rc"
fi
echo "$recipe" >"$tmp/.recipe"
rm -rf "$dest"
mv "$tmp" "$dest"
log "built kstatus (cli-utils $version) in $(clock $((SECONDS - began)))"
echo "$dest/kstatus"
