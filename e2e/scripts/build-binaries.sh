#!/usr/bin/env bash
# Builds the local control plane's binaries from their Go modules, pinned by e2e/versions.env,
# into $KVQ_CACHE/bin/<component>-<version>/ (default ~/.cache/kvq). A component whose
# binaries are already there is not rebuilt. Usage: build-binaries.sh [component ...]
# (components: kubernetes etcd kwok helm; default all). Prints nothing but progress to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../versions.env
source "$here/versions.env"
cache=${KVQ_CACHE:-$HOME/.cache/kvq}
bin_root="$cache/bin"
work_root="$cache/build"
# One Go for every machine (fetched once from the module proxy); see e2e/README.md.
export GOTOOLCHAIN=${GOTOOLCHAIN:-go1.27.3}
export GOCACHE="$cache/go-build"
export GOMODCACHE="$cache/go-mod"
export GOFLAGS="-trimpath -mod=mod -buildvcs=false"
export CGO_ENABLED=0
# Two cores: one package build at a time per go command keeps memory and time predictable.
export GOMAXPROCS=${GOMAXPROCS:-2}
build_date=2026-01-01T00:00:00Z

log() { echo "[build-binaries] $*" >&2; }

# wrapper_module NAME: a throwaway module (unique per run) that only requires what we build.
wrapper_module() {
  w=$(mktemp -d "$work_root/$1.XXXXXX")
  # Each build runs in a subshell: its work dir goes when it ends, built or failed.
  trap 'rm -rf "$w"' EXIT
  (cd "$w" && go mod init kvq.local/build >/dev/null 2>&1)
}

# One build of a component at a time, whoever starts it (make, pytest, a developer); a
# waiter finds the binaries in place once the lock is free.
lock_component() {
  exec {lock_fd}>"$work_root/$1.lock"
  flock "$lock_fd"
}

# install_into DEST_DIR BIN...: move freshly built binaries into place atomically.
install_into() {
  local dest=$1 tmp=$1.tmp
  shift
  rm -rf "$tmp"
  mkdir -p "$tmp"
  for b in "$@"; do mv "$b" "$tmp/"; done
  rm -rf "$dest"
  mv "$tmp" "$dest"
  rm -rf "$w"
}

have_all() {
  local dir=$1
  shift
  for b in "$@"; do [ -x "$dir/$b" ] || return 1; done
}

build_kubernetes() {
  local v=$KUBERNETES_VERSION dest="$bin_root/kubernetes-$KUBERNETES_VERSION"
  local bins=(kube-apiserver kube-controller-manager kube-scheduler)
  if have_all "$dest" "${bins[@]}"; then log "kubernetes $v cached"; return; fi
  local staging=v0.${v#v1.}
  wrapper_module "kubernetes-$v"
  cd "$w"
  go mod download -json "k8s.io/kubernetes@$v" >kube.json
  local gomod
  gomod=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["GoMod"])' kube.json)
  # k8s.io/kubernetes replaces every staging module with ./staging/...; outside its tree
  # each one must point at the published module of the same release.
  grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$gomod" \
    | awk '{print $1}' | sort -u >staging.txt
  while read -r m; do go mod edit -replace "$m=$m@$staging"; done <staging.txt
  go mod edit -require "k8s.io/kubernetes@$v"
  local major minor
  major=$(echo "$v" | cut -d. -f1 | tr -d v)
  minor=$(echo "$v" | cut -d. -f2)
  local ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
  done
  for b in "${bins[@]}"; do
    log "building $b $v"
    go build -ldflags "$ld" -o "$w/$b" "k8s.io/kubernetes/cmd/$b"
  done
  install_into "$dest" "${bins[@]/#/$w/}"
}

build_etcd() {
  local v=$ETCD_VERSION dest="$bin_root/etcd-$ETCD_VERSION"
  if have_all "$dest" etcd; then log "etcd $v cached"; return; fi
  wrapper_module "etcd-$v"
  cd "$w"
  go mod edit -require "go.etcd.io/etcd/server/v3@$v"
  log "building etcd $v"
  go build -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=release-$v" \
    -o "$w/etcd" go.etcd.io/etcd/server/v3
  install_into "$dest" "$w/etcd"
}

build_kwok() {
  local v=$KWOK_VERSION dest="$bin_root/kwok-$KWOK_VERSION"
  if have_all "$dest" kwok; then log "kwok $v cached"; return; fi
  wrapper_module "kwok-$v"
  cd "$w"
  go mod edit -require "sigs.k8s.io/kwok@$v"
  log "building kwok $v"
  go build -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$v" \
    -o "$w/kwok" sigs.k8s.io/kwok/cmd/kwok
  install_into "$dest" "$w/kwok"
}

build_helm() {
  local v=$HELM_VERSION dest="$bin_root/helm-$HELM_VERSION"
  if have_all "$dest" helm; then log "helm $v cached"; return; fi
  wrapper_module "helm-$v"
  cd "$w"
  go mod edit -require "helm.sh/helm/v3@$v"
  log "building helm $v"
  go build -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$v \
    -X helm.sh/helm/v3/internal/version.gitTreeState=clean" -o "$w/helm" helm.sh/helm/v3/cmd/helm
  install_into "$dest" "$w/helm"
}

components=("$@")
[ ${#components[@]} -gt 0 ] || components=(etcd kwok kubernetes helm)
mkdir -p "$bin_root" "$work_root"
for c in "${components[@]}"; do
  start=$(date +%s)
  lock_component "$c"
  ( "build_$c" )
  exec {lock_fd}>&-
  log "$c done in $(($(date +%s) - start)) s"
done
