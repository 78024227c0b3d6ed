#!/usr/bin/env bash
# Build the real control plane the cluster test tier (tests/cluster/) runs, from Go modules:
# kube-apiserver, kube-controller-manager and kube-scheduler, the etcd that Kubernetes release pins,
# kwok (fake nodes), the LeaderWorkerSet controller and helm. Idempotent and cached by version outside
# the repo: $M3FLEET_CLUSTER_CACHE (default ~/.cache/m3fleet/cluster)/<versions>/bin. A cold build (empty Go
# module and build caches) took 6.4 min on 2 cores, kube-apiserver 2.5 of them; a warm run takes a second.
# Fails loudly (never skips) when it cannot build.
#
# stdout carries exactly one line, the bin directory; progress goes to stderr.
# Usage: bash .ci/control-plane.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec 3>&1 1>&2
# shellcheck source=../tests/support/cluster/versions.env
source tests/support/cluster/versions.env

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
CACHE=$(realpath -m "${M3FLEET_CLUSTER_CACHE:-$HOME/.cache/m3fleet/cluster}")
KEY="k8s-$KUBERNETES_VERSION-kwok-$KWOK_VERSION-lws-$LWS_VERSION-helm-$HELM_VERSION"
OUT="$CACHE/$KEY"
BIN="$OUT/bin"
log() { printf '[control-plane %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
command -v go >/dev/null || die "go is not installed (the cluster tier builds Kubernetes from Go modules)"

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock" && flock 9   # two concurrent runs must not build the same binaries twice
if [[ -f $OUT/.complete ]]; then
  log "reusing $BIN"
  echo "$BIN" >&3
  exit 0
fi
mkdir -p "$BIN" "$OUT/data"
WORK=$(mktemp -d "$CACHE/.build-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
t0=$(date +%s)
step() { log "$1 ($(( $(date +%s) - t0 ))s elapsed)"; }

# Kubernetes: k8s.io/kubernetes cannot be `go install`ed (its go.mod replaces its staging modules with
# local paths). Build it inside a wrapper module that replaces each k8s.io/* module the proxied go.mod
# requires at v0.0.0 with its published v0.<minor>.<patch> tag, derived from that go.mod, not hard-coded.
step "kubernetes $KUBERNETES_VERSION: resolving modules"
K8S_MOD=$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')
[[ -f $K8S_MOD ]] || die "could not download k8s.io/kubernetes@$KUBERNETES_VERSION from the Go module proxy"
STAGING_VERSION="v0.${KUBERNETES_VERSION#v1.}"
mkdir -p "$WORK/k8s" && cd "$WORK/k8s"
{
  echo "module m3fleet.test/kubernetes-build"
  echo
  grep -m1 '^go ' "$K8S_MOD"
  grep '^godebug' "$K8S_MOD" || true
  echo
  echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
  echo
  echo "replace ("
  awk '$2 == "v0.0.0" && $1 ~ /^k8s\.io\// { print "\t" $1 " => " $1 " '"$STAGING_VERSION"'" }' "$K8S_MOD"
  echo ")"
} > go.mod
cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
go mod tidy >/dev/null 2>&1 || go mod tidy || die "go mod tidy for kubernetes $KUBERNETES_VERSION"
ETCD_VERSION=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/client/v3)
MINOR=${KUBERNETES_VERSION#v1.}; MINOR=${MINOR%%.*}
VERSION_LDFLAGS=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  VERSION_LDFLAGS+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$MINOR"
  VERSION_LDFLAGS+=" -X $pkg.gitCommit=0000000000000000000000000000000000000000 -X $pkg.gitTreeState=clean"
  VERSION_LDFLAGS+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
  [[ -x $BIN/$cmd ]] && { step "$cmd: already built"; continue; }
  step "building $cmd $KUBERNETES_VERSION (the longest steps: up to a few minutes each on 2 cores)"
  go build -trimpath -ldflags "-s -w $VERSION_LDFLAGS" -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd" || die "go build $cmd"
  mv "$BIN/$cmd.tmp" "$BIN/$cmd"
done

# etcd at the version this Kubernetes release pins; its server module's root package is etcd's main.
if [[ ! -x $BIN/etcd ]]; then
  step "building etcd $ETCD_VERSION (pinned by kubernetes $KUBERNETES_VERSION)"
  mkdir -p "$WORK/etcd" && cd "$WORK/etcd"
  printf 'module m3fleet.test/etcd-build\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > go.mod
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
  go mod tidy || die "go mod tidy for etcd $ETCD_VERSION"
  go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3 || die "go build etcd"
  mv "$BIN/etcd.tmp" "$BIN/etcd"
fi

# The documented `go install` paths for kwok, LeaderWorkerSet (its binary is named `cmd`) and helm.
install_tool() {  # NAME PACKAGE@VERSION OUTPUT_NAME
  [[ -x $BIN/$3 ]] && { step "$1: already built"; return; }
  step "building $1 ($2)"
  mkdir -p "$WORK/gobin-$3"
  GOBIN="$WORK/gobin-$3" go install -trimpath -ldflags "-s -w" "$2" || die "go install $2"
  mv "$WORK/gobin-$3/$(basename "${2%@*}")" "$BIN/$3"
}
install_tool kwok "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" kwok
# LWS's main package is sigs.k8s.io/lws/cmd inside module sigs.k8s.io/lws; the proxy answers 403 (not 404) for
# the probe of a module named sigs.k8s.io/lws/cmd, so `go install pkg@version` stops there: use a wrapper module.
if [[ ! -x $BIN/lws-controller ]]; then
  step "building LeaderWorkerSet controller (sigs.k8s.io/lws $LWS_VERSION)"
  mkdir -p "$WORK/lws" && cd "$WORK/lws"
  printf 'module m3fleet.test/lws-build\n\ngo 1.26\n\nrequire sigs.k8s.io/lws %s\n' "$LWS_VERSION" > go.mod
  printf '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/lws/cmd"\n' > tools.go
  go mod tidy || die "go mod tidy for sigs.k8s.io/lws $LWS_VERSION"
  go build -trimpath -ldflags "-s -w" -o "$BIN/lws-controller.tmp" sigs.k8s.io/lws/cmd || die "go build lws"
  mv "$BIN/lws-controller.tmp" "$BIN/lws-controller"
fi
install_tool helm "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" helm

# Data files shipped in the modules just built: kwok's Stage objects and LWS's CRDs and webhook config.
step "copying kwok stages and LeaderWorkerSet manifests from the module cache"
MODCACHE=$(go env GOMODCACHE)
rm -rf "$OUT/data" && mkdir -p "$OUT/data"
cp -r "$MODCACHE/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage" "$OUT/data/kwok-stage"
cp -r "$MODCACHE/sigs.k8s.io/lws@$LWS_VERSION/config" "$OUT/data/lws-config"
chmod -R u+w "$OUT/data"
echo "ETCD_VERSION=$ETCD_VERSION" > "$OUT/versions.env"
"$BIN/kube-apiserver" --version >&2
"$BIN/etcd" --version | head -1 >&2
touch "$OUT/.complete"
step "control plane built in $BIN"
echo "$BIN" >&3
