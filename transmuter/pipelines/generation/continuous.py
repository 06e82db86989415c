"""Continuous batching for text generation: a decode batch of fixed slots on the device.

The past of every slot lives in one buffer of `length` positions (twice the model's positions,
rounded up to a power of two: a prompt left-padded to its bucket, then its new tokens) with its
mask. A request joining is prefilled alone (its prompt left-padded to a bucket, as `Decoder`
does), its keys, values and mask copied into the start of a free slot and its first token
chosen, in one program; then every step runs the model once on each running request's last
token, each row writing its new key and value at its own index and choosing its next token with
its own sampling options. A step reads only what the running requests need: their rows (padded
with free ones to a power of two) and the buffer's first `window` positions, the power of two
(from MIN_PAST_BUCKET) past every row's write index; a program for each pair. A finished
request leaves at once and frees its slot for the next.

Between two steps at most one chunk of one joining prompt is prefilled: a prompt whose bucket
is longer than `prefill_chunk` tokens fills its own past buffer one chunk at a time (each chunk
attending to the chunks before it, a program for every chunk), its slot reserved, so a long
prompt holds the running requests back by one chunk at a time, never by its whole prefill.
Chunks of nothing but left padding are skipped.

Greedy answers are the tokens the request gets alone (`TextGeneration.generate`): the order of
the buffer's slots does not matter to attention, only the mask and the position ids do.
Sampling draws each row from its own key (a request's `seed`), so a seeded answer repeats, but
is not the draw a batch of `generate` makes.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import transmuter
from transmuter import telemetry
from transmuter.errors import InputError, ModelLoadError, Overloaded, ServingClosed
from transmuter.pipelines.generation.decoder import (
    MIN_PAST_BUCKET,
    MIN_PROMPT_BUCKET,
    Settings,
    left_padded,
)
from transmuter.pipelines.shapes import pow2
from transmuter.pipelines.text.text_generation import TextGeneration

# The per-request options; end of sequence is the model's (generation_config.json).
_OPTIONS = {
    "max_new_tokens", "min_new_tokens", "do_sample", "temperature", "top_k", "top_p",
    "repetition_penalty", "stop", "on_token", "seed",
}  # fmt: skip


class ClientGone(Exception):
    """The Future of a request whose caller left (`abandon`) before it finished."""


@dataclass
class _Filling:
    """A prompt being prefilled chunk by chunk into its own past buffer, for `slot`."""

    slot: int
    request: Any  # _Request
    ids: np.ndarray  # the left-padded prompt, its mask and positions: [1, bucket]
    mask: np.ndarray
    positions: np.ndarray
    offset: int  # where the next chunk starts
    past: dict[str, Any]
    past_mask: Any


@dataclass
class _Request:
    prompt: list[int]
    max_new_tokens: int
    temperature: float  # 0: greedy
    top_k: int  # 0: every token
    top_p: float
    repetition_penalty: float
    min_new_tokens: int
    key: Any  # [1]
    watcher: Any  # streams text and sees stop strings (text-generation's); None: neither
    tokens: list[int] = field(default_factory=list)
    future: Future = field(default_factory=Future)


class ContinuousGeneration:
    """Generates for many concurrent requests in `slots` decode rows on the device. `submit`
    returns a Future of the new token ids (up to and including end of sequence); the options
    are text-generation's: max_new_tokens, min_new_tokens, temperature (0 or do_sample=False:
    greedy), top_k, top_p, repetition_penalty, stop, on_token(row, text) (row 0) and seed. `max_queue`
    requests may wait for a slot before `submit` refuses with `Overloaded`. Prompts longer
    than `prefill_chunk` tokens (a power of two) are prefilled that many tokens at a time
    between steps."""

    def __init__(
        self,
        pipeline: TextGeneration,
        *,
        slots: int = 8,
        max_queue: int = 1024,
        prefill_chunk: int = 256,
        max_len: int | None = None,
    ):
        decoder = pipeline.decoder
        if not decoder.positions:
            raise ModelLoadError(
                f"{pipeline.repo.source} takes no position_ids: continuous batching needs them "
                "(each slot's positions are its own)"
            )
        if slots < 1 or max_queue < 1:
            raise InputError(f"slots and max_queue must be at least 1; got {slots}, {max_queue}")
        if prefill_chunk < MIN_PROMPT_BUCKET or prefill_chunk & (prefill_chunk - 1):
            # Prompt buckets are powers of two from MIN_PROMPT_BUCKET: such chunks divide them.
            raise InputError(
                f"prefill_chunk must be a power of two, at least {MIN_PROMPT_BUCKET}; got "
                f"{prefill_chunk}"
            )
        config = pipeline.repo.config
        positions = config.get("max_position_embeddings", config.get("n_positions"))
        if not isinstance(positions, int):
            raise ModelLoadError(
                f"{pipeline.repo.source}: config.json gives no max_position_embeddings or "
                "n_positions, which size the slots' past"
            )
        if max_len is not None:  # a budget (transmuter serve's --max-model-len)
            if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
                raise InputError(f"max_len must be an integer of at least 2; got {max_len!r}")
            positions = min(positions, max_len)
        self.pipeline, self.decoder = pipeline, decoder
        # A prompt padded to its power-of-two bucket is under twice its length, so a request
        # within the model's positions always fits twice them.
        self.size, self.length, self.positions = slots, pow2(2 * positions, 1), positions
        self.max_queue, self.chunk = max_queue, prefill_chunk
        eos = pipeline.defaults["eos_token_id"]
        self.eos = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
        # The pipeline's pad id: the repetition penalty counts the pads, as transformers does.
        self.pad_id = pipeline._pad_id(Settings(eos=self.eos))
        self.programs = 0
        slot_state = ("past", "mask", "seen", "keys")
        self._join_program = transmuter.jit(self._join_fn, donate_argnames=slot_state)
        self._place_program = transmuter.jit(self._place_fn, donate_argnames=slot_state)
        self._extend = transmuter.jit(self._extend_fn, donate_argnames=("past", "past_mask"))
        self._step = transmuter.jit(
            self._step_fn, static_argnames=("window",), donate_argnames=("seen",)
        )
        self._write = transmuter.jit(_write_rows, donate_argnames=("past", "mask"))
        self._lock = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._rows: list[_Request | None] = [None] * slots
        self._filling: _Filling | None = None
        self._closing = False
        self._gone: set[Future] = set()  # running requests whose callers left (`abandon`)
        self._worker = threading.Thread(target=self._serve, name="transmuter-slots", daemon=True)
        self._worker.start()

    # --- callers ---------------------------------------------------------------------------

    def submit(self, prompt: Sequence[int], **options: Any) -> Future:
        """Queue a prompt (token ids) for the next free slot; its Future gives the new token
        ids. Cancelling it before it has a slot takes it out."""
        return self._queue(self._request(list(prompt), options), bounded=True)

    def abandon(self, future: Future) -> None:
        """The caller of `future` has gone: a waiting request leaves the queue, a running one
        frees its slot at the next step (its Future fails with ClientGone)."""
        if future.cancel():  # still waiting: it never joins
            return
        with self._lock:
            if not future.done():
                self._gone.add(future)

    def _queue(self, request: _Request, bounded: bool) -> Future:
        with self._lock:
            if self._closing:
                raise ServingClosed("this generation engine is closed")
            if bounded and len(self._waiting) >= self.max_queue:
                raise Overloaded(
                    f"{len(self._waiting)} requests are waiting for a slot "
                    f"(max_queue={self.max_queue}); retry later"
                )
            self._waiting.append(request)
            self._lock.notify_all()
        return request.future

    def warmup(self, prompt: Sequence[int]) -> int:
        """Compile before traffic: the join of `prompt`'s bucket, and the step for every count
        of running rows at the smallest window, by running a request of `prompt` in every slot
        at once (they join one a step). Returns the programs compiled; larger windows compile
        when requests first reach them."""
        before = self.programs
        room = MIN_PAST_BUCKET - pow2(len(prompt), MIN_PROMPT_BUCKET) - 1
        new = max(1, min(self.size + 1, room, self.positions - len(prompt)))
        options = {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False}
        # Not traffic: a max_queue below the slot count does not apply.
        requests = [self._request(list(prompt), options) for _ in range(self.size)]
        for future in [self._queue(request, bounded=False) for request in requests]:
            future.result()
        return self.programs - before

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def active(self) -> int:
        return sum(r is not None for r in self._rows)

    def close(self, timeout: float | None = None) -> None:
        """Refuse new requests, finish the queued and running ones, stop the worker."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        self._worker.join(timeout)

    def _request(self, prompt: list[int], options: dict) -> _Request:
        given = {**self.pipeline.defaults, **options}
        extra = set(options) - _OPTIONS
        if extra:
            raise InputError(
                f"continuous batching has no option {sorted(extra)}; it takes {sorted(_OPTIONS)}"
            )
        if not prompt or not all(isinstance(t, int) for t in prompt):
            raise InputError("a prompt is a non-empty list of token ids")
        max_new = int(given["max_new_tokens"])
        if max_new < 1:
            raise InputError(f"max_new_tokens must be at least 1; got {max_new}")
        if len(prompt) + max_new > self.positions:
            raise InputError(
                f"a prompt of {len(prompt)} tokens and max_new_tokens={max_new} need "
                f"{len(prompt) + max_new} positions; the model has {self.positions}"
            )
        sample = bool(given["do_sample"]) and float(given["temperature"]) > 0
        top_k = int(given["top_k"] or 0)
        if top_k < 0:
            raise InputError(f"top_k must be 0 (every token) or more; got {top_k}")
        seed = options.get("seed")
        watcher = self.pipeline._watch(1, given["stop"], given["on_token"])
        return _Request(
            prompt=prompt,
            max_new_tokens=max_new,
            temperature=float(given["temperature"]) if sample else 0.0,
            top_k=top_k if sample else 0,
            top_p=float(given["top_p"]) if sample else 1.0,
            repetition_penalty=float(given["repetition_penalty"]),
            min_new_tokens=int(given["min_new_tokens"]),
            key=jax.random.key(0 if seed is None else seed)[None],
            watcher=watcher,
        )

    # --- the loop ----------------------------------------------------------------------------

    def _serve(self) -> None:
        with jax.enable_x64(True):  # the graph's int64 inputs stay int64 inside the programs
            self._state()
            while True:
                with self._lock:
                    while not (self._waiting or self._busy or self._closing):
                        self._lock.wait()
                    if self._closing and not self._waiting and not self._busy:
                        return
                    free = self._free_slot()
                    joining = (
                        self._waiting.popleft()
                        if free is not None and self._waiting and self._filling is None
                        else None
                    )
                failed = None
                try:
                    if joining is not None and joining.future.set_running_or_notify_cancel():
                        failed = joining
                        self._join(free, joining)
                    elif self._filling is not None:
                        failed = self._filling.request
                        self._fill()
                except Exception as error:  # its prefill failed: that request alone ends
                    self._filling = None
                    self._rows = [None if r is failed else r for r in self._rows]
                    if not failed.future.done():
                        failed.future.set_exception(error)
                if self.active:
                    try:
                        self._advance()
                    except Exception as error:  # the step failed: every running request ends
                        for slot, request in enumerate(self._rows):
                            if request is not None:
                                self._rows[slot] = None
                                request.future.set_exception(error)
                        self._state()

    @property
    def _busy(self) -> bool:
        return bool(self.active) or self._filling is not None

    def _free_slot(self) -> int | None:
        reserved = self._filling.slot if self._filling is not None else None
        return next((i for i, r in enumerate(self._rows) if r is None and i != reserved), None)

    def _state(self) -> None:
        size, length = self.size, self.length
        self.past = {
            name: jnp.zeros((size, heads, length, width), dtype)
            for name, ((heads, width), dtype) in self.decoder.shapes()
        }
        self.mask = jnp.zeros((size, length), jnp.int64)
        self.seen = jnp.zeros((size, self.decoder.vocab_size), bool)
        self.tokens = np.zeros(size, np.int64)
        self.next_position = np.zeros(size, np.int64)
        self.write = np.zeros(size, np.int32)
        self.keys = jax.random.split(jax.random.key(0), size)

    def _join(self, slot: int, request: _Request) -> None:
        """Prefill `request` alone and place it in `slot`, in one program, or (past
        `prefill_chunk` tokens) a chunk now and the others between the next steps."""
        ids, mask, positions = left_padded([request.prompt], self.pad_id)
        if ids.shape[1] > self.chunk:
            padding = ids.shape[1] - len(request.prompt)
            past = {
                name: jnp.zeros((1, heads, ids.shape[1], width), dtype)
                for name, ((heads, width), dtype) in self.decoder.shapes()
            }
            self._filling = _Filling(
                slot=slot,
                request=request,
                ids=ids,
                mask=mask,
                positions=positions,
                offset=padding // self.chunk * self.chunk,
                past=past,
                past_mask=jnp.zeros((1, ids.shape[1]), jnp.int64),
            )
            self._fill()
            return
        try:
            self.past, self.mask, self.seen, self.keys, token = self._join_program(
                self.decoder.model.params, ids, mask, positions, *self._slot_state(),
                *self._joining(slot, request, ids),
            )  # fmt: skip
        except Exception as error:  # a request the model refuses fails alone
            request.future.set_exception(error)
            return
        self._placed(slot, request, ids, positions, int(token))

    def _fill(self) -> None:
        """The next chunk of the prompt being prefilled; after the last, it takes its slot."""
        f = self._filling
        part = slice(f.offset, f.offset + self.chunk)
        try:
            logits, f.past, f.past_mask = self._extend(
                self.decoder.model.params,
                f.ids[:, part],
                f.mask[:, part],
                f.positions[:, part],
                f.offset,
                f.past,
                f.past_mask,
            )
        except Exception as error:
            self._filling = None
            f.request.future.set_exception(error)
            return
        f.offset += self.chunk
        if f.offset == f.ids.shape[1]:
            self._filling = None
            try:
                self.past, self.mask, self.seen, self.keys, token = self._place_program(
                    *self._slot_state(), logits, f.past, f.past_mask,
                    *self._joining(f.slot, f.request, f.ids),
                )  # fmt: skip
            except Exception as error:
                f.request.future.set_exception(error)
                return
            self._placed(f.slot, f.request, f.ids, f.positions, int(token))

    def _slot_state(self) -> tuple:
        return self.past, self.mask, self.seen, self.keys

    def _joining(self, slot: int, request: _Request, ids: np.ndarray) -> tuple:
        """The join programs' arguments after the slots' state: the slot, the tokens the
        request's prompt has seen, its key and its options."""
        seen = np.zeros((1, self.decoder.vocab_size), bool)
        np.put_along_axis(seen, ids, True, axis=1)  # the pads too, as transformers counts them
        return (slot, seen, request.key, *self._options([request]))

    def _placed(self, slot, request, ids, positions, token: int) -> None:
        """`request` holds `slot` from its prompt's last position on; `token` is its first."""
        self._rows[slot] = request
        self.next_position[slot] = positions[0, -1] + 1
        self.write[slot] = ids.shape[1]
        self._take(slot, token)

    def _advance(self) -> None:
        """One step of the running requests' rows (with free ones up to a power of two of
        rows); the tokens go to their requests."""
        running = [slot for slot, r in enumerate(self._rows) if r is not None]
        free = [slot for slot, r in enumerate(self._rows) if r is None]
        count = min(self.size, pow2(len(running), 1))
        rows = np.array(running + free[: count - len(running)], np.int32)
        # Indexing copies: on the CPU a numpy argument may be the device buffer itself, and
        # these change in place between steps.
        tokens, new, self.seen = self._step(
            self.decoder.model.params,
            rows,
            self.tokens[rows],
            self.next_position[rows],
            self.past,
            self.mask,
            self.seen,
            self.keys,
            *self._options([self._rows[slot] for slot in rows]),
            window=min(self.length, pow2(int(self.write.max()) + 1, MIN_PAST_BUCKET)),
        )
        self.past, self.mask = self._write(self.past, self.mask, rows, self.write[rows], new)
        # Free rows stay at 0, so that their writes stay inside the smallest window.
        self.next_position[running] += 1
        self.write[running] += 1
        if telemetry.listening("transmuter.serving.batch"):
            telemetry.emit("transmuter.serving.batch", {"items": len(running), "requests": len(running),
                           "queued": self.queued}, {"pipeline": "continuous"})  # fmt: skip
        for slot, token in zip(running, np.asarray(tokens).tolist()):
            self._take(slot, token)

    @staticmethod
    def _options(rows: Sequence[_Request | None]) -> tuple:
        """Each row's (step, temperature, top_k, top_p, repetition penalty, min new tokens); a
        free slot's are a greedy row's. Host arrays: building device arrays one by one cost
        more than the step itself."""
        return (
            np.array([len(r.tokens) if r else 0 for r in rows], np.int32),
            np.array([r.temperature if r else 0.0 for r in rows], np.float32),
            np.array([r.top_k if r else 0 for r in rows], np.int32),
            np.array([r.top_p if r else 1.0 for r in rows], np.float32),
            np.array([r.repetition_penalty if r else 1.0 for r in rows], np.float32),
            np.array([r.min_new_tokens if r else 0 for r in rows], np.int32),
        )

    def _take(self, slot: int, token: int) -> None:
        """Give `token` to the request in `slot`; a finished one leaves its slot."""
        request = self._rows[slot]
        if request.future in self._gone:
            with self._lock:
                self._gone.discard(request.future)
            self._rows[slot] = None
            self.write[slot] = self.next_position[slot] = 0
            request.future.set_exception(ClientGone("the caller went away; its slot is free"))
            return
        request.tokens.append(token)
        self.tokens[slot] = token
        watcher = request.watcher
        try:
            stopped = watcher is not None and watcher(0, token)
            done = token in self.eos or stopped or len(request.tokens) >= request.max_new_tokens
            if done and watcher is not None:
                watcher.flush()
        except Exception as error:  # its streaming callback failed: that request ends
            self._rows[slot] = None
            request.future.set_exception(error)
            return
        if done:
            self._rows[slot] = None
            self.write[slot] = self.next_position[slot] = 0
            request.future.set_result(request.tokens)

    # --- the programs (traced) -------------------------------------------------------------

    def _join_fn(self, params, ids, prompt_mask, positions, past, mask, seen, keys, *joining):
        logits, row_past, row_mask = self.decoder.prefill_past(
            params, ids, prompt_mask, positions, ids.shape[1]
        )
        return self._place_fn(past, mask, seen, keys, logits, row_past, row_mask, *joining)

    def _place_fn(self, past, mask, seen, keys, logits, row_past, row_mask, slot, row_seen,
                  key, *options):  # fmt: skip
        """The prompt's keys, values and mask at the start of `slot` (the rest of its mask
        cleared), its seen tokens and key; and its first token."""
        self.programs += 1
        past = {
            name: jax.lax.dynamic_update_slice(past[name], row_past[name], (slot, 0, 0, 0))
            for name in past
        }
        row_mask = (
            jnp.zeros((1, mask.shape[1]), mask.dtype).at[:, : row_mask.shape[1]].set(row_mask)
        )
        token = choose_rows(logits, row_seen, options[0], key, *options[1:], eos=self.eos)[0]
        return (
            past,
            jax.lax.dynamic_update_slice(mask, row_mask, (slot, 0)),
            seen.at[slot].set(row_seen[0]).at[slot, token].set(True),
            keys.at[slot].set(key[0]),
            token,
        )

    def _extend_fn(self, params, ids, mask, positions, offset, past, past_mask):
        self.programs += 1
        return self.decoder.extend_past(params, ids, mask, positions, offset, past, past_mask)

    def _step_fn(self, params, rows, tokens, positions, past, mask, seen, keys, *options, window):
        """The next token and new keys and values of the slots `rows`, reading the buffers'
        first `window` positions. The write is another program: one that reads a buffer and
        also updates it in place gets a copy of the whole buffer from XLA (1.2 s against 0.1 s
        a step for a GPT-2-small-sized model's 16 slots)."""
        self.programs += 1
        view = {name: value[rows, :, :window] for name, value in past.items()}
        logits, new = self.decoder.step_past(params, tokens, positions, view, mask[rows, :window])
        chosen = choose_rows(logits, seen[rows], options[0], keys[rows], *options[1:], eos=self.eos)
        return chosen, new, seen.at[rows, chosen].set(True)


def _write_rows(past, mask, rows, write, new):
    """Each row's new key and value into the buffers at its own `write` index, in place."""
    past = {name: past[name].at[rows, :, write].set(new[name].astype(past[name].dtype))
            for name in past}  # fmt: skip
    return past, mask.at[rows, write].set(1)


def choose_rows(logits, seen, steps, keys, temperature, top_k, top_p, penalty, min_new, eos):
    """Each row's next token with its own options, in the order of `generation.choose`:
    repetition penalty, no end of sequence before `min_new` tokens, then greedy (temperature
    0) or temperature, top-k and top-p before sampling from the row's key folded with its
    step. Each row's k is data, not a static size: the k-th largest is read from the sorted
    row that top-p sorts anyway."""
    logits = logits.astype(jnp.float32)
    factor = penalty[:, None]
    penalized = jnp.where(logits < 0, logits * factor, logits / factor)
    logits = jnp.where(seen & (factor != 1.0), penalized, logits)
    if eos:
        blocked = jnp.zeros(logits.shape[-1], bool).at[jnp.asarray(eos)].set(True)
        logits = jnp.where((steps < min_new)[:, None] & blocked, -jnp.inf, logits)
    greedy = jnp.argmax(logits, axis=-1)
    # The sort, softmax and draws cost more than a tiny model's step: run them only when some
    # row samples.
    return jax.lax.cond(
        jnp.any(temperature > 0),
        lambda: _sampled(logits, greedy, steps, keys, temperature, top_k, top_p),
        lambda: greedy,
    )


def _sampled(logits, greedy, steps, keys, temperature, top_k, top_p):
    """Each sampling row's draw after its temperature, top-k and top-p; greedy rows' `greedy`."""
    scaled = logits / jnp.where(temperature > 0, temperature, 1.0)[:, None]
    ordered = jnp.sort(scaled, axis=-1)[:, ::-1]
    k = jnp.clip(top_k, 1, logits.shape[-1])[:, None]
    kth = jnp.where(top_k[:, None] > 0, jnp.take_along_axis(ordered, k - 1, axis=-1), -jnp.inf)
    scaled = jnp.where(scaled < kth, -jnp.inf, scaled)  # ties with the k-th stay, as lax.top_k's
    ordered = jnp.where(ordered < kth, -jnp.inf, ordered)
    probs = jax.nn.softmax(ordered, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # keep the fewest reaching top_p, at least one
    cutoff = jnp.min(jnp.where(before < top_p[:, None], ordered, jnp.inf), axis=-1)
    scaled = jnp.where((top_p[:, None] < 1.0) & (scaled < cutoff[:, None]), -jnp.inf, scaled)
    draw = jax.vmap(
        lambda key, step, row: jax.random.categorical(jax.random.fold_in(key, step), row)
    )
    return jnp.where(temperature > 0, draw(keys, steps, scaled), greedy)
