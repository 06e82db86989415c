"""Shape buckets: named dims padded up to a few sizes, so that shapes recur and programs are reused.

A bucketed dim (a name the file gives a dim: `batch`, `sequence`) is padded, on every input that
carries it, up to the smallest bucket that holds it; outputs that carry it are sliced back, so a
caller sees the shapes it passed. A dim the file writes as a sum (`past_sequence + 1`, a mask
over past and new tokens) is padded part by part: each part's padding sits at the end of that
part, where the part's own padding is, and slicing takes the parts back out.

Padding is exact only where the model cannot see it. Rows (a dim that is only ever the leading
axis of the inputs, a batch) are exact in row-independent graphs. Any other dim must be carried
by a mask input (an input whose name says `mask`, as exporters name attention masks), which pads
with 0 so the padded positions are hidden; a dim that comes before another in a sum (a past
before the new tokens) moves the later part, which is exact only where the model takes explicit
position ids (an input whose name says `position`). Bucketing anything else is refused when
compiling; what names cannot show (a Shape output, an unmasked mean) the compiled model's check
of its first padded call against an unpadded run finds.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from transmuter import ir
from transmuter.errors import InputError
from transmuter.runtime.execute import to_device

# A part of a dim: a dim name, or a fixed size in a sum (`past_sequence + 1`).
Part = str | int
_TERM = re.compile(r"^\s*(?:(\d+)|([A-Za-z_][\w.\-]*))\s*$")


def dim_parts(dim: ir.Dim) -> tuple[Part, ...] | None:
    """A declared dim as the parts it sums: (4,), ("batch",), ("past", 1); None for a dim
    written as another expression (a product, a quotient)."""
    if isinstance(dim, int):
        return (dim,)
    parts: list[Part] = []
    for term in dim.name.split("+"):
        match = _TERM.match(term)
        if match is None:
            return None
        number, name = match.groups()
        parts.append(int(number) if number is not None else name)
    return tuple(parts)


class Rule:
    """The sizes a bucketed dim takes: the smallest that holds the call's size, or None past the
    largest (that call compiles its exact shape)."""

    def __init__(self, dim: str, spec: Any):
        self.dim = dim
        self.sizes: tuple[int, ...] | None = None  # an explicit list
        self.step: int | None = None  # ("multiple", m)
        self.largest: int | None = None  # the bound of a rule, None for none
        if isinstance(spec, str):
            spec = (spec,)
        if isinstance(spec, tuple) and spec and spec[0] in ("pow2", "multiple"):
            self._rule(spec)
        elif isinstance(spec, Sequence) and spec and all(_is_size(s) for s in spec):
            self.sizes = tuple(sorted({int(s) for s in spec}))
            self.largest = self.sizes[-1]
        else:
            raise InputError(
                f"buckets[{dim!r}] must be a list of sizes, 'pow2', ('pow2', largest), "
                f"('multiple', m) or ('multiple', m, largest); got {spec!r}"
            )

    def _rule(self, spec: tuple) -> None:
        kind, *args = spec
        if kind == "multiple":
            if not args or not _is_size(args[0]) or args[0] < 1:
                raise InputError(f"buckets[{self.dim!r}]: ('multiple', m) needs m >= 1")
            self.step, args = int(args[0]), args[1:]
        if len(args) > 1 or (args and not _is_size(args[0])):
            raise InputError(f"buckets[{self.dim!r}]: {spec!r} takes one largest size at most")
        self.largest = int(args[0]) if args else None

    def bucket(self, size: int) -> int | None:
        if size == 0:
            return 0  # an empty dim (an empty past) is its own shape: nothing to pad
        if self.sizes is not None:
            return next((s for s in self.sizes if s >= size), None)
        if self.step is not None:
            padded = -(-size // self.step) * self.step
        else:
            padded = 1 << (size - 1).bit_length()
        return padded if self.largest is None or padded <= self.largest else None

    def all_sizes(self) -> tuple[int, ...]:
        """Every bucket, for warming up; unbounded rules have no such list."""
        if self.sizes is not None:
            return self.sizes
        if self.largest is None:
            raise InputError(
                f"warmup('buckets') needs a largest size for {self.dim!r}: give a list of "
                "sizes, ('pow2', largest) or ('multiple', m, largest)"
            )
        if self.step is not None:
            return tuple(range(self.step, self.largest + 1, self.step))
        return tuple(1 << i for i in range(int(math.log2(self.largest)) + 1))


def _is_size(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class Padding:
    """One call's bucketing: each bucketed dim's size in the call and padded, and the dims
    larger than every bucket (compiled at their exact size)."""

    sizes: dict[str, tuple[int, int]]  # dim -> (call's size, padded size), every named dim
    exceeded: dict[str, int]

    @property
    def padded(self) -> bool:
        return any(got != padded for got, padded in self.sizes.values())


class Buckets:
    """Where a model's bucketed dims are (input and output axes, by the file's dim names), how
    to pad inputs up to their buckets and slice outputs back."""

    def __init__(
        self,
        model,
        buckets: Mapping[str, Any],
        pad_values: Mapping[str, Any] | None = None,
        *,
        inputs: Sequence[str],
    ):
        self.rules = {dim: Rule(dim, spec) for dim, spec in buckets.items()}
        self.inputs = {name: _axes(model.input_specs[name]) for name in inputs}
        self.outputs = {name: _axes(model.output_specs[name]) for name in model.outputs}
        self.pad_values = dict(pad_values or {})
        known = {p for axes in self.inputs.values() for parts in axes or () for p in parts or ()}
        unknown = [d for d in self.rules if d not in known]
        if unknown:
            names = sorted(p for p in known if isinstance(p, str))
            raise InputError(
                f"buckets name dims no input declares: {unknown}; the inputs' dims are {names}"
            )
        wrong = [n for n in self.pad_values if n not in self.inputs]
        if wrong:
            raise InputError(f"pad_values name {wrong}, which are not padded inputs")
        for name, axes in self.outputs.items():
            if axes is None:
                raise InputError(
                    f"output {name!r} declares no shape: buckets slice outputs back by the dims "
                    "the file declares for them"
                )
        specs = {**model.input_specs, **model.output_specs}
        for name, axes in {**self.inputs, **self.outputs}.items():
            for axis, parts in enumerate(axes or ()):
                text = str(specs[name].shape[axis])
                if parts is None and any(
                    re.search(rf"\b{re.escape(d)}\b", text) for d in self.rules
                ):
                    raise InputError(
                        f"{name!r} axis {axis} is declared as {text!r}: buckets pad and slice "
                        "dims that are names or sums of names and sizes only"
                    )
        self._check_exact()

    def _check_exact(self) -> None:
        masks = [n for n in self.inputs if "mask" in n.lower()]
        for name in masks:
            value = self.pad_values.get(name, 0)
            if value != 0:
                raise InputError(f"pad_values[{name!r}] is {value}: a mask pads with 0")
        masked = {p for n in masks for parts in self.inputs[n] or () for p in parts or ()}
        positions = any("position" in n.lower() for n in self.inputs)
        for dim in self.rules:
            carried = [
                (name, axis, parts)
                for name, axes in self.inputs.items()
                for axis, parts in enumerate(axes or ())
                if parts and dim in parts
            ]
            if all(axis == 0 and parts == (dim,) for _, axis, parts in carried):
                continue  # rows: exact where rows are independent
            if dim not in masked:
                raise InputError(
                    f"cannot bucket {dim!r}: no mask input carries it, so the padded positions "
                    f"would change the outputs (it is in {sorted({n for n, _, _ in carried})}). "
                    "Bucket the batch dim only, or dims a mask input hides"
                )
            leading = [
                name
                for name, axes in {**self.inputs, **self.outputs}.items()
                for parts in axes or ()
                if parts and dim in parts[:-1]
            ]
            if leading and not positions:
                raise InputError(
                    f"cannot bucket {dim!r}: it comes before other positions in {leading[0]!r}, "
                    "and the model takes no position ids, so padding it would move the "
                    "positions it computes for them"
                )

    def padding(self, arrays: Mapping[str, Any]) -> Padding:
        """The call's bucketed dims: their sizes in `arrays` and their buckets."""
        sizes: dict[str, int] = {}
        sums = []
        for name, axes in self.inputs.items():
            shape = np.shape(arrays[name])
            for axis, parts in enumerate(axes or ()):
                if parts is None:
                    continue
                if len(parts) == 1 and isinstance(parts[0], str):
                    _bind(sizes, parts[0], shape[axis], name, axis)
                elif len(parts) > 1:
                    sums.append((name, axis, parts, shape[axis]))
        for name, axis, parts, size in sums:  # a sum gives its one unknown part
            unknown = [p for p in parts if isinstance(p, str) and p not in sizes]
            known = sum(p if isinstance(p, int) else sizes.get(p, 0) for p in parts)
            if len(unknown) == 1:
                _bind(sizes, unknown[0], size - known, name, axis)
            elif not unknown and known != size:
                raise InputError(
                    f"input {name!r} axis {axis} is {size}, but its dim "
                    f"{' + '.join(map(str, parts))} is {known} by the other inputs"
                )
        chosen = {dim: (size, size) for dim, size in sizes.items()}
        exceeded = {}
        for dim, rule in self.rules.items():
            if dim not in sizes:
                continue
            bucket = rule.bucket(sizes[dim])
            if bucket is None:
                exceeded[dim] = sizes[dim]
                bucket = sizes[dim]
            chosen[dim] = (sizes[dim], bucket)
        return Padding(chosen, exceeded)

    # Padding and slicing run in numpy (inputs go to the compiled program as numpy anyway):
    # through JAX every new size of a call would compile a small program of its own.

    def pad(self, arrays: Mapping[str, Any], padding: Padding) -> dict[str, Any]:
        """`arrays` with each bucketed part padded at its end to its bucket."""
        out = dict(arrays)
        for name, axes in self.inputs.items():
            pieces = self._axis_pieces(axes, padding)
            if pieces:
                value = np.asarray(arrays[name])
                for axis, parts in pieces:
                    value = _pad_axis(value, axis, parts, self.pad_values.get(name, 0))
                out[name] = value
        return out

    def slice(self, outputs: Mapping[str, Any], padding: Padding) -> dict[str, Any]:
        """`outputs` with each bucketed part cut back to the call's size."""
        out = dict(outputs)
        for name, axes in self.outputs.items():
            pieces = self._axis_pieces(axes, padding)
            if pieces:
                value = np.asarray(outputs[name])
                for axis, parts in pieces:
                    value = _slice_axis(value, axis, parts)
                out[name] = to_device(value)
        return out

    def _axis_pieces(self, axes, padding: Padding) -> list[tuple[int, list[tuple[int, int]]]]:
        """The axes whose size the padding changes, each with its parts' (call, padded) sizes."""
        found = []
        for axis, parts in enumerate(axes or ()):
            if parts and any(p in padding.sizes for p in parts):
                pieces = self._pieces(parts, padding)
                if any(got != padded for got, padded in pieces):
                    found.append((axis, pieces))
        return found

    def _pieces(self, parts: tuple[Part, ...], padding: Padding) -> list[tuple[int, int]]:
        """Each part of a dim as (size in the call, padded size)."""
        pieces = []
        for part in parts:
            if isinstance(part, int):
                pieces.append((part, part))
            elif part in padding.sizes:
                pieces.append(padding.sizes[part])
            else:
                raise InputError(f"dim {part!r} of a bucketed sum has no size in this call")
        return pieces

    def combinations(self, fixed: Mapping[str, int]) -> list[dict[str, int]]:
        """Every combination of the bucketed dims' buckets, with the other dims at `fixed`."""
        names = list(self.rules)
        grids = [self.rules[n].all_sizes() for n in names]
        return [dict(fixed, **dict(zip(names, sizes))) for sizes in itertools.product(*grids)]


def _axes(spec: Any) -> tuple[tuple[Part, ...] | None, ...] | None:
    """Each axis's parts; None where the shape is not declared."""
    if not isinstance(spec, ir.TensorType) or spec.shape is None:
        return None
    return tuple(dim_parts(d) for d in spec.shape)


def _bind(sizes: dict[str, int], dim: str, size: int, name: str, axis: int) -> None:
    if sizes.setdefault(dim, size) != size:
        raise InputError(
            f"input {name!r} axis {axis} is {size}, but dim {dim!r} is {sizes[dim]} in "
            "another input"
        )


def _pad_axis(value: np.ndarray, axis: int, pieces: list[tuple[int, int]], fill: Any):
    out, start = [], 0
    for got, padded in pieces:
        part = value[(slice(None),) * axis + (slice(start, start + got),)]
        start += got
        if padded > got:
            width = [(0, 0)] * value.ndim
            width[axis] = (0, padded - got)
            part = np.pad(part, width, constant_values=np.asarray(fill, dtype=value.dtype))
        out.append(part)
    return out[0] if len(out) == 1 else np.concatenate(out, axis=axis)


def _slice_axis(value: np.ndarray, axis: int, pieces: list[tuple[int, int]]) -> np.ndarray:
    out, start = [], 0
    for got, padded in pieces:
        out.append(value[(slice(None),) * axis + (slice(start, start + got),)])
        start += padded
    return out[0] if len(out) == 1 else np.concatenate(out, axis=axis)
