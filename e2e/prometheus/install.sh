#!/usr/bin/env bash
# Installs Debian's Prometheus package once and prints the binary's path.
#
# Tests start /usr/bin/prometheus themselves (own config, storage and port: see
# server.py); the package's system service is never used. Idempotent: no apt at all
# when the binary is there; `apt-get update` first when it is not (a fresh image has
# no package lists).
set -euo pipefail
binary=${KVQ_PROMETHEUS:-/usr/bin/prometheus}
if [ ! -x "$binary" ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >&2
  $sudo apt-get install -y -qq --no-install-recommends prometheus >&2
fi
echo "$binary"
