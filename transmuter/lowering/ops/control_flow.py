"""Control flow: If, Loop and Scan, with their subgraphs evaluated through `ctx.run_graph`.

A decision that fixes the program's shape (which branch runs, how many iterations) is taken on
the host when its inputs are concrete (host values, or concrete arrays when running eagerly).
Under a trace it becomes `lax.cond`, `lax.scan` or `lax.while_loop` when every iteration keeps
the same shapes; otherwise the op raises HostValueNeeded, where `transmuter.compile` breaks the
graph. A Loop whose trip count is known on the host runs as `lax.scan` (differentiable), or
unrolled in Python when its carried values change shape (a growing sequence or concat); so does
a Scan whose state changes shape or is needed on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transmuter.errors import HostValueNeeded, ShapeError
from transmuter.lowering import op
from transmuter.lowering.shared import check_size, normalize_axis

_ALL_VERSIONS = (1, 11, 13, 16, 19, 21, 23, 24, 25)


def _concrete(value: Any) -> np.ndarray | None:
    """`value` as numpy when it is known now (a host value or a concrete array), else None."""
    if value is None or isinstance(value, jax.core.Tracer):
        return None
    return np.asarray(value)


def _flag(value: np.ndarray, what: str) -> bool:
    if value.size != 1:
        raise ShapeError(f"{what} must hold one boolean, got shape {list(value.shape)}")
    return bool(value.reshape(()))


def _specs(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.dtype(x.dtype)), tree)


def _signature(tree: Any) -> tuple:
    """Structure, shapes and dtypes of a pytree of values, ignoring JAX's weak types."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(np.shape(x)), np.dtype(x.dtype)) for x in leaves)


def _stack(values: Sequence[Any]) -> Any:
    if all(isinstance(v, np.ndarray) for v in values):
        return np.stack(values)
    return jnp.stack([jnp.asarray(v) for v in values])


@op("If", since=_ALL_VERSIONS, context=True, may_need_host="its branches may give different shapes")
def if_(ctx, cond, *, else_branch, then_branch):
    """ONNX If-1..25: the outputs of then_branch or else_branch."""
    known = _concrete(cond)
    if known is not None:
        branch = then_branch if _flag(known, "If cond") else else_branch
        return tuple(ctx.run_graph(branch, []))
    then_fn = lambda: tuple(ctx.run_graph(then_branch, []))  # noqa: E731
    else_fn = lambda: tuple(ctx.run_graph(else_branch, []))  # noqa: E731
    then_types = _branch_types(ctx, "then_branch", then_fn)
    else_types = _branch_types(ctx, "else_branch", else_fn)
    # lax.cond needs both branches to give the same types; only the host can pick otherwise.
    if _signature(then_types) != _signature(else_types):
        ctx.need_host(0, "the If condition")
    if np.size(cond) != 1:
        raise ShapeError(f"If cond must hold one boolean, got shape {list(np.shape(cond))}")
    return jax.lax.cond(jnp.reshape(cond, ()), then_fn, else_fn)


def _branch_types(ctx, which: str, branch_fn) -> Any:
    """The output types of one If branch traced abstractly. ONNX runs only the taken branch, so
    a branch that cannot be traced for the current shapes (a voice model's 8 kHz branch handed
    the 16 kHz tensors, an LSTM then given a 5-D input) is no error: the condition must be
    known, and the If becomes a graph break that runs the taken branch alone."""
    try:
        return jax.eval_shape(branch_fn)
    except HostValueNeeded:
        raise
    except Exception as exc:
        cause = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        why = f"the If condition ({which} cannot be traced for these shapes: {cause})"
        ctx.need_host(0, why)


@dataclass(frozen=True)
class _LoopBody:
    """What one abstract trace of a Loop body (iteration number and carried values unknown, the
    incoming condition True) shows. None instead of this: the body needs the iteration number
    or a carried value on the host, so only a Python loop can run it."""

    stable: bool  # carried values keep their structure, shapes and dtypes
    always_true: bool  # the outgoing condition is True on the host whenever the incoming one is
    scan_specs: tuple  # ShapeDtypeStruct of each scan output element


def _probe(ctx, body, carried: Sequence[Any]) -> _LoopBody | None:
    n = len(carried)
    outgoing = []

    def one(i, carry):
        outs = ctx.run_graph(body, [i, np.array(True), *carry])
        outgoing.append(_concrete(outs[0]))
        return list(outs[1 : 1 + n]), tuple(outs[1 + n :])

    try:
        carry_out, scans = jax.eval_shape(
            one, jax.ShapeDtypeStruct((), np.int64), _specs(list(carried))
        )
    except HostValueNeeded:
        return None
    # Induction: True in gives True out whatever the iteration, so the condition never stops it.
    always_true = outgoing[0] is not None and _flag(outgoing[0], "the Loop body's condition")
    stable = _signature(carry_out) == _signature(_specs(list(carried)))
    return _LoopBody(stable, always_true, scans)


@op(
    "Loop",
    since=_ALL_VERSIONS,
    context=True,
    may_need_host="a trip count or condition read from data decides the output length",
)
def loop(ctx, max_trip_count=None, cond=None, *v_initial, body):
    """ONNX Loop-1..25: run body while i < max_trip_count and cond; carried values and stacked
    scan outputs."""
    n = len(v_initial)
    if len(body.outputs) < 1 + n or len(body.inputs) != 2 + n:
        raise ShapeError(
            f"Loop body must take (iteration, condition, {n} carried) and return (condition, "
            f"{n} carried, scan outputs...); it takes {len(body.inputs)} and returns "
            f"{len(body.outputs)}"
        )
    k = len(body.outputs) - 1 - n
    trip = _concrete(max_trip_count)
    keep = _concrete(cond)
    trip_traced = max_trip_count is not None and trip is None
    cond_traced = cond is not None and keep is None
    limit = None if trip is None else int(trip.reshape(()))
    running = keep is None or _flag(keep, "Loop cond")
    probe = _probe(ctx, body, v_initial)

    if not trip_traced and not cond_traced:
        fixed = cond is None or not running or (probe is not None and probe.always_true)
        if fixed:
            count = limit if running else 0
            if count is None:
                raise ShapeError(
                    "Loop has no trip count and no condition that can end it: it never stops"
                )
            if probe is not None and probe.stable:
                return _scan_loop(ctx, body, count, v_initial, probe)
            return _python_loop(ctx, body, count, cond, v_initial, k, probe, follow_cond=False)
        result = _python_loop(ctx, body, limit, cond, v_initial, k, probe, follow_cond=True)
        if result is not None:
            return result

    reason = "the Loop trip count" if trip_traced else "the Loop condition"
    if k or probe is None or not probe.stable:
        # Stacked scan outputs and changing shapes need the number of iterations on the host.
        ctx.need_host(0 if trip_traced else 1, reason)
    return _while_loop(ctx, body, max_trip_count, cond, v_initial)


def _scan_loop(ctx, body, count: int, carried: Sequence[Any], probe: _LoopBody) -> tuple:
    """Exactly `count` iterations as one lax.scan; the condition is known to stay True. The
    iteration number is carried, not scanned over: a trip count of 2^62 with no scan output is a
    long loop, not an array of 2^62 numbers."""
    n = len(carried)
    for index, spec in enumerate(probe.scan_specs):
        check_size(f"Loop scan output {index}", (count, *spec.shape), spec.dtype)

    def step(carry, _):
        i, values = carry
        outs = ctx.run_graph(body, [i, np.array(True), *values])
        return (i + 1, list(outs[1 : 1 + n])), tuple(outs[1 + n :])

    start = (jnp.int64(0), list(carried))
    (_, final), stacked = jax.lax.scan(step, start, None, length=count)
    return (*final, *stacked)


def _python_loop(
    ctx, body, limit, cond, carried, k: int, probe: _LoopBody | None, *, follow_cond: bool
) -> tuple | None:
    """Iterate in Python (unrolled under a trace), the iteration number a host value. With
    follow_cond the body's condition decides when to stop; None when that turns out traced."""
    carried = list(carried)
    n = len(carried)
    scans: list[list[Any]] = [[] for _ in range(k)]
    keep = np.array(True) if cond is None else cond
    i = 0
    while limit is None or i < limit:
        if follow_cond:
            known = _concrete(keep)
            if known is None:
                return None
            if not _flag(known, "the Loop body's condition"):
                break
        outs = ctx.run_graph(body, [np.array(i, np.int64), keep, *carried])
        keep, carried = outs[0], list(outs[1 : 1 + n])
        for acc, value in zip(scans, outs[1 + n :], strict=True):
            acc.append(value)
        i += 1
    return (
        *carried,
        *(_stack(acc) if acc else _empty_scan(probe, j) for j, acc in enumerate(scans)),
    )


def _empty_scan(probe: _LoopBody | None, index: int) -> np.ndarray:
    if probe is None:
        raise ShapeError(
            f"Loop ran no iteration, and the shape of scan output {index} depends on the "
            "iteration number, so its empty value has no known shape"
        )
    spec = probe.scan_specs[index]
    return np.zeros((0, *spec.shape), spec.dtype)


def _while_loop(ctx, body, max_trip_count, cond, carried: Sequence[Any]) -> tuple:
    """A lax.while_loop for a trip count or condition known only on the device."""
    n = len(carried)
    limit = None if max_trip_count is None else jnp.reshape(max_trip_count, ()).astype(jnp.int64)

    def test(state):
        i, keep, _ = state
        go = keep if cond is not None else jnp.asarray(True)
        return go if limit is None else jnp.logical_and(go, i < limit)

    def step(state):
        i, keep, carry = state
        outs = ctx.run_graph(body, [i, keep, *carry])
        # Without a cond input the body's condition is ignored (ONNX: a plain for loop).
        keep_out = jnp.reshape(outs[0], ()).astype(jnp.bool_) if cond is not None else keep
        return i + 1, keep_out, list(outs[1 : 1 + n])

    start = jnp.reshape(cond, ()).astype(jnp.bool_) if cond is not None else jnp.asarray(True)
    _, _, final = jax.lax.while_loop(test, step, (jnp.int64(0), start, list(carried)))
    return tuple(final)


def _per_value(values: Sequence[int] | None, count: int, what: str) -> list[int]:
    if values is None:
        return [0] * count
    if len(values) != count:
        raise ShapeError(f"{what} must have {count} entries, got {len(values)}")
    return [int(v) for v in values]


def _check_directions(directions: Sequence[int], what: str) -> None:
    for d in directions:
        if d not in (0, 1):
            raise ValueError(f"{what} must be 0 (forward) or 1 (reverse), got {d}")


def _scan_arguments(values, num_scan_inputs: int, body) -> tuple[list, int, int]:
    """Scan's variadic input as a list, with the count of scan inputs m and of states n, checked
    against the body's signature."""
    values = list(values)
    m = num_scan_inputs
    n = len(values) - m
    if m < 1 or n < 0 or len(body.inputs) != n + m or len(body.outputs) < n:
        raise ShapeError(
            f"Scan with num_scan_inputs={m} got {len(values)} inputs for a body taking "
            f"{len(body.inputs)} and returning {len(body.outputs)}"
        )
    return values, m, n


@op("Scan", since=(9, 11, 16, 19, 21, 23, 24, 25), context=True)
def scan(
    ctx,
    *initial_state_and_scan_inputs,
    body,
    num_scan_inputs,
    scan_input_axes=None,
    scan_input_directions=None,
    scan_output_axes=None,
    scan_output_directions=None,
):
    """ONNX Scan-9..25: run body over slices of the scan inputs with carried state; one lax.scan."""
    values, m, n = _scan_arguments(initial_state_and_scan_inputs, num_scan_inputs, body)
    k = len(body.outputs) - n
    in_axes = _per_value(scan_input_axes, m, "scan_input_axes")
    in_dirs = _per_value(scan_input_directions, m, "scan_input_directions")
    out_axes = _per_value(scan_output_axes, k, "scan_output_axes")
    out_dirs = _per_value(scan_output_directions, k, "scan_output_directions")
    _check_directions(in_dirs, "scan_input_directions")
    _check_directions(out_dirs, "scan_output_directions")

    xs = []
    for j, (x, axis, reverse) in enumerate(zip(values[n:], in_axes, in_dirs, strict=True)):
        x = jnp.moveaxis(x, normalize_axis(axis, np.ndim(x), f"scan_input_axes[{j}]"), 0)
        xs.append(jnp.flip(x, 0) if reverse else x)
    lengths = {x.shape[0] for x in xs}
    if len(lengths) != 1:
        raise ShapeError(
            f"Scan inputs have different lengths along their scan axes: {sorted(lengths)}"
        )

    def step(carry, elems):
        outs = ctx.run_graph(body, [*carry, *elems])
        return list(outs[:n]), tuple(outs[n:])

    if lengths == {0} or _scan_is_stable(step, values[:n], xs):
        final, stacked = jax.lax.scan(step, values[:n], xs)
    else:
        final, stacked = _unrolled_scan(step, values[:n], xs, k)
    outputs = []
    for j, (y, axis, reverse) in enumerate(zip(stacked, out_axes, out_dirs, strict=True)):
        y = jnp.flip(y, 0) if reverse else y  # prepending reverses the iteration order
        outputs.append(jnp.moveaxis(y, 0, normalize_axis(axis, y.ndim, f"scan_output_axes[{j}]")))
    return (*final, *outputs)


def _scan_is_stable(step, state: Sequence[Any], xs: Sequence[Any]) -> bool:
    """Whether one step, traced abstractly, keeps the state's shapes and dtypes and needs no
    state value on the host: what lax.scan needs. ONNX's Scan asks neither."""
    elements = [jax.ShapeDtypeStruct(np.shape(x)[1:], np.dtype(x.dtype)) for x in xs]
    try:
        out, _ = jax.eval_shape(step, _specs(list(state)), elements)
    except HostValueNeeded:
        return False
    return _signature(out) == _signature(_specs(list(state)))


def _unrolled_scan(step, state: Sequence[Any], xs: Sequence[Any], k: int) -> tuple:
    """The scan as a Python loop (unrolled under a trace): the state may change shape."""
    state, ys = list(state), [[] for _ in range(k)]
    for t in range(int(np.shape(xs[0])[0])):
        state, outs = step(state, [x[t] for x in xs])
        for acc, y in zip(ys, outs, strict=True):
            acc.append(y)
    return state, tuple(_stack(acc) for acc in ys)


@op("Scan", since=8, context=True)
def scan_v8(
    ctx, sequence_lens=None, *initial_state_and_scan_inputs, body, directions=None, num_scan_inputs
):
    """ONNX Scan-8: batch axis 0, sequence axis 1, per-batch lengths; outputs padded with 0."""
    values, m, n = _scan_arguments(initial_state_and_scan_inputs, num_scan_inputs, body)
    dirs = _per_value(directions, m, "directions")
    _check_directions(dirs, "directions")
    xs = [jnp.asarray(x) for x in values[n:]]
    for j, x in enumerate(xs):
        if x.ndim < 2 or x.shape[:2] != xs[0].shape[:2]:
            raise ShapeError(
                f"Scan-8 scan input {j} must be [batch, sequence, ...] like the first, got "
                f"{list(x.shape)} and {list(xs[0].shape)}"
            )
    batch, steps = xs[0].shape[:2]
    if sequence_lens is None:
        lens = jnp.full((batch,), steps, jnp.int64)
    else:
        lens = jnp.asarray(sequence_lens).astype(jnp.int64)
        if lens.shape != (batch,):
            raise ShapeError(f"sequence_lens must have shape [{batch}], got {list(lens.shape)}")

    if steps == 0:
        # No step runs, but tracing the body still indexes a step: give it one to index.
        xs = [jnp.zeros((batch, 1, *x.shape[2:]), x.dtype) for x in xs]

    def one(states, seqs, length):
        def step(carry, t):
            live = t < length
            # A reversed sequence starts at its own last valid step.
            index = [jnp.clip(length - 1 - t, 0, max(steps - 1, 0)) if d else t for d in dirs]
            outs = ctx.run_graph(body, [*carry, *(s[i] for s, i in zip(seqs, index, strict=True))])
            carry = [jnp.where(live, new, old) for new, old in zip(outs[:n], carry, strict=True)]
            return carry, tuple(jnp.where(live, y, jnp.zeros_like(y)) for y in outs[n:])

        return jax.lax.scan(step, states, jnp.arange(steps, dtype=jnp.int64))

    final, stacked = jax.vmap(one)([jnp.asarray(s) for s in values[:n]], xs, lens)
    return (*final, *stacked)
