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


# -- the contract: the worker never dies and never mixes ----------------------------------------


class Raising:
    """Doubles numbers; raises `error` on the item "boom", wherever it is in the batch."""

    def __init__(self, error: BaseException):
        self.error, self.calls = error, []

    def run_items(self, items):
        self.calls.append(list(items))
        if "boom" in items:
            raise self.error
        return [x * 2 for x in items]


@pytest.mark.parametrize(
    "error",
    [
        ValueError("bad value"),
        MemoryError("out of memory"),
        GeneratorExit("odd"),
        transmuter.errors.NodeError("node n1 failed"),
    ],  # fmt: skip
    ids=lambda e: type(e).__name__,
)
def test_a_raising_pipeline_fails_its_request_alone_and_the_worker_goes_on(error):
    pipeline = Raising(error)
    with Serving(pipeline, batch_size=8, batch_timeout_ms=200) as serving:
        futures = [serving.submit(x) for x in (1, "boom", [2, 3])]
        assert futures[0].result(10) == 2 and futures[2].result(10) == [4, 6]
        with pytest.raises(type(error), match=str(error)):
            futures[1].result(10)
        assert serving.submit(7).result(10) == 14  # the next request is served
    assert pipeline.calls[0] == [1, "boom", 2, 3]


def test_a_wrong_row_count_fails_the_batch_naming_the_pipeline():
    def collapsing(items):  # fill-mask's old habit: one item gives a bare row
        return items[0] * 2 if len(items) == 1 else [x * 2 for x in items] + [0]

    with Serving(collapsing, batch_timeout_ms=0) as serving:
        with pytest.raises(transmuter.serving.batching.ContractError, match=r"collapsing .*int"):
            serving(3)
        with pytest.raises(transmuter.serving.batching.ContractError,
                           match=r"collapsing returned 3 rows for 2 items"):  # fmt: skip
            serving([1, 2])
        assert serving.submit([4, 5]).exception(10) is not None  # still answering


def test_errors_in_single_batch_key_and_telemetry_stay_with_their_request():
    class Picky:
        def run_items(self, items):
            return [x * 2 for x in items]

        def single(self, result, item, options):
            if item == 13:
                raise RuntimeError("unlucky")
            return result

        def batch_key(self, item):
            if item == 99:
                raise KeyError("no bucket for 99")
            return 0

    def broken_handler(event, measurements, metadata):
        raise RuntimeError("metrics down")

    transmuter.telemetry.attach("test-broken", ["transmuter.serving.batch"], broken_handler)
    try:
        with Serving(Picky(), batch_size=8, batch_timeout_ms=100) as serving:
            futures = [serving.submit(x) for x in (1, 13, 99, 2)]
            assert futures[0].result(10) == 2 and futures[3].result(10) == 4
            with pytest.raises(RuntimeError, match="unlucky"):
                futures[1].result(10)
            with pytest.raises(KeyError, match="no bucket for 99"):
                futures[2].result(10)
            assert serving(5) == 10
    finally:
        transmuter.telemetry.detach("test-broken")


def test_systemexit_in_a_pipeline_answers_everyone_then_refuses():
    gate = threading.Event()

    def exiting(items):
        gate.wait(10)
        if "exit" in items:
            raise SystemExit(3)
        return items

    serving = Serving(exiting, batch_size=1, batch_timeout_ms=0)
    first = serving.submit("exit")
    queued = serving.submit("next")
    gate.set()
    with pytest.raises(SystemExit):
        first.result(10)
    with pytest.raises(ServingClosed, match="worker stopped: SystemExit"):
        queued.result(10)
    with pytest.raises(ServingClosed):
        serving.submit("later")


def test_batch_keys_digest_contents_not_reprs():
    from transmuter.serving.batching import digest

    a = np.zeros((64, 64, 3), np.uint8)
    b = a.copy()
    b[32, 32, 1] = 1  # same corners: numpy's repr of both is the same
    assert repr(a) == repr(b) and digest({"image": a}) != digest({"image": b})
    assert digest({"image": a}) == digest({"image": a.copy()})
    assert digest(a) != digest(a.astype(np.int8)) != digest(a.reshape(64, 192, 1))
    assert digest({"x": [1, {"y": 2.5}]}) == digest({"x": [1, {"y": 2.5}]})
    assert digest({"x": 1}) != digest({"x": 1.0}) != digest({"x": "1"}) != digest({"x": True})
    assert digest({"a": 1, "b": 2}) == digest({"b": 2, "a": 1})
    assert digest([1, 2]) != digest((1, 2)) and digest(0.1 + 0.2) != digest(0.3)


def test_requests_with_large_arrays_sharing_corners_batch_apart():
    def painting(items, image):  # stands in for image-to-image: the rows depend on the option
        return [int(image.sum()) + x for x in items]

    a = np.zeros((2000,), np.int64)
    b = a.copy()
    b[1000] = 5
    with Serving(painting, batch_size=8, batch_timeout_ms=200) as serving:
        futures = [serving.submit(1, image=a), serving.submit(1, image=b)]
        assert [f.result(10) for f in futures] == [1, 6]


@pytest.fixture(scope="module")
def answering():
    return transmuter.pipeline("question-answering", REPOS / "bert-qa")


def test_one_question_alone_and_among_others_answers_as_the_pipeline(answering):
    questions = [
        {"question": "who went home?", "context": "Alice went home after the party."},
        {"question": "what color?", "context": "The sky was blue and the grass green."},
        {"question": "where?", "context": "They met in Paris in spring."},
    ]
    want = [answering(q) for q in questions]
    with Serving(answering, batch_size=4, batch_timeout_ms=100) as serving:
        assert serving.submit(questions[0]).result(60) == want[0]  # alone: the probe
        with ThreadPoolExecutor(3) as pool:
            same_answers(list(pool.map(serving, questions)), want)
        same_answers(serving(questions[:2]), want[:2])
        same_answers(serving(questions[1], top_k=2), answering(questions[1], top_k=2))


def same_answers(got, want):
    """Equal answers, scores within float noise (a batch pads its texts to one length)."""
    assert type(got) is type(want) and len(got) == len(want)
    for g, w in zip(got, want):
        assert {**g, "score": 0} == {**w, "score": 0}
        assert g["score"] == pytest.approx(w["score"], rel=1e-5)


def test_requests_whose_options_differ_only_in_type_batch_apart():
    def echo(items, top_k):  # stands in for a task whose option check differs by type
        return [f"{item}:{type(top_k).__name__}" for item in items]

    with Serving(echo, batch_size=8, batch_timeout_ms=200) as serving:
        futures = [serving.submit("x", top_k=k) for k in (1, 1.0, True, 1)]
        assert [f.result(10) for f in futures] == ["x:int", "x:float", "x:bool", "x:int"]
