"""Memory is bounded by cache_size: a service seeing a new shape on every call keeps only what
its cache holds, not an entry per shape ever seen in JAX's tracing caches. Measured in a fresh
process (RSS), so that the rest of the test run does not count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models"

NEW_SHAPES = """
import gc, sys
from pathlib import Path
import numpy as np
import transmuter


def rss_mib():
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) / 1024


model = transmuter.load(sys.argv[1])
inputs = lambda n: {k: np.ones((1, n), np.int64) for k in model.inputs}
compiled = transmuter.compile(model, inputs(2), cache_size=4)
for n in range(3, 10):  # the cache is full and evicting from here on
    compiled(inputs(n))
gc.collect()
start = rss_mib()
for n in range(10, 50):
    out = compiled(inputs(n))
gc.collect()
again = compiled(inputs(49))  # the programs kept still run after JAX's caches were cleared
assert np.array_equal(np.asarray(again["last_hidden_state"]), np.asarray(out["last_hidden_state"]))
print(round(rss_mib() - start, 1))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_forty_new_shapes_past_a_full_cache_keep_memory_flat():
    command = [sys.executable, "-c", NEW_SHAPES, str(FIXTURES / "bert.onnx")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    growth = float(done.stdout.strip().splitlines()[-1])
    # Before evictions cleared JAX's caches this grew by about 0.9 MiB a shape (36 MiB here).
    assert growth < 20, f"RSS grew {growth} MiB over 40 new shapes with cache_size=4"
