"""The task x model coverage matrix of a run, as markdown.

    python coverage/print_matrix.py cases/ [--out coverage/matrix.md]

Reads cases/manifest.json and cases/results.json (run_cases.py). A summary per task, then the
matrix: one row per task, its models by downloads (most downloaded first), each cell the status
mark, the model and its largest absolute error against ONNX Runtime; then what failed and why
(the error's first line, or the first diverging node of a mismatch).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import cases

MARKS = {"pass": "✅", "mismatch": "⚠️", "error": "❌", "no-reference": "➖", "not run": "·"}
STATUSES = ["pass", "mismatch", "error", "no-reference", "not run"]


def display_name(case: dict) -> str:
    """The repo, with the file when it is not the usual onnx/model.onnx; else the case name."""
    if not case.get("repo"):
        return case["name"]
    if case["file"] in ("onnx/model.onnx", "model.onnx"):
        return case["repo"]
    return f"{case['repo']} ({case['file']})"


def by_task(manifest: dict) -> dict[str, list[dict]]:
    """Task -> its cases, most downloaded first (then by name)."""
    tasks = defaultdict(list)
    for case in manifest["cases"]:
        tasks[case["task"]].append(case)
    for listed in tasks.values():
        listed.sort(key=lambda c: (-(c.get("downloads") or 0), c["name"]))
    return dict(sorted(tasks.items()))


def status_of(result: dict | None) -> str:
    return result["status"] if result else "not run"


def cell(case: dict, result: dict | None) -> str:
    status = status_of(result)
    text = f"{MARKS[status]} {cases.markdown_cell(display_name(case))}"
    if result and result.get("max_abs") is not None:
        text += f" ({result['max_abs']:.1e})"
    if result and result.get("mode") == "eager":
        text += " eager"
    return text


def problem(result: dict) -> str:
    if result["status"] == "mismatch":
        worst = [f"{n}: {o['detail']}" for n, o in result["outputs"].items() if not o["ok"]]
        found = result.get("divergence") or {}
        if found.get("node") is not None:
            where = (
                f"first diverging node {found['node']!r} ({found['op_type']}), {found['detail']}"
            )
        else:
            where = found.get("detail") or found.get("error", "")
        saturating = result.get("reference_saturation") or []
        if saturating:
            where += (
                ". ONNX Runtime's u8 x s8 kernels may have saturated (no VNNI where it was "
                f"recorded) at {', '.join(saturating)}"
            )
        return f"{'; '.join(worst)}. {where}"
    return result.get("error") or ""


def matrix(manifest: dict, results: dict[str, dict]) -> str:
    tasks = by_task(manifest)
    width = max((len(listed) for listed in tasks.values()), default=0)
    lines = [
        "| Task | Models | " + " | ".join(f"{MARKS[s]} {s}" for s in STATUSES[:-1]) + " |",
        "|---|---|" + "---|" * (len(STATUSES) - 1),
    ]
    for task, listed in tasks.items():
        counts = [
            sum(status_of(results.get(c["name"])) == s for c in listed) for s in STATUSES[:-1]
        ]
        lines.append(f"| {task} | {len(listed)} | " + " | ".join(map(str, counts)) + " |")
    lines += [
        "",
        "| Task | " + " | ".join(f"#{i + 1}" for i in range(width)) + " |",
        "|---|" + "---|" * width,
    ]
    for task, listed in tasks.items():
        cells = [cell(c, results.get(c["name"])) for c in listed]
        cells += [""] * (width - len(cells))
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    problems = [
        (case, results[case["name"]])
        for listed in tasks.values()
        for case in listed
        if case["name"] in results and results[case["name"]]["status"] != "pass"
    ]
    if problems:
        lines += ["", "Problems:", ""]
        for case, result in problems:
            lines.append(
                f"- {MARKS[result['status']]} {display_name(case)} ({case['task']}): "
                f"{cases.markdown_cell(problem(result))}"
            )
    return "\n".join(lines) + "\n"


def report_main(render, description: str, argv: list[str] | None) -> int:
    """The command line of a markdown report over a cases folder: `render(manifest, results)`
    printed, or written to --out."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("cases", type=Path, help="folder written by record_references.py")
    parser.add_argument("--out", type=Path, help="write the markdown here instead of stdout")
    args = parser.parse_args(argv)
    text = render(cases.read_manifest(args.cases), cases.read_results(args.cases))
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    return report_main(matrix, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
