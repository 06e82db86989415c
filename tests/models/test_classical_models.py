"""scikit-learn, LightGBM and XGBoost models as skl2onnx / onnxmltools convert them by default
(tests/fixtures/make_classical.py), against stored ONNX Runtime outputs, eager and compiled:
labels exactly, scores and probabilities to 1e-5, ZipMap's maps key by key."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import transmuter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "classical"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["models"]
RTOL, ATOL = 1e-5, 1e-5

pytestmark = pytest.mark.slow


def stored(name):
    data = np.load(FIXTURES / f"{name}.npz", allow_pickle=True)
    inputs = {k[3:]: data[k] for k in data if k.startswith("in/")}
    outputs = {k[4:]: data[k] for k in data if k.startswith("out/")}
    return inputs, outputs


def check(got, expected, maps, what):
    for name, want in expected.items():
        value = got[name]
        if name in maps:  # a sequence of maps: one dict per row, keys as ONNX Runtime's
            assert isinstance(value, list) and len(value) == len(want), f"{what} {name}"
            for row, (m, w) in enumerate(zip(value, want)):
                assert list(m) == maps[name], f"{what} {name}[{row}] keys {list(m)}"
                got_row = np.array([m[k] for k in maps[name]])
                assert got_row.dtype == np.float32, f"{what} {name}[{row}]: {got_row.dtype}"
                np.testing.assert_allclose(got_row, w, rtol=RTOL, atol=ATOL, err_msg=what)
            continue
        value = np.asarray(value)
        assert value.dtype == want.dtype, f"{what} {name}: dtype {value.dtype} != {want.dtype}"
        assert value.shape == want.shape, f"{what} {name}: shape {value.shape} != {want.shape}"
        if want.dtype.kind in "iubO":
            np.testing.assert_array_equal(value, want, err_msg=f"{what} {name}")
        else:
            np.testing.assert_allclose(value, want, rtol=RTOL, atol=ATOL, err_msg=f"{what} {name}")


def _numeric_inputs(name) -> bool:
    return all(v.dtype != object for v in stored(name)[0].values())


# Models whose inputs are strings (the TF-IDF pipelines) run their string ops on the host before
# anything compiles, so they have no first program to look at.
ZIPMAP_COMPILED = {n for n, e in MANIFEST.items() if e["maps"] and _numeric_inputs(n)}


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_matches_onnx_runtime(name):
    entry = MANIFEST[name]
    model = transmuter.load(FIXTURES / f"{name}.onnx")
    inputs, expected = stored(name)
    check(transmuter.run(model, inputs), expected, entry["maps"], f"{name} eager:")
    compiled = transmuter.compile(model, inputs)
    if name in ZIPMAP_COMPILED:  # only the map construction runs on the host
        assert_zipmap_keeps_the_scores_compiled(compiled)
    check(compiled(inputs), expected, entry["maps"], f"{name} compiled:")
    # Another batch size: the first rows again, a new program for the new shape.
    half = {k: v[:5] for k, v in inputs.items()}
    check(compiled(half), {k: v[:5] for k, v in expected.items()}, entry["maps"], f"{name} N=5:")


def assert_zipmap_keeps_the_scores_compiled(compiled):
    # The segment before the map construction is one program, which ends at ZipMap.
    first = compiled.segments[0]
    assert first[0] == 0 and first[2], compiled.segments
    zipmap = compiled.runner.plan.steps[first[1]].node
    assert zipmap.op_type == "ZipMap", compiled.segments
