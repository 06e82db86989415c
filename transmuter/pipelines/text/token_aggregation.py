"""token-classification's answers from its tokens' scores, as transformers'
TokenClassificationPipeline makes them: the tokens (special ones left out), aggregated by
`aggregation_strategy` into words and entity groups, the labels in `ignore_labels` dropped, and
the entities of a long text's overlapping windows (`stride`) merged into one list.

A `decode` function joins tokens (or words) into text as transformers'
`convert_tokens_to_string` does: the tokenizer's decoder on the token strings.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from transmuter.errors import InputError

STRATEGIES = ("none", "simple", "first", "average", "max")
# The strategies that join a word's tokens before grouping (transformers' aggregate_words).
WORD_STRATEGIES = ("first", "average", "max")

Decode = Callable[[Sequence[str]], str]


def aggregation_strategy(value: Any) -> str:
    """One of STRATEGIES, in any case (transformers looks the name up upper-cased in its
    AggregationStrategy)."""
    if isinstance(value, str) and value.lower() in STRATEGIES:
        return value.lower()
    raise InputError(f"aggregation_strategy must be one of {', '.join(STRATEGIES)}; got {value!r}")


def ignore_labels(value: Any) -> frozenset[str]:
    """The labels to leave out of the answer: a list of label names ([] keeps every one)."""
    if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(v, str) for v in value):
        return frozenset(value)
    raise InputError(f"ignore_labels must be a list of label names; got {value!r}")


def decoder(tokenizer: Any) -> Decode:
    """transformers' fast-tokenizer `convert_tokens_to_string`: the tokenizer's decoder on
    the token strings (WordPiece's joins "##" pieces), else the tokens joined by spaces."""
    if tokenizer.decoder is None:
        return " ".join
    return tokenizer.decoder.decode


def unknown_id(tokenizer_config: Mapping[str, Any], tokenizer: Any) -> int | None:
    """The id of the unknown token (tokenizer_config.json's unk_token, else the tokenizer
    model's), whose word transformers takes from the text instead."""
    token = tokenizer_config.get("unk_token")
    if isinstance(token, dict):
        token = token.get("content")
    token = token or getattr(tokenizer.model, "unk_token", None)
    return tokenizer.token_to_id(token) if isinstance(token, str) else None


def joined(words: Sequence[str], delimiter: str) -> tuple[str, list[int]]:
    """A pre-tokenized text as transformers rebuilds it: the words joined by `delimiter`, and
    where each word starts in it."""
    starts, at = [], 0
    for word in words:
        starts.append(at)
        at += len(word) + len(delimiter)
    return delimiter.join(words), starts


@dataclass(frozen=True)
class Token:
    """A token as transformers' gather_pre_entities keeps it: its index in the encoding, its
    word (the token string), its scores over the labels, its character span, and whether it
    continues the word of the token before it."""

    index: int
    word: str
    scores: np.ndarray
    start: int
    end: int
    is_subword: bool


def tokens(
    text: str,
    encoding: Any,
    scores: np.ndarray,
    tokenizer: Any,
    unknown: int | None,
    strategy: str,
    *,
    word_starts: Sequence[int] | None = None,
) -> list[Token]:
    """The encoding's tokens less its special ones, as transformers' gather_pre_entities.

    With a word-aware tokenizer (one whose model has a continuing_subword_prefix, such as
    WordPiece's "##"), a token is a subword where its string is not as long as the text it
    covers; otherwise transformers' fallback: a token is a subword where no space is next to
    its start (and it warns, as transformers does, that words are guessed). An unknown token's
    word is the text it covers, and it starts a word. With `word_starts` (a pre-tokenized
    text's, from `joined`), the encoding's offsets are within each word: shifted by where the
    token's word starts in `text`."""
    word_aware = bool(getattr(tokenizer.model, "continuing_subword_prefix", None))
    if not word_aware and strategy in WORD_STRATEGIES:
        warnings.warn(
            "the tokenizer marks no subwords: words are guessed as transformers does (a token "
            "with no space next to its start continues a word)",
            UserWarning,
            stacklevel=2,
        )
    found = []
    for index, (token, (start, end), special) in enumerate(
        zip(encoding.tokens, encoding.offsets, encoding.special_tokens_mask)
    ):
        if special:
            continue
        word_id = encoding.word_ids[index] if word_starts is not None else None
        if word_id is not None:
            start, end = start + word_starts[word_id], end + word_starts[word_id]
        covered = text[start:end]
        if encoding.ids[index] == unknown:
            word, is_subword = covered, False
        elif word_aware:
            word, is_subword = token, len(token) != len(covered)
        else:
            word, is_subword = token, start > 0 and " " not in text[start - 1 : start + 1]
        found.append(Token(index, word, scores[index], start, end, is_subword))
    return found


def entities(
    found: Sequence[Token], strategy: str, labels: Sequence[str], decode: Decode
) -> list[dict[str, Any]]:
    """transformers' aggregate: each token with its best label ("none"), those grouped
    ("simple"), or the tokens joined into words first ("first", "average", "max") and those
    grouped."""
    if strategy in WORD_STRATEGIES:
        labeled = words(found, strategy, labels, decode)
    else:
        labeled = [_labeled(token, labels) for token in found]
    return labeled if strategy == "none" else groups(labeled, decode)


def _labeled(token: Token, labels: Sequence[str]) -> dict[str, Any]:
    best = int(token.scores.argmax())
    return {
        "entity": labels[best],
        "score": float(token.scores[best]),
        "index": token.index,
        "word": token.word,
        "start": token.start,
        "end": token.end,
    }


def words(
    found: Sequence[Token], strategy: str, labels: Sequence[str], decode: Decode
) -> list[dict[str, Any]]:
    """The tokens joined into words (a token and the subwords after it), as transformers'
    aggregate_words: the word's label and score are the first token's best ("first"), the
    best of the token with the highest score ("max"), or the best of the tokens' mean scores
    ("average"); its word is its tokens decoded, its span from its first to its last token."""
    spans: list[list[Token]] = []
    for token in found:
        if token.is_subword and spans:
            spans[-1].append(token)
        else:
            spans.append([token])
    return [_word(span, strategy, labels, decode) for span in spans]


def _word(
    span: Sequence[Token], strategy: str, labels: Sequence[str], decode: Decode
) -> dict[str, Any]:
    if strategy == "first":
        scores = span[0].scores
    elif strategy == "max":
        scores = max(span, key=lambda token: token.scores.max()).scores
    else:
        scores = np.nanmean(np.stack([token.scores for token in span]), axis=0)
    best = int(scores.argmax())
    return {
        "entity": labels[best],
        "score": float(scores[best]),
        "word": decode([token.word for token in span]),
        "start": span[0].start,
        "end": span[-1].end,
    }


def groups(labeled: Sequence[dict[str, Any]], decode: Decode) -> list[dict[str, Any]]:
    """Adjacent entities of one type as one group, as transformers' group_entities: an entity
    joins the group before it where its type (its label less a "B-" or "I-" prefix) is that of
    the group's last entity and it is not tagged "B-". A group's entity_group is its first
    label after the first "-", its score the mean of its scores, its word its words decoded."""
    runs: list[list[dict[str, Any]]] = []
    for entity in labeled:
        bi, tag = _bio(entity["entity"])
        if runs and bi != "B" and tag == _bio(runs[-1][-1]["entity"])[1]:
            runs[-1].append(entity)
        else:
            runs.append([entity])
    return [
        {
            "entity_group": run[0]["entity"].split("-", 1)[-1],
            "score": float(np.nanmean([entity["score"] for entity in run])),
            "word": decode([entity["word"] for entity in run]),
            "start": run[0]["start"],
            "end": run[-1]["end"],
        }
        for run in runs
    ]


def _bio(label: str) -> tuple[str, str]:
    """transformers' get_tag: ("B" or "I", the type); a label without either prefix
    continues ("I")."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def kept(found: Sequence[dict[str, Any]], ignore: frozenset[str]) -> list[dict[str, Any]]:
    """The entities whose label (entity, or entity_group once grouped) is not in `ignore`."""
    return [
        entity
        for entity in found
        if entity.get("entity") not in ignore and entity.get("entity_group") not in ignore
    ]


def merge_windows(found: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One text's entities from its overlapping windows as one list, as transformers'
    aggregate_overlapping_entities: in order of their start; of an entity and the next that
    starts inside it, the longer is kept (the higher score where they are as long)."""
    merged: list[dict[str, Any]] = []
    for entity in sorted(found, key=lambda e: e["start"]):
        last = merged[-1] if merged else None
        if last is None or not last["start"] <= entity["start"] < last["end"]:
            merged.append(entity)
            continue
        length, last_length = entity["end"] - entity["start"], last["end"] - last["start"]
        if length > last_length or (length == last_length and entity["score"] > last["score"]):
            merged[-1] = entity
    return merged
