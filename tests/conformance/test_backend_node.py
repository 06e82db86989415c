"""ONNX's backend node suite (every single-operator case of the installed onnx, built in memory),
each case run through `transmuter.compile` by `TransmuterBackend`.

Known failures are strict xfails listed in expected_failures.py.
"""

import re

import numpy as np
import pytest
from conformance_suite import (
    all_test_names,
    expected_failure,
    node_cases,
    suite_classes,
    tolerance,
)
from expected_failures import EXPECTED_FAILURES, TOLERANCES
from onnx.backend.test.runner import Runner

from transmuter.backend import TransmuterBackend

globals().update(suite_classes(__name__, ["NodeModel"]))


def _holds_a_scalar_in_a_sequence(case) -> bool:
    return any(
        isinstance(out, list) and any(np.ndim(v) == 0 for v in out)
        for _, outputs in case.data_sets
        for out in outputs
    )


@pytest.mark.parametrize(
    "case",
    [c for c in node_cases() if _holds_a_scalar_in_a_sequence(c)],
    ids=lambda c: c.name,
)
def test_cases_the_runner_cannot_compare(case):
    """onnx's runner fails on sequence outputs holding 0-d tensors before looking at them (see
    expected_failures.py); compare those cases' outputs here, element by element."""
    rep = TransmuterBackend.prepare(case.model)
    rtol, atol = tolerance(case)
    for inputs, expected in case.data_sets:
        outputs = rep.run(list(inputs))
        assert len(outputs) == len(expected)
        for got, want in zip(outputs, expected):
            got, want = (got, want) if isinstance(want, list) else ([got], [want])
            assert isinstance(got, list) and len(got) == len(want)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape
                np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("pattern", sorted(EXPECTED_FAILURES))
def test_expected_failure_names_a_case(pattern):
    """An entry that matches no case is stale (a renamed case, a typo): remove or fix it."""
    assert any(re.search(pattern, name) for name in all_test_names()), pattern


@pytest.mark.parametrize("name", sorted(TOLERANCES))
def test_tolerance_names_a_case(name):
    """A TOLERANCES entry that names no node case is stale: remove or fix it."""
    assert name in {c.name for c in node_cases()}, name


def _rewritable_cases() -> list:
    """The cases graph passes can change (more than one node: the function-expanded ones), every
    third of them, bar the expected failures. The suite's classes leave the expanded cases out:
    each is a function body of ops the suite tests one by one, and two thirds of them repeat
    the same few bodies (softmax, layer normalization, the losses) on other shapes."""
    cases = [
        c
        for c in node_cases()
        if len(c.model.graph.node) > 1 and expected_failure(f"{c.name}_cpu") is None
    ]
    return cases[::3]


@pytest.mark.parametrize("optimize", [True, False], ids=["passes", "no_passes"])
@pytest.mark.parametrize("case", _rewritable_cases(), ids=lambda c: c.name)
def test_cases_with_and_without_graph_passes(case, optimize):
    """With `transmuter.load`'s default passes and with them off (`optimize=False`), so that
    both paths stay conformant."""
    rep = TransmuterBackend.prepare(case.model, optimize=optimize)
    rtol, atol = tolerance(case)
    for inputs, expected in case.data_sets:
        # onnx's own comparison, as the suite's runner makes it (bfloat16 and all).
        Runner.assert_similar_outputs(list(expected), rep.run(list(inputs)), rtol, atol)
