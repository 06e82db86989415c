"""The ai.onnx.preview.training domain: the optimizer steps Adagrad, Adam and Momentum, and
Gradient.

Each takes the learning rate R, the update count T, then its tensors grouped by role (all the
values X_1..X_n, then all their gradients, then each kind of optimizer state) and returns the new
values followed by the new states, grouped the same way. The update is element-wise, so several
tensors are updated independently with the same formulas (the spec's "concatenation" view).
Scalar factors that depend on T are computed in float64 and cast to each tensor's type once.

Gradient-1 differentiates a part of the enclosing graph named by its attributes: the runtime
recomputes y from the values fed for xs and zs (`OpContext.recompute`), and JAX differentiates
that recomputation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transmuter.errors import ShapeError
from transmuter.lowering import op

TRAINING = "ai.onnx.preview.training"


def _groups(op_type: str, inputs: tuple, kinds: tuple[str, ...]) -> list[tuple]:
    """Split the variadic inputs into one tuple per optimized tensor, in `kinds` order."""
    if not inputs or len(inputs) % len(kinds):
        raise ShapeError(
            f"{op_type}: after R and T the inputs must be {len(kinds)} groups of equal size "
            f"({', '.join(kinds)}), got {len(inputs)} tensors"
        )
    n = len(inputs) // len(kinds)
    return [tuple(jnp.asarray(inputs[k * n + i]) for k in range(len(kinds))) for i in range(n)]


def _scalar(op_type: str, name: str, value):
    value = jnp.asarray(value)
    if value.size != 1:
        raise ShapeError(f"{op_type}: {name} must be a scalar, got shape {list(value.shape)}")
    return value.reshape(())


def _outputs(per_tensor: list[tuple]) -> tuple:
    """Per-tensor results (X_new, state_new, ...) regrouped by kind: all X_new first."""
    return tuple(result for kind in zip(*per_tensor) for result in kind)


@op("Adagrad", since=1, domain=TRAINING)
def adagrad(R, T, *inputs, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
    """ONNX-training Adagrad-1: inputs X..., G..., H...; outputs X_new..., H_new..."""
    r = _scalar("Adagrad", "R", R).astype(jnp.float64)
    t = _scalar("Adagrad", "T", T).astype(jnp.float64)
    rate = r / (1 + t * decay_factor)
    results = []
    for x, g, h in _groups("Adagrad", inputs, ("X", "G", "H")):
        g_reg = norm_coefficient * x + g
        h_new = h + g_reg * g_reg
        x_new = x - rate.astype(x.dtype) * g_reg / (jnp.sqrt(h_new) + epsilon)
        results.append((x_new.astype(x.dtype), h_new.astype(h.dtype)))
    return _outputs(results)


@op("Adam", since=1, domain=TRAINING)
def adam(
    R,
    T,
    *inputs,
    alpha=0.9,
    beta=0.999,
    epsilon=1e-6,
    norm_coefficient=0.0,
    norm_coefficient_post=0.0,
):
    """ONNX-training Adam-1: inputs X..., G..., V..., H...; outputs X_new..., V_new..., H_new..."""
    r = _scalar("Adam", "R", R).astype(jnp.float64)
    t = _scalar("Adam", "T", T)
    power = t.astype(jnp.float64)
    # The bias correction applies from the first counted update on (T > 0); T = 0 keeps R and
    # must not divide by 1 - alpha**0 = 0.
    corrected = r * jnp.sqrt(1 - beta**power) / jnp.where(t > 0, 1 - alpha**power, 1)
    rate = jnp.where(t > 0, corrected, r)
    results = []
    for x, g, v, h in _groups("Adam", inputs, ("X", "G", "V", "H")):
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + (1 - alpha) * g_reg
        h_new = beta * h + (1 - beta) * g_reg * g_reg
        x_new = x - rate.astype(x.dtype) * v_new / (jnp.sqrt(h_new) + epsilon)
        x_final = (1 - norm_coefficient_post) * x_new
        results.append((x_final.astype(x.dtype), v_new.astype(v.dtype), h_new.astype(h.dtype)))
    return _outputs(results)


@op("Momentum", since=1, domain=TRAINING)
def momentum(R, T, *inputs, alpha, beta, mode, norm_coefficient):
    """ONNX-training Momentum-1 (standard or Nesterov): inputs X..., G..., V...; outputs
    X_new..., V_new..."""
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum: mode must be 'standard' or 'nesterov', got {mode!r}")
    r = _scalar("Momentum", "R", R)
    t = _scalar("Momentum", "T", T)
    # The first update (T = 0) takes the whole gradient.
    beta_adjusted = jnp.where(t > 0, beta, 1.0)
    results = []
    for x, g, v in _groups("Momentum", inputs, ("X", "G", "V")):
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + beta_adjusted.astype(x.dtype) * g_reg
        step = g_reg + alpha * v_new if mode == "nesterov" else v_new
        x_new = x - r.astype(x.dtype) * step
        results.append((x_new.astype(x.dtype), v_new.astype(v.dtype)))
    return _outputs(results)


@op("Gradient", since=1, domain=TRAINING, context=True)
def gradient(ctx, *inputs, xs, y, zs=None):
    """ai.onnx.preview.training Gradient-1: dy/dx for each x in xs, y recomputed from the xs and
    zs fed in (the nodes between them differentiated, the zs held fixed); a y with several
    elements counts as their sum, as reverse mode seeded with ones computes it."""
    zs = tuple(zs or ())
    if len(inputs) != len(xs) + len(zs):
        raise ShapeError(
            f"Gradient: takes one input per name in xs and zs ({len(xs) + len(zs)}), "
            f"got {len(inputs)}"
        )
    fixed = dict(zip(zs, inputs[len(xs) :]))

    def total(*values):
        (value,) = ctx.recompute([y], {**fixed, **dict(zip(xs, values))})
        return jnp.sum(value)

    points = [jnp.asarray(v) for v in inputs[: len(xs)]]
    return tuple(jax.grad(total, argnums=tuple(range(len(xs))))(*points))
