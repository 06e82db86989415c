"""DFT, STFT, the window functions and MelWeightMatrix against ONNX Runtime (or onnx.reference).

Float32 FFTs round differently from ONNX Runtime's own FFT: errors grow with the transform size
and the magnitude of the spectrum, so float32 cases use atol/rtol 1e-4 (1e-5 is not enough from
a few dozen points on). Where the two references part, we follow the spec:
- IRFFT (inverse=1, onesided=1) with an explicit dft_length other than 2 * (bins - 1): ONNX
  Runtime does not drop the bins beyond dft_length // 2 + 1; onnx.reference and we follow
  numpy's irfft, the transform the spec refers to.
- A forward one-sided DFT of complex input is an error ("only real input is supported"), as in
  ONNX Runtime; onnx.reference quietly truncates the full spectrum.
- STFT with neither window nor frame_length: the spec says frame_length = signal_length
  (onnx.reference); ONNX Runtime fails.
ONNX Runtime crashes (segfault) on a DFT-20 node whose trailing optional input is named "", so
DFT-20 cases list only the inputs they pass.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from opcheck import (
    assert_close,
    check_node,
    make_node_model,
    reference_run,
    transmuter_runs,
)

from transmuter.errors import TransmuterError

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = {"rtol": 1e-4, "atol": 1e-4}
TOL = {
    np.float32: F32,
    np.float64: {"rtol": 1e-10, "atol": 1e-10},
    np.float16: {"rtol": 1e-2, "atol": 2e-2},
}


def _i64(v):
    return np.array(v, np.int64)


def _dft_inputs(x, dft_length=None, axis=None):
    """Inputs and node input order for a DFT-20 node without trailing empty inputs."""
    inputs = {"input": x, "dft_length": dft_length, "axis": axis}
    names = ["input", "dft_length", "axis"]
    while inputs[names[-1]] is None:
        names.pop()
    return inputs, names


def _expect(op_type, inputs, attrs, expected, *, opset, rtol, atol, **options):
    """Run through Transmuter only and compare with `expected`."""
    model = make_node_model(op_type, inputs, attrs, opset=opset, **options)
    for mode, outputs in transmuter_runs(model, inputs).items():
        assert_close(outputs[0], expected, rtol=rtol, atol=atol, what=f"{op_type} ({mode})")


# ----------------------------------------------------------------------------------------- DFT

# (input shape, attributes) over the transform kinds; shapes end with 1 (real) or 2 (complex).
DFT_CASES = [
    ((2, 8, 1), {}),
    ((2, 8, 2), {}),
    ((2, 8, 1), {"onesided": 1}),
    ((2, 7, 1), {"onesided": 1}),
    ((2, 8, 1), {"inverse": 1}),
    ((2, 8, 2), {"inverse": 1}),
    ((2, 5, 2), {"inverse": 1, "onesided": 1}),
    ((3, 6, 4, 2), {}),
    ((3, 6, 4, 1), {"onesided": 1}),
]


@pytest.mark.parametrize("shape, attrs", DFT_CASES, ids=str)
def test_dft_17_default_axis(rng, shape, attrs):
    x = rng.standard_normal(shape).astype(np.float32)
    check_node("DFT", {"input": x}, attrs, opset=17, **F32)


@pytest.mark.parametrize("shape, attrs", DFT_CASES, ids=str)
def test_dft_20_default_axis(rng, shape, attrs):
    x = rng.standard_normal(shape).astype(np.float32)
    inputs, names = _dft_inputs(x)
    check_node("DFT", inputs, attrs, opset=20, input_names=names, **F32)


@pytest.mark.parametrize("axis", [0, 1, 2, -2, -3, -4])
@pytest.mark.parametrize(
    "last, attrs",
    [(2, {}), (1, {"onesided": 1}), (2, {"inverse": 1}), (2, {"inverse": 1, "onesided": 1})],
)
def test_dft_axes(rng, axis, last, attrs):
    x = rng.standard_normal((4, 6, 5, last)).astype(np.float32)
    check_node("DFT", {"input": x}, {**attrs, "axis": axis}, opset=17, **F32)
    inputs, names = _dft_inputs(x, axis=_i64(axis))
    check_node("DFT", inputs, attrs, opset=20, input_names=names, constants=["axis"], **F32)


@pytest.mark.parametrize("length", [3, 8, 13])
@pytest.mark.parametrize(
    "last, attrs", [(1, {}), (2, {}), (1, {"onesided": 1}), (2, {"inverse": 1})]
)
def test_dft_length_pads_or_truncates(rng, length, last, attrs):
    x = rng.standard_normal((2, 8, last)).astype(np.float32)
    # dft_length may be int32 or int64.
    n = np.array(length, np.int32 if length == 3 else np.int64)
    check_node(
        "DFT",
        {"input": x, "dft_length": n},
        {**attrs, "axis": 1},
        opset=17,
        constants=["dft_length"],
        **F32,
    )
    inputs, names = _dft_inputs(x, dft_length=n, axis=_i64(1))
    check_node(
        "DFT", inputs, attrs, opset=20, input_names=names, constants=["dft_length", "axis"], **F32
    )


@pytest.mark.parametrize("length", [4, 7, 9, 10, 12])
def test_irfft_length_follows_numpy(rng, length):
    # ONNX Runtime disagrees when length != 2 * (bins - 1): see the module docstring.
    x = rng.standard_normal((2, 6, 3, 2)).astype(np.float32)
    n = _i64(length)
    attrs = {"inverse": 1, "onesided": 1}
    expected = np.fft.irfft(x[..., 0] + 1j * x[..., 1], n=length, axis=1)[..., None]
    inputs, names = _dft_inputs(x, dft_length=n, axis=_i64(1))
    _expect(
        "DFT",
        inputs,
        attrs,
        expected.astype(np.float32),
        opset=20,
        input_names=names,
        constants=["dft_length", "axis"],
        **F32,
    )
    check_node(
        "DFT",
        inputs,
        attrs,
        opset=20,
        input_names=names,
        constants=["dft_length", "axis"],
        reference="onnx",
        **F32,
    )


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
@pytest.mark.parametrize(
    "last, attrs", [(2, {}), (1, {"onesided": 1}), (2, {"inverse": 1, "onesided": 1})]
)
def test_dft_dtypes(rng, dtype, last, attrs):
    x = rng.standard_normal((2, 8, last)).astype(dtype)
    # ONNX Runtime's float64 IRFFT is only float32-accurate (errors ~3e-8): use onnx.reference.
    irfft = attrs.get("inverse") and attrs.get("onesided")
    reference = "onnx" if dtype == np.float64 and irfft else "ort"
    check_node("DFT", {"input": x}, attrs, opset=17, reference=reference, **TOL[dtype])
    check_node("DFT", {"input": x}, attrs, opset=20, reference=reference, **TOL[dtype])


def test_dft_bfloat16(rng):
    x = rng.standard_normal((2, 8, 2)).astype(np.float32)
    expected = np.fft.fft(x[..., 0] + 1j * x[..., 1], axis=1)
    expected = np.stack([expected.real, expected.imag], -1).astype(BF16)
    _expect("DFT", {"input": x.astype(BF16)}, {}, expected, opset=20, rtol=2e-2, atol=5e-2)


def test_dft_large_float32(rng):
    # 1e-4 is needed here: float32 rounding over 512 points differs between FFT libraries.
    x = rng.standard_normal((3, 512, 2)).astype(np.float32)
    check_node("DFT", {"input": x}, {}, opset=20, rtol=1e-4, atol=1e-3)
    check_node("DFT", {"input": x}, {"inverse": 1}, opset=20, **F32)


def test_dft_zero_batch_and_symbolic_batch(rng):
    x = np.zeros((0, 8, 2), np.float32)
    check_node("DFT", {"input": x}, {}, opset=20)
    x = rng.standard_normal((3, 8, 1)).astype(np.float32)
    check_node("DFT", {"input": x}, {"onesided": 1}, opset=20, symbolic={"input": [0]}, **F32)


@pytest.mark.parametrize(
    "shape, attrs, opset, match",
    [
        ((2, 8, 2), {"onesided": 1}, 20, "RFFT"),
        ((2, 8, 1), {"onesided": 1, "inverse": 1}, 20, "IRFFT"),
        ((2, 8, 2), {"axis": 2}, 17, "axis 2 is out of range"),
        ((2, 8, 2), {"axis": -1}, 17, "axis -1 is out of range"),
        ((2, 8, 3), {}, 20, "end with an axis of 1"),
        ((2, 1, 2), {"onesided": 1, "inverse": 1, "axis": 1}, 17, "default dft_length is 0"),
        ((2, 8, 2), {"inverse": 2}, 20, "inverse"),
    ],
)
def test_dft_errors(shape, attrs, opset, match):
    x = np.zeros(shape, np.float32)
    model = make_node_model("DFT", {"input": x}, attrs, opset=opset)
    with pytest.raises(TransmuterError, match=match):
        transmuter_runs(model, {"input": x}, compiled=False)


def test_dft_length_must_be_positive():
    x = np.zeros((2, 8, 2), np.float32)
    inputs = {"input": x, "dft_length": _i64(0)}
    model = make_node_model("DFT", inputs, {}, opset=20, constants=["dft_length"])
    with pytest.raises(TransmuterError, match="dft_length must be >= 1"):
        transmuter_runs(model, inputs, compiled=False)


# ---------------------------------------------------------------------------------------- STFT

STFT_NAMES = ["signal", "frame_step", "window", "frame_length"]


def _stft(signal, step, window=None, length=None):
    inputs = {"signal": signal, "frame_step": step, "window": window, "frame_length": length}
    names = list(STFT_NAMES)
    while inputs[names[-1]] is None:
        names.pop()
    return inputs, {"input_names": names, "constants": ["frame_step", "frame_length"]}


@pytest.mark.parametrize("last", [1, 2])
@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("step, size", [(3, 8), (5, 7), (1, 16)])
@pytest.mark.parametrize("given", ["both", "window", "length"])
def test_stft(rng, last, onesided, step, size, given):
    # Complex onesided output keeps the first size // 2 + 1 bins, as both references do.
    signal = rng.standard_normal((2, 32, last)).astype(np.float32)
    window = np.hanning(size).astype(np.float32) if given != "length" else None
    length = _i64(size) if given != "window" else None
    inputs, options = _stft(signal, _i64(step), window, length)
    check_node("STFT", inputs, {"onesided": onesided}, opset=17, **options, **F32)


def test_stft_default_onesided_and_int32_params(rng):
    signal = rng.standard_normal((1, 40, 1)).astype(np.float32)
    window = np.hamming(10).astype(np.float32)
    inputs, options = _stft(signal, np.array(6, np.int32), window, np.array(10, np.int32))
    check_node("STFT", inputs, {}, opset=17, **options, **F32)


@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("given", ["both", "window", "length"])
def test_stft_real_signal_without_trailing_axis(rng, onesided, given):
    # [batch, signal_length], as torch.onnx writes torch.stft (Kokoro-82M): outside the spec's
    # [batch, length, 1], but ONNX Runtime takes it as a real signal, and so do we.
    signal = rng.standard_normal((2, 45)).astype(np.float32)
    window = np.hanning(10).astype(np.float32) if given != "length" else None
    length = _i64(10) if given != "window" else None
    inputs, options = _stft(signal, _i64(5), window, length)
    out = check_node("STFT", inputs, {"onesided": onesided}, opset=17, **options, **F32)
    inputs["signal"] = signal[..., None]
    check_node("STFT", inputs, {"onesided": onesided}, opset=17, expected=out, **options, **F32)


def test_stft_2d_signal_symbolic_length_and_window_input(rng):
    signal = rng.standard_normal((1, 300)).astype(np.float32)
    inputs, options = _stft(signal, _i64(7), rng.random(20).astype(np.float32), _i64(20))
    check_node("STFT", inputs, {}, opset=17, symbolic={"signal": [0, 1]}, **options, **F32)


def test_stft_whole_signal_frame(rng):
    # Neither window nor frame_length: one frame of the whole signal (ONNX Runtime fails here).
    signal = rng.standard_normal((2, 20, 1)).astype(np.float32)
    inputs, options = _stft(signal, _i64(4))
    out = check_node("STFT", inputs, {}, opset=17, reference="onnx", **options, **F32)
    assert out[0].shape == (2, 1, 11, 2)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_stft_dtypes(rng, dtype):
    signal = rng.standard_normal((2, 32, 1)).astype(dtype)
    window = np.hanning(8).astype(dtype)
    inputs, options = _stft(signal, _i64(4), window, _i64(8))
    check_node("STFT", inputs, {}, opset=17, **options, **TOL[dtype])


def test_stft_window_from_graph_input_and_zero_batch(rng):
    signal = rng.standard_normal((3, 24, 2)).astype(np.float32)
    window = rng.random(6).astype(np.float32)
    inputs, options = _stft(signal, _i64(3), window, _i64(6))
    check_node(
        "STFT", inputs, {"onesided": 0}, opset=17, symbolic={"signal": [0]}, **options, **F32
    )
    empty = np.zeros((0, 24, 1), np.float32)
    inputs, options = _stft(empty, _i64(3), window, _i64(6))
    check_node("STFT", inputs, {}, opset=17, reference="onnx", **options)


@pytest.mark.parametrize(
    "signal_shape, step, window_size, length, match",
    [
        ((2, 32, 1), 4, 8, 6, "window has length 8 but frame_length is 6"),
        ((2, 32, 1), 4, None, 40, "frame_length 40 must be in"),
        ((2, 32, 1), 0, None, 8, "frame_step must be >= 1"),
        ((32,), 4, None, 8, "batch, signal_length"),
        ((2, 3, 32), 4, None, 8, "end with an axis of 1"),
        ((2, 32, 3, 1), 4, None, 8, "batch, signal_length"),
    ],
)
def test_stft_errors(signal_shape, step, window_size, length, match):
    signal = np.zeros(signal_shape, np.float32)
    window = None if window_size is None else np.ones(window_size, np.float32)
    inputs, options = _stft(signal, _i64(step), window, _i64(length))
    model = make_node_model("STFT", inputs, {}, opset=17, **options)
    with pytest.raises(TransmuterError, match=match):
        transmuter_runs(model, inputs, compiled=False)


# ------------------------------------------------------------------------------------- windows

WINDOWS = ["HannWindow", "HammingWindow", "BlackmanWindow"]


@pytest.mark.parametrize("op_type", WINDOWS)
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("size", [1, 2, 5, 16, 33])
@pytest.mark.parametrize("size_dtype", [np.int64, np.int32])
def test_windows(op_type, periodic, size, size_dtype):
    # A symmetric window of size 1 is NaN (0/0) in both references and here.
    check_node(
        op_type,
        {"size": np.array(size, size_dtype)},
        {"periodic": periodic},
        opset=17,
        constants=["size"],
        atol=1e-6,
    )


@pytest.mark.parametrize("op_type", WINDOWS)
@pytest.mark.parametrize("code", [11, 10, 6, 2])
def test_window_output_types(op_type, code):
    check_node(
        op_type,
        {"size": _i64(9)},
        {"output_datatype": code, "periodic": 0},
        opset=17,
        constants=["size"],
        rtol=1e-3,
        atol=1e-3,
    )


@pytest.mark.parametrize("op_type", WINDOWS)
def test_window_size_zero_and_bfloat16(op_type):
    # ONNX Runtime rejects size 0; onnx.reference gives an empty window.
    check_node(op_type, {"size": _i64(0)}, {}, opset=17, constants=["size"], reference="onnx")
    expected = check_node(op_type, {"size": _i64(12)}, {}, opset=17, constants=["size"])[0]
    # atol: float32 arithmetic leaves 1.5e-8 where the window is 0 (ONNX Runtime's Blackman).
    _expect(
        op_type,
        {"size": _i64(12)},
        {"output_datatype": 16},
        expected.astype(BF16),
        opset=17,
        constants=["size"],
        rtol=0,
        atol=1e-7,
    )


def test_window_from_graph_input_is_host_known():
    # A size fed at run time still gives a concrete window (it decides the shape).
    check_node("HannWindow", {"size": _i64(10)}, {}, opset=17, atol=1e-6)


def test_window_rejects_bool_output():
    model = make_node_model(
        "HannWindow", {"size": _i64(4)}, {"output_datatype": 9}, opset=17, constants=["size"]
    )
    with pytest.raises(TransmuterError, match="output_datatype 9"):
        transmuter_runs(model, {}, compiled=False)


# ------------------------------------------------------------------------------ MelWeightMatrix

MEL_CASES = [
    (8, 16, 8192, 0.0, 4096.0),
    (10, 64, 16000, 20.0, 8000.0),
    (4, 10, 100, 5.0, 45.0),
    (20, 512, 16000, 0.0, 8000.0),
    (40, 400, 16000, 125.0, 7600.0),
    (80, 1024, 22050, 0.0, 11025.0),
    (3, 8, 1000, 0.0, 500.0),
    (13, 33, 44100, 300.0, 3000.0),
]


def _mel_inputs(bins, length, rate, low, high, int_dtype=np.int64, float_dtype=np.float32):
    return {
        "num_mel_bins": np.array(bins, int_dtype),
        "dft_length": np.array(length, int_dtype),
        "sample_rate": np.array(rate, int_dtype),
        "lower_edge_hertz": np.array(low, float_dtype),
        "upper_edge_hertz": np.array(high, float_dtype),
    }


@pytest.mark.parametrize("case", MEL_CASES, ids=str)
@pytest.mark.parametrize("reference", ["ort", "onnx"])
def test_mel_weight_matrix(case, reference):
    inputs = _mel_inputs(*case)
    check_node("MelWeightMatrix", inputs, {}, opset=17, constants=list(inputs), reference=reference)


@pytest.mark.parametrize("code", [11, 10, 7, 1])
@pytest.mark.parametrize("types", [(np.int32, np.float64), (np.int64, np.float32)])
def test_mel_weight_matrix_types(code, types):
    # ONNX Runtime has kernels for few of these type combinations.
    inputs = _mel_inputs(16, 128, 16000, 50.0, 7000.0, *types)
    check_node(
        "MelWeightMatrix",
        inputs,
        {"output_datatype": code},
        opset=17,
        constants=list(inputs),
        reference="onnx",
        atol=1e-3,
        rtol=1e-3,
    )


def test_mel_weight_matrix_from_graph_inputs():
    inputs = _mel_inputs(*MEL_CASES[1])
    check_node("MelWeightMatrix", inputs, {}, opset=17)


def test_mel_weight_matrix_half_edges():
    # onnx.reference computes the mel points in float16 for float16 edges and moves a band edge;
    # we compute in float64, which is what the same (exactly representable) edges give as float32.
    half = _mel_inputs(16, 128, 16000, 50.0, 7000.0, float_dtype=np.float16)
    single = _mel_inputs(16, 128, 16000, 50.0, 7000.0)
    model = make_node_model("MelWeightMatrix", single, {}, opset=17, constants=list(single))
    expected = reference_run(model, {})[0]
    _expect("MelWeightMatrix", half, {}, expected, opset=17, constants=list(half), rtol=0, atol=0)
