"""Property-based fuzzing of the loader and the eager runtime (issue 18): committed fixture
files truncated, bit-flipped, or with dims, opsets, attribute types or external-data fields
edited, and random small graphs. Each case loads, and runs eagerly on example inputs if it
loads: a result or a TransmuterError, never another exception or a hang.

The CI run is short and seeded (derandomize=True; ~30 s on 2 cores): the cases that run the
fixture models (dims, opset) get fewer examples than those that mostly fail to load.
tests/fuzz/run_long.py runs the same cases by the hundred thousand, in worker processes, where
a crash is counted instead of fatal.
"""

from __future__ import annotations

import tempfile

import pytest
from fuzz_cases import FIXTURES, fixture_bytes, make_case, outcome
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

# No shrinking: a failing case is reported as found (derandomized, so a rerun finds it again),
# where shrinking reran slow cases for minutes.
FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
# A hang is a case past this. A mutation that changes a shape early in a model (a Conv's
# strides or dilations) makes the eager run compile every later op anew: 20 s for resnet_qdq
# on an idle machine, and past 60 s in a full suite run on a busy one.
HANG_S = 300


@pytest.fixture(scope="module", autouse=True)
def _fixtures_run_once_untimed():
    """Each fixture run once, unmutated, before any case: the first eager run compiles every
    op's program (20 s and more for resnet_qdq on a busy machine), and a case's timeout is
    for what its mutation costs, not for that."""
    for name in sorted(FIXTURES):
        assert outcome(fixture_bytes(name), run=True, timeout=600) == ("ran", ""), name


def _fuzz(kind: str, examples: int):
    @settings(FUZZ, max_examples=examples)
    @given(fixture=st.sampled_from(sorted(FIXTURES)), rng=st.randoms(use_true_random=False))
    def test(fixture, rng):
        with tempfile.TemporaryDirectory() as folder:
            source = make_case(kind, fixture, rng, folder)
            result, detail = outcome(source, run=True, timeout=HANG_S)
        assert result in ("ran", "loaded", "TransmuterError"), f"{kind} {result}: {detail}"

    test.__name__ = f"test_{kind}_gives_a_result_or_a_transmuter_error"
    return test


test_truncated_file = _fuzz("truncate", 100)
test_flipped_bytes = _fuzz("flip", 100)
test_edited_dims = _fuzz("dims", 25)
test_edited_opsets = _fuzz("opset", 25)
test_swapped_attribute_types = _fuzz("attribute", 50)
test_edited_external_data_fields = _fuzz("external", 50)
test_random_small_graph = _fuzz("graph", 100)
