#!/usr/bin/env bash
# Build (or reuse) the two offline venvs the engine-parser test tier (tests/engine_parsers/) runs
# vLLM's and SGLang's own argument parsers in. Versions are pinned in each wheel's
# Requires-Dist; torch comes from PyPI with its CUDA libraries (see below), which import fine on a CPU.
# Cold: 5.5 GB per venv, about 4 GB of downloads, 3 min (idle 2 cores) to 6 min (busy) for both.
#
# Output contract (stdout carries ONLY these two lines; every log line goes to stderr):
#   VLLM_PY=/abs/path/to/vllm-venv/bin/python
#   SGLANG_PY=/abs/path/to/sglang-venv/bin/python
# The same two lines are written to "$ROOT/pythons.env", which tests/support/engines/runner.py reads.
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
# Everything comes from PyPI: a find-links directory (a machine's local wheels) could hand pip a different
# build of the same version, e.g. torch 2.14.0+cpu for torch==2.14.0, behind the content hash's back.
unset PIP_FIND_LINKS

# torch: the exact version each engine's wheel pins (Requires-Dist; the smoke import checks it). PyPI's
# Linux torch is the CUDA build. It runs on a CPU, but `import torch` loads libtorch_cuda.so, which links
# cuBLAS, cuDNN, NCCL & co.: torch alone (--no-deps) fails with "libcublasLt.so.*[0-9] not found". So the
# CUDA library wheels torch pins are installed too (3 GB per venv), minus what importing torch does not
# load: cuSOLVER (libtorch_cuda_linalg.so, loaded on first use), NVTX (optional), cuda-bindings, triton.
VLLM_TORCH=2.14.0  # vllm 0.33.0
SGL_TORCH=2.14.1   # sglang 0.5.23
# From torch 2.14.x's Requires-Dist (the same for both): cuda-toolkit[...]==13.0.3, nvidia-*-cu13.
TORCH_CUDA=('cuda-toolkit[cudart,cupti,cublas,nvrtc,cufft,curand,cusparse,nvjitlink,cufile]==13.0.3'
  nvidia-cudnn-cu13==9.24.0.43 nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7 nvidia-nvshmem-cu13==3.4.5)
# The smoke import also fails loudly when a version bump in versions.py leaves the torch pin behind.
torch_pin_check() {  # ENGINE VARIABLE
  printf '%s' "import importlib.metadata as md; t = 'torch==' + md.version('torch'); pins = [r.split(';')[0].replace(' ', '') for r in md.requires('$1')]; assert t in pins, f'$1 pins {[p for p in pins if p.startswith(\"torch\")]}, not {t}: update $2 in .ci/engine-envs.sh'"
}

# --no-deps on the engines: their Requires-Dist pulls flashinfer, the CUDA extensions, etc. The second
# lists are what the parse path really imports (found by iterating on ModuleNotFoundError, per the doc).
VLLM_NODEPS=("torch==$VLLM_TORCH" "vllm==$VLLM_VERSION" xgrammar==0.2.8 apache-tvm-ffi==0.1.11)
VLLM_DEPS=("${TORCH_CUDA[@]}" filelock typing-extensions 'setuptools>=77.0.3,<81' sympy networkx jinja2 fsspec
  packaging regex cachetools psutil numpy 'requests>=2.33.0' tqdm 'pydantic>=2.12.0' pyyaml msgspec
  'pyzmq>=25.0.0' cloudpickle cbor2 'transformers>=5.16.1,<5.21.0' 'aiohttp>=3.14.4' 'oss-harmony>=0.0.11'
  'openai>=2.25.0' 'pillow>=13.0.0' pybase64 uvloop py-cpuinfo 'fastapi>=0.133.0,<0.137.0' 'starlette>=1.0.1'
  'prometheus_client>=0.18.0' partial-json-parser 'llguidance>=1.7.0,<1.8.0' uvicorn watchfiles 'orjson>=3.11.6'
  einops)  # einops: `vllm bench serve` (m3fleet bench; tests/engine_parsers/test_bench_clients.py) imports it
VLLM_SMOKE="import torch, vllm, vllm.entrypoints.cli.main, vllm.benchmarks.serve; $(torch_pin_check vllm VLLM_TORCH)"
# triton only here (the version torch pins): sglang/srt/utils/common.py imports it at top level; vLLM's
# parse path does not.
# The second line of each SGLang list: what its benchmark client (`python3 -m sglang.benchmark.serving`, for
# m3fleet bench) imports beyond the parser, found the same way; torchvision is the release built for
# SGL_TORCH (change them together), the others as sglang's Requires-Dist pins them.
# The third lines: what SGLang's HTTP server (srt/entrypoints/http_server.py) imports beyond those, for
# tests/engine_parsers/test_key_guard.py, which serves SGLang's own FastAPI app on a CPU; pins as sglang's Requires-Dist
# (fastapi: the range vLLM pins; later releases import opentelemetry).
SGL_NODEPS=("torch==$SGL_TORCH" "sglang==$SGLANG_VERSION" triton==3.8.0
  torchvision==0.29.2 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0
  xgrammar==0.2.7)
SGL_DEPS=("${TORCH_CUDA[@]}" filelock typing-extensions 'setuptools>=77.0.3' sympy networkx jinja2 fsspec
  numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic 'pyzmq>=25.1.2' tqdm IPython aiohttp
  transformers==5.19.0 datasets sentencepiece gguf loguru
  'fastapi>=0.133.0,<0.137.0' 'uvicorn>=0.51' uvloop python-multipart 'prometheus-client>=0.20.0' openai==2.8.0
  partial_json_parser setproctitle einops jsonschema soundfile==0.13.1)
SGL_SMOKE="import torch, triton, sglang, sglang.benchmark.serving, sglang.srt.entrypoints.http_server; $(torch_pin_check sglang SGL_TORCH)"

mkdir -p "$ROOT"
exec 9>"$ROOT/.lock" && flock 9   # two concurrent runs must not build the same env twice
# A SIGKILLed build cannot run its EXIT trap; sweep its leftovers (we hold the lock, nobody else builds).
find "$ROOT" -maxdepth 1 -name '.build-*' -exec rm -rf {} +

# pip install into a venv, minus the noise it prints on every run: the dependency-conflict report (the
# engines' own Requires-Dist is deliberately not installed).
pip_install() {  # PYTHON ARGS...
  # Always "python -m pip": console-script shebangs hold the temp path and break after the rename.
  "$1" -m pip install --progress-bar off -q "${@:2}" 2>&1 |
    { grep -vE "^ERROR: pip's dependency resolver| which is (not installed|incompatible)\.$" || true; }
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
  # A complete env passed its smoke import when it was built (.complete is written after it, and the env moved into
  # place atomically). On reuse only its interpreter and distributions are checked: the full import (torch and the
  # engine, 30-60 s) sat on every CI run's critical path, and the engine-parser tier imports both engines anyway.
  if [[ -f $dir/.complete ]]; then
    t0=$(now)
    if "$dir/bin/python" -c "import importlib.metadata as md; [md.version(d) for d in ('torch', '$name'.split('-')[0])]" \
      >/dev/null 2>&1; then
      log "$name: reusing $dir (interpreter and distributions checked $(since "$t0"))"
      BUILT_PY=$dir/bin/python; return
    fi
    log "$name: $dir fails its check, rebuilding"
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
