"""`Serving`: many callers, few device calls.

Callers in threads (`submit`, `__call__`) or asyncio (`infer`) hand in requests; one worker
thread gathers the requests of one batch key (the pipeline's `batch_key` of their items, e.g.
a text's sequence bucket, and the call options) until they hold `batch_size` items or the
oldest has waited `batch_timeout_ms`, runs the pipeline once on all their items, and gives each
caller its own rows.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from transmuter import telemetry
from transmuter.errors import InputError, Overloaded, ServingClosed


@dataclass
class _Request:
    items: list
    single: bool
    options: dict
    key: Hashable
    arrived: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)


class Serving:
    """Batches concurrent requests to `pipeline` (any `transmuter.pipeline(...)` callable, or a
    function taking a list of items and returning a row per item).

    `batch_size`: items per pipeline call; `batch_timeout_ms`: how long the oldest request
    waits for others to join; `max_queue`: requests waiting beyond the running batch before
    `submit` refuses with `Overloaded`. A request is one item or a list of items (a list longer
    than `batch_size` runs alone; the pipeline splits it). A request that fails fails alone:
    when a batch raises, its requests run again one at a time.
    """

    def __init__(
        self,
        pipeline: Callable[..., Any],
        *,
        batch_size: int = 8,
        batch_timeout_ms: float = 5.0,
        max_queue: int = 1024,
    ):
        if batch_size < 1 or max_queue < 1 or batch_timeout_ms < 0:
            raise InputError(
                "batch_size and max_queue must be at least 1 and batch_timeout_ms at least 0; "
                f"got {batch_size}, {max_queue}, {batch_timeout_ms}"
            )
        self.pipeline = pipeline
        self.batch_size = batch_size
        self.batch_timeout = batch_timeout_ms / 1000
        self.max_queue = max_queue
        self.ready = False  # set by warmup()
        self._item_key = getattr(pipeline, "batch_key", None)
        # A task (pipelines/base.py) answers a list of items with a result per item, and says
        # what one item alone gets; a plain function is called on the list.
        self._run_items = getattr(pipeline, "run_items", pipeline)
        self._single = getattr(pipeline, "single", None) or (lambda result, item, options: result)
        self._lock = threading.Condition(threading.RLock())
        self._waiting: dict[Hashable, deque[_Request]] = {}
        self._queued = 0
        self._closing = False
        self._worker = threading.Thread(target=self._serve, name="transmuter-serving", daemon=True)
        self._worker.start()

    @property
    def queued(self) -> int:
        """Requests waiting for a batch (not counting the one running)."""
        return self._queued

    def submit(self, inputs: Any, **options: Any) -> Future:
        """Queue a request; its Future gives what `pipeline(inputs, **options)` would return.
        Cancelling the Future before its batch starts takes it out of the queue."""
        items, single = _items(inputs)
        key = (_frozen(options), max(map(self._item_key, items)) if self._item_key else None)
        request = _Request(items, single, options, key)
        with self._lock:
            if self._closing:
                raise ServingClosed("this Serving is closed; it takes no new requests")
            if self._queued >= self.max_queue:
                raise Overloaded(
                    f"{self._queued} requests are waiting (max_queue={self.max_queue}); retry later"
                )
            self._waiting.setdefault(key, deque()).append(request)
            self._queued += 1
            self._lock.notify_all()
        request.future.add_done_callback(lambda _: self._forget(request))
        return request.future

    def __call__(self, inputs: Any, **options: Any) -> Any:
        """`submit` and wait for the result (its error raised here)."""
        return self.submit(inputs, **options).result()

    async def infer(self, inputs: Any, **options: Any) -> Any:
        """`submit` for asyncio; cancelling the awaiting task cancels a request still queued."""
        return await asyncio.wrap_future(self.submit(inputs, **options))

    def warmup(self, examples: Sequence[Any], **options: Any) -> int:
        """Compile ahead of traffic: each example item as a request of every batch size the
        pipeline's buckets round to (1, 2, 4, ... up to batch_size), through the queue like any
        request; returns the number of requests. Sets `ready`."""
        doublings = (self.batch_size - 1).bit_length() + 1
        sizes = sorted({min(1 << i, self.batch_size) for i in range(doublings)})
        for example in examples:
            for size in sizes:
                self.submit([example] * size, **options).result()
        self.ready = True
        return len(examples) * len(sizes)

    def close(self, timeout: float | None = None) -> None:
        """Refuse new requests, finish the queued and running ones, stop the worker."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        self._worker.join(timeout)

    def __enter__(self) -> Serving:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _forget(self, request: _Request) -> None:
        """A cancelled request leaves the queue at once, freeing its place."""
        if not request.future.cancelled():
            return
        with self._lock:
            queue = self._waiting.get(request.key)
            if queue is not None and request in queue:
                queue.remove(request)
                self._queued -= 1
                if not queue:
                    del self._waiting[request.key]

    def _serve(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._run(batch)

    def _next_batch(self) -> list[_Request] | None:
        """The requests of the key whose oldest request came first, once they fill a batch or
        that request has waited batch_timeout; None when closed and drained."""
        with self._lock:
            while True:
                if not self._waiting:
                    if self._closing:
                        return None
                    self._lock.wait()
                    continue
                key = min(self._waiting, key=lambda k: self._waiting[k][0].arrived)
                queue = self._waiting[key]
                wait = queue[0].arrived + self.batch_timeout - time.monotonic()
                if sum(len(r.items) for r in queue) >= self.batch_size or wait <= 0:
                    break
                if self._closing:
                    break
                self._lock.wait(wait)
            batch, size = [], 0
            while queue and (not batch or size + len(queue[0].items) <= self.batch_size):
                request = queue.popleft()
                batch.append(request)
                size += len(request.items)
            if not queue:
                del self._waiting[key]
            self._queued -= len(batch)
            return batch

    def _run(self, batch: list[_Request]) -> None:
        live = [r for r in batch if r.future.set_running_or_notify_cancel()]
        if not live:
            return
        items = [item for r in live for item in r.items]
        start = time.monotonic()
        try:
            rows, failed = self._run_items(items, **live[0].options), None
        except Exception as error:
            rows, failed = None, error
        if telemetry.listening("transmuter.serving.batch"):
            telemetry.emit(
                "transmuter.serving.batch",
                {"items": len(items), "requests": len(live),
                 "duration": time.monotonic() - start, "queued": self._queued},
                {"pipeline": type(self.pipeline).__name__, "failed": failed is not None},
            )  # fmt: skip
        if failed is not None:
            if len(live) == 1:
                live[0].future.set_exception(failed)
            else:
                for request in live:  # find the request that failed; the others succeed
                    self._run_alone(request)
            return
        at = 0
        for request in live:
            mine = rows[at : at + len(request.items)]
            at += len(request.items)
            request.future.set_result(self._answer(request, mine))

    def _run_alone(self, request: _Request) -> None:
        try:
            rows = self._run_items(request.items, **request.options)
        except Exception as error:
            request.future.set_exception(error)
        else:
            request.future.set_result(self._answer(request, rows))

    def _answer(self, request: _Request, rows: list) -> Any:
        if not request.single:
            return rows
        return self._single(rows[0], request.items[0], request.options)


def _items(inputs: Any) -> tuple[list, bool]:
    """A request's items and whether it was one item: a list or tuple is a batch of items."""
    if isinstance(inputs, (list, tuple)):
        if not inputs:
            raise InputError("a request needs an item or a non-empty list of items")
        return list(inputs), False
    return [inputs], True


def _frozen(options: dict) -> Hashable:
    """The options as a hashable key, so that only requests asking the same batch together."""
    return tuple(sorted((k, repr(v)) for k, v in options.items()))
