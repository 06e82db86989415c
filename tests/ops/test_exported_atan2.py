"""torch.onnx's atan2 as exports carry it (Div, Atan, Greater/Less and two Where), against ONNX
Runtime: eager and compiled, with and without the optimization passes, and a NaN from its 0 / 0
reaching a quantized Conv, as in Kokoro-82M's int8 export (STFT -> atan2 -> Concat ->
DynamicQuantizeLinear -> ConvInteger).

At y = x = 0 the pattern is NaN in every runtime: Less(0, 0) is false, so the outer Where picks
atan(0 / 0); no Where leaves it out. What differed was DynamicQuantizeLinear, whose NaN min/max made
the scale NaN and so the whole integer product NaN, where ONNX Runtime skips the NaN.
Subnormals are left out of the value grid: XLA:CPU flushes them to zero, so 1e-45 / 0 is 0 / 0
(NaN) there and +inf in ONNX Runtime.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from opcheck import assert_close, make_model, ort_run

import transmuter

# Zeros of both signs, tiny and huge normals, infinities: every quadrant and both axes.
EDGES = [0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 3e38, -3e38, np.inf, -np.inf]


def atan2_nodes(y: str, x: str, out: str, dtype=np.float32) -> list[onnx.NodeProto]:
    """The nodes torch.onnx's symbolic_opset9.atan2 writes for torch.atan2(y, x)."""

    def constant(name, value):
        tensor = numpy_helper.from_array(np.array(value, dtype))
        return helper.make_node("Constant", [], [name], value=tensor)

    return [
        constant("zero", 0.0),
        constant("pi", np.pi),
        helper.make_node("Div", [y, x], ["slope"]),
        helper.make_node("Atan", ["slope"], ["atan"]),
        helper.make_node("Greater", [y, "zero"], ["upper"]),
        helper.make_node("Add", ["atan", "pi"], ["plus_pi"]),
        helper.make_node("Sub", ["atan", "pi"], ["minus_pi"]),
        helper.make_node("Where", ["upper", "plus_pi", "minus_pi"], ["second_third"]),
        helper.make_node("Less", [x, "zero"], ["left"]),
        helper.make_node("Where", ["left", "second_third", "atan"], [out]),
    ]


def runs(proto: onnx.ModelProto, feeds: dict) -> dict[str, list[np.ndarray]]:
    """Outputs of eager and compiled runs, after the default passes and after none."""
    found = {}
    for optimize in (True, False):
        model = transmuter.load(proto, optimize=optimize)
        for mode, out in (
            ("eager", transmuter.run(model, feeds)),
            ("compiled", transmuter.compile(model, feeds)(feeds)),
        ):
            found[f"{mode}, optimize={optimize}"] = [np.asarray(out[n]) for n in model.outputs]
    return found


def test_pattern_matches_onnx_runtime():
    y, x = (a.ravel() for a in np.meshgrid(*[np.array(EDGES, np.float32)] * 2))
    n = y.size
    proto = make_model(
        atan2_nodes("y", "x", "angle"),
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, [n]) for k in ("y", "x")],
        [helper.make_tensor_value_info("angle", TensorProto.FLOAT, [n])],
    )
    feeds = {"y": y, "x": x}
    (expected,) = ort_run(proto, feeds)
    # 0 / 0 and inf / inf are NaN, and the Where selects them: NaN in ONNX Runtime too.
    assert np.array_equal(np.isnan(expected), (y == 0) & (x == 0) | np.isinf(y) & np.isinf(x))
    for mode, (got,) in runs(proto, feeds).items():
        assert_close(got, expected, rtol=1e-6, atol=1e-6, what=mode)


def quantized_phase_conv() -> onnx.ModelProto:
    """[1, bins, frames] real and imaginary parts -> Concat(atan2 phase, real, imaginary) ->
    DynamicQuantizeLinear -> ConvInteger -> float, as Kokoro's int8 harmonic branch (which
    concatenates magnitude and phase). The range's extremes come after the NaNs: ONNX Runtime's
    SIMD min/max forgets what a lane saw before a NaN, so only then does it find the true range."""
    bins, filters = 11, 8
    weights = np.random.default_rng(1).integers(-127, 128, (filters, 3 * bins, 7), np.int8)
    nodes = [
        *atan2_nodes("imag", "real", "phase"),
        helper.make_node("Concat", ["phase", "real", "imag"], ["harmonic"], axis=1),
        helper.make_node("DynamicQuantizeLinear", ["harmonic"], ["q", "q_scale", "q_zero"]),
        helper.make_node("ConvInteger", ["q", "w", "q_zero", "w_zero"], ["acc"], pads=[3, 3]),
        helper.make_node("Cast", ["acc"], ["acc_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["acc_float", "q_scale"], ["out"]),
    ]
    spectrum = [1, bins, "frames"]
    return make_model(
        nodes,
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, spectrum) for k in ("real", "imag")],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in ("out", "phase")],
        [
            numpy_helper.from_array(weights, "w"),
            numpy_helper.from_array(np.array(0, np.int8), "w_zero"),
        ],
    )


def test_nan_of_zero_over_zero_stays_out_of_the_quantized_conv():
    rng = np.random.default_rng(0)
    real, imag = 4 * rng.standard_normal((2, 1, 11, 20)).astype(np.float32)
    real[..., 5:9] = imag[..., 5:9] = 0.0  # silent frames: every bin is 0 / 0
    imag[:, 0] = 0.0  # the DC bin's imaginary part is exactly zero, as a real FFT's
    feeds = {"real": real, "imag": imag}
    proto = quantized_phase_conv()
    expected_out, expected_phase = ort_run(proto, feeds)
    assert np.isnan(expected_phase).sum() == 4 * 11 and np.isfinite(expected_out).all()
    for mode, (out, phase) in runs(proto, feeds).items():
        assert_close(phase, expected_phase, rtol=1e-6, atol=1e-6, what=f"phase ({mode})")
        # One quantization step of one input may differ where atan rounds apart: a few units
        # of the largest weight times the scale.
        assert_close(out, expected_out, rtol=0, atol=1e-3, what=f"conv ({mode})")


@pytest.mark.parametrize("length", [400, 45020])
def test_stft_of_a_2d_signal_into_the_pattern(length):
    """torch.onnx's stft writes a [batch, length] signal (Kokoro: [1, 45020]); the compiled
    program gives ONNX Runtime's NaNs (silent frames) and nothing else."""
    rng = np.random.default_rng(2)
    signal = (0.1 * rng.standard_normal((1, length))).astype(np.float32)
    signal[:, 100:200] = 0.0
    window = np.hanning(21)[:-1].astype(np.float32)
    nodes = [
        helper.make_node("STFT", ["signal", "step", "window", "size"], ["spectrum"]),
        helper.make_node("Split", ["spectrum"], ["re", "im"], axis=3, num_outputs=2),
        *atan2_nodes("im", "re", "angle"),
    ]
    proto = make_model(
        nodes,
        [helper.make_tensor_value_info("signal", TensorProto.FLOAT, [1, "length"])],
        [helper.make_tensor_value_info("angle", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.array(5, np.int64), "step"),
            numpy_helper.from_array(window, "window"),
            numpy_helper.from_array(np.array(20, np.int64), "size"),
        ],
        opset=18,
    )
    feeds = {"signal": signal}
    (expected,) = ort_run(proto, feeds)
    model = transmuter.load(proto)
    got = np.asarray(transmuter.compile(model, feeds)(feeds)["angle"])
    assert got.shape == expected.shape == (1, (length - 20) // 5 + 1, 11, 1)
    assert np.array_equal(np.isnan(got), np.isnan(expected))
    starts = np.arange(got.shape[1]) * 5
    silent = (starts >= 100) & (starts + 20 <= 200)
    assert np.array_equal(np.isnan(got[0]).any(axis=(1, 2)), silent)
    assert np.isnan(got[0, silent]).all()


@pytest.mark.parametrize("compiled", [False, True])
def test_pattern_gradients_are_atan2s(compiled):
    """jax.grad through both Where equals atan2's own partials, x / r^2 and -y / r^2, in every
    quadrant: the branches a Where leaves out contribute nothing."""
    rng = np.random.default_rng(3)
    y, x = (
        (rng.uniform(0.2, 2.0, 64) * rng.choice([-1.0, 1.0], 64)).astype(np.float32).reshape(2, 32)
    )
    proto = make_model(
        atan2_nodes("y", "x", "angle"),
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, [32]) for k in ("y", "x")],
        [helper.make_tensor_value_info("angle", TensorProto.FLOAT, [32])],
    )
    model = transmuter.load(proto)
    weight = rng.uniform(0.5, 1.5, 32).astype(np.float32)

    def loss(y, x):
        return jnp.sum(transmuter.run(model, {"y": y, "x": x})["angle"] * weight)

    grad = jax.grad(loss, argnums=(0, 1))
    dy, dx = (jax.jit(grad) if compiled else grad)(y, x)
    r2 = x.astype(np.float64) ** 2 + y.astype(np.float64) ** 2
    np.testing.assert_allclose(dy, weight * x / r2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, -weight * y / r2, rtol=1e-5, atol=1e-6)
