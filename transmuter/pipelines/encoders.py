"""Encoder tasks: feature-extraction, text-classification and token-classification.

Texts are tokenized with the repository's tokenizer.json, run in batches padded to the longest
text (the compiled model then pads sequences to a multiple of 16 and batches to a power of two,
so a few programs serve every batch), and the outputs turned into what transformers' pipelines
return.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.repo import Repo

_TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class Encoder:
    """A text encoder's model and tokenizer, running batches of texts."""

    def __init__(self, repo: Repo, task: str, batch_size: int):
        if batch_size < 1:
            raise InputError(f"batch_size must be at least 1; got {batch_size}")
        self.repo = repo
        self.tokenizer = repo.require_tokenizer(task)
        self.model = repo.model("model")
        unknown = [n for n in self.model.inputs if n not in _TEXT_INPUTS]
        if unknown or "input_ids" not in self.model.inputs:
            raise ModelLoadError(
                f"{repo.source}: {task} feeds {', '.join(_TEXT_INPUTS)}; the model takes "
                f"{self.model.inputs}"
            )
        self.batch_size = batch_size
        self.pairs = task == "text-classification"
        self.pad_id = _pad_id(repo, self.tokenizer)
        self.limit = limit = repo.config.get("max_position_embeddings")
        if limit and self.tokenizer.truncation is None:
            # Past the model's positions the embedding lookup would fail: cut as transformers'
            # tokenizers do (keeping the special tokens the post-processor adds).
            self.tokenizer.enable_truncation(limit)
        self._compiled = None

    def encode(self, texts: Sequence[Any]) -> list[Any]:
        """Each text's tokenizer encoding (truncated to the model's positions); a pair
        {"text", "text_pair"} (a cross-encoder's query and passage, as transformers'
        text-classification takes them) encodes as the tokenizer's pair template."""
        return self.tokenizer.encode_batch([_text_or_pair(t, self.pairs) for t in texts])

    def sequence_bucket(self, text: Any) -> int:
        """The padded length `text` runs at (tokens rounded up to a multiple of 16): texts of
        one bucket batch together without padding each other further."""
        return -(-len(self.encode([text])[0].ids) // 16) * 16

    def run(self, encodings: Sequence[Any], output: str) -> list[np.ndarray]:
        """`output` for each encoding, its padding cut off along the sequence when it has one."""
        rows = self.run_outputs(encodings, (output,))
        return [
            row[output][: len(e.ids)] if row[output].ndim > 1 else row[output]
            for row, e in zip(rows, encodings)
        ]

    def run_outputs(
        self, encodings: Sequence[Any], outputs: Sequence[str]
    ) -> list[dict[str, np.ndarray]]:
        """Several outputs for each encoding from one run, each row as the batch had it
        (padded to the batch's longest encoding): the caller knows which outputs run along the
        sequence."""
        missing = [o for o in outputs if o not in self.model.outputs]
        if missing:
            raise ModelLoadError(f"{self.repo.source}: the model has no output {missing[0]!r}")
        results = []
        for start in range(0, len(encodings), self.batch_size):
            chunk = encodings[start : start + self.batch_size]
            found = self._call(self._inputs(chunk))
            values = {o: np.asarray(found[o]) for o in outputs}
            results += [{o: v[row] for o, v in values.items()} for row in range(len(chunk))]
        return results

    def _inputs(self, chunk: Sequence[Any]) -> dict[str, np.ndarray]:
        width = max(len(e.ids) for e in chunk)
        ids = np.full((len(chunk), width), self.pad_id, np.int64)
        mask = np.zeros((len(chunk), width), np.int64)
        types = np.zeros((len(chunk), width), np.int64)
        for row, encoding in enumerate(chunk):
            n = len(encoding.ids)
            ids[row, :n], mask[row, :n], types[row, :n] = encoding.ids, 1, encoding.type_ids
        given = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return {n: given[n] for n in self.model.inputs}

    def _call(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        if self._compiled is None:
            self._compiled = transmuter.compile(
                self.model,
                inputs,
                buckets=self._buckets(),
                pad_values=self._pad_values(),
                cache_size=self._programs(),
            )
        return self._compiled(inputs)

    def _buckets(self) -> dict[str, Any] | None:
        """The batch and sequence dims of input_ids, by the names the file gives them; none
        without an attention mask, which alone makes a padded sequence invisible."""
        shape = getattr(self.model.input_specs["input_ids"], "shape", None) or ()
        names = [str(d) for d in shape if not isinstance(d, int)]
        if len(names) != 2 or "attention_mask" not in self.model.inputs:
            return None
        return {names[0]: "pow2", names[1]: ("multiple", 16)}

    def _programs(self) -> int:
        """Room for every (batch, sequence) bucket traffic can reach: batches of 1, 2, 4, ...
        up to batch_size, sequences by 16 up to the model's positions (512 where the config
        does not say). Fewer would evict and recompile programs that varied traffic needs
        again."""
        batches = (self.batch_size - 1).bit_length() + 1
        return batches * -(-(self.limit or 512) // 16)

    def _pad_values(self) -> dict[str, int] | None:
        return {"input_ids": self.pad_id} if self._buckets() else None


def _pad_id(repo: Repo, tokenizer: Any) -> int:
    pad = repo.config.get("pad_token_id")
    if isinstance(pad, int):
        return pad
    for token in ("[PAD]", "<pad>"):
        found = tokenizer.token_to_id(token)
        if found is not None:
            return found
    return 0  # masked out: any id in the vocabulary does


def _text_or_pair(item: Any, pairs: bool) -> str | tuple[str, str]:
    if isinstance(item, str):
        return item
    if pairs and isinstance(item, dict) and set(item) == {"text", "text_pair"}:
        pair = (item["text"], item["text_pair"])
        if all(isinstance(t, str) for t in pair):
            return pair
    wanted = 'strings or {"text", "text_pair"} pairs of strings' if pairs else "strings"
    raise InputError(f"the inputs must be {wanted}; got {item!r}")


def _as_list(inputs: Any) -> tuple[list[Any], bool]:
    """The texts (or pairs), and whether one (not a list) was given."""
    if isinstance(inputs, (str, dict)):
        return [inputs], True
    if isinstance(inputs, Sequence) and inputs:
        return list(inputs), False
    raise InputError(f"give a string or a non-empty list of strings; got {inputs!r}")


class FeatureExtraction:
    """Text -> embeddings: per token (`pooling="none"`: an array [tokens, hidden] per text) or
    pooled (`"mean"` over the real tokens, `"cls"` the first token: an array [texts, hidden],
    [hidden] for one text), L2-normalized with `normalize=True`."""

    def __init__(
        self, repo: Repo, *, pooling: str = "none", normalize: bool = False, batch_size: int = 8
    ):
        if pooling not in ("none", "mean", "cls"):
            raise InputError(f"pooling must be 'none', 'mean' or 'cls'; got {pooling!r}")
        self.encoder = Encoder(repo, "feature-extraction", batch_size)
        self.pooling, self.normalize = pooling, normalize
        outputs = self.encoder.model.outputs
        self.output = "last_hidden_state" if "last_hidden_state" in outputs else outputs[0]

    def batch_key(self, text: str) -> int:
        """`Serving` batches texts of one sequence bucket together."""
        return self.encoder.sequence_bucket(text)

    def __call__(self, inputs: str | Sequence[str]) -> Any:
        texts, single = _as_list(inputs)
        hidden = self.encoder.run(self.encoder.encode(texts), self.output)
        if self.pooling == "none":
            rows = [_normalized(h) if self.normalize else h for h in hidden]
            return rows[0] if single else rows
        pooled = np.stack([h.mean(0) if self.pooling == "mean" else h[0] for h in hidden])
        if self.normalize:
            pooled = _normalized(pooled)
        return pooled[0] if single else pooled


# sentence-transformers' pooling modes (1_Pooling/config.json) by FeatureExtraction's names.
_POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
_NORMALIZE_MODULE = "sentence_transformers.models.Normalize"


def sentence_embedding(repo: Repo) -> dict[str, Any]:
    """FeatureExtraction's `pooling` and `normalize` for `repo`'s sentence embeddings: as its
    sentence-transformers files say (the mode set in 1_Pooling/config.json, a Normalize module
    in modules.json), else mean pooling, normalized."""
    if not repo.pooling:
        return {"pooling": "mean", "normalize": True}
    modes = sorted(k for k, v in repo.pooling.items() if k.startswith("pooling_mode") and v)
    if len(modes) != 1 or modes[0] not in _POOLING_MODES:
        raise ModelLoadError(
            f"{repo.source}: 1_Pooling/config.json sets {modes}; Transmuter pools by exactly "
            f"one of {sorted(_POOLING_MODES)}"
        )
    normalize = any(m.get("type") == _NORMALIZE_MODULE for m in repo.modules if isinstance(m, dict))
    return {"pooling": _POOLING_MODES[modes[0]], "normalize": normalize}


def _normalized(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _labels(repo: Repo, count: int) -> list[str]:
    """config.json's id2label, or LABEL_i as transformers names unlabeled classes."""
    names = repo.config.get("id2label") or {}
    return [str(names.get(str(i), names.get(i, f"LABEL_{i}"))) for i in range(count)]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


_SCORES = {
    "softmax": _softmax,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "none": lambda x: x,
}


class TextClassification:
    """Text (or a {"text", "text_pair"} pair) -> [{"label", "score"}] as transformers'
    text-classification: softmax over the labels (a sigmoid for one label or multi-label
    configs; per call, `function_to_apply` "softmax", "sigmoid" or "none" for the logits); the
    best label per text, or the `top_k` best (None: all) as a list per text."""

    def __init__(self, repo: Repo, *, top_k: int | None = 1, batch_size: int = 8):
        self.encoder = Encoder(repo, "text-classification", batch_size)
        self.top_k = top_k
        self.sigmoid = (
            repo.config.get("problem_type") == "multi_label_classification"
            or len(repo.config.get("id2label") or {}) == 1
        )

    def batch_key(self, text: str) -> int:
        """`Serving` batches texts of one sequence bucket together."""
        return self.encoder.sequence_bucket(text)

    def single(self, rows: list) -> Any:
        """What one text (not a list) gets, from the rows of a list of one."""
        return rows if self.top_k == 1 else rows[0]

    def __call__(self, inputs: Any, *, function_to_apply: str | None = None) -> Any:
        if function_to_apply is None:
            function_to_apply = "sigmoid" if self.sigmoid else "softmax"
        if function_to_apply not in _SCORES:
            raise InputError(
                f"function_to_apply must be one of {', '.join(_SCORES)}; got {function_to_apply!r}"
            )
        texts, single = _as_list(inputs)
        logits = self.encoder.run(self.encoder.encode(texts), "logits")
        results = []
        for row in logits:
            scores = _SCORES[function_to_apply](row)
            labels = _labels(self.encoder.repo, len(scores))
            order = np.argsort(-scores, kind="stable")[: self.top_k]
            ranked = [{"label": labels[i], "score": float(scores[i])} for i in order]
            results.append(ranked[0] if self.top_k == 1 else ranked)
        return self.single(results) if single else results


class TokenClassification:
    """Text -> one dict per token not labeled in `ignore_labels` (special tokens left out), as
    transformers' token-classification without aggregation: entity, score (softmax), index
    (in the tokenized text), word (the token), start and end (character offsets)."""

    def __init__(self, repo: Repo, *, ignore_labels: Sequence[str] = ("O",), batch_size: int = 8):
        self.encoder = Encoder(repo, "token-classification", batch_size)
        self.ignore = set(ignore_labels)

    def batch_key(self, text: str) -> int:
        """`Serving` batches texts of one sequence bucket together."""
        return self.encoder.sequence_bucket(text)

    def __call__(self, inputs: str | Sequence[str]) -> Any:
        texts, single = _as_list(inputs)
        encodings = self.encoder.encode(texts)
        results = []
        for encoding, logits in zip(encodings, self.encoder.run(encodings, "logits")):
            scores = _softmax(logits)
            labels = _labels(self.encoder.repo, scores.shape[-1])
            found = []
            for index, token in enumerate(encoding.tokens):
                best = int(scores[index].argmax())
                if encoding.special_tokens_mask[index] or labels[best] in self.ignore:
                    continue
                start, end = encoding.offsets[index]
                found.append(
                    {
                        "entity": labels[best],
                        "score": float(scores[index, best]),
                        "index": index,
                        "word": token,
                        "start": start,
                        "end": end,
                    }
                )
            results.append(found)
        return results[0] if single else results
