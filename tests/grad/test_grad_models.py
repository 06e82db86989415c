"""jax.grad, jax.jit and jax.vmap of `transmuter.run` on every fixture model with float params,
in a process with JAX's default settings (x64 off), as a user's training loop runs them
(model_gradients.py says what is measured)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("model_gradients.py")
MODELS = [
    "bert",
    "gpt2",
    "t5_encoder",
    "vit",
    "resnet",
    "whisper_encoder",
    "whisper_decoder",
    "llama",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_gradients_with_x64_off(name):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), name], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    measures = json.loads(done.stdout.strip().splitlines()[-1])
    assert measures["dtypes"] == ["float32"]
    # Eager, jitted, per example and under x64: the same float32 gradient up to rounding.
    assert measures["jit"] < 1e-5, measures
    assert measures["x64"] < 1e-5, measures
    assert measures["vmap"] < 1e-5, measures
    # Against float64 differences: float32's own accuracy through the model.
    assert measures["fd"] < 1e-4, measures
