"""`run`: evaluate a model's graph on given inputs, eagerly or inside the caller's trace."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from transmuter.errors import InputError
from transmuter.runtime.interpreter import Interpreter


def x64_scope():
    """The context every trace and call of a Transmuter graph runs in: 64-bit types enabled,
    scoped to Transmuter's own work so the caller's setting is left alone."""
    return jax.enable_x64(True)


def run(
    model, inputs: Mapping[str, Any], *, params: Mapping[str, Any] | None = None, key: Any = None
) -> dict[str, Any]:
    """Evaluate `model` on `inputs` (name -> array-like); returns name -> array.

    Pure: call it eagerly, or inside `jax.jit`, `jax.vmap` and `jax.grad` (differentiate with
    respect to `params`, a dict like `model.params`). `key` is a PRNG key for random operators.
    """
    arrays = model.check_inputs(inputs)
    with x64_scope():
        return evaluate(
            model,
            {k: on_device(v) for k, v in arrays.items()},
            _check_params(model, params),
            model.device_constants,
            key,
        )


def evaluate(
    model,
    inputs: Mapping[str, Any],
    params: Mapping[str, Any],
    device_constants: Mapping[str, Any],
    key: Any = None,
) -> dict[str, Any]:
    """The graph walk shared by `run` and the compiled runtime. Call inside `x64_scope`."""
    env = _environment(model, inputs, params, device_constants)
    values = Interpreter(model.plan, key).run(model.plan, env)
    return {name: as_output(v) for name, v in zip(model.outputs, values)}


def intermediates(model, inputs: Mapping[str, Any], *, key: Any = None) -> dict[str, Any]:
    """Every value of the main graph after an eager run, by name: what a search for the first
    node where Transmuter and a reference diverge compares. `key`: as for `run`."""
    arrays = model.check_inputs(inputs)
    with x64_scope():
        env = _environment(
            model,
            {k: on_device(v) for k, v in arrays.items()},
            model.params,
            model.device_constants,
        )
        Interpreter(model.plan, key).run(model.plan, env)
        return {name: as_output(v) for name, v in env.items()}


def _environment(model, inputs, params, device_constants) -> dict[str, Any]:
    env: dict[str, Any] = dict(model.host_constants)
    env.update(device_constants)
    env.update(params)
    env.update(inputs)
    return env


def to_device(array: np.ndarray) -> jax.Array:
    """A numpy array copied to the device. Not `jnp.asarray`: outside a trace that compiles a
    small XLA program per shape and dtype (`lax.stage`), 13 ms each, where a transfer takes
    0.1 ms (a model's params at load, host results at every call)."""
    return jax.device_put(array)


def on_device(value: Any) -> Any:
    """Inputs are data, so device values, except strings, which only live on the host."""
    if isinstance(value, list):
        return [on_device(v) for v in value]
    if isinstance(value, np.ndarray) and value.dtype != object:
        return to_device(value)
    return value


def _check_params(model, params: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if params is None:
        return model.params
    if not isinstance(params, Mapping) or set(params) != set(model.params):
        given = set(params) if isinstance(params, Mapping) else type(params).__name__
        missing = sorted(set(model.params) - set(given)) if isinstance(given, set) else []
        extra = sorted(set(given) - set(model.params)) if isinstance(given, set) else []
        raise InputError(
            f"params must have exactly the keys of model.params (missing {missing[:5]}, "
            f"unknown {extra[:5]}); got {given if not isinstance(given, set) else len(given)} entries"
        )
    return params


def as_output(value: Any) -> Any:
    """Host results become JAX arrays like every other output; strings stay numpy."""
    if isinstance(value, list):
        return [as_output(v) for v in value]
    if isinstance(value, np.ndarray) and value.dtype != object:
        return to_device(value)
    return value
