#!/usr/bin/env bash
# The release: what .github/workflows/release.yml runs on a tag v<version>, and its dry run.
#
#   hack/release.sh --dry-run   # every step that runs without credentials, into dist/; prints each push it would do
#   hack/release.sh --push      # the workflow: also pushes the image (multi-arch) and the chart, signs the image
#
# Steps: (1) one version: pyproject.toml's, equal to the chart's version and appVersion (hack/generate.py writes
# them) and to the tag (GITHUB_REF_NAME) when there is one; (2) the operator image (hack/build-image.sh) as an OCI
# archive, multi-arch with --push; (2b) the endpoint picker image spec.gateway runs (hack/build-epp-image.sh), under
# its own pin (m3fleet.catalog.gateway.EPP_IMAGE: GIE's version + our filter's revision, not the operator's version),
# multi-arch with --push, signed like the operator's; (3) `helm package`; (4) the CLI's and the simulator's sdists and wheels
# (`python -m build`), `twine check`ed. PyPI is published by the workflow's own step (trusted publishing needs its OIDC token).
# Environment: M3FLEET_IMAGE_REPOSITORY (default ghcr.io/m3fleet/operator), M3FLEET_EPP_IMAGE (default the pin),
# M3FLEET_CHART_REPOSITORY (default
# oci://ghcr.io/m3fleet/charts), M3FLEET_PLATFORMS (with --push; default linux/amd64,linux/arm64),
# M3FLEET_BASE (debian or registry; default debian for --dry-run, registry for --push), PYTHON, HELM.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MODE=${1:-}
[[ $MODE == --dry-run || $MODE == --push ]] || { echo "usage: hack/release.sh --dry-run | --push" >&2; exit 2; }
log() { printf '[release %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
would() { log "dry run, would run: $*"; }
PYTHON=${PYTHON:-python3}
HELM=${HELM:-helm}
command -v "$HELM" >/dev/null || die "helm is not installed (set HELM=/path/to/helm)"
IMAGE_REPOSITORY=${M3FLEET_IMAGE_REPOSITORY:-ghcr.io/m3fleet/operator}
CHART_REPOSITORY=${M3FLEET_CHART_REPOSITORY:-oci://ghcr.io/m3fleet/charts}
DIST=dist
start=$(date +%s)

# (1) One version.
VERSION=$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
chart_field() { sed -n "s/^$1: *\"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" charts/m3fleet/Chart.yaml; }
[[ $(chart_field version) == "$VERSION" && $(chart_field appVersion) == "$VERSION" ]] \
  || die "charts/m3fleet/Chart.yaml says version $(chart_field version), appVersion $(chart_field appVersion); pyproject.toml says $VERSION: run python3 hack/generate.py"
if [[ ${GITHUB_REF_TYPE:-} == tag ]]; then
  [[ $GITHUB_REF_NAME == "v$VERSION" ]] || die "tag $GITHUB_REF_NAME does not match pyproject.toml's version $VERSION (tag v$VERSION)"
fi
log "version $VERSION"
rm -rf "$DIST" && mkdir -p "$DIST"

# (2) The image.
if [[ $MODE == --push ]]; then
  PLATFORMS=${M3FLEET_PLATFORMS:-linux/amd64,linux/arm64}
  BASE=${M3FLEET_BASE:-registry}
else
  PLATFORMS=${M3FLEET_PLATFORMS:-}
  BASE=${M3FLEET_BASE:-debian}
fi
TAG="$IMAGE_REPOSITORY:$VERSION"
archive=$(M3FLEET_IMAGE_REPOSITORY=$IMAGE_REPOSITORY bash hack/build-image.sh --base "$BASE" ${PLATFORMS:+--platform "$PLATFORMS"})
cp "$archive" "$DIST/m3fleet-operator-$VERSION.oci.tar"
BUILDAH=(buildah --root "${M3FLEET_IMAGE_CACHE:-$HOME/.cache/m3fleet/image}/storage"
  --runroot "${M3FLEET_IMAGE_CACHE:-$HOME/.cache/m3fleet/image}/run" --storage-driver vfs)
if [[ $MODE == --push ]]; then
  "${BUILDAH[@]}" manifest push --all --digestfile "$DIST/image.digest" "$TAG" "docker://$TAG"
  cosign sign --yes "$IMAGE_REPOSITORY@$(cat "$DIST/image.digest")"   # keyless: the workflow's OIDC identity
else
  would "buildah manifest push --all --digestfile $DIST/image.digest $TAG docker://$TAG"
  would "cosign sign --yes $IMAGE_REPOSITORY@<digest>"
fi

# (2b) The endpoint picker image. Its archive is not copied into dist/: the tag is the pin, pushed as is.
epp_archive=$(bash hack/build-epp-image.sh ${PLATFORMS:+--platform "$PLATFORMS"})
EPP_IMAGE=$(tar -xOf "$epp_archive" index.json | "$PYTHON" -c \
  'import json, sys; print(json.load(sys.stdin)["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"])')
if [[ $MODE == --push ]]; then
  "${BUILDAH[@]}" manifest push --all --digestfile "$DIST/epp-image.digest" "$EPP_IMAGE" "docker://$EPP_IMAGE"
  cosign sign --yes "${EPP_IMAGE%:*}@$(cat "$DIST/epp-image.digest")"
else
  would "buildah manifest push --all --digestfile $DIST/epp-image.digest $EPP_IMAGE docker://$EPP_IMAGE"
  would "cosign sign --yes ${EPP_IMAGE%:*}@<digest>"
fi

# (3) The chart.
"$HELM" package charts/m3fleet --destination "$DIST" >&2
chart="$DIST/m3fleet-$VERSION.tgz"
[[ -f $chart ]] || die "helm package wrote no $chart"
if [[ $MODE == --push ]]; then
  "$HELM" push "$chart" "$CHART_REPOSITORY" >&2
else
  would "helm push $chart $CHART_REPOSITORY"
fi

# (4) The CLI, and the simulator its extra `m3fleet[simulate]` installs (a distribution of its own, same version).
"$PYTHON" -m build --sdist --wheel --outdir "$DIST" . >&2
"$PYTHON" -m build --sdist --wheel --outdir "$DIST" simulator >&2
"$PYTHON" -m twine check --strict "$DIST/m3fleet-$VERSION.tar.gz" "$DIST/m3fleet-$VERSION-py3-none-any.whl" \
  "$DIST/m3fleet_simulator-$VERSION.tar.gz" "$DIST/m3fleet_simulator-$VERSION-py3-none-any.whl" >&2
[[ $MODE == --push ]] || would "pypa/gh-action-pypi-publish (trusted publishing) of $DIST/m3fleet-$VERSION* $DIST/m3fleet_simulator-$VERSION*"

log "done in $(( $(date +%s) - start ))s:"
ls -l "$DIST" >&2
