#!/usr/bin/env bash
# Build Kueue's manager (sigs.k8s.io/kueue/cmd/kueue) from Go modules, plus the CRDs and the webhook configuration
# its module ships (config/components/crd/bases, config/components/webhook), for the cluster tier's Kueue test
# (tests/cluster/test_kueue.py: a LeaderWorkerSet group admitted as one Workload). Cached outside the repo by
# version: $M3FLEET_KUEUE_CACHE (default ~/.cache/m3fleet)/kueue-<version>/. A cold build (empty Go build cache) costs
# about 410 CPU-seconds (client-go and Kueue's many integrations): about 3.5 min on 2 idle cores, 15-18 min measured
# on 2 cores shared with other builds; 25 s with a warm Go build cache, a second when the output is cached. Fails
# loudly (never skips).
#
# stdout carries exactly one line, the output directory (bin/kueue, crds/, webhook/); progress goes to stderr.
# Usage: bash .ci/kueue.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec 3>&1 1>&2
# shellcheck source=../tests/support/cluster/versions.env
source tests/support/cluster/versions.env
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
log() { printf '[kueue %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
command -v go >/dev/null || die "go is not installed (Kueue builds from Go modules)"
[[ -n ${KUEUE_VERSION:-} ]] || die "tests/support/cluster/versions.env names no KUEUE_VERSION"

CACHE=$(realpath -m "${M3FLEET_KUEUE_CACHE:-$HOME/.cache/m3fleet}")
OUT="$CACHE/kueue-$KUEUE_VERSION"
mkdir -p "$CACHE"
exec 9>"$CACHE/.kueue.lock" && flock 9   # two concurrent runs must not build the same binary twice
if [[ -f $OUT/.complete ]]; then
  log "reusing $OUT"
  echo "$OUT" >&3
  exit 0
fi
WORK=$(mktemp -d "$CACHE/.kueue-build-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
t0=$(date +%s)
step() { log "$1 ($(( $(date +%s) - t0 ))s elapsed)"; }

# Kueue's go.mod replaces nothing, so the documented `go install pkg@version` builds it as released.
step "building sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
mkdir -p "$WORK/bin"
GOBIN="$WORK/bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION" \
  || die "go install sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
step "copying the CRDs and the webhook configuration of the module"
MODULE_DIR=$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",\?$/\1/p')
[[ -d $MODULE_DIR ]] || die "could not download sigs.k8s.io/kueue@$KUEUE_VERSION"
mkdir -p "$WORK/crds" "$WORK/webhook"
cp "$MODULE_DIR"/config/components/crd/bases/*.yaml "$WORK/crds/"
cp "$MODULE_DIR"/config/components/webhook/manifests.yaml "$WORK/webhook/"
chmod -R u+w "$WORK/crds" "$WORK/webhook"
"$WORK/bin/kueue" --help 2>&1 | grep -q -- '-config' || die "bin/kueue does not answer --help with its flags"
touch "$WORK/.complete"
rm -rf "$OUT" && mv "$WORK" "$OUT"
trap - EXIT
step "built $OUT"
echo "$OUT" >&3
