"""What every task shares: its calling conventions, its option checks, labels and scores.

`Task` is the base of every task. It does what transformers' `Pipeline.__call__` does with a
call's inputs, so that a task file holds only its own preprocessing, model and postprocessing:
- one item (the task's `is_item`: a string, a {"text", "text_pair"} dict, an image, a clip)
  gives that item's result;
- a list or tuple of items gives a list with one result per item;
- a generator (any other iterator) gives a generator of results, computed `batch_size` items
  at a time as the items arrive;
- per-call options (keywords) apply to every item of the call.

The contract with Serving (serving/batching.py): `run_items(items, **options)` returns exactly
one result per item, whatever the task (a result may itself be a list: fill-mask's candidates,
an image's boxes); `single(result, item, options)` is what a call with that one item (not a
list) returns; `batch_key(item)`, where a task has one, groups items that batch together.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from transmuter.errors import InputError


class Task:
    """A task's calling conventions. Subclasses set `batch_size` and implement `run_items`;
    they override `is_item` where one of their items is not a string."""

    batch_size: int = 1

    def __call__(self, inputs: Any, **options: Any) -> Any:
        self.check_options(options)
        if isinstance(inputs, Iterator):
            return self._stream(inputs, options)
        items, single = self.items(inputs)
        results = self.run_items(items, **options)
        return self.single(results[0], items[0], options) if single else results

    def items(self, inputs: Any) -> tuple[list, bool]:
        """The call's items, and whether it was one item (not a list)."""
        if self.is_item(inputs):
            return [inputs], True
        if isinstance(inputs, (list, tuple)):
            if not inputs:
                raise InputError(f"{self.describe_items()}: got an empty list")
            return list(inputs), False
        raise InputError(f"{self.describe_items()}; got {type(inputs).__name__}")

    def is_item(self, value: Any) -> bool:
        """Whether `value` is one item (a text or a {"text", "text_pair"} pair by default)."""
        return isinstance(value, (str, Mapping))

    def describe_items(self) -> str:
        """What a call takes, for errors."""
        return "give a text, a list of texts or a generator of them"

    def run_items(self, items: list, **options: Any) -> list:
        """One result per item (the Serving contract)."""
        raise NotImplementedError

    def check_options(self, options: Mapping[str, Any]) -> None:
        """An InputError naming the options `run_items` does not take (a call's unknown keyword
        would otherwise be Python's TypeError); a task whose `run_items` takes **options checks
        its own."""
        parameters = inspect.signature(self.run_items).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            return
        known = sorted(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise InputError(f"{type(self).__name__} has no option {unknown}; it takes {known}")

    def single(self, result: Any, item: Any, options: Mapping[str, Any]) -> Any:
        """What a call with one item (not in a list) and these options returns, from that
        item's result."""
        return result

    def _stream(self, inputs: Iterator, options: dict) -> Iterator:
        chunk: list = []
        for item in inputs:
            chunk.append(item)
            if len(chunk) == self.batch_size:
                yield from self.run_items(chunk, **options)
                chunk = []
        if chunk:
            yield from self.run_items(chunk, **options)


def per_item(value: Any, items: Sequence, name: str, is_one: Callable[[Any], bool]) -> list:
    """An option given once for the call or once per item (transformers zips a list of
    per-item values with the items: candidate_labels as a list of lists, one per image)."""
    if is_one(value):
        return [value] * len(items)
    if isinstance(value, (list, tuple)) and all(is_one(v) for v in value):
        if len(value) != len(items):
            raise InputError(
                f"{name} has {len(value)} entries, one per item, but the call has "
                f"{len(items)} items"
            )
        return list(value)
    raise InputError(f"{name} must be given once for the call or once per item; got {value!r}")


# Option checks: each names its option and says what it takes.


def positive_int(value: Any, name: str) -> int:
    """An integer option of at least 1 (`batch_size`, `max_answer_len`, ...)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{name} must be an integer of at least 1; got {value!r}")
    return int(value)


def top_k(value: Any, name: str = "top_k", *, none: bool = False) -> int | None:
    """`top_k`: how many best answers; None (all of them) where the task allows it."""
    if value is None and none:
        return None
    return positive_int(value, name)


def threshold(value: Any, name: str = "threshold") -> float:
    """A score threshold: a finite number."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.number))
        or not math.isfinite(value)
    ):
        raise InputError(f"{name} must be a number; got {value!r}")
    return float(value)


def candidate_labels(value: Any, name: str = "candidate_labels") -> list[str]:
    """Labels as a list of strings; one string is split at commas, as transformers does."""
    if isinstance(value, str):
        labels = [label.strip() for label in value.split(",") if label.strip()]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        labels = list(value)
    else:
        raise InputError(f"{name} must be a string or a list of strings; got {value!r}")
    if not labels:
        raise InputError(f"{name} is empty: give at least one label")
    return labels


def is_labels(value: Any) -> bool:
    """Whether `value` is one set of candidate labels (a string or a list of strings)."""
    return isinstance(value, str) or (
        isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    )


def hypothesis_template(value: Any) -> str:
    """A template with one "{}" for the label."""
    if not isinstance(value, str) or "{}" not in value:
        raise InputError(
            f'hypothesis_template must be a string with a "{{}}" for the label; got {value!r}'
        )
    try:
        value.format("label")
    except (IndexError, KeyError, ValueError) as error:
        raise InputError(f"hypothesis_template {value!r} cannot be formatted: {error}") from None
    return value


def choice(value: Any, name: str, choices: Iterable[str]) -> str:
    """An option that takes one of a few names."""
    choices = list(choices)
    if value not in choices:
        raise InputError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


# Labels and scores.


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, in the logits' precision."""
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


SCORES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "softmax": softmax,
    "sigmoid": sigmoid,
    "none": lambda x: x,
}


def id2label(config: Mapping[str, Any], count: int) -> list[str]:
    """config.json's id2label, or LABEL_i as transformers names unlabeled classes."""
    names = config.get("id2label") or {}
    return [str(names.get(str(i), names.get(i, f"LABEL_{i}"))) for i in range(count)]


def ranked(scores: np.ndarray, labels: Sequence[str], k: int | None) -> list[dict[str, Any]]:
    """The `k` best (None: all) {"label", "score"}, best first; ties keep label order."""
    order = np.argsort(-scores, kind="stable")[:k]
    return [{"label": labels[i], "score": float(scores[i])} for i in order]
