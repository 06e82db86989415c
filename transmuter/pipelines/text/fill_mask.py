"""The fill-mask task (BERT-style masked language models: Optimum's model.onnx, input_ids /
attention_mask / token_type_ids -> logits [batch, sequence, vocabulary]), as transformers'
pipeline: the `top_k` most likely tokens for each mask token, optionally among `targets`.

Texts run through encoders.py's `Encoder`: batched, the batch padded to a power of two and the
sequence to a multiple of 16 (the bucketed dims), so a few programs serve every text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.base import Task, positive_int, softmax
from transmuter.pipelines.base import top_k as top_k_option
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.text.encoders import Encoder, tokenizer_options

# The mask tokens of the BERT and RoBERTa families, where tokenizer_config.json names none.
_MASK_TOKENS = ("[MASK]", "<mask>")


class FillMask(Task):
    """Text(s) with mask tokens -> for each mask the `top_k` (default 5) tokens as
    [{"score", "token", "token_str", "sequence"}], scores softmaxed over the vocabulary (then
    kept to `targets`' tokens where given: a target that is no token of the vocabulary stands
    for its first token, as in transformers). One mask gives that list, several a list per
    mask (their sequences keep the special tokens and the other masks, as transformers
    decodes them). `top_k` and `targets` are options here and per call."""

    def __init__(
        self,
        repo: Repo,
        *,
        top_k: int = 5,
        targets: str | Sequence[str] | None = None,
        batch_size: int = 8,
    ):
        self.encoder = Encoder(repo, "fill-mask", batch_size)
        self.batch_size = self.encoder.batch_size
        self.tokenizer = self.encoder.tokenizer
        self.mask_id = _mask_id(repo, self.tokenizer)
        self.clean_up = _cleans_up(repo, self.tokenizer)
        self.top_k = top_k_option(top_k)
        self.target_ids = None if targets is None else self._target_ids(targets)

    def batch_key(self, text: str) -> int:
        """`Serving` batches texts of one sequence bucket together."""
        return self.encoder.sequence_bucket(text)

    def __call__(self, inputs: Any, **options: Any) -> Any:
        results = super().__call__(inputs, **options)
        # transformers answers a list of one text as it answers the text.
        return results[0] if isinstance(inputs, list) and len(inputs) == 1 else results

    def is_item(self, value: Any) -> bool:
        return isinstance(value, str)

    def run_items(
        self,
        items: list,
        *,
        top_k: int | None = None,
        targets: str | Sequence[str] | None = None,
        batch_size: int | None = None,
        tokenizer_kwargs: Mapping[str, Any] | None = None,
    ) -> list:
        if batch_size is not None:  # transformers' per-call batching; answers do not depend on it
            positive_int(batch_size, "batch_size")
        options = tokenizer_options(tokenizer_kwargs, "tokenizer_kwargs")
        top_k = self.top_k if top_k is None else top_k_option(top_k)
        target_ids = self.target_ids if targets is None else self._target_ids(targets)
        encodings = self.encoder.encode(items, options)
        masks = []
        for text, encoding in zip(items, encodings):
            found = np.flatnonzero(np.asarray(encoding.ids) == self.mask_id)
            if not found.size:
                raise InputError(
                    f"fill-mask needs a mask token ({self.tokenizer.id_to_token(self.mask_id)}) "
                    f"in each text; {text!r} has none"
                )
            masks.append(found)
        logits = self.encoder.run(encodings, "logits")
        return [
            self._fill(np.asarray(encoding.ids), where, rows, top_k, target_ids)
            for encoding, where, rows in zip(encodings, masks, logits)
        ]

    def _fill(
        self,
        ids: np.ndarray,
        masks: np.ndarray,
        logits: np.ndarray,
        top_k: int,
        target_ids: np.ndarray | None,
    ) -> list:
        probs = softmax(logits[masks].astype(np.float32))
        if target_ids is not None:
            probs = probs[:, target_ids]
        single = len(masks) == 1
        per_mask = []
        for position, row in zip(masks, probs):
            ranked = []
            for choice in np.argsort(-row, kind="stable")[:top_k]:
                token = int(choice if target_ids is None else target_ids[choice])
                filled = ids.copy()
                filled[position] = token
                ranked.append(
                    {
                        "score": float(row[choice]),
                        "token": token,
                        "token_str": self._decode([token], skip_special_tokens=False),
                        "sequence": self._decode(
                            filled[filled != self.encoder.pad_id], skip_special_tokens=single
                        ),
                    }
                )
            per_mask.append(ranked)
        return per_mask[0] if single else per_mask

    def _decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        text = self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        return _clean_up(text) if self.clean_up else text

    def _target_ids(self, targets: str | Sequence[str]) -> np.ndarray:
        """The vocabulary ids of `targets`, each once (a target outside the vocabulary stands
        for the first token it encodes to; one that encodes to nothing is dropped)."""
        if isinstance(targets, str):
            targets = [targets]
        if not isinstance(targets, Sequence) or not all(isinstance(t, str) for t in targets):
            raise InputError(f"targets must be a string or a list of strings; got {targets!r}")
        vocab = self.tokenizer.get_vocab()
        ids = set()
        for target in targets:
            found = vocab.get(target)
            if found is None:
                encoded = self.tokenizer.encode(target, add_special_tokens=False).ids
                found = encoded[0] if encoded else None
            if found is not None:
                ids.add(found)
        if not ids:
            raise InputError(f"none of the targets {list(targets)} is in the vocabulary")
        return np.array(sorted(ids))


def _mask_id(repo: Repo, tokenizer: Any) -> int:
    """The mask token's id: tokenizer_config.json's mask_token, else [MASK] or <mask>."""
    named = repo.tokenizer_config.get("mask_token")
    if isinstance(named, dict):  # older files spell special tokens as AddedToken dicts
        named = named.get("content")
    for token in (named,) if named else _MASK_TOKENS:
        found = tokenizer.token_to_id(token)
        if found is not None:
            return found
    raise ModelLoadError(
        f"{repo.source}: fill-mask needs a mask token; tokenizer.json has none of "
        f"{[named] if named else list(_MASK_TOKENS)}"
    )


def _cleans_up(repo: Repo, tokenizer: Any) -> bool:
    """Whether decoded text gets transformers' clean-up of spaces before punctuation: as
    tokenizer_config.json says (transformers' default: no), and never for BPE vocabularies,
    where transformers skips it because it would remove real spaces."""
    wanted = bool(repo.tokenizer_config.get("clean_up_tokenization_spaces", False))
    return wanted and type(tokenizer.model).__name__ != "BPE"


# transformers' clean_up_tokenization: the spaces WordPiece decoding puts before punctuation
# and English contractions.
_CLEAN_UPS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


def _clean_up(text: str) -> str:
    for spaced, joined in _CLEAN_UPS:
        text = text.replace(spaced, joined)
    return text
