"""A model split over several devices (`pipeline(..., mesh=, model_axis=)`, `transmuter serve
--model-shards N`): its params are placed in shards as they are read and the tasks' answers are
one device's. Several CPU devices exist only in a process started with XLA's host device
count, so the sharded runs are subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from test_http import REPOS, TEXTS, Running, normalized

import transmuter
from transmuter.errors import InputError

# Beside the suite's own XLA_FLAGS (tests/conftest.py), which the servers' processes keep.
FOUR_DEVICES = {
    "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4"
}

ON_A_MESH = """
import json, sys
import jax, numpy as np
import transmuter

repos = sys.argv[1]
mesh = jax.make_mesh((4,), ("model",))
texts = ["the quick brown fox", "jumps over the lazy dog"]
results = {}
for name, task, run in (
    ("bert", "feature-extraction", lambda p: p(texts)),
    ("gpt2", "text-generation", lambda p: p("hello there", max_new_tokens=6)),
):
    alone = run(transmuter.pipeline(task, f"{repos}/{name}"))
    repo = transmuter.load_repo(f"{repos}/{name}")
    sharded = transmuter.pipeline(task, repo, mesh=mesh, model_axis="model")
    got = run(sharded)
    split = [v for m in repo._models.values() for v in m.params.values()
             if "model" in str(v.sharding.spec)]
    results[name] = {
        "split_params": len(split),
        "devices": sorted({len(v.sharding.device_set) for v in split}),
        "same": got == alone if task == "text-generation" else None,
        "error": None if task == "text-generation" else max(
            float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(got, alone)),
    }
print(json.dumps(results))
"""


def test_pipelines_on_a_four_device_mesh_answer_as_on_one():
    done = subprocess.run(
        [sys.executable, "-c", ON_A_MESH, str(REPOS)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **FOUR_DEVICES},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("bert", "gpt2"):
        assert results[name]["split_params"] > 0 and results[name]["devices"] == [4], results
    assert results["bert"]["error"] < 1e-5, results  # the partial sums add up in another order
    assert results["gpt2"]["same"], results  # greedy tokens


def test_sharding_options_say_what_is_missing_or_late():
    with pytest.raises(InputError, match="model_axis='model' names an axis of a mesh"):
        transmuter.pipeline("feature-extraction", REPOS / "bert", model_axis="model")
    repo = transmuter.load_repo(REPOS / "bert")
    repo.model("model")
    mesh = jax.make_mesh((1,), ("model",))
    with pytest.raises(InputError, match=r"\['model'\] already loaded on one device"):
        transmuter.pipeline("feature-extraction", repo, mesh=mesh, model_axis="model")


def test_serve_refuses_more_shards_than_devices(capsys):
    from transmuter.cli import main

    argv = ["serve", str(REPOS / "bert"), "--task", "feature-extraction", "--model-shards", "2"]
    assert main(argv) == 1
    assert "--model-shards 2 needs that many devices, and there are 1" in capsys.readouterr().err


@pytest.mark.slow
def test_a_server_with_its_model_in_four_shards_answers_as_the_pipeline():
    server = Running(REPOS / "bert", "feature-extraction", "--model-shards", "4", env=FOUR_DEVICES)
    try:
        got = server.http.post(
            "/v1/embeddings", json={"model": "bert", "input": TEXTS, "encoding_format": "float"}
        ).json()
        mean = transmuter.pipeline("feature-extraction", REPOS / "bert", pooling="mean")
        embeddings = [d["embedding"] for d in got["data"]]
        np.testing.assert_allclose(embeddings, normalized(mean(TEXTS)), atol=1e-5)
    finally:
        assert server.stop()
    assert "params split over 4 cpu devices" in server.log
