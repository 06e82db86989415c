"""Layers point downwards only: runtime -> lowering -> ir <- frontend; only the front end
imports onnx; the IR imports neither onnx nor jax; the pipelines sit on the public API (and
the Hub code), not on the runtime's or the lowering's insides; serving sits on the pipelines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "transmuter"

FORBIDDEN = {
    "ir": {"onnx", "jax", "transmuter.frontend", "transmuter.lowering", "transmuter.runtime"},
    "frontend": {"jax", "transmuter.lowering", "transmuter.runtime"},
    "lowering": {"onnx", "transmuter.frontend", "transmuter.runtime"},
    "runtime": {"onnx", "transmuter.frontend"},
    "pipelines": {
        "onnx",
        "transmuter.runtime",
        "transmuter.lowering",
        "transmuter.ir",
        "transmuter.serving",
    },
    # The serving layer sits on the pipelines and the public API, never below them.
    "serving": {
        "onnx",
        "transmuter.frontend",
        "transmuter.runtime",
        "transmuter.lowering",
        "transmuter.ir",
    },
    "dtypes.py": {
        "onnx",
        "jax",
        "transmuter.frontend",
        "transmuter.lowering",
        "transmuter.runtime",
    },
    "errors.py": {
        "onnx",
        "jax",
        "transmuter.frontend",
        "transmuter.lowering",
        "transmuter.runtime",
    },
}


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _files(part: str) -> list[Path]:
    target = PACKAGE / part
    return sorted(target.rglob("*.py")) if target.is_dir() else [target]


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_layer_imports_point_downwards(part):
    bad = []
    for path in _files(part):
        for name in imports(path):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[part]):
                bad.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    assert not bad, "\n".join(bad)


# transmuter/backend.py implements onnx.backend.base.Backend, ONNX's own test API: it takes
# ModelProto / NodeProto and subclasses onnx's classes, so it is the one exception to the rule.
ONNX_API_EXCEPTIONS = {PACKAGE / "backend.py"}


def test_only_the_front_end_imports_onnx():
    bad = [
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if "frontend" not in path.parts
        and path not in ONNX_API_EXCEPTIONS
        and any(n == "onnx" or n.startswith("onnx.") for n in imports(path))
    ]
    assert not bad, bad


def test_coverage_folder_is_not_a_package():
    assert not (PACKAGE.parent / "coverage" / "__init__.py").exists()


def test_test_modules_have_unique_names():
    # tests/ has no __init__.py files: pytest imports each test file by its name alone, so two
    # files of one name fail to collect (tests/ops' and tests/pipelines' test_detection.py did).
    names = [p.name for p in (PACKAGE.parent / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


# What families share lives in lowering/shared.py and transmuter/dtypes.py. A com.microsoft op
# may build on the ai.onnx operator it extends (FusedConv on Conv, DynamicQuantizeLSTM on the
# LSTM recurrence), and the ai.onnx.ml modules share ml.py, one family in four modules.
OPS = PACKAGE / "lowering" / "ops"


def _family_imports_allowed(path: Path, imported: str) -> bool:
    if "contrib" in path.parts:
        return True
    return path.stem.startswith("ml_") and imported == "ml"


def test_no_op_family_imports_another():
    bad = []
    for path in sorted(OPS.rglob("*.py")):
        for name in imports(path):
            family = name.removeprefix("transmuter.lowering.ops.")
            if family != name and family and not _family_imports_allowed(path, family):
                bad.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    assert not bad, "\n".join(bad)
