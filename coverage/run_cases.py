"""Run every recorded case through Transmuter and compare with the recorded ONNX Runtime outputs.

    python coverage/run_cases.py cases/ [--rtol 1e-3 --atol 1e-4]

For each case of cases/manifest.json: transmuter.load, transmuter.compile on the recorded inputs
and one more call (timed apart); when compiling fails, eager transmuter.run instead (the compile
error is kept). Outputs are compared as `transmuter check` compares them
(transmuter.checking.compare): per output, max abs error and max error relative to the output's
largest magnitude. Status: "pass" (every output within tolerance), "mismatch" (an output differs:
transmuter.checking.first_divergence then names the first node whose output differs from ONNX
Runtime's, and `reference_saturation` lists the u8 x s8 nodes where ONNX Runtime may have
saturated when the recording CPU lacked VNNI), "error" (Transmuter raised: exception class and first line), or "no-reference" (ONNX
Runtime could not run the model when it was recorded). Writes cases/results.json; offline.
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib.metadata import version
from pathlib import Path

import cases
import jax
import numpy as np

import transmuter
from transmuter import checking

# Real exports are deep; float32 rounding differences between two correct runtimes grow with
# depth past the fixture tests' 1e-4 / 1e-5, so the sweep's defaults are looser.
RTOL, ATOL = 1e-3, 1e-4


def run_case(folder: Path, case: dict, rtol: float, atol: float, vnni: bool | None = None) -> dict:
    """One case's result (see the module docstring for the fields' meaning); `vnni`: whether
    the CPU that recorded the reference had VNNI (None: unknown)."""
    result = {
        "name": case["name"],
        "task": case["task"],
        "status": "error",
        "mode": None,
        "error": None,
        "compile_error": None,
        "load_s": None,
        "compile_s": None,
        "run_s": None,
        "outputs": {},
        "max_abs": None,
        "max_rel": None,
        "divergence": None,
        "reference_saturation": [],
    }
    if case["reference_error"]:
        result.update(status="no-reference", error=case["reference_error"])
        return result
    inputs, expected = cases.case_arrays(folder, case)
    path = cases.case_model_path(folder, case)
    start = time.perf_counter()
    try:
        model = transmuter.load(path)
    except Exception as exc:  # a failing model is a row of the matrix, not a crash
        result["error"] = cases.error_text(exc)
        return result
    result["load_s"] = _since(start)
    try:
        start = time.perf_counter()
        compiled = transmuter.compile(model, inputs)
        result["compile_s"] = _since(start)
        start = time.perf_counter()
        got = _materialize(compiled(inputs))
        result["run_s"] = _since(start)
        result["mode"] = "compiled"
    except Exception as exc:
        result["compile_error"] = cases.error_text(exc)
        try:
            start = time.perf_counter()
            got = _materialize(transmuter.run(model, inputs))
            result["run_s"] = _since(start)
            result["mode"] = "eager"
        except Exception as exc:
            result["error"] = cases.error_text(exc)
            return result
    diffs = checking.compare(got, expected, rtol=rtol, atol=atol)
    result["outputs"] = {d.name: _record(d) for d in diffs}
    result["max_abs"] = max((d.max_abs for d in diffs), default=None)
    result["max_rel"] = max((d.max_rel for d in diffs), default=None)
    if all(d.ok for d in diffs):
        result["status"] = "pass"
    else:
        result["status"] = "mismatch"
        result["divergence"] = divergence(model, path, inputs, rtol, atol)
        # vnni None (not recorded or unknown) counts as "may saturate": the check is advisory.
        result["reference_saturation"] = [
            p.node for p in checking.reference_saturation(model, vnni=bool(vnni))
        ]
    return result


def divergence(model: transmuter.Model, path: Path, inputs: dict, rtol: float, atol: float) -> dict:
    """The first node whose output differs from ONNX Runtime's, on the model as its reference
    was recorded (transmuter.checking.first_divergence)."""
    try:
        found = checking.first_divergence(model, path, inputs, rtol=rtol, atol=atol)
    except Exception as exc:
        return {"error": cases.error_text(exc)}
    if found is None:
        return {"node": None, "detail": "every intermediate agrees within tolerance"}
    return {
        "node": found.node,
        "op_type": found.op_type,
        "output": found.output,
        "detail": _record(found.difference)["detail"],
    }


def _record(diff: checking.Difference) -> dict:
    """A compared value as results.json keeps it; `detail` says what differs when it is not ok."""
    detail = diff.detail or ("" if diff.ok else f"max abs error {diff.max_abs:.3g}")
    return {"max_abs": diff.max_abs, "max_rel": diff.max_rel, "ok": diff.ok, "detail": detail}


def _materialize(outputs: dict) -> dict:
    return {k: np.asarray(v) if not isinstance(v, list) else v for k, v in outputs.items()}


def _since(start: float) -> float:
    return round(time.perf_counter() - start, 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", type=Path, help="folder written by record_references.py")
    parser.add_argument("--rtol", type=float, default=RTOL)
    parser.add_argument("--atol", type=float, default=ATOL)
    args = parser.parse_args(argv)
    manifest = cases.read_manifest(args.cases)
    results = []
    for case in manifest["cases"]:
        result = run_case(args.cases, case, args.rtol, args.atol, manifest.get("vnni"))
        error = f" ({result['error']})" if result["error"] else ""
        mode = f" [{result['mode']}]" if result["mode"] else ""
        print(f"{case['name']}: {result['status']}{mode}{error}")
        results.append(result)
        jax.clear_caches()  # compiled programs of finished cases only hold memory
    cases.write_json(
        args.cases / cases.RESULTS,
        {
            "generated_by": "python coverage/run_cases.py",
            "transmuter": version("transmuter"),
            "jax": jax.__version__,
            "rtol": args.rtol,
            "atol": args.atol,
            "results": results,
        },
    )
    counts = {
        s: sum(r["status"] == s for r in results)
        for s in ("pass", "mismatch", "error", "no-reference")
    }
    print(", ".join(f"{n} {s}" for s, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
