"""Operator coverage: what Transmuter implements and how it fares on ONNX's node conformance suite.

    python coverage/ops_report.py                      # runs the node suite, then writes the report
    python coverage/ops_report.py --results RUN.xml    # reuses a run's JUnit XML instead

writes coverage/ops.md and coverage/ops.json. Per (domain, op): the since-versions registered in
`transmuter.lowering`, the schema versions onnx has that are not registered, the conformance cases
passed / failed / xfailed (strict expected failures, tests/conformance/expected_failures.py), the
inputs the op needs on the host (`OpDef.host_inputs`), whether its output shapes depend on data
(`OpDef.data_dependent`) and when it asks for host values while tracing (`OpDef.may_need_host`,
`OpDef.strings_on_host`): all read from the registrations, as the runtime reads them. Then the ai.onnx operators of the installed onnx with no lowering, and the
cases whose operator is in another domain (ai.onnx.ml, training) with no lowering.

Results come from pytest's JUnit XML for tests/conformance/test_backend_node.py: the run this
script starts (`-n auto` when pytest-xdist is installed), or one given with --results (a CI run's
`--junitxml` file). A case counts for the operator of its node; a `*_expanded` case (the operator's
function body, run as other operators) is counted apart, under the operator it expands.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import warnings
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import onnx
import onnx.defs
from onnx.backend.test.loader import load_model_tests

from transmuter.lowering import registered

ROOT = Path(__file__).resolve().parents[1]
SUITE = "tests/conformance/test_backend_node.py"
OUTCOMES = ("passed", "failed", "xfailed", "skipped")
EXPANDED = re.compile(r"_expanded(_ver\d+)?$")
DEVICE = re.compile(r"_(cpu|cuda)$")


def run_suite(junit: Path) -> None:
    """Run the node suite, writing JUnit XML to `junit`. Failing cases are data, not an error."""
    try:
        import xdist  # noqa: F401

        parallel = ["-n", "auto"]
    except ImportError:
        parallel = []
    command = [sys.executable, "-m", "pytest", SUITE, "-q", "-p", "no:cacheprovider"]
    command += [*parallel, f"--junitxml={junit}"]
    print("running:", " ".join(command), file=sys.stderr)
    subprocess.run(command, cwd=ROOT, check=False, stdout=subprocess.DEVNULL)
    if not junit.exists():
        raise SystemExit(
            f"the conformance run wrote no results ({junit}); run it by hand to see why"
        )


def read_results(junit: Path) -> dict[str, dict]:
    """Test name (device suffix kept) -> {"outcome", "detail"} from a JUnit XML file."""
    results = {}
    for case in ET.parse(junit).iter("testcase"):
        if not case.get("classname", "").endswith("OnnxBackendNodeModelTest"):
            continue
        outcome, detail = "passed", ""
        for child in case:
            kind = child.get("type", "")
            if child.tag in ("failure", "error"):
                outcome, detail = "failed", first_line(child.get("message") or child.text or "")
            elif child.tag == "skipped" and kind == "pytest.xfail":
                outcome, detail = "xfailed", child.get("message", "")
            elif child.tag == "skipped":
                outcome, detail = "skipped", child.get("message", "")
        results[case.get("name")] = {"outcome": outcome, "detail": detail}
    return results


# numpy's assertion messages: summary lines, then the mismatching positions and both arrays.
_POSITIONS = ("Mismatch at ind", "First ", "[")
_ARRAYS = ("x:", "y:", "ACTUAL", "DESIRED", "Max relative")


def first_line(message: str) -> str:
    """The first line of an error; for numpy's assertions (which start on the next line) the
    summary lines: what differs, how many elements, by how much."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    head = lines[0]
    if head.endswith(":") and len(lines) > 1:
        summary = []
        for line in lines[1:]:
            if line.startswith(_ARRAYS) or len(summary) == 4:
                break
            if not line.startswith(_POSITIONS):
                summary.append(line)
        head = f"{head} {'; '.join(summary)}"
    return head if len(head) <= 400 else head[:397] + "..."


def case_ops() -> dict[str, tuple[str, str, bool]]:
    """Node case name -> (domain, op type, expanded). An expanded case belongs to the operator of
    the case it expands (its own graph holds the function body's nodes)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the cases compute inf/nan on purpose
        cases = {case.name: case for case in load_model_tests(kind="node")}
    owners = {}
    for name in cases:
        base = EXPANDED.sub("", name)
        node = cases[base if base in cases else name].model.graph.node[0]
        domain = "" if node.domain == "ai.onnx" else node.domain
        owners[name] = (domain, node.op_type, base != name)
    return owners


def schema_versions() -> dict[tuple[str, str], dict]:
    """(domain, op) -> the since-versions onnx defines and whether the latest is deprecated."""
    found: dict[tuple[str, str], dict] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        domain = "" if schema.domain == "ai.onnx" else schema.domain
        entry = found.setdefault(
            (domain, schema.name), {"versions": set(), "latest": 0, "deprecated": False}
        )
        entry["versions"].add(schema.since_version)
        if schema.since_version > entry["latest"]:
            entry["latest"], entry["deprecated"] = schema.since_version, schema.deprecated
    return found


def host_needs(defs) -> dict[str, str]:
    """Input index -> what the op needs it for; a need that only some versions have names them."""
    versions = [d.since for d in defs]
    reasons: dict[tuple[int, str], list[int]] = defaultdict(list)
    for d in defs:
        for index, reason in d.host_inputs.items():
            reasons[(index, reason)].append(d.since)
    needs: dict[str, list[str]] = defaultdict(list)
    for (index, reason), since in sorted(reasons.items()):
        where = "" if since == versions else f" (v{', v'.join(map(str, since))})"
        needs[str(index)].append(reason + where)
    return {index: "; ".join(texts) for index, texts in needs.items()}


def asks_host(defs) -> str:
    """When the op asks for host values while tracing (a possible break), per its registration."""
    reasons = {d.may_need_host for d in defs if d.may_need_host}
    if any(d.strings_on_host for d in defs):
        reasons.add("given strings")
    return "; ".join(sorted(reasons))


def build(results: dict[str, dict], source: str) -> dict:
    owners = case_ops()
    schemas = schema_versions()
    lowered: dict[tuple[str, str], list] = defaultdict(list)
    for opdef in registered():
        lowered[(opdef.domain, opdef.op_type)].append(opdef)

    tallies: dict[tuple[str, str], dict] = defaultdict(
        lambda: {
            "cases": dict.fromkeys(OUTCOMES, 0),
            "expanded_cases": dict.fromkeys(OUTCOMES, 0),
            "failures": [],
            "xfails": [],
        }
    )
    unknown = []
    for test, result in sorted(results.items()):
        case = DEVICE.sub("", test)
        if case not in owners:
            unknown.append(test)
            continue
        domain, op_type, expanded = owners[case]
        tally = tallies[(domain, op_type)]
        tally["expanded_cases" if expanded else "cases"][result["outcome"]] += 1
        if result["outcome"] == "failed":
            tally["failures"].append({"case": test, "error": result["detail"]})
        elif result["outcome"] == "xfailed":
            tally["xfails"].append({"case": test, "reason": result["detail"]})

    ops = []
    for key in sorted(lowered):
        defs = lowered[key]
        domain, op_type = key
        since = [d.since for d in defs]
        schema = schemas.get(key, {"versions": set()})
        ops.append(
            {
                "domain": domain or "ai.onnx",
                "op": op_type,
                "family": defs[0].fn.__module__.removeprefix("transmuter.lowering.ops."),
                "since_versions": since,
                "onnx_versions_not_registered": sorted(schema["versions"] - set(since)),
                "host_inputs": host_needs(defs),
                "data_dependent": any(d.data_dependent for d in defs),
                "asks_host": asks_host(defs),
                "random": any(d.random for d in defs),
                **tallies[key],
            }
        )
    missing = []
    for (domain, op_type), schema in sorted(schemas.items()):
        if domain == "" and (domain, op_type) not in lowered:
            missing.append(
                {
                    "op": op_type,
                    "onnx_versions": sorted(schema["versions"]),
                    "deprecated": schema["deprecated"],
                    **tallies[(domain, op_type)],
                }
            )
    elsewhere = [
        {"domain": domain, "op": op_type, **tally}
        for (domain, op_type), tally in sorted(tallies.items())
        if domain != "" and (domain, op_type) not in lowered
    ]
    totals = dict.fromkeys(OUTCOMES, 0)
    for result in results.values():
        totals[result["outcome"]] += 1
    return {
        "generated_by": "python coverage/ops_report.py",
        "onnx_version": onnx.__version__,
        "results": source,
        "totals": totals,
        "ops": ops,
        "ai_onnx_without_lowering": missing,
        "other_domains_without_lowering": elsewhere,
        "tests_not_in_the_suite": unknown,
    }


def _counts(tally: dict, none: str = "none") -> str:
    if not any(tally.values()):
        return none
    text = f"{tally['passed']} / {tally['failed']} / {tally['xfailed']}"
    return text + (f" ({tally['skipped']} skipped)" if tally["skipped"] else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(report: dict) -> str:
    t = report["totals"]
    lines = [
        "# Operator coverage",
        "",
        f"Generated by `{report['generated_by']}` from {report['results']}; onnx "
        f"{report['onnx_version']}. Do not edit by hand.",
        "",
        f"ONNX backend node suite: **{t['passed']} passed, {t['failed']} failed, "
        f"{t['xfailed']} expected failures** (strict xfails, listed with their reasons in "
        f"`tests/conformance/expected_failures.py`), {t['skipped']} skipped.",
        "",
        "*Cases*: passed / failed / xfailed, counted for the operator of their node; *expanded* "
        "cases run the operator's ONNX function body (other operators) and are counted apart. "
        "*Not registered*: schema versions onnx defines that have no lowering of their own (a "
        "model at such an opset uses the highest registered version below it; versions below the "
        "first registered one are unsupported). *Host inputs*: input index: what the op needs as a "
        "concrete value (a graph break when it is computed on the device). *Data-dep.*: output "
        "shapes depend on input values. *Asks at trace*: when the op may ask for a host value while "
        "tracing (a possible break). ONNX's node suite has no cases for the com.microsoft "
        "operators (and few for ai.onnx.ml): those are tested by single-node tests against ONNX "
        "Runtime in `tests/ops/` (`test_contrib_*.py`, `test_ml.py`), and the com.microsoft ones "
        "also by the ORT-made variant models in `tests/fixtures/variants/`.",
        "",
        "## Implemented operators",
        "",
        "| Domain | Op | Family | Since-versions | Not registered | Cases | Expanded | Host inputs "
        "| Data-dep. | Asks at trace |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for op in report["ops"]:
        hosts = "; ".join(f"{i}: {r}" for i, r in op["host_inputs"].items())
        lines.append(
            f"| {op['domain']} | {op['op']} | {op['family']} "
            f"| {', '.join(map(str, op['since_versions']))} "
            f"| {', '.join(map(str, op['onnx_versions_not_registered']))} "
            f"| {_counts(op['cases'])} | {_counts(op['expanded_cases'], '')} "
            f"| {_cell(hosts)} | {'yes' if op['data_dependent'] else ''} "
            f"| {_cell(op['asks_host'])} |"
        )
    missing = report["ai_onnx_without_lowering"]
    lines += [
        "",
        f"## ai.onnx operators of onnx {report['onnx_version']} with no lowering ({len(missing)})",
        "",
        "| Op | ONNX since-versions | Deprecated | Cases | Expanded |",
        "|---|---|---|---|---|",
    ]
    for op in missing:
        lines.append(
            f"| {op['op']} | {', '.join(map(str, op['onnx_versions']))} "
            f"| {'yes' if op['deprecated'] else ''} | {_counts(op['cases'])} "
            f"| {_counts(op['expanded_cases'], '')} |"
        )
    if report["other_domains_without_lowering"]:
        lines += [
            "",
            "## Node cases of other domains with no lowering",
            "",
            "| Domain | Op | Cases |",
            "|---|---|---|",
        ]
        for op in report["other_domains_without_lowering"]:
            lines.append(f"| {op['domain']} | {op['op']} | {_counts(op['cases'])} |")
    xfails = [x for op in report["ops"] + missing for x in op["xfails"]]
    if xfails:
        lines += ["", "## Expected failures", ""]
        for x in sorted(xfails, key=lambda x: x["case"]):
            lines.append(f"- `{x['case']}`: {x['reason']}")
    failures = [
        (op.get("domain", "ai.onnx"), op["op"], f)
        for op in report["ops"] + missing + report["other_domains_without_lowering"]
        for f in op["failures"]
    ]
    if failures:
        lines += ["", f"## Failing cases ({len(failures)})", ""]
        for domain, op_type, f in failures:
            lines.append(f"- {domain}::{op_type} `{f['case']}`: {_cell(f['error'])}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, help="JUnit XML of a node suite run to reuse")
    parser.add_argument("--out", type=Path, default=ROOT / "coverage", help="output folder")
    args = parser.parse_args(argv)
    if args.results is not None:
        results = read_results(args.results)
        source = f"the conformance results in `{args.results.name}`"
    else:
        with tempfile.TemporaryDirectory() as tmp:
            junit = Path(tmp) / "node.xml"
            run_suite(junit)
            results = read_results(junit)
        source = f"a run of `{SUITE}`"
    if not results:
        raise SystemExit("no node suite results found: was the right JUnit file given?")
    report = build(results, source)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ops.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    (args.out / "ops.md").write_text(markdown(report))
    t = report["totals"]
    print(
        f"wrote {args.out / 'ops.md'} and ops.json: {t['passed']} passed, {t['failed']} failed, "
        f"{t['xfailed']} xfailed, {t['skipped']} skipped"
    )


if __name__ == "__main__":
    main()
