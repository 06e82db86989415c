"""Events about Transmuter's work: loading, compiling, cache use, graph breaks, calls.

    transmuter.telemetry.attach("my-id", ["transmuter.cache.miss"], handler)
    handler(event: str, measurements: dict, metadata: dict)

Spans emit `<name>.start` (measurements `system_time`, `monotonic_time`), then `<name>.stop`
(`duration`, `monotonic_time`) or `<name>.exception` (metadata adds `kind`, `reason`,
`stacktrace`). With no handler attached for an event, emitting it costs a dict lookup: call
sites check `listening(event)` before building metadata.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

Handler = Callable[[str, dict, dict], None]

_handlers: dict[Any, tuple[frozenset[str], Handler]] = {}
_by_event: dict[str, tuple[Handler, ...]] = {}
_log = logging.getLogger("transmuter")


def attach(handler_id: Any, events: Iterable[str], handler: Handler) -> None:
    """Call `handler` for each of `events`. `handler_id` must not be attached already."""
    if handler_id in _handlers:
        raise ValueError(f"a telemetry handler with id {handler_id!r} is already attached")
    events = frozenset([events] if isinstance(events, str) else events)
    _handlers[handler_id] = (events, handler)
    _rebuild()


def detach(handler_id: Any) -> bool:
    """Remove a handler; False when none had that id."""
    found = _handlers.pop(handler_id, None) is not None
    _rebuild()
    return found


def _rebuild() -> None:
    table: dict[str, list[Handler]] = {}
    for events, handler in _handlers.values():
        for event in events:
            table.setdefault(event, []).append(handler)
    _by_event.clear()
    _by_event.update({event: tuple(handlers) for event, handlers in table.items()})


def listening(event: str) -> bool:
    """True when some handler is attached to `event`."""
    return event in _by_event


def emit(event: str, measurements: dict, metadata: dict) -> None:
    """Call every handler of `event`. A handler that raises is logged and detached, so a broken
    handler cannot break inference."""
    for handler in _by_event.get(event, ()):
        try:
            handler(event, measurements, metadata)
        except Exception:
            _log.exception("telemetry handler for %s failed; detaching it", event)
            for handler_id, (_, h) in list(_handlers.items()):
                if h is handler:
                    detach(handler_id)


class span:
    """`with span("transmuter.compile", metadata) as s:` emits start and stop/exception;
    `s.stop_metadata` collects what the stop event adds. Costs little when nobody listens."""

    __slots__ = ("name", "metadata", "stop_metadata", "start", "active")

    def __init__(self, name: str, metadata: dict):
        self.name = name
        self.metadata = metadata
        self.stop_metadata: dict = {}
        self.active = (
            name + ".start" in _by_event
            or name + ".stop" in _by_event
            or name + ".exception" in _by_event
        )

    def __enter__(self) -> span:
        if self.active:
            self.start = time.monotonic_ns()
            emit(
                self.name + ".start",
                {"system_time": time.time_ns(), "monotonic_time": self.start},
                self.metadata,
            )
        return self

    def __exit__(self, kind, error, trace) -> None:
        if not self.active:
            return
        now = time.monotonic_ns()
        measurements = {"duration": now - self.start, "monotonic_time": now}
        if kind is None:
            emit(self.name + ".stop", measurements, {**self.metadata, **self.stop_metadata})
        else:
            details = {
                "kind": kind.__name__,
                "reason": str(error),
                "stacktrace": "".join(traceback.format_tb(trace)),
            }
            emit(self.name + ".exception", measurements, {**self.metadata, **details})


COMPILE_EVENTS = (
    "transmuter.load.stop",
    "transmuter.compile.stop",
    "transmuter.cache.miss",
    "transmuter.cache.evict",
    "transmuter.bucket.exceeded",
    "transmuter.segment.compile.stop",
    "transmuter.break.stop",
)


def log_compile_work(level: int = logging.INFO, logger: logging.Logger | None = None) -> str:
    """Log, through `logging`, the events that show compile work (loads, compiles, cache misses
    with the shapes buckets padded from, evictions, sizes past every bucket, segment compiles,
    graph breaks). A break that static inputs would remove names them (`static_inputs` of
    `transmuter.break.stop`). Returns the handler id for `detach`."""
    target = logger or _log
    handler_id = ("transmuter.log_compile_work", id(target))

    def log(event: str, measurements: dict, metadata: dict) -> None:
        took = measurements.get("duration")
        took_text = f" in {took / 1e6:.1f} ms" if took is not None else ""
        details = ", ".join(f"{k}={v}" for k, v in metadata.items() if k != "stacktrace")
        target.log(level, "%s%s: %s", event, took_text, details)
        if event == "transmuter.break.stop" and metadata.get("static_inputs"):
            names = metadata["static_inputs"]
            target.log(
                level,
                "%s (%s) breaks the graph on data computed from %s alone: pass "
                "compile(..., static_inputs={%s}) to compile one program per value instead",
                metadata.get("node"),
                metadata.get("op_type"),
                ", ".join(map(repr, names)),
                ", ".join(f"{n!r}: ..." for n in names),
            )

    attach(handler_id, COMPILE_EVENTS, log)
    return handler_id
