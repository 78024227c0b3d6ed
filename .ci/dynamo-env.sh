#!/usr/bin/env bash
# Build (or reuse) the offline venv with the pinned NVIDIA Dynamo release that two test tiers run for real:
# tests/engine_parsers/test_dynamo_parsers.py (Dynamo's own argument parsers on every rendered Dynamo command)
# and tests/cluster/test_dynamo_run.py (the rendered frontend, prefill and decode commands started on loopback,
# dynamo.mocker standing in for the GPU engine). No engine (TensorRT-LLM, vLLM, SGLang) and no torch: the
# frontend, the KV router, the mocker and the Rust runtime need none. Cold: ~700 MB, 1-7 min (mostly downloads);
# a second when reused.
#
# Both wheels come with --no-deps, then their requirements by hand: ai-dynamo requires `aisimulate`, a PyPI stub
# that refuses to install (the planner's simulation estimator imports it; nothing run here does).
#
# Output contract (stdout carries ONLY this line; every log line goes to stderr):
#   DYNAMO_PY=/abs/path/to/dynamo-venv/bin/python
# The same line is written to "$ROOT/python.env", which tests/support/dynamo/env.py reads.
# Usage: bash .ci/dynamo-env.sh         (ROOT = ${M3FLEET_DYNAMO_ENV:-$HOME/.cache/m3fleet/dynamo})
set -euo pipefail
ROOT=$(realpath -m "${M3FLEET_DYNAMO_ENV:-$HOME/.cache/m3fleet/dynamo}")  # before the cd
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec 3>&1 1>&2

PY=${PYTHON:-python3}
log() { printf '[dynamo-env] %s\n' "$*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }

VERSION=$("$PY" tests/support/dynamo/pinned.py)  # the release the operator renders (the catalog's DYNAMO_VERSION)
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
unset PIP_FIND_LINKS  # PyPI only: a machine's local wheel directory could hand pip another build

NODEPS=("ai-dynamo==$VERSION" "ai-dynamo-runtime==$VERSION")
# ai-dynamo-runtime's and ai-dynamo's Requires-Dist (minus aisimulate), with their ranges.
DEPS=('pydantic>=2.10.6,<=2.13.5' 'uvloop>=0.21.0' 'aiohttp>=3.14.3,<4.0' 'certifi>=2026.10.19'
  'kubernetes>=32.0.1,<33.0.0' 'msgspec>=0.19.0' 'prometheus-client>=0.23.1,<1.0' 'pyzmq>=26.0.0'
  'redis>=6.2.0,<9.0.0' 'tqdm>=4.0.0' 'transformers>=4.56.0' 'typing-extensions>=4.10.0' 'zstandard>=0.23.0,<1.0')
# What the tests run: the frontend, the mocker (both import the Rust runtime, dynamo._core) and the parsers.
SMOKE="import importlib.metadata as md, dynamo._core, dynamo.frontend.main, dynamo.mocker.main, tokenizers
assert md.version('ai-dynamo') == '$VERSION', md.version('ai-dynamo')"

mkdir -p "$ROOT"
exec 9>"$ROOT/.lock" && flock 9   # two concurrent runs must not build the same env twice
find "$ROOT" -maxdepth 1 -name '.build-*' -exec rm -rf {} +   # a SIGKILLed build's leftovers

pip_install() {  # PYTHON ARGS...   (the resolver's complaint about the left-out aisimulate is expected)
  "$1" -m pip install --progress-bar off -q "${@:2}" 2>&1 |
    { grep -vE "^ERROR: pip's dependency resolver|which is (not installed|incompatible)\.$" || true; }
}

# The directory name carries a hash of exactly what gets installed, so editing a list rebuilds.
HASH=$(printf '%s\n' "py$PYVER" "${NODEPS[@]}" -- "${DEPS[@]}" | sha256sum | cut -c1-12)
DIR="$ROOT/dynamo-$VERSION-$HASH"
t0=$(now)
if [[ -f $DIR/.complete ]] && "$DIR/bin/python" -c "$SMOKE" >/dev/null 2>&1; then
  log "reusing $DIR (smoke import $(since "$t0"))"
else
  rm -rf "$DIR"
  TMP=$(mktemp -d "$ROOT/.build-XXXXXX")
  trap 'rm -rf "$TMP"' EXIT
  chmod 755 "$TMP"
  "$PY" -m venv "$TMP"
  pip_install "$TMP/bin/python" --no-deps "${NODEPS[@]}"
  log "--no-deps install (${NODEPS[*]}) $(since "$t0")"
  pip_install "$TMP/bin/python" "${DEPS[@]}"
  log "dependency install $(since "$t0")"
  "$TMP/bin/python" -c "$SMOKE"
  touch "$TMP/.complete"
  # A venv's scripts hold its path; the tests run `python -m ...`, which does not care about the rename.
  mv -T "$TMP" "$DIR"
  trap - EXIT
  log "built $DIR in $(since "$t0")"
fi
printf 'DYNAMO_PY=%s\n' "$DIR/bin/python" > "$ROOT/python.env.tmp"
mv "$ROOT/python.env.tmp" "$ROOT/python.env"
cat "$ROOT/python.env" >&3
