"""Beam search's host bookkeeping (generation/beams.py) on a model made in the test: each
prefix's next-token log-probabilities drawn from a generator seeded by the prefix. With as many
beams as there are sequences, and early_stopping="never" (transformers' exact bound for a
positive length_penalty), beam search is exhaustive: its best hypotheses must be the best of
every sequence that ends (at the end-of-sequence token or at max_new_tokens), scored as
transformers scores finished beams. The T5 and BART call forms of
tests/pipelines/differential/test_diff_generation.py check the device side against
transformers' own 4-beam answers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from transmuter.pipelines.generation.beams import BeamSearch, beam_loop

VOCAB, EOS, MAX_NEW = 4, 3, 3


def log_probs(prefix: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, *prefix, len(prefix)])
    logits = rng.normal(size=VOCAB).astype(np.float32) * 2
    return logits - np.log(np.exp(logits).sum(dtype=np.float32))


def run_search(seed: int, beams: int, count: int, length_penalty: float, early_stopping):
    """beam_loop with a numpy stand-in for the device's step (seq2seq._best_continuations)."""
    search = BeamSearch(1, beams, MAX_NEW, (EOS,), length_penalty, early_stopping)
    rows = [()] * beams

    def continuations(running):
        scores = np.stack([log_probs(r, seed) for r in rows]) + running.reshape(-1, 1)
        flat = scores.reshape(1, -1)
        top = np.argsort(-flat, axis=1, kind="stable")[:, : search.keep]
        return flat[:, top[0]], top // VOCAB, top % VOCAB

    def first(running):
        return continuations(running)

    def step(tokens, index, order, running):
        nonlocal rows
        rows = [rows[o] + (int(t),) for o, t in zip(order, tokens)]
        return continuations(running)

    return beam_loop(first, step, search, count)


def brute_force(seed: int, count: int, length_penalty: float) -> list[list[int]]:
    """Every sequence that ends, best first by sum of log-probabilities / length ** penalty."""
    ended = []
    for length in range(1, MAX_NEW + 1):
        for seq in itertools.product(range(VOCAB), repeat=length):
            if EOS in seq[:-1] or (length < MAX_NEW and seq[-1] != EOS):
                continue
            total = np.float32(0)
            for i, token in enumerate(seq):
                total += log_probs(seq[:i], seed)[token]
            ended.append((total / np.float32(length**length_penalty), list(seq)))
    ended.sort(key=lambda e: -e[0])
    return [seq for _, seq in ended[:count]]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("length_penalty", [1.0, 2.0])
def test_as_many_beams_as_sequences_find_the_best_ones(seed, length_penalty):
    beams = VOCAB**MAX_NEW
    got = run_search(seed, beams, 3, length_penalty, "never")
    assert got == brute_force(seed, 3, length_penalty)


def test_a_narrow_beam_keeps_its_best_finished_first_and_stops_at_eos():
    for seed in range(6):
        got = run_search(seed, 2, 2, 1.0, False)
        assert len(got) == 2
        for seq in got:  # each ends at the end-of-sequence token or at max_new_tokens
            assert 1 <= len(seq) <= MAX_NEW and EOS not in seq[:-1]
            assert seq[-1] == EOS or len(seq) == MAX_NEW


def test_early_stopping_true_ends_a_row_once_its_beams_have_finished():
    # The two best continuations end (EOS), the next two run on: with early_stopping=True the
    # row is full and the search ends; with "never" a running beam might still score better
    # over max_new_tokens (-0.3 / 5 > -0.2 / 1), so it goes on.
    scores = np.array([[-0.1, -0.2, -0.3, -0.4]], np.float32)
    beam, token = np.zeros((1, 4), np.int64), np.array([[EOS, EOS, 0, 1]])
    for early_stopping, done in ((True, True), ("never", False)):
        search = BeamSearch(1, 2, 5, (EOS,), 1.0, early_stopping)
        tokens, order = search.advance(scores, beam, token, 0)
        assert search.done == done
        assert search.best(2) == [[EOS], [EOS]]
        assert tokens.tolist() == [0, 1] and order.tolist() == [0, 0]
