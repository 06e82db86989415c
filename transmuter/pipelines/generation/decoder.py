"""Decoding with a decoder-only export's past key values, in a few compiled programs.

The past lives on the device in a buffer of a bucketed length `L` with its attention mask. The
prompt (left-padded to a bucket, positions from the mask) runs once with an empty past, and its
keys and values are written to the start of the buffer: one program per (batch, prompt bucket,
L). Each later step runs the model on one token with the whole buffer as its past (the unused
slots masked), then writes the token's key and value into its slot: one program per (batch, L).
The order of the slots does not matter to attention, only the mask and the explicit position
ids do. Logits never leave the device: the step chooses the next token with choice.py's
`choose` (greedy or sampled, each row's settings as arrays, so a new temperature compiles
nothing) and returns only it; choice.py's `decode_loop` runs the steps.

An export without `position_ids` computes positions from the past's length, which the buffer
would give wrongly; it runs each prompt alone at exact shapes instead (a program per token,
the model's alone: the token is chosen by choice.py's `shared_program(choose)`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.generation.choice import (
    Settings,
    Tracker,
    choose,
    decode_loop,
    mark_seen,
    row_keys,
    seen_tokens,
    shared_program,
)
from transmuter.pipelines.shapes import ProgramBudget, pow2

__all__ = ["Decoder", "Settings", "Tracker", "choose", "left_padded", "past_layout"]

# Prompt lengths and buffer lengths are padded to powers of two, at least these.
MIN_PROMPT_BUCKET = 8
MIN_PAST_BUCKET = 64
_KNOWN_INPUTS = {"input_ids", "attention_mask", "position_ids", "use_cache_branch"}


class Decoder:
    """A decoder-only ONNX model with past key values, run as compiled prefill and decode steps.
    `programs` counts the programs traced so far (each one compile)."""

    def __init__(self, model: transmuter.Model, *, merged: bool):
        self.model = model
        self.merged = merged
        layout = past_layout(model)
        self.pasts = layout.own
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
        self.presents = layout.presents
        self.positions = "position_ids" in model.inputs
        self.masked = "attention_mask" in model.inputs
        self.past_shapes = {p: past_shape(model, p) for p in self.pasts}
        self.programs = 0
        self.budget = ProgramBudget()  # exact decoding compiles a program per token
        # The merged decoder's branch flag as arrays made outside any trace: inside one, a
        # closed-over concrete array stays concrete, so its If picks a branch on the host (a
        # numpy value would be staged as a traced input, and the branches differ in shape).
        self._branch = {flag: jnp.array([flag]) for flag in (False, True)}
        self._prefill = transmuter.jit(self._prefill_step, static_argnames=("length", "rules"))
        self._decode = transmuter.jit(
            self._decode_step, static_argnames=("rules",), donate_argnames=("past", "mask")
        )
        self._exact = transmuter.jit(self._exact_step, static_argnames=("use_cache",))

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

    def _prefill_step(self, params, ids, mask, positions, seen, keys, sampling, *, length, rules):
        self.programs += 1
        logits, past, past_mask = self.prefill_past(params, ids, mask, positions, length)
        return choose(logits, seen, 0, keys, sampling, rules), past, past_mask

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
        self, params, token, positions, seen, step, keys, sampling, slot, past, mask, *, rules
    ):
        self.programs += 1
        ones = jnp.ones((mask.shape[0], 1), mask.dtype)
        logits, updated, mask = self.extend_past(
            params, token[:, None], ones, positions[:, None], slot, past, mask
        )
        return choose(logits, seen, step, keys, sampling, rules), updated, mask

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

    def _exact_step(self, params, ids, mask, positions, past, *, use_cache):
        self.programs += 1
        out = transmuter.run(
            self.model, self._inputs(ids, mask, positions, past, use_cache), params=params
        )
        return out["logits"][:, -1], {name: out[self.presents[name]] for name in self.pasts}

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
        settings: Settings | None = None,
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
        settings = Settings() if settings is None else settings
        self.budget.spend(self.programs)
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
        params, rules = self.model.params, settings.rules
        sampling, keys = settings.sampling(batch), row_keys(key, batch)
        state = {"seen": seen_tokens(ids, settings, lambda: self.vocab_size)}

        def first():
            token, state["past"], state["mask"] = self._prefill(
                params, ids, mask, positions, state["seen"], keys, sampling,
                length=length, rules=rules,
            )  # fmt: skip
            return token

        def step(token, index):
            state["seen"] = mark_seen(state["seen"], token)
            token, state["past"], state["mask"] = self._decode(
                params, token, jnp.asarray(positions[:, -1] + index), state["seen"],
                jnp.int32(index), keys, sampling, jnp.int32(width + index - 1), state["past"],
                state["mask"], rules=rules,
            )  # fmt: skip
            return token

        return decode_loop(
            first, step, batch=batch, max_new_tokens=max_new, eos=settings.eos, on_token=on_token
        )

    def _generate_exact(self, prompt, row, max_new, settings, key, on_token):
        """One prompt at exact shapes: the past grows by one each step (a program per token)."""
        ids = np.asarray([prompt], np.int64)
        sampling, keys, rules = settings.sampling(1), row_keys(key, 1), settings.rules
        state = {
            "seen": seen_tokens(ids, settings, lambda: self.vocab_size),
            "past": {p: jnp.zeros((1, s[0], 0, s[1]), d) for p, (s, d) in self.shapes()},
            "length": ids.shape[1],
        }

        def run(ids, positions, index):
            mask = np.ones((1, state["length"]), np.int64)
            logits, state["past"] = self._exact(
                self.model.params, ids, mask, positions, state["past"], use_cache=index > 0
            )
            return shared_program(choose, "rules")(
                logits, state["seen"], jnp.int32(index), keys, sampling, rules=rules
            )

        def step(token, index):
            state["seen"] = mark_seen(state["seen"], token)
            state["length"] += 1
            position = np.asarray([[state["length"] - 1]], np.int64)
            return run(np.asarray(token)[:, None].astype(np.int64), position, index)

        first = lambda: run(ids, np.arange(ids.shape[1], dtype=np.int64)[None], 0)  # noqa: E731
        watch = None if on_token is None else (lambda _, token: on_token(row, token))
        return decode_loop(
            first, step, batch=1, max_new_tokens=max_new, eos=settings.eos, on_token=watch
        )[0]

    @property
    def vocab_size(self) -> int:
        return vocab_size(self.model)


def vocab_size(model) -> int:
    """The vocabulary size `model`'s logits declare (for the repetition penalty's seen tokens)."""
    spec = model.output_specs["logits"]
    size = spec.shape[-1] if spec is not None and spec.shape else None
    if not isinstance(size, int):
        raise ModelLoadError(f"{model.source}: logits declare no vocabulary size")
    return size


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


# The namings of a decoder's past inputs and the outputs that return them, in Optimum's and
# transformers.js's exports: past_key_values.{i}.key / .value with present.{i}.key (decoder-only
# models, and the decoder of a VisionEncoderDecoder such as GPT-2, which reads the encoder's
# states at every step); past_key_values.{i}.decoder.key (self-attention) and
# past_key_values.{i}.encoder.key (cross-attention, computed once) with present.{i}.decoder.key
# and present.{i}.encoder.key (encoder-decoders). Some exporters name the outputs
# present_key_values.*.
PAST_PREFIX = "past_key_values."
PRESENT_PREFIXES = ("present.", "present_key_values.")


class PastLayout(NamedTuple):
    """A decoder's past inputs: `own` (self-attention, growing by a token a step) and `cross`
    (cross-attention, fixed after the first step), and the output returning each."""

    own: list[str]
    cross: list[str]
    presents: dict[str, str]


def past_layout(model, *, outputs: Sequence[str] | None = None) -> PastLayout:
    """The past inputs of `model` and the output of `outputs` (default: the model's own) that
    returns each, in any of the namings above; a past with no output is a ModelLoadError
    naming what was looked for. Cross-attention pasts may have no output in a with-past
    decoder (it only reads them): they map to the name a first step would return."""
    outputs = list(model.outputs if outputs is None else outputs)
    pasts = [n for n in model.inputs if n.startswith(PAST_PREFIX)]
    cross = [n for n in pasts if ".encoder." in n]
    own = [n for n in pasts if n not in cross]
    presents = {}
    for name in pasts:
        rest = name.removeprefix(PAST_PREFIX)
        candidates = [prefix + rest for prefix in PRESENT_PREFIXES]
        found = next((c for c in candidates if c in outputs), None)
        if found is None and name in own:
            raise ModelLoadError(
                f"{model.source} takes {name!r} but returns none of {candidates}; it returns "
                f"{outputs}"
            )
        presents[name] = found or candidates[0]
    return PastLayout(own, cross, presents)


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
