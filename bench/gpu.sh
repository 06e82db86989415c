#!/usr/bin/env bash
# Benchmarks on a machine with an NVIDIA GPU, from a fresh clone:
#   bash bench/gpu.sh [OUT_DIR]
# Installs Transmuter with jax's CUDA plugin and onnxruntime-gpu into .venv-gpu, checks that both
# see the GPU, then writes JSON results to OUT_DIR (default bench/gpu-results):
#   models.json    bench_models.py: every fixture model, Transmuter on the GPU against ONNX
#                  Runtime (bench_models.py asks ORT for its CPU provider);
#   cases.json     bench_cases.py --ort-provider cuda: issue 13's cases (MiniLM, ResNet-50, a
#                  GPT-2 decode step, ...) against ONNX Runtime's CUDA provider; the model
#                  files come from bench/make_minilm.py and bench/make_cases.py (torch), made
#                  here when torch imports, and a missing one is skipped with a note;
#   sharding.json  bench_sharding.py --throughput: rows/s data-parallel over 1, 2, 4, ...
#                  GPUs (all the machine has), against ONNX Runtime's CUDA provider; MiniLM
#                  when bench/make_minilm.py has made it (needs torch), else the BERT fixture.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench/gpu-results}"
mkdir -p "$out"

python3 -m venv .venv-gpu
. .venv-gpu/bin/activate
# JAX's CUDA 13 plugin where the driver supports CUDA 13, else its CUDA 12 one.
cuda=$(nvidia-smi | grep -o 'CUDA Version: [0-9]*' | grep -o '[0-9]*$')
extra=$([ "${cuda:-0}" -ge 13 ] && echo cuda13 || echo cuda12)
# Not the test extra: its onnxruntime (CPU) would shadow onnxruntime-gpu, one import name.
pip install -e ".[$extra]" 'onnxruntime-gpu>=1.31'

python - <<'PY'
import jax, onnxruntime
assert jax.default_backend() == "gpu", f"jax sees no GPU: {jax.devices()}"
assert "CUDAExecutionProvider" in onnxruntime.get_available_providers(), "no ORT CUDA provider"
print(f"jax {jax.__version__}: {jax.devices()}; onnxruntime {onnxruntime.__version__}")
PY

export JAX_PLATFORMS=cuda  # bench_models.py defaults to the CPU otherwise
if python -c 'import torch, transformers' 2>/dev/null; then
    python bench/make_minilm.py && python bench/make_cases.py
fi
python bench/bench_models.py --json "$out/models.json"
python bench/bench_cases.py --ort-provider cuda --json "$out/cases.json"
python bench/bench_sharding.py --throughput --json "$out/sharding.json"
