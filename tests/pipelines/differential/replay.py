"""Replays transformers' recorded pipeline calls (tests/fixtures/differential/) on transmuter.

Each repo under tests/fixtures/differential/ holds an export made the way users get it
(Optimum's main_export, or transformers.js's layout) and calls.json: every call form that
transformers' own tests/pipelines/test_pipelines_<task>.py exercises, with transformers'
answer, or the exception it raised (record.py says how they are written).

Equal means: the same structure, keys, labels, strings and order; numbers under "score" or
"scores" within 1e-4, under "box" within one pixel, other floats and arrays within 1e-4
(a call's "tolerance" may widen one key, saying why in its form); images equal pixel for pixel.
A form transformers refuses must be an InputError here. A form transformers accepts and this
project refuses fails; the test modules list what is still refused in REFUSED, with the reason,
as strict xfails.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import transmuter
from transmuter.errors import InputError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "differential"
DEFAULT_TOLERANCE = {"score": 1e-4, "scores": 1e-4, "box": 1.0, "float": 1e-4, "pixels": 0.0}


def calls(repo: str) -> list[dict]:
    return json.loads((FIXTURES / repo / "calls.json").read_text())["calls"]


def cases(*repos: str, refused: dict[str, str] | None = None) -> list:
    """One pytest param per recorded call, "repo/id"; those in `refused` are strict xfails."""
    refused = dict(refused or {})
    params = []
    for repo in repos:
        for call in calls(repo):
            name = f"{repo}/{call['id']}"
            marks = ()
            if name in refused:
                marks = pytest.mark.xfail(strict=True, reason=refused.pop(name))
            params.append(pytest.param(repo, call, id=name, marks=marks))
    if refused:
        raise ValueError(f"REFUSED names calls that were not recorded: {sorted(refused)}")
    return params


@functools.cache
def _arrays(repo: str, name: str) -> dict[str, np.ndarray]:
    path = FIXTURES / repo / name
    if not path.exists():
        return {}
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _decode(value: Any, arrays: dict[str, np.ndarray], *, live: bool) -> Any:
    if isinstance(value, list):
        return [_decode(v, arrays, live=live) for v in value]
    if not isinstance(value, dict):
        return value
    if "$generator" in value:
        return (_decode(v, arrays, live=live) for v in value["$generator"])
    if "$array" in value:
        return arrays[value["$array"]]
    if "$image" in value:
        pixels = arrays[value["$image"]]
        if not live:
            return pixels
        from PIL import Image

        return Image.fromarray(pixels, mode=value["mode"])
    return {k: _decode(v, arrays, live=live) for k, v in value.items()}


# The last few pipelines only: the tests of a repo run together, and every pipeline kept holds
# its compiled programs (generation's a program per step), each a few memory maps: kept for
# the whole session they passed the kernel's 65,530 maps a process and XLA crashed compiling.
@functools.lru_cache(maxsize=4)
def _pipeline(root: str, task: str, options: str):
    return transmuter.pipeline(task, root, **json.loads(options))


def pipeline_for(repo: str, call: dict, root: Path | None = None):
    root = root or FIXTURES / repo
    return _pipeline(str(root), call["task"], json.dumps(call["pipeline_kwargs"], sort_keys=True))


def check(repo: str, call: dict, root: Path | None = None) -> None:
    """Runs one recorded call on transmuter and compares with transformers' answer."""
    pipe = pipeline_for(repo, call, root)
    inputs = _arrays(repo, "inputs.npz")
    args = [_decode(a, inputs, live=True) for a in call["args"]]
    kwargs = {k: _decode(v, inputs, live=True) for k, v in call["kwargs"].items()}
    if "raises" in call:
        with pytest.raises(InputError):
            pipe(*args, **kwargs)
        return
    answer = pipe(*args, **kwargs)
    if hasattr(answer, "__next__"):
        answer = list(answer)
    expected = _decode(call["expected"], _arrays(repo, "expected.npz"), live=False)
    assert_matches(answer, expected, {**DEFAULT_TOLERANCE, **call["tolerance"]})


def assert_matches(
    ours: Any, theirs: Any, tolerance: dict, path: str = "answer", atol: float | None = None
) -> None:
    """Same structure and labels; numbers within the tolerance of the innermost key named in
    `tolerance` (integers exact where none is), other floats within tolerance["float"]."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), f"{path}: a {type(ours).__name__}, transformers a dict"
        assert sorted(ours) == sorted(theirs), f"{path}: keys {sorted(ours)} != {sorted(theirs)}"
        for key in theirs:
            assert_matches(
                ours[key], theirs[key], tolerance, f"{path}.{key}", tolerance.get(key, atol)
            )
    elif isinstance(theirs, list):
        assert isinstance(ours, list | tuple) or _is_array(ours), (
            f"{path}: a {type(ours).__name__}, transformers a list of {len(theirs)}"
        )
        if _numeric(theirs):
            _close(ours, np.asarray(theirs, dtype=np.float64), atol, tolerance, path)
            return
        assert len(ours) == len(theirs), f"{path}: {len(ours)} items, transformers {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_matches(a, b, tolerance, f"{path}[{i}]", atol)
    elif isinstance(theirs, np.ndarray):
        if theirs.dtype == np.uint8 and theirs.ndim >= 2:  # an image's pixels
            ours = np.asarray(ours)
            assert ours.shape == theirs.shape, f"{path}: shape {ours.shape} != {theirs.shape}"
            wrong = np.mean(ours.astype(np.int64) != theirs)
            assert wrong <= tolerance["pixels"], f"{path}: {wrong:.2%} of the pixels differ"
        else:
            _close(ours, theirs, atol, tolerance, path)
    elif isinstance(theirs, bool) or theirs is None or isinstance(theirs, str):
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"
    elif isinstance(theirs, int) and atol is None:
        assert ours == theirs and not isinstance(ours, bool), f"{path}: {ours!r} != {theirs!r}"
    else:
        _close(ours, np.float64(theirs), atol, tolerance, path)


def _close(ours: Any, theirs: np.ndarray, atol: float | None, tolerance: dict, path: str) -> None:
    ours = np.asarray(ours, dtype=np.float64)
    assert ours.shape == theirs.shape, f"{path}: shape {ours.shape} != {theirs.shape}"
    atol = tolerance["float"] if atol is None else atol
    worst = float(np.max(np.abs(ours - theirs), initial=0.0))
    assert worst <= atol, f"{path}: differs by {worst:.3g} (tolerance {atol:g})"


def _numeric(items: list) -> bool:
    flat = np.asarray(items, dtype=object).ravel() if items else []
    return len(flat) > 0 and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in flat
    )


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def transformers_js_layout(repo: str, to: Path) -> Path:
    """The repo in transformers.js's layout: the ONNX files under onnx/, the rest at the top."""
    source = FIXTURES / repo
    (to / "onnx").mkdir(parents=True)
    for path in source.iterdir():
        if path.name in ("calls.json", "inputs.npz", "expected.npz"):
            continue
        onnx_file = path.suffix == ".onnx" or path.name.endswith(".onnx_data")
        shutil.copy(path, to / "onnx" / path.name if onnx_file else to / path.name)
    return to


def check_transformers_js(repo: str, to: Path) -> None:
    """The repo's first recorded answer, from its transformers.js layout."""
    first = next(c for c in calls(repo) if "raises" not in c)
    check(repo, first, transformers_js_layout(repo, to))
