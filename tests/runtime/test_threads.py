"""Threads sharing one compiled model: each new shape compiles once, and every thread gets the
answer a single thread gets."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import transmuter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models"


def encoder_inputs(sequence: int) -> dict[str, np.ndarray]:
    ids = (np.arange(sequence, dtype=np.int64) * 7 % 100)[None]
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": ids * 0}


@pytest.mark.slow
def test_threads_hitting_new_shapes_compile_each_once():
    model = transmuter.load(FIXTURES / "bert.onnx")
    compiled = transmuter.compile(model, encoder_inputs(4))
    compiles, events = [], []
    transmuter.telemetry.attach(
        "threads", ["transmuter.segment.compile.stop", "transmuter.cache.hit"],
        lambda event, m, metadata: (compiles if "compile" in event else events).append(metadata),
    )  # fmt: skip
    start, answers = threading.Barrier(8), []

    def serve(worker: int) -> None:
        start.wait()
        for n in (5, 6, 7, 5, 6, 7):
            answers.append((n, np.asarray(compiled(encoder_inputs(n))["last_hidden_state"])))

    try:
        threads = [threading.Thread(target=serve, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        transmuter.telemetry.detach("threads")
    assert not any(t.is_alive() for t in threads) and len(answers) == 8 * 6
    want = {n: np.asarray(compiled(encoder_inputs(n))["last_hidden_state"]) for n in (5, 6, 7)}
    assert all(np.array_equal(got, want[n]) for n, got in answers)
    assert sorted(m["shapes"][0][1][0] for m in compiles) == [(1, 5), (1, 6), (1, 7)]
    assert len(events) == 8 * 6 - 3  # every other call is a hit, some after waiting
