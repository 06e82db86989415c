"""Every third-party import under transmuter/ is a core dependency, or is declared in an extra
that the importing module's docstring names (`transmuter[serve]`, or "the `serve` extra"), so
that `pip install transmuter[<that extra>]` is all a user of that module needs."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Import names whose distribution is named otherwise, or which come with another one.
DISTRIBUTION = {
    "PIL": "pillow",
    "google": "protobuf",  # google.protobuf
    "multipart": "python-multipart",
    "prometheus_client": "prometheus-client",
    "pydantic_core": "pydantic",
}
# Distributions a core dependency requires: importing them needs nothing more.
CORE_REQUIRES = {"protobuf": "onnx"}
EXTRA_NAMED = re.compile(r"transmuter\[(\w+)\]|the `(\w+)` extra")


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")


def _project() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]} | set(CORE_REQUIRES)
    extras = {k: {_name(r) for r in v} for k, v in project["optional-dependencies"].items()}
    return core, extras


def _third_party_imports(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top not in ("transmuter", "__future__"):
                found.add(top)
    return found


MODULES = sorted((ROOT / "transmuter").rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_are_declared(path: Path):
    core, extras = _project()
    tree = ast.parse(path.read_text())
    named = {a or b for a, b in EXTRA_NAMED.findall(ast.get_docstring(tree) or "")}
    unknown = named - set(extras)
    assert not unknown, f"the docstring names extras pyproject.toml lacks: {sorted(unknown)}"
    for module in sorted(_third_party_imports(tree)):
        dist = DISTRIBUTION.get(module, module).lower().replace("_", "-")
        if dist in core:
            continue
        declaring = sorted(e for e in named if dist in extras[e])
        assert declaring, (
            f"imports {module} ({dist}), which is no core dependency: its docstring must name "
            f"an extra that declares it (extras declaring it: "
            f"{sorted(e for e, reqs in extras.items() if dist in reqs) or 'none'})"
        )


def test_the_check_sees_imports_inside_functions():
    tree = ast.parse("def f():\n    from PIL import Image\n    import tqdm.auto\n")
    assert _third_party_imports(tree) == {"PIL", "tqdm"}
