"""Decoding with an encoder-decoder export in Optimum's layout (T5, BART, Whisper).

The encoder runs once, in the same program as the decoder's first step (the decoder prompt:
the start token, or Whisper's forced tokens), which returns the first token, the
self-attention's keys and values and the cross-attention's (computed from the encoder's
states once, then passed to every step as past inputs, as Optimum's with-past decoder takes
them). Each later step runs the with-past decoder on one token; keys, values and the chosen
token stay on the device, and the token is chosen inside the step (`generation.choose`).

Optimum's encoder-decoder decoders take no self-attention mask and compute their positions
(BART's learned ones, T5's relative bias, Whisper's) from the past's length, so the past
cannot sit in a padded buffer as `generation.Decoder` keeps a decoder-only model's: it grows
by one token per step, a program per (batch, encoder length, step). Every row's decoder has
the same length, and text inputs are padded to a multiple of 8 (masked by
`encoder_attention_mask`), so a later generation of up to as many tokens compiles nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.generation import Settings, _mark, _past_shape, _Tracker, choose
from transmuter.pipelines.repo import Repo

ENCODER_BUCKET = 8  # text inputs pad to a multiple of this many tokens
_PAST = "past_key_values."


class Seq2SeqDecoder:
    """An encoder-decoder repository's encoder_model.onnx and decoder_model_merged.onnx, or
    decoder_model.onnx and decoder_with_past_model.onnx. `programs` counts the programs traced
    so far (each one compile)."""

    def __init__(self, repo: Repo, task: str):
        self.repo = repo
        self.encoder = repo.model("encoder")
        if "decoder_merged" in repo.onnx:
            self.first = self.step = repo.model("decoder_merged")
        elif "decoder" in repo.onnx and "decoder_with_past" in repo.onnx:
            self.first, self.step = repo.model("decoder"), repo.model("decoder_with_past")
        else:
            raise ModelLoadError(
                f"{repo.source}: {task} needs encoder_model.onnx with decoder_model_merged.onnx, "
                f"or with decoder_model.onnx and decoder_with_past_model.onnx; found {repo.found}"
            )
        self.merged = "use_cache_branch" in self.step.inputs
        pasts = [n for n in self.step.inputs if n.startswith(_PAST)]
        self.own = [n for n in pasts if ".encoder." not in n]  # self-attention: grows
        self.cross = [n for n in pasts if ".encoder." in n]  # cross-attention: fixed
        if not self.own or not self.cross:
            raise ModelLoadError(
                f"{self.step.source}: the with-past decoder takes past_key_values.*.decoder.* "
                f"and past_key_values.*.encoder.* in Optimum's exports; it takes {pasts}"
            )
        for name in pasts:
            present = "present." + name.removeprefix(_PAST)
            if name in self.own and present not in self.step.outputs:
                raise ModelLoadError(f"{self.step.source} returns no {present!r}")
            if present not in self.first.outputs:
                raise ModelLoadError(f"{self.first.source} returns no {present!r}")
        self.masked = "encoder_attention_mask" in self.first.inputs
        self.past_shapes = {n: _past_shape(self.step, n) for n in pasts}
        self.programs = 0
        self._branch = {flag: jnp.array([flag]) for flag in (False, True)}  # see generation.py
        self._start = jax.jit(self._start_step, static_argnames=("settings",))
        self._next = jax.jit(self._next_step, static_argnames=("settings",))

    # --- the steps (traced) ----------------------------------------------------------------

    def _start_step(self, params, encoder_inputs, prompt, seen, key, last, *, settings):
        """Encode, then run the decoder on the prompt."""
        self.programs += 1
        encoder_params, first_params = params
        hidden = transmuter.run(self.encoder, encoder_inputs, params=encoder_params)
        hidden = hidden["last_hidden_state"]
        mask = encoder_inputs.get("attention_mask")
        inputs = {"input_ids": prompt, "encoder_hidden_states": hidden}
        if self.masked:
            inputs["encoder_attention_mask"] = mask
        if self.merged:  # the no-past branch reads no past: empty ones stand in
            batch = prompt.shape[0]
            for name, ((heads, size), dtype) in self.past_shapes.items():
                inputs[name] = jnp.zeros((batch, heads, 0, size), dtype)
            inputs["use_cache_branch"] = self._branch[False]
        out = transmuter.run(self.first, _only(inputs, self.first), params=first_params)
        present = {n: out["present." + n.removeprefix(_PAST)] for n in (*self.own, *self.cross)}
        context = {"encoder_attention_mask": mask, "encoder_hidden_states": hidden}
        context = {k: v for k, v in context.items() if k in self.step.inputs}
        token = choose(out["logits"][:, -1], seen, 0, key, settings, last)
        return token, present, context

    def _next_step(self, params, token, past, context, seen, step, key, last, *, settings):
        """One token through the with-past decoder: the next token and the grown self-attention
        past."""
        self.programs += 1
        inputs = {"input_ids": token[:, None], **past, **context}
        if self.merged:
            inputs["use_cache_branch"] = self._branch[True]
        out = transmuter.run(self.step, inputs, params=params)
        grown = {n: out["present." + n.removeprefix(_PAST)] for n in self.own}
        return choose(out["logits"][:, -1], seen, step, key, settings, last), grown

    # --- the loop (host) -------------------------------------------------------------------

    def generate(
        self,
        encoder_inputs: Mapping[str, np.ndarray],
        prompt: list[int],
        *,
        max_new_tokens: int,
        settings: Settings | None = None,
        key: Any = None,
        on_token: Callable[[int, int], bool] | None = None,
    ) -> list[list[int]]:
        """The new tokens of each row (after `prompt`, the decoder's forced start), up to and
        including its end of sequence token. `on_token(row, token)` as in `Decoder.generate`."""
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be at least 1; got {max_new_tokens}")
        settings = Settings() if settings is None else settings
        key = jax.random.key(0) if key is None else key
        batch = next(iter(encoder_inputs.values())).shape[0]
        ids = np.tile(np.asarray(prompt, np.int64), (batch, 1))
        with jax.enable_x64(True):  # the graph's int64 inputs stay int64 inside the programs
            seen = self._seen(ids, settings)
            params = (self.encoder.params, self.first.params)
            token, present, context = self._start(
                params,
                dict(encoder_inputs),
                ids,
                seen,
                key,
                max_new_tokens == 1,
                settings=settings,
            )
            cross = {n: present[n] for n in self.cross}
            past = {n: present[n] for n in self.own}
            tracker = _Tracker(batch, max_new_tokens, settings.eos, on_token)
            for index in range(1, max_new_tokens + 1):
                if tracker.take(np.asarray(token)) or index == max_new_tokens:
                    break
                seen = _mark(seen, token)
                token, past = self._next(
                    self.step.params,
                    token,
                    {**past, **cross},
                    context,
                    seen,
                    jnp.int32(index),
                    key,
                    index == max_new_tokens - 1,
                    settings=settings,
                )
        return tracker.rows

    def _seen(self, ids: np.ndarray, settings: Settings):
        if settings.repetition_penalty == 1.0:
            return jnp.zeros((ids.shape[0], 0), bool)
        spec = self.step.output_specs["logits"]
        vocab = spec.shape[-1] if spec is not None and spec.shape else None
        if not isinstance(vocab, int):
            raise ModelLoadError(f"{self.step.source}: logits declare no vocabulary size")
        seen = np.zeros((ids.shape[0], vocab), bool)
        np.put_along_axis(seen, ids, True, axis=1)
        return jnp.asarray(seen)

    def text_inputs(self, rows: list[list[int]], pad_id: int) -> dict[str, np.ndarray]:
        """input_ids and attention_mask of token rows, right-padded to a multiple of
        ENCODER_BUCKET where the decoder masks the padding (exact otherwise)."""
        if not rows or any(len(r) == 0 for r in rows):
            raise InputError("give at least one input of at least one token")
        names = self.encoder.inputs
        if "input_ids" not in names or set(names) - {"input_ids", "attention_mask"}:
            raise ModelLoadError(
                f"{self.encoder.source}: a text encoder takes input_ids and attention_mask; "
                f"this one takes {names}"
            )
        width = max(map(len, rows))
        if self.masked and "attention_mask" in names:
            width = -(-width // ENCODER_BUCKET) * ENCODER_BUCKET
        ids = np.full((len(rows), width), pad_id, np.int64)
        mask = np.zeros((len(rows), width), np.int64)
        for row, tokens in enumerate(rows):
            ids[row, : len(tokens)], mask[row, : len(tokens)] = tokens, 1
        return (
            {"input_ids": ids, "attention_mask": mask}
            if "attention_mask" in names
            else {"input_ids": ids}
        )


def _only(inputs: dict[str, Any], model) -> dict[str, Any]:
    return {n: v for n, v in inputs.items() if n in model.inputs}
