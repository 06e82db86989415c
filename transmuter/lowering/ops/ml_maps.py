"""Operators on ONNX maps of the ai.onnx.ml domain: ZipMap, CastMap, DictVectorizer.

A map is a Python dict (int or str keys; numpy scalars, arrays or str values), a sequence of maps
a list of them, as ONNX Runtime returns them. ZipMap builds maps from a classifier's scores, so it
runs on the host after the compiled segment that computes them (`host_outputs`). CastMap and
DictVectorizer read maps: a map input of numbers is a pytree the compiled program takes (its keys
fix the program), a map of strings stays on the host.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from transmuter.errors import ShapeError
from transmuter.lowering import op
from transmuter.lowering.ops.ml import ML, one_of, strings_array


def _map_input(ctx, value) -> dict:
    if not isinstance(value, dict):
        raise ShapeError(f"{ctx.node.op_type}: X must be a map (dict), got {type(value).__name__}")
    return value


def _traced(values) -> bool:
    return any(isinstance(v, jax.core.Tracer) for v in values)


def _host_map(ctx, value: dict, why: str) -> dict:
    if _traced(value.values()):
        ctx.need_host(0, why)
    return value


@op(
    "ZipMap", since=1, domain=ML, host_inputs={"X": "the scores it builds maps from"},
    host_outputs=True,
)  # fmt: skip
def zip_map(X, *, classlabels_int64s=None, classlabels_strings=None):
    """ONNX-ML ZipMap-1: each row of scores [N, C] as a map label -> score, a list of N maps."""
    name, labels = one_of(
        "ZipMap", "the map keys",
        classlabels_int64s=classlabels_int64s, classlabels_strings=classlabels_strings,
    )  # fmt: skip
    labels = [str(k) for k in labels] if name == "classlabels_strings" else [int(k) for k in labels]
    scores = np.asarray(X)
    scores = scores[None, :] if scores.ndim == 1 else scores
    if scores.ndim != 2 or scores.shape[1] != len(labels):
        raise ShapeError(
            f"ZipMap: X must be [N, {len(labels)}] (one column per label), got {list(scores.shape)}"
        )
    scores = scores.astype(np.float32)
    return [dict(zip(labels, row)) for row in scores]


_CASTS = {"TO_FLOAT": np.float32, "TO_INT64": np.int64, "TO_STRING": object}


def _to_string(value) -> str:
    # ONNX Runtime writes numbers as C's %f ("1.500000").
    return value if isinstance(value, str) else f"{float(value):f}"


@op("CastMap", since=1, domain=ML, context=True, strings_on_host=True)
def cast_map(ctx, X, *, cast_to="TO_FLOAT", map_form="DENSE", max_map=1):
    """ONNX-ML CastMap-1: a map int64 -> value as a [1, M] tensor: the values in key order
    (DENSE), or at their keys' positions in [0, max_map) with zeros elsewhere (SPARSE)."""
    if cast_to not in _CASTS or map_form not in ("DENSE", "SPARSE"):
        raise ValueError(
            f"CastMap: cast_to must be TO_FLOAT, TO_STRING or TO_INT64 and map_form DENSE or "
            f"SPARSE; got {cast_to!r}, {map_form!r}"
        )
    data = _map_input(ctx, X)
    keys = sorted(data)
    if map_form == "SPARSE":
        if max_map < 1 or any(k < 0 or k >= max_map for k in keys):
            raise ShapeError(f"CastMap: SPARSE keys must be in [0, max_map={max_map}), got {keys}")
    strings = any(isinstance(data[k], str) for k in keys)
    if cast_to == "TO_STRING" or strings:
        data = _host_map(ctx, data, "map values turned into or read from strings")
        if cast_to == "TO_STRING":
            values = [_to_string(data[k]) for k in keys]
            # The spec names no fill value; ONNX Runtime writes the literal "0.f", Transmuter a
            # formatted 0 like its other numbers.
            fill = _to_string(0.0)
        else:
            values = [float(data[k]) if isinstance(data[k], str) else data[k] for k in keys]
            values = np.asarray(values, np.float64)
            # Strings parse to float; TO_INT64 truncates, as C++'s casts do.
            values = values.astype(_CASTS[cast_to]) if values.size else values
            fill = 0
        if map_form == "DENSE":
            out = values
        else:
            out = np.full(max_map, fill, _CASTS[cast_to])
            out[keys] = values
        if cast_to == "TO_STRING":
            return strings_array(list(out), (1, -1))
        return np.asarray(out, _CASTS[cast_to]).reshape(1, -1)
    dtype = _CASTS[cast_to]
    values = [jnp.asarray(data[k]).reshape(()).astype(dtype) for k in keys]
    if map_form == "DENSE":
        out = jnp.stack(values) if values else jnp.zeros(0, dtype)
    else:
        out = jnp.zeros(max_map, dtype)
        if values:
            out = out.at[np.asarray(keys)].set(jnp.stack(values))
    return out.reshape(1, -1)


@op("DictVectorizer", since=1, domain=ML, context=True)
def dict_vectorizer(ctx, X, *, int64_vocabulary=None, string_vocabulary=None):
    """ONNX-ML DictVectorizer-1: a map's values in vocabulary order, 0 (or "") for the words it
    lacks; keys outside the vocabulary are dropped."""
    name, vocabulary = one_of(
        "DictVectorizer", "the vocabulary",
        int64_vocabulary=int64_vocabulary, string_vocabulary=string_vocabulary,
    )  # fmt: skip
    data = _map_input(ctx, X)
    if data and (name == "string_vocabulary") != isinstance(next(iter(data)), str):
        raise ValueError(f"DictVectorizer: the map's keys do not match {name}")
    vocabulary = [str(k) for k in vocabulary] if name == "string_vocabulary" else list(vocabulary)
    values = list(data.values())
    # The spec's Y is 1-D, as onnx.reference has it; ONNX Runtime returns [1, V].
    if any(isinstance(v, str) for v in values):
        return strings_array([data.get(k, "") for k in vocabulary], (-1,))
    if not values:
        raise ValueError("DictVectorizer: an empty map has no value type to give Y")
    dtype = jnp.asarray(values[0]).dtype
    zero = jnp.zeros((), dtype)
    if _traced(values):
        return jnp.stack([jnp.asarray(data[k], dtype) if k in data else zero for k in vocabulary])
    return np.asarray([data.get(k, 0) for k in vocabulary], dtype)
