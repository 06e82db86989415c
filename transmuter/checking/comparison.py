"""Comparing outputs with the reference's, per output and node by node (the first node where
the two disagree, or where a NaN or infinity starts), and the reference's own noise."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from transmuter.checking.reference import reference_outputs
from transmuter.errors import TransmuterError
from transmuter.runtime.execute import intermediates
from transmuter.runtime.model import Model


@dataclass(frozen=True)
class Difference:
    """How one output of Transmuter compares with the reference: the largest absolute error,
    that error relative to the reference's largest magnitude (which stays meaningful where single
    elements are near zero), and whether every element is within atol + rtol * |reference|."""

    name: str
    max_abs: float
    max_rel: float
    ok: bool
    detail: str = ""  # why it is not ok, when the errors alone don't say


def difference(name: str, ours: Any, theirs: Any, *, rtol: float, atol: float) -> Difference:
    """`ours` against `theirs`: dtype and shape exactly; floats elementwise within tolerance,
    NaN where the reference has NaN, equal infinities equal; other types exactly."""
    a, b = np.asarray(ours), np.asarray(theirs)
    if a.shape != b.shape or a.dtype != b.dtype:
        detail = f"{a.dtype}{list(a.shape)} vs reference {b.dtype}{list(b.shape)}"
        return Difference(name, float("inf"), float("inf"), False, detail)
    if a.size == 0:
        return Difference(name, 0.0, 0.0, True)
    if a.dtype.kind in "OSU":  # strings: equal or not
        wrong = int(np.sum(a != b))
        error = float("inf") if wrong else 0.0
        return Difference(name, error, error, not wrong, _differ(wrong, a.size))
    wide = np.complex128 if a.dtype.kind == "c" else np.float64
    a64, b64 = a.astype(wide), b.astype(wide)
    if not (np.isnan(a64) == np.isnan(b64)).all():
        return Difference(name, float("inf"), float("inf"), False, "NaN placement differs")
    both_nan = np.isnan(b64)  # NaN placement agrees, checked above
    with np.errstate(invalid="ignore"):  # inf - inf: equal infinities are caught by a64 == b64
        err = np.where((a64 == b64) | both_nan, 0.0, np.abs(a64 - b64))
    ref = np.where(both_nan, 0.0, np.abs(b64))
    max_abs = float(err.max())
    finite = ref[np.isfinite(ref)]
    scale = float(finite.max()) if finite.size else 0.0
    max_rel = max_abs / scale if scale > 0 else max_abs
    if a.dtype.kind in "iub":
        wrong = int(np.sum(err > 0))
        return Difference(name, max_abs, max_rel, not wrong, _differ(wrong, a.size))
    # An infinite reference is matched exactly or not at all.
    ok = bool(np.all(err <= atol + rtol * np.where(np.isfinite(ref), ref, 0.0)))
    return Difference(name, max_abs, max_rel, ok)


def _differ(wrong: int, size: int) -> str:
    return f"{wrong} of {size} elements differ" if wrong else ""


def compare(
    ours: Mapping[str, Any], theirs: Mapping[str, Any], *, rtol: float = 1e-4, atol: float = 1e-5
) -> list[Difference]:
    """One `Difference` per reference output, in the reference's order."""
    return [
        difference(name, ours[name], value, rtol=rtol, atol=atol) for name, value in theirs.items()
    ]


@dataclass(frozen=True)
class Divergence:
    """The first node (in graph order) whose output differs beyond tolerance."""

    node: str
    op_type: str
    output: str
    inputs: tuple[str, ...]
    difference: Difference


def first_divergence(
    model: Model,
    source,
    inputs: Mapping[str, Any],
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    key: Any = None,
) -> Divergence | None:
    """Run `model` eagerly keeping every value, and ONNX Runtime on `source` with every
    intermediate as an output; compare node by node and return the first disagreement. `key`
    is the PRNG key for random operators without a seed (their draws differ from ORT's, so the
    search stops at them; without a key it cannot run them)."""
    return _first(
        model, source, inputs, key, lambda n, a, b: difference(n, a, b, rtol=rtol, atol=atol)
    )


def first_non_finite(
    model: Model, source, inputs: Mapping[str, Any], *, key: Any = None
) -> Divergence | None:
    """As `first_divergence`, but the first node with a NaN or infinity where the reference's
    value is finite: where a non-finite result starts, past any earlier differences that are
    only rounding or a quantized model's noise."""
    return _first(model, source, inputs, key, _non_finite)


def made_non_finite(ours: Any, theirs: Any) -> int:
    """How many elements of `ours` are NaN or infinite where the reference's are finite."""
    a, b = np.asarray(ours), np.asarray(theirs)
    if a.dtype.kind not in "fc" or a.shape != b.shape:
        return 0
    return int((~np.isfinite(a) & np.isfinite(b)).sum())


def _non_finite(name: str, ours: Any, theirs: Any) -> Difference:
    count = made_non_finite(ours, theirs)
    if not count:
        return Difference(name, 0.0, 0.0, True)
    detail = f"{count} of {np.size(ours)} elements non-finite where the reference's are finite"
    return Difference(name, float("inf"), float("inf"), False, detail)


def _first(model: Model, source, inputs: Mapping[str, Any], key: Any, test) -> Divergence | None:
    ours = intermediates(model, inputs, key=key)
    theirs = reference_outputs(source, inputs, expose_intermediates=True)
    for node in model.ir.graph.nodes:
        for name in node.outputs:
            if name and name in theirs and name in ours:
                diff = test(name, ours[name], theirs[name])
                if not diff.ok:
                    return Divergence(node.label, node.op_type, name, node.inputs, diff)
    return None


def reference_noise(
    source, inputs: Mapping[str, Any], reference: Mapping[str, Any], *, scale: float = 1e-6
) -> dict[str, float]:
    """How far the reference's own outputs move when its float inputs are scaled by 1 + scale
    and by 1 - scale: per output, the largest absolute change from `reference`. A quantized
    model requantizes every activation, so such a change moves its outputs by whole
    quantization steps; a difference from Transmuter no larger than this is within the model's
    own noise (a duration that moves by a frame, a waveform by a quantization step). An output
    whose shape the change moves (audio whose length follows a duration) is not measured: its
    noise stays 0, and a difference there is a mismatch."""
    floats = [k for k, v in inputs.items() if np.asarray(v).dtype.kind == "f"]
    if not floats:
        raise TransmuterError(
            "the model's own noise is measured by scaling its float inputs; it takes none"
        )
    noise = dict.fromkeys(reference, 0.0)
    for factor in (1 + scale, 1 - scale):
        moved = dict(inputs)
        for name in floats:
            value = np.asarray(inputs[name])
            moved[name] = value * value.dtype.type(factor)
        for name, value in reference_outputs(source, moved).items():
            base = np.asarray(reference[name])
            if base.dtype.kind in "fciu" and base.shape == np.shape(value):
                with np.errstate(invalid="ignore"):
                    change = np.abs(np.asarray(value, np.float64) - base.astype(np.float64))
                finite = change[np.isfinite(change)]
                noise[name] = max(noise[name], float(finite.max()) if finite.size else 0.0)
    return noise
