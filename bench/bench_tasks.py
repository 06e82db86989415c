"""Tasks: each pipeline on Transmuter against the same pipeline on ONNX Runtime, and how many
programs varied inputs compile.

    python bench/bench_tasks.py [--case NAME ...] [--rounds 20] [--varied 50]

The ONNX Runtime side is the same pipeline object with `transmuter.compile` replaced by an
`onnxruntime.InferenceSession` of the same file (default graph optimizations, all cores):
the same pre- and post-processing around each model call, so the ratio is the model calls'.
Per case (a task on a repo of tests/fixtures/pipelines, tiny random weights):

- first: seconds from `transmuter.pipeline(...)` to the first result (loading, tracing,
  compiling; ONNX Runtime: session creation and the first run), measured first in the process;
- compiles: the programs XLA compiled for `--varied` inputs of random sizes (images of 32 to
  640 pixels high, aspect ratios up to 3, clips of 0.2 to 3 s), counted by the `transmuter.segment.compile.stop`
  telemetry event (goal: at most 8);
- per call: the median over `--rounds` of one call on a fixed input, the two alternating.

Pipelines that run their own jitted programs (generation) are not cases here: see
bench_generate.py and bench_serving.py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

import transmuter
from transmuter import cpu, telemetry

REPOS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "pipelines"
sys.path.insert(0, str(REPOS.parent))


def image(rng: np.random.Generator) -> np.ndarray:
    """An image of 32 to 640 pixels high, at most three times as wide as high or the reverse
    (the tiny fixtures' sizes would resize a narrower one to nothing)."""
    height = int(rng.integers(32, 641))
    width = max(16, int(height * np.exp(rng.uniform(-np.log(3), np.log(3)))))
    return rng.integers(0, 256, (height, width, 3), np.uint8)


def clip(rng: np.random.Generator) -> np.ndarray:
    return (0.1 * rng.standard_normal(int(16000 * rng.uniform(0.2, 3.0)))).astype(np.float32)


@dataclass
class Case:
    task: str
    repo: str
    make: Callable[[np.random.Generator], Any]  # one random input
    options: dict[str, Any] = field(default_factory=dict)
    call: dict[str, Any] = field(default_factory=dict)  # per-call keyword arguments


CASES = {
    "image-classification/vit": Case("image-classification", "vit", image),
    "zero-shot-image-classification/clip": Case(
        "zero-shot-image-classification",
        "clip",
        image,
        call={"candidate_labels": ["a cat", "a dog", "a tiny robot"]},
    ),
    "depth-estimation/depth-anything": Case("depth-estimation", "depth-anything", image),
    "image-segmentation/segformer": Case("image-segmentation", "segformer", image),
    "image-segmentation/detr-panoptic": Case("image-segmentation", "detr-panoptic", image),
    "image-segmentation/mask2former-panoptic": Case(
        "image-segmentation", "mask2former-panoptic", image
    ),
    "object-detection/detr": Case("object-detection", "detr", image),
    "object-detection/detr-pad64": Case(
        "object-detection", "detr", image, options={"pad_to_multiple_of": 64}
    ),
    "object-detection/yolos": Case("object-detection", "yolos", image),
    "object-detection/rtdetr": Case("object-detection", "rtdetr", image),
    "zero-shot-object-detection/owlv2": Case(
        "zero-shot-object-detection",
        "owlv2",
        image,
        call={"candidate_labels": ["a cat", "a remote control", "a dog"]},
    ),
    "audio-classification/ast": Case("audio-classification", "ast", clip),
    "audio-classification/wav2vec2": Case("audio-classification", "wav2vec2", clip),
}


class OrtCompiled:
    """What `transmuter.compile` returns, on an ONNX Runtime session of the model's file."""

    def __init__(self, model: transmuter.Model, example: Any = None, **_: Any):
        self.session = ort.InferenceSession(model.source, providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.session.get_outputs()]

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.names, self.session.run(None, dict(inputs))))


class on_ort:
    """Within: pipelines compile their models as ONNX Runtime sessions."""

    def __enter__(self):
        self.compile, transmuter.compile = transmuter.compile, OrtCompiled

    def __exit__(self, *_):
        transmuter.compile = self.compile


def timed(run: Callable[[], Any]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def measure(case: Case, rounds: int, varied: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    fixed = case.make(rng)
    path = REPOS / case.repo
    start = time.perf_counter()
    ours = transmuter.pipeline(case.task, path, **case.options)
    ours(fixed, **case.call)
    first = time.perf_counter() - start
    with on_ort():
        start = time.perf_counter()
        theirs = transmuter.pipeline(case.task, path, **case.options)
        theirs(fixed, **case.call)
        ort_first = time.perf_counter() - start
    compiles = []
    telemetry.attach("bench", ["transmuter.segment.compile.stop"], lambda *_: compiles.append(1))
    try:
        for _ in range(varied):
            ours(case.make(rng), **case.call)
    finally:
        telemetry.detach("bench")
    times: dict[str, list[float]] = {"transmuter": [], "ort": []}
    for _ in range(rounds):
        times["transmuter"].append(timed(lambda: ours(fixed, **case.call)))
        with on_ort():
            times["ort"].append(timed(lambda: theirs(fixed, **case.call)))
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    return {
        "first_s": first,
        "ort_first_s": ort_first,
        "compiles": len(compiles),
        "ms": ms["transmuter"],
        "ort_ms": ms["ort"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--varied", type=int, default=50)
    args = parser.parse_args()
    print(f"# {cpu.describe()}; onnxruntime {ort.__version__}")
    print(
        f"| case | first result (s) | ORT first (s) | compiles for {args.varied} varied | "
        "per call (ms) | ORT (ms) | ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in args.case or CASES:
        r = measure(CASES[name], args.rounds, args.varied)
        print(
            f"| {name} | {r['first_s']:.2f} | {r['ort_first_s']:.2f} | {r['compiles']} | "
            f"{r['ms']:.2f} | {r['ort_ms']:.2f} | {r['ms'] / r['ort_ms']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
