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
from model_gradients import VMAP

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
def test_gradients_with_x64_off():
    """One subprocess measures every model in turn, so that JAX's import and the compiles the
    models share are paid once (and a work-stealing run cannot split it over two workers)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *MODELS],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    all_measures = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(all_measures) == sorted(MODELS)
    for name, measures in all_measures.items():
        where = (name, measures)
        assert measures["dtypes"] == ["float32"], where
        # Eager, jitted and under x64: the same float32 gradient up to rounding.
        assert measures["jit"] < 1e-5, where
        assert measures["x64"] < 1e-5, where
        # Per example: measured on the models model_gradients.VMAP names (see there for why).
        if name in VMAP:
            assert measures["vmap"] < 1e-5, where
        # Against float64 differences: float32's own accuracy through the model.
        assert measures["fd"] < 1e-4, where
