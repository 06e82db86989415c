"""examples/finetune.py against PyTorch: the same BERT cross-encoder, batches and AdamW settings
trained in torch (tests/fixtures/make_finetune.py) give the same 30 losses and step-0
gradients; the saved ONNX file runs in ONNX Runtime to Transmuter's logits."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import numpy as np
import onnxruntime
import pytest

import transmuter

ROOT = Path(__file__).resolve().parents[2]
TORCH_RUN = ROOT / "tests" / "fixtures" / "finetune" / "torch_run.npz"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("finetune", ROOT / "examples" / "finetune.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def torch_run():
    with np.load(TORCH_RUN) as stored:
        return dict(stored)


@pytest.mark.slow
def test_finetune_matches_pytorch_and_saves_for_onnxruntime(example, torch_run, tmp_path):
    model = transmuter.load(example.MODEL, trainable=True)
    data = example.batches()
    for k, batch in enumerate(data):  # the fixture was trained on these very batches
        for name, value in batch.items():
            np.testing.assert_array_equal(value, torch_run[f"batch{k}/{name}"])

    # Step-0 gradients: float32 programs that sum in different orders. Each tensor is held to
    # 1e-5 of its own largest gradient; the 1e-10 floor is for the attention key biases, whose
    # true gradient is 0 (softmax ignores a shift shared by all keys) and both runs give ~1e-12.
    with jax.enable_x64(True):  # int64 ids stay int64 through jit (see example.train)
        grads = jax.jit(jax.grad(lambda p: example.loss(p, model, data[0])))(model.params)
    assert set(grads) == {k.removeprefix("grad/") for k in torch_run if k.startswith("grad/")}
    for name, grad in grads.items():
        want = torch_run[f"grad/{name}"]
        np.testing.assert_allclose(
            grad, want, rtol=0, atol=1e-5 * np.abs(want).max() + 1e-10, err_msg=name
        )

    with jax.numpy_dtype_promotion("standard"):  # optax mixes Python floats and int32 counts
        params, losses = example.train(model, data)
    assert len(losses) == example.STEPS == 30
    np.testing.assert_allclose(losses, torch_run["losses"], rtol=1e-4)
    assert losses[-1] < 0.5 * losses[0]  # it learned something

    path = tmp_path / "tuned.onnx"
    transmuter.save(model, path, params=params)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    predict = example.predictor(model)
    for batch in data:
        theirs = session.run(["logits"], {name: batch[name] for name in model.inputs})[0]
        np.testing.assert_allclose(theirs, predict(params, batch), rtol=0, atol=1e-5)
