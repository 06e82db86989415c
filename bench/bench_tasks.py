"""Tasks: each pipeline on Transmuter against the same pipeline on ONNX Runtime, and how many
programs varied inputs compile.

    python bench/bench_tasks.py [--case NAME ...] [--rounds 20] [--varied 50]

The ONNX Runtime side is the same pipeline object with `transmuter.compile` replaced by an
`onnxruntime.InferenceSession` of the same file (default graph optimizations, all cores):
the same pre- and post-processing around each model call, so the ratio is the model calls'.
Per case (a task on a repo of tests/fixtures/pipelines, tiny random weights, or a real-sized
random-weight repo of bench/.cache):

- first: seconds from `transmuter.pipeline(...)` to the first result (loading, tracing,
  compiling; ONNX Runtime: session creation and the first run), measured first in the process;
- compiles: the programs XLA compiled for `--varied` inputs of random sizes (images of 32 to
  640 pixels high, aspect ratios up to 3, clips of 0.2 to 3 s), counted by the
  `transmuter.segment.compile.stop` telemetry event (goal: at most 8 for 50);
- per call: the median over `--rounds` of one call on a fixed input, the two alternating.
  SAM keeps the embeddings of its last images, so its calls take the fixed image with one
  pixel changed each round: every call runs the 1024 x 1024 image encoder and the decoder.

The real-sized cases (detr-r50, detr-r50-pad64, sam-vit-b) run when
`/tmp/torchenv/bin/python bench/make_vision_large.py` has written their repos, and otherwise
print how to make them. A call takes seconds on two cores (DETR-R50 about 4 s at 800 x 1066,
each new size about 8 s more to compile), so they default to fewer rounds and varied inputs
(DETR: 5 and 20, about 4 minutes a case; SAM: 3 and 5, about 4 minutes); `--rounds` and
`--varied` override that for every case given, e.g. `--case object-detection/detr-r50
--varied 50` (5 to 8 minutes a DETR case). DETR at exact sizes compiles a program per resized
size (800 on the shorter side, up to 1333 on the longer), so nearly one per image;
`pad_to_multiple_of=64` buckets them, into 21 sizes for 50 images here (30 compiles with the
pipeline's 8 programs kept): bench/README.md has the figures.

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

ROOT = Path(__file__).resolve().parents[1]
REPOS = ROOT / "tests" / "fixtures" / "pipelines"
CACHE = ROOT / "bench" / ".cache"  # make_vision_large.py's real-sized repos
MAKE_LARGE = "/tmp/torchenv/bin/python bench/make_vision_large.py"
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
    repo: str | Path  # a folder of REPOS, or a path
    make: Callable[[np.random.Generator], Any]  # one random input
    options: dict[str, Any] = field(default_factory=dict)
    call: dict[str, Any] = field(default_factory=dict)  # per-call keyword arguments
    rounds: int | None = None  # the defaults of --rounds and --varied for this case
    varied: int | None = None
    # The pipeline keeps results per input (SAM's image embeddings): time each call on a copy
    # of the fixed input with one pixel changed, so that it runs every model.
    fresh: bool = False


# Two point prompts of one point each, inside every image().
POINTS = [[[[10, 12]], [[14, 6]]]]


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
    "zero-shot-object-detection/grounding-dino": Case(
        "zero-shot-object-detection",
        "grounding-dino",
        image,
        call={"candidate_labels": ["cat", "remote control", "a photo of a dog"]},
    ),
    "zero-shot-object-detection/grounding-dino-pad32": Case(
        "zero-shot-object-detection",
        "grounding-dino",
        image,
        options={"pad_to_multiple_of": 32},
        call={"candidate_labels": ["cat", "remote control", "a photo of a dog"]},
    ),
    "mask-generation/sam": Case(
        "mask-generation", "sam", image, call={"input_points": POINTS}, fresh=True
    ),
    "object-detection/detr-r50": Case(
        "object-detection", CACHE / "detr-r50", image, rounds=5, varied=20
    ),
    "object-detection/detr-r50-pad64": Case(
        "object-detection",
        CACHE / "detr-r50",
        image,
        options={"pad_to_multiple_of": 64},
        rounds=5,
        varied=20,
    ),
    "mask-generation/sam-vit-b": Case(
        "mask-generation",
        CACHE / "sam-vit-b",
        image,
        call={"input_points": POINTS},
        fresh=True,
        rounds=3,
        varied=5,
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


def variants(fixed: np.ndarray, fresh: bool) -> Callable[[], np.ndarray]:
    """The fixed input, or (fresh) a copy of it with one more element changed at each call."""
    count = 0

    def next_input() -> np.ndarray:
        nonlocal count
        if not fresh:
            return fixed
        count += 1
        changed = fixed.copy()
        changed.flat[count % changed.size] ^= 1
        return changed

    return next_input


def measure(case: Case, rounds: int, varied: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    fixed = case.make(rng)
    path = REPOS / case.repo
    given = variants(fixed, case.fresh)
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
        now = given()
        times["transmuter"].append(timed(lambda x=now: ours(x, **case.call)))
        with on_ort():
            times["ort"].append(timed(lambda x=now: theirs(x, **case.call)))
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
    parser.add_argument("--rounds", type=int, help="default: 20, or the case's")
    parser.add_argument("--varied", type=int, help="default: 50, or the case's")
    args = parser.parse_args()
    print(f"# {cpu.describe()}; onnxruntime {ort.__version__}")
    print(
        "| case | first result (s) | ORT first (s) | compiles / varied inputs | "
        "per call (ms) | ORT (ms) | ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in args.case or CASES:
        case = CASES[name]
        if not (REPOS / case.repo).exists():
            print(f"| {name} | not run: no {case.repo}; make it with `{MAKE_LARGE}` |")
            continue
        rounds = args.rounds or case.rounds or 20
        varied = args.varied if args.varied is not None else case.varied or 50
        r = measure(case, rounds, varied)
        print(
            f"| {name} | {r['first_s']:.2f} | {r['ort_first_s']:.2f} | {r['compiles']} / "
            f"{varied} | {r['ms']:.2f} | {r['ort_ms']:.2f} | {r['ms'] / r['ort_ms']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
