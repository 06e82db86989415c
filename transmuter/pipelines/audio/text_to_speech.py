"""text-to-speech (alias text-to-audio) with Kokoro-82M in onnx-community's layout:
onnx/model*.onnx (`dtype=` chooses), voices/<name>.bin (float32 [N, 1, 256] style packs),
tokenizer.json holding the phoneme vocabulary. Both input namings of Kokoro's exports work:
`input_ids`/`style`/`speed` -> `waveform` (onnx-community) and `tokens`/`style`/`speed` ->
`audio` (kokoro-onnx).

Input: a phoneme string (`phonemes=True`), each character mapped to its id in tokenizer.json's
vocabulary and 0 put at both ends, as Kokoro does; or text (the default), turned into phonemes
by misaki (Kokoro's grapheme-to-phoneme package, the `tts` extra), American or British English
by the voice name's first letter. The style vector is the voice pack's row len(phonemes) - 1,
clipped to the pack, as the `kokoro` package's KPipeline picks it (kokoro-onnx and kokoro-js
take the next row). Inputs over 510 tokens are split at sentence ends (. ! ? ;) and the audio
joined; `progress` shows a bar of the chunks (None: where stderr is a terminal and the input
has more than one; False: never; True: always).

Buckets (transmuter/frontend/graph_edits.py edits the graph before loading): the token count
becomes an input (`take_token_count`), so the token ids are padded with 0s to 32, 128 or 512
tokens and the padding changes nothing the real tokens get (masks, LSTM sequence_lens, zero
durations); the frames' total is padded (on the last real token) to FRAME_BUCKETS (from 64
frames, 1.6 s, half an octave apart), with the instance norms and convolutions after the
durations made to see only the real frames (`pad_durations`). So a program before the graph's
data-dependent break per token bucket, and one after it per (token bucket, frame bucket): on 50
sentences of random lengths 11 programs (8 with powers of two), where exact lengths compiled
about two per token count (99 for 47 counts). The cost: the vocoder runs on up to 1.5x the
frames (1.23x over bench_tts_pipeline.py's sentences; 1.51x with powers of two). The padded
frames' samples are cut from what is returned; the convolutions near the end saw them, so the
last few hundred samples differ from the unpadded graph's. A graph that takes its token count
from the ids' shape and masks nothing (kokoro-onnx's kokoro-v1.0.int8.onnx: its BERT's attention
mask is all ones, its LSTMs have no sequence_lens) is given the mask (`mask_padded_tokens`):
without it each new token count compiled both programs again (30-37 s on 2 cores). A graph
neither edit can pad is run with a warning and a program per token count.

`fix_atan2=True` (the default) gives torch.atan2's +pi on the STFT's DC bin where the exported
pattern gives -pi: the audio then matches torch's, which the voices were trained with
(examples/kokoro_tts.py measures the difference).

Returns {"audio": float32 [samples], "sampling_rate": 24000, "durations": int64 frames per
token, 0s included, chunks joined}: transformers' text-to-audio keys, plus the durations.
"""

from __future__ import annotations

import contextlib
import re
import wave
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.frontend import hub
from transmuter.frontend.graph_edits import DURATIONS_OUTPUT, TOKEN_COUNT_INPUT, load_speech_model
from transmuter.pipelines.base import Task
from transmuter.pipelines.progress import progress_bar
from transmuter.pipelines.repo import Repo

SAMPLING_RATE = 24000
FRAME_SAMPLES = 600  # Kokoro: one duration frame is 600 samples (25 ms)
TOKEN_BUCKETS = (32, 128, 512)  # token ids padded to these (Kokoro's context is 512)
# The durations' total, padded to these: 64 frames (1.6 s) up to 32768, half an octave apart
# (64, 96, 128, 192, ...), so the vocoder runs on at most 1.5x the real frames (powers of two:
# 2x; the real Kokoro's 89-token sentence of 257 frames: 8.4 s a call at 512, 5.9 s at 384).
FRAME_BUCKETS = tuple(sorted({64 * 2**k for k in range(10)} | {96 * 2**k for k in range(9)}))
STYLE_SIZE = 256
MAX_PHONEMES = 510  # Kokoro's context of 512 less the two 0s
SENTENCE_END = re.compile(r"(?<=[.!?;])\s*")
# The two namings of Kokoro's exports: token input -> audio output.
NAMINGS = {"input_ids": "waveform", "tokens": "audio"}


class TextToSpeech(Task):
    """Speak a text ({"audio", "sampling_rate", "durations"}), a list of texts (a list of
    them) or a generator of texts (a generator of them). `voice`: a name under voices/ or a weighted blend {"af_heart": 0.7, "am_adam": 0.3}
    (weights normalized to sum to 1); `speed`: Kokoro's speed factor; both also per call.
    `fix_atan2`: see the module docstring."""

    def __init__(
        self,
        repo: Repo,
        *,
        voice: str | Mapping[str, float] = "af_heart",
        speed: float = 1.0,
        fix_atan2: bool = True,
    ):
        self.repo = repo
        self.vocab = repo.require_tokenizer("text-to-speech").get_vocab()
        if "model" not in repo.onnx:
            raise ModelLoadError(f"{repo.source} has no onnx/model.onnx; found {repo.found}")
        self.model = load_speech_model(
            repo.onnx["model"],
            fix_atan2=fix_atan2,
            frames=FRAME_BUCKETS,
            token_inputs=tuple(NAMINGS),
        )
        names = {v.name for v in self.model.ir.graph.inputs}
        token_input = next((n for n in NAMINGS if n in names), None)
        if token_input is None or not {"style", "speed"} <= names:
            raise ModelLoadError(
                f"{repo.onnx['model']}: inputs {sorted(names)} are not Kokoro's "
                "(input_ids or tokens, style, speed)"
            )
        self.token_input, self.audio_output = token_input, NAMINGS[token_input]
        self.pads_tokens = TOKEN_COUNT_INPUT in names
        self.voice, self.speed = voice, speed
        self._packs: dict[str, np.ndarray] = {}
        self._compiled = None

    def is_item(self, value: Any) -> bool:
        return isinstance(value, str)

    def run_items(
        self,
        items: list,
        *,
        phonemes: bool = False,
        voice: str | Mapping[str, float] | None = None,
        speed: float | None = None,
        progress: bool | None = None,
    ) -> list:
        return [self._speak_text(i, phonemes, voice, speed, progress) for i in items]

    def _speak_text(
        self, inputs: Any, phonemes: bool, voice: Any, speed: float | None, progress: bool | None
    ):
        if not isinstance(inputs, str):
            raise InputError(f"text-to-speech takes a string or a list of them, not {inputs!r}")
        voice = self.voice if voice is None else voice
        pack = self._voice(voice)
        text = inputs if phonemes else to_phonemes(inputs, voice)
        audio, durations = [], []
        chunks = split_sentences(text)
        # A bar of the chunks for a long input (progress=True: for any input).
        bar = progress_bar(len(chunks), progress if len(chunks) > 1 or progress else False)
        with bar if bar is not None else contextlib.nullcontext():
            for chunk in chunks:
                ids = self._ids(chunk)
                style = pack[min(max(len(ids) - 1, 0), len(pack) - 1)]
                wave_, frames = self._speak(ids, style, self.speed if speed is None else speed)
                audio.append(wave_)
                durations.append(frames)
                if bar is not None:
                    bar.update(1)
        return {
            "audio": np.concatenate(audio) if audio else np.zeros(0, np.float32),
            "sampling_rate": SAMPLING_RATE,
            "durations": np.concatenate(durations) if durations else np.zeros(0, np.int64),
        }

    def _ids(self, phonemes: str) -> list[int]:
        unknown = sorted({c for c in phonemes if c not in self.vocab})
        if unknown:
            raise InputError(
                f"phonemes {unknown} are not in {self.repo.source}'s vocabulary (tokenizer.json)"
            )
        return [self.vocab[c] for c in phonemes]

    def _speak(self, ids: list[int], style: np.ndarray, speed: float):
        if not isinstance(speed, (int, float)) or speed <= 0:
            raise InputError(f"speed must be a positive number; got {speed!r}")
        tokens = [0, *ids, 0]
        feed = {
            "style": style.reshape(1, STYLE_SIZE).astype(np.float32),
            "speed": np.array([speed], np.float32),
        }
        if self.pads_tokens:
            bucket = next(b for b in TOKEN_BUCKETS if b >= len(tokens))
            feed[TOKEN_COUNT_INPUT] = np.array([len(tokens)], np.int64)
            tokens = tokens + [0] * (bucket - len(tokens))
        feed[self.token_input] = np.array([tokens], np.int64)
        if self._compiled is None:
            self._compiled = transmuter.compile(self.model, feed, cache_size=16)
        out = self._compiled(feed)
        durations = np.asarray(out[DURATIONS_OUTPUT]).reshape(-1).astype(np.int64)
        durations = durations[: len(ids) + 2]  # the padding tokens' are 0
        audio = np.asarray(out[self.audio_output], np.float32).reshape(-1)
        # The padded frames (trailing, on the end marker) are not the model's audio.
        return audio[: int(durations.sum()) * FRAME_SAMPLES], durations

    def _voice(self, voice: str | Mapping[str, float]) -> np.ndarray:
        if isinstance(voice, str):
            return self._pack(voice)
        if not isinstance(voice, Mapping) or not voice:
            raise InputError(f"voice must be a name or a {{name: weight}} blend; got {voice!r}")
        total = float(sum(voice.values()))
        if total <= 0:
            raise InputError(f"a voice blend's weights must sum to more than 0; got {voice}")
        return sum(self._pack(name) * (w / total) for name, w in voice.items())

    def _pack(self, name: str) -> np.ndarray:
        if name not in self._packs:
            if not re.fullmatch(r"[\w.-]+", name):
                raise InputError(f"voice {name!r} is not a voice name (voices/<name>.bin)")
            path = f"voices/{name}.bin"
            if self.repo.source.startswith(hub.PREFIX):
                local = hub.fetch(hub.hub_file(f"{self.repo.source}/{path}"))
            else:
                local = Path(self.repo.source, path)
                if not local.is_file():
                    raise ModelLoadError(f"{self.repo.source} has no {path}")
            data = np.fromfile(local, dtype="<f4")
            if data.size == 0 or data.size % STYLE_SIZE:
                raise ModelLoadError(f"{local}: not a float32 [N, 1, {STYLE_SIZE}] voice pack")
            self._packs[name] = data.reshape(-1, STYLE_SIZE)
        return self._packs[name]


def split_sentences(phonemes: str) -> list[str]:
    """Chunks of at most MAX_PHONEMES phonemes, cut after sentence ends (. ! ? ;); a sentence
    longer than that is cut at its last space before the limit (else at the limit)."""
    chunks: list[str] = []
    for sentence in (s for s in SENTENCE_END.split(phonemes.strip()) if s):
        while len(sentence) > MAX_PHONEMES:
            cut = sentence.rfind(" ", 1, MAX_PHONEMES + 1)
            cut = MAX_PHONEMES if cut <= 0 else cut
            sentence, rest = sentence[cut:].lstrip(), sentence[:cut].rstrip()
            chunks.append(rest)
        if chunks and len(chunks[-1]) + 1 + len(sentence) <= MAX_PHONEMES:
            chunks[-1] = f"{chunks[-1]} {sentence}"
        else:
            chunks.append(sentence)
    return chunks


def to_phonemes(text: str, voice: str | Mapping[str, float]) -> str:
    """Text through misaki's English G2P: American for voices named a*, British for b*."""
    try:
        from misaki import en
    except ImportError:
        raise InputError(
            "text input needs misaki (pip install transmuter[tts]); "
            "or give phonemes with phonemes=True"
        ) from None
    name = voice if isinstance(voice, str) else next(iter(voice))
    if name[:1] not in ("a", "b"):
        raise InputError(f"text input is English only (voices a*, b*); {name!r} is not")
    return en.G2P(british=name.startswith("b"))(text)[0]


def write_wav(path: str | Path, audio: np.ndarray, sampling_rate: int = SAMPLING_RATE) -> None:
    """16-bit mono PCM WAV (samples clipped to [-1, 1])."""
    pcm = (np.clip(np.asarray(audio, np.float32), -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sampling_rate)
        out.writeframes(pcm.tobytes())
