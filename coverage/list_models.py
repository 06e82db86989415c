"""The table of tested models, as markdown: repo, file, task, size, ops, status.

    python coverage/list_models.py cases/ [--out coverage/models.md]

Reads cases/manifest.json and, when run_cases.py has run, cases/results.json. One row per model in
task order, most downloaded first: Hub repo and file (or the file inside the models folder), task,
downloads, size on disk (with external data), node count (subgraphs included), distinct op types,
status and the largest absolute error against ONNX Runtime.
"""

from __future__ import annotations

import sys

import cases
from print_matrix import MARKS, by_task, report_main, status_of


def size_text(size: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def table(manifest: dict, results: dict[str, dict]) -> str:
    lines = [
        "| Repo | File | Task | Downloads | Size | Nodes | Op types | Status | Max abs error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for task, listed in by_task(manifest).items():
        for case in listed:
            result = results.get(case["name"])
            status = status_of(result)
            error = result.get("max_abs") if result else None
            lines.append(
                f"| {case.get('repo') or '—'} | {cases.markdown_cell(case['file'])} | {task} "
                f"| {case.get('downloads') if case.get('downloads') is not None else '—'} "
                f"| {size_text(case['size_bytes'])} | {case['nodes']} | {len(case['op_types'])} "
                f"| {MARKS[status]} {status} | {f'{error:.1e}' if error is not None else '—'} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return report_main(table, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
