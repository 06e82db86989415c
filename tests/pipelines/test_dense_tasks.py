"""Call forms of depth-estimation, image-segmentation and mask-generation that transformers'
pipelines take, tested on the mechanism rather than on one recorded model (the recorded
answers are replayed in differential/test_diff_dense.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPOS

import transmuter
from transmuter.errors import InputError

Image = pytest.importorskip("PIL.Image")


@pytest.mark.parametrize(
    "task, repo, key",
    [
        ("depth-estimation", "depth-anything", "predicted_depth"),
        ("image-segmentation", "segformer", "label"),
    ],
)
def test_batch_size_per_call_is_taken_and_checked(task, repo, key):
    """transformers' pipelines take batch_size per call (test_pipelines_image_segmentation's
    run_pipeline_test: a list with batch_size=2): an image task takes it, checks it, and
    answers as without it."""
    pipe = transmuter.pipeline(task, REPOS / repo)
    images = [Image.new("RGB", (20 + 8 * i, 12), (i * 40, 90, 200 - i * 30)) for i in range(3)]
    plain = pipe(images)
    batched = pipe(images, batch_size=2)
    assert len(plain) == len(batched) == 3
    for a, b in zip(plain, batched):
        if key == "label":
            assert [s["label"] for s in a] == [s["label"] for s in b]
        else:
            np.testing.assert_array_equal(a[key], b[key])
    for wrong in (0, 1.5, "2", True):
        with pytest.raises(InputError, match="batch_size must be an integer of at least 1"):
            pipe(images, batch_size=wrong)
