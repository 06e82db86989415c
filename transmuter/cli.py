"""The `transmuter` command: info, run, check, export and bench on a model path or hf:// source.

Errors print one line and a hint; `--debug` shows the traceback. Progress goes to stderr, results
to stdout. `transmuter serve` needs the server's libraries: `pip install transmuter[serve]`.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np

import transmuter
from transmuter import checking, cpu, ir
from transmuter.errors import TransmuterError
from transmuter.pipelines.generation.seq2seq import DECODINGS
from transmuter.pipelines.registry import TASKS

HINTS = {
    "UnsupportedOpError": "see `transmuter info MODEL` for every unsupported operator",
    "InputError": "see `transmuter info MODEL` for the inputs it expects",
    "ModelLoadError": "check the path or hf:// source",
    "HostValueNeeded": "pass the deciding input as a static input, or use `transmuter run`",
    "ExportError": "bound dims with --constraint, fix them with --shape, or fix inputs with --static",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.command(args)
    except (TransmuterError, OSError, ValueError) as exc:
        if args.debug:
            raise
        name = type(exc).__name__
        print(f"error: {name}: {exc}".splitlines()[0], file=sys.stderr)
        print(f"hint: {HINTS.get(name, 'rerun with --debug for the traceback')}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transmuter", description="Run ONNX models as JAX.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    def command(name: str, fn, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.add_argument("model", help="an .onnx path or hf://org/repo/path/model.onnx")
        sub.add_argument("--revision", help="Hub branch, tag or commit (hf:// sources)")
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS)
        sub.set_defaults(command=fn)
        return sub

    command("info", info, "inputs, outputs, opsets, operators and graph breaks of a model")
    for name, fn, help in (
        ("run", run, "run a model compiled on given inputs; print and save the outputs"),
        ("check", check, "compare Transmuter with ONNX Runtime on a model"),
        ("bench", bench, "time Transmuter (compiled) and ONNX Runtime side by side"),
    ):
        sub = command(name, fn, help)
        sub.add_argument(
            "--input", action="append", default=[], metavar="NAME=PATH.npy",
            help="an input from a .npy file (repeat); the others are made from the specs",
        )  # fmt: skip
        sub.add_argument(
            "--dim", action="append", default=[], metavar="NAME=SIZE",
            help="size of a named dim for made-up inputs (defaults: batch 1, sequence 8, past 0)",
        )  # fmt: skip
        sub.add_argument(
            "--config", type=Path, metavar="CONFIG.json",
            help="the model's Hugging Face config.json: vocabulary, image and audio sizes",
        )  # fmt: skip
        if name == "run":
            sub.add_argument("--output-dir", type=Path, help="save each output as NAME.npy")
        if name == "check":
            sub.add_argument("--rtol", type=float, default=1e-4)
            sub.add_argument("--atol", type=float, default=1e-5)
            sub.add_argument(
                "--noise", action="store_true",
                help="also rerun the reference with float inputs scaled by 1 +- 1e-6: a "
                "difference no larger than the reference's own movement is the model's noise "
                "(quantized models), not a mismatch",
            )  # fmt: skip
        if name == "bench":
            sub.add_argument("--runs", type=int, default=20, help="timed calls each (median)")
            sub.add_argument(
                "--profile", action="store_true",
                help="also time each node alone: ms per operator type and the slowest nodes",
            )  # fmt: skip
            sub.add_argument("--top", type=int, default=15, help="slowest nodes --profile lists")
            sub.add_argument(
                "--passes", metavar="NAMES",
                help="graph passes to run at load: comma-separated names, 'none', or the default",
            )  # fmt: skip
    export = command("export", export_, "write a StableHLO artifact with symbolic dims")
    export.add_argument("-o", "--output", type=Path, required=True, help="artifact directory")
    export.add_argument("--params", choices=("embed", "argument"), default="embed")
    export.add_argument("--platform", action="append", help="cpu, cuda, rocm, tpu (repeat)")
    export.add_argument(
        "--shape", action="append", default=[], metavar="NAME=DIMS",
        help="an input's dims instead of the file's, e.g. input_ids=batch,sequence or pixel_values=1,3,h,w",
    )  # fmt: skip
    export.add_argument(
        "--constraint", action="append", default=[], metavar="EXPR",
        help="a bound on the symbolic dims, e.g. 'sequence <= 512' (repeat)",
    )  # fmt: skip
    export.add_argument(
        "--static", action="append", default=[], metavar="NAME=PATH.npy",
        help="an input fixed at export time, e.g. a use_cache flag (repeat)",
    )  # fmt: skip
    for which in ("inputs", "outputs"):
        export.add_argument(
            f"--int64-{which}", choices=("int64", "int32"), default="int64",
            help=f"int32 program {which} where ONNX says int64 (runs with x64 off)",
        )  # fmt: skip
    serve = commands.add_parser(
        "serve", help="serve a repository's task over HTTP (OpenAI's and TEI's APIs)",
        description="serve a repository's task over HTTP (OpenAI's and TEI's APIs)",
    )  # fmt: skip
    serve.add_argument("repo", help="a model repository: a folder or hf://org/repo[@revision]")
    serve.add_argument(
        "--task", required=True, metavar="TASK",
        help="; ".join(f"{name}: {task.summary}" for name, task in TASKS.items()),
    )  # fmt: skip
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--batch-size", type=int, default=8, help="items per device call")
    serve.add_argument(
        "--batch-timeout-ms", type=float, default=5.0,
        help="how long a request waits for others to batch with",
    )  # fmt: skip
    serve.add_argument(
        "--max-queue", type=int, default=1024,
        help="requests waiting beyond the running batch before 429s",
    )  # fmt: skip
    serve.add_argument("--max-client-batch-size", type=int, default=32, help="items a request")
    serve.add_argument("--dtype", help="transformers.js weight files: fp32, fp16, q8, q4, q4f16")
    serve.add_argument(
        "--model-shards", type=int, default=1,
        help="split the params over this many devices (tensor parallel), for a model too "
        "large for one",
    )  # fmt: skip
    serve.add_argument(
        "--decoding", choices=sorted(DECODINGS),
        help="automatic-speech-recognition: past (the with-past decoder, the default: a program "
        "per token) or padded (the no-past decoder over padded tokens: a program per bucket)",
    )  # fmt: skip
    serve.add_argument(
        "--cache-dir",
        help="persist compiled programs in this folder, so that a restart skips XLA",
    )
    serve.add_argument("--model-id", help="the name clients give as model (default: the folder's)")
    serve.add_argument(
        "--max-request-bytes", type=_size, metavar="SIZE",
        help="refuse larger bodies with a 413 (default: 2MB as text-embeddings-inference; "
        "25MB for image and audio tasks)",
    )  # fmt: skip
    serve.add_argument(
        "--max-model-len", type=int, metavar="TOKENS",
        help="text-generation: positions a request may use, prompt and new tokens (default: "
        "the model's, capped so that the slots' past fits --kv-memory)",
    )  # fmt: skip
    serve.add_argument(
        "--kv-memory", type=_size, metavar="SIZE",
        help="text-generation: memory for the slots' past, e.g. 4GiB (default: half the "
        "device's memory)",
    )  # fmt: skip
    serve.add_argument(
        "--no-warmup", dest="warmup", action="store_false",
        help="take traffic at once instead of compiling the batch sizes first",
    )  # fmt: skip
    serve.add_argument("--debug", action="store_true", default=argparse.SUPPRESS)
    serve.set_defaults(command=serve_)
    return parser


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _load(args) -> transmuter.Model:
    _progress(f"loading {args.model}")
    start = time.perf_counter()
    model = transmuter.load(args.model, **_revision(args), **_passes(args))
    _progress(f"loaded in {time.perf_counter() - start:.2f} s")
    return model


def _passes(args) -> dict:
    given = getattr(args, "passes", None)
    if given is None:
        return {}
    names = [n.strip() for n in given.split(",") if n.strip()]
    return {"optimize": False if names == ["none"] else names}


def _revision(args) -> dict:
    return {"revision": args.revision} if args.revision else {}


def _inputs(args, model) -> dict[str, np.ndarray]:
    given = {}
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep:
            raise ValueError(f"--input {item!r}: write NAME=PATH.npy")
        given[name] = np.load(path)
    dims = {}
    for item in args.dim:
        name, sep, size = item.partition("=")
        if not sep or not size.isdigit():
            raise ValueError(f"--dim {item!r}: write NAME=SIZE")
        dims[name] = int(size)
    config = json.loads(args.config.read_text()) if args.config is not None else None
    return checking.example_inputs(model, dims, given=given, config=config)


def _spec(value_type, owner: str = "") -> str:
    if value_type is None:
        return "undeclared"
    if isinstance(value_type, ir.TensorType) and value_type.shape is not None:
        # A dim the file leaves open (no name, or Paddle's -1) carries the loader's fresh name
        # `<owner>_dim<axis>`, which says nothing to the reader: show it as ONNX Runtime does.
        dims = ", ".join(
            "?" if isinstance(d, ir.SymbolicDim) and d.name == f"{owner}_dim{axis}" else str(d)
            for axis, d in enumerate(value_type.shape)
        )
        return f"tensor({np.dtype(value_type.dtype).name})[{dims}]"
    return str(value_type)


def info(args) -> int:
    from transmuter.frontend import load_model
    from transmuter.runtime.analysis import unsupported_ops

    _progress(f"reading {args.model}")
    source = _local_source(args)
    model_ir = load_model(source)
    graph = model_ir.graph
    print(f"model: {args.model}")
    if model_ir.producer:
        print(f"producer: {model_ir.producer}")
    print(
        "opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(model_ir.opsets.items()))
    )
    print("inputs:")
    for v in graph.inputs:
        if v.name not in graph.initializers:
            print(f"  {v.name}: {_spec(v.type, v.name)}")
    print("outputs:")
    for v in graph.outputs:
        print(f"  {v.name}: {_spec(v.type, v.name)}")
    weights = sum(a.nbytes for a in graph.initializers.values())
    print(f"initializers: {len(graph.initializers)} ({weights / 2**20:.1f} MiB)")
    histogram = collections.Counter(
        f"{'' if n.domain == '' else n.domain + '::'}{n.op_type}" for n in _nodes(graph)
    )
    print(f"operators: {sum(histogram.values())} nodes, {len(histogram)} types")
    for op, count in sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {count:6d}  {op}")
    missing = unsupported_ops(model_ir)
    print("unsupported: " + (", ".join(missing) if missing else "none"))
    if missing:
        print("graph breaks: unknown until every operator is supported")
        return 1
    breaks = transmuter.Model(model_ir, source=str(args.model)).graph_breaks()
    print("graph breaks: " + ("none (one compiled program per shape)" if not breaks else ""))
    for found in breaks:
        print(f"  {found}")
    return 0


def _nodes(graph: ir.Graph):
    for node in graph.nodes:
        yield node
        for sub in ir.subgraphs(node):
            yield from _nodes(sub)


def _local_source(args):
    """What the front end reads: the path, or for hf:// sources the downloaded file."""
    model = args.model
    if isinstance(model, str) and model.startswith("hf://"):
        from transmuter.frontend.hub import resolve

        return resolve(model, **_revision(args))
    return model


def run(args) -> int:
    model = _load(args)
    inputs = _inputs(args, model)
    _progress("compiling")
    start = time.perf_counter()
    compiled = transmuter.compile(model, inputs)
    _progress(f"compiled and ran in {time.perf_counter() - start:.2f} s")
    outputs = compiled(inputs)
    for name, value in outputs.items():
        print(f"{name}: {_summary(value)}")
        if args.output_dir is not None:
            args.output_dir.mkdir(parents=True, exist_ok=True)
            np.save(args.output_dir / f"{_file_name(name)}.npy", np.asarray(value))
    if args.output_dir is not None:
        print(f"saved {len(outputs)} outputs to {args.output_dir}")
    return 0


def _summary(value) -> str:
    array = np.asarray(value)
    text = f"{array.dtype}{list(array.shape)}"
    if array.size and array.dtype.kind in "fiub":
        as_float = array.astype(np.float64)
        text += f" min {as_float.min():.4g} max {as_float.max():.4g} mean {as_float.mean():.4g}"
    return text


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def check(args) -> int:
    model = _load(args)
    inputs = _inputs(args, model)
    source = model.origin.path  # the file it was read from (for hf://, the downloaded one)
    _progress("running ONNX Runtime (optimizations off)")
    reference = checking.reference_outputs(source, inputs)
    _progress("running Transmuter (compiled)")
    ours = transmuter.compile(model, inputs)(inputs)
    diffs = checking.compare(ours, reference, rtol=args.rtol, atol=args.atol)
    noise = None
    if args.noise:
        _progress("rerunning ONNX Runtime with the float inputs scaled by 1 +- 1e-6")
        noise = checking.reference_noise(source, inputs, reference)
    width = max(len(d.name) for d in diffs)
    failed = []
    for d in diffs:
        if d.ok:
            mark = "ok"
        elif noise is not None and d.max_abs <= noise[d.name]:
            mark = f"within the model's noise (the reference moves by {noise[d.name]:.3g})"
        else:
            notes = [d.detail] if d.detail else []
            if noise is not None:
                notes.append(f"the reference moves by {noise[d.name]:.3g}")
            mark = "MISMATCH" + (f"  ({'; '.join(notes)})" if notes else "")
            failed.append(d)
        print(f"  {d.name:<{width}}  max abs {d.max_abs:.3g}  max rel {d.max_rel:.3g}  {mark}")
    if not failed:
        within = " or within the model's noise" if noise is not None else ""
        print(f"all {len(diffs)} outputs match{within} (rtol {args.rtol:g}, atol {args.atol:g})")
        return 0
    if any(checking.made_non_finite(ours[d.name], reference[d.name]) for d in failed):
        _progress("looking for the first node that makes a NaN or infinity")
        found = checking.first_non_finite(model, source, inputs)
        if found is None:
            print("no node makes a non-finite value when run eagerly: the compiled program does")
        else:
            print(
                f"first non-finite value: node {found.node!r} ({found.op_type}) output "
                f"{found.output!r}: {found.difference.detail}"
            )
            print(f"  its inputs: {', '.join(found.inputs)}")
        return 1
    _progress("looking for the first diverging node")
    found = checking.first_divergence(model, source, inputs, rtol=args.rtol, atol=args.atol)
    if found is None:
        print("every intermediate agrees: the compiled run differs from the eager one")
    else:
        d = found.difference
        print(
            f"first divergence: node {found.node!r} ({found.op_type}) output {found.output!r}: "
            f"max abs {d.max_abs:.3g} {d.detail}".rstrip()
        )
        print(f"  its inputs: {', '.join(found.inputs)}")
    _print_saturation(checking.reference_saturation(model), found)
    return 1


def _print_saturation(
    products: list[checking.SaturatingProduct], found: checking.Divergence | None
) -> None:
    """Where the reference itself may be wrong on this CPU, say so next to the mismatch."""
    if not products:
        return
    print(
        f"note: ONNX Runtime's reference may saturate on this CPU ({cpu.describe()}): without "
        "VNNI its u8 x s8 kernels add pairs of products in 16-bit saturating lanes, and these "
        "nodes can pass 32767:"
    )
    for p in products:
        print(f"  {p.node} ({p.op_type}): {p.inputs[0]} x {p.inputs[1]}, pairs up to {p.largest}")
    if found is not None and any(p.node == found.node for p in products):
        print("  the first divergence is one of them: compare on a CPU with VNNI to be sure")


def bench(args) -> int:
    model = _load(args)
    inputs = _inputs(args, model)
    _progress("compiling")
    compiled = transmuter.compile(model, inputs)
    ours = _median_ms(lambda: _block(compiled(inputs)), args.runs)
    print(f"transmuter   {ours:9.3f} ms (median of {args.runs})")
    if args.profile:
        from transmuter.runtime.profile import profile

        _progress("profiling: each node compiled and timed alone")
        print(profile(model, inputs, runs=min(args.runs, 10)).report(args.top))
    if importlib.util.find_spec("onnxruntime") is None:
        print("onnxruntime not installed: no side-by-side figure")
        return 0
    session = checking.reference_session(model.origin.path, optimized=True)
    feeds = checking.reference_feeds(session, inputs)
    theirs = _median_ms(lambda: session.run(None, feeds), args.runs)
    print(f"onnxruntime  {theirs:9.3f} ms (default optimizations)")
    print(f"ratio        {ours / theirs:9.2f} (transmuter / onnxruntime; below 1 is faster)")
    return 0


def _block(outputs):
    for value in outputs.values():
        if hasattr(value, "block_until_ready"):
            value.block_until_ready()


def _median_ms(fn, runs: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def serve_(args) -> int:
    try:
        import uvicorn

        from transmuter.serving import http
    except ImportError as exc:
        print(f"error: transmuter serve needs the serve extra ({exc.name} is not installed): "
              "pip install 'transmuter[serve]'", file=sys.stderr)  # fmt: skip
        return 1
    try:
        http.routes_for(args.task)
    except transmuter.InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.cache_dir:
        transmuter.use_persistent_cache(args.cache_dir)
    repo = transmuter.load_repo(args.repo, dtype=args.dtype)
    if args.model_shards != 1:
        devices = jax.devices()
        if not 1 < args.model_shards <= len(devices):
            print(f"error: --model-shards {args.model_shards} needs that many devices, and "
                  f"there are {len(devices)} ({devices[0].platform})", file=sys.stderr)  # fmt: skip
            return 1
        mesh = jax.sharding.Mesh(np.array(devices[: args.model_shards]), ("model",))
        repo.shard(mesh, "model")
        _progress(f"params split over {args.model_shards} {devices[0].platform} devices")
    model_id = args.model_id or args.repo.rstrip("/").split("/")[-1].split("@")[0]
    try:
        server = http.Server(
            repo, args.task, model_id=model_id, batch_size=args.batch_size,
            batch_timeout_ms=args.batch_timeout_ms, max_queue=args.max_queue,
            max_client_batch_size=args.max_client_batch_size, decoding=args.decoding,
            max_request_bytes=args.max_request_bytes, max_model_len=args.max_model_len,
            kv_memory=args.kv_memory,
        )  # fmt: skip
    except transmuter.InputError as error:  # a budget that does not fit, a bad flag
        print(f"error: {error}", file=sys.stderr)
        return 1
    _progress(f"serving {model_id!r} ({args.task}) on http://{args.host}:{args.port}")
    uvicorn.run(http.app(server, warmup=args.warmup), host=args.host, port=args.port,
                log_level="warning")  # fmt: skip
    return 0


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 1 << 10,
          "mib": 1 << 20, "gib": 1 << 30}  # fmt: skip


def _size(text: str) -> int:
    """A size in bytes: 2000000, 2MB, 512KiB, 4GiB."""
    number = text.rstrip("bBkKmMgGiI")
    unit = text[len(number) :].lower()
    try:
        value = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 2MB, 4GiB)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a size is at least 1 byte")
    return int(value)


def export_(args) -> int:
    model = _load(args)
    platforms = tuple(args.platform or ("cpu",))
    options = {
        "params": args.params,
        "static_inputs": _named(args.static, "--static", np.load) or None,
        "constraints": tuple(args.constraint),
    }
    shapes = _named(args.shape, "--shape", _dims)
    _progress(f"exporting for {', '.join(platforms)} (params {args.params})")
    narrowing = {"int64_inputs": args.int64_inputs, "int64_outputs": args.int64_outputs}
    exported = transmuter.export(model, shapes or None, platforms=platforms, **options, **narrowing)
    transmuter.write_export(exported, args.output, model=model, **options)
    for constraint in transmuter.derived_constraints(exported):
        print(f"derived constraint: {constraint}")
    print(f"wrote {args.output}")
    for path in sorted(args.output.iterdir()):
        print(f"  {path.name}  {path.stat().st_size / 1024:.1f} KiB")
    return 0


def _named(items: list[str], flag: str, parse) -> dict:
    """NAME=VALUE options as a dict, each VALUE parsed."""
    found = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"{flag} {item!r}: write NAME=VALUE")
        found[name] = parse(value)
    return found


def _dims(text: str) -> tuple:
    return tuple(int(d) if d.strip().isdigit() else d.strip() for d in text.split(","))


if __name__ == "__main__":
    sys.exit(main())
