"""Continuous batching (`ContinuousGeneration`): requests join a running decode batch of fixed
slots and leave when done; each gets the tokens it gets alone from `TextGeneration.generate`
(greedy, with its own repetition penalty and minimum length), streams and stops as it would
alone; a seed repeats a sample; the programs compiled once serve every later mix of requests."""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import pytest
from conftest import REPOS

import transmuter
from transmuter.errors import InputError, Overloaded, ServingClosed
from transmuter.pipelines.generation.continuous import ContinuousGeneration, choose_rows

PROMPTS = ["Once upon a time", "Hello", "The quick brown fox jumps", "a",
           "One two three four five six seven eight nine ten eleven twelve"]  # fmt: skip


@pytest.fixture(scope="module")
def gpt2():
    return transmuter.pipeline("text-generation", REPOS / "gpt2")


@pytest.fixture(scope="module")
def engine(gpt2):
    engine = ContinuousGeneration(gpt2, slots=3)
    yield engine
    engine.close()


def alone(pipeline, ids, **options):
    return pipeline.generate([ids], **{"do_sample": False, **options})[0]


def test_requests_joining_and_leaving_get_their_tokens_alone(gpt2, engine):
    ids = [gpt2.tokenizer.encode(p).ids for p in PROMPTS]
    options = [{"max_new_tokens": n} for n in (20, 5, 33, 12, 40)]
    options[1]["repetition_penalty"] = 1.3
    options[3]["min_new_tokens"] = 12
    futures = []
    for i, (prompt, option) in enumerate(zip(ids, options)):
        futures.append(engine.submit(prompt, do_sample=False, **option))
        time.sleep(0.02 * i)  # later ones join a running batch; five requests, three slots
    got = [f.result(120) for f in futures]
    assert got == [alone(gpt2, p, **o) for p, o in zip(ids, options)]
    before = engine.programs
    assert engine.submit(ids[0], max_new_tokens=3).result(60) == got[0][:3]
    assert engine.programs == before  # steps and prompt buckets are compiled once


def test_warmup_compiles_a_step_for_every_count_of_running_requests(gpt2):
    engine = ContinuousGeneration(gpt2, slots=4, max_queue=1)  # warm-up is not traffic
    prompt = gpt2.tokenizer.encode("Hello").ids
    try:
        assert engine.warmup(prompt) == 4  # the join, and the steps of 1, 2 and 4 rows
        before = engine.programs
        futures = []
        for n in (30, 9, 20, 3, 12):
            futures.append(engine.submit(prompt, max_new_tokens=n))
            while engine.queued:  # max_queue=1: each waits for its slot before the next
                time.sleep(0.01)
        assert [f.result(60) for f in futures] == [
            alone(gpt2, prompt, max_new_tokens=n) for n in (30, 9, 20, 3, 12)
        ]
        assert engine.programs == before  # every mix of up to 4 requests, within 64 positions
    finally:
        engine.close()


def test_stop_strings_and_streaming_are_the_pipelines(gpt2, engine):
    prompt = gpt2.tokenizer.encode(PROMPTS[0]).ids
    text = gpt2.tokenizer.decode(alone(gpt2, prompt, max_new_tokens=20), skip_special_tokens=True)
    stop = text[6:9]
    pieces = []
    got = engine.submit(prompt, max_new_tokens=20, stop=[stop],
                        on_token=lambda row, piece: pieces.append(piece)).result(60)  # fmt: skip
    assert got == alone(gpt2, prompt, max_new_tokens=20, stop=[stop])
    assert "".join(pieces) == gpt2.tokenizer.decode(got, skip_special_tokens=True)


def test_a_seed_repeats_a_sample(gpt2, engine):
    prompt = gpt2.tokenizer.encode("Hello").ids
    sample = dict(max_new_tokens=12, do_sample=True, temperature=0.9, top_p=0.95, top_k=0)
    first = engine.submit(prompt, seed=3, **sample)
    second = engine.submit(prompt, seed=3, **sample)  # in the batch beside the first
    assert first.result(60) == second.result(60)
    assert first.result() != alone(gpt2, prompt, max_new_tokens=12)  # it did sample
    # Each row's own k: k=1 samples the greedy token, beside rows with other k.
    rows = [
        engine.submit(prompt, seed=s, **{**sample, "top_k": k}) for s, k in enumerate((1, 5, 1))
    ]
    assert rows[0].result(60) == rows[2].result(60) == alone(gpt2, prompt, max_new_tokens=12)
    assert rows[1].result(60) != rows[0].result()
    with pytest.raises(InputError, match="top_k must be 0"):
        engine.submit(prompt, do_sample=True, top_k=-1)


def test_top_k_per_row_keeps_the_k_largest():
    # Row 0 k=2, row 1 k=0 (every token), row 2 k past the vocabulary: the draws each allows.
    logits = jnp.log(jnp.array([[0.1, 0.4, 0.2, 0.3]] * 3))
    drawn = [set(), set(), set()]
    choose = jax.jit(choose_rows, static_argnames="eos")  # as the step runs it: one compile
    for step in range(200):
        keys = jax.random.split(jax.random.key(step), 3)
        tokens = choose(
            logits, jnp.zeros((3, 4), bool), jnp.zeros(3, jnp.int32), keys,
            temperature=jnp.ones(3), top_k=jnp.array([2, 0, 9]), top_p=jnp.ones(3),
            penalty=jnp.ones(3), min_new=jnp.zeros(3, jnp.int32), eos=(),
        )  # fmt: skip
        for row, token in enumerate(tokens.tolist()):
            drawn[row].add(token)
    assert drawn == [{1, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}]


def test_a_failing_callback_ends_only_its_request(gpt2, engine):
    prompt = gpt2.tokenizer.encode("Hello").ids

    def broken(row, piece):
        raise RuntimeError("client gone")

    failing = engine.submit(prompt, max_new_tokens=30, on_token=broken)
    fine = engine.submit(prompt, max_new_tokens=10)
    with pytest.raises(RuntimeError, match="client gone"):
        failing.result(60)
    assert fine.result(60) == alone(gpt2, prompt, max_new_tokens=10)


def test_bad_requests_full_queues_and_close(gpt2):
    engine = ContinuousGeneration(gpt2, slots=1, max_queue=1)
    prompt = gpt2.tokenizer.encode("Hello").ids
    with pytest.raises(InputError, match="need 129 positions; the model has 128"):
        engine.submit(prompt, max_new_tokens=128 - len(prompt) + 1)
    with pytest.raises(InputError, match="no option \\['beams'\\]"):
        engine.submit(prompt, beams=2)
    gate = threading.Event()
    running = engine.submit(prompt, max_new_tokens=40, on_token=lambda r, p: gate.wait(10))
    while engine.queued:  # the running one has left the queue for its slot
        time.sleep(0.01)
    waiting = engine.submit(prompt, max_new_tokens=2)
    with pytest.raises(Overloaded, match="max_queue=1"):
        engine.submit(prompt, max_new_tokens=2)
    gate.set()
    engine.close()
    assert len(running.result(0)) == 40 and len(waiting.result(0)) == 2
    with pytest.raises(ServingClosed):
        engine.submit(prompt)


def test_a_long_prompt_is_prefilled_a_chunk_between_steps(gpt2):
    engine = ContinuousGeneration(gpt2, slots=2, prefill_chunk=16)
    running = gpt2.tokenizer.encode(PROMPTS[0]).ids
    long = gpt2.tokenizer.encode(" ".join(PROMPTS[1:])).ids[:40]  # bucket 64
    assert len(running) <= 16  # prefilled at once
    steps_at_chunks = []
    fill = engine._fill

    def watched():
        steps_at_chunks.append(len(engine._rows[0].tokens) if engine._rows[0] else None)
        fill()

    engine._fill = watched
    try:
        first = engine.submit(running, max_new_tokens=30)
        while engine.active == 0:
            time.sleep(0.01)
        second = engine.submit(long, max_new_tokens=12)
        assert first.result(120) == alone(gpt2, running, max_new_tokens=30)
        assert second.result(120) == alone(gpt2, long, max_new_tokens=12)
    finally:
        engine.close()
    # Three chunks of 16 (the first, of left padding alone, skipped), the running request one
    # step further at each.
    assert len(steps_at_chunks) == 3
    assert all(b == a + 1 for a, b in zip(steps_at_chunks, steps_at_chunks[1:]))
    with pytest.raises(InputError, match="power of two"):
        ContinuousGeneration(gpt2, prefill_chunk=12)
