#!/usr/bin/env bash
# Build m3fleet's endpoint picker (epp/: upstream GIE's EPP with our m3fleet-context-tier filter registered) from
# Go modules, after its Go tests pass, plus the ext-proc protocol descriptors the cluster tier's gateway client
# speaks (tests/support/cluster/extproc.py). Cached outside the repo by the Go version and a hash of epp/'s
# sources (go.mod pins GIE): $M3FLEET_EPP_CACHE (default ~/.cache/m3fleet)/epp-<gie>-<hash>/. A cold build
# takes about 5 min on 2 cores (most of it upstream's EPP), a warm one a second. Fails loudly (never skips).
#
# stdout carries exactly one line, the output directory (bin/epp, extproc.binpb, crds/: the GIE CRDs of the pinned
# module and the Gateway API's); progress goes to stderr.
# Usage: bash .ci/epp.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec 3>&1 1>&2
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly
log() { printf '[epp %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
command -v go >/dev/null || die "go is not installed (the endpoint picker builds from Go modules)"

GIE_VERSION=$(awk '$1 == "sigs.k8s.io/gateway-api-inference-extension" { print $2 }' epp/go.mod)
[[ -n $GIE_VERSION ]] || die "epp/go.mod does not require sigs.k8s.io/gateway-api-inference-extension"
# The Gateway API's CRDs (Gateway, HTTPRoute) the cluster tier installs next to GIE's: v1.6.3 is the newest release
# this Go builds; only its CRD files are taken.
GATEWAY_API_VERSION=v1.6.3
SOURCE_HASH=$( (go version; sha256sum .ci/epp.sh; find epp -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print0 \
  | LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16)
CACHE=$(realpath -m "${M3FLEET_EPP_CACHE:-$HOME/.cache/m3fleet}")
OUT="$CACHE/epp-$GIE_VERSION-$SOURCE_HASH"

mkdir -p "$CACHE"
exec 9>"$CACHE/.epp.lock" && flock 9   # two concurrent runs must not build the same binary twice
if [[ -f $OUT/.complete ]]; then
  log "reusing $OUT"
  echo "$OUT" >&3
  exit 0
fi
WORK=$(mktemp -d "$CACHE/.epp-build-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
t0=$(date +%s)
step() { log "$1 ($(( $(date +%s) - t0 ))s elapsed)"; }

cd epp
step "go test ./... (GIE $GIE_VERSION)"
go test ./... >&2 || die "the endpoint picker's Go tests failed"
step "building bin/epp"
mkdir -p "$WORK/bin"
# No -trimpath: it would compile every package go test just compiled again.
go build -o "$WORK/bin/epp" ./cmd/epp || die "go build ./cmd/epp"
step "writing the ext-proc descriptors"
go run ./cmd/extproc-descriptors > "$WORK/extproc.binpb" || die "go run ./cmd/extproc-descriptors"
step "copying the GIE CRDs of the pinned module"
GIE_DIR=$(go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api-inference-extension)
mkdir -p "$WORK/crds" && cp "$GIE_DIR"/config/crd/bases/*.yaml "$WORK/crds/"
step "copying the Gateway API $GATEWAY_API_VERSION CRDs (standard channel: GatewayClass, Gateway, HTTPRoute)"
GATEWAY_API_DIR=$(cd "$WORK" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION" \
  | sed -n 's/^\s*"Dir": "\(.*\)",\?$/\1/p')
[[ -d $GATEWAY_API_DIR ]] || die "could not download sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION"
for kind in gatewayclasses gateways httproutes; do
  cp "$GATEWAY_API_DIR/config/crd/standard/gateway.networking.k8s.io_$kind.yaml" "$WORK/crds/"
done
chmod u+w "$WORK"/crds/*.yaml
"$WORK/bin/epp" --help 2>&1 | grep -q -- '--pool-name' || die "bin/epp does not answer --help with its flags"
touch "$WORK/.complete"
rm -rf "$OUT" && mv "$WORK" "$OUT"
trap - EXIT
step "built $OUT"
echo "$OUT" >&3
