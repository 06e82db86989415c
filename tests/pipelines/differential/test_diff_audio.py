"""transformers' automatic-speech-recognition and audio-classification call forms replayed on
Optimum's exports of Whisper (encoder + merged decoder), wav2vec2 CTC, AST and wav2vec2 sequence
classification (tests/fixtures/differential/make_audio.py records them)."""

from __future__ import annotations

import pytest
from replay import cases, check, check_transformers_js

REPOS = ("audio-whisper", "audio-wav2vec2-ctc", "audio-ast", "audio-wav2vec2-cls")

_PADDED_BATCH = (
    "transformers decodes every frame of a padded batch: a clip (or last chunk) shorter than "
    "its batch's longest gets letters from frames of the zero padding past its end (its answer "
    "depends on batch_size and on its neighbours); transmuter runs each clip at its own "
    "length, as transformers does with batch_size=1 (Optimum's export takes no attention mask)"
)
_TOP_K_BUG = (
    "transformers 5.25's AudioClassificationPipeline ignores a pipeline-level top_k on every "
    "call (_sanitize_parameters turns the call's top_k=None into num_labels); transmuter "
    "applies it, as the pipeline's docs say"
)
_NO_TIMESTAMPS = (
    "Whisper's timestamps are missing: transformers' WhisperTimeStampLogitsProcessor and "
    "_decode_asr's {'timestamp', 'text'} chunks (transmuter's prompt ends with "
    "<|notimestamps|>; return_timestamps is not an option)"
)
REFUSED: dict[str, str] = {
    "audio-whisper/long-without-chunking": (
        "audio past Whisper's window without chunk_length_s: transformers decodes it "
        "sequentially, window after window, seeking by the predicted timestamps; transmuter "
        "has no timestamps (below) and refuses it with an InputError naming chunk_length_s"
    ),
    "audio-whisper/return-timestamps": _NO_TIMESTAMPS,
    "audio-wav2vec2-ctc/batch-size": _PADDED_BATCH,
    "audio-wav2vec2-ctc/chunked-batch": _PADDED_BATCH,
    "audio-ast/pipeline-top-k": _TOP_K_BUG,
    "audio-wav2vec2-cls/pipeline-top-k": _TOP_K_BUG,
}


def _slow_whisper(params: list) -> list:
    """Whisper's cases compile a decoder program per token: 10-60 s each on a loaded 2-core
    machine, so they are model-level (slow)."""
    return [
        pytest.param(*p.values, id=p.id, marks=[*p.marks, pytest.mark.slow])
        if p.id.startswith("audio-whisper/")
        else p
        for p in params
    ]


@pytest.mark.parametrize("repo, call", _slow_whisper(cases(*REPOS, refused=REFUSED)))
def test_call(repo, call):
    check(repo, call)


@pytest.mark.parametrize(
    "repo",
    [pytest.param(r, marks=pytest.mark.slow) if r == "audio-whisper" else r for r in REPOS],
)
def test_transformers_js_layout(repo, tmp_path):
    check_transformers_js(repo, tmp_path)
