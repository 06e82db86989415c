"""Fixture exports rewritten by ONNX Runtime's own tools (tests/fixtures/make_variants.py): fused
com.microsoft graphs, float16, dynamic and static int8, 4- and 8-bit weights, GroupQueryAttention
decoders; compiled on every recorded case, against ORT's stored outputs, and eager on the first
where an eager run can take another path than the compiled one.

Eager runs compile each operator for each new shape, which dominated this file's time. A lowering
that never asks whether a value is traced runs the same code eagerly as compiled, so an eager run
of a graph of only such lowerings repeats the compiled one op by op (tests/opcheck.py's
`eager_can_differ`, as tests/ops decides it); the float fixtures' eager runs
(test_fixture_models.py) cover the interpreter's eager path itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from opcheck import eager_can_differ

import transmuter

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
VARIANTS = ROOT / "variants"
MANIFEST = json.loads((VARIANTS / "manifest.json").read_text())
FLOAT16 = [e for e in MANIFEST if e["kind"] == "float16"]

pytestmark = pytest.mark.slow

# Float graphs (fused, GroupQueryAttention in float32, 4/8-bit weights with accuracy_level 0,
# where ORT dequantizes the weights and multiplies in float32): the fixtures' tolerance.
RTOL, ATOL = 1e-4, 1e-5
# Quantized activations: one int8 rounding that lands the other way moves an output by a
# quantization step carried through the rest of the graph, far above float rounding. The manifest
# records the model's own noise: how far ORT's outputs move when the float weights move by 1e-6
# relative before quantizing (four draws), or the float inputs by one ulp, or (llama_gqa_int4,
# accuracy_level 4) when ORT keeps the activations in float. Transmuter's float differences from
# ORT (about 1e-7 relative) are smaller than those nudges, so they should flip fewer roundings;
# twice the noise allows for that, and a wrong scale, zero point or rounding mode moves outputs by
# far more. Where the noise is below float rounding, the float tolerance applies.
NOISE_FACTOR = 2
# float16 keeps 11 significant bits, so every op rounds to 2**-11 relative. ORT's CPU kernels and
# XLA round at different places (both compute many float16 ops in float32 internally, not the
# same ones), so the outputs differ by a few float16 ulps at the scale of the output (up to 1.5
# measured): allow 4 ulps of the largest output value.
FLOAT16_ULPS = 4
FLOAT16_EPS = 2.0**-10
# compute_type="float32" on a float16 graph is compared with ORT running the same graph with its
# float16 tensors made float32 (exact: float16 values are float32 values). Outputs the file
# declares float16 are rounded to float16 at the end, half an ulp: 2**-11 relative.
FLOAT16_OUTPUT_RTOL = 1e-3
# bfloat16 keeps 8 significant bits (2**-9 relative per rounding). The BERT fixture's
# LayerNorm outputs are of order 1 (largest about 3.4) and roundings compound through two layers
# of attention, GELU and normalization: the errors measured were at most 1.4 * 2**-7 times the
# largest output value (0.028 on last_hidden_state). Allow 4 * 2**-7 of it: a wrong op (a lost
# float32 accumulation, a dropped mask) moves outputs by far more.
BFLOAT16_ULPS = 4
BFLOAT16_EPS = 2.0**-7


def cases(npz: Path, entry: dict, reference: str = "out"):
    stored = np.load(npz)
    for case in entry["cases"]:
        prefix = f"case{case['index']}/"
        inputs = {k[len(prefix) + 3 :]: stored[k] for k in stored if k.startswith(prefix + "in/")}
        want = {
            k[len(prefix) + len(reference) + 1 :]: stored[k]
            for k in stored
            if k.startswith(f"{prefix}{reference}/")
        }
        yield case["description"], inputs, want


def tolerance(entry: dict, output: str, want: np.ndarray) -> tuple[float, float]:
    """(rtol, atol) for one output of a variant; see the constants above for why."""
    if "noise" in entry:
        noise = max(by_method[output] for by_method in entry["noise"].values())
        return RTOL, max(NOISE_FACTOR * noise, ATOL)
    if entry["kind"] == "float16":
        return 0.0, FLOAT16_ULPS * FLOAT16_EPS * float(np.max(np.abs(want), initial=0.0))
    return RTOL, ATOL


def check(got: dict, expected: dict, what: str, tolerance_of) -> None:
    for name, want in expected.items():
        value = np.asarray(got[name])
        assert value.dtype == want.dtype, f"{what} {name}: dtype {value.dtype} != {want.dtype}"
        assert value.shape == want.shape, f"{what} {name}: shape {value.shape} != {want.shape}"
        rtol, atol = tolerance_of(name, want)
        np.testing.assert_allclose(
            value.astype(np.float64),
            want.astype(np.float64),
            rtol=rtol,
            atol=atol,
            err_msg=f"{what} {name}",
        )


@pytest.mark.parametrize("entry", MANIFEST, ids=[e["name"] for e in MANIFEST])
def test_matches_onnx_runtime(entry):
    model = transmuter.load(VARIANTS / entry["onnx"])
    all_cases = list(cases(VARIANTS / f"{entry['name']}.npz", entry))
    assert len(all_cases) >= 2

    def tolerance_of(name, want):
        return tolerance(entry, name, want)

    description, inputs, expected = all_cases[0]
    if eager_can_differ(onnx.load(VARIANTS / entry["onnx"], load_external_data=False)):
        check(
            transmuter.run(model, inputs),
            expected,
            f"{entry['name']} eager, {description}:",
            tolerance_of,
        )
    compiled = transmuter.compile(model, inputs)
    for description, inputs, expected in all_cases:
        what = f"{entry['name']} compiled, {description}:"
        check(compiled(inputs), expected, what, tolerance_of)
    assert compiled.segments == [(0, "end", True)]  # one program per shape, no graph break
    assert len(compiled.runner.caches[0]) == len(all_cases)
    if entry["kind"] == "float16":
        assert_native_float16_is_as_accurate_as_onnx_runtime(entry, model, compiled)
        assert len(compiled.runner.caches[0]) == len(all_cases)  # the same programs again


@pytest.mark.parametrize("entry", FLOAT16, ids=[e["name"] for e in FLOAT16])
def test_float16_graph_in_float32(entry):
    model = transmuter.load(VARIANTS / entry["onnx"], compute_type="float32")
    all_cases = list(cases(VARIANTS / f"{entry['name']}.npz", entry, reference="ref32"))
    declared = entry["outputs"]

    def tolerance_of(name, want):
        return (FLOAT16_OUTPUT_RTOL if declared[name] == "float16" else RTOL), ATOL

    compiled = transmuter.compile(model, all_cases[0][1])
    for description, inputs, expected in all_cases:
        got = {k: np.asarray(v) for k, v in compiled(inputs).items()}
        for name, dtype in declared.items():  # the file's interface types are kept
            assert got[name].dtype == np.dtype(dtype), f"{name}: {got[name].dtype} != {dtype}"
        got = {k: v.astype(np.float32) for k, v in got.items()}
        check(got, expected, f"{entry['name']} as float32, {description}:", tolerance_of)


def assert_native_float16_is_as_accurate_as_onnx_runtime(entry, model, compiled):
    """Measured against the float32 model (`ref32`), the default float16 run errs no more than
    ONNX Runtime's float16 run (the stored outputs), and its weights stay float16. Rounding
    every op's result to float16 (compute_type="float16") erred up to 1.9x more than ORT (vit:
    0.0027 against 0.0015): residual Add -> LayerNorm chains and GELU lose a bit per op.
    `compiled` is test_matches_onnx_runtime's program, already compiled for these inputs."""
    assert {np.dtype(v.dtype) for v in model.params.values()} == {np.dtype(np.float16)}
    npz = VARIANTS / f"{entry['name']}.npz"
    theirs = {d: out for d, _, out in cases(npz, entry)}
    for description, inputs, ref32 in cases(npz, entry, reference="ref32"):
        got = compiled(inputs)
        for name, want in ref32.items():
            want = want.astype(np.float64)
            ours = float(np.max(np.abs(np.asarray(got[name]).astype(np.float64) - want)))
            ort = float(np.max(np.abs(theirs[description][name].astype(np.float64) - want)))
            # A float16 output is rounded once at the end: on another CPU the float32 value
            # before it sums in another order and may round to the neighbouring float16.
            last_rounding = (
                float(np.spacing(np.float16(np.abs(want).max())))
                if np.asarray(got[name]).dtype == np.float16
                else 0.0
            )
            assert ours <= ort + last_rounding, (
                f"{entry['name']} {description} {name}: {ours} > ORT's {ort}"
            )


def test_bert_in_bfloat16():
    """The float32 BERT fixture run in bfloat16 against ORT's float32 outputs."""
    fixtures = ROOT / "models"
    entry = next(
        e for e in json.loads((fixtures / "manifest.json").read_text()) if e["name"] == "bert"
    )
    model = transmuter.load(fixtures / "bert.onnx", compute_type="bfloat16")
    all_cases = list(cases(fixtures / "bert.npz", entry))

    def tolerance_of(name, want):
        return 0.0, BFLOAT16_ULPS * BFLOAT16_EPS * float(np.max(np.abs(want)))

    compiled = transmuter.compile(model, all_cases[0][1])
    for description, inputs, expected in all_cases:
        check(compiled(inputs), expected, f"bert in bfloat16, {description}:", tolerance_of)
