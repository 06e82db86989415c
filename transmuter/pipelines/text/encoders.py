"""Encoder tasks: feature-extraction, text-classification and token-classification.

Texts are tokenized with the repository's tokenizer.json, run in batches padded to the longest
text (the compiled model then pads sequences to a multiple of 16 and batches to a power of two,
so a few programs serve every batch), and the outputs turned into what transformers' pipelines
return.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.base import (
    SCORES,
    Task,
    choice,
    id2label,
    positive_int,
    ranked,
    softmax,
)
from transmuter.pipelines.base import top_k as top_k_option
from transmuter.pipelines.repo import Repo

_TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class _Unset:
    """The default of an option whose absence changes the answer's shape."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()


class Encoder:
    """A text encoder's model and tokenizer, running batches of texts."""

    def __init__(self, repo: Repo, task: str, batch_size: int):
        self.batch_size = positive_int(batch_size, "batch_size")
        self.repo = repo
        self.tokenizer = repo.require_tokenizer(task)
        self.model = repo.model("model")
        unknown = [n for n in self.model.inputs if n not in _TEXT_INPUTS]
        if unknown or "input_ids" not in self.model.inputs:
            raise ModelLoadError(
                f"{repo.source}: {task} feeds {', '.join(_TEXT_INPUTS)}; the model takes "
                f"{self.model.inputs}"
            )
        self.pairs = task == "text-classification"
        self.pad_id = _pad_id(repo, self.tokenizer)
        self.limit = limit = repo.max_length()
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


class FeatureExtraction(Task):
    """Text -> embeddings: per token (`pooling="none"`: an array [tokens, hidden] per text) or
    pooled (`"mean"` over the real tokens, `"cls"` the first token: an array [texts, hidden],
    [hidden] for one text), L2-normalized with `normalize=True`."""

    def __init__(
        self, repo: Repo, *, pooling: str = "none", normalize: bool = False, batch_size: int = 8
    ):
        self.pooling = choice(pooling, "pooling", ("none", "mean", "cls"))
        self.encoder = Encoder(repo, "feature-extraction", batch_size)
        self.batch_size, self.normalize = self.encoder.batch_size, normalize
        outputs = self.encoder.model.outputs
        self.output = "last_hidden_state" if "last_hidden_state" in outputs else outputs[0]

    def batch_key(self, text: str) -> int:
        """`Serving` batches texts of one sequence bucket together."""
        return self.encoder.sequence_bucket(text)

    def __call__(self, inputs: Any, **options: Any) -> Any:
        results = super().__call__(inputs, **options)
        # Pooled vectors of a list come as one array [texts, hidden].
        return (
            np.stack(results) if self.pooling != "none" and isinstance(results, list) else results
        )

    def run_items(self, items: list) -> list:
        hidden = self.encoder.run(self.encoder.encode(items), self.output)
        if self.pooling != "none":
            hidden = [h.mean(0) if self.pooling == "mean" else h[0] for h in hidden]
        return [_normalized(h) if self.normalize else h for h in hidden]


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


class TextClassification(Task):
    """Text (or a {"text", "text_pair"} pair) -> [{"label", "score"}] as transformers'
    text-classification: softmax over the labels (a sigmoid for one label or multi-label
    configs; `function_to_apply` "softmax", "sigmoid" or "none" for the logits). Without a
    `top_k`, the best label per text as a dict (one text gives a list of that dict, one pair
    the dict); with a `top_k` (None: all labels), a list of the best per text. `top_k` and
    `function_to_apply` are options here and per call."""

    def __init__(
        self,
        repo: Repo,
        *,
        top_k: int | None | _Unset = UNSET,
        function_to_apply: str | None = None,
        batch_size: int = 8,
    ):
        self.encoder = Encoder(repo, "text-classification", batch_size)
        self.batch_size = self.encoder.batch_size
        sigmoid = (
            repo.config.get("problem_type") == "multi_label_classification"
            or len(repo.config.get("id2label") or {}) == 1
        )
        self.defaults = {
            "top_k": UNSET if top_k is UNSET else top_k_option(top_k, none=True),
            "function_to_apply": "sigmoid" if sigmoid else "softmax",
        }
        if function_to_apply is not None:
            self.defaults["function_to_apply"] = choice(
                function_to_apply, "function_to_apply", SCORES
            )

    def batch_key(self, text: str) -> int:
        """`Serving` batches texts of one sequence bucket together."""
        return self.encoder.sequence_bucket(text)

    def single(self, result: Any, item: Any, options: Mapping[str, Any]) -> Any:
        # transformers' odd case: one string called without a top_k answers a list of its
        # result (of its one dict, or with top_k set at construction, of its list).
        return [result] if isinstance(item, str) and "top_k" not in options else result

    def run_items(
        self,
        items: list,
        *,
        top_k: Any = UNSET,
        function_to_apply: str | None = None,
        batch_size: int | None = None,
    ) -> list:
        if batch_size is not None:  # transformers' per-call batching; answers do not depend on it
            positive_int(batch_size, "batch_size")
        if top_k is UNSET:
            top_k = self.defaults["top_k"]
        else:
            top_k = top_k_option(top_k, none=True)
        function = self.defaults["function_to_apply"]
        if function_to_apply is not None:
            function = choice(function_to_apply, "function_to_apply", SCORES)
        logits = self.encoder.run(self.encoder.encode(items), "logits")
        results = []
        for row in logits:
            scores = SCORES[function](row)
            best = ranked(scores, id2label(self.encoder.repo.config, len(scores)), None)
            results.append(best[0] if top_k is UNSET else best[:top_k])
        return results


class TokenClassification(Task):
    """Text -> one dict per token not labeled in `ignore_labels` (special tokens left out), as
    transformers' token-classification without aggregation: entity, score (softmax), index
    (in the tokenized text), word (the token), start and end (character offsets)."""

    def __init__(self, repo: Repo, *, ignore_labels: Sequence[str] = ("O",), batch_size: int = 8):
        self.encoder = Encoder(repo, "token-classification", batch_size)
        self.batch_size = self.encoder.batch_size
        self.ignore = set(ignore_labels)

    def batch_key(self, text: str) -> int:
        """`Serving` batches texts of one sequence bucket together."""
        return self.encoder.sequence_bucket(text)

    def is_item(self, value: Any) -> bool:
        return isinstance(value, str)

    def run_items(self, items: list, *, batch_size: int | None = None) -> list:
        if batch_size is not None:  # transformers' per-call batching; answers do not depend on it
            positive_int(batch_size, "batch_size")
        encodings = self.encoder.encode(items)
        results = []
        for encoding, logits in zip(encodings, self.encoder.run(encodings, "logits")):
            scores = softmax(logits)
            labels = id2label(self.encoder.repo.config, scores.shape[-1])
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
        return results
