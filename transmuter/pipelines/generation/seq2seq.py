"""Decoding with an encoder-decoder export in Optimum's layout (T5, BART, Whisper), two ways.

`decoding="past"` (`Seq2SeqDecoder`, the default): the encoder runs once, in the same program
as the decoder's first step (the decoder prompt: the start token, or Whisper's forced tokens),
which returns the first logits, the self-attention's keys and values and the cross-attention's
(computed from the encoder's states once, then passed to every step as past inputs, as
Optimum's with-past decoder takes them). Each later step runs the with-past decoder on one
token; logits, keys and values stay on the device. Optimum's encoder-decoder decoders take no
self-attention mask and compute their positions (BART's learned ones, T5's relative bias,
Whisper's) from the past's length, so the past cannot sit in a padded buffer as
`generation.Decoder` keeps a decoder-only model's: it grows by one token per step, a program
per (batch, encoder length, step), about a second of compiling per token the first time, and
the cheapest steps after.

Both decodings choose each token in a program of its own (`_chosen`: choice.py's `choose`, or a
beam search's scores), compiled once per (rows, vocabulary, settings) for the whole process:
inside each step, its sort and draws for sampling took 0.55 s of a per-step program's 1.55 s
of compiling on a tiny GPT-2 decoder. It costs one dispatch more per token.

`decoding="padded"` (`PaddedSeq2SeqDecoder`): every step runs the no-past decoder
(decoder_model.onnx, or decoder_model_merged.onnx's no-past branch) on the whole sequence so
far, right-padded to a power of two from 16 (at most the position table), and reads the logits
at the last real position: self-attention is causal, so the padding after a position changes
nothing at it. The decoder is loaded with `at_position`, so its vocabulary product covers that
one row, and split (`transmuter.split`) at the encoder's states and mask: what it computes
from them alone (the cross-attention's keys and values) is computed by the first step and read
by the later ones. A program per (batch, encoder length, bucket), 4 for 40 tokens; each step
recomputes the sequence's own layers, so steps cost more as the sequence grows
(bench/README.md, "Encoder-decoder generation").

Every row's decoder has the same length, and text inputs are padded to a multiple of 8 (masked
by `encoder_attention_mask`), so a later generation of up to as many tokens compiles nothing.

A decoder that takes inputs_embeds instead of input_ids (Florence-2's, exported in parts by
onnx-community) runs the repository's embed_tokens.onnx on each chosen token inside the step,
so the token still never leaves the device; `encode` is what a model with its own way into
the encoder (Florence-2's image features before the prompt) overrides. `no_repeat_ngram_size`
(generation_config.json's or the task's, as transformers' NoRepeatNGramLogitsProcessor applies
it) bans, at each step, every token that would repeat an n-gram of the decoder's tokens (kept
in a device buffer with "past", read from the padded sequence with "padded").

The past's namings are decoder.py's `past_layout`: Optimum's encoder-decoders'
past_key_values.{i}.decoder.* and .encoder.* (the cross-attention's, from the first step), and
its VisionEncoderDecoder decoders' past_key_values.{i}.key / .value with no cross-attention past
(GPT-2 reads encoder_hidden_states at every step). Both decodings choose tokens with choice.py's
`choose` and run choice.py's `decode_loop`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.generation.beams import BeamSearch, beam_loop
from transmuter.pipelines.generation.choice import (
    Settings,
    beam_scores,
    choose,
    decode_loop,
    mark_seen,
    row_keys,
    seen_tokens,
    shared_program,
)
from transmuter.pipelines.generation.decoder import past_layout, past_shape, vocab_size
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.shapes import ProgramBudget, pow2

ENCODER_BUCKET = 8  # text inputs pad to a multiple of this many tokens
_POSITION = "logits_position"  # padded decoding: the decoder's input choosing its logits' row
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
        self.budget = ProgramBudget()  # "past" compiles a program per step and encoder length
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
        no_repeat_ngram_size: int = 0,
    ) -> list[list[int]]:
        """The new tokens of each row (after `prompt`, the decoder's forced start), up to and
        including its end of sequence token. `on_token(row, token)` as in `Decoder.generate`;
        `no_repeat_ngram_size` > 0 bans repeating the decoder's n-grams of that size."""
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be at least 1; got {max_new_tokens}")
        if no_repeat_ngram_size < 0:
            raise InputError(f"no_repeat_ngram_size must be 0 or more; got {no_repeat_ngram_size}")
        settings = Settings() if settings is None else settings
        key = jax.random.key(0) if key is None else key
        batch = next(iter(encoder_inputs.values())).shape[0]
        self.budget.spend(self.programs)
        return self._decode(
            encoder_inputs,
            prompt,
            batch,
            max_new_tokens,
            settings,
            key,
            on_token,
            no_repeat_ngram_size,
        )

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
    decoder_model_merged.onnx, or decoder_model.onnx and decoder_with_past_model.onnx (and
    embed_tokens.onnx where the decoder takes inputs_embeds)."""

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
        # The decoder's tokens go in as input_ids, or as embed_tokens.onnx's inputs_embeds.
        self.embed = repo.model("embed_tokens") if "inputs_embeds" in self.step.inputs else None
        # Self-attention pasts grow a token a step; cross-attention ones (where the export has
        # them: not GPT-2's in a VisionEncoderDecoder, which reads encoder_hidden_states at
        # every step) are the first step's, fixed.
        layout = past_layout(self.step)
        self.own, self.cross = layout.own, layout.cross
        if not self.own:
            raise ModelLoadError(
                f"{self.step.source}: the with-past decoder takes no past_key_values.* (Optimum's "
                f"past_key_values.{{i}}.key or past_key_values.{{i}}.decoder.key); it takes "
                f"{self.step.inputs}"
            )
        # What the first step returns for each past (the cross-attention's too).
        self.presents = past_layout(self.step, outputs=self.first.outputs).presents
        missing = [
            self.presents[n] for n in layout.cross if self.presents[n] not in self.first.outputs
        ]
        if missing:
            raise ModelLoadError(f"{self.first.source} returns no {missing}")
        self.masked = "encoder_attention_mask" in self.first.inputs
        self.past_shapes = {n: past_shape(self.step, n) for n in (*self.own, *self.cross)}
        self._start = transmuter.jit(self._start_step)
        self._next = transmuter.jit(self._next_step, static_argnames=("no_repeat",))

    def encoder_params(self) -> Any:
        """The parameters `encode` reads."""
        return self.encoder.params

    # --- the steps (traced) ----------------------------------------------------------------

    def encode(self, params, encoder_inputs):
        """The encoder's last hidden state, and the mask over it (None where it takes none)."""
        hidden = transmuter.run(self.encoder, encoder_inputs, params=params)
        return hidden["last_hidden_state"], encoder_inputs.get("attention_mask")

    def _tokens(self, params, ids) -> dict[str, Any]:
        """The decoder's token input: `ids`, or their embeddings."""
        if self.embed is None:
            return {"input_ids": ids}
        out = transmuter.run(self.embed, {"input_ids": ids}, params=params)
        return {"inputs_embeds": out["inputs_embeds"]}

    def _start_step(self, params, encoder_inputs, prompt):
        """Encode, then run the decoder on the prompt: its last logits, the pasts it returns
        and the inputs every later step reads (the encoder's states and mask)."""
        self.programs += 1
        encoder_params, first_params, embed_params = params
        hidden, mask = self.encode(encoder_params, encoder_inputs)
        inputs = {**self._tokens(embed_params, prompt), "encoder_hidden_states": hidden}
        if self.masked:
            inputs["encoder_attention_mask"] = mask
        if self.merged:  # the no-past branch reads no past: empty ones stand in
            batch = prompt.shape[0]
            for name, ((heads, size), dtype) in self.past_shapes.items():
                inputs[name] = jnp.zeros((batch, heads, 0, size), dtype)
            inputs["use_cache_branch"] = self._branch[False]
        out = transmuter.run(self.first, _only(inputs, self.first), params=first_params)
        present = {n: out[self.presents[n]] for n in (*self.own, *self.cross)}
        context = {"encoder_attention_mask": mask, "encoder_hidden_states": hidden}
        context = {k: v for k, v in context.items() if k in self.step.inputs}
        return out["logits"][:, -1], present, context

    def _next_step(
        self,
        params,
        token,
        past,
        context,
        history,
        length,
        order,
        *,
        no_repeat,
    ):
        """One token through the with-past decoder: its logits, the grown self-attention past,
        and the decoder's tokens so far (`length` of them, `token` the last) where n-grams are
        banned. In a beam search `order` is the row each row continues: its past and tokens
        are that row's."""
        self.programs += 1
        step_params, embed_params = params
        if order is not None:
            past = {n: jnp.take(v, order, axis=0) if n in self.own else v for n, v in past.items()}
            history = None if history is None else jnp.take(history, order, axis=0)
        inputs = {**self._tokens(embed_params, token[:, None]), **past, **context}
        if self.merged:
            inputs["use_cache_branch"] = self._branch[True]
        out = transmuter.run(self.step, inputs, params=step_params)
        grown = {n: out[self.presents[n]] for n in self.own}
        if no_repeat:
            history = jax.lax.dynamic_update_slice_in_dim(
                history, token[:, None].astype(history.dtype), length - 1, axis=1
            )
        return out["logits"][:, -1], grown, history

    # --- the loop (host) -------------------------------------------------------------------

    def _decode(
        self, encoder_inputs, prompt, batch, max_new_tokens, settings, key, on_token, no_repeat
    ):
        beams = settings.num_beams
        rows = batch * beams  # a beam search runs each input row as `beams` rows
        encoder_inputs = _repeated(encoder_inputs, beams)
        ids = np.tile(np.asarray(prompt, np.int64), (rows, 1))
        # The decoder's tokens, for banning n-grams: the prompt, then each chosen token.
        history = None
        if no_repeat:
            history = np.zeros((rows, len(prompt) + max_new_tokens), np.int64)
            history[:, : len(prompt)] = ids
        embed_params = None if self.embed is None else self.embed.params
        sampling, keys, rules = settings.sampling(rows), row_keys(key, rows), settings.rules
        state = {
            "seen": seen_tokens(ids, settings, lambda: vocab_size(self.step)),
            "history": history,
        }

        def first(running=None):
            params = (self.encoder_params(), self.first.params, embed_params)
            logits, present, state["context"] = self._start(params, encoder_inputs, ids)
            state["cross"] = {n: present[n] for n in self.cross}
            state["past"] = {n: present[n] for n in self.own}
            return _chosen(
                logits, state["seen"], jnp.int32(0), keys, sampling, max_new_tokens == 1,
                history, jnp.int32(len(prompt)), _device(running), rules=rules,
                no_repeat=no_repeat,
            )  # fmt: skip

        def step(token, index, order=None, running=None):
            token, order = jnp.asarray(token), _device(order)
            if order is not None:
                state["seen"] = jnp.take(state["seen"], order, axis=0)
            state["seen"] = mark_seen(state["seen"], token)
            length = jnp.int32(len(prompt) + index)
            logits, state["past"], state["history"] = self._next(
                (self.step.params, embed_params), token, {**state["past"], **state["cross"]},
                state["context"], state["history"], length, order, no_repeat=no_repeat,
            )  # fmt: skip
            return _chosen(
                logits, state["seen"], jnp.int32(index), keys, sampling,
                index == max_new_tokens - 1, state["history"], length, _device(running),
                rules=rules, no_repeat=no_repeat,
            )  # fmt: skip

        with jax.enable_x64(True):  # the graph's int64 inputs stay int64 inside the programs
            return _loop(first, step, batch, max_new_tokens, settings, on_token)


class PaddedSeq2SeqDecoder(_EncoderDecoder):
    """decoding="padded": an encoder-decoder repository's encoder_model.onnx with
    decoder_model_merged.onnx or decoder_model.onnx."""

    def __init__(self, repo: Repo, task: str):
        super().__init__(repo)
        # decoder_model.onnx first: a merged decoder computes the cross-attention inside its
        # If, which `transmuter.split` leaves to every step.
        role = next((r for r in ("decoder", "decoder_merged") if r in repo.onnx), None)
        if role is not None:
            # The logits at the position each step reads only: one row by the vocabulary.
            self.decoder = repo.model(role, at_position=(("logits", _POSITION),))
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
        self.past_shapes = {n: past_shape(self.decoder, n) for n in pasts}
        self.masked = "encoder_attention_mask" in names
        # What the decoder computes from the encoder's states and mask (the cross-attention's
        # keys and values), computed once by the first step: later steps read it.
        encoder_side = [
            n for n in ("encoder_hidden_states", "encoder_attention_mask") if n in names
        ]
        self.head, self.tail = transmuter.split(self.decoder, encoder_side)
        self._start = transmuter.jit(self._start_step)
        self._next = transmuter.jit(self._next_step)

    # --- the steps (traced) ----------------------------------------------------------------

    def _start_step(self, params, encoder_inputs, ids, length):
        """Encode, then the logits after the prompt `ids[:, :length]`, and what every later
        step reads of the encoder's side: the decoder's head's outputs (its tail's inputs)."""
        self.programs += 1
        encoder_params, head_params, tail_params = params
        hidden = transmuter.run(self.encoder, encoder_inputs, params=encoder_params)
        encoded = {"encoder_hidden_states": hidden["last_hidden_state"]}
        if self.masked:
            encoded["encoder_attention_mask"] = encoder_inputs.get("attention_mask")
        head = transmuter.run(self.head, _only(encoded, self.head), params=head_params)
        context = {k: v for k, v in {**encoded, **head}.items() if k in self.tail.inputs}
        return self._logits(tail_params, ids, length, context), context

    def _next_step(self, params, ids, length, context):
        """The logits after `ids[:, :length]`."""
        self.programs += 1
        return self._logits(params, ids, length, context)

    def _logits(self, params, ids, length, context):
        inputs = {"input_ids": ids, **context}
        if self.merged:
            batch = ids.shape[0]
            for name, ((heads, size), dtype) in self.past_shapes.items():
                inputs[name] = jnp.zeros((batch, heads, 0, size), dtype)
            inputs["use_cache_branch"] = self._branch[False]
        inputs[_POSITION] = jnp.reshape(length - 1, (1,)).astype(jnp.int64)
        out = transmuter.run(self.tail, _only(inputs, self.tail), params=params)
        return out["logits"][:, 0]

    # --- the loop (host) -------------------------------------------------------------------

    def _decode(
        self, encoder_inputs, prompt, batch, max_new_tokens, settings, key, on_token, no_repeat
    ):
        beams = settings.num_beams
        rows = batch * beams  # a beam search runs each input row as `beams` rows
        encoder_inputs = _repeated(encoder_inputs, beams)
        ids = np.zeros((rows, self._bucket(len(prompt))), np.int64)
        ids[:, : len(prompt)] = prompt
        sampling, keys, rules = settings.sampling(rows), row_keys(key, rows), settings.rules
        seen = seen_tokens(ids[:, : len(prompt)], settings, lambda: vocab_size(self.decoder))
        state = {"ids": ids, "seen": seen}

        def first(running=None):
            params = (self.encoder.params, self.head.params, self.tail.params)
            length = np.int32(len(prompt))
            logits, state["context"] = self._start(params, encoder_inputs, ids, length)
            return _chosen(
                logits, state["seen"], jnp.int32(0), keys, sampling, max_new_tokens == 1,
                ids if no_repeat else None, length, _device(running), rules=rules,
                no_repeat=no_repeat,
            )  # fmt: skip

        def step(token, index, order=None, running=None):
            length = len(prompt) + index  # the tokens so far, `token` the last
            if order is not None:
                state["ids"] = state["ids"][order]
                state["seen"] = jnp.take(state["seen"], jnp.asarray(order), axis=0)
            state["seen"] = mark_seen(state["seen"], jnp.asarray(token))
            state["ids"] = self._appended(state["ids"], length - 1, np.asarray(token))
            logits = self._next(self.tail.params, state["ids"], np.int32(length), state["context"])
            return _chosen(
                logits, state["seen"], jnp.int32(index), keys, sampling,
                index == max_new_tokens - 1, state["ids"] if no_repeat else None,
                np.int32(length), _device(running), rules=rules, no_repeat=no_repeat,
            )  # fmt: skip

        with jax.enable_x64(True):  # the graph's int64 inputs stay int64 inside the programs
            return _loop(first, step, batch, max_new_tokens, settings, on_token)

    def _bucket(self, length: int) -> int:
        size = pow2(length, MIN_DECODER_BUCKET)
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


def _loop(first, step, batch, max_new_tokens, settings: Settings, on_token):
    """Both decodings' host loop: choice.py's `decode_loop`, or beams.py's `beam_loop` (its
    `step` gets each row's source row and the beams' scores as well)."""
    if settings.num_beams == 1:
        return decode_loop(
            first, step, batch=batch, max_new_tokens=max_new_tokens, eos=settings.eos,
            on_token=on_token,
        )  # fmt: skip
    search = BeamSearch(
        batch, settings.num_beams, max_new_tokens, settings.eos, settings.length_penalty,
        settings.early_stopping,
    )  # fmt: skip
    return beam_loop(first, step, search, settings.num_return_sequences)


def _repeated(encoder_inputs: Mapping[str, np.ndarray], beams: int) -> dict[str, np.ndarray]:
    """The encoder's inputs with each row repeated for its beams."""
    if beams == 1:
        return dict(encoder_inputs)
    return {n: np.repeat(v, beams, axis=0) for n, v in encoder_inputs.items()}


def _device(value):
    return None if value is None else jnp.asarray(value)


def _chosen(*args, **kwargs):
    """`_pick` in its program, shared by every step (choice.py's `shared_program`)."""
    return shared_program(_pick, "rules", "no_repeat")(*args, **kwargs)


def _pick(logits, seen, step, keys, sampling, last, history, length, running, *, rules, no_repeat):
    """(Traced.) The next token of each row (`choose`, after `_no_repeat` where n-grams are
    banned); in a beam search (`running`: each input row's beams' scores [batch, beams]) each
    input row's best continuations over its beams instead (`_best_continuations`)."""
    if running is None:
        if no_repeat:
            logits = _no_repeat(logits, history, length, no_repeat)
        return choose(logits, seen, step, keys, sampling, rules, last)
    scores = beam_scores(logits, seen, step, sampling, rules, last)
    if no_repeat:
        scores = _no_repeat(scores, history, length, no_repeat)
    return _best_continuations(scores, running, len(rules.eos))


def _best_continuations(scores, running, eos_count: int):
    """Each input row's best continuations over its beams' next-token log-probabilities
    `scores` [batch * beams, vocabulary] plus the beams' own `running` [batch, beams]: their
    accumulated scores, the beam each extends and the token, [batch, keep] each, keeping as
    many as transformers does (beams.py)."""
    batch, beams = running.shape
    vocab = scores.shape[-1]
    total = scores.reshape(batch, beams, vocab) + running[:, :, None]
    keep = max(2, 1 + eos_count) * beams
    values, flat = jax.lax.top_k(total.reshape(batch, beams * vocab), keep)
    return values, flat // vocab, flat % vocab


def _no_repeat(logits, history, length, size: int):
    """`logits` with every token banned (-inf) that would make the last `size` - 1 of the
    first `length` tokens of `history` [batch, width] into an n-gram of `size` tokens seen
    before in them, as transformers' NoRepeatNGramLogitsProcessor bans them."""
    batch, width = history.shape
    starts = width - size + 1  # where an n-gram can start in the buffer
    if starts < 1:
        return logits
    length = jnp.asarray(length, jnp.int32)
    grams = jnp.stack([history[:, i : i + starts] for i in range(size)], axis=-1)
    tail = jax.lax.dynamic_slice_in_dim(history, jnp.maximum(length - size + 1, 0), size - 1, 1)
    # An n-gram counts where it lies within the tokens so far and starts like the tail.
    inside = jnp.arange(starts, dtype=jnp.int32) <= length - size
    match = jnp.all(grams[:, :, :-1] == tail[:, None, :], axis=-1) & inside
    rows = jnp.broadcast_to(jnp.arange(batch)[:, None], match.shape)
    # Counted, not set: equal banned tokens in a row would race in a scatter of booleans.
    counts = jnp.zeros(logits.shape, jnp.int32)
    counts = counts.at[rows, grams[:, :, -1]].add(match.astype(jnp.int32))
    return jnp.where(counts > 0, -jnp.inf, logits)


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
