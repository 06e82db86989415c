"""The one token chooser and the one decode loop, shared by every decoding (decoder.py's
decoder-only models, seq2seq.py's encoder-decoders: T5, BART, Whisper, VisionEncoderDecoder,
Florence-2).

Token choice follows transformers' logits processors, in their order: repetition penalty, no
end of sequence before the minimum length, suppressed tokens, then greedy, or temperature,
top-k and top-p before sampling; a forced first or last token overrides the choice. What varies
per request (temperature, top_k, top_p, the penalty, the minimum length, greedy or sampled) is
an array with a value per row (`Sampling`), so a new value compiles nothing; what decides a
program's structure (which ids end a sequence or are suppressed or forced: `Rules`) is static.

A decoding whose steps compile per step (a past that grows a token a step) chooses in a
program of its own, `shared_program(choose, "rules")`, compiled once per (rows, vocabulary,
rules) for the process rather than inside each step (seq2seq.py says what it saves).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import transmuter


class Sampling(NamedTuple):
    """Each row's token choice, as arrays [batch] (traced: a new value compiles nothing).
    temperature 0 is greedy; top_k 0 and top_p 1 keep every token; penalty 1 is none."""

    temperature: Any
    top_k: Any
    top_p: Any
    penalty: Any
    min_new: Any


@dataclass(frozen=True)
class Rules:
    """The token ids a program treats specially: static, part of the program's cache key."""

    eos: tuple[int, ...] = ()
    suppress: tuple[int, ...] = ()  # never chosen (generation_config's suppress_tokens)
    begin_suppress: tuple[int, ...] = ()  # not chosen as the first new token
    forced_bos: int | None = None  # the first new token
    forced_eos: tuple[int, ...] = ()  # the last new token (at max_new_tokens)


@dataclass(frozen=True)
class Settings:
    """A generation's token choice, as the pipelines build it from their options: its
    `rules` (static) and its `sampling(batch)` arrays (one value per row)."""

    sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    eos: tuple[int, ...] = ()
    min_new_tokens: int = 0  # no end of sequence before this many new tokens
    suppress: tuple[int, ...] = ()
    begin_suppress: tuple[int, ...] = ()
    forced_bos: int | None = None
    forced_eos: tuple[int, ...] = ()
    # Beam search (beams.py), greedy only: the beams kept, the answers returned of each row,
    # and how finished beams are scored and when the search ends, as transformers' are.
    num_beams: int = 1
    num_return_sequences: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False

    @property
    def rules(self) -> Rules:
        return Rules(self.eos, self.suppress, self.begin_suppress, self.forced_bos, self.forced_eos)

    def sampling(self, batch: int) -> Sampling:
        def rows(value, dtype):
            return np.full((batch,), value, dtype)

        return Sampling(
            temperature=rows(self.temperature if self.sample else 0.0, np.float32),
            top_k=rows(self.top_k if self.sample else 0, np.int32),
            top_p=rows(self.top_p if self.sample else 1.0, np.float32),
            penalty=rows(self.repetition_penalty, np.float32),
            min_new=rows(self.min_new_tokens, np.int32),
        )

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1.0


def choose(logits, seen, step, keys, sampling: Sampling, rules: Rules, last=False):
    """(Traced.) The next token of each row from its last logits [batch, vocabulary]: `seen`
    marks the tokens each row holds ([batch, 0] where no row has a repetition penalty),
    `step` is the index of the new token (a scalar or one per row), `keys` one PRNG key per
    row, folded with the step before drawing; `last` (traced) where the token is the last."""
    logits = logits.astype(jnp.float32)
    step = jnp.broadcast_to(jnp.asarray(step, jnp.int32), logits.shape[:1])
    logits = _processed(logits, seen, step, sampling, rules)
    greedy = jnp.argmax(logits, axis=-1)
    temperature = sampling.temperature
    # The sort, softmax and draws cost more than a tiny model's step: only when a row samples.
    token = jax.lax.cond(
        jnp.any(temperature > 0),
        lambda: _sampled(logits, greedy, step, keys, sampling),
        lambda: greedy,
    )
    if rules.forced_bos is not None:
        token = jnp.where(step == 0, rules.forced_bos, token)
    if rules.forced_eos:
        token = jnp.where(last, min(rules.forced_eos), token)
    return token


def beam_scores(logits, seen, step, sampling: Sampling, rules: Rules, last=False):
    """(Traced.) Each row's log-probabilities of the next token [batch, vocabulary] after the
    same processors as `choose`, in transformers' beam search order: log-softmax first, then
    the processors on the log-probabilities; a forced token scores 0 and every other -inf."""
    scores = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    step = jnp.broadcast_to(jnp.asarray(step, jnp.int32), scores.shape[:1])
    scores = _processed(scores, seen, step, sampling, rules)
    vocab = jnp.arange(scores.shape[-1])
    if rules.forced_bos is not None:
        forced = jnp.where(vocab == rules.forced_bos, 0.0, -jnp.inf)
        scores = jnp.where((step == 0)[:, None], forced, scores)
    if rules.forced_eos:
        forced = jnp.where(jnp.isin(vocab, jnp.asarray(rules.forced_eos)), 0.0, -jnp.inf)
        scores = jnp.where(last, forced, scores)
    return scores


def _processed(logits, seen, step, sampling: Sampling, rules: Rules):
    """`logits` after the repetition penalty, the minimum length and the suppressed tokens."""
    vocab = logits.shape[-1]
    if seen.shape[-1]:
        factor = sampling.penalty[:, None]
        penalized = jnp.where(logits < 0, logits * factor, logits / factor)
        logits = jnp.where(seen, penalized, logits)
    if rules.eos:
        blocked = jnp.zeros(vocab, bool).at[jnp.asarray(rules.eos)].set(True)
        logits = jnp.where((step < sampling.min_new)[:, None] & blocked, -jnp.inf, logits)
    if rules.suppress:
        logits = logits.at[:, jnp.asarray(rules.suppress)].set(-jnp.inf)
    if rules.begin_suppress:
        begin = jnp.zeros(vocab, bool).at[jnp.asarray(rules.begin_suppress)].set(True)
        logits = jnp.where((step == 0)[:, None] & begin, -jnp.inf, logits)
    return logits


def _sampled(logits, greedy, step, keys, sampling: Sampling):
    """Each sampling row's draw after its temperature, top-k and top-p; greedy rows' `greedy`.
    A row's k is data, not a static size: the k-th largest is read from the sorted row that
    top-p sorts anyway (ties with it stay, as with transformers' torch.topk threshold)."""
    temperature, top_k, top_p = sampling.temperature, sampling.top_k, sampling.top_p
    scaled = logits / jnp.where(temperature > 0, temperature, 1.0)[:, None]
    ordered = jnp.sort(scaled, axis=-1)[:, ::-1]
    k = jnp.clip(top_k, 1, logits.shape[-1])[:, None]
    kth = jnp.where(top_k[:, None] > 0, jnp.take_along_axis(ordered, k - 1, axis=-1), -jnp.inf)
    scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
    ordered = jnp.where(ordered < kth, -jnp.inf, ordered)
    probs = jax.nn.softmax(ordered, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # keep the fewest reaching top_p, at least one
    cutoff = jnp.min(jnp.where(before < top_p[:, None], ordered, jnp.inf), axis=-1)
    scaled = jnp.where((top_p[:, None] < 1.0) & (scaled < cutoff[:, None]), -jnp.inf, scaled)
    draw = jax.vmap(lambda key, s, row: jax.random.categorical(jax.random.fold_in(key, s), row))
    return jnp.where(temperature > 0, draw(keys, step, scaled), greedy)


@functools.cache
def shared_program(fun: Callable, *static: str) -> Callable:
    """`transmuter.jit(fun)` with the keyword arguments `static` static, one for the process
    (its compiled programs shared by every decoder and pipeline), made on first use so that
    importing touches no JAX backend."""
    return transmuter.jit(fun, static_argnames=static)


def row_keys(key: Any, batch: int):
    """One PRNG key per row from a generation's key."""
    return jax.random.split(key, batch)


def seen_tokens(ids: np.ndarray, settings: Settings, vocab: Callable[[], int]):
    """Which tokens each row holds, for the repetition penalty (the pads too, as transformers
    counts them); [batch, 0] when there is no penalty."""
    if not settings.penalized:
        return jnp.zeros((ids.shape[0], 0), bool)
    seen = np.zeros((ids.shape[0], vocab()), bool)
    np.put_along_axis(seen, ids, True, axis=1)
    return jnp.asarray(seen)


def mark_seen(seen, token):
    if seen.shape[1] == 0:
        return seen
    return seen.at[jnp.arange(seen.shape[0]), token].set(True)


class Tracker:
    """The tokens each row has made, and which rows are done (end of sequence or stopped)."""

    def __init__(self, batch, max_new, eos, on_token):
        self.rows: list[list[int]] = [[] for _ in range(batch)]
        self.done = [False] * batch
        self.max_new, self.eos, self.on_token = max_new, set(eos), on_token

    def take(self, tokens: np.ndarray) -> bool:
        """Record one step's tokens; True when every row is done."""
        for row, token in enumerate(tokens.tolist()):
            if self.done[row]:
                continue
            self.rows[row].append(token)
            stopped = self.on_token is not None and self.on_token(row, token)
            if token in self.eos or stopped or len(self.rows[row]) >= self.max_new:
                self.done[row] = True
        return all(self.done)


def decode_loop(
    first: Callable[[], Any],
    step: Callable[[Any, int], Any],
    *,
    batch: int,
    max_new_tokens: int,
    eos: tuple[int, ...],
    on_token: Callable[[int, int], bool] | None = None,
) -> list[list[int]]:
    """The host loop of every decoding: `first()` returns the first new tokens [batch] (on the
    device), `step(tokens, index)` the tokens at `index` after `tokens`; each row ends at an
    end-of-sequence token, when `on_token(row, token)` returns True, or at max_new_tokens."""
    tracker = Tracker(batch, max_new_tokens, eos, on_token)
    token = first()
    for index in range(1, max_new_tokens + 1):
        if tracker.take(np.asarray(token)) or index == max_new_tokens:
            break
        token = step(token, index)
    return tracker.rows
