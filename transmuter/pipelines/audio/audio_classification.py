"""The audio-classification task: waveforms in, [{"score", "label"}] out, as transformers'
pipeline returns them, with the features of the repo's feature extractor:

- `ASTFeatureExtractor` (Audio Spectrogram Transformer): Kaldi log mel filter banks
  (audio.py's `kaldi_fbank`), padded with zeros or cut to `max_length` frames, normalized as
  (x - mean) / (2 std). Every clip is the same shape, so clips batch (the batch dim bucketed to
  powers of two) and one program serves any length.
- `Wav2Vec2FeatureExtractor` (wav2vec2, HuBERT, WavLM): the raw waveform, scaled to zero mean
  and unit variance with `do_normalize`. Their exports take no attention mask and the model
  means over every frame, so padding would change the answer: each clip runs alone at its own
  length, as transformers' pipeline runs it, a program per length (the `cache_size` most recent
  kept).
"""

from __future__ import annotations

import numpy as np

import transmuter
from transmuter.errors import ModelLoadError
from transmuter.pipelines.audio.features import kaldi_fbank
from transmuter.pipelines.audio.waveforms import WaveformItems, waveform
from transmuter.pipelines.base import SCORES, Task, choice, id2label, positive_int, ranked
from transmuter.pipelines.base import top_k as top_k_option
from transmuter.pipelines.repo import Repo

EXTRACTORS = ("ASTFeatureExtractor", "Wav2Vec2FeatureExtractor")


class AudioClassification(WaveformItems, Task):
    """Classify 1-D float waveforms at the feature extractor's sampling rate (numpy arrays, or
    {"array"/"raw", "sampling_rate"} dicts), one, a list or a generator: the `top_k` best of
    config.json's
    id2label (None: all) as [{"score", "label"}] per clip, scored by `function_to_apply`
    ("softmax", "sigmoid", "none"; by default sigmoid for multi-label configs, none for
    regression, else softmax)."""

    def __init__(
        self,
        repo: Repo,
        *,
        top_k: int | None = None,
        function_to_apply: str | None = None,
        batch_size: int = 8,
        cache_size: int = 8,
    ):
        self.repo = repo
        self.batch_size = positive_int(batch_size, "batch_size")
        self.cache_size = positive_int(cache_size, "cache_size")
        self.features = repo.preprocessor_config
        self.kind = self.features.get("feature_extractor_type")
        if self.kind not in EXTRACTORS:
            raise ModelLoadError(
                f"{repo.source}: preprocessor_config.json names feature extractor "
                f"{self.kind!r}; audio classification supports {', '.join(EXTRACTORS)}"
            )
        self.model = repo.model("model")
        if self.model.inputs != ["input_values"] or "logits" not in self.model.outputs:
            raise ModelLoadError(
                f"{repo.source}: audio classification feeds input_values and reads logits; the "
                f"model takes {self.model.inputs} and gives {self.model.outputs}"
            )
        self.top_k = _checked_top_k(top_k)
        self.function_to_apply = _checked_function(function_to_apply)
        self._compiled = None

    def run_items(
        self,
        items: list,
        *,
        top_k: int | None = None,
        function_to_apply: str | None = None,
        batch_size: int | None = None,
    ) -> list:
        waves = [waveform(w, self._rate()) for w in items]
        function = _checked_function(function_to_apply) or self.function_to_apply
        function = function or self._default_function()
        top_k = _checked_top_k(top_k) or self.top_k
        batch = self.batch_size if batch_size is None else positive_int(batch_size, "batch_size")
        return [self._ranked(row, function, top_k) for row in self._logits(waves, batch)]

    def _logits(self, waves: list[np.ndarray], batch_size: int) -> list[np.ndarray]:
        if self.kind == "Wav2Vec2FeatureExtractor":
            return [self._run(self._normalized(w)[None])[0] for w in waves]
        features = np.stack([self._spectrogram(w) for w in waves])
        return [
            row
            for start in range(0, len(features), batch_size)
            for row in self._run(features[start : start + batch_size])
        ]

    def _run(self, values: np.ndarray) -> np.ndarray:
        inputs = {"input_values": values}
        if self._compiled is None:
            batch = self._batch_dim()
            self._compiled = transmuter.compile(
                self.model,
                inputs,
                buckets={batch: "pow2"} if batch and self.kind == "ASTFeatureExtractor" else None,
                cache_size=self.cache_size,
            )
        return np.asarray(self._compiled(inputs)["logits"], np.float32)

    def _batch_dim(self) -> str | None:
        shape = getattr(self.model.input_specs["input_values"], "shape", None) or ()
        return str(shape[0]) if shape and not isinstance(shape[0], int) else None

    def _spectrogram(self, wave: np.ndarray) -> np.ndarray:
        """AST's input: [max_length, mels] normalized filter banks."""
        length = int(self.features.get("max_length", 1024))
        mels = int(self.features.get("num_mel_bins", 128))
        bank = kaldi_fbank(wave, mels, self._rate())[:length]
        bank = np.pad(bank, ((0, length - bank.shape[0]), (0, 0)))
        if self.features.get("do_normalize", True):
            mean = np.float32(self.features.get("mean", -4.2677393))
            std = np.float32(self.features.get("std", 4.5689974))
            bank = (bank - mean) / (std * 2)
        return bank.astype(np.float32)

    def _normalized(self, wave: np.ndarray) -> np.ndarray:
        """wav2vec2's input: the float32 waveform, zero mean and unit variance when configured."""
        wave = wave.astype(np.float32)
        if self.features.get("do_normalize", True):
            wave = (wave - wave.mean()) / np.sqrt(wave.var() + 1e-7)
        return wave

    def _ranked(self, logits: np.ndarray, function: str, top_k: int | None) -> list[dict]:
        scores = SCORES[function](logits.astype(np.float64))
        # transformers' audio-classification answers {"score", "label"} in that order.
        return [
            {"score": r["score"], "label": r["label"]}
            for r in ranked(scores, id2label(self.repo.config, len(scores)), top_k)
        ]

    def _default_function(self) -> str:
        problem = self.repo.config.get("problem_type")
        return {"regression": "none", "multi_label_classification": "sigmoid"}.get(
            problem, "softmax"
        )

    def _rate(self) -> int:
        return int(self.features.get("sampling_rate", 16000))


def _checked_top_k(top_k: int | None) -> int | None:
    return top_k_option(top_k, none=True)


def _checked_function(function: str | None) -> str | None:
    return None if function is None else choice(function, "function_to_apply", SCORES)
