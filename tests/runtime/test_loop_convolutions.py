"""Convolutions inside loops reach XLA channels last with HWIO kernels read from the loop state
(transmuter/runtime/loop_convolutions.py): XLA:CPU makes a convolution fast only at a program's
top level, and a kernel transposed inside a while body is transposed on every step."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import transmuter
from transmuter.runtime.loop_convolutions import loop_convolutions, slow_loop_convolutions

RNG = np.random.default_rng(0)
C = 8


def _hlo(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


def test_the_check_finds_channels_first_convolutions_in_loops_only():
    x = jnp.ones((1, C, 6, 6), jnp.float32)
    w = jnp.ones((C, C, 3, 3), jnp.float32)

    def conv(x, w, layout):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=layout)

    nchw = ("NCHW", "OIHW", "NCHW")
    in_loop = _hlo(lambda x, w: jax.lax.fori_loop(0, 3, lambda i, x: conv(x, w, nchw), x), x, w)
    (slow,) = slow_loop_convolutions(in_loop)
    assert slow.dim_labels == "bf01_oi01->bf01"
    assert loop_convolutions(_hlo(lambda x, w: conv(x, w, nchw), x, w)) == []  # top level

    xl, hwio = jnp.transpose(x, (0, 2, 3, 1)), jnp.transpose(w, (2, 3, 1, 0))
    nhwc = ("NHWC", "HWIO", "NHWC")
    text = _hlo(lambda x, w: jax.lax.fori_loop(0, 3, lambda i, x: conv(x, w, nhwc), x), xl, hwio)
    (found,) = loop_convolutions(text)
    assert found.dim_labels == "b01f_01io->b01f" and found.kernel == "get-tuple-element"
    assert slow_loop_convolutions(text) == []
    ohwi = ("NHWC", "OHWI", "NHWC")  # channels last, but a kernel XLA:CPU runs slowly in a loop
    ohwi_w = jnp.transpose(w, (0, 2, 3, 1))
    text = _hlo(lambda x, w: jax.lax.fori_loop(0, 3, lambda i, x: conv(x, w, ohwi), x), xl, ohwi_w)
    assert [c.dim_labels for c in slow_loop_convolutions(text)] == ["b01f_o01i->b01f"]


# ---- ONNX Loop and Scan bodies holding convolutions -------------------------------------------


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _conv_nodes(x, out, kernel):
    """Two convolutions with a Relu between, reading `kernel` and the bias `b` (outer scope)."""
    return [
        helper.make_node("Conv", [x, kernel, "b"], [f"{out}_c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", [f"{out}_c"], [f"{out}_r"]),
        helper.make_node("Conv", [f"{out}_r", kernel], [out], pads=[1, 1, 1, 1]),
    ]


W = (RNG.standard_normal((C, C, 3, 3)) / 8).astype(np.float32)


def _kernel_source(source: str):
    """(outer nodes, outer initializers, name the body reads) for a kernel from `source`."""
    w = W
    if source == "constant":
        return [], {"w": w}, "w"
    if source == "input":  # computed at run time (a graph input here): transposed before the loop
        return [], {}, "w"
    # A float16 kernel read in float32: what compute_type makes of a float16 export.
    cast = helper.make_node("Cast", ["w16"], ["w32"], to=TP.FLOAT)
    return [cast], {"w16": w.astype(np.float16)}, "w32"


def _model(outer_nodes, node, initializers, outputs):
    inits = {"b": RNG.standard_normal(C).astype(np.float32), **initializers}
    inputs = [_vi("x", TP.FLOAT, [1, C, 6, 6])]
    if not any(name.startswith("w") for name in initializers):
        inputs.append(_vi("w", TP.FLOAT, [C, C, 3, 3]))
    graph = helper.make_graph(
        [*outer_nodes, node],
        "main",
        inputs,
        [helper.make_value_info(n, onnx.TypeProto()) for n in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _loop_model(source: str):
    outer, inits, kernel = _kernel_source(source)
    body = helper.make_graph(
        [*_conv_nodes("x_in", "x_out", kernel), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [_vi("i", TP.INT64, []), _vi("c_in", TP.BOOL, []), _vi("x_in", TP.FLOAT, None)],
        [_vi("c_out", TP.BOOL, []), _vi("x_out", TP.FLOAT, None)],
    )
    node = helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)
    return _model(outer, node, {**inits, "M": np.array(3, np.int64)}, ["y"])


def _scan_model(source: str):
    outer, inits, kernel = _kernel_source(source)
    nodes = [
        *_conv_nodes("s_in", "s_c", kernel),
        helper.make_node("Add", ["s_c", "x_t"], ["s_out"]),
    ]
    nodes.append(helper.make_node("Identity", ["s_out"], ["y_t"]))
    body = helper.make_graph(
        nodes,
        "body",
        [_vi("s_in", TP.FLOAT, [1, C, 6, 6]), _vi("x_t", TP.FLOAT, [1, C, 6, 6])],
        [_vi("s_out", TP.FLOAT, [1, C, 6, 6]), _vi("y_t", TP.FLOAT, [1, C, 6, 6])],
    )
    node = helper.make_node(
        "Scan", ["x", "xs"], ["y", "ys"], body=body, num_scan_inputs=1, scan_input_axes=[0]
    )
    inits["xs"] = RNG.standard_normal((3, 1, C, 6, 6)).astype(np.float32)
    return _model(outer, node, inits, ["y", "ys"])


@pytest.mark.parametrize("make", [_loop_model, _scan_model], ids=["Loop", "Scan"])
@pytest.mark.parametrize("source", ["constant", "cast", "input"])
def test_onnx_loop_bodies_convolve_channels_last_reading_kernels_laid_out_once(make, source):
    proto = make(source)
    inputs = {"x": RNG.standard_normal((1, C, 6, 6)).astype(np.float32)}
    if source == "input":
        inputs["w"] = W
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, inputs)
    for optimize in (True, False):
        model = transmuter.load(proto, optimize=optimize)

        def run(params, inputs):
            return transmuter.run(model, inputs, params=params)  # noqa: B023

        text = _hlo(run, model.params, inputs)
        found = loop_convolutions(text)
        assert len(found) == 2, found  # the body's two
        assert slow_loop_convolutions(text) == []
        if optimize:  # the layout pass stores the kernel as the loop reads it
            assert {c.kernel for c in found} == {"get-tuple-element"}, found
        outputs = jax.jit(run)(model.params, inputs)
        for got, want in zip(outputs.values(), expected, strict=True):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


@pytest.mark.xfail(
    strict=True,
    reason="ConvTranspose's kernel is flipped and transposed in the lowering, inside the body on "
    "every step: XLA's loop-invariant code motion does not hoist reverse and transpose, and no "
    "graph rewrite stores it flipped yet",
)
def test_a_loop_body_conv_transpose_reads_its_kernel_laid_out_once():
    body = helper.make_graph(
        [
            helper.make_node(
                "ConvTranspose", ["x_in", "w"], ["t"], strides=[2, 2], pads=[1, 1, 1, 1]
            ),
            helper.make_node("MaxPool", ["t"], ["x_out"], kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [_vi("i", TP.INT64, []), _vi("c_in", TP.BOOL, []), _vi("x_in", TP.FLOAT, None)],
        [_vi("c_out", TP.BOOL, []), _vi("x_out", TP.FLOAT, None)],
    )
    node = helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)
    w = (RNG.standard_normal((C, C, 4, 4)) / 8).astype(np.float32)
    model = transmuter.load(_model([], node, {"w": w, "M": np.array(3, np.int64)}, ["y"]))
    x = RNG.standard_normal((1, C, 6, 6)).astype(np.float32)

    def run(params, x):
        return transmuter.run(model, {"x": x}, params=params)

    (found,) = loop_convolutions(_hlo(run, model.params, x))
    assert found.dim_labels == "b01f_01io->b01f"  # holds already
    assert found.kernel == "get-tuple-element", found


# ---- the text-to-image program: the whole denoising loop as one while loop --------------------

TINY_SD = Path(__file__).resolve().parents[1] / "fixtures" / "pipelines" / "tiny-sd"


def test_the_text_to_image_loop_convolves_channels_last_on_stored_kernels():
    pipe = transmuter.pipeline("text-to-image", TINY_SD)
    program, texts = pipe._program, []

    def lowered(*args, **static):  # the pipeline's own program, its optimized HLO kept
        compiled = program.lower(*args, **static).compile()
        texts.append(compiled.as_text())
        return compiled(*args)

    pipe._program = lowered
    pipe("a red cube", num_inference_steps=2, height=16, width=16, output_type="np")
    (text,) = texts
    found = loop_convolutions(text)
    assert len(found) >= 10, found  # the UNet's
    assert slow_loop_convolutions(text) == []
    assert {c.kernel for c in found} == {"get-tuple-element"}  # params, read as stored
