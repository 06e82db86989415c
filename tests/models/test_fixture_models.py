"""Tiny Hugging Face exports (tests/fixtures/make_models.py) against stored ONNX Runtime outputs,
compiled at two input sizes each (decoders: an empty and a non-empty past) and eager on the first.

Eager runs compile each operator again for each new shape, which dominated this file's time; the
second size's new shapes are what the compiled program (one program per shape, asserted below)
covers, and eager execution itself is the same at either size, so only the first case runs eagerly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import transmuter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
RTOL, ATOL = 1e-4, 1e-5

pytestmark = pytest.mark.slow


def cases(entry):
    stored = np.load(FIXTURES / f"{entry['name']}.npz")
    for case in entry["cases"]:
        prefix = f"case{case['index']}/"
        inputs = {k[len(prefix) + 3 :]: stored[k] for k in stored if k.startswith(prefix + "in/")}
        outputs = {k[len(prefix) + 4 :]: stored[k] for k in stored if k.startswith(prefix + "out/")}
        yield case["description"], inputs, outputs


def check(got, expected, what):
    for name, want in expected.items():
        value = np.asarray(got[name])
        assert value.dtype == want.dtype, f"{what} {name}: dtype {value.dtype} != {want.dtype}"
        assert value.shape == want.shape, f"{what} {name}: shape {value.shape} != {want.shape}"
        np.testing.assert_allclose(value, want, rtol=RTOL, atol=ATOL, err_msg=f"{what} {name}")


@pytest.mark.parametrize("entry", MANIFEST, ids=[e["name"] for e in MANIFEST])
def test_matches_onnx_runtime(entry):
    model = transmuter.load(FIXTURES / entry["onnx"])
    all_cases = list(cases(entry))
    assert len(all_cases) >= 2
    compiled = transmuter.compile(model, all_cases[0][1])
    description, inputs, expected = all_cases[0]
    check(transmuter.run(model, inputs), expected, f"{entry['name']} eager, {description}:")
    for description, inputs, expected in all_cases:
        check(compiled(inputs), expected, f"{entry['name']} compiled, {description}:")
    assert compiled.segments == [(0, "end", True)]  # one program per shape, no graph break
    assert len(compiled.runner.caches[0]) == len(all_cases)
