"""Sequences and optionals: a sequence is a Python list of arrays, an empty optional is None.

A list's length is a Python int, so it is known while tracing; positions and split sizes are
host inputs, and the ops only move references, slice or concatenate. String tensors (numpy object
arrays) stay in numpy.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from transmuter import dtypes
from transmuter.errors import ShapeError
from transmuter.lowering import op, variant


def _sequence(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise ShapeError(f"{what} must be a sequence, got {type(value).__name__}")
    return value


def _position(position: np.ndarray, length: int, *, inserting: bool = False) -> int:
    """A position in [-length, length - 1] ([-length, length] when inserting), made non-negative."""
    if position.size != 1:
        raise ShapeError(f"position must be a scalar, got shape {list(position.shape)}")
    p = int(position.reshape(()))
    high = length if inserting else length - 1
    if not -length <= p <= high:
        raise ShapeError(
            f"position {p} is out of range [{-length}, {high}] for a sequence of {length}"
        )
    return p + length if p < 0 else p


@op("SequenceConstruct", since=11)
def sequence_construct(*inputs):
    """ONNX SequenceConstruct-11: the inputs as a sequence."""
    return list(inputs)


@op("SequenceEmpty", since=11)
def sequence_empty(*, dtype=None):
    """ONNX SequenceEmpty-11: an empty sequence (the element dtype is not kept)."""
    if dtype is not None:
        dtypes.from_onnx(dtype)  # an unknown element type is an error, not an empty list
    return []


@op("SequenceAt", since=11, host_inputs={"position": "the position in the sequence"})
def sequence_at(input_sequence, position):
    """ONNX SequenceAt-11: the tensor at position (negative counts from the back)."""
    seq = _sequence(input_sequence, "input_sequence")
    return seq[_position(position, len(seq))]


@op("SequenceInsert", since=11, host_inputs={"position": "the position in the sequence"})
def sequence_insert(input_sequence, tensor, position=None):
    """ONNX SequenceInsert-11: a new sequence with tensor inserted at position (default: end)."""
    seq = list(_sequence(input_sequence, "input_sequence"))
    at = len(seq) if position is None else _position(position, len(seq), inserting=True)
    seq.insert(at, tensor)
    return seq


@op("SequenceErase", since=11, host_inputs={"position": "the position in the sequence"})
def sequence_erase(input_sequence, position=None):
    """ONNX SequenceErase-11: a new sequence without the tensor at position (default: last)."""
    seq = list(_sequence(input_sequence, "input_sequence"))
    if not seq:
        raise ShapeError("SequenceErase: the sequence is empty")
    del seq[-1 if position is None else _position(position, len(seq))]
    return seq


@op("SequenceLength", since=11)
def sequence_length(input_sequence):
    """ONNX SequenceLength-11: the number of tensors, an int64 scalar known on the host."""
    return np.array(len(_sequence(input_sequence, "input_sequence")), np.int64)


@op("ConcatFromSequence", since=11)
def concat_from_sequence(input_sequence, *, axis, new_axis=0):
    """ONNX ConcatFromSequence-11: concatenate the tensors along axis, or stack them (new_axis)."""
    seq = _sequence(input_sequence, "input_sequence")
    if not seq:
        raise ShapeError(
            "ConcatFromSequence: the sequence is empty, there is nothing to concatenate"
        )
    if new_axis not in (0, 1):
        raise ValueError(f"new_axis must be 0 or 1, got {new_axis}")
    rank = np.ndim(seq[0]) + new_axis
    if not -rank <= axis < rank:
        raise ShapeError(f"axis {axis} is out of range for rank {rank} (new_axis={new_axis})")
    if any(isinstance(x, np.ndarray) and x.dtype == object for x in seq):
        return np.stack(seq, axis) if new_axis else np.concatenate(seq, axis)
    arrays = [jnp.asarray(x) for x in seq]
    return jnp.stack(arrays, axis) if new_axis else jnp.concatenate(arrays, axis)


@op("SplitToSequence", since=(11, 24), host_inputs={"split": "the split sizes"})
def split_to_sequence(input, split=None, *, axis=0, keepdims=1):
    """ONNX SplitToSequence-11/24: pieces of `split` along axis (default 1, squeezed unless keepdims)."""
    x = input if isinstance(input, np.ndarray) and input.dtype == object else jnp.asarray(input)
    if not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"axis {axis} is out of range for input of rank {x.ndim}")
    axis %= x.ndim
    size = x.shape[axis]
    before = (slice(None),) * axis
    if split is None:
        return [x[(*before, i if not keepdims else slice(i, i + 1))] for i in range(size)]
    sizes = [int(s) for s in np.asarray(split).reshape(-1)]
    if any(s < 0 for s in sizes) or (split.ndim == 0 and sizes[0] == 0):
        raise ShapeError(f"split must hold positive sizes, got {sizes}")
    if split.ndim == 0:
        step = sizes[0]
        sizes = [min(step, size - start) for start in range(0, size, step)]
    elif split.ndim != 1 or sum(sizes) != size:
        raise ShapeError(
            f"split must be a scalar or 1-D sizes summing to {size} (axis {axis}), got {sizes}"
        )
    starts = np.cumsum([0, *sizes])[:-1].tolist()
    return [x[(*before, slice(s, s + n))] for s, n in zip(starts, sizes, strict=True)]


@op("SequenceMap", since=17, context=True)
def sequence_map(ctx, input_sequence, *additional_inputs, body):
    """ONNX SequenceMap-17: body applied to each element (sequences zipped, tensors shared)."""
    seq = _sequence(input_sequence, "input_sequence")
    for j, value in enumerate(additional_inputs):
        if isinstance(value, list) and len(value) != len(seq):
            raise ShapeError(
                f"SequenceMap: additional input {j} has {len(value)} elements, the input "
                f"sequence {len(seq)}"
            )
    outputs: tuple[list, ...] = tuple([] for _ in body.outputs)
    for i, element in enumerate(seq):
        extra = [v[i] if isinstance(v, list) else v for v in additional_inputs]
        for acc, value in zip(outputs, ctx.run_graph(body, [element, *extra]), strict=True):
            acc.append(value)
    return outputs


@op("Optional", since=(15, 28))
def optional(input=None, *, type=None):
    """ONNX Optional-15/28: the input as an optional; None (empty) when it is absent."""
    return input


@op("OptionalHasElement", since=(18, 28))
def optional_has_element(input=None):
    """ONNX OptionalHasElement-18/28: False for an empty optional or an absent input, else True."""
    return np.array(input is not None)


optional_has_element_v15 = op("OptionalHasElement", since=15)(variant(
    optional_has_element, "optional_has_element_v15",
    "ONNX OptionalHasElement-15: whether the optional holds a value (input required).",
    required=("input",),
))  # fmt: skip


@op("OptionalGetElement", since=(15, 18, 28))
def optional_get_element(input):
    """ONNX OptionalGetElement-15..28: the optional's value (a tensor or sequence passes through)."""
    if input is None:
        raise ValueError("OptionalGetElement: the optional is empty")
    return input
