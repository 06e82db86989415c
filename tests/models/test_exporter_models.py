"""Graphs in the shapes other exporters write (tests/fixtures/make_exporters.py): Paddle's -1
dims, tf2onnx's NHWC transposes and shape idioms, Optimum's merged decoder with its If on
use_cache_branch; plus a Keras model converted by the real tf2onnx (tests/fixtures/make_tf2onnx.py,
`tf2onnx_keras`); eager and compiled against ONNX Runtime's stored outputs, and `transmuter
check` on each file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import transmuter
from transmuter.cli import main

EXPORTERS = Path(__file__).resolve().parents[1] / "fixtures" / "exporters"
NAMES = ["paddle_style", "tf2onnx_style", "tf2onnx_keras", "optimum_merged_decoder"]
RTOL, ATOL = 1e-5, 1e-6


def stored_cases(name):
    stored = np.load(EXPORTERS / f"{name}.npz")
    index = 0
    while f"case{index}/" in {k[: len(f"case{index}/")] for k in stored}:
        prefix = f"case{index}/"
        inputs = {k[len(prefix) + 3 :]: stored[k] for k in stored if k.startswith(prefix + "in/")}
        outputs = {k[len(prefix) + 4 :]: stored[k] for k in stored if k.startswith(prefix + "out/")}
        yield inputs, outputs
        index += 1


@pytest.mark.parametrize("name", NAMES)
def test_exporter_graph_matches_onnx_runtime(name):
    model = transmuter.load(EXPORTERS / f"{name}.onnx")
    cases = list(stored_cases(name))
    assert len(cases) == 2
    compiled = transmuter.compile(model, cases[0][0])
    for inputs, expected in cases:
        for mode, got in (("eager", transmuter.run(model, inputs)), ("compiled", compiled(inputs))):
            for output, want in expected.items():
                np.testing.assert_allclose(
                    np.asarray(got[output]), want, rtol=RTOL, atol=ATOL, err_msg=f"{mode} {output}"
                )


def test_paddle_dims_are_free():
    model = transmuter.load(EXPORTERS / "paddle_style.onnx")
    assert str(model.input_specs["x"]) == "tensor(float32)[x_dim0, 3, x_dim2, x_dim3]"


@pytest.mark.parametrize("name", NAMES)
def test_transmuter_check_passes(name, capsys):
    assert main(["check", str(EXPORTERS / f"{name}.onnx")]) == 0
    assert "outputs match" in capsys.readouterr().out
