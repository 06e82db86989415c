"""`Serving`: many callers, few device calls.

Callers in threads (`submit`, `__call__`) or asyncio (`infer`) hand in requests; one worker
thread gathers the requests of one batch key (the pipeline's `batch_key` of their items, e.g.
a text's sequence bucket, and a digest of the call options' contents) until they hold
`batch_size` items or the oldest has waited `batch_timeout_ms`, runs the pipeline once on all
their items, and gives each caller its own rows.

The contract with a pipeline (pipelines/base.py): `run_items(items, **options)` returns one
row per item. Serving checks the count, so that a pipeline that breaks it fails its batch
with an error naming it instead of handing a caller another's rows. The worker never dies: an
exception anywhere in a batch (the pipeline, `single`, a telemetry handler) fails only that
batch's requests, each with its cause.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from transmuter import telemetry
from transmuter.errors import InputError, Overloaded, ServingClosed, TransmuterError

_log = logging.getLogger(__name__)


class ContractError(TransmuterError):
    """A pipeline broke the Serving contract (pipelines/base.py): a row count other than one
    per item. A defect of the pipeline, never of the request."""


@dataclass
class _Request:
    items: list
    single: bool
    options: dict
    key: Hashable
    arrived: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)


class Serving:
    """Batches concurrent requests to `pipeline` (any `transmuter.pipeline(...)` task, or a
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
        self.name = getattr(pipeline, "__name__", None) or type(pipeline).__name__
        self.batch_size = batch_size
        self.batch_timeout = batch_timeout_ms / 1000
        self.max_queue = max_queue
        self.ready = False  # set by warmup()
        self._item_key = getattr(pipeline, "batch_key", None)
        # A task (pipelines/base.py) splits a call's inputs into items (its `items` knows which
        # values are one item), answers a list of items with a row per item and says what one
        # item alone gets; a plain function is called on the list.
        self._split = getattr(pipeline, "items", None) or _items
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
        Cancelling the Future before its batch starts takes it out of the queue. Refusals
        (`Overloaded`, `ServingClosed`, an empty list) raise here; an item the pipeline's
        `batch_key` cannot place gives a Future failed with that error."""
        items, single = self._split(inputs)
        try:
            bucket = max(map(self._item_key, items)) if self._item_key else None
            key = (_key(options), _key(bucket))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:  # this request's fault or the pipeline's: it alone fails
            failed: Future = Future()
            failed.set_exception(error)
            return failed
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
            try:
                self._run(batch)
            except (KeyboardInterrupt, SystemExit) as error:
                # Not the batch's failure but the process's: answer everyone, then stop (a
                # thread re-raising it would stop nothing more).
                self._fail([r for r in batch if not r.future.done()], error)
                self._shut(error)
                _log.error("the serving worker stopped: %r", error)
                return
            except BaseException as error:  # a defect outside the pipeline call: this batch
                self._fail([r for r in batch if not r.future.done()], error)

    def _shut(self, error: BaseException) -> None:
        """The worker is stopping for good: refuse new requests and fail the queued ones."""
        with self._lock:
            self._closing = True
            waiting = [r for queue in self._waiting.values() for r in queue]
            self._waiting.clear()
            self._queued = 0
        closed = ServingClosed(f"the serving worker stopped: {type(error).__name__}")
        self._fail([r for r in waiting if r.future.set_running_or_notify_cancel()], closed)

    @staticmethod
    def _fail(requests: list[_Request], error: BaseException) -> None:
        for request in requests:
            if not request.future.done():
                request.future.set_exception(error)

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
        rows, failed = self._rows(items, live[0].options)
        self._emit(len(items), len(live), time.monotonic() - start, failed is not None)
        if failed is not None:
            if len(live) == 1 or isinstance(failed, (KeyboardInterrupt, SystemExit)):
                self._fail(live, failed)
                if isinstance(failed, (KeyboardInterrupt, SystemExit)):
                    raise failed
            else:
                for request in live:  # find the request that failed; the others succeed
                    self._run_alone(request)
            return
        at = 0
        for request in live:
            self._answer(request, rows[at : at + len(request.items)])
            at += len(request.items)

    def _rows(self, items: list, options: dict) -> tuple[list | None, BaseException | None]:
        """The pipeline's rows for `items`, checked against the contract, or its error."""
        try:
            rows = self._run_items(items, **options)
            if not isinstance(rows, (Sequence, np.ndarray)) or isinstance(rows, (str, bytes)):
                raise ContractError(
                    f"{self.name} returned a {type(rows).__name__} for {len(items)} items; "
                    "run_items must return a list with one row per item"
                )
            if len(rows) != len(items):
                raise ContractError(
                    f"{self.name} returned {len(rows)} rows for {len(items)} items; "
                    "run_items must return one row per item"
                )
            return rows, None
        except BaseException as error:  # noqa: B036 - anything the pipeline raises is its batch's
            return None, error

    def _emit(self, items: int, requests: int, duration: float, failed: bool) -> None:
        if not telemetry.listening("transmuter.serving.batch"):
            return
        try:
            telemetry.emit(
                "transmuter.serving.batch",
                {"items": items, "requests": requests, "duration": duration,
                 "queued": self._queued},
                {"pipeline": self.name, "failed": failed},
            )  # fmt: skip
        except Exception:  # a broken metric never costs an answer
            _log.exception("the serving batch's telemetry failed")

    def _run_alone(self, request: _Request) -> None:
        rows, failed = self._rows(request.items, request.options)
        if failed is not None:
            request.future.set_exception(failed)
            if isinstance(failed, (KeyboardInterrupt, SystemExit)):
                raise failed
        else:
            self._answer(request, rows)

    def _answer(self, request: _Request, rows: Sequence) -> None:
        """Hand `request` its rows (`single`'s answer for one item); an error there is its
        own."""
        try:
            if request.single:
                result = self._single(rows[0], request.items[0], request.options)
            else:
                result = rows
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:
            request.future.set_exception(error)
        else:
            request.future.set_result(result)


def _items(inputs: Any) -> tuple[list, bool]:
    """A request's items and whether it was one item: a list or tuple is a batch of items."""
    if isinstance(inputs, (list, tuple)):
        if not inputs:
            raise InputError("a request needs an item or a non-empty list of items")
        return list(inputs), False
    return [inputs], True


_PLAIN = (int, float, str, bool, type(None))


def _key(value: Any) -> Hashable:
    """A batch key: plain values (and flat mappings of them) as themselves with their types,
    which costs less than hashing; anything else by `digest`."""
    if type(value) in _PLAIN:
        return type(value).__name__, value
    if type(value) is dict and all(type(v) in _PLAIN for v in value.values()):
        return tuple(sorted((str(k), type(v).__name__, v) for k, v in value.items()))
    return digest(value)


def digest(value: Any) -> bytes:
    """A stable digest of `value`'s contents, so that only requests asking the same batch
    together: arrays by shape, dtype and a hash of their bytes (a repr abbreviates past 1,000
    elements), mappings and sequences recursively, numbers by type and value. An object of
    another kind is its own key (its identity), so it never shares a batch by mistake."""
    hasher = hashlib.blake2b(digest_size=16)
    _feed(hasher, value)
    return hasher.digest()


def _feed(hasher: Any, value: Any) -> None:
    def tag(name: str, payload: bytes = b"") -> None:
        hasher.update(name.encode() + b"\0" + struct.pack("<Q", len(payload)) + payload)

    if value is None or isinstance(value, bool):
        tag("const", repr(value).encode())
    elif isinstance(value, int):
        tag("int", str(value).encode())
    elif isinstance(value, float):
        tag("float", struct.pack("<d", value))
    elif isinstance(value, str):
        tag("str", value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        tag("bytes", bytes(value))
    elif isinstance(value, np.generic):
        _feed(hasher, np.asarray(value))
    elif isinstance(value, np.ndarray):
        tag("array", f"{value.dtype.str}{value.shape}".encode())
        if value.dtype.hasobject:
            for element in value.reshape(-1):
                _feed(hasher, element)
        else:
            tag("data", hashlib.blake2b(np.ascontiguousarray(value).data).digest())
    elif isinstance(value, Mapping):
        tag("map", str(len(value)).encode())
        for key in sorted(value, key=lambda k: (type(k).__name__, str(k))):
            _feed(hasher, key)
            _feed(hasher, value[key])
    elif isinstance(value, (list, tuple)):
        tag(type(value).__name__, str(len(value)).encode())
        for element in value:
            _feed(hasher, element)
    elif _is_pil_image(value):
        tag("image", f"{value.mode}{value.size}".encode())
        tag("data", hashlib.blake2b(value.tobytes()).digest())
    else:
        tag("object", f"{type(value).__qualname__}:{id(value)}".encode())


def _is_pil_image(value: Any) -> bool:
    module = type(value).__module__
    return module.startswith("PIL.") and hasattr(value, "tobytes") and hasattr(value, "mode")
