#!/usr/bin/env bash
# The CRDs the serving path (spec.gateway) needs in the cluster tier, taken from the pinned Go modules: the Gateway
# API Inference Extension's (InferencePool and the x-k8s objectives its picker watches) and the Gateway API's
# standard channel (GatewayClass, Gateway, HTTPRoute). Only files are copied, nothing is built: seconds cold, nothing
# warm. Cached outside the repo: $M3FLEET_GATEWAY_CRDS_CACHE (default ~/.cache/m3fleet)/gateway-crds-<gie>-<gwapi>/.
# Fails loudly (never skips).
#
# stdout carries exactly one line, the directory holding the CRD files; progress goes to stderr.
# Usage: bash .ci/gateway-crds.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec 3>&1 1>&2
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
GIE_VERSION=v1.3.0
GATEWAY_API_VERSION=v1.6.3
log() { printf '[gateway-crds %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
command -v go >/dev/null || die "go is not installed (the CRDs come from the Go module proxy)"

CACHE=$(realpath -m "${M3FLEET_GATEWAY_CRDS_CACHE:-$HOME/.cache/m3fleet}")
OUT="$CACHE/gateway-crds-$GIE_VERSION-$GATEWAY_API_VERSION"
mkdir -p "$CACHE"
exec 9>"$CACHE/.gateway-crds.lock" && flock 9
if [[ -f $OUT/.complete ]]; then
  log "reusing $OUT"
  echo "$OUT" >&3
  exit 0
fi
WORK=$(mktemp -d "$CACHE/.gateway-crds-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
module_dir() {  # the unpacked module directory of $1@$2 in the Go module cache
  (cd "$WORK" && go mod download -json "$1@$2" | sed -n 's/^\s*"Dir": "\(.*\)",\?$/\1/p')
}
GIE_DIR=$(module_dir sigs.k8s.io/gateway-api-inference-extension "$GIE_VERSION")
[[ -d $GIE_DIR ]] || die "could not download sigs.k8s.io/gateway-api-inference-extension@$GIE_VERSION"
GATEWAY_API_DIR=$(module_dir sigs.k8s.io/gateway-api "$GATEWAY_API_VERSION")
[[ -d $GATEWAY_API_DIR ]] || die "could not download sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION"
cp "$GIE_DIR"/config/crd/bases/*.yaml "$WORK/"
for kind in gatewayclasses gateways httproutes; do
  cp "$GATEWAY_API_DIR/config/crd/standard/gateway.networking.k8s.io_$kind.yaml" "$WORK/"
done
chmod u+w "$WORK"/*.yaml
touch "$WORK/.complete"
rm -rf "$OUT" && mv "$WORK" "$OUT"
trap - EXIT
log "copied $(ls "$OUT"/*.yaml | wc -l) CRDs to $OUT"
echo "$OUT" >&3
