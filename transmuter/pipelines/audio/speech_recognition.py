"""The automatic-speech-recognition task with Whisper: waveforms in, {"text": ...} out, as
transformers' pipeline returns them. Log-mel features in features.py, decoding in
generation/seq2seq.py.

Whisper hears one window (the feature extractor's n_samples: 30 s). Longer audio is
transcribed as transformers' pipeline does with `chunk_length_s`: windows of that length, each
overlapping the previous by `stride_length_s` (default chunk_length_s / 6) on each side
(`chunk_iter`), transcribed as a batch, and their texts' tokens merged where they overlap
(`merge_overlapping`, WhisperTokenizer's _find_longest_common_sequence). Audio longer than the
window without chunk_length_s is an InputError, never cut.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from transmuter.errors import InputError
from transmuter.pipelines.audio.features import log_mel
from transmuter.pipelines.audio.waveforms import DESCRIPTION, is_waveform, waveform
from transmuter.pipelines.base import Task, threshold
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.text.text2text_generation import Text2TextGeneration


class AutomaticSpeechRecognition(Text2TextGeneration):
    """Transcribe (or translate) 1-D float waveforms at the preprocessor's sampling rate
    (numpy arrays, or {"array"/"raw", "sampling_rate"} dicts), one, a list or a generator.
    Greedy by default; the options are text2text-generation's, and `language` ("en",
    "<|en|>") and `task` ("transcribe", "translate") choose Whisper's prompt tokens (default
    generation_config.json's forced_decoder_ids); `chunk_length_s` and `stride_length_s` (a
    number or [left, right]) transcribe audio longer than Whisper's window in overlapping
    chunks, as transformers' pipeline does. No timestamps: the prompt ends with
    <|notimestamps|>."""

    task = "automatic-speech-recognition"

    def __init__(
        self,
        repo: Repo,
        *,
        decoding: str = "past",
        batch_size: int = 8,
        chunk_length_s: float | None = None,
        stride_length_s: float | Sequence[float] | None = None,
        **options: Any,
    ):
        self._load(repo, decoding, batch_size, ["input_features"])  # Whisper's encoder
        self.features = repo.preprocessor_config
        self._set_defaults(
            options,
            language=None,
            task=None,
            chunk_length_s=chunk_length_s,
            stride_length_s=stride_length_s,
        )
        self._strides({})  # the chunking options, checked

    __call__ = Task.__call__  # a waveform's {"text"}, a list's list of them (not flattened)

    def is_item(self, value: Any) -> bool:
        return is_waveform(value)

    def describe_items(self) -> str:
        return f"give {DESCRIPTION}, a list or a generator of them"

    def run_items(self, items: list, *, key: Any = None, **options: Any) -> list:
        waves = [waveform(w, self._rate()) for w in items]
        chunking = self._strides(options)
        window = self._window()
        pieces: list[tuple[int, np.ndarray]] = []  # (item, chunk)
        for index, wave in enumerate(waves):
            if chunking is None:
                if wave.shape[0] > window:
                    rate = self._rate()
                    raise InputError(
                        f"the audio is {wave.shape[0] / rate:.1f} s and Whisper hears "
                        f"{window / rate:g} s at a time: pass chunk_length_s (e.g. "
                        f"chunk_length_s={window / rate:g}) to transcribe it in chunks, as "
                        "transformers' pipeline does"
                    )
                pieces.append((index, wave))
            else:
                pieces.extend((index, chunk) for chunk in chunk_iter(wave, *chunking))
        options = {k: v for k, v in options.items() if k not in _CHUNKING}
        rows = []
        for start in range(0, len(pieces), self.batch_size):
            batch = [chunk for _, chunk in pieces[start : start + self.batch_size]]
            rows.extend(self.generate(log_mel(batch, self.features), key=key, **options))
        texts: list[list[list[int]]] = [[] for _ in waves]
        for (index, _), row in zip(pieces, rows):
            texts[index].append(self._text_tokens(row))
        return [
            {"text": self.tokenizer.decode(merge_overlapping(t), skip_special_tokens=True)}
            for t in texts
        ]

    def generate(self, features: np.ndarray, *, key: Any = None, **options: Any):
        """The new token ids (after the prompt) for log-mel `features` [batch, mels, frames]."""
        given = {**self.defaults, **options}
        prompt = self.prompt(given["language"], given["task"])
        return self.decode(
            {"input_features": np.asarray(features, np.float32)},
            prompt,
            features.shape[0],
            options,
            key,
        )

    def _window(self) -> int:
        """The samples Whisper hears at once (its feature extractor's n_samples)."""
        rate = self._rate()
        return int(
            self.features.get("n_samples", int(self.features.get("chunk_length", 30)) * rate)
        )

    def _rate(self) -> int:
        return int(self.features.get("sampling_rate", 16000))

    def _strides(self, options: Mapping[str, Any]) -> tuple[int, int, int] | None:
        """(chunk, left stride, right stride) in samples, as transformers' pipeline rounds
        them, or None without chunk_length_s."""
        given = {**self.defaults, **options}
        length, stride = given["chunk_length_s"], given["stride_length_s"]
        if length is None:
            return None
        length = threshold(length, "chunk_length_s")
        if length <= 0:
            raise InputError(f"chunk_length_s must be above 0; got {length}")
        if stride is None:
            stride = length / 6
        strides = [stride, stride] if not isinstance(stride, (list, tuple)) else list(stride)
        if len(strides) != 2:
            raise InputError(f"stride_length_s is a number or [left, right]; got {stride!r}")
        strides = [threshold(s, "stride_length_s") for s in strides]
        if min(strides) < 0:
            raise InputError(f"stride_length_s must be 0 or more; got {stride!r}")
        rate = self._rate()
        chunk = int(round(length * rate))
        left, right = (int(round(s * rate)) for s in strides)
        if chunk <= left + right:
            raise InputError(
                f"chunk_length_s={length} must be longer than its strides ({strides}, left and "
                "right)"
            )
        if chunk > self._window():
            raise InputError(
                f"chunk_length_s={length} is longer than the {self._window() / rate:g} s Whisper "
                "hears at once"
            )
        return chunk, left, right

    def _text_tokens(self, row: list[int]) -> list[int]:
        """A chunk's text tokens, as _decode_asr keeps them: no special tokens, no timestamps
        (the added tokens <|0.00|> ...)."""
        if not hasattr(self, "_not_text"):
            self._not_text = {
                i
                for i, token in self.tokenizer.get_added_tokens_decoder().items()
                if token.special or _TIMESTAMP.fullmatch(token.content)
            }
        return [t for t in row if t not in self._not_text]

    def prompt(self, language: str | None = None, task: str | None = None) -> list[int]:
        """Whisper's decoder prompt, as transformers' generate() makes it: the start token,
        the language and task tokens (given, else forced_decoder_ids'), <|notimestamps|>."""
        config = self.repo.generation_config
        start = config.get("decoder_start_token_id", self.repo.config.get("decoder_start_token_id"))
        tokens = [start]
        forced = dict(config.get("forced_decoder_ids") or [])
        languages, tasks = config.get("lang_to_id") or {}, config.get("task_to_id") or {}
        language = language or config.get("language")
        task = task or config.get("task")
        if language is not None:
            name = language if language.startswith("<|") else f"<|{language.lower()}|>"
            if name not in languages:
                raise InputError(f"language {language!r} is not one of {sorted(languages)}")
            tokens.append(languages[name])
        elif forced.get(1) is not None:
            tokens.append(forced[1])
        elif languages:
            raise InputError(
                f"{self.repo.source} is multilingual and detecting the language is not "
                f"implemented: give language= (one of {sorted(languages)})"
            )
        if task is not None:
            if task not in tasks:
                raise InputError(f"task {task!r} is not one of {sorted(tasks)}")
            tokens.append(tasks[task])
        elif forced.get(2) is not None and (language is None or forced[2] in tasks.values()):
            tokens.append(forced[2])
        elif language is not None and "transcribe" in tasks:
            tokens.append(tasks["transcribe"])
        no_timestamps = config.get("no_timestamps_token_id")
        if no_timestamps is not None and tokens[-1] != no_timestamps:
            tokens.append(no_timestamps)
        if start is None:
            raise InputError(f"{self.repo.source}: no decoder_start_token_id")
        return tokens


_CHUNKING = ("chunk_length_s", "stride_length_s")
_TIMESTAMP = re.compile(r"<\|\d+\.\d+\|>")


def chunk_iter(wave: np.ndarray, chunk: int, left: int, right: int) -> Iterator[np.ndarray]:
    """The chunks of `wave` as transformers' chunk_iter cuts them: `chunk` samples every
    chunk - left - right, the last reaching the end; a chunk no longer than its left stride
    (all of it heard already) is dropped."""
    step = chunk - left - right
    for start in range(0, wave.shape[0], step):
        end = start + chunk
        piece = wave[start:end]
        stride_left = 0 if start == 0 else left
        if piece.shape[0] > stride_left:
            yield piece
        if end >= wave.shape[0]:
            break


def merge_overlapping(sequences: Sequence[Sequence[int]]) -> list[int]:
    """Overlapping chunks' token sequences as one, as WhisperTokenizer's
    _find_longest_common_sequence merges them: each pair is aligned where the most tokens
    match (more than one, favoring longer alignments), and cut at the middle of the overlap,
    the left chunk's tokens before it and the right one's after. Empty chunks are skipped."""
    sequences = [list(s) for s in sequences if s]
    if not sequences:
        return []
    left = sequences[0]
    total: list[int] = []
    for right in sequences[1:]:
        best, bounds = 0.0, (len(left), len(left), 0, 0)
        for i in range(1, len(left) + len(right)):
            left_start, left_stop = (
                max(0, len(left) - i),
                min(len(left), len(left) + len(right) - i),
            )
            right_start, right_stop = max(0, i - len(left)), min(len(right), i)
            matches = int(
                np.sum(
                    np.array(left[left_start:left_stop]) == np.array(right[right_start:right_stop])
                )
            )
            score = matches / i + i / 10000.0  # the epsilon favors long perfect matches
            if matches > 1 and score > best:
                best, bounds = score, (left_start, left_stop, right_start, right_stop)
        left_start, left_stop, right_start, right_stop = bounds
        total.extend(left[: (left_start + left_stop) // 2])
        left = right[(right_start + right_stop) // 2 :]
    return total + left
