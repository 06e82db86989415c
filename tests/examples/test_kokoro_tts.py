"""examples/kokoro_tts.py on the Kokoro-shaped stand-in graph (tests/fixtures/tts_standin.onnx,
made by tests/fixtures/make_tts_standin.py): the atan2 edit, durations padded to 200 ms, segment
reuse across close lengths, and the output against ONNX Runtime on the same edited graph."""

from __future__ import annotations

import importlib.util
import wave
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from opcheck import ort_run

import transmuter

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "fixtures" / "tts_standin.onnx"
FRAMES_PER_BUCKET = 8  # 200 ms of 25 ms frames
# atan2's quadrant decides phases fed to a Conv; where the STFT's values are tiny, the phase is
# ill-conditioned and float32 rounding differences between the two runtimes grow to ~1e-4.
ATOL = 5e-4


def load_script(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def kokoro():
    return load_script("kokoro_tts", ROOT / "examples" / "kokoro_tts.py")


@pytest.fixture(scope="module")
def standin_builder():
    return load_script("make_tts_standin", ROOT / "tests" / "fixtures" / "make_tts_standin.py")


def count(proto: onnx.ModelProto, op_type: str) -> int:
    return sum(node.op_type == op_type for node in proto.graph.node)


def test_atan2_fix_edits_only_the_quadrant_greater(kokoro):
    proto = onnx.load(STANDIN)
    greater, greater_equal = count(proto, "Greater"), count(proto, "GreaterOrEqual")
    assert greater == 2  # atan2's and a LeakyReLU written as Where(x > 0, ...)
    assert kokoro.fix_atan2_quadrant(proto) == ["Greater_0"]
    assert count(proto, "Greater") == 1 and count(proto, "GreaterOrEqual") == greater_equal + 1
    (leaky,) = (n for n in proto.graph.node if n.op_type == "Greater")
    assert leaky.name == "Greater_1"  # the LeakyReLU's, left alone
    assert kokoro.fix_atan2_quadrant(proto) == []  # nothing left to fix


def test_fixed_atan2_matches_numpy_on_the_negative_real_axis(kokoro, standin_builder):
    """The exported pattern alone, on points of every quadrant and both axes."""
    b = standin_builder.Builder(np.random.default_rng(0))
    out = standin_builder.atan2(b, "y", "x")
    b.nodes.append(helper.make_node("Identity", [out], ["angle"]))
    values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [7]) for n in ("y", "x")]
    graph = helper.make_graph(
        b.nodes, "atan2", values, [helper.make_tensor_value_info("angle", TensorProto.FLOAT, [7])]
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    y = np.array([0.0, 0.0, 1.0, -1.0, 1.0, -1.0, 2.0], np.float32)
    x = np.array([-1.0, 1.0, -1.0, -1.0, 1.0, 1.0, 0.0], np.float32)
    before = ort_run(proto, {"y": y, "x": x})[0]
    assert before[0] == pytest.approx(-np.pi)  # the exported graph's answer at (0, -1)
    assert kokoro.fix_atan2_quadrant(proto) == ["Greater_0"]
    for got in (
        ort_run(proto, {"y": y, "x": x})[0],
        transmuter.run(transmuter.load(proto), {"y": y, "x": x})["angle"],
    ):
        np.testing.assert_allclose(got, np.arctan2(y, x), rtol=1e-6, atol=1e-6)


def test_the_fix_changes_the_standin_audio(kokoro):
    """The stand-in's STFT DC bin hits y == 0, x < 0, as Kokoro's does."""
    inputs = kokoro.inputs_for(
        kokoro.DEFAULT_TOKENS, kokoro.style_vector(None, kokoro.DEFAULT_TOKENS), 1.0
    )
    exported = ort_run(onnx.load(STANDIN), inputs)[0]
    fixed = onnx.load(STANDIN)
    kokoro.fix_atan2_quadrant(fixed)
    assert np.abs(ort_run(fixed, inputs)[0] - exported).max() > 0.1


def test_pad_durations_refuses_a_graph_without_predicted_durations(kokoro):
    proto = onnx.load(ROOT / "tests" / "fixtures" / "models" / "bert.onnx")
    with pytest.raises(kokoro.GraphEditError, match="expected one duration node"):
        kokoro.pad_durations(proto, FRAMES_PER_BUCKET)


def padded(frames: int) -> int:
    return -(-frames // FRAMES_PER_BUCKET) * FRAMES_PER_BUCKET


@pytest.mark.slow
def test_close_lengths_share_compiled_segments_and_match_onnx_runtime(kokoro):
    proto, fixed = kokoro.prepare(str(STANDIN))
    assert fixed == ["Greater_0"]
    tokens = kokoro.DEFAULT_TOKENS
    style = kokoro.style_vector(None, tokens)
    # Speeds whose predicted lengths differ but fall in one 200 ms bucket, and one outside it.
    predicted = {}
    for speed in np.arange(0.8, 1.4, 0.02):
        reference = ort_run(proto, kokoro.inputs_for(tokens, style, float(speed)))
        predicted[float(speed)] = (int(reference[1].sum()), reference[0])
    speeds = sorted(predicted, key=lambda s: predicted[s][0])
    a, b = next(
        (s, t)
        for s, t in zip(speeds, speeds[1:])
        if predicted[s][0] != predicted[t][0] and padded(predicted[s][0]) == padded(predicted[t][0])
    )
    other = next(s for s in speeds if padded(predicted[s][0]) != padded(predicted[a][0]))

    model = transmuter.load(proto)
    speak = transmuter.compile(model, kokoro.inputs_for(tokens, style, a))
    (start, stop, _), *_ = speak.segments
    assert model.ir.graph.nodes[stop].op_type == "Range"  # the data-dependent length breaks here
    for speed, new_segments in ((a, 0), (b, 0), (other, 1)):
        with kokoro.CompileCounter() as counter:
            out = speak(kokoro.inputs_for(tokens, style, speed))
        assert counter.compiled == new_segments, speed
        frames, reference = predicted[speed]
        waveform = np.asarray(out["waveform"])
        assert int(np.asarray(out[kokoro.DURATIONS_OUTPUT]).sum()) == frames
        assert waveform.size == padded(frames) * kokoro.FRAME_SAMPLES  # 200 ms steps
        np.testing.assert_allclose(waveform, reference, rtol=1e-3, atol=ATOL)


@pytest.mark.slow
def test_main_writes_a_wav_per_speed(kokoro, tmp_path, capsys):
    kokoro.main(["--out", str(tmp_path / "speech.wav"), "--speed", "1", "1.1"])
    printed = capsys.readouterr().out
    assert "atan2 quadrant fixed on 1 node(s): Greater_0" in printed
    for name in ("speech_1x.wav", "speech_1.1x.wav"):
        with wave.open(str(tmp_path / name)) as audio:
            assert (audio.getnchannels(), audio.getsampwidth(), audio.getframerate()) == (
                1,
                2,
                24000,
            )
            assert audio.getnframes() > 0 and audio.getnframes() % (FRAMES_PER_BUCKET * 600) == 0
    assert "max |transmuter - onnxruntime|" in printed
