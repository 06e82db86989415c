"""transmuter.Serving: concurrent requests gathered into few pipeline calls, each caller given
its own rows; bucket keys and options kept apart; a bounded queue, cancellation, one bad
request failing alone, a clean close. A list-doubling pipeline stands in for a model where the
mechanism is the point; the bert fixture repo checks the rows are the pipeline's own."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import CancelledError, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import transmuter
from transmuter.errors import InputError, Overloaded, ServingClosed
from transmuter.serving import Serving

REPOS = Path(__file__).resolve().parents[1] / "fixtures" / "pipelines"


class Doubling:
    """Doubles numbers; records each call's items; `gate` (an Event) holds calls until set;
    the item "bad" makes a call fail, as a pipeline's input check does."""

    def __init__(self, gate: threading.Event | None = None):
        self.calls: list[list] = []
        self.gate = gate

    def __call__(self, items, scale=2):
        self.calls.append(list(items))
        if self.gate is not None:
            self.gate.wait(10)
        if "bad" in items:
            raise InputError("'bad' is not a number")
        return [x * scale for x in items]

    def batch_key(self, item):
        return 0 if item == "bad" else len(str(item))


def test_concurrent_callers_share_calls_and_get_their_own_rows():
    pipeline = Doubling()
    with Serving(pipeline, batch_size=8, batch_timeout_ms=200) as serving:
        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(serving, range(10, 26)))
    assert got == [2 * x for x in range(10, 26)]
    assert len(pipeline.calls) <= 4 and all(len(c) <= 8 for c in pipeline.calls)
    assert sorted(x for c in pipeline.calls for x in c) == list(range(10, 26))


def test_a_list_request_gets_a_list_and_one_item_gets_its_row():
    with Serving(Doubling(), batch_timeout_ms=0) as serving:
        assert serving([1, 2, 3]) == [2, 4, 6]
        assert serving((4,)) == [8]
        assert serving(5) == 10
        with pytest.raises(InputError, match="non-empty list"):
            serving([])


def test_bucket_keys_and_options_batch_apart():
    pipeline = Doubling()
    with Serving(pipeline, batch_size=16, batch_timeout_ms=200) as serving:
        futures = [serving.submit(x) for x in (1, 22, 3, 44)]
        futures += [serving.submit(5, scale=3)]
        assert [f.result() for f in futures] == [2, 44, 6, 88, 15]
    # 1 and 3 (one digit), 22 and 44 (two), 5 at another scale: three calls.
    assert sorted(map(sorted, pipeline.calls)) == [[1, 3], [5], [22, 44]]


def test_a_full_queue_refuses_and_a_cancelled_request_frees_its_place():
    gate = threading.Event()
    pipeline = Doubling(gate)
    serving = Serving(pipeline, batch_size=1, batch_timeout_ms=0, max_queue=2)
    running = serving.submit(1)
    while not pipeline.calls:  # the worker has taken it: the queue is empty again
        time.sleep(0.01)
    waiting = [serving.submit(2), serving.submit(3)]
    with pytest.raises(Overloaded, match=r"2 requests are waiting \(max_queue=2\)"):
        serving.submit(4)
    assert waiting[0].cancel() and serving.queued == 1
    late = serving.submit(5)  # the cancelled request's place
    gate.set()
    assert [running.result(), waiting[1].result(), late.result()] == [2, 6, 10]
    with pytest.raises(CancelledError):
        waiting[0].result()
    assert [c for c in pipeline.calls] == [[1], [3], [5]]  # 2 never ran
    serving.close()


def test_a_bad_request_fails_alone():
    pipeline = Doubling()
    pipeline.batch_key = None  # everything in one bucket, so "bad" shares a batch
    with Serving(pipeline, batch_size=8, batch_timeout_ms=200) as serving:
        futures = [serving.submit(x) for x in (1, "bad", [2, 3])]
        assert futures[0].result() == 2 and futures[2].result() == [4, 6]
        with pytest.raises(InputError, match="'bad' is not a number"):
            futures[1].result()
    assert pipeline.calls[0] == [1, "bad", 2, 3]  # together first, then one at a time


def test_close_finishes_what_is_queued_then_refuses():
    gate = threading.Event()
    serving = Serving(Doubling(gate), batch_size=1, batch_timeout_ms=0)
    futures = [serving.submit(x) for x in range(4)]
    closer = threading.Thread(target=serving.close)
    closer.start()
    time.sleep(0.05)
    with pytest.raises(ServingClosed):
        serving.submit(9)
    gate.set()
    closer.join(10)
    assert [f.result(0) for f in futures] == [0, 2, 4, 6]


def test_asyncio_callers_batch_together():
    pipeline = Doubling()

    async def main(serving):
        return await asyncio.gather(*(serving.infer(x) for x in range(10, 22)))

    with Serving(pipeline, batch_size=8, batch_timeout_ms=100) as serving:
        assert asyncio.run(main(serving)) == [2 * x for x in range(10, 22)]
    assert [len(c) for c in pipeline.calls] == [8, 4]


def test_options_are_checked():
    with pytest.raises(InputError, match="batch_size and max_queue must be at least 1"):
        Serving(Doubling(), batch_size=0)


@pytest.fixture(scope="module")
def embeddings():
    return transmuter.pipeline("feature-extraction", REPOS / "bert", pooling="mean")


def test_a_pipelines_rows_under_concurrency_are_its_own(embeddings):
    texts = [f"sentence number {i} " + "word " * (i % 5) for i in range(12)]
    want = [embeddings(t) for t in texts]
    batches = []
    transmuter.telemetry.attach("test-batches", ["transmuter.serving.batch"],
                                lambda e, m, meta: batches.append(m["items"]))  # fmt: skip
    try:
        with Serving(embeddings, batch_size=4, batch_timeout_ms=100) as serving:
            assert serving.warmup(["warm up"]) == 3  # batch sizes 1, 2, 4
            assert serving.ready
            warm = len(batches)
            with ThreadPoolExecutor(12) as pool:
                got = list(pool.map(serving, texts))
    finally:
        transmuter.telemetry.detach("test-batches")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert len(batches) - warm < len(texts) and max(batches[warm:]) <= 4
