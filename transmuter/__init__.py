"""Transmuter: run ONNX models as JAX programs.

`load` reads a model; `run` evaluates it (eagerly, or inside jax.jit / grad / vmap; `jit` is
jax.jit with the XLA options `compile` uses); `compile` makes a callable that keeps one compiled
program per input shape; `save` writes a model back to ONNX with new weights; `export` makes one
StableHLO program with symbolic dims (`write_export` puts it on disk). `load_repo` and
`pipeline` (transmuter.pipelines, needing the `pipelines` extra) run whole Hugging Face
repositories as tasks; `Serving` batches concurrent callers of one (transmuter.serving;
`transmuter serve` puts it behind HTTP).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from transmuter import errors, telemetry
from transmuter.errors import (
    HostValueNeeded,
    InputError,
    ModelLoadError,
    NodeError,
    ShapeError,
    TransmuterError,
    UnsupportedOpError,
)
from transmuter.frontend import hub, load_model
from transmuter.frontend.saver import Origin, save_model
from transmuter.ir.compute_type import COMPUTE_TYPES, runs_half_in_float32, with_compute_type
from transmuter.ir.last_position import at_position as at_chosen_position
from transmuter.ir.last_position import last_position as at_last_position
from transmuter.ir.split import split as split_graph
from transmuter.runtime import CompiledModel, Model, run, sharding, xla_options
from transmuter.runtime.disk_cache import use_persistent_cache
from transmuter.runtime.export import ExportError, derived_constraints, export, write_export
from transmuter.runtime.optimize import optimize as optimize_graph

__all__ = [
    "CompiledModel",
    "ExportError",
    "HostValueNeeded",
    "InputError",
    "Model",
    "ModelLoadError",
    "NodeError",
    "Serving",
    "ShapeError",
    "TransmuterError",
    "UnsupportedOpError",
    "compile",
    "derived_constraints",
    "errors",
    "export",
    "jit",
    "load",
    "load_repo",
    "pipeline",
    "run",
    "save",
    "split",
    "telemetry",
    "use_persistent_cache",
    "write_export",
]


def __getattr__(name: str) -> Any:
    # Loaded on first use: `import transmuter` stays as light as before the pipelines existed.
    if name in ("load_repo", "pipeline"):
        from transmuter import pipelines

        return getattr(pipelines, name)
    if name == "Serving":
        from transmuter.serving import Serving

        return Serving
    raise AttributeError(f"module 'transmuter' has no attribute {name!r}")


def load(
    source: Any,
    *,
    trainable: bool = False,
    compute_type: str | None = None,
    revision: str | None = None,
    mesh: jax.sharding.Mesh | None = None,
    model_axis: str | None = None,
    param_sharding: Mapping[str, jax.sharding.PartitionSpec] | None = None,
    optimize: bool | Sequence[str] = True,
    last_position: Sequence[str] = (),
    at_position: Mapping[str, str] | None = None,
) -> Model:
    """Load an ONNX model from a path, bytes, `onnx.ModelProto`, or the Hugging Face Hub:
    `"hf://org/repo/path/model.onnx"` or `("hf", "org/repo", "path/model.onnx")`, at `revision`
    (a branch, tag or commit hash; also `hf://org/repo@revision/...`), with its external data.

    trainable=True makes every float initializer a param (see `Model.params`). compute_type
    ("float32", "bfloat16" or "float16") runs the graph's float16, bfloat16 and float32 tensors
    in that type; inputs and outputs keep the types the file declares. By default (None) a graph
    holding float16 / bfloat16 tensors keeps its weights in that type but computes in float32,
    rounding only where the graph's interface says half precision: as ONNX Runtime's CPU kernels
    do, and as accurate (per-op half-precision rounding compounds through residual chains,
    tests/models/test_variant_models.py). compute_type="float16" keeps every rounding.

    mesh: place the params on this `jax.sharding.Mesh` as they are read, each device getting only
    its shard (never the whole weight on one device): split over `model_axis` by the graph's
    column / row pairs, or by `param_sharding` ({regex: PartitionSpec}), else replicated
    (runtime/sharding.py). `compile(..., mesh=)` then keeps that placement.

    optimize: rewrite the graph before it is lowered (transmuter/ir/passes): True runs the
    default passes, False none, a list of pass names those (`transmuter.ir.passes.PASSES`). A
    trainable model keeps its float initializers as the file has them (its params); otherwise
    the params are what the passes made: weight chains folded, convolution kernels stored
    spatial axes first (`<kernel>__spatial_first`, read channels last), and the weights of
    repeated layers stacked along a new first axis (`<first layer's name>__layers`), read by
    one Scan. `[*transmuter.ir.passes.DEFAULT, "dequantize"]` also holds 4-bit MatMulNBits
    weights as float32 (8x their memory, for float32 speed).

    last_position: outputs (of rank 2 or more) computed at their last position only, on the
    axis before the last (size 1 there): a language model's logits [batch, 1, vocabulary] where
    generation reads the last token's. A last MatMul then multiplies that position's row only
    (transmuter/ir/last_position.py). at_position: {output: input} the same at a position chosen
    at run time, given to the new int64 input [1] `input` (negative counts from the end).
    """
    if compute_type is not None and compute_type not in COMPUTE_TYPES:
        raise TransmuterError(
            f"compute_type must be None or one of {', '.join(COMPUTE_TYPES)}; got {compute_type!r}"
        )
    hub_file = hub.hub_file(source, revision)
    name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else ""
    name = hub_file.uri if hub_file is not None else name
    with telemetry.span("transmuter.load", {"source": name}) as span:
        if hub_file is not None:
            source = hub.fetch(hub_file)
        graph = load_model(source)
        if last_position:
            graph = at_last_position(graph, last_position)
        if at_position:
            graph = at_chosen_position(graph, at_position)
        if compute_type is not None:
            graph = with_compute_type(graph, compute_type)
        elif runs_half_in_float32(graph):
            graph = with_compute_type(graph, "float32", keep_storage=True)
        if optimize is not False:
            names = None if optimize is True else list(optimize)
            graph = optimize_graph(graph, names, trainable=trainable)
        if mesh is None and (model_axis is not None or param_sharding is not None):
            raise InputError("model_axis and param_sharding place params on a mesh: give mesh=")
        place = (
            None if mesh is None else sharding.placer(graph.graph, mesh, model_axis, param_sharding)
        )
        model = Model(graph, trainable=trainable, source=name, origin=Origin(source), place=place)
        span.stop_metadata.update(
            node_count=len(model.ir.graph.nodes), opset=model.ir.opsets.get("", 0)
        )
    return model


def compile(
    model: Model,
    example_inputs: Mapping[str, Any],
    *,
    static_inputs: Mapping[str, Any] | None = None,
    cache_size: int = 8,
    cache_dir: str | os.PathLike | None = None,
    eager_threshold: int = 20,
    buckets: Mapping[str, Any] | None = None,
    pad_values: Mapping[str, Any] | None = None,
    checks: bool = False,
    mesh: jax.sharding.Mesh | None = None,
    data_axis: str | tuple[str, ...] | None = None,
    model_axis: str | None = None,
    param_sharding: Mapping[str, jax.sharding.PartitionSpec] | None = None,
    batch_axis: str | None = None,
    gather_outputs: bool = False,
) -> CompiledModel:
    """Compile `model` for the shapes of `example_inputs` (running it once on them).

    Other shapes compile on first use; each segment keeps its `cache_size` most recently used
    programs. Where a value decides a shape or a branch, the graph breaks: the part before is
    compiled and run, the break node runs on the host, and compiling goes on after it; segments
    shorter than `eager_threshold` nodes around a break run op by op. `static_inputs` are inputs
    known at compile time (no break where they decide a shape or branch); a call may omit them
    or pass a new value, which compiles again. `cache_dir` persists compiled programs on disk
    (JAX's persistent compilation cache, a process-wide setting).

    `buckets` pads named dims so that shapes recur: {"batch": [1, 2, 4, 8], "sequence": "pow2"}
    (dim names as the file declares them; a list of sizes, "pow2", ("pow2", largest),
    ("multiple", m) or ("multiple", m, largest)). Each input that carries a bucketed dim is
    padded up to the smallest bucket holding it, with 0 or `pad_values[input]` (masks with 0),
    and outputs that carry it are sliced back; a size past every bucket compiles as it is.
    Padding must be invisible to the model: rows (a leading batch dim) of a row-independent
    graph, or positions a mask input hides; other dims are refused (runtime/buckets.py).

    Integer inputs that index a table (token ids into an embedding) are checked against its
    size on every call (an InputError). `checks=True` also compiles every segment under
    `jax.experimental.checkify`, so that an index computed inside the graph raises a NodeError;
    by default (False) such an index clamps to the table, as XLA's gather does.

    `mesh` (a `jax.sharding.Mesh`) runs the programs over its devices, XLA's partitioner adding
    the collectives. `data_axis` (a mesh axis name, or a tuple of them) splits each input's batch
    dim, the dim name leading every input or `batch_axis`; `model_axis` splits the weights in
    the column / row pairs the graph's matmuls form, embeddings by vocabulary and KV-cache inputs
    by heads; `param_sharding` ({regex: PartitionSpec}) places the params whose names match as
    given. Params already on this mesh (`load(..., mesh=)`) keep their placement when neither is
    given. Outputs come back as the partitioner leaves them (split by batch under data
    parallelism), or whole on every device with `gather_outputs=True` (runtime/sharding.py).
    """
    sharding_options = (data_axis, model_axis, param_sharding, batch_axis)
    if mesh is None and (gather_outputs or any(o is not None for o in sharding_options)):
        raise InputError(
            "data_axis, model_axis, param_sharding, batch_axis and gather_outputs need mesh="
        )
    placement = None
    if mesh is not None:
        placement = sharding.Placement(
            model,
            mesh,
            data_axis=data_axis,
            model_axis=model_axis,
            param_sharding=param_sharding,
            batch_axis=batch_axis,
            gather_outputs=gather_outputs,
            static_inputs=frozenset(static_inputs or ()),
        )
    return CompiledModel(
        model,
        example_inputs,
        static_inputs=static_inputs,
        cache_size=cache_size,
        cache_dir=cache_dir,
        eager_threshold=eager_threshold,
        buckets=buckets,
        pad_values=pad_values,
        checks=checks,
        placement=placement,
    )


def jit(fun=None, /, **jit_kwargs):
    """`jax.jit(fun, **jit_kwargs)` with the XLA options `compile` gives its own programs, chosen
    by the platform and each program's dots (runtime/xla_options.py), for a program of your own
    around `run`: SD 1.5's UNet took 3.6 s a call under plain `jax.jit` on a 2-core AVX-512 CPU,
    2.3-2.5 s with them. A call with new argument types lowers its program first to read the
    dots. Options in `compiler_options=` win; usable as a decorator, with or without arguments."""
    if fun is None:
        return lambda f: jit(f, **jit_kwargs)
    return xla_options.Jitted(fun, jit_kwargs)


def split(model: Model, invariant: Sequence[str]) -> tuple[Model, Model]:
    """(head, tail) of `model` at inputs that stay the same over many calls (a decoder's steps
    over one encoder's states): head takes the `invariant` inputs and returns the values computed
    from their data that the rest of the graph reads; tail takes the other inputs and those
    values, and returns the model's outputs. Run head once and tail per call; both run on
    `model`'s arrays (transmuter/ir/split.py)."""
    head, tail = split_graph(model.ir, invariant)
    return model.part(head, f"{model.source} (head)"), model.part(tail, f"{model.source} (tail)")


def save(
    model: Model,
    path: str | os.PathLike,
    *,
    params: Mapping[str, Any] | None = None,
    external_data: bool | None = None,
) -> None:
    """Write `model` to the ONNX file `path` with `params` (default `model.params`) in place of
    the initializers of the same names; everything else is kept as in the loaded model's source.

    Each param must keep its initializer's dtype and shape (an InputError says which does not);
    a subset of the params may be given. external_data=None writes the weights to
    `<file name>_data` beside the model when they pass ~1.8 GB (protobuf's limit is 2 GB), True
    always does, False never does.
    """
    if model.origin is None:
        raise TransmuterError("this model was not made by transmuter.load: nothing to save from")
    given = model.params if params is None else params
    arrays = {name: np.asarray(value) for name, value in given.items()}
    save_model(model.origin, path, arrays, external_data=external_data)
