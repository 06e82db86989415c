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
from transmuter.pipelines.text import token_aggregation as aggregation

_TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class _Unset:
    """The default of an option whose absence changes the answer's shape."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()


# transformers' per-call tokenizer keywords (tokenizer_kwargs, tokenize_kwargs, or keywords of
# the call) that an encoder task takes.
TOKENIZER_OPTIONS = ("truncation", "max_length", "padding")
# Paddings (besides True and False) that leave each text as it is: every text here runs at its
# own length, its padding in a batch masked and cut off ("max_length" would add tokens).
_PADDINGS = ("longest", "do_not_pad")


def tokenizer_options(given: Any, name: str) -> dict[str, Any]:
    """A call's tokenizer keywords, checked: truncation (a bool), max_length (a positive
    integer, cut at as transformers' tokenizers cut: see `_truncates`) and padding."""
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise InputError(f"{name} must be a dict of tokenizer keywords; got {given!r}")
    unknown = sorted(set(given) - set(TOKENIZER_OPTIONS))
    if unknown:
        raise InputError(f"{name} takes {list(TOKENIZER_OPTIONS)}; got {unknown}")
    options = dict(given)
    if "truncation" in options and not isinstance(options["truncation"], bool):
        raise InputError(f"truncation must be True or False; got {options['truncation']!r}")
    if options.get("max_length") is not None:
        options["max_length"] = positive_int(options["max_length"], "max_length")
    padding = options.get("padding", False)
    if not (isinstance(padding, bool) or padding in _PADDINGS):
        raise InputError(
            "padding must be True, False, 'longest' or 'do_not_pad' (each text runs at its "
            f"own length; 'max_length' padding is not supported); got {padding!r}"
        )
    return options


def _truncates(options: Mapping[str, Any]) -> bool:
    """Whether a call's tokenizer keywords cut at their max_length: truncation=True, or, as
    transformers' tokenizers default it, a max_length given with neither truncation nor
    padding."""
    if "truncation" in options:
        return options["truncation"]
    return options.get("max_length") is not None and not options.get("padding", False)


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
        self._truncating_at: dict[int, Any] = {}
        self._compiled = None

    def encode(
        self,
        texts: Sequence[Any],
        options: Mapping[str, Any] | None = None,
        *,
        pretokenized: bool = False,
    ) -> list[Any]:
        """Each text's tokenizer encoding (truncated to the model's positions); a pair
        {"text", "text_pair"} (a cross-encoder's query and passage, as transformers'
        text-classification takes them) encodes as the tokenizer's pair template; with
        `pretokenized`, each text is a list of words, each tokenized alone (the encoding's
        offsets are then within its word, word_ids its word's index). `options`
        are a call's tokenizer keywords (`tokenizer_options`): truncation=True with a
        max_length cuts there (keeping the special tokens); truncation=False refuses a text
        past the model's positions, which transformers' model would fail on."""
        options = options or {}
        tokenizer = self.tokenizer
        if _truncates(options) and options.get("max_length"):
            tokenizer = self._truncating(options["max_length"])
        encodings = tokenizer.encode_batch(
            [_words(t) if pretokenized else _text_or_pair(t, self.pairs) for t in texts],
            is_pretokenized=pretokenized,
        )
        if options.get("truncation") is False:
            for text, encoding in zip(texts, encodings):
                if encoding.overflowing:
                    raise InputError(
                        f"truncation=False, and {text!r} has more tokens than the model's "
                        f"{self.limit} positions"
                    )
        return encodings

    def _truncating(self, length: int) -> Any:
        """A copy of the tokenizer that cuts at `length` tokens (at most the model's)."""
        if length not in self._truncating_at:
            tokenizer = type(self.tokenizer).from_str(self.tokenizer.to_str())
            tokenizer.enable_truncation(min(length, self.limit or length))
            self._truncating_at[length] = tokenizer
        return self._truncating_at[length]

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


def _words(item: Any) -> list[str]:
    """A pre-tokenized text: a list of words (transformers' is_split_into_words)."""
    if isinstance(item, (list, tuple)) and item and all(isinstance(w, str) for w in item):
        return list(item)
    raise InputError(
        f"with is_split_into_words=True each input must be a non-empty list of words; got {item!r}"
    )


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
    """Text -> embeddings: per token (`pooling="none"`: an array [1, tokens, hidden] per text,
    transformers' answer with its batch of one kept) or pooled (`"mean"` over the real tokens,
    `"cls"` the first token: an array [texts, hidden], [hidden] for one text), L2-normalized
    with `normalize=True`."""

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

    def run_items(
        self,
        items: list,
        *,
        truncation: bool | None = None,
        tokenize_kwargs: Mapping[str, Any] | None = None,
        return_tensors: bool | None = None,
        batch_size: int | None = None,
    ) -> list:
        """transformers' per-call options: tokenize_kwargs, truncation (not both ways),
        return_tensors (arrays either way here) and batch_size (answers do not depend on it)."""
        options = tokenizer_options(tokenize_kwargs, "tokenize_kwargs")
        if truncation is not None:
            if "truncation" in options:
                raise InputError("truncation given twice: as an option and in tokenize_kwargs")
            options = tokenizer_options({**options, "truncation": truncation}, "truncation")
        if return_tensors is not None and not isinstance(return_tensors, bool):
            raise InputError(f"return_tensors must be True or False; got {return_tensors!r}")
        if batch_size is not None:
            positive_int(batch_size, "batch_size")
        hidden = self.encoder.run(self.encoder.encode(items, options), self.output)
        if self.pooling != "none":
            hidden = [h.mean(0) if self.pooling == "mean" else h[0] for h in hidden]
        hidden = [_normalized(h) if self.normalize else h for h in hidden]
        return hidden if self.pooling != "none" else [h[None] for h in hidden]


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
        truncation: bool | None = None,
        max_length: int | None = None,
        padding: Any = None,
    ) -> list:
        given = {"truncation": truncation, "max_length": max_length, "padding": padding}
        options = tokenizer_options({k: v for k, v in given.items() if v is not None}, "options")
        if batch_size is not None:  # transformers' per-call batching; answers do not depend on it
            positive_int(batch_size, "batch_size")
        if top_k is UNSET:
            top_k = self.defaults["top_k"]
        else:
            top_k = top_k_option(top_k, none=True)
        function = self.defaults["function_to_apply"]
        if function_to_apply is not None:
            function = choice(function_to_apply, "function_to_apply", SCORES)
        logits = self.encoder.run(self.encoder.encode(items, options), "logits")
        results = []
        for row in logits:
            scores = SCORES[function](row)
            best = ranked(scores, id2label(self.encoder.repo.config, len(scores)), None)
            results.append(best[0] if top_k is UNSET else best[:top_k])
        return results


class TokenClassification(Task):
    """Text -> its entities, as transformers' token-classification (token_aggregation.py
    follows its postprocessing). With `aggregation_strategy="none"` one dict per token (special
    tokens left out): entity, score (softmax), index (in the tokenized text), word (the token),
    start and end (character offsets); "simple" groups adjacent tokens of one entity type, and
    "first", "average" and "max" join a word's tokens first, into dicts of entity_group, score,
    word, start and end. Entities labeled in `ignore_labels` are left out. With a `stride`, a
    text past the model's positions runs in windows overlapping by `stride` tokens, their
    entities merged. The three are options here and per call.

    Per call, `is_split_into_words=True` takes pre-tokenized texts: a list of words is one
    text, a list of such lists several (transformers answers both with a list of answers).
    Each word is tokenized alone; start and end are offsets into the words joined by
    `delimiter` (" "), the text transformers slices for the entities."""

    def __init__(
        self,
        repo: Repo,
        *,
        ignore_labels: Sequence[str] = ("O",),
        aggregation_strategy: str | None = None,
        stride: int | None = None,
        batch_size: int = 8,
    ):
        self.encoder = Encoder(repo, "token-classification", batch_size)
        self.batch_size = self.encoder.batch_size
        self.ignore = aggregation.ignore_labels(ignore_labels)
        self.strategy = aggregation.aggregation_strategy(
            "none" if aggregation_strategy is None else aggregation_strategy
        )
        self.stride = self._stride(stride, aggregation_strategy)
        self.decode = aggregation.decoder(self.encoder.tokenizer)
        self.unknown = aggregation.unknown_id(repo.tokenizer_config, self.encoder.tokenizer)
        self._windows: dict[int, Any] = {}  # a tokenizer cutting windows, by stride

    def batch_key(self, text: str) -> int:
        """`Serving` batches texts of one sequence bucket together."""
        return self.encoder.sequence_bucket(text)

    def is_item(self, value: Any) -> bool:
        return isinstance(value, str)

    def __call__(self, inputs: Any, **options: Any) -> Any:
        # transformers takes a list of words (not of lists) as one pre-tokenized text, and
        # answers it as a list of one answer.
        if (
            options.get("is_split_into_words") is True
            and isinstance(inputs, (list, tuple))
            and not all(isinstance(item, (list, tuple)) for item in inputs)
        ):
            inputs = [inputs]
        return super().__call__(inputs, **options)

    def run_items(
        self,
        items: list,
        *,
        aggregation_strategy: str | None = None,
        ignore_labels: Sequence[str] | None = None,
        stride: int | None = None,
        batch_size: int | None = None,
        is_split_into_words: bool = False,
        delimiter: str | None = None,
    ) -> list:
        if not isinstance(is_split_into_words, (bool, np.bool_)):
            raise InputError(
                f"is_split_into_words must be True or False; got {is_split_into_words!r}"
            )
        if delimiter is not None and not (is_split_into_words and isinstance(delimiter, str)):
            raise InputError(
                "delimiter (the string between words) is a string, given with "
                f"is_split_into_words=True; got delimiter={delimiter!r}"
            )
        if batch_size is not None:  # transformers' per-call batching; answers do not depend on it
            positive_int(batch_size, "batch_size")
        strategy = self.strategy
        if aggregation_strategy is not None:
            strategy = aggregation.aggregation_strategy(aggregation_strategy)
        ignore = self.ignore if ignore_labels is None else aggregation.ignore_labels(ignore_labels)
        stride = self.stride if stride is None else self._stride(stride, aggregation_strategy)
        windows = self._windows_of(items, stride, bool(is_split_into_words))
        logits = iter(self.encoder.run([w for text in windows for w in text], "logits"))
        results = []
        for item, encodings in zip(items, windows):
            text, word_starts = item, None
            if is_split_into_words:
                text, word_starts = aggregation.joined(
                    item, " " if delimiter is None else delimiter
                )
            found = []
            for encoding in encodings:
                scores = softmax(next(logits))
                labels = id2label(self.encoder.repo.config, scores.shape[-1])
                tokens = aggregation.tokens(
                    text,
                    encoding,
                    scores,
                    self.encoder.tokenizer,
                    self.unknown,
                    strategy,
                    word_starts=word_starts,
                )
                found += aggregation.kept(
                    aggregation.entities(tokens, strategy, labels, self.decode), ignore
                )
            results.append(aggregation.merge_windows(found) if len(encodings) > 1 else found)
        return results

    def _windows_of(self, texts: list, stride: int | None, words: bool) -> list[list[Any]]:
        """Each text's encoding, alone; with a stride, each text's windows (transformers'
        overflowing tokens), by a copy of the tokenizer that cuts them. `words`: the texts
        are lists of words."""
        if stride is None or not self.encoder.limit:
            return [[e] for e in self.encoder.encode(texts, pretokenized=words)]
        tokenizer = self._windows.get(stride)
        if tokenizer is None:
            tokenizer = self.encoder.repo.require_tokenizer("token-classification")
            tokenizer.enable_truncation(self.encoder.limit, stride=stride)
            self._windows[stride] = tokenizer
        encodings = tokenizer.encode_batch(
            [_words(t) if words else _text_or_pair(t, False) for t in texts],
            is_pretokenized=words,
        )
        return [[encoding, *encoding.overflowing] for encoding in encodings]

    def _stride(self, stride: Any, strategy: str | None) -> int | None:
        """A stride shorter than a window's text tokens (the model's positions less the
        special tokens); transformers refuses one given with aggregation_strategy "none"."""
        if stride is None:
            return None
        if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or stride < 0:
            raise InputError(f"stride must be an integer of at least 0; got {stride!r}")
        limit, processor = self.encoder.limit, self.encoder.tokenizer.post_processor
        room = limit
        if limit and processor:
            room = limit - processor.num_special_tokens_to_add(False)
        if room is not None and stride >= room:
            raise InputError(
                f"stride must be less than the {room} text tokens of a window (the model's "
                f"{limit} positions less the special tokens); got {stride}"
            )
        if isinstance(strategy, str) and strategy.lower() == "none":
            raise InputError('stride needs an aggregation_strategy other than "none"')
        return int(stride)
