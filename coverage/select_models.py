"""Pick the most downloaded Hugging Face Hub repos that carry ONNX files, per pipeline task.

    python coverage/select_models.py --per-task 5 --out coverage/models.json
    python coverage/select_models.py --tasks fill-mask image-classification --out models.csv

For each task, asks the Hub (HfApi.list_models, filter="onnx", the task's pipeline_tag, sorted by
downloads) for candidates and lists each candidate's files; a repo is taken when it has a .onnx
file, until `--per-task` repos are found (gated repos are passed over: they need a token). One
file per repo, chosen by `onnx_preference`: onnx/model.onnx, then model.onnx, then their
precision variants (fp16, quantized, int8, q4 ...), then the other names of encoder-decoder
exports (decoder_model_merged, encoder_model ...). Writes repo, file, task, downloads, revision
(the commit the listing saw, so downloads are reproducible), the file's external data files and
whether the repo has a config.json; JSON, or CSV when --out ends in .csv. This is the only
coverage script that needs the network; record_references.py downloads what it lists.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path, PurePosixPath
from typing import Any

# The tasks whose models the sweep runs by default: text, vision and audio pipelines for which
# ONNX exports are common.
DEFAULT_TASKS = [
    "feature-extraction",
    "sentence-similarity",
    "fill-mask",
    "text-classification",
    "token-classification",
    "question-answering",
    "text-generation",
    "text2text-generation",
    "image-classification",
    "image-feature-extraction",
    "object-detection",
    "image-segmentation",
    "depth-estimation",
    "zero-shot-image-classification",
    "automatic-speech-recognition",
    "audio-classification",
    "text-to-speech",
]
# Candidates examined per wanted repo: most popular repos tagged "onnx" have ONNX files, but
# some keep them only in unusual places or are gated.
SCAN_FACTOR = 4

# Base names in order of preference: the single-file export first, then the parts of
# encoder-decoder and decoder exports, of which the merged decoder covers the most.
BASE_NAMES = [
    "model",
    "decoder_model_merged",
    "decoder_with_past_model",
    "decoder_model",
    "encoder_model",
]
# Precision variants (file name suffixes) in order of preference: full precision first.
VARIANTS = ["", "_fp32", "_fp16", "_quantized", "_int8", "_uint8", "_q8", "_q4", "_q4f16", "_bnb4"]
FOLDERS = ["onnx", ""]
FIELDS = ["repo", "file", "task", "downloads", "revision", "data_files", "config"]


def split_variant(stem: str) -> tuple[str, str]:
    """`model_q4f16` -> (`model`, `_q4f16`); a stem with no known suffix is its own base."""
    for suffix in sorted(VARIANTS[1:], key=len, reverse=True):
        if stem.endswith(suffix):
            return stem[: -len(suffix)], suffix
    return stem, ""


def onnx_preference(path: str) -> tuple:
    """Sort key of an ONNX file path: smaller is preferred (see the module docstring)."""
    p = PurePosixPath(path)
    base, variant = split_variant(p.stem)
    folder = str(p.parent) if str(p.parent) != "." else ""
    return (
        BASE_NAMES.index(base) if base in BASE_NAMES else len(BASE_NAMES),
        VARIANTS.index(variant),
        FOLDERS.index(folder) if folder in FOLDERS else len(FOLDERS),
        path,
    )


def data_files(onnx_file: str, files: list[str]) -> list[str]:
    """External data beside `onnx_file`: `model.onnx_data`, `model.onnx.data`, `model.onnx_data_1`."""
    prefix = onnx_file
    return sorted(
        f for f in files if f.startswith(prefix) and f != onnx_file and "data" in f[len(prefix) :]
    )


def pick_file(files: list[str]) -> str | None:
    onnx_files = [f for f in files if f.endswith(".onnx")]
    return min(onnx_files, key=onnx_preference) if onnx_files else None


def select(api: Any, tasks: list[str], per_task: int, log=print) -> list[dict]:
    """The `per_task` most downloaded repos with ONNX files for each task, as rows of FIELDS.

    `api` is a huggingface_hub.HfApi, or anything with its `list_models(filter=, pipeline_tag=,
    sort=, limit=, expand=)` and `list_repo_files(repo_id, revision=)`."""
    rows = []
    for task in tasks:
        found = 0
        candidates = api.list_models(
            filter="onnx",
            pipeline_tag=task,
            sort="downloads",
            limit=per_task * SCAN_FACTOR,
            expand=["downloads", "sha", "gated", "pipeline_tag"],
        )
        for info in candidates:
            if found == per_task:
                break
            if getattr(info, "gated", False):
                continue
            files = list(api.list_repo_files(info.id, revision=info.sha))
            chosen = pick_file(files)
            if chosen is None:
                continue
            rows.append(
                {
                    "repo": info.id,
                    "file": chosen,
                    "task": task,
                    "downloads": info.downloads,
                    "revision": info.sha,
                    "data_files": data_files(chosen, files),
                    "config": "config.json" if "config.json" in files else None,
                }
            )
            found += 1
        log(f"{task}: {found} repos with ONNX files")
    return rows


def write(rows: list[dict], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".csv":
        with out.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            for row in rows:
                writer.writerow(
                    {
                        **row,
                        "data_files": " ".join(row["data_files"]),
                        "config": row["config"] or "",
                    }
                )
    else:
        out.write_text(json.dumps(rows, indent=1) + "\n")


def read(path: Path) -> list[dict]:
    """A list written by `write` (JSON or CSV) back as rows."""
    if path.suffix == ".csv":
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        for row in rows:
            row["downloads"] = int(row["downloads"]) if row["downloads"] else None
            row["data_files"] = row["data_files"].split()
            row["config"] = row["config"] or None
        return rows
    return json.loads(path.read_text())


def main(argv: list[str] | None = None, api: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS, help="pipeline tags")
    parser.add_argument("--per-task", type=int, default=5, help="repos per task")
    parser.add_argument(
        "--out", type=Path, default=Path("coverage/models.json"), help=".json or .csv"
    )
    args = parser.parse_args(argv)
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    rows = select(api, args.tasks, args.per_task, log=lambda text: print(text, file=sys.stderr))
    write(rows, args.out)
    print(f"wrote {len(rows)} models over {len(args.tasks)} tasks to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
