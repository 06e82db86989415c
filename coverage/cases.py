"""What the model coverage scripts share: the models folder and its sidecars, the cases folder,
and report text. Inputs, the ONNX Runtime reference, comparison and the search for the first
diverging node are transmuter.checking's, the code `transmuter check` runs.

coverage/ is a folder of scripts, not a package (`coverage` is coverage.py's import name), so the
scripts import this module by its name: `python coverage/run_cases.py` puts coverage/ first on
sys.path. Code that imports the scripts from elsewhere (the tests) puts coverage/ on sys.path.

Models folder: any tree of ONNX files; a model `X.onnx` takes part when a sidecar `X.json` lies
beside it: {"task": "feature-extraction"} at least; record_references.py's downloads add "repo",
"file", "revision", "downloads" and "config" (the repo's config.json, a path relative to the
sidecar), which input generation (transmuter.checking.example_inputs) reads for vocabulary,
image and audio sizes.

Cases folder: manifest.json (one entry per model: where it is, its task, sizes, op types, the
inputs it was given, how the reference was made), one NAME.npz per case (`in/<input>`,
`out/<output>`: ONNX Runtime's outputs), and results.json once run_cases.py has run.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

MANIFEST = "manifest.json"
RESULTS = "results.json"


class CasesError(Exception):
    """A models or cases folder is not what the coverage scripts expect."""


# ------------------------------------------------------------------------------------------------
# Models folder
# ------------------------------------------------------------------------------------------------


@dataclass
class ModelEntry:
    """One model of a models folder: its ONNX file and what its sidecar says."""

    path: Path
    task: str
    repo: str | None = None
    file: str | None = None
    revision: str | None = None
    downloads: int | None = None
    config: dict | None = None
    relative: str = ""  # the path inside the models folder

    @property
    def name(self) -> str:
        """The case name: from the Hub repo and file when known, else from the path inside the
        models folder."""
        if self.repo:
            return slug(f"{self.repo}/{self.file or self.path.name}".removesuffix(".onnx"))
        return slug((self.relative or self.path.name).removesuffix(".onnx"))


def slug(text: str) -> str:
    """A file-name-safe name: `owner/repo/onnx/model` -> `owner__repo__onnx__model`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.replace("/", "__")).strip("_")


def sidecar_path(onnx_path: Path) -> Path:
    return onnx_path.with_suffix(".json")


def write_sidecar(onnx_path: Path, fields: Mapping[str, Any]) -> Path:
    path = sidecar_path(onnx_path)
    path.write_text(json.dumps(dict(fields), indent=1) + "\n")
    return path


def find_models(folder: Path) -> tuple[list[ModelEntry], list[Path]]:
    """The models of `folder` (ONNX files with a sidecar), and the ONNX files without one."""
    folder = Path(folder)
    found, unlabelled = [], []
    for onnx_path in sorted(folder.rglob("*.onnx")):
        side = sidecar_path(onnx_path)
        if not side.is_file():
            unlabelled.append(onnx_path)
            continue
        fields = json.loads(side.read_text())
        if not isinstance(fields, dict) or not fields.get("task"):
            raise CasesError(f"{side} must be a JSON object with a 'task' (e.g. 'fill-mask')")
        config = None
        if fields.get("config"):
            config_path = (side.parent / fields["config"]).resolve()
            if not config_path.is_file():
                raise CasesError(f"{side} names config {fields['config']!r}, not found")
            config = json.loads(config_path.read_text())
        found.append(
            ModelEntry(
                path=onnx_path,
                task=fields["task"],
                repo=fields.get("repo"),
                file=fields.get("file"),
                revision=fields.get("revision"),
                downloads=fields.get("downloads"),
                config=config,
                relative=onnx_path.relative_to(folder).as_posix(),
            )
        )
    return found, unlabelled


def model_bytes(onnx_path: Path, proto: onnx.ModelProto) -> int:
    """Size on disk: the ONNX file and the external data files it names."""
    size = onnx_path.stat().st_size
    locations = set()
    for tensor in _all_initializers(proto.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            locations.update(e.value for e in tensor.external_data if e.key == "location")
    for location in locations:
        data = onnx_path.parent / location
        if data.is_file():
            size += data.stat().st_size
    return size


def _all_initializers(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for sub in _subgraphs(node):
            yield from _all_initializers(sub)


def _subgraphs(node: onnx.NodeProto):
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def all_nodes(graph: onnx.GraphProto):
    """Every node, subgraphs (If/Loop/Scan bodies) included."""
    for node in graph.node:
        yield node
        for sub in _subgraphs(node):
            yield from all_nodes(sub)


def op_types(proto: onnx.ModelProto) -> list[str]:
    """Sorted op types, `domain::Op` outside the default domain; local functions included."""
    nodes = [*all_nodes(proto.graph), *(n for f in proto.functions for n in f.node)]
    return sorted(
        {n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}" for n in nodes}
    )


def node_count(proto: onnx.ModelProto) -> int:
    return sum(1 for _ in all_nodes(proto.graph)) + sum(len(f.node) for f in proto.functions)


def case_seed(name: str) -> int:
    """The seed of a case's generated inputs: stable across runs, different across cases."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


# ------------------------------------------------------------------------------------------------
# Cases folder
# ------------------------------------------------------------------------------------------------


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise CasesError(f"no {MANIFEST} in {folder}: run coverage/record_references.py first")
    return json.loads(path.read_text())


def read_results(folder: Path) -> dict[str, dict]:
    """Case name -> result; empty when run_cases.py has not run."""
    path = Path(folder) / RESULTS
    if not path.is_file():
        return {}
    return {r["name"]: r for r in json.loads(path.read_text())["results"]}


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


def case_model_path(folder: Path, case: Mapping) -> Path:
    return (Path(folder) / case["model"]).resolve()


def case_arrays(folder: Path, case: Mapping) -> tuple[dict, dict]:
    """The recorded inputs and reference outputs of a case."""
    with np.load(Path(folder) / case["arrays"]) as stored:
        inputs = {k[3:]: stored[k] for k in stored.files if k.startswith("in/")}
        outputs = {k[4:]: stored[k] for k in stored.files if k.startswith("out/")}
    return inputs, outputs


# ------------------------------------------------------------------------------------------------
# Reporting
# ------------------------------------------------------------------------------------------------


def error_text(exc: BaseException) -> str:
    """`Class: first line of the message` (at most 300 characters)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def markdown_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
