"""Beam search as transformers' generate() runs it (greedy, not sampled), for the
encoder-decoders' "past" decoding (seq2seq.py).

Each input row keeps `num_beams` running beams, decoded as rows of one batch. At each step the
device returns, for each input row, the best `keep` continuations over all its beams (their
accumulated log-probabilities, which beam each extends and with which token): `keep` is twice
the beams (more with several end-of-sequence ids), so that enough of them stay unfinished. The
host (`BeamSearch.advance`) then does what transformers' vectorized beam search does with them:

- a continuation that ends (an end-of-sequence token, or the last token max_new_tokens allows)
  and ranks among the first `num_beams` joins the row's finished hypotheses, scored by its
  log-probability over its length to the power length_penalty; the best `num_beams` stay;
- the best `num_beams` unfinished continuations run on: the device reorders the past by the
  beam each extends (`order`) before the next step;
- the search ends when no running beam can still beat the worst finished one (transformers'
  heuristic: the best running score over the current length, or over the longest length when
  early_stopping="never" and length_penalty > 0), when every row has `num_beams` finished
  with early_stopping=True, or when every continuation ended.

The answer of each input row is its best `num_return_sequences` finished hypotheses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

# transformers' stand-in for minus infinity in beam scores (kept finite so that sums order).
_NEVER = np.float32(-1.0e9)


class BeamSearch:
    """The running and finished beams of `batch` input rows (host arrays; scores float32 as
    transformers keeps them)."""

    def __init__(
        self,
        batch: int,
        beams: int,
        max_new_tokens: int,
        eos: tuple[int, ...],
        length_penalty: float,
        early_stopping: bool | str,
    ):
        self.batch, self.beams, self.max_new = batch, beams, max_new_tokens
        self.eos, self.length_penalty, self.early_stopping = eos, length_penalty, early_stopping
        self.keep = max(2, 1 + len(eos)) * beams
        shape = (batch, beams, max_new_tokens)
        self.running = np.full(shape, -1, np.int64)  # each beam's new tokens (-1: none yet)
        self.running_scores = np.zeros((batch, beams), np.float32)
        self.running_scores[:, 1:] = _NEVER  # the beams start equal: only the first counts
        self.finished = np.full(shape, -1, np.int64)
        self.finished_scores = np.full((batch, beams), _NEVER, np.float32)
        self.is_finished = np.zeros((batch, beams), bool)
        self.improvable = np.ones((batch, 1), bool)
        self.done = False

    def advance(
        self, scores: np.ndarray, beam: np.ndarray, token: np.ndarray, index: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Take step `index`'s best continuations ([batch, keep] each: accumulated scores, the
        beam extended, the token); return the next step's tokens and the flat row each running
        beam continues ([batch * beams] each)."""
        rows = np.arange(self.batch)[:, None]
        candidates = self.running[rows, beam]
        candidates[:, :, index] = token
        length = index + 1
        ended = np.isin(token, self.eos) | (length >= self.max_new)
        # The best unfinished continuations run on.
        running = scores + ended * _NEVER
        best = _top(running, self.beams)
        self.running = candidates[rows, best]
        self.running_scores = running[rows, best]
        order = (rows * self.beams + beam[rows, best]).reshape(-1)
        # The ended ones among the first `beams` join the finished, if good enough.
        joined = ended & (np.arange(self.keep) < self.beams)
        final = scores / np.float32(length**self.length_penalty)
        if self.early_stopping is True:
            final = final + np.all(self.is_finished, axis=1, keepdims=True) * _NEVER
        final = final + ~self.improvable * _NEVER + ~joined * _NEVER
        merged_scores = np.concatenate([self.finished_scores, final], axis=1)
        kept = _top(merged_scores, self.beams)
        self.finished = np.concatenate([self.finished, candidates], axis=1)[rows, kept]
        self.finished_scores = merged_scores[rows, kept]
        self.is_finished = np.concatenate([self.is_finished, joined], axis=1)[rows, kept]
        self._check_done(length, ended)
        return self.running[:, :, index].reshape(-1), order

    def _check_done(self, length: int, ended: np.ndarray) -> None:
        if self.early_stopping == "never" and self.length_penalty > 0:
            best_length = self.max_new
        else:
            best_length = length
        best_running = self.running_scores[:, :1] / np.float32(best_length**self.length_penalty)
        worst = np.where(self.is_finished, self.finished_scores.min(axis=1, keepdims=True), _NEVER)
        self.improvable &= np.any(best_running > worst, axis=1, keepdims=True)
        all_full = np.all(self.is_finished) and self.early_stopping is True
        self.done = not self.improvable.any() or all_full or bool(np.all(ended))

    def best(self, count: int) -> list[list[int]]:
        """Each input row's best `count` finished hypotheses (new tokens, through the end of
        sequence token where one ended them), row after row."""
        return [
            [t for t in self.finished[row, rank].tolist() if t >= 0]
            for row in range(self.batch)
            for rank in range(count)
        ]


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """The indices of each row's `k` largest scores, best first (ties: the lower index, as
    lax.top_k orders them)."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def beam_loop(
    first: Callable[[np.ndarray], Any],
    step: Callable[[np.ndarray, int, np.ndarray, np.ndarray], Any],
    search: BeamSearch,
    count: int,
) -> list[list[int]]:
    """The host loop of a beam search: `first(running_scores)` and `step(tokens, index, order,
    running_scores)` return a step's best continuations (scores, beam, token), on the device;
    the answer is each input row's best `count` hypotheses."""
    found = first(search.running_scores)
    for index in range(search.max_new):
        tokens, order = search.advance(*map(np.asarray, found), index)
        if search.done:
            break
        found = step(tokens, index + 1, order, search.running_scores)
    return search.best(count)
