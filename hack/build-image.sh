#!/usr/bin/env bash
# Build the operator image from operator/Dockerfile with buildah: no daemon, no Docker.
#
#   hack/build-image.sh                      # base made from Debian packages (mmdebstrap): no registry needed
#   hack/build-image.sh --base registry      # the Dockerfile's own base (python:3.11-slim), where a registry is reachable
#   hack/build-image.sh --platform linux/amd64,linux/arm64   # multi-arch manifest list (needs qemu-user binfmt
#                                                             # for the foreign architecture's RUN steps)
#
# Cached under $M3FLEET_IMAGE_CACHE (default ~/.cache/m3fleet/image), keyed by every input (the build context
# .dockerignore admits, the Dockerfile, this script, base and platforms): a second run with nothing changed takes
# a second. The base rootfs is cached by its own key (suite + packages). The image is written as an OCI archive,
# what `ctr -n k8s.io images import`, `kind load image-archive` or `skopeo copy` take (docs/install.md).
# OCI labels: source, version (pyproject.toml's, the one version), revision (git HEAD, "+dirty" for local edits).
#
# stdout carries exactly one line, the OCI archive's path; progress, size and build time go to stderr.
set -euo pipefail
shopt -s inherit_errexit   # a failure inside $(...) (the base's mmdebstrap) fails the build
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec 3>&1 1>&2

BASE=debian
PLATFORMS=""
usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --base) BASE=${2:?--base needs debian or registry}; shift 2 ;;
    --platform) PLATFORMS=${2:?--platform needs a list like linux/amd64,linux/arm64}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)"; exit 2 ;;
  esac
done
[[ $BASE == debian || $BASE == registry ]] || { echo "error: --base $BASE: use debian or registry"; exit 2; }

log() { printf '[build-image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
for tool in buildah git python3; do
  command -v $tool >/dev/null || die "$tool is not installed (apt-get install buildah)"
done
[[ $BASE == registry ]] || command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (apt-get install mmdebstrap)"
[[ $BASE == registry || ${PLATFORMS:-} != *,* ]] || command -v arch-test >/dev/null \
  || die "a foreign architecture's Debian base needs arch-test and qemu-user-static (apt-get install arch-test qemu-user-static)"

CACHE=$(realpath -m "${M3FLEET_IMAGE_CACHE:-$HOME/.cache/m3fleet/image}")
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock" && flock 9   # two runs must not build (or prune) at once
# Storage of its own, vfs: no overlay mounts or fuse needed, and nothing lands in the machine's default storage.
BUILDAH=(buildah --root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver vfs)
export BUILDAH_ISOLATION=chroot   # RUN steps in a chroot: no runc namespaces needed (works in CI containers)

VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
# The revision the image's sources are from: the last commit that changed them (so a commit elsewhere in the
# repository reuses the cached image), "+dirty" with local edits.
INPUTS=(operator pyproject.toml README.md .dockerignore)
REVISION=$(git log -1 --format=%H -- "${INPUTS[@]}" 2>/dev/null || true)
REVISION=${REVISION:-unknown}
[[ -z $(git status --porcelain -- "${INPUTS[@]}" 2>/dev/null) ]] || REVISION+="+dirty"
SOURCE_EPOCH=$(git log -1 --format=%ct -- "${INPUTS[@]}" 2>/dev/null || true)
SOURCE=${M3FLEET_IMAGE_SOURCE:-https://github.com/m3fleet/m3fleet}
ARCHES=${PLATFORMS:-linux/$(buildah info --format '{{.host.arch}}' 2>/dev/null || dpkg --print-architecture)}

# --- the base: Debian bookworm's python3.11 as a rootfs, made from Debian packages ---------------------------
BASE_PACKAGES="python3,python3-venv,python-is-python3,ca-certificates"
base_ref() {  # $1: linux/<arch>; the base image for it, built once per key
  local arch=${1#linux/} key tar sources
  key=$(printf '%s\n' bookworm "$BASE_PACKAGES" "$arch" | sha256sum | cut -c1-16)
  tar="$CACHE/base-bookworm-$arch-$key.tar"
  if [[ ! -s $tar ]]; then
    # The machine's own apt sources (whatever mirror it uses); debian.sources or the classic sources.list.
    sources=/etc/apt/sources.list.d/debian.sources
    [[ -f $sources ]] || sources=/etc/apt/sources.list
    log "base: mmdebstrap bookworm ($arch) with $BASE_PACKAGES"
    mmdebstrap --quiet --format=tar --variant=minbase --arch="$arch" --include="$BASE_PACKAGES" \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' bookworm "$tar.part" "$sources" >&2
    mv "$tar.part" "$tar"
  fi
  local ref="localhost/m3fleet-base:bookworm-$arch-$key"
  if ! "${BUILDAH[@]}" inspect --type image "$ref" >/dev/null 2>&1; then
    local container
    container=$("${BUILDAH[@]}" from --arch "$arch" scratch)
    "${BUILDAH[@]}" add --quiet "$container" "$tar" / >/dev/null
    "${BUILDAH[@]}" config --arch "$arch" --os linux --env PATH=/usr/local/bin:/usr/bin:/bin \
      --env LANG=C.UTF-8 --cmd python3 "$container"
    "${BUILDAH[@]}" commit --quiet --rm "$container" "$ref" >/dev/null
  fi
  echo "$ref"
}

# Named as the chart pulls it (values.yaml image.repository, tag = appVersion = this version): an archive imported
# into a node's containerd is what the chart's default values run, with no registry.
IMAGE="${M3FLEET_IMAGE_REPOSITORY:-ghcr.io/m3fleet/operator}:$VERSION"

# --- the cache key: every input of the build -----------------------------------------------------------------
context_files() {  # what .dockerignore admits: the Dockerfile copies pyproject.toml, README.md and operator/
  git ls-files --cached --others --exclude-standard -- "${INPUTS[@]}" \
    | grep -v -e '__pycache__' -e '\.pyc$' -e '\.egg-info/' -e '^operator/Dockerfile$' | sort
}
KEY=$(
  {
    for path in $(context_files) operator/Dockerfile hack/build-image.sh; do
      [[ -f $path ]] && printf '%s %s\n' "$path" "$(sha256sum < "$path" | cut -c1-64)"
    done
    echo "base=$BASE platforms=$ARCHES revision=$REVISION image=$IMAGE"
  } | sha256sum | cut -c1-16
)
ARCH_SET=$(sed 's|linux/||g; s|,|+|g' <<<"$ARCHES")
NAME="m3fleet-operator-$VERSION-$ARCH_SET-$KEY"
ARCHIVE="$CACHE/$NAME.oci.tar"

if [[ -s $ARCHIVE ]]; then
  log "reusing $ARCHIVE (inputs unchanged, key $KEY)"
else
  start=$(date +%s)
  labels=(
    --label "org.opencontainers.image.source=$SOURCE"
    --label "org.opencontainers.image.version=$VERSION"
    --label "org.opencontainers.image.revision=$REVISION"
    --label "org.opencontainers.image.title=m3fleet-operator"
    --label "org.opencontainers.image.licenses=Apache-2.0"
  )
  "${BUILDAH[@]}" manifest rm "$IMAGE" >/dev/null 2>&1 || "${BUILDAH[@]}" rmi -f "$IMAGE" >/dev/null 2>&1 || true
  "${BUILDAH[@]}" manifest create "$IMAGE" >/dev/null
  # The machine's own pip settings (an index mirror, a proxy's CA: PIP_CERT, /etc/pip.conf) reach pip in the RUN
  # steps as read-only bind mounts, never stored in the image.
  build_mounts=()
  [[ -f /etc/pip.conf ]] && build_mounts+=(--volume /etc/pip.conf:/etc/pip.conf:ro)
  [[ -n ${PIP_CERT:-} && -f ${PIP_CERT:-} ]] && build_mounts+=(--volume "$PIP_CERT:$PIP_CERT:ro")
  IFS=, read -r -a platform_list <<<"$ARCHES"
  for platform in "${platform_list[@]}"; do
    if [[ $BASE == debian ]]; then
      base=$(base_ref "$platform")
    else  # the Dockerfile's default, fully qualified (buildah refuses short names where none is configured)
      base=$(sed -n 's/^ARG PYTHON_IMAGE=//p' operator/Dockerfile)
      [[ $base == */* ]] || base="docker.io/library/$base"
    fi
    log "building $IMAGE for $platform (base: $BASE)"
    "${BUILDAH[@]}" build --quiet --isolation chroot --platform "$platform" --manifest "$IMAGE" \
      --layers=false --timestamp "${SOURCE_EPOCH:-$(date +%s)}" \
      --build-arg "PYTHON_IMAGE=$base" "${build_mounts[@]}" "${labels[@]}" -f operator/Dockerfile . >/dev/null
  done
  # One archive per key: older ones of this version go (they are what an earlier checkout built).
  rm -f "$CACHE"/m3fleet-operator-"$VERSION"-"$ARCH_SET"-*.oci.tar
  "${BUILDAH[@]}" manifest push --quiet --all "$IMAGE" "oci-archive:$ARCHIVE.part:$IMAGE" >/dev/null
  mv "$ARCHIVE.part" "$ARCHIVE"
  "${BUILDAH[@]}" rmi --prune >/dev/null 2>&1 || true   # the build stage's leftovers (vfs keeps full copies)
  log "built in $(( $(date +%s) - start ))s"
fi
log "image $IMAGE ($ARCHES), version $VERSION, revision $REVISION"
log "size: $(du -h "$ARCHIVE" | cut -f1) compressed ($ARCHIVE)"
echo "$ARCHIVE" >&3
