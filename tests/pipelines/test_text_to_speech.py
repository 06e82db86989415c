"""text-to-speech on a Kokoro-shaped repo built here: tests/fixtures/tts_standin.onnx (random
weights, Kokoro's interface; tests/fixtures/make_tts_standin.py) as onnx/model.onnx, small
random voices/*.bin and a tokenizer.json with a phoneme vocabulary. The reference is ONNX
Runtime on the stand-in with only the atan2 edit (no duration padding). The stand-in has no
token mask, so its token ids are not padded (a warning; tests/pipelines/test_kokoro.py runs the
real export's structure)."""

from __future__ import annotations

import sys
import wave
from pathlib import Path

import numpy as np
import onnx
import pytest
from frontend.test_hub import hub  # noqa: F401  (the loopback Hub fixture)
from onnx import TensorProto, helper
from opcheck import ort_run

import transmuter
from transmuter.errors import InputError
from transmuter.frontend.graph_edits import fix_atan2_quadrant
from transmuter.pipelines.audio.text_to_speech import write_wav

STANDIN = Path(__file__).resolve().parents[1] / "fixtures" / "tts_standin.onnx"
PHONEMES = "$abcdefghijklmnopqrstuvwxyzəɪʊŋɜɹðʌɛʃɑɔʒɡ .,!?;"  # "$" is Kokoro's 0
pytestmark = pytest.mark.filterwarnings("ignore:.*does not mask its tokens:UserWarning")
ATOL = 5e-4  # see tests/examples/test_kokoro_tts.py: ill-conditioned phases near tiny STFT bins
VOICE_ROWS = 40
TAIL = 600  # one frame: the vocoder's reach into the padding (see the first test)


def tokenizer_json() -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({c: i for i, c in enumerate(PHONEMES)}, unk_token="$"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return tokenizer.to_str()


def voice(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((VOICE_ROWS, 1, 256)).astype(np.float32)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("kokoro")
    (root / "onnx").mkdir()
    (root / "voices").mkdir()
    (root / "onnx" / "model.onnx").write_bytes(STANDIN.read_bytes())
    (root / "config.json").write_text('{"model_type": "style_text_to_speech_2"}')
    (root / "tokenizer.json").write_text(tokenizer_json())
    voice(0).tofile(root / "voices" / "af_a.bin")
    voice(1).tofile(root / "voices" / "am_b.bin")
    (0.75 * voice(0) + 0.25 * voice(1)).tofile(root / "voices" / "af_mix.bin")
    return root


@pytest.fixture(scope="module")
def speak(folder):
    return transmuter.pipeline("text-to-speech", str(folder), voice="af_a")


@pytest.fixture(scope="module")
def reference():
    proto = onnx.load(STANDIN)
    fix_atan2_quadrant(proto)

    def run(phonemes: str, pack: np.ndarray, speed: float = 1.0):
        ids = [PHONEMES.index(c) for c in phonemes]
        inputs = {
            "input_ids": np.array([[0, *ids, 0]], np.int64),
            "style": pack[min(len(ids) - 1, len(pack) - 1)].reshape(1, 256),
            "speed": np.array([speed], np.float32),
        }
        return ort_run(proto, inputs)[0]

    return run


def test_audio_is_the_unpadded_models(speak, reference):
    for phonemes in ("həloʊ wɜɹld", "ðɪs ɪz ə tɛst ʌv ðə pipəlaɪn."):
        out = speak(phonemes, phonemes=True)
        assert list(out) == ["audio", "sampling_rate", "durations"]
        assert out["sampling_rate"] == 24000 and out["audio"].dtype == np.float32
        want = reference(phonemes, voice(0))
        assert len(out["durations"]) == len(phonemes) + 2
        assert out["audio"].size == want.size == out["durations"].sum() * 600
        # The padded frames are cut, but the vocoder's convolutions near the end saw them: the
        # last ~350 samples (under one 600-sample frame) differ from the unpadded graph's.
        np.testing.assert_allclose(out["audio"][:-TAIL], want[:-TAIL], atol=ATOL)


def test_voice_blends_and_speed_per_call(speak, reference):
    phonemes = "ə ʃɔɹt wʌn"
    blend = speak(phonemes, phonemes=True, voice={"af_a": 3, "am_b": 1}, speed=1.2)
    mixed = speak(phonemes, phonemes=True, voice="af_mix", speed=1.2)
    np.testing.assert_allclose(blend["audio"], mixed["audio"], atol=1e-5)
    want = reference(phonemes, 0.75 * voice(0) + 0.25 * voice(1), 1.2)
    np.testing.assert_allclose(blend["audio"][:-TAIL], want[:-TAIL], atol=ATOL)


def test_long_inputs_are_split_at_sentence_ends(speak):
    sentence = "ðə kwɪk bɹaʊn fɑks dʒʌmps oʊvəɹ ðə leɪzi dɔɡ!"
    fits = (510 + 1) // (len(sentence) + 1)  # sentences (space-joined) in one 510-token chunk
    phonemes = " ".join([sentence] * (fits + 2))
    out = speak(phonemes, phonemes=True)
    first = speak(" ".join([sentence] * fits), phonemes=True)
    second = speak(" ".join([sentence] * 2), phonemes=True)
    assert len(out["durations"]) == len(first["durations"]) + len(second["durations"])
    np.testing.assert_allclose(
        out["audio"], np.concatenate([first["audio"], second["audio"]]), atol=1e-5
    )


def test_a_long_input_shows_a_bar_of_its_chunks(speak, capsys):
    sentence = "ðə kwɪk bɹaʊn fɑks dʒʌmps oʊvəɹ ðə leɪzi dɔɡ!"
    fits = (510 + 1) // (len(sentence) + 1)
    long = " ".join([sentence] * (fits + 2))  # two chunks
    shown = speak(long, phonemes=True, progress=True)
    assert "2/2" in capsys.readouterr().err
    quiet = speak(long, phonemes=True, progress=False)
    short = speak(sentence, phonemes=True)  # one chunk: no bar unless asked for
    assert "/" not in capsys.readouterr().err
    speak(sentence, phonemes=True, progress=True)
    assert "1/1" in capsys.readouterr().err
    np.testing.assert_array_equal(shown["audio"], quiet["audio"])
    assert short["audio"].size > 0
    with pytest.raises(InputError, match="progress must be True, False or None"):
        speak(sentence, phonemes=True, progress=1)


def test_bad_inputs_name_what_is_wrong(speak, monkeypatch):
    with pytest.raises(InputError, match=r"\['X', 'Ω'\]"):
        speak("aXbΩ", phonemes=True)
    monkeypatch.setitem(sys.modules, "misaki", None)  # as without the tts extra, which CI lacks
    with pytest.raises(InputError, match="misaki"):
        speak("Hello world")
    with pytest.raises(InputError, match="speed"):
        speak("ab", phonemes=True, speed=0)
    with pytest.raises(transmuter.errors.ModelLoadError, match="voices/nobody.bin"):
        speak("ab", phonemes=True, voice="nobody")


def test_fixed_atan2_gives_pi_on_a_dc_bin_with_negative_real_part():
    """torch.onnx's atan2 pattern on (imaginary 0, real < 0): -pi exported, +pi once fixed."""
    zero, pi = (
        helper.make_tensor(n, TensorProto.FLOAT, [], [v]) for n, v in (("zero", 0.0), ("pi", np.pi))
    )
    nodes = [
        helper.make_node("Div", ["y", "x"], ["ratio"]),
        helper.make_node("Atan", ["ratio"], ["a"]),
        helper.make_node("Greater", ["y", "zero"], ["upper"], name="quadrant"),
        helper.make_node("Add", ["a", "pi"], ["plus"]),
        helper.make_node("Sub", ["a", "pi"], ["minus"]),
        helper.make_node("Where", ["upper", "plus", "minus"], ["corrected"]),
        helper.make_node("Less", ["x", "zero"], ["left"]),
        helper.make_node("Where", ["left", "corrected", "a"], ["angle"]),
    ]
    values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("y", "x")]
    out = [helper.make_tensor_value_info("angle", TensorProto.FLOAT, [2])]
    proto = helper.make_model(
        helper.make_graph(nodes, "atan2", values, out, [zero, pi]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    feed = {"y": np.array([0.0, 0.0], np.float32), "x": np.array([-3.0, 2.0], np.float32)}
    before = transmuter.run(transmuter.load(proto), feed)["angle"]
    np.testing.assert_allclose(before, [-np.pi, 0.0], rtol=1e-6)
    assert fix_atan2_quadrant(proto) == ["quadrant"]
    after = transmuter.run(transmuter.load(proto), feed)["angle"]
    np.testing.assert_allclose(after, np.arctan2(feed["y"], feed["x"]), rtol=1e-6)


def test_write_wav(tmp_path):
    write_wav(tmp_path / "a.wav", np.array([0.0, 0.5, -2.0], np.float32))
    with wave.open(str(tmp_path / "a.wav")) as audio:
        assert (audio.getframerate(), audio.getsampwidth(), audio.getnframes()) == (24000, 2, 3)
        pcm = np.frombuffer(audio.readframes(3), "<i2")
    assert pcm.tolist() == [0, 16383, -32767]


def test_a_hub_repo_speaks(hub, folder, speak):  # noqa: F811
    files = {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }
    hub.publish("org/kokoro", files)
    remote = transmuter.pipeline("text-to-audio", "hf://org/kokoro", voice="am_b")
    phonemes = "hʌb"
    np.testing.assert_allclose(
        remote(phonemes, phonemes=True)["audio"],
        speak(phonemes, phonemes=True, voice="am_b")["audio"],
        atol=1e-5,
    )
