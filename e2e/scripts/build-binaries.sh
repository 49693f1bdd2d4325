#!/usr/bin/env bash
# Builds the local control plane's binaries from their Go modules, pinned by e2e/versions.env,
# into $KVQ_CACHE/bin/<name>-<version>/ (default ~/.cache/kvq). A binary already there, built
# with the same recipe (module, ldflags, Go), is not rebuilt.
#
# Usage: build-binaries.sh [component ...]   (default: etcd kwok kubernetes helm keda lws)
#
# Progress goes to stderr as `[build-binaries] ...` lines: which component, elapsed time, the
# measured cold-build time as an estimate, and a heartbeat every $KVQ_BUILD_HEARTBEAT_S (30 s)
# while the go command works. The go command's own output goes to the log
# ($KVQ_BUILD_LOG, default $KVQ_CACHE/logs/build-binaries.log), and its tail to stderr when
# a build fails.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../versions.env
source "$here/versions.env"
cache=${KVQ_CACHE:-$HOME/.cache/kvq}
bin_root="$cache/bin"
work_root="$cache/build"
log_file=${KVQ_BUILD_LOG:-$cache/logs/build-binaries.log}
heartbeat_s=${KVQ_BUILD_HEARTBEAT_S:-30}
# One Go for every machine (fetched once from the module proxy); see e2e/README.md.
export GOTOOLCHAIN=${GOTOOLCHAIN:-go1.27.3}
export GOCACHE="$cache/go-build"
export GOMODCACHE="$cache/go-mod"
export GOFLAGS="-trimpath -mod=mod -buildvcs=false"
export CGO_ENABLED=0
# Two cores: one package build at a time per go command keeps memory and time predictable.
export GOMAXPROCS=${GOMAXPROCS:-2}
build_date=2026-01-01T00:00:00Z
default_components=(etcd kwok kubernetes helm keda lws)

# Cold-build wall time per component in seconds (empty cache, this project's 2-core machine;
# e2e/README.md "Measurements"). Shown as the estimate; etcd's includes fetching Go itself.
declare -A cold_s=([etcd]=80 [kwok]=134 [kube-apiserver]=410 [kube-controller-manager]=120
  [kube-scheduler]=10 [helm]=150 [keda]=900 [keda-adapter]=120 ["keda-crds manifests"]=5
  [lws]=240 ["lws-chart manifests"]=5 [traefik]=600 ["gateway-api-crds manifests"]=5 ["inference-extension-crds manifests"]=5)

log() {
  echo "[build-binaries] $*" >&2
  echo "[build-binaries] $(date -u +%H:%M:%S) $*" >>"$log_file"
}

clock() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }

# building WHAT: announce a build with its estimate; built WHAT: say how long it took.
building() {
  build_began=$SECONDS
  log "$label: building $1 (cold build: about $(clock "${cold_s[$1]:-300}"))"
}
built() {
  log "$label: built $1 in $(clock $((SECONDS - build_began)))"
  echo "$1" >>"$built_list"
}

# run_logged LABEL ESTIMATE_S CMD...: CMD's output into the log, a heartbeat line on stderr
# every $heartbeat_s, and the log's tail on stderr when CMD fails.
run_logged() {
  local label=$1 estimate=$2 began=$SECONDS rc=0 next
  shift 2
  echo "[build-binaries] $(date -u +%H:%M:%S) $label: $*" >>"$log_file"
  "$@" >>"$log_file" 2>&1 &
  local pid=$!
  next=$((began + heartbeat_s))
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$next" ]; then
      log "$label: still building, $(clock $((SECONDS - began))) elapsed (cold build: about $(clock "$estimate"))"
      next=$((next + heartbeat_s))
    fi
    sleep 1
  done
  wait "$pid" || rc=$?
  if [ "$rc" -ne 0 ]; then
    tail -n 20 "$log_file" >&2
    log "$label: failed (exit $rc) after $(clock $((SECONDS - began)))"
    return "$rc"
  fi
}

# wrapper_module NAME: a throwaway module (unique per run) that only requires what we build.
wrapper_module() {
  w=$(mktemp -d "$work_root/$1.XXXXXX")
  # Each build runs in a subshell: its work dir goes when it ends, built or failed.
  trap 'rm -rf "$w"' EXIT
  (cd "$w" && go mod init kvq.local/build >>"$log_file" 2>&1)
}

# module_gomod MODULE VERSION: the path of that module's go.mod in the module cache.
module_gomod() {
  go mod download -json "$1@$2" 2>>"$log_file" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])'
}

# inherit_directives GOMOD: the built module's own replace and exclude directives that name
# other modules (forks, pinned versions), as `go mod edit` flags. Local-path replaces are
# left out: they point at sibling modules of the same repository, published at the same
# version (or, as with Traefik's nested module, supplied by the component's prepare step).
inherit_directives() {
  go mod edit -json "$1" 2>>"$log_file" | python3 -c '
import json, sys
mod = json.load(sys.stdin)
def at(m): return m["Path"] + ("@" + m["Version"] if m.get("Version") else "")
for r in mod.get("Replace") or []:
    if not r["New"]["Path"].startswith("."):
        print("-replace=" + at(r["Old"]) + "=" + at(r["New"]))
for e in mod.get("Exclude") or []:
    print("-exclude=" + at(e))
'
}

# One build of a component at a time, whoever starts it (make, pytest, a developer); a
# waiter finds the binaries in place once the lock is free.
lock_component() {
  exec {lock_fd}>"$work_root/$1.lock"
  flock "$lock_fd"
}

# The recipe a binary was built with; a different one (new ldflags, module or Go) rebuilds.
recipe() { printf '%s\n' "$GOTOOLCHAIN" "$@"; }

# is_built DEST RECIPE BIN...: every binary in DEST, built with RECIPE.
is_built() {
  local dest=$1 want=$2
  shift 2
  [ -f "$dest/.recipe" ] && [ "$(cat "$dest/.recipe")" = "$want" ] || return 1
  for b in "$@"; do [ -x "$dest/$b" ] || return 1; done
}

# install_into DEST RECIPE BIN...: move freshly built binaries into place atomically.
install_into() {
  local dest=$1 want=$2 tmp=$1.tmp
  shift 2
  rm -rf "$tmp"
  mkdir -p "$tmp"
  for b in "$@"; do mv "$b" "$tmp/"; done
  echo "$want" >"$tmp/.recipe"
  rm -rf "$dest"
  mv "$tmp" "$dest"
}

# build_module NAME VERSION MODULE PKG LDFLAGS [PREPARE [EXTRA]]: binary NAME from package PKG
# of MODULE@VERSION into $bin_root/NAME-VERSION/NAME, in a wrapper module that carries MODULE's
# own replace/exclude directives. PREPARE, a function, runs in the wrapper before the build;
# EXTRA is one more line of the recipe (what PREPARE depends on beyond its own text).
build_module() {
  local name=$1 v=$2 module=$3 pkg=$4 ld=$5 prepare=${6:-} extra=${7:-}
  local dest="$bin_root/$name-$v" want
  want=$(recipe "$module@$v" "$pkg" "$ld" "${prepare:+$(declare -f "$prepare" | sha256sum | cut -c1-16)}" ${extra:+"$extra"})
  if is_built "$dest" "$want" "$name"; then return; fi
  building "$name"
  (
    wrapper_module "$name-$v"
    cd "$w"
    local directives
    directives=$(inherit_directives "$(module_gomod "$module" "$v")")
    # shellcheck disable=SC2086  # one flag per line
    go mod edit -require "$module@$v" $directives 2>>"$log_file"
    [ -z "$prepare" ] || "$prepare" "$w" "$module" "$v"
    run_logged "$label ($name)" "${cold_s[$name]:-300}" \
      go build -ldflags "-s -w $ld" -o "$w/$name" "$pkg"
    install_into "$dest" "$want" "$w/$name"
  )
  built "$name"
}

component_etcd() {
  build_module etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3 \
    "-X go.etcd.io/etcd/api/v3/version.GitSHA=release-$ETCD_VERSION"
}

component_kwok() {
  build_module kwok "$KWOK_VERSION" sigs.k8s.io/kwok sigs.k8s.io/kwok/cmd/kwok \
    "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
}

# fetch_manifests NAME VERSION MODULE DIR GLOB: files DIR/GLOB of MODULE@VERSION (CRDs, as the
# module publishes them) into $cache/manifests/NAME-VERSION/.
fetch_manifests() {
  local name=$1 v=$2 module=$3 dir=$4 glob=$5
  local dest="$cache/manifests/$name-$v" want
  want=$(recipe "$module@$v" "$dir/$glob")
  if [ -f "$dest/.recipe" ] && [ "$(cat "$dest/.recipe")" = "$want" ]; then return; fi
  building "$name manifests"
  local src tmp="$dest.tmp"
  src=$(go mod download -json "$module@$v" 2>>"$log_file" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf "$tmp"
  mkdir -p "$tmp"
  # shellcheck disable=SC2086  # the glob expands here
  cp -r "$src/$dir/"$glob "$tmp/"
  chmod -R u+w "$tmp"
  echo "$want" >"$tmp/.recipe"
  rm -rf "$dest"
  mv "$tmp" "$dest"
  built "$name manifests"
}

# KEDA with the scalers kvq renders and its tests use (KEDA_SCALERS), not all ~80: one Go
# package (pkg/scalers) holds every scaler, so building the operator compiles every
# scaler's SDK (Elasticsearch's typed API alone is 961 packages): 3,349 packages in all,
# 11-14 minutes cold on two cores. A copy of the module whose scaler registry
# (pkg/scaling/scalers_builder.go, between its TRIGGERS-START/-END markers) keeps only
# those trigger types, without the other scalers' files, is 1,567. Everything else is
# upstream's code: the operator, the scale loop, the metrics adapter, the CRDs. A trigger
# type left out is refused by KEDA itself ("no scaler found for type"). The function's
# text is part of the recipe.
KEDA_SCALERS="prometheus cpu memory cron external external-push"
keda_prepare() {
  local w=$1 src
  src=$(go mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" 2>>"$log_file" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])' 2>>"$log_file")
  cp -r "$src" "$w/keda-src"
  chmod -R u+w "$w/keda-src"
  # shellcheck disable=SC2086  # one trigger type per word
  python3 - "$w/keda-src" $KEDA_SCALERS >>"$log_file" 2>&1 <<'PY'
import re, sys
from pathlib import Path
root, keep = Path(sys.argv[1]), set(sys.argv[2:])
builder = root / "pkg/scaling/scalers_builder.go"
text = builder.read_text()
start, end = text.index("// TRIGGERS-START"), text.index("// TRIGGERS-END")
switch = text[start:end]
cases = re.findall(r"\tcase ([^\n]*):\n((?:\t\t[^\n]*\n|\t//[^\n]*\n)+?)(?=\tcase |\tdefault:)", switch)
kept, used, found = [], set(), set()
for names, body in cases:
    types = set(re.findall(r'"([^"]+)"', names))
    if types & keep:
        kept.append(f"\tcase {names}:\n{body.rstrip()}\n")
        used |= set(re.findall(r"scalers\.(New\w+)", body))
        found |= types & keep
assert found == keep, f"not in KEDA's scaler registry: {sorted(keep - found)}"
switch = "// TRIGGERS-START\n\tswitch triggerType {\n" + "".join(kept) + switch[switch.index("\tdefault:"):]
builder.write_text(text[:start] + switch + text[end:])
for scaler in sorted((root / "pkg/scalers").glob("*_scaler.go")):
    constructors = set(re.findall(r"^func (New\w+)\(", scaler.read_text(), re.M))
    if constructors and not constructors & used:
        scaler.unlink()
# The one shared name that upstream defines in a scaler file left out (azure_queue_scaler.go).
(root / "pkg/scalers/zz_kvq_trimmed.go").write_text(
    'package scalers\n\nconst externalMetricType = "External"\n'
)
print("KEDA scalers kept:", sorted(used))
PY
  (cd "$w" && go mod edit -replace "github.com/kedacore/keda/v2=./keda-src" 2>>"$log_file")
}

component_keda() {
  # The operator (upstream's binary is called keda) and the external-metrics API server,
  # one module: the second build reuses nearly every package of the first.
  local v=$KEDA_VERSION m=github.com/kedacore/keda/v2
  local ld="-X $m/version.Version=$v -X $m/version.GitCommit=release-$v"
  build_module keda "$v" "$m" "$m/cmd/operator" "$ld" keda_prepare
  build_module keda-adapter "$v" "$m" "$m/cmd/adapter" "$ld" keda_prepare
  fetch_manifests keda-crds "$v" "$m" config/crd/bases '*.yaml'
}

# LeaderWorkerSet's controller (sigs.k8s.io/lws, one binary: controllers and webhooks) and its
# Helm chart (CRDs, webhook configurations), the multi-node add-on. Built in KEDA's module
# graph: the wrapper also requires KEDA (with KEDA's own directives), so minimal version
# selection picks the Kubernetes libraries KEDA was built with and nearly every package
# comes from KEDA's build cache (about 13 s after KEDA; LWS v0.9.0 and KEDA v2.21.0 both
# build against the Kubernetes 1.3x libraries). KEDA's version is part of the recipe.
lws_prepare() {
  local w=$1 directives
  directives=$(inherit_directives "$(module_gomod github.com/kedacore/keda/v2 "$KEDA_VERSION")")
  # shellcheck disable=SC2086  # one flag per line
  (cd "$w" && go mod edit -require "github.com/kedacore/keda/v2@$KEDA_VERSION" $directives \
    2>>"$log_file")
}

component_lws() {
  local v=$LWS_VERSION m=sigs.k8s.io/lws
  local ld="-X $m/pkg/version.GitVersion=$v -X $m/pkg/version.GitCommit=release-$v"
  ld+=" -X $m/pkg/version.BuildDate=$build_date"
  build_module lws "$v" "$m" "$m/cmd" "$ld" lws_prepare "keda@$KEDA_VERSION"
  fetch_manifests lws-chart "$v" "$m" charts 'lws'
}

# Traefik v3.7 from the module proxy needs three things its module does not bring:
# - github.com/traefik/traefik/dynamic/ext, which its go.mod replaces with its own nested
#   ./pkg/config/dynamic/ext; a nested module is left out of the module zip, and the proxy
#   serves no such module. Upstream's file is empty extension points (types HTTP, Router,
#   RouterIng): the wrapper gets the same as a local module.
# - its fork of go-http-auth at the 2026 revision, which the proxy this project uses refuses
#   ("This module version is not available"): the fork's 2020 revision (the one Traefik v2
#   shipped) has the same API for the basic and digest auth middlewares.
# - lego's ACME DNS-challenge providers: Traefik links all ~215 through lego's registry
#   (providers/dns/zz_gen_dns_providers.go), each with its DNS host's SDK, and the proxy
#   refuses the SDKs of 13 of them. A copy of lego whose registry keeps only the providers
#   that need no SDK (exec, httpreq, manual) builds, and builds in far less time: ACME is
#   not on the gateway's path, and a provider left out is refused by lego itself
#   ("unrecognized DNS provider").
# The function's text is part of the recipe.
traefik_prepare() {
  local w=$1 lego_version lego
  local fork=github.com/containous/go-http-auth@v0.4.1-0.20200324110947-a37a7636d23e
  local kept="exec httpreq manual"
  mkdir -p "$w/ext"
  printf 'module github.com/traefik/traefik/dynamic/ext\n\ngo 1.24.0\n' >"$w/ext/go.mod"
  printf '%s\n' 'package ext' '' '// HTTP is a dynamic.HTTP extension.' 'type HTTP struct{}' '' \
    '// Router is a dynamic.Router extension.' 'type Router struct{}' '' \
    '// RouterIng is a RouterIng extension for ingress provider annotations.' \
    'type RouterIng struct{}' '' '// ToRouter converts RouterIng to a Router.' \
    'func (r RouterIng) ToRouter() Router { return Router{} }' >"$w/ext/ext.go"
  lego_version=$(go mod edit -json "$(module_gomod github.com/traefik/traefik/v3 "$TRAEFIK_VERSION")" \
    | python3 -c 'import json,sys; print(next(r["Version"] for r in json.load(sys.stdin)["Require"] if r["Path"] == "github.com/go-acme/lego/v5"))' 2>>"$log_file")
  lego=$(go mod download -json "github.com/go-acme/lego/v5@$lego_version" 2>>"$log_file" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])' 2>>"$log_file")
  cp -r "$lego" "$w/lego"
  chmod -R u+w "$w/lego"
  # shellcheck disable=SC2086  # one provider per word
  python3 - "$w/lego/providers/dns/zz_gen_dns_providers.go" $kept 2>>"$log_file" <<'PY'
import re, sys
path, kept = sys.argv[1], set(sys.argv[2:])
text = open(path).read()
imports = re.findall(r'\n\t"github.com/go-acme/lego/v5/providers/dns/(\w+)"', text)
cases = re.findall(r'\n\tcase ([^\n]*):\n\t\treturn (\w+)\.NewDNSProvider\(\)', text)
assert kept <= set(imports), sorted(kept - set(imports))
for name in set(imports) - kept:
    text = text.replace(f'\n\t"github.com/go-acme/lego/v5/providers/dns/{name}"', "", 1)
for labels, name in cases:
    if name not in kept:
        text = text.replace(f"\n\tcase {labels}:\n\t\treturn {name}.NewDNSProvider()", "", 1)
assert re.findall(r"return (\w+)\.NewDNSProvider", text) and set(
    re.findall(r"return (\w+)\.NewDNSProvider", text)) == kept, "registry not as expected"
open(path, "w").write(text)
PY
  (cd "$w" && go mod edit -replace github.com/traefik/traefik/dynamic/ext=./ext \
    -replace "github.com/abbot/go-http-auth=$fork" \
    -replace github.com/go-acme/lego/v5=./lego 2>>"$log_file")
}

component_gateway() {
  # Traefik with its Kubernetes Gateway API provider, the Gateway API's standard-channel
  # CRDs at the version that Traefik is built against, and the InferencePool CRD.
  local v=$TRAEFIK_VERSION m=github.com/traefik/traefik/v3
  local ld="-X $m/pkg/version.Version=$v -X $m/pkg/version.BuildDate=$build_date"
  build_module traefik "$v" "$m" "$m/cmd/traefik" "$ld" traefik_prepare
  gateway_crds
}

gateway_crds() {
  fetch_manifests gateway-api-crds "$GATEWAY_API_VERSION" sigs.k8s.io/gateway-api \
    config/crd/standard '*.yaml'
  fetch_manifests inference-extension-crds "$INFERENCE_EXTENSION_VERSION" \
    sigs.k8s.io/gateway-api-inference-extension config/crd/bases \
    'inference.networking.k8s.io_inferencepools.yaml'
}

component_crds() {
  # Only the CRDs of the APIs kvq renders objects of (KEDA's, the Gateway API's, the
  # InferencePool), no controller: a cluster that serves them, for tests that compare what
  # kvq applies (a module download each, seconds; no build).
  fetch_manifests keda-crds "$KEDA_VERSION" github.com/kedacore/keda/v2 config/crd/bases '*.yaml'
  gateway_crds
}

component_helm() {
  # Helm's offline capabilities (`helm template`, `helm lint`) default to Kubernetes v1.20
  # unless linked with a version: give it the version of the control plane it renders for.
  local major minor ld v=$HELM_VERSION
  major=$(echo "$KUBERNETES_VERSION" | cut -d. -f1 | tr -d v)
  minor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2)
  ld="-X helm.sh/helm/v3/internal/version.version=$v"
  ld+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ld+=" -X $pkg.k8sVersionMajor=$major -X $pkg.k8sVersionMinor=$minor"
  done
  build_module helm "$v" helm.sh/helm/v3 helm.sh/helm/v3/cmd/helm "$ld"
}

component_kubernetes() {
  local v=$KUBERNETES_VERSION dest="$bin_root/kubernetes-$KUBERNETES_VERSION"
  local bins=(kube-apiserver kube-controller-manager kube-scheduler)
  local major minor ld="-s -w" want
  major=$(echo "$v" | cut -d. -f1 | tr -d v)
  minor=$(echo "$v" | cut -d. -f2)
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
  done
  want=$(recipe "k8s.io/kubernetes@$v" "${bins[@]}" "$ld")
  if is_built "$dest" "$want" "${bins[@]}"; then return; fi
  (
    wrapper_module "kubernetes-$v"
    cd "$w"
    local gomod staging=v0.${v#v1.}
    gomod=$(module_gomod k8s.io/kubernetes "$v")
    # k8s.io/kubernetes replaces every staging module with ./staging/...; outside its tree
    # each one must point at the published module of the same release.
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$gomod" \
      | awk '{print $1}' | sort -u >staging.txt
    local edits=()
    while read -r m; do edits+=("-replace=$m=$m@$staging"); done <staging.txt
    go mod edit "${edits[@]}" -require "k8s.io/kubernetes@$v" 2>>"$log_file"
    for b in "${bins[@]}"; do
      building "$b"
      run_logged "$label ($b)" "${cold_s[$b]:-300}" \
        go build -ldflags "$ld" -o "$w/$b" "k8s.io/kubernetes/cmd/$b"
      built "$b"
    done
    install_into "$dest" "$want" "${bins[@]/#/$w/}"
  )
}

version_of() {
  case $1 in
    etcd) echo "$ETCD_VERSION" ;;
    kwok) echo "$KWOK_VERSION" ;;
    kubernetes) echo "$KUBERNETES_VERSION" ;;
    helm) echo "$HELM_VERSION" ;;
    keda) echo "$KEDA_VERSION" ;;
    gateway) echo "$TRAEFIK_VERSION" ;;
    crds) echo "keda $KEDA_VERSION, gateway-api $GATEWAY_API_VERSION" ;;
    lws) echo "$LWS_VERSION" ;;
  esac
}

components=("$@")
[ ${#components[@]} -gt 0 ] || components=("${default_components[@]}")
for c in "${components[@]}"; do
  if ! declare -F "component_$c" >/dev/null; then
    echo "[build-binaries] error: unknown component '$c' (known: ${default_components[*]} gateway crds)" >&2
    exit 2
  fi
done
mkdir -p "$bin_root" "$work_root" "$(dirname "$log_file")"
# What this run built (the builds run in subshells, so a file, not a variable).
built_list=$(mktemp "$work_root/built.XXXXXX")
trap 'rm -f "$built_list"' EXIT
all_began=$SECONDS
total=${#components[@]}
i=0
for c in "${components[@]}"; do
  i=$((i + 1))
  label="$i/$total $c $(version_of "$c")"
  lock_component "$c"
  # A component returns at once when its binaries are there, built with the same recipe.
  # (Run outside any `||` so that errexit holds inside it.)
  set +e
  (
    set -e
    "component_$c"
  )
  rc=$?
  set -e
  exec {lock_fd}>&-
  if [ "$rc" -ne 0 ]; then
    log "error: building $c $(version_of "$c") failed (exit $rc); read $log_file"
    exit "$rc"
  fi
done
if [ -s "$built_list" ]; then
  log "ready in $(clock $((SECONDS - all_began))): ${components[*]}"
else
  log "cached: ${components[*]}"
fi
