"""Shared by the conformance modules: ONNX's backend suite over `TransmuterBackend`, with the
known failures applied as strict xfails.

`onnx.backend.test.BackendTest` builds unittest classes, one per category (`OnnxBackendNodeModel
Test`, `OnnxBackendSimpleModelTest`, ...), each with a `test_<case>_<device>` method per case and
device. Every case prepares a `TransmuterRep`, whose first run goes through `transmuter.compile`.
"""

from __future__ import annotations

import functools
import re
import unittest
import warnings

import onnx.backend.test
import pytest
from expected_failures import EXPECTED_FAILURES, NONDETERMINISTIC, TOLERANCES
from onnx.backend.test.loader import load_model_tests

from transmuter.backend import TransmuterBackend

DEVICES = ("cpu", "cuda")


def suite_classes(module: str, categories: list[str]) -> dict[str, type[unittest.TestCase]]:
    """The suite's unittest classes for `categories` (e.g. "Node"), to put in a test module's
    namespace. A device the backend cannot use here (CUDA without a GPU) gets no cases at all,
    rather than a skip for every case; the known failures are marked strict xfails and the
    cases in TOLERANCES compare with theirs. The "_expanded" cases (an op's function body, made
    of ops with cases of their own) are left to test_backend_node.py, which runs a third of
    them with and without the graph passes."""
    with warnings.catch_warnings():
        # Building the node cases runs numpy on inf/nan on purpose (Cast overflow, log 0).
        warnings.simplefilter("ignore", RuntimeWarning)
        suite = onnx.backend.test.BackendTest(TransmuterBackend, module, test_kwargs=TOLERANCES)
    absent = [d for d in DEVICES if not TransmuterBackend.supports_device(d.upper())]
    classes = {}
    for category in categories:
        cls = suite.test_cases[f"OnnxBackend{category}Test"]
        for name in [n for n in vars(cls) if n.startswith("test_")]:
            if name.rsplit("_", 1)[-1] in absent or "_expanded" in name:
                delattr(cls, name)
                continue
            reason = expected_failure(name)
            if reason is not None:
                setattr(
                    cls, name, pytest.mark.xfail(strict=True, reason=reason)(getattr(cls, name))
                )
            elif name in NONDETERMINISTIC:
                mark = pytest.mark.xfail(strict=False, reason=NONDETERMINISTIC[name])
                setattr(cls, name, mark(getattr(cls, name)))
        classes[cls.__name__] = cls
    return classes


def expected_failure(name: str) -> str | None:
    """The reason `name` is expected to fail, or None; an error when two entries claim it."""
    reasons = [reason for pattern, reason in EXPECTED_FAILURES.items() if re.search(pattern, name)]
    if len(reasons) > 1:
        raise ValueError(f"{name} matches several EXPECTED_FAILURES entries: {reasons}")
    return reasons[0] if reasons else None


def tolerance(case) -> tuple[float, float]:
    """(rtol, atol) to compare `case`'s outputs with: its own, or its TOLERANCES entry's."""
    override = TOLERANCES.get(case.name, {})
    return override.get("rtol", case.rtol), override.get("atol", case.atol)


@functools.cache
def node_cases() -> list:
    """onnx's node cases (models and data, built in memory by the installed onnx)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return list(load_model_tests(kind="node"))


def all_test_names() -> set[str]:
    """The name of every test the suite defines, in every category and for every device."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        suite = onnx.backend.test.BackendTest(TransmuterBackend)
    return {n for cls in suite.test_cases.values() for n in vars(cls) if n.startswith("test_")}
