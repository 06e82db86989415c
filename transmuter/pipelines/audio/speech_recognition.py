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

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.audio.features import log_mel
from transmuter.pipelines.audio.waveforms import WaveformItems, waveform
from transmuter.pipelines.base import Task, positive_int, threshold
from transmuter.pipelines.repo import Repo, read_json
from transmuter.pipelines.text.text2text_generation import Text2TextGeneration


class AutomaticSpeechRecognition(WaveformItems, Text2TextGeneration):
    """Transcribe (or translate) 1-D float waveforms at the preprocessor's sampling rate
    (numpy arrays, or {"array"/"raw", "sampling_rate"} dicts), one, a list or a generator.
    Beam search with 5 beams by default (where generation_config.json sets no num_beams), as
    transformers' pipeline decodes Whisper; num_beams=1 is greedy. The options are
    text2text-generation's (less num_return_sequences), and `language` ("en",
    "<|en|>") and `task` ("transcribe", "translate") choose Whisper's prompt tokens (default
    generation_config.json's forced_decoder_ids); `chunk_length_s` and `stride_length_s` (a
    number or [left, right]) transcribe audio longer than Whisper's window in overlapping
    chunks, as transformers' pipeline does. No timestamps: the prompt ends with
    <|notimestamps|>."""

    task = "automatic-speech-recognition"
    # transformers' ASR pipeline's default: 5 beams, as OpenAI's Whisper; one text a waveform.
    own_defaults = {"num_beams": 5, "length_penalty": 1.0, "early_stopping": False}

    def __new__(cls, repo: Repo, **options: Any):
        # One task name, two kinds of model, as in transformers: an export without an
        # encoder_model.onnx and with a model.onnx is a CTC model (wav2vec2, HuBERT, ...).
        if cls is AutomaticSpeechRecognition and is_ctc(repo):
            return CTCSpeechRecognition(repo, **options)
        return super().__new__(cls)

    def __init__(
        self,
        repo: Repo,
        *,
        decoding: str = "past",
        batch_size: int = 8,
        chunk_length_s: float | None = None,
        stride_length_s: float | Sequence[float] | None = None,
        generate_kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ):
        self._load(repo, decoding, batch_size, ["input_features"])  # Whisper's encoder
        self.features = repo.preprocessor_config
        options = _with_generate_kwargs(options, generate_kwargs)
        self._set_defaults(
            options,
            language=None,
            task=None,
            chunk_length_s=chunk_length_s,
            stride_length_s=stride_length_s,
        )
        self._strides({})  # the chunking options, checked

    __call__ = Task.__call__  # a waveform's {"text"}, a list's list of them (not flattened)

    def run_items(
        self,
        items: list,
        *,
        key: Any = None,
        batch_size: int | None = None,
        generate_kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> list:
        options = _with_generate_kwargs(options, generate_kwargs)
        batch_size = (
            self.batch_size if batch_size is None else positive_int(batch_size, "batch_size")
        )
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
        for start in range(0, len(pieces), batch_size):
            batch = [chunk for _, chunk in pieces[start : start + batch_size]]
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

    def _lengths(self, given: dict[str, Any], prompt_length: int):
        """As WhisperForConditionalGeneration.generate counts them: a max_length (without
        max_new_tokens) counts after the prompt's first max_target_positions // 2 - 1 tokens,
        the total capped at max_target_positions."""
        limit = self.repo.config.get("max_target_positions")
        if given["max_new_tokens"] is None and given["max_length"] is not None and limit:
            total = int(given["max_length"]) + min(int(limit) // 2 - 1, prompt_length)
            given = {**given, "max_length": min(total, int(limit))}
        return super()._lengths(given, prompt_length)

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
        strides = chunk_strides({**self.defaults, **options}, self._rate(), align=1)
        if strides is not None and strides[0] > self._window():
            raise InputError(
                f"chunk_length_s={strides[0] / self._rate():g} is longer than the "
                f"{self._window() / self._rate():g} s Whisper hears at once"
            )
        return strides

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


def _with_generate_kwargs(
    options: dict[str, Any], generate_kwargs: Mapping[str, Any] | None
) -> dict[str, Any]:
    """`options` with transformers' `generate_kwargs` dict merged in (its keys are this task's
    generation options: max_new_tokens, language, task, ...); a key given both ways is an
    InputError, as transformers' pipeline raises for it."""
    if generate_kwargs is None:
        return options
    if not isinstance(generate_kwargs, Mapping):
        raise InputError(f"generate_kwargs must be a dict; got {type(generate_kwargs).__name__}")
    both = sorted(set(options) & set(generate_kwargs))
    if both:
        raise InputError(f"{both} given both as options and in generate_kwargs: give them once")
    return {**options, **generate_kwargs}


_TIMESTAMP = re.compile(r"<\|\d+\.\d+\|>")


def chunk_strides(
    given: Mapping[str, Any], rate: int, *, align: int
) -> tuple[int, int, int] | None:
    """chunk_length_s and stride_length_s (a number, or [left, right]; a sixth of the chunk
    where not given) checked and turned into samples: (chunk, left, right), each rounded to a
    multiple of `align` samples (a model's frame), or None without chunk_length_s."""
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
    chunk, left, right = (int(round(s * rate / align) * align) for s in (length, *strides))
    if chunk <= left + right:
        raise InputError(
            f"chunk_length_s={length} must be longer than its strides ({strides}, left and right)"
        )
    return chunk, left, right


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


def is_ctc(repo: Repo) -> bool:
    """Whether `repo` is a CTC speech model's export: model.onnx and no encoder-decoder."""
    return "model" in repo.onnx and "encoder" not in repo.onnx


class CTCSpeechRecognition(WaveformItems, Task):
    """automatic-speech-recognition with CTC models (Wav2Vec2ForCTC, HuBERT, WavLM: Optimum's
    model.onnx, input_values in, logits out; Wav2Vec2CTCTokenizer's vocab.json): each frame's
    best token, repeats merged, blanks (the pad token) dropped, the word delimiter a space, as
    transformers' pipeline decodes them. Each clip (or chunk) runs alone at its own length
    (the exports take no attention mask). `chunk_length_s` / `stride_length_s` cut long audio
    into overlapping chunks, rounded to the model's samples per frame, whose frames are kept
    between the strides and joined; `return_timestamps` ("char" or "word") adds {"text",
    "timestamp": (start, end)} chunks in seconds."""

    task = "automatic-speech-recognition"

    def __init__(
        self,
        repo: Repo,
        *,
        batch_size: int = 8,
        chunk_length_s: float | None = None,
        stride_length_s: float | Sequence[float] | None = None,
        return_timestamps: str | None = None,
        cache_size: int = 8,
    ):
        self.repo = repo
        self.batch_size = positive_int(batch_size, "batch_size")
        self.cache_size = positive_int(cache_size, "cache_size")
        self.features = repo.preprocessor_config
        self.model = repo.model("model")
        if self.model.inputs != ["input_values"] or "logits" not in self.model.outputs:
            raise ModelLoadError(
                f"{repo.source}: CTC speech recognition feeds input_values and reads logits; "
                f"the model takes {self.model.inputs} and gives {self.model.outputs}"
            )
        vocab = read_json(repo, "vocab.json")
        if not vocab:
            raise ModelLoadError(
                f"{repo.source}: CTC speech recognition reads Wav2Vec2CTCTokenizer's vocab.json; "
                f"found {repo.found}"
            )
        if all(isinstance(v, dict) for v in vocab.values()):  # multilingual: {lang: vocab}
            target = repo.tokenizer_config.get("target_lang")
            if target not in vocab:
                raise ModelLoadError(
                    f"{repo.source}: vocab.json holds languages {sorted(vocab)} and "
                    f"tokenizer_config.json's target_lang is {target!r}"
                )
            vocab = vocab[target]
        self.tokens = {int(i): t for t, i in vocab.items()}
        config = repo.tokenizer_config
        self.blank = _token_text(config.get("pad_token", "<pad>"))
        self.delimiter = _token_text(config.get("word_delimiter_token", "|"))
        self.space = config.get("replace_word_delimiter_char", " ")
        self.lower = bool(config.get("do_lower_case", False))
        self.align = int(np.prod(repo.config.get("conv_stride") or [1]))
        self.defaults = {
            "chunk_length_s": chunk_length_s,
            "stride_length_s": stride_length_s,
            "return_timestamps": return_timestamps,
        }
        self._strides({})
        _timestamps(return_timestamps)
        self._compiled = None

    def run_items(self, items: list, *, batch_size: int | None = None, **options: Any) -> list:
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            raise InputError(
                f"{self.task} (CTC) has no option {unknown}; it takes "
                f"{sorted([*self.defaults, 'batch_size'])}"
            )
        if batch_size is not None:
            positive_int(batch_size, "batch_size")
        given = {**self.defaults, **options}
        timestamps = _timestamps(given["return_timestamps"])
        chunking = self._strides(options)
        rate = int(self.features.get("sampling_rate", 16000))
        results = []
        for item in items:
            wave = waveform(item, rate)
            if chunking is None:
                frames = self._frames(wave)
            else:
                chunk, left, right = chunking
                frames = np.concatenate(
                    [
                        self._frames(piece)[keep_left : frames_n - keep_right]
                        for piece, (frames_n, keep_left, keep_right) in _ctc_chunks(
                            wave, chunk, left, right, self.align
                        )
                    ]
                )
            results.append(self._decoded(frames, timestamps, rate))
        return results

    def _frames(self, wave: np.ndarray) -> np.ndarray:
        """Each logit frame's best token id, for one clip."""
        values = wave.astype(np.float32)
        if self.features.get("do_normalize", True):
            values = (values - values.mean()) / np.sqrt(values.var() + 1e-7)
        inputs = {"input_values": values[None]}
        if self._compiled is None:
            self._compiled = transmuter.compile(self.model, inputs, cache_size=self.cache_size)
        logits = np.asarray(self._compiled(inputs)["logits"], np.float32)
        return logits[0].argmax(-1)

    def _decoded(self, ids: np.ndarray, timestamps: str | None, rate: int) -> dict:
        """Wav2Vec2CTCTokenizer.decode's text (and offsets) of frame tokens `ids`."""
        tokens = [self.tokens.get(int(i), "") for i in ids]
        groups: list[tuple[str, int, int]] = []  # (token, first frame, end frame)
        for index, token in enumerate(tokens):
            if groups and groups[-1][0] == token:
                groups[-1] = (token, groups[-1][1], index + 1)
            else:
                groups.append((token, index, index + 1))
        chars = [
            (self.space if t == self.delimiter else t, start, end)
            for t, start, end in groups
            if t != self.blank
        ]
        text = "".join(c for c, _, _ in chars).strip()
        result: dict[str, Any] = {"text": text.lower() if self.lower else text}
        if timestamps is None:
            return result
        pieces = chars if timestamps == "char" else _words(chars, self.space)
        scale = self.align / rate
        result["chunks"] = [
            {"text": piece, "timestamp": (start * scale, end * scale)}
            for piece, start, end in pieces
        ]
        return result

    def _strides(self, options: Mapping[str, Any]) -> tuple[int, int, int] | None:
        """(chunk, left, right) in samples, rounded to whole frames as transformers' pipeline
        rounds them for CTC models, or None without chunk_length_s."""
        rate = int(self.features.get("sampling_rate", 16000))
        return chunk_strides({**self.defaults, **options}, rate, align=self.align)


def _token_text(token: Any) -> Any:
    """A special token of tokenizer_config.json: a string or an AddedToken's dict."""
    return token.get("content") if isinstance(token, Mapping) else token


def _timestamps(value: Any) -> str | None:
    if value is None or value is False:
        return None
    if value not in ("char", "word"):
        raise InputError(
            "a CTC model's return_timestamps is 'char' or 'word' (as transformers has it); got "
            f"{value!r}"
        )
    return value


def _ctc_chunks(
    wave: np.ndarray, chunk: int, left: int, right: int, align: int
) -> Iterator[tuple[np.ndarray, tuple[int, int, int]]]:
    """transformers' chunk_iter for CTC: each chunk and its stride in frames (frames, left,
    right: rescale_stride's rounding), the first without a left stride, the last without a
    right one."""
    step = chunk - left - right
    for start in range(0, wave.shape[0], step):
        end = start + chunk
        piece = wave[start:end]
        is_last = end >= wave.shape[0]
        stride_left = 0 if start == 0 else left
        stride_right = 0 if is_last else right
        if piece.shape[0] > stride_left:
            frames = int(round(piece.shape[0] / align))
            yield (
                piece,
                (
                    frames,
                    int(round(stride_left / piece.shape[0] * frames)),
                    int(round(stride_right / piece.shape[0] * frames)),
                ),
            )
        if is_last:
            break


def _words(chars: list[tuple[str, int, int]], space: str) -> list[tuple[str, int, int]]:
    """Wav2Vec2CTCTokenizer._get_word_offsets: runs of characters between spaces, each from
    its first character's start to its last one's end."""
    words: list[tuple[str, int, int]] = []
    word, start, end, last = "", 0, 0, "SPACE"
    for char, char_start, char_end in chars:
        state = "SPACE" if char == space else "WORD"
        if state == last:
            end = char_end
            word += char
        elif state == "SPACE":
            words.append((word, start, end))
        else:
            word, start, end = char, char_start, char_end
        last = state
    if last == "WORD":
        words.append((word, start, end))
    return words
