"""automatic-speech-recognition's mechanisms beyond the replayed calls of
differential/test_diff_audio.py: CTC decoding (Wav2Vec2CTCTokenizer's grouping, blanks, word
delimiter, char and word offsets), transformers' CTC chunk strides, Whisper's length counting
and the generate_kwargs / num_beams forms."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import REPOS

import transmuter
from transmuter.errors import InputError
from transmuter.pipelines.audio.speech_recognition import (
    CTCSpeechRecognition,
    _ctc_chunks,
    _words,
)

DIFFERENTIAL = Path(__file__).resolve().parents[1] / "fixtures" / "differential"


@pytest.fixture(scope="module")
def ctc():
    return transmuter.pipeline("automatic-speech-recognition", DIFFERENTIAL / "audio-wav2vec2-ctc")


def test_a_ctc_export_is_run_as_ctc(ctc):
    assert isinstance(ctc, CTCSpeechRecognition)
    assert ctc.align == 40  # conv strides 5 * 4 * 2


def test_ctc_decoding_groups_repeats_drops_blanks_and_spaces_words(ctc):
    ids = {t: i for i, t in ctc.tokens.items()}
    frames = [ids[t] for t in "<pad> h h <pad> e l <pad> l l o | | t a t <pad>".split()]
    answer = ctc._decoded(np.array(frames), "char", 16000)
    # a repeat split by a blank is two letters; repeats in a row are one; "|" is a space
    assert answer["text"] == "hello tat"
    chars = answer["chunks"]
    assert [c["text"] for c in chars] == list("hello tat")
    scale = 40 / 16000
    assert chars[0]["timestamp"] == (1 * scale, 3 * scale)  # "h h": frames 1-2
    assert chars[5]["timestamp"] == (10 * scale, 12 * scale)  # "| |": one space, frames 10-11
    words = ctc._decoded(np.array(frames), "word", 16000)["chunks"]
    assert [(w["text"], w["timestamp"]) for w in words] == [
        ("hello", (1 * scale, 10 * scale)),
        ("tat", (12 * scale, 15 * scale)),
    ]
    # a blank between two delimiters leaves two spaces, as Wav2Vec2CTCTokenizer has it
    spaced = [ids[t] for t in "a | <pad> | b".split()]
    assert ctc._decoded(np.array(spaced), None, 16000) == {"text": "a  b"}
    assert ctc._decoded(np.array([ids["<pad>"]] * 3), None, 16000) == {"text": ""}


def test_word_offsets_start_after_leading_spaces():
    assert _words([(" ", 0, 1), ("a", 1, 2), (" ", 2, 3), (" ", 3, 4), ("b", 5, 6)], " ") == [
        ("a", 1, 2),
        ("b", 5, 6),
    ]


def test_ctc_chunk_strides_in_frames_as_transformers_rescales_them():
    wave = np.zeros(1000, np.float32)
    pieces = list(_ctc_chunks(wave, 400, 80, 40, 40))
    # starts every 400 - 80 - 40 = 280 samples; the last chunk reaches the end
    assert [p.shape[0] for p, _ in pieces] == [400, 400, 400, 160]
    assert [s for _, s in pieces] == [(10, 0, 1), (10, 2, 1), (10, 2, 1), (4, 2, 0)]
    # a shorter last chunk: its frames rounded from its own length
    assert [s for _, s in _ctc_chunks(np.zeros(920, np.float32), 400, 80, 40, 40)][-1] == (
        9,
        2,
        0,
    )


def test_ctc_chunking_keeps_the_text_of_a_short_clip(ctc):
    rng = np.random.default_rng(0)
    wave = (0.3 * rng.standard_normal(12000)).astype(np.float32)
    # one chunk covering the clip: no strides cut, the same frames as unchunked
    assert ctc(wave, chunk_length_s=1.0) == ctc(wave)


def test_ctc_options_are_checked(ctc):
    wave = np.zeros(4000, np.float32)
    with pytest.raises(InputError, match="'char' or 'word'"):
        ctc(wave, return_timestamps=True)
    with pytest.raises(InputError, match="longer than its strides"):
        ctc(wave, chunk_length_s=0.2, stride_length_s=0.1)
    with pytest.raises(InputError, match="no option"):
        ctc(wave, max_new_tokens=3)
    with pytest.raises(InputError, match="batch_size"):
        ctc([wave], batch_size=0)


@pytest.fixture(scope="module")
def whisper():
    return transmuter.pipeline("automatic-speech-recognition", REPOS / "whisper")


def test_whisper_max_length_counts_after_the_prompt(whisper):
    # WhisperForConditionalGeneration.generate adds the prompt's length to max_length (and
    # caps the total at max_target_positions: 64 here), unlike other encoder-decoders.
    given = {**whisper.defaults, "max_new_tokens": None}
    assert whisper._lengths({**given, "max_length": 10}, 4)[0] == 10
    assert whisper._lengths({**given, "max_length": 100}, 4)[0] == 60
    assert whisper._lengths({**given, "max_new_tokens": 7, "max_length": 10}, 4)[0] == 7


def test_whisper_generate_kwargs_and_num_beams(whisper):
    wave = np.zeros(8000, np.float32)
    plain = whisper(wave, max_new_tokens=2)
    assert whisper.defaults["num_beams"] == 5  # transformers' ASR pipeline's default
    assert whisper(wave, generate_kwargs={"max_new_tokens": 2}) == plain
    assert whisper(wave, generate_kwargs={"max_new_tokens": 2, "num_beams": 5}) == plain
    greedy = whisper(wave, generate_kwargs={"max_new_tokens": 2, "num_beams": 1})
    assert greedy == whisper(wave, max_new_tokens=2, num_beams=1)
    with pytest.raises(InputError, match="num_beams must be an integer"):
        whisper(wave, num_beams=0)
    with pytest.raises(InputError, match=r"has no option \['num_return_sequences'\]"):
        whisper(wave, num_return_sequences=2)
    with pytest.raises(InputError, match="both"):
        whisper(wave, max_new_tokens=2, generate_kwargs={"max_new_tokens": 3})
    with pytest.raises(InputError, match="generate_kwargs must be a dict"):
        whisper(wave, generate_kwargs=[("max_new_tokens", 2)])
