#!/usr/bin/env bash
# Build (or reuse) the two offline venvs the engine-parser test tier (tests/engine_parsers/) runs
# vLLM's and SGLang's own argument parsers in. Recipe and reasoning: shared/docs/engine-argparse.md §1.
#
# Output contract (stdout carries ONLY these two lines; every log line goes to stderr):
#   VLLM_PY=/abs/path/to/vllm-venv/bin/python
#   SGLANG_PY=/abs/path/to/sglang-venv/bin/python
# The same two lines are written to "$ROOT/pythons.env", which tests/engine_parsers/runner.py reads.
# Usage: bash .ci/engine-envs.sh            (ROOT = ${M3FLEET_ENGINE_ENVS:-$HOME/.cache/m3fleet/engine-envs})
set -euo pipefail
ROOT=$(realpath -m "${M3FLEET_ENGINE_ENVS:-$HOME/.cache/m3fleet/engine-envs}")  # before the cd
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec 3>&1 1>&2   # keep stdout for the two result lines; pip & co. print to stderr

PY=${PYTHON:-python3}
log() { printf '[engine-envs] %s\n' "$*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
pinned() { "$PY" -c 'import runpy, sys; print(runpy.run_path("operator/m3fleet/catalog/versions.py")[sys.argv[1]])' "$1"; }

VLLM_VERSION=$(pinned VLLM_VERSION)
SGLANG_VERSION=$(pinned SGLANG_VERSION)
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# The +cpu local wheel comes from pip's find-links (/opt/wheels). PyPI only has the CUDA build, which
# would not import without the nvidia-* wheels, so fail loudly instead of falling back to it.
TORCH='torch==2.13.0+cpu'

# --no-deps on the engines: their Requires-Dist pulls CUDA torch, flashinfer, etc. The second lists are
# what the parse path really imports (found by iterating on ModuleNotFoundError, per the doc).
VLLM_NODEPS=("$TORCH" "vllm==$VLLM_VERSION" xgrammar==0.2.8 apache-tvm-ffi==0.1.11)
VLLM_DEPS=(filelock typing-extensions 'setuptools>=77.0.3,<81' sympy networkx jinja2 fsspec
  packaging regex cachetools psutil numpy 'requests>=2.33.0' tqdm 'pydantic>=2.12.0' pyyaml msgspec
  'pyzmq>=25.0.0' cloudpickle cbor2 'transformers>=5.16.1,<5.21.0' 'aiohttp>=3.14.4' 'oss-harmony>=0.0.11'
  'openai>=2.25.0' 'pillow>=13.0.0' pybase64 uvloop py-cpuinfo 'fastapi>=0.133.0,<0.137.0' 'starlette>=1.0.1'
  'prometheus_client>=0.18.0' partial-json-parser 'llguidance>=1.7.0,<1.8.0' uvicorn watchfiles 'orjson>=3.11.6')
VLLM_SMOKE='import torch, vllm, vllm.entrypoints.cli.main'
# triton only here: sglang/srt/utils/common.py imports it at top level; vLLM's parse path does not.
SGL_NODEPS=("$TORCH" "sglang==$SGLANG_VERSION" triton==3.9.0)
SGL_DEPS=(filelock typing-extensions 'setuptools>=77.0.3' sympy networkx jinja2 fsspec
  numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic 'pyzmq>=25.1.2' tqdm IPython aiohttp)
SGL_SMOKE='import torch, triton, sglang'

mkdir -p "$ROOT"
exec 9>"$ROOT/.lock" && flock 9   # two concurrent runs must not build the same env twice
# A SIGKILLed build cannot run its EXIT trap; sweep its leftovers (we hold the lock, nobody else builds).
find "$ROOT" -maxdepth 1 -name '.build-*' -exec rm -rf {} +

# pip install into a venv, minus the noise it prints on every run here: the dependency-conflict report (the
# engines' own Requires-Dist is deliberately not installed) and the local extra-index's misses.
pip_install() {  # PYTHON ARGS...
  # Always "python -m pip": console-script shebangs hold the temp path and break after the rename.
  "$1" -m pip install --progress-bar off -q "${@:2}" 2>&1 |
    { grep -vE "^WARNING: Location '.*' is ignored|^ERROR: pip's dependency resolver| which is (not installed|incompatible)\.$" || true; }
}

# build_env NAME SMOKE -- NODEPS... -- DEPS...   -> sets BUILT_PY to the env's python
BUILT_PY='' BUILD_TMP=''
trap 'if [[ -n $BUILD_TMP ]]; then rm -rf "$BUILD_TMP"; fi' EXIT
build_env() {
  local name=$1 smoke=$2; shift 3
  local nodeps=() deps=()
  while [[ $1 != -- ]]; do nodeps+=("$1"); shift; done; shift
  deps=("$@")
  # The directory name carries a hash of exactly what gets installed, so editing a list rebuilds.
  local hash dir tmp t0 t
  hash=$(printf '%s\n' "py$PYVER" "${nodeps[@]}" -- "${deps[@]}" | sha256sum | cut -c1-12)
  dir="$ROOT/$name-$hash"
  if [[ -f $dir/.complete ]]; then
    t0=$(now)
    if env VLLM_TARGET_DEVICE=cpu "$dir/bin/python" -c "$smoke" >/dev/null 2>&1; then
      log "$name: reusing $dir (smoke import $(since "$t0"))"
      BUILT_PY=$dir/bin/python; return
    fi
    log "$name: $dir fails its smoke import, rebuilding"
  fi
  rm -rf "$dir"
  tmp=$(mktemp -d "$ROOT/.build-$name-XXXXXX"); BUILD_TMP=$tmp
  t0=$(now); t=$t0
  chmod 755 "$tmp"   # mktemp makes it 0700
  "$PY" -m venv "$tmp"
  log "$name: venv $(since "$t")"; t=$(now)
  pip_install "$tmp/bin/python" --no-deps "${nodeps[@]}"
  log "$name: --no-deps install (${nodeps[*]}) $(since "$t")"; t=$(now)
  pip_install "$tmp/bin/python" "${deps[@]}"
  log "$name: dependency install $(since "$t")"; t=$(now)
  env VLLM_TARGET_DEVICE=cpu "$tmp/bin/python" -c "$smoke"
  log "$name: smoke import $(since "$t")"
  touch "$tmp/.complete"
  mv -T "$tmp" "$dir"   # atomic: a killed build never leaves a half env under the final name
  BUILD_TMP=''
  log "$name: built $dir in $(since "$t0")"
  BUILT_PY=$dir/bin/python
}

t_all=$(now)
build_env "vllm-$VLLM_VERSION" "$VLLM_SMOKE" -- "${VLLM_NODEPS[@]}" -- "${VLLM_DEPS[@]}"
VLLM_PY=$BUILT_PY
build_env "sglang-$SGLANG_VERSION" "$SGL_SMOKE" -- "${SGL_NODEPS[@]}" -- "${SGL_DEPS[@]}"
SGLANG_PY=$BUILT_PY
printf 'VLLM_PY=%s\nSGLANG_PY=%s\n' "$VLLM_PY" "$SGLANG_PY" > "$ROOT/pythons.env.tmp"
mv "$ROOT/pythons.env.tmp" "$ROOT/pythons.env"
log "total $(since "$t_all"); interpreters recorded in $ROOT/pythons.env"
cat "$ROOT/pythons.env" >&3
