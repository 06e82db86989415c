"""Recurrent layers: RNN, GRU and LSTM, each one `lax.scan` over time.

The input projection X·Wᵀ is one matmul over all steps before the scan; the scan body only does
the recurrent matmul and the gate arithmetic, every direction in the same step, so the program
stays small and differentiable. Half-precision inputs are computed in float32 and cast back.

sequence_lens follows ONNX Runtime: outputs at and past a sequence's length are zero, Y_h / Y_c
hold the state at the sequence's last valid step (zero, not the initial state, for a length of 0
or an X with no steps), and the reverse direction runs from each sequence's own last valid step
back to step 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transmuter.errors import ShapeError
from transmuter.lowering import op, variant

_REQUIRED = object()

# Lower-case name -> (f(x, alpha, beta), default alpha, default beta). A default of None means the
# function takes no such parameter; _REQUIRED means there is no default to fall back on. Defaults
# are those of the standalone ONNX operators, as the RNN/GRU/LSTM specs say.
_ACTIVATIONS: dict[str, tuple[Callable, Any, Any]] = {
    "relu": (lambda x, a, b: jnp.maximum(x, 0), None, None),
    "tanh": (lambda x, a, b: jnp.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: jax.nn.sigmoid(x), None, None),
    "affine": (lambda x, a, b: a * x + b, _REQUIRED, _REQUIRED),
    "leakyrelu": (lambda x, a, b: jnp.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: jnp.where(x >= a, x, 0), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * jnp.tanh(b * x), _REQUIRED, _REQUIRED),
    "hardsigmoid": (lambda x, a, b: jnp.clip(a * x + b, 0, 1), 0.2, 0.5),
    # expm1 of the negative part only, so a large x gives no inf (and no nan gradient).
    "elu": (lambda x, a, b: jnp.where(x >= 0, x, a * jnp.expm1(jnp.minimum(x, 0))), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + jnp.abs(x)), None, None),
    "softplus": (lambda x, a, b: jnp.logaddexp(x, 0), None, None),
}

_DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


def num_directions(direction: str) -> int:
    """The number of directions (1 or 2) a direction attribute names; ValueError if unknown."""
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be one of {sorted(_DIRECTIONS)}, got {direction!r}")
    return _DIRECTIONS[direction]


@dataclass(frozen=True)
class Kind:
    """What differs between RNN, GRU and LSTM outside the cell equations."""

    name: str
    gates: int
    defaults: tuple[str, ...]  # activations of one direction when the attribute is absent


RNN = Kind("RNN", 1, ("Tanh",))
GRU = Kind("GRU", 3, ("Sigmoid", "Tanh"))
LSTM = Kind("LSTM", 4, ("Sigmoid", "Tanh", "Tanh"))


def _activations(
    kind: Kind,
    num_dir: int,
    names: Sequence[str] | None,
    alphas: Sequence[float] | None,
    betas: Sequence[float] | None,
) -> list[list[Callable]]:
    """Per direction, the activation functions with their alpha/beta bound.

    alpha and beta values are consumed in order by the functions that take them, as ONNX
    Runtime does; a function that takes one the lists do not supply gets its operator default.
    """
    per = len(kind.defaults)
    names = list(names) if names else list(kind.defaults)
    if len(names) == per and num_dir == 2:
        names = names * 2
    if len(names) != per * num_dir:
        raise ValueError(
            f"{kind.name} activations: expected {per * num_dir} names "
            f"({per} per direction), got {len(names)}: {names}"
        )
    alpha_iter, beta_iter = iter(alphas or ()), iter(betas or ())
    bound = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATIONS:
            raise ValueError(
                f"{kind.name} activation {name!r} is not supported; supported: "
                f"{', '.join(sorted(_ACTIVATIONS))}"
            )
        fn, default_alpha, default_beta = _ACTIVATIONS[key]
        alpha = _parameter(name, "alpha", alpha_iter, default_alpha)
        beta = _parameter(name, "beta", beta_iter, default_beta)
        bound.append(_Bound(fn, alpha, beta))
    return [bound[d * per : (d + 1) * per] for d in range(num_dir)]


@dataclass(frozen=True)
class _Bound:
    """An activation with its alpha and beta: equal when the function and parameters are."""

    fn: Callable
    alpha: float | None
    beta: float | None

    def __call__(self, x):
        return self.fn(x, self.alpha, self.beta)


def _parameter(name: str, which: str, values, default):
    if default is None:
        return None
    value = next(values, default)
    if value is _REQUIRED:
        raise ValueError(
            f"activation {name!r} needs {which}: give it in activation_{which} (no default exists)"
        )
    return float(value)


def _check_shape(name: str, value, expected: tuple) -> None:
    if tuple(value.shape) != expected:
        raise ShapeError(f"{name} must have shape {list(expected)}, got {list(value.shape)}")


def _plain_product(h, R, step):
    return h @ R.T


def recurrent(
    ctx,
    kind: Kind,
    X,
    W,
    R,
    B,
    sequence_lens,
    initial_h,
    initial_c=None,
    P=None,
    *,
    activation_alpha,
    activation_beta,
    activations,
    clip,
    direction,
    hidden_size,
    layout,
    input_forget=0,
    linear_before_reset=0,
    recurrent_product: Callable = _plain_product,
    recurrent_weights: Any = None,
):
    """The ai.onnx RNN, GRU or LSTM (`kind`) over all steps; returns the outputs ctx wants.

    `recurrent_product(h, R, step)` computes every h·Rᵀ of the cell equations: h is one
    direction's state [batch, hidden] (or GRU's r ⊙ h), R the rows of that direction's R it
    meets, step the int32 index of the scan step. Both directions count steps from 0 and a
    sequence of length L runs for steps < L, so a hook can tell which sequences have ended. The
    default is the plain product; DynamicQuantizeLSTM quantizes h there. `recurrent_weights`
    (LSTM and RNN, whose cells use R whole): what the hook gets in place of R, a pytree whose
    leaves have the direction axis first (DynamicQuantizeLSTM's integer R and its quantization).
    """
    if layout not in (0, 1):
        raise ValueError(f"layout must be 0 or 1, got {layout}")
    num_dir = num_directions(direction)
    acts = _activations(kind, num_dir, activations, activation_alpha, activation_beta)

    out_dtype = X.dtype
    if not jnp.issubdtype(out_dtype, jnp.floating):
        raise TypeError(f"{kind.name} takes floating-point X, got {jnp.dtype(out_dtype).name}")
    # Half precision would lose the recurrent state's accuracy over many steps.
    dtype = jnp.float32 if jnp.dtype(out_dtype).itemsize < 4 else out_dtype
    X = jnp.asarray(X, dtype)
    if X.ndim != 3:
        raise ShapeError(f"X must be 3-D, got shape {list(X.shape)}")
    if layout == 1:
        X = jnp.swapaxes(X, 0, 1)
    steps, batch, input_size = X.shape
    W, R, Wb, Rb, P = _weights(kind, W, R, B, P, num_dir, input_size, hidden_size, dtype)
    hidden = R.shape[-1]
    shape = (num_dir, batch, hidden)
    h0 = _initial_state(initial_h, "initial_h", shape, layout, dtype)
    c0 = _initial_state(initial_c, "initial_c", shape, layout, dtype) if kind is LSTM else None

    lens = lengths(sequence_lens, steps, batch)
    t = jnp.arange(steps, dtype=jnp.int32)[:, None]
    valid = None if lens is None else t < lens[None, :]  # [steps, batch]
    # Step order of the reverse direction: each sequence backwards from its own last valid step;
    # padding steps map to themselves. The map is its own inverse, so it also restores Y.
    order = None if lens is None else jnp.where(valid, lens[None, :] - 1 - t, t)

    def to_step_order(seq, d):
        reverse = direction == "reverse" or d == 1
        if not reverse:
            return seq
        if order is None:
            return jnp.flip(seq, 0)
        return jnp.take_along_axis(seq, order.reshape(order.shape + (1,) * (seq.ndim - 2)), 0)

    projected = jnp.einsum("tbi,dgi->dtbg", X, W) + Wb[:, None, None, :]
    if kind is not GRU:  # GRU's hidden-gate recurrent bias sits inside the reset product
        projected = projected + Rb[:, None, None, :]
    # [steps, num_dir, batch, gates]: each direction's inputs in its own step order
    xs = jnp.stack([to_step_order(projected[d], d) for d in range(num_dir)], axis=1)
    cell = _cell(kind, clip, input_forget, linear_before_reset)
    want_y = ctx.wants(0)
    weights = R if recurrent_weights is None else recurrent_weights

    def body(carry, inputs):
        xw, mask, step = inputs

        def product(h, R):
            return recurrent_product(h, R, step)

        def direction_step(xw, state, R, Rb, P, acts):
            return cell(xw, state, R, Rb, P, acts, product)

        if recurrent_weights is not None and all(a == acts[0] for a in acts):
            # A hook's product (DynamicQuantizeLSTM's quantizer and integer dot) for both
            # directions as one batched step: half the ops, 10.5 against 17 ms over 89 steps of
            # Kokoro's. The plain float product stays per direction, where XLA:CPU's loop for a
            # vector times a matrix beats its batched dot (about 8 against 11 ms).
            new = jax.vmap(partial(direction_step, acts=acts[0]))(xw, carry, weights, Rb, P)
        else:
            states = [
                direction_step(xw[d], tuple(s[d] for s in carry),
                               jax.tree.map(lambda w, d=d: w[d], weights), Rb[d],
                               None if P is None else P[d], acts[d])
                for d in range(num_dir)
            ]  # fmt: skip
            new = tuple(jnp.stack(s) for s in zip(*states, strict=True))
        if mask is not None:
            new = tuple(jnp.where(mask[:, None], n, o) for n, o in zip(new, carry, strict=True))
        if not want_y:
            return new, None
        return new, new[0] if mask is None else jnp.where(mask[:, None], new[0], 0)

    init = (h0,) if c0 is None else (h0, c0)  # each [num_dir, batch, hidden]
    final, ys = jax.lax.scan(body, init, (xs, valid, t[:, 0]))

    # ONNX Runtime reports a zero state, not the initial one, for an empty sequence.
    if steps == 0:
        final = jax.tree.map(jnp.zeros_like, final)
    elif lens is not None:
        final = tuple(jnp.where(lens[:, None] > 0, s, 0) for s in final)
    Y = None
    if want_y:
        Y = jnp.stack([to_step_order(ys[:, d], d) for d in range(num_dir)], axis=1)
    return _outputs(ctx, kind, Y, final, layout, out_dtype)


def _weights(kind: Kind, W, R, B, P, num_dir: int, input_size: int, hidden_size, dtype):
    """W, R, the input and recurrent biases (split from B, zero when absent) and the peepholes
    P, checked against the spec's shapes and cast to the compute type."""
    hidden = R.shape[-1]
    if hidden_size is not None and hidden_size != hidden:
        raise ShapeError(f"hidden_size is {hidden_size} but R's last dim is {hidden}")
    width = kind.gates * hidden
    _check_shape("W", W, (num_dir, width, input_size))
    _check_shape("R", R, (num_dir, width, hidden))
    W, R = jnp.asarray(W, dtype), jnp.asarray(R, dtype)
    if B is not None:
        _check_shape("B", B, (num_dir, 2 * width))
        Wb, Rb = jnp.split(jnp.asarray(B, dtype), 2, axis=-1)
    else:
        Wb = Rb = jnp.zeros((num_dir, width), dtype)
    if P is not None:
        _check_shape("P", P, (num_dir, 3 * hidden))
        P = jnp.asarray(P, dtype)
    return W, R, Wb, Rb, P


def _initial_state(value, name: str, shape: tuple, layout: int, dtype):
    """initial_h or initial_c as [num_directions, batch, hidden] (zeros when absent)."""
    if value is None:
        return jnp.zeros(shape, dtype)
    value = jnp.asarray(value, dtype)
    if layout == 1:
        value = jnp.swapaxes(value, 0, 1)
    _check_shape(f"{name} (as [num_directions, batch, hidden])", value, shape)
    return value


def _outputs(ctx, kind: Kind, Y, final, layout: int, dtype) -> tuple:
    """Y [steps, num_directions, batch, hidden] (None when not wanted), then the last h (and
    c for LSTM) per direction, in `layout`, as far as the node lists outputs."""
    results: list[Any] = [None if Y is None else jnp.transpose(Y, (2, 0, 1, 3)) if layout else Y]
    for index in range(1, 3 if kind is LSTM else 2):
        if index < ctx.num_outputs:
            last = final[index - 1]  # [num_dir, batch, hidden]
            results.append(jnp.swapaxes(last, 0, 1) if layout == 1 else last)
    results = results[: ctx.num_outputs]
    return tuple(None if r is None else r.astype(dtype) for r in results)


def lengths(sequence_lens, steps: int, batch: int):
    """sequence_lens as int32 [batch], or None when every sequence is known to be full."""
    if sequence_lens is None:
        return None
    if tuple(sequence_lens.shape) != (batch,):
        raise ShapeError(
            f"sequence_lens must have shape [{batch}], got {list(sequence_lens.shape)}"
        )
    if isinstance(sequence_lens, np.ndarray):
        if np.any((sequence_lens < 0) | (sequence_lens > steps)):
            raise ValueError(f"sequence_lens values must be in [0, {steps}], got {sequence_lens}")
        if np.all(sequence_lens == steps):
            return None
    return jnp.asarray(sequence_lens).astype(jnp.int32)


def _cell(kind: Kind, clip, input_forget: int, linear_before_reset: int) -> Callable:
    """One step of one direction: (x·Wᵀ + biases, state, R, Rb, P, activations, product) ->
    state, where product(h, R) is h·Rᵀ."""

    def clipped(x):
        return x if clip is None else jnp.clip(x, -clip, clip)

    def rnn(xw, carry, R, Rb, P, acts, product):
        (h,) = carry
        return (acts[0](clipped(xw + product(h, R))),)

    def gru(xw, carry, R, Rb, P, acts, product):
        (h,) = carry
        f, g = acts
        hidden = h.shape[-1]
        xz, xr, xh = jnp.split(xw, 3, axis=-1)
        if linear_before_reset:
            rz, rr, rh = jnp.split(product(h, R) + Rb, 3, axis=-1)
        else:
            rz, rr = jnp.split(product(h, R[: 2 * hidden]) + Rb[: 2 * hidden], 2, axis=-1)
        z = f(clipped(xz + rz))
        r = f(clipped(xr + rr))
        if linear_before_reset:
            candidate = g(clipped(xh + r * rh))
        else:
            candidate = g(clipped(xh + product(r * h, R[2 * hidden :]) + Rb[2 * hidden :]))
        return ((1 - z) * candidate + z * h,)

    def lstm(xw, carry, R, Rb, P, acts, product):
        h, c = carry
        f, g, act_h = acts
        gi, go, gf, gc = jnp.split(xw + product(h, R), 4, axis=-1)
        pi, po, pf = (None, None, None) if P is None else jnp.split(P, 3)
        i = f(clipped(gi if P is None else gi + pi * c))
        if input_forget:
            forget = 1 - i
        else:
            forget = f(clipped(gf if P is None else gf + pf * c))
        c_new = forget * c + i * g(clipped(gc))
        o = f(clipped(go if P is None else go + po * c_new))
        return o * act_h(c_new), c_new

    return {"RNN": rnn, "GRU": gru, "LSTM": lstm}[kind.name]


# Versions: 1 had output_sequence (it only said whether Y is optional; Y is produced whenever the
# node lists it), 7 dropped it, 14 added layout, 22 added bfloat16. GRU-3 added
# linear_before_reset. The v1 docs wrote Ht-1*R without the transpose; the input shapes were the
# same, so every version computes Ht-1*Rᵀ, as ONNX Runtime and onnx.reference do.


@op("RNN", since=(14, 22), context=True)
def rnn_v14(
    ctx,
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=("Tanh", "Tanh"),
    clip=None,
    direction="forward",
    hidden_size=None,
    layout=0,
):
    """ONNX RNN-14..22: Ht = f(Xt·Wᵀ + Ht-1·Rᵀ + Wb + Rb); layout 1 puts batch first."""
    if direction != "bidirectional" and len(activations) == 2:
        # The schema's default lists two functions even for one direction: the first applies.
        activations = activations[:1]
    return recurrent(
        ctx, RNN, X, W, R, B, sequence_lens, initial_h,
        activation_alpha=activation_alpha, activation_beta=activation_beta,
        activations=activations, clip=clip, direction=direction, hidden_size=hidden_size,
        layout=layout,
    )  # fmt: skip


rnn_v7 = op("RNN", since=7, context=True)(variant(
    rnn_v14, "rnn_v7", "ONNX RNN-7: RNN-14 without layout (sequence first).", fixed={"layout": 0},
))  # fmt: skip
rnn_v1 = op("RNN", since=1, context=True)(variant(
    rnn_v7, "rnn_v1", "ONNX RNN-1: RNN-7 plus output_sequence (Y optional when 0).",
    ignored={"output_sequence": 0},
))  # fmt: skip


@op("GRU", since=(14, 22), context=True)
def gru_v14(
    ctx,
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    layout=0,
    linear_before_reset=0,
):
    """ONNX GRU-14..22: update/reset/hidden gates (zrh); layout 1 puts batch first."""
    return recurrent(
        ctx, GRU, X, W, R, B, sequence_lens, initial_h,
        activation_alpha=activation_alpha, activation_beta=activation_beta,
        activations=activations, clip=clip, direction=direction, hidden_size=hidden_size,
        layout=layout, linear_before_reset=linear_before_reset,
    )  # fmt: skip


gru_v7 = op("GRU", since=7, context=True)(variant(
    gru_v14, "gru_v7", "ONNX GRU-7: GRU-14 without layout (sequence first).", fixed={"layout": 0},
))  # fmt: skip
gru_v3 = op("GRU", since=3, context=True)(variant(
    gru_v7, "gru_v3", "ONNX GRU-3: GRU-7 plus output_sequence (Y optional when 0).",
    ignored={"output_sequence": 0},
))  # fmt: skip


@op("GRU", since=1, context=True)
def gru_v1(
    ctx,
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="foward",
    hidden_size=None,
    output_sequence=0,
):
    """ONNX GRU-1: as GRU-3 without linear_before_reset (always 0)."""
    # GRU-1's schema misspells its default direction; it means forward.
    return gru_v7(
        ctx, X, W, R, B, sequence_lens, initial_h, activation_alpha=activation_alpha,
        activation_beta=activation_beta, activations=activations, clip=clip,
        direction="forward" if direction == "foward" else direction, hidden_size=hidden_size,
    )  # fmt: skip


@op("LSTM", since=(14, 22), context=True)
def lstm_v14(
    ctx,
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    P=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    input_forget=0,
    layout=0,
):
    """ONNX LSTM-14..22: input/output/forget/cell gates (iofc), peepholes P; layout 1 puts
    batch first."""
    return recurrent(
        ctx, LSTM, X, W, R, B, sequence_lens, initial_h, initial_c, P,
        activation_alpha=activation_alpha, activation_beta=activation_beta,
        activations=activations, clip=clip, direction=direction, hidden_size=hidden_size,
        layout=layout, input_forget=input_forget,
    )  # fmt: skip


lstm_v7 = op("LSTM", since=7, context=True)(variant(
    lstm_v14, "lstm_v7", "ONNX LSTM-7: LSTM-14 without layout (sequence first).",
    fixed={"layout": 0},
))  # fmt: skip
lstm_v1 = op("LSTM", since=1, context=True)(variant(
    lstm_v7, "lstm_v1", "ONNX LSTM-1: LSTM-7 plus output_sequence (Y optional when 0).",
    ignored={"output_sequence": 0},
))  # fmt: skip
