#!/usr/bin/env bash
# Build m3fleet's endpoint picker image (epp/: GIE's EPP with the m3fleet-context-tier filter) with buildah: no
# daemon, no registry, no base image. The EPP is a static Go binary (CGO_ENABLED=0), so the image is that binary
# alone, FROM scratch, run as uid 65532; Go cross-compiles each architecture (no qemu needed).
#
#   hack/build-epp-image.sh                                        # this machine's architecture
#   hack/build-epp-image.sh --platform linux/amd64,linux/arm64     # multi-arch manifest list (GB200 nodes are arm64)
#
# Named as the operator runs it: M3FLEET_EPP_IMAGE (default: the pin spec.gateway uses, m3fleet.catalog.gateway's
# EPP_IMAGE, read from its source). Cached under $M3FLEET_IMAGE_CACHE (default ~/.cache/m3fleet/image), keyed by
# epp/'s sources, this script, the image name and the platforms; written as an OCI archive (what
# `ctr -n k8s.io images import`, `kind load image-archive` or `skopeo copy` take).
#
# stdout carries exactly one line, the OCI archive's path; progress goes to stderr.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec 3>&1 1>&2

PLATFORMS=""
while (($#)); do
  case $1 in
    --platform) PLATFORMS=${2:?--platform needs a list like linux/amd64,linux/arm64}; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)"; exit 2 ;;
  esac
done
log() { printf '[build-epp-image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
for tool in buildah go; do
  command -v $tool >/dev/null || die "$tool is not installed"
done

PIN=$(sed -n 's/^EPP_IMAGE: Final = f"\(.*\)"$/\1/p' operator/m3fleet/catalog/gateway.py)
EPP_VERSION=$(sed -n 's/^EPP_VERSION: Final = "\(.*\)"$/\1/p' operator/m3fleet/catalog/gateway.py)
[[ -n $PIN && -n $EPP_VERSION ]] || die "could not read EPP_IMAGE and EPP_VERSION from operator/m3fleet/catalog/gateway.py"
GIE_VERSION=$(awk '$1 == "sigs.k8s.io/gateway-api-inference-extension" { print $2 }' epp/go.mod)
[[ $GIE_VERSION == "$EPP_VERSION" ]] || die "epp/go.mod pins GIE $GIE_VERSION, m3fleet.catalog.gateway.EPP_VERSION says $EPP_VERSION"
IMAGE=${M3FLEET_EPP_IMAGE:-${PIN//\{EPP_VERSION\}/$EPP_VERSION}}
ARCHES=${PLATFORMS:-linux/$(go env GOARCH)}

CACHE=$(realpath -m "${M3FLEET_IMAGE_CACHE:-$HOME/.cache/m3fleet/image}")
mkdir -p "$CACHE"
exec 9>"$CACHE/.epp-lock" && flock 9
BUILDAH=(buildah --root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver vfs)
KEY=$( (sha256sum hack/build-epp-image.sh; go version; echo "$IMAGE $ARCHES"
  find epp -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
) | sha256sum | cut -c1-16)
ARCHIVE="$CACHE/m3fleet-epp-$(sed 's|linux/||g; s|,|+|g' <<<"$ARCHES")-$KEY.oci.tar"
if [[ -s $ARCHIVE ]]; then
  log "reusing $ARCHIVE (inputs unchanged, key $KEY)"
  echo "$ARCHIVE" >&3
  exit 0
fi

WORK=$(mktemp -d "$CACHE/.epp-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
REVISION=$(git log -1 --format=%H -- epp 2>/dev/null || echo unknown)
"${BUILDAH[@]}" manifest rm "$IMAGE" >/dev/null 2>&1 || "${BUILDAH[@]}" rmi -f "$IMAGE" >/dev/null 2>&1 || true
"${BUILDAH[@]}" manifest create "$IMAGE" >/dev/null
IFS=, read -r -a platform_list <<<"$ARCHES"
for platform in "${platform_list[@]}"; do
  arch=${platform#linux/}
  log "go build ./cmd/epp for $platform"
  # The flags .ci/epp.sh builds with, so this machine's architecture reuses its compiled packages.
  (cd epp && GOTOOLCHAIN=local CGO_ENABLED=0 GOOS=linux GOARCH=$arch GOFLAGS=-mod=readonly \
    go build -o "$WORK/epp-$arch" ./cmd/epp) || die "go build for $platform"
  container=$("${BUILDAH[@]}" from --arch "$arch" scratch)
  "${BUILDAH[@]}" copy --chmod 0755 "$container" "$WORK/epp-$arch" /epp >/dev/null
  "${BUILDAH[@]}" config --arch "$arch" --os linux --user 65532:65532 --entrypoint '["/epp"]' \
    --label "org.opencontainers.image.title=m3fleet-epp" \
    --label "org.opencontainers.image.description=GIE $GIE_VERSION endpoint picker with the m3fleet-context-tier filter" \
    --label "org.opencontainers.image.source=${M3FLEET_IMAGE_SOURCE:-https://github.com/m3fleet/m3fleet}" \
    --label "org.opencontainers.image.revision=$REVISION" \
    --label "org.opencontainers.image.licenses=Apache-2.0" "$container"
  "${BUILDAH[@]}" commit --quiet --rm --manifest "$IMAGE" "$container" >/dev/null
done
"${BUILDAH[@]}" manifest push --quiet --all "$IMAGE" "oci-archive:$ARCHIVE.part:$IMAGE" >/dev/null
mv "$ARCHIVE.part" "$ARCHIVE"
find "$CACHE" -maxdepth 1 -name 'm3fleet-epp-*.oci.tar' ! -path "$ARCHIVE" -delete   # older inputs' archives
log "built $IMAGE ($(du -h "$ARCHIVE" | cut -f1)) for $ARCHES"
echo "$ARCHIVE" >&3
