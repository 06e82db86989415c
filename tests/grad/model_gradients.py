"""Gradients of a fixture model in a process with JAX's default settings (x64 off), as a user's
training loop takes them: `python model_gradients.py NAME...` prints one JSON line mapping each
name to its measures. One process measures the models in turn, so JAX's import and the compiles
the models share are paid once.

The loss is sum_k sum(output_k * r_k) over the float outputs (r_k fixed random arrays), of the
params, at the fixture's stored inputs. Measures, each a relative error:
- "jit": `jax.jit(jax.grad(loss))` against eager `jax.grad(loss)`, both with x64 off;
- "x64": jitted with x64 off against jitted inside `jax.enable_x64(True)`;
- "fd": the gradient along a random unit direction d against the central difference
  (L(p + h d) - L(p - h d)) / 2h of the model's float64 copy (h = 1e-5): float32 differences
  would be swamped by rounding, and a larger h crosses kinks (ReLU, max-pooling: ResNet's
  difference is off by 15% at h = 1e-3);
- "vmap": per-example gradients by `jax.vmap(jax.grad(loss))` over a batch of two inputs,
  against each example's own gradient; measured only for the models in VMAP (see there).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from grad_harness import retyped

import transmuter

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "models"
# vmap batches transmuter.run the same way on every model (the interpreter's ops see one more
# leading axis); BERT (integer ids through Gather, attention masks) and ResNet (float images
# through Conv and pooling) cover both kinds of input and the op families batching could break.
VMAP = {"bert", "resnet"}


def stored_inputs(name: str, model: transmuter.Model, case: int) -> dict:
    stored = np.load(FIXTURES / f"{name}.npz")
    return {n: stored[f"case{case}/in/{n}"] for n in model.inputs}


def scalar_loss(model: transmuter.Model, inputs: dict, dtype=np.float32):
    outputs = jax.eval_shape(lambda x: transmuter.run(model, x), inputs)
    rng = np.random.default_rng(0)
    readout = {
        n: rng.uniform(0.5, 1.5, v.shape).astype(dtype)
        for n, v in outputs.items()
        if jnp.issubdtype(v.dtype, jnp.floating)
    }

    def loss(params, x):
        out = transmuter.run(model, x, params=params)
        return sum(jnp.sum(out[n].astype(dtype) * r) for n, r in readout.items())

    return loss


def relative(got, want) -> float:
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    scale = max(float(np.max(np.abs(w))) for w in want)
    return max(float(np.max(np.abs(np.asarray(g) - np.asarray(w)))) for g, w in zip(got, want)) / (
        scale or 1.0
    )


def measure(name: str) -> dict:
    assert not jax.config.jax_enable_x64, "run this with JAX's default settings"
    model = transmuter.load(str(FIXTURES / f"{name}.onnx"), trainable=True)
    inputs = stored_inputs(name, model, 0)
    loss = scalar_loss(model, inputs)
    params = model.params
    grad = jax.grad(loss)

    eager = grad(params, inputs)
    jitted = jax.jit(grad)
    with jax.enable_x64(True):
        under_x64 = jax.jit(grad)(params, inputs)

    rng = np.random.default_rng(1)
    direction = jax.tree.map(lambda p: rng.standard_normal(p.shape).astype(np.float32), params)
    norm = np.sqrt(sum(float(np.sum(d * d)) for d in jax.tree.leaves(direction)))
    direction = jax.tree.map(lambda d: d / norm, direction)
    along = sum(
        float(np.sum(g * d)) for g, d in zip(jax.tree.leaves(eager), jax.tree.leaves(direction))
    )
    finite = float64_difference(name, direction)
    fd = abs(along - finite) / max(abs(finite), 1e-3)

    measures = {
        "jit": relative(jitted(params, inputs), eager),
        "x64": relative(jitted(params, inputs), under_x64),
        "fd": fd,
        "dtypes": sorted({str(g.dtype) for g in jax.tree.leaves(eager)}),
    }
    if name not in VMAP:
        return measures
    # Two examples: the stored inputs and, for the second, float inputs scaled and integer ids
    # rolled (in the table still), stacked along a new leading axis.
    other = {
        n: np.roll(v, 1, axis=-1) if v.dtype.kind in "iu" else (v * 0.5).astype(v.dtype)
        for n, v in inputs.items()
    }
    batch = {n: np.stack([inputs[n], other[n]]) for n in inputs}
    per_example = jax.jit(jax.vmap(grad, in_axes=(None, 0)))(params, batch)
    separately = jax.tree.map(
        lambda a, b: np.stack([a, b]), jitted(params, inputs), jitted(params, other)
    )
    measures["vmap"] = relative(per_example, separately)
    return measures


def float64_difference(name: str, direction: dict, h: float = 1e-5) -> float:
    """(L(p + h d) - L(p - h d)) / 2h on the model's float64 copy."""
    double, single = onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT
    with jax.enable_x64(True):
        model = transmuter.load(
            retyped(onnx.load(FIXTURES / f"{name}.onnx"), single, double), trainable=True
        )
        inputs = {
            n: v.astype(np.float64) if v.dtype == np.float32 else v
            for n, v in stored_inputs(name, model, 0).items()
        }
        at = jax.jit(scalar_loss(model, inputs, np.float64))
        params = jax.tree.map(lambda p: np.asarray(p, np.float64), model.params)

        def shifted(sign):
            return {n: p + sign * h * direction[n].astype(np.float64) for n, p in params.items()}

        return (float(at(shifted(1), inputs)) - float(at(shifted(-1), inputs))) / (2 * h)


if __name__ == "__main__":
    print(json.dumps({name: measure(name) for name in sys.argv[1:]}))
