"""Decoding with a decoder-only export's past key values, in a few compiled programs.

The past lives on the device in a buffer of a bucketed length `L` with its attention mask. The
prompt (left-padded to a bucket, positions from the mask) runs once with an empty past, and its
keys and values are written to the start of the buffer: one program per (batch, prompt bucket,
L). Each later step runs the model on one token with the whole buffer as its past (the unused
slots masked), then writes the token's key and value into its slot: one program per (batch, L).
The order of the slots does not matter to attention, only the mask and the explicit position
ids do. Logits never leave the device: the step chooses the next token (greedy or sampled, with
the repetition penalty and the minimum length) and returns only it.

An export without `position_ids` computes positions from the past's length, which the buffer
would give wrongly; it runs each prompt alone at exact shapes instead (a program per token).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.shapes import pow2

# Prompt lengths and buffer lengths are padded to powers of two, at least these.
MIN_PROMPT_BUCKET = 8
MIN_PAST_BUCKET = 64
_KNOWN_INPUTS = {"input_ids", "attention_mask", "position_ids", "use_cache_branch"}


@dataclass(frozen=True)
class Settings:
    """What chooses a token; part of each program's cache key (it decides the program)."""

    sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    eos: tuple[int, ...] = ()
    min_new_tokens: int = 0  # no end of sequence before this many new tokens
    suppress: tuple[int, ...] = ()  # never chosen (generation_config's suppress_tokens)
    begin_suppress: tuple[int, ...] = ()  # not chosen as the first new token
    forced_bos: int | None = None  # the first new token
    forced_eos: tuple[int, ...] = ()  # the last new token (at max_new_tokens)


class Decoder:
    """A decoder-only ONNX model with past key values, run as compiled prefill and decode steps.
    `programs` counts the programs traced so far (each one compile)."""

    def __init__(self, model: transmuter.Model, *, merged: bool):
        self.model = model
        self.merged = merged
        self.pasts = [n for n in model.inputs if n.startswith("past_key_values.")]
        if not self.pasts:
            raise ModelLoadError(
                f"{model.source} takes no past_key_values.*: text generation needs a decoder "
                "exported with past key values (Optimum's decoder_with_past_model.onnx, "
                "decoder_model_merged.onnx, or model.onnx with past inputs)"
            )
        unknown = [n for n in model.inputs if n not in _KNOWN_INPUTS and n not in self.pasts]
        if unknown or "input_ids" not in model.inputs:
            raise ModelLoadError(
                f"{model.source}: text generation knows the inputs input_ids, attention_mask, "
                f"position_ids, use_cache_branch and past_key_values.*; this model takes "
                f"{model.inputs}"
            )
        self.presents = {p: _present_name(p, model.outputs) for p in self.pasts}
        self.positions = "position_ids" in model.inputs
        self.masked = "attention_mask" in model.inputs
        self.past_shapes = {p: past_shape(model, p) for p in self.pasts}
        self.programs = 0
        # The merged decoder's branch flag as arrays made outside any trace: inside one, a
        # closed-over concrete array stays concrete, so its If picks a branch on the host (a
        # numpy value would be staged as a traced input, and the branches differ in shape).
        self._branch = {flag: jnp.array([flag]) for flag in (False, True)}
        self._prefill = jax.jit(self._prefill_step, static_argnames=("length", "settings"))
        self._decode = jax.jit(
            self._decode_step, static_argnames=("settings",), donate_argnames=("past", "mask")
        )
        self._exact = jax.jit(self._exact_step, static_argnames=("use_cache", "settings"))

    # --- the steps (traced) ----------------------------------------------------------------

    def _inputs(self, ids, mask, positions, past, use_cache: bool) -> dict[str, Any]:
        inputs = {"input_ids": ids, **past}
        if self.masked:
            inputs["attention_mask"] = mask
        if self.positions:
            inputs["position_ids"] = positions
        if self.merged:
            inputs["use_cache_branch"] = self._branch[use_cache]
        return inputs

    def _prefill_step(self, params, ids, mask, positions, seen, step, key, *, length, settings):
        self.programs += 1
        logits, past, past_mask = self.prefill_past(params, ids, mask, positions, length)
        return choose(logits, seen, step, key, settings), past, past_mask

    def prefill_past(self, params, ids, mask, positions, length: int):
        """(Traced.) The prompt's last logits, and its keys and values written to the start of
        a past buffer of `length` positions, with the buffer's mask."""
        batch, width = ids.shape
        empty = {p: jnp.zeros((batch, *s[:1], 0, *s[1:]), d) for p, (s, d) in self.shapes()}
        out = transmuter.run(
            self.model, self._inputs(ids, mask, positions, empty, False), params=params
        )
        past = {}
        for name, (shape, dtype) in self.shapes():
            buffer = jnp.zeros((batch, shape[0], length, shape[1]), dtype)
            past[name] = jax.lax.dynamic_update_slice_in_dim(
                buffer, out[self.presents[name]].astype(dtype), 0, axis=2
            )
        past_mask = jax.lax.dynamic_update_slice_in_dim(
            jnp.zeros((batch, length), mask.dtype), mask, 0, axis=1
        )
        return out["logits"][:, -1], past, past_mask

    def step_past(self, params, tokens, positions, past, mask):
        """(Traced.) One token for each row after its `past` and `mask` (the slots' buffers, or
        a window of them): the logits, and each row's new key and value per past input."""
        batch, length = mask.shape
        full = jnp.concatenate([mask, jnp.ones((batch, 1), mask.dtype)], axis=1)
        inputs = self._inputs(tokens[:, None], full, positions[:, None], past, True)
        out = transmuter.run(self.model, inputs, params=params)
        new = {name: out[self.presents[name]][:, :, length] for name in self.pasts}
        return out["logits"][:, -1], new

    def _decode_step(
        self, params, token, positions, seen, step, key, slot, past, mask, *, settings
    ):
        self.programs += 1
        ones = jnp.ones((mask.shape[0], 1), mask.dtype)
        logits, updated, mask = self.extend_past(
            params, token[:, None], ones, positions[:, None], slot, past, mask
        )
        return choose(logits, seen, step, key, settings), updated, mask

    def extend_past(self, params, ids, mask, positions, offset, past, past_mask):
        """(Traced.) New tokens after the past in a buffer (the next token, or the next chunk
        of a prompt): their last logits, and their keys and values written into the buffer
        from `offset`, with the buffer's mask."""
        length = past_mask.shape[1]
        full = jnp.concatenate([past_mask, mask], axis=1)
        out = transmuter.run(
            self.model, self._inputs(ids, full, positions, past, True), params=params
        )
        updated = {}
        for name in self.pasts:
            new = out[self.presents[name]][:, :, length:]  # the new tokens' own keys or values
            updated[name] = jax.lax.dynamic_update_slice_in_dim(
                past[name], new.astype(past[name].dtype), offset, axis=2
            )
        past_mask = jax.lax.dynamic_update_slice_in_dim(past_mask, mask, offset, axis=1)
        return out["logits"][:, -1], updated, past_mask

    def _exact_step(
        self, params, ids, mask, positions, seen, step, key, past, *, use_cache, settings
    ):
        self.programs += 1
        out = transmuter.run(
            self.model, self._inputs(ids, mask, positions, past, use_cache), params=params
        )
        present = {name: out[self.presents[name]] for name in self.pasts}
        return choose(out["logits"][:, -1], seen, step, key, settings), present

    def shapes(self):
        """Each past input's name, and its (heads, head size) and dtype."""
        return [(p, self.past_shapes[p]) for p in self.pasts]

    # --- the loop (host) -------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        pad_id: int,
        max_new_tokens: int,
        settings: Settings = Settings(),
        key: Any = None,
        on_token: Callable[[int, int], bool] | None = None,
    ) -> list[list[int]]:
        """The new tokens of each prompt (token ids), up to and including its end-of-sequence
        token. `on_token(row, token)` is called for each new token; it returns True to stop
        that row (a stop string)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise InputError("text generation needs at least one prompt of at least one token")
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be at least 1; got {max_new_tokens}")
        key = jax.random.key(0) if key is None else key
        with jax.enable_x64(True):  # the graph's int64 inputs stay int64 inside the programs
            if not self.positions:
                return [
                    self._generate_exact(p, row, max_new_tokens, settings, key, on_token)
                    for row, p in enumerate(prompts)
                ]
            return self._generate_buffered(prompts, pad_id, max_new_tokens, settings, key, on_token)

    def _generate_buffered(self, prompts, pad_id, max_new, settings, key, on_token):
        batch = len(prompts)
        ids, mask, positions = left_padded(prompts, pad_id)
        width = ids.shape[1]
        length = pow2(width + max_new, MIN_PAST_BUCKET)
        seen = self._seen(ids, settings)
        params = self.model.params
        step = jnp.int32(0)
        token, past, past_mask = self._prefill(
            params, ids, mask, positions, seen, step, key, length=length, settings=settings
        )
        next_position = positions[:, -1] + 1
        tracker = Tracker(batch, max_new, settings.eos, on_token)
        for index in range(max_new):
            chosen = np.asarray(token)
            if tracker.take(chosen) or index == max_new - 1:
                break
            seen = mark_seen(seen, token)
            token, past, past_mask = self._decode(
                params,
                token,
                jnp.asarray(next_position + index),
                seen,
                jnp.int32(index + 1),
                key,
                jnp.int32(width + index),
                past,
                past_mask,
                settings=settings,
            )
        return tracker.rows

    def _generate_exact(self, prompt, row, max_new, settings, key, on_token):
        """One prompt at exact shapes: the past grows by one each step (a program per token)."""
        ids = np.asarray([prompt], np.int64)
        mask = np.ones_like(ids)
        positions = np.arange(ids.shape[1], dtype=np.int64)[None]
        seen = self._seen(ids, settings)
        past = {p: jnp.zeros((1, s[0], 0, s[1]), d) for p, (s, d) in self.shapes()}
        tracker = Tracker(1, max_new, settings.eos, on_token and partial(_row, on_token, row))
        for index in range(max_new):
            token, past = self._exact(
                self.model.params,
                ids,
                mask,
                positions,
                seen,
                jnp.int32(index),
                key,
                past,
                use_cache=index > 0,
                settings=settings,
            )
            if tracker.take(np.asarray(token)):
                break
            seen = mark_seen(seen, token)
            ids = np.asarray(token)[:, None].astype(np.int64)
            mask = np.ones((1, mask.shape[1] + 1), np.int64)
            positions = positions[:, -1:] + 1
        return tracker.rows[0]

    def _seen(self, ids: np.ndarray, settings: Settings):
        """Which tokens each row holds, for the repetition penalty (the pads too, as
        transformers counts them); a dummy when there is no penalty."""
        if settings.repetition_penalty == 1.0:
            return jnp.zeros((ids.shape[0], 0), bool)
        vocab = self.vocab_size
        seen = np.zeros((ids.shape[0], vocab), bool)
        np.put_along_axis(seen, ids, True, axis=1)
        return jnp.asarray(seen)

    @property
    def vocab_size(self) -> int:
        spec = self.model.output_specs["logits"]
        size = spec.shape[-1] if spec is not None and spec.shape else None
        if not isinstance(size, int):
            raise ModelLoadError(f"{self.model.source}: logits declare no vocabulary size")
        return size


def _row(on_token, row, _, token):
    return on_token(row, token)


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


def choose(logits, seen, step, key, settings: Settings, last=False):
    """The next token of each row from its logits, as transformers' logits processors order
    it: repetition penalty, minimum length (no end of sequence before it), suppressed tokens,
    then greedy, or temperature, top-k and top-p before sampling; a forced first token (at
    `step` 0) or last one (where `last`, traced) overrides the choice."""
    token = _choose(logits, seen, step, key, settings)
    if settings.forced_bos is not None:
        token = jnp.where(step == 0, settings.forced_bos, token)
    if settings.forced_eos:
        token = jnp.where(last, min(settings.forced_eos), token)
    return token


def _choose(logits, seen, step, key, settings: Settings):
    logits = logits.astype(jnp.float32)
    if settings.repetition_penalty != 1.0:
        penalty = settings.repetition_penalty
        logits = jnp.where(seen, jnp.where(logits < 0, logits * penalty, logits / penalty), logits)
    if settings.eos:
        early = step < settings.min_new_tokens
        blocked = jnp.zeros(logits.shape[-1], bool).at[jnp.asarray(settings.eos)].set(True)
        logits = jnp.where(early & blocked, -jnp.inf, logits)
    if settings.suppress:
        logits = logits.at[:, jnp.asarray(settings.suppress)].set(-jnp.inf)
    if settings.begin_suppress:
        begin = jnp.zeros(logits.shape[-1], bool).at[jnp.asarray(settings.begin_suppress)].set(True)
        logits = jnp.where((step == 0) & begin, -jnp.inf, logits)
    if not settings.sample:
        return jnp.argmax(logits, axis=-1)
    logits = logits / settings.temperature
    if settings.top_k:
        kth = jax.lax.top_k(logits, min(settings.top_k, logits.shape[-1]))[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if settings.top_p < 1.0:
        ordered = jnp.sort(logits, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(ordered, axis=-1)
        # Keep the smallest set whose probability reaches top_p (at least one token).
        before = jnp.cumsum(probs, axis=-1) - probs
        cutoff = jnp.min(jnp.where(before < settings.top_p, ordered, jnp.inf), axis=-1)
        logits = jnp.where(logits < cutoff[:, None], -jnp.inf, logits)
    return jax.random.categorical(jax.random.fold_in(key, step), logits, axis=-1)


def mark_seen(seen, token):
    if seen.shape[1] == 0:
        return seen
    return seen.at[jnp.arange(seen.shape[0]), token].set(True)


def left_padded(prompts: Sequence[Sequence[int]], pad_id: int):
    """The prompts left-padded with `pad_id` to their power-of-two bucket: ids, attention mask
    and transformers' positions for left padding (counted over real tokens, 1 on the pads)."""
    width = pow2(max(map(len, prompts)), MIN_PROMPT_BUCKET)
    ids = np.full((len(prompts), width), pad_id, np.int64)
    mask = np.zeros((len(prompts), width), np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = prompt
        mask[row, width - len(prompt) :] = 1
    return ids, mask, np.where(mask == 1, np.cumsum(mask, axis=1) - 1, 1)


def _present_name(past: str, outputs: Sequence[str]) -> str:
    """Optimum's present.{i}.key for past_key_values.{i}.key."""
    name = "present." + past.removeprefix("past_key_values.")
    if name not in outputs:
        raise ModelLoadError(
            f"the model takes {past!r} but returns no {name!r}; outputs: {outputs}"
        )
    return name


def past_shape(model, name: str):
    """(heads, head size) and dtype of a past input, from its declared [batch, heads, past,
    head size]."""
    spec = model.input_specs[name]
    shape = getattr(spec, "shape", None)
    if shape is None or len(shape) != 4 or not all(isinstance(shape[i], int) for i in (1, 3)):
        raise ModelLoadError(
            f"{model.source}: {name!r} is declared as {spec}; text generation needs "
            "[batch, heads, past, head size] with the heads and head size as numbers"
        )
    return (shape[1], shape[3]), spec.dtype


def warn_exact(source: str) -> None:
    warnings.warn(
        f"{source} takes no position_ids: it computes positions from the past's length, so a "
        "padded past would move them; generating at exact shapes, one prompt at a time (a "
        "compile per token)",
        stacklevel=3,
    )
