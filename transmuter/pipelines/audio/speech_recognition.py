"""The automatic-speech-recognition task with Whisper: waveforms in, {"text": ...} out, as
transformers' pipeline returns them. Log-mel features in audio.py, decoding in seq2seq.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transmuter.errors import InputError
from transmuter.pipelines.audio.features import log_mel
from transmuter.pipelines.generation.seq2seq import seq2seq_decoder
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.text.text2text_generation import Text2TextGeneration, seq2seq_settings


class AutomaticSpeechRecognition(Text2TextGeneration):
    """Transcribe (or translate) 1-D float waveforms at the preprocessor's sampling rate
    (numpy arrays, or {"array"/"raw", "sampling_rate"} dicts), one or a list. Greedy by
    default; the options are text2text-generation's, and `language` ("en", "<|en|>") and
    `task` ("transcribe", "translate") choose Whisper's prompt tokens (default
    generation_config.json's forced_decoder_ids). No timestamps: the prompt ends with
    <|notimestamps|>."""

    task = "automatic-speech-recognition"

    def __init__(self, repo: Repo, *, decoding: str = "past", **options: Any):
        self.repo = repo
        self.tokenizer = repo.require_tokenizer(self.task)
        self.decoder = seq2seq_decoder(repo, self.task, decoding)
        if self.decoder.encoder.inputs != ["input_features"]:
            raise InputError(
                f"{repo.source}: speech recognition feeds input_features (Whisper's encoder); "
                f"the encoder takes {self.decoder.encoder.inputs}"
            )
        self.features = repo.preprocessor_config
        self._set_defaults(options, language=None, task=None)

    def __call__(self, inputs: Any, *, key: Any = None, **options: Any) -> Any:
        single = not isinstance(inputs, (list, tuple))
        waves = [self._waveform(w) for w in ([inputs] if single else inputs)]
        if not waves:
            raise InputError("give a waveform or a non-empty list of them")
        rows = self.generate(log_mel(waves, self.features), key=key, **options)
        texts = [{"text": self._text(row)} for row in rows]
        return texts[0] if single else texts

    def generate(self, features: np.ndarray, *, key: Any = None, **options: Any):
        """The new token ids (after the prompt) for log-mel `features` [batch, mels, frames]."""
        given, key = self._given(options, key)
        max_new = int(given["max_new_tokens"])
        prompt = self.prompt(given["language"], given["task"])
        self._check_length(len(prompt) + max_new)
        settings = seq2seq_settings(self.repo, self._settings(given), len(prompt))
        return self._streamed(
            features.shape[0],
            given,
            lambda on_token: self.decoder.generate(
                {"input_features": np.asarray(features, np.float32)},
                prompt,
                max_new_tokens=max_new,
                settings=settings,
                key=key,
                on_token=on_token,
            ),
        )

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

    def _waveform(self, wave: Any) -> np.ndarray:
        rate = int(self.features.get("sampling_rate", 16000))
        if isinstance(wave, Mapping):
            given = wave.get("sampling_rate", rate)
            if given != rate:
                raise InputError(
                    f"the waveform is sampled at {given} Hz and the model takes {rate} Hz: "
                    "resample it first"
                )
            wave = wave.get("array", wave.get("raw"))
        wave = np.asarray(wave)
        if wave.ndim != 1 or wave.size == 0 or not np.issubdtype(wave.dtype, np.floating):
            raise InputError(
                f"a waveform is a non-empty 1-D float array; got {wave.dtype}{list(wave.shape)}"
            )
        return wave
