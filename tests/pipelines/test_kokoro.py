"""Kokoro as the `kokoro` package runs it: a tiny random-weight KModel exported by the real
exporter, with the package's own outputs recorded (tests/fixtures/make_kokoro_tiny.py,
tests/fixtures/pipelines/kokoro/). The waveform is not compared: the model draws noise in its
harmonic source on every call. What comes before the noise is: the durations, the F0 and N
curves, the decoder's input features (asr) and the features the decoder hands its vocoder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import transmuter
from transmuter.frontend.graph_edits import (
    DURATIONS_OUTPUT,
    TOKEN_COUNT_INPUT,
    load_speech_model,
    pad_durations,
    take_token_count,
)
from transmuter.pipelines.audio.text_to_speech import FRAME_BUCKETS

REPO = Path(__file__).resolve().parents[1] / "fixtures" / "pipelines" / "kokoro"
MODEL = REPO / "onnx" / "model.onnx"
EXPECTED = np.load(REPO / "expected.npz")
NAMES = ("short", "sentence", "long")
PHONEMES = {  # as in make_kokoro_tiny.py
    "short": "hˈɛloʊ",
    "sentence": "ðɪs ɪz ə tˈɛst ʌv ðə pˈaɪplaɪn.",
    "long": "kəkˈɔɹoʊ ɪz ən ˈoʊpən wˈeɪt tˌiːtˌiːˈɛs mˈɑːdəl, wɪð ˈeɪɾi tˈuː mˈɪljən pɚɹˈæmɪɾɚz.",
}
# Values inside the graph, by the names torch.onnx gave them (module paths).
INSIDE = {
    "F0": "/F0_proj/Conv_output_0",
    "N": "/N_proj/Conv_output_0",
    "asr": "/MatMul_1_output_0",
    "vocoder_input": "/decoder/decode.3/Mul_output_0",
}
ATOL = 1e-4


def with_inside_outputs(proto: onnx.ModelProto) -> onnx.ModelProto:
    for name in INSIDE.values():
        proto.graph.output.append(onnx.ValueInfoProto(name=name))
    return proto


def voice(name: str = "af_tiny") -> np.ndarray:
    return np.fromfile(REPO / "voices" / f"{name}.bin", "<f4").reshape(-1, 256)


def feed(name: str) -> dict[str, np.ndarray]:
    row = int(EXPECTED[f"{name}/style_row"])
    return {
        "input_ids": EXPECTED[f"{name}/input_ids"][None],
        "style": voice()[row][None],
        "speed": np.ones(1, np.float32),
    }


def real_part(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """`got` ([1, ..., L] over padded frames) cut to `want`'s length on the last axis."""
    return np.asarray(got)[0][..., : want.shape[-1]].reshape(want.shape)


@pytest.fixture(scope="module")
def unpadded():
    """The export as it is, compiled (a program pair per token count)."""
    model = transmuter.load(with_inside_outputs(onnx.load(MODEL)))
    return transmuter.compile(model, feed("short"), cache_size=8)


def test_the_export_runs_as_kmodel(unpadded):
    for name in NAMES:
        out = unpadded(feed(name))
        np.testing.assert_array_equal(out["duration"], EXPECTED[f"{name}/durations"])
        for key in ("F0", "N", "asr"):
            want = EXPECTED[f"{name}/{key}"]
            np.testing.assert_allclose(real_part(out[INSIDE[key]], want), want, atol=ATOL)
        assert out["waveform"].shape == (EXPECTED[f"{name}/durations"].sum() * 600,)


def test_padding_tokens_and_frames_changes_nothing_real(unpadded):
    """take_token_count + pad_durations: ids padded to 128 tokens and frames to a power of two,
    and what the real tokens and frames get is KModel's (and the unpadded graph's, for the
    features the vocoder reads)."""
    proto = with_inside_outputs(onnx.load(MODEL))
    pad_durations(proto, FRAME_BUCKETS, take_token_count(proto))
    padded = None
    for name in ("short", "long"):
        inputs = feed(name)
        ids = inputs["input_ids"]
        tokens = np.zeros((1, 128), np.int64)
        tokens[:, : ids.shape[1]] = ids
        inputs_padded = {**inputs, "input_ids": tokens, TOKEN_COUNT_INPUT: np.array([ids.shape[1]])}
        padded = padded or transmuter.compile(transmuter.load(proto), inputs_padded)
        out = padded(inputs_padded)
        want_durations = EXPECTED[f"{name}/durations"]
        durations = np.asarray(out[DURATIONS_OUTPUT]).reshape(-1)
        np.testing.assert_array_equal(durations[: ids.shape[1]], want_durations)
        assert not durations[ids.shape[1] :].any()
        frames = np.asarray(out["duration"]).sum()
        assert frames in FRAME_BUCKETS and frames > want_durations.sum()
        for key in ("F0", "N", "asr"):
            want = EXPECTED[f"{name}/{key}"]
            np.testing.assert_allclose(real_part(out[INSIDE[key]], want), want, atol=ATOL)
        exact = unpadded(inputs)[INSIDE["vocoder_input"]]
        np.testing.assert_allclose(
            real_part(out[INSIDE["vocoder_input"]], exact[0]), exact[0], atol=ATOL
        )


@pytest.fixture(scope="module")
def speak():
    return transmuter.pipeline("text-to-speech", str(REPO), voice="af_tiny")


def test_pipeline_speaks_as_the_kokoro_package(speak):
    for name in NAMES:
        assert [0, *speak._ids(PHONEMES[name]), 0] == EXPECTED[f"{name}/input_ids"].tolist()
        out = speak(PHONEMES[name], phonemes=True)
        # The durations depend on the style row: equal durations are the package's row too.
        np.testing.assert_array_equal(out["durations"], EXPECTED[f"{name}/durations"])
        assert out["audio"].shape == (out["durations"].sum() * 600,)
        assert np.isfinite(out["audio"]).all()


def test_token_counts_in_a_bucket_share_their_programs(speak):
    """Five phoneme strings of 12 to 20 tokens (token bucket 32) and 67 to 93 frames (frame
    bucket 96) compile two programs at most, both on the first."""
    texts = [PHONEMES["long"][:k] for k in (10, 12, 14, 16, 18)]
    compiled = []

    def count(event, measurements, metadata):
        compiled.append(bool(metadata.get("compiled")))

    transmuter.telemetry.attach("kokoro-test", ["transmuter.segment.compile.stop"], count)
    try:
        first = speak(texts[0], phonemes=True)
        on_first = sum(compiled)
        rest = [speak(t, phonemes=True) for t in texts[1:]]
    finally:
        transmuter.telemetry.detach("kokoro-test")
    frames = [int(out["durations"].sum()) for out in [first, *rest]]
    buckets = {next(b for b in FRAME_BUCKETS if b >= f) for f in frames}
    assert buckets == {96} and len(set(frames)) > 1
    assert on_first <= 2 and sum(compiled) == on_first


def test_a_graph_without_kokoros_token_mask_warns_and_runs_unpadded(tmp_path):
    proto = onnx.load(MODEL)
    for node in proto.graph.node:
        if node.op_type == "ReduceMax":  # the mask's length no longer sets a Range
            node.op_type, node.input[:] = "Identity", node.input[:1]
            del node.attribute[:]
    path = tmp_path / "model.onnx"
    onnx.save(proto, path)
    with pytest.warns(UserWarning, match="does not mask its tokens as Kokoro's export does"):
        model = load_speech_model(
            path, fix_atan2=True, frames=FRAME_BUCKETS, token_inputs=("input_ids",)
        )
    assert TOKEN_COUNT_INPUT not in {v.name for v in model.ir.graph.inputs}


def test_helpers_name_what_is_wrong():
    with pytest.raises(ValueError, match="ascending"):
        pad_durations(onnx.load(MODEL), [128, 64])
    graph = helper.make_graph([], "empty", [], [])
    with pytest.raises(Exception, match="token-length mask"):
        take_token_count(helper.make_model(graph))
