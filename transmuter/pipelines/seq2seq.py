"""Decoding with an encoder-decoder export in Optimum's layout (T5, BART, Whisper), two ways.

`decoding="past"` (`Seq2SeqDecoder`, the default): the encoder runs once, in the same program
as the decoder's first step (the decoder prompt: the start token, or Whisper's forced tokens),
which returns the first token, the self-attention's keys and values and the cross-attention's
(computed from the encoder's states once, then passed to every step as past inputs, as
Optimum's with-past decoder takes them). Each later step runs the with-past decoder on one
token; keys, values and the chosen token stay on the device, and the token is chosen inside
the step (`generation.choose`). Optimum's encoder-decoder decoders take no self-attention mask
and compute their positions (BART's learned ones, T5's relative bias, Whisper's) from the
past's length, so the past cannot sit in a padded buffer as `generation.Decoder` keeps a
decoder-only model's: it grows by one token per step, a program per (batch, encoder length,
step), about a second of compiling per token the first time, and the cheapest steps after.

`decoding="padded"` (`PaddedSeq2SeqDecoder`): every step runs the no-past decoder
(decoder_model.onnx, or decoder_model_merged.onnx's no-past branch) on the whole sequence so
far, right-padded to a power of two from 16 (at most the position table), and reads the logits
at the last real position: self-attention is causal, so the padding after a position changes
nothing at it. A program per (batch, encoder length, bucket), 4 for 40 tokens; each step
recomputes the sequence, the cross-attention's keys and values and every position's logits,
so steps cost more and more as the sequence grows (bench/README.md, "Encoder-decoder
generation": at 40 tokens on a model of Whisper tiny's size, the first generation about 8x
faster, later ones 3x slower).

Every row's decoder has the same length, and text inputs are padded to a multiple of 8 (masked
by `encoder_attention_mask`), so a later generation of up to as many tokens compiles nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.generation import Settings, _mark, _past_shape, _pow2, _Tracker, choose
from transmuter.pipelines.repo import Repo

ENCODER_BUCKET = 8  # text inputs pad to a multiple of this many tokens
MIN_DECODER_BUCKET = 16  # padded decoding: the sequence pads to a power of two, at least this
_PAST = "past_key_values."


class _EncoderDecoder:
    """What both decodings share: the encoder, the decoder's position table, the count of
    programs traced so far (each one compile) and the encoder's text inputs."""

    def __init__(self, repo: Repo):
        self.repo = repo
        self.encoder = repo.model("encoder")
        config = repo.config
        limit = config.get("max_target_positions", config.get("max_position_embeddings"))
        self.positions = limit if isinstance(limit, int) else None  # the position table's size
        self.programs = 0
        self._branch = {flag: jnp.array([flag]) for flag in (False, True)}  # see generation.py

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
        return self._decode(encoder_inputs, prompt, batch, max_new_tokens, settings, key, on_token)

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


class Seq2SeqDecoder(_EncoderDecoder):
    """decoding="past": an encoder-decoder repository's encoder_model.onnx and
    decoder_model_merged.onnx, or decoder_model.onnx and decoder_with_past_model.onnx."""

    def __init__(self, repo: Repo, task: str):
        super().__init__(repo)
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

    def _decode(self, encoder_inputs, prompt, batch, max_new_tokens, settings, key, on_token):
        ids = np.tile(np.asarray(prompt, np.int64), (batch, 1))
        with jax.enable_x64(True):  # the graph's int64 inputs stay int64 inside the programs
            seen = _seen(self.step, ids, settings)
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


class PaddedSeq2SeqDecoder(_EncoderDecoder):
    """decoding="padded": an encoder-decoder repository's encoder_model.onnx with
    decoder_model_merged.onnx or decoder_model.onnx."""

    def __init__(self, repo: Repo, task: str):
        super().__init__(repo)
        if "decoder_merged" in repo.onnx:
            self.decoder = repo.model("decoder_merged")
        elif "decoder" in repo.onnx:
            self.decoder = repo.model("decoder")
        else:
            raise ModelLoadError(
                f"{repo.source}: {task} needs encoder_model.onnx with decoder_model_merged.onnx "
                f"or decoder_model.onnx; found {repo.found}"
            )
        names = self.decoder.inputs
        if "input_ids" not in names or "encoder_hidden_states" not in names:
            raise ModelLoadError(
                f"{self.decoder.source}: the decoder takes input_ids and encoder_hidden_states "
                f"in Optimum's exports; it takes {names}"
            )
        _check_sequence_axis(self.decoder)
        self.merged = "use_cache_branch" in names
        # The merged decoder's no-past branch reads no past: empty ones stand in.
        pasts = [n for n in names if n.startswith(_PAST)] if self.merged else []
        self.past_shapes = {n: _past_shape(self.decoder, n) for n in pasts}
        self.masked = "encoder_attention_mask" in names
        self._start = jax.jit(self._start_step, static_argnames=("settings",))
        self._next = jax.jit(self._next_step, static_argnames=("settings",))

    # --- the steps (traced) ----------------------------------------------------------------

    def _start_step(self, params, encoder_inputs, ids, length, seen, key, last, *, settings):
        """Encode, then choose the first new token after the prompt `ids[:, :length]`."""
        self.programs += 1
        encoder_params, decoder_params = params
        hidden = transmuter.run(self.encoder, encoder_inputs, params=encoder_params)
        context = {"encoder_hidden_states": hidden["last_hidden_state"]}
        if self.masked:
            context["encoder_attention_mask"] = encoder_inputs.get("attention_mask")
        logits = self._logits(decoder_params, ids, length, context)
        return choose(logits, seen, 0, key, settings, last), context

    def _next_step(self, params, ids, length, context, seen, step, key, last, *, settings):
        """The token after `ids[:, :length]`."""
        self.programs += 1
        return choose(self._logits(params, ids, length, context), seen, step, key, settings, last)

    def _logits(self, params, ids, length, context):
        inputs = {"input_ids": ids, **context}
        if self.merged:
            batch = ids.shape[0]
            for name, ((heads, size), dtype) in self.past_shapes.items():
                inputs[name] = jnp.zeros((batch, heads, 0, size), dtype)
            inputs["use_cache_branch"] = self._branch[False]
        logits = transmuter.run(self.decoder, inputs, params=params)["logits"]
        return jax.lax.dynamic_index_in_dim(logits, length - 1, axis=1, keepdims=False)

    # --- the loop (host) -------------------------------------------------------------------

    def _decode(self, encoder_inputs, prompt, batch, max_new_tokens, settings, key, on_token):
        length = len(prompt)
        ids = np.zeros((batch, self._bucket(length)), np.int64)
        ids[:, :length] = prompt
        with jax.enable_x64(True):  # the graph's int64 inputs stay int64 inside the programs
            seen = _seen(self.decoder, ids[:, :length], settings)
            params = (self.encoder.params, self.decoder.params)
            token, context = self._start(
                params,
                dict(encoder_inputs),
                ids,
                np.int32(length),
                seen,
                key,
                max_new_tokens == 1,
                settings=settings,
            )
            tracker = _Tracker(batch, max_new_tokens, settings.eos, on_token)
            for index in range(1, max_new_tokens + 1):
                chosen = np.asarray(token)
                if tracker.take(chosen) or index == max_new_tokens:
                    break
                seen = _mark(seen, token)
                ids = self._appended(ids, length, chosen)
                length += 1
                token = self._next(
                    self.decoder.params,
                    ids,
                    np.int32(length),
                    context,
                    seen,
                    jnp.int32(index),
                    key,
                    index == max_new_tokens - 1,
                    settings=settings,
                )
        return tracker.rows

    def _bucket(self, length: int) -> int:
        size = _pow2(length, MIN_DECODER_BUCKET)
        return size if self.positions is None else max(min(size, self.positions), length)

    def _appended(self, ids: np.ndarray, length: int, tokens: np.ndarray) -> np.ndarray:
        """`ids` with `tokens` at position `length`, grown to the next bucket when full, as a
        new array: JAX may read an aligned host array in place, so an array a step was given
        is never written."""
        grown = np.zeros((ids.shape[0], self._bucket(length + 1)), ids.dtype)
        grown[:, :length] = ids[:, :length]
        grown[:, length] = tokens
        return grown


# The decodings by name, the `decoding` option of text2text-generation and speech recognition.
DECODINGS = {"past": Seq2SeqDecoder, "padded": PaddedSeq2SeqDecoder}


def seq2seq_decoder(repo: Repo, task: str, decoding: str) -> Seq2SeqDecoder | PaddedSeq2SeqDecoder:
    if decoding not in DECODINGS:
        raise InputError(f"decoding must be one of {', '.join(DECODINGS)}; got {decoding!r}")
    return DECODINGS[decoding](repo, task)


def _seen(model, ids: np.ndarray, settings: Settings):
    """The tokens each row has seen, for the repetition penalty (an empty mask without it)."""
    if settings.repetition_penalty == 1.0:
        return jnp.zeros((ids.shape[0], 0), bool)
    spec = model.output_specs["logits"]
    vocab = spec.shape[-1] if spec is not None and spec.shape else None
    if not isinstance(vocab, int):
        raise ModelLoadError(f"{model.source}: logits declare no vocabulary size")
    seen = np.zeros((ids.shape[0], vocab), bool)
    np.put_along_axis(seen, ids, True, axis=1)
    return jnp.asarray(seen)


def _only(inputs: dict[str, Any], model) -> dict[str, Any]:
    return {n: v for n, v in inputs.items() if n in model.inputs}


def _check_sequence_axis(decoder) -> None:
    """The decoder runs on whole sequences: its input_ids' second axis must not be fixed."""
    shape = getattr(decoder.input_specs["input_ids"], "shape", None)
    if shape is not None and (len(shape) != 2 or isinstance(shape[1], int)):
        raise ModelLoadError(
            f"{decoder.source}: input_ids is declared as {decoder.input_specs['input_ids']}; "
            "decoding runs the no-past decoder on the whole sequence, [batch, sequence]"
        )
