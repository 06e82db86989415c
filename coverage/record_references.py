"""Record ONNX Runtime's outputs for every model of a models folder, as cases for run_cases.py.

    python coverage/record_references.py --models models/ --out cases/
    python coverage/record_references.py --list coverage/models.json --models models/ --out cases/

With --list (select_models.py's JSON or CSV), first downloads each listed file (with its external
data and the repo's config.json) from the Hub at the listed revision into models/<owner__repo>/,
keeping the repo's layout, and writes the sidecar that gives its task. Then, offline, for every
model of the folder (an X.onnx with an X.json sidecar, see cases.py): generates inputs from the
model's input specs and config (transmuter.checking.example_inputs), runs ONNX Runtime on the CPU
with graph optimizations off (transmuter.checking.reference_outputs, what `transmuter check`
compares with), and writes cases/NAME.npz (`in/<input>`, `out/<output>`) and cases/manifest.json.
MatMulNBits models are recorded with accuracy_level 0 (a model edit, listed in the manifest: see
transmuter.frontend.edit.reference_edits). A model ORT cannot run is recorded with its error and
no arrays.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import cases
import numpy as np
import onnx

from transmuter import checking, cpu
from transmuter.frontend import load_model
from transmuter.frontend.edit import reference_edits


def fetch(rows: list[dict], models: Path, download: Callable | None = None) -> list[Path]:
    """Download the listed files into `models`/<repo slug>/ and write their sidecars; returns the
    ONNX paths. `download` takes huggingface_hub.hf_hub_download's keyword arguments (repo_id,
    filename, revision, local_dir) and defaults to it."""
    if download is None:
        from huggingface_hub import hf_hub_download as download
    paths = []
    for row in rows:
        local = models / cases.slug(row["repo"])
        wanted = [row["file"], *row.get("data_files", [])]
        if row.get("config"):
            wanted.append(row["config"])
        for filename in wanted:
            download(
                repo_id=row["repo"],
                filename=filename,
                revision=row.get("revision"),
                local_dir=local,
            )
        onnx_path = local / row["file"]
        config = (
            os.path.relpath(local / row["config"], onnx_path.parent) if row.get("config") else None
        )
        cases.write_sidecar(
            onnx_path,
            {
                "task": row["task"],
                "repo": row["repo"],
                "file": row["file"],
                "revision": row.get("revision"),
                "downloads": row.get("downloads"),
                "config": config,
            },
        )
        paths.append(onnx_path)
    return paths


def record(entry: cases.ModelEntry, out: Path) -> dict:
    """Record one model's case into `out`; returns its manifest entry."""
    proto = onnx.load(entry.path, load_external_data=False)
    name = entry.name
    case = {
        "name": name,
        "task": entry.task,
        "repo": entry.repo,
        "file": entry.file or entry.relative,
        "revision": entry.revision,
        "downloads": entry.downloads,
        "model": os.path.relpath(entry.path.resolve(), out.resolve()),
        "size_bytes": cases.model_bytes(entry.path, proto),
        "nodes": cases.node_count(proto),
        "op_types": cases.op_types(proto),
        "opsets": {o.domain or "ai.onnx": o.version for o in proto.opset_import},
        "inputs": {},
        "outputs": [],
        "arrays": None,
        "reference_edits": [],
        "reference_error": None,
        "record_s": None,
    }
    start = time.perf_counter()
    try:
        # The IR alone, not transmuter.load: a model Transmuter cannot run still gets a case.
        inputs = checking.example_inputs(
            load_model(entry.path), seed=cases.case_seed(name), config=entry.config
        )
        case["inputs"] = {
            k: {"dtype": v.dtype.name, "shape": list(v.shape)} for k, v in inputs.items()
        }
        case["reference_edits"] = reference_edits(proto)
        outputs = checking.reference_outputs(entry.path, inputs)
    except Exception as exc:  # the model's failure is data for the matrix, not a crash
        case["reference_error"] = cases.error_text(exc)
        return case
    arrays = {f"in/{k}": v for k, v in inputs.items()}
    for output, value in outputs.items():
        if isinstance(value, np.ndarray):
            arrays[f"out/{output}"] = value
            case["outputs"].append(output)
    case["arrays"] = f"{name}.npz"
    np.savez(out / case["arrays"], **arrays)
    case["record_s"] = round(time.perf_counter() - start, 3)
    return case


def main(argv: list[str] | None = None, download: Callable | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, required=True, help="folder of models with sidecars")
    parser.add_argument("--out", type=Path, required=True, help="cases folder to write")
    parser.add_argument("--list", type=Path, help="select_models.py output: download these first")
    args = parser.parse_args(argv)
    if args.list is not None:
        import select_models

        rows = select_models.read(args.list)
        print(f"downloading {len(rows)} models into {args.models} ...")
        fetch(rows, args.models, download)
    entries, unlabelled = cases.find_models(args.models)
    for path in unlabelled:
        print(f"skipped {path}: no sidecar {cases.sidecar_path(path).name} giving its task")
    if not entries:
        raise SystemExit(f"no models with sidecars under {args.models}")
    args.out.mkdir(parents=True, exist_ok=True)
    recorded = []
    for entry in entries:
        case = record(entry, args.out)
        status = (
            f"reference error: {case['reference_error']}" if case["reference_error"] else "recorded"
        )
        print(f"{case['name']} ({case['task']}): {status}")
        recorded.append(case)
    manifest = {
        "generated_by": "python coverage/record_references.py",
        "onnxruntime": _version("onnxruntime"),
        "onnx": onnx.__version__,
        # ORT's u8 x s8 kernels are exact only with VNNI: run_cases.py says where they may not be.
        "cpu": cpu.describe(),
        "vnni": cpu.has_vnni(),
        "cases": recorded,
    }
    cases.write_json(args.out / cases.MANIFEST, manifest)
    print(f"wrote {len(recorded)} cases to {args.out}")
    return 0


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    sys.exit(main())
