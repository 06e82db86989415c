"""`export`: a model as one StableHLO program (`jax.export.Exported`) with symbolic dims, and
`write_export`: that program on disk with a manifest, loadable with plain `jax.export.deserialize`.

The file's dim names become `jax.export` symbolic dimensions created in one scope, so the same
name on several inputs is one dim. Shape arithmetic in the graph (Shape -> Gather -> Concat ->
Reshape) stays on the host with symbolic dims (lowering/symbolic.py), so the program serves
every size. A graph that needs a value computed from its inputs on the host (a graph break:
NonZero, an If on data, ...) cannot be one program and is refused.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transmuter import ir
from transmuter.errors import (
    HostValueNeeded,
    InputError,
    NodeError,
    ShapeError,
    TransmuterError,
)
from transmuter.lowering.platforms import tracing_for
from transmuter.lowering.symbolic import dims_to_device, is_symbolic, recording_bounds
from transmuter.runtime import trace_cache
from transmuter.runtime.analysis import graph_breaks
from transmuter.runtime.execute import evaluate, x64_scope

PARAMS_MODES = ("embed", "argument")
# Types JAX narrows to 32 bits unless x64 is enabled.
_X64_TYPES = ("int64", "uint64", "float64", "complex128")


class ExportError(TransmuterError):
    """The model cannot be exported as one program. `nodes` names the graph breaks, if any."""

    def __init__(self, message: str, nodes: Sequence[str] = ()):
        self.nodes = tuple(nodes)
        super().__init__(message)


def export(
    model,
    input_specs: Mapping[str, Any] | None = None,
    *,
    params: str = "embed",
    platforms: Sequence[str] = ("cpu",),
    static_inputs: Mapping[str, Any] | None = None,
    constraints: Sequence[str] = (),
    int64_inputs: str = "int64",
    int64_outputs: str = "int64",
) -> jax.export.Exported:
    """Export `model` as one StableHLO program with symbolic dims.

    input_specs: name -> shape (a tuple of ints and dim names or expressions such as "batch" or
    "2*sequence") or a `jax.ShapeDtypeStruct`, overriding the dims the file declares; the same
    name is the same dim across inputs. static_inputs: inputs known at export time (a use_cache
    flag), folded into the program. constraints: `jax.export` constraints on the dims, such as
    "sequence <= 64" where the model bounds a dim. params="embed" makes the weights constants of
    the program, called as `exported.call(*inputs)`; "argument" makes them its first argument,
    `exported.call(params, *inputs)` with a dict like `model.params`. Inputs and outputs are
    positional, in the model's order (static inputs left out). `platforms` may name platforms
    absent here ("cuda", "tpu"): lowering needs no device.

    Where the graph itself bounds a dim (a Slice of a 64-row position table gives
    min(sequence, 64), which then fails to broadcast against sequence), the bound is added as a
    constraint ("sequence <= 64") and the export retried; `derived_constraints(exported)` and
    the manifest name the ones added. int64_inputs="int32" / int64_outputs="int32" give the
    program int32 ids (cast to int64 inside) and int32 results where ONNX says int64, so that it
    runs in a process with x64 off; values must then fit in int32.
    """
    _check_params_mode(params)
    narrow_in = _int64_choice("int64_inputs", int64_inputs)
    narrow_out = _int64_choice("int64_outputs", int64_outputs)
    static = _static_values(model, static_inputs)
    # With the persistent cache on, a later process reads the program back instead of tracing.
    # A jax.ShapeDtypeStruct's symbolic scope (its constraints) has no value to key by.
    stored = None
    given = dict(input_specs or {})
    if trace_cache.folder() is not None and not any(
        isinstance(spec, jax.ShapeDtypeStruct) for spec in given.values()
    ):
        options = (params, tuple(platforms), tuple(constraints), int64_inputs, int64_outputs)
        stored = trace_cache.key(model, "export", given, static, options)
        entry = trace_cache.read(stored)
        if entry is not None:
            return _with_derived(entry["exported"], entry["derived"])
    names = [name for name in model.inputs if name not in static]
    derived: list[str] = []
    for _ in range(_MOST_DERIVATIONS + 1):
        specs = _input_specs(model, names, dict(input_specs or {}), [*constraints, *derived])
        declared = [spec.dtype for spec in specs]
        if narrow_in:
            specs = [_narrowed(spec) for spec in specs]
        with recording_bounds() as seen:
            try:
                exported = _trace(
                    model, names, static, specs, declared, params, platforms, narrow_out
                )
            except (NodeError, ShapeError) as exc:
                more = _bounds_for(exc, seen, [*constraints, *derived])
                if not more:
                    raise ExportError(
                        f"{exc} (exporting with symbolic dims: no bound the graph states explains "
                        "this; where the model bounds a dim, pass a constraint such as "
                        "constraints=['sequence <= 64']; a dim that must be concrete can be an "
                        "int in input_specs)"
                    ) from exc
                derived.extend(more)
                continue
        blob = None if stored is None else trace_cache.serialized(exported)
        if blob is not None:
            trace_cache.write(stored, blob, derived=tuple(derived))
        return _with_derived(exported, tuple(derived))
    raise ExportError(f"gave up deriving constraints after {derived} (each retry met new bounds)")


def _with_derived(exported: jax.export.Exported, derived: tuple[str, ...]) -> jax.export.Exported:
    """`exported`, remembered as having the constraints `derived` added by `export`."""
    if derived:
        _DERIVED[id(exported)] = (weakref.ref(exported), derived)
        weakref.finalize(exported, _DERIVED.pop, id(exported), None)
    return exported


def derived_constraints(exported: jax.export.Exported) -> tuple[str, ...]:
    """The constraints `export` derived from bounds the graph states, for this program."""
    kept = _DERIVED.get(id(exported))
    return kept[1] if kept is not None and kept[0]() is exported else ()


# id(exported) -> (weak reference, derived constraints): Exported is a frozen dataclass, and the
# manifest must say which constraints were derived rather than given.
_DERIVED: dict[int, tuple[weakref.ref, tuple[str, ...]]] = {}
# Each retry adds at least one constraint; a graph needing more than this many is unusual.
_MOST_DERIVATIONS = 8


def _trace(model, names, static, specs, declared, params, platforms, narrow_out):
    def graph(weights, *arrays):
        # Narrowed ids come in as int32 and are int64 again before the first operator.
        arrays = [jnp.asarray(a).astype(d) if a.dtype != d else a for a, d in zip(arrays, declared)]
        inputs = {**dict(zip(names, arrays)), **static}
        outputs = evaluate(model, inputs, weights, model.device_constants)
        results = [_program_output(name, outputs[name]) for name in model.outputs]
        return tuple(_narrowed_output(v) if narrow_out else v for v in results)

    with x64_scope(), tracing_for(platforms):
        try:
            if params == "embed":
                program = jax.jit(lambda *arrays: graph(model.params, *arrays))
                return jax.export.export(program, platforms=platforms)(*specs)
            weights = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in model.params.items()}
            return jax.export.export(jax.jit(graph), platforms=platforms)(weights, *specs)
        except HostValueNeeded as exc:
            raise _break_error(model, exc, static) from exc


def _bounds_for(exc: Exception, seen, known: Sequence[str]) -> list[str]:
    """Constraints for the bounds the trace met (min(dim, N), `seen`) that explain `exc`: those
    whose min(...) the error names, else, when it names none, every bound met. An empty list:
    nothing the graph states would help, and the error stands."""
    text = str(exc)
    fresh = [(bound, n) for bound, n in seen if f"{bound} <= {n}" not in known]
    named = [(bound, n) for bound, n in fresh if f"min({bound}, {n})" in text]
    chosen = named or fresh
    return list(dict.fromkeys(f"{bound} <= {n}" for bound, n in chosen))


def _int64_choice(option: str, value: str) -> bool:
    if value not in ("int64", "int32"):
        raise ExportError(f"{option} must be 'int64' or 'int32', got {value!r}")
    return value == "int32"


def _narrowed(spec: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    if np.dtype(spec.dtype) != np.int64:
        return spec
    return jax.ShapeDtypeStruct(spec.shape, np.dtype(np.int32))


def _narrowed_output(value: Any) -> Any:
    if np.dtype(value.dtype) != np.int64:
        return value
    return jnp.asarray(value).astype(jnp.int32)


def write_export(
    exported: jax.export.Exported,
    directory: str | os.PathLike,
    *,
    model,
    params: str = "embed",
    static_inputs: Mapping[str, Any] | None = None,
    constraints: Sequence[str] = (),
) -> Path:
    """Write `exported`, made by `export(model, params=params, static_inputs=...,
    constraints=...)`, to `directory` (created if needed): `model.jax_exported` (serialized, for
    plain `jax.export.deserialize`), `model.mlir` (its StableHLO text), `manifest.json` (input
    and output names in order, dtypes, symbolic shapes, the params mode, platforms, constraints,
    static inputs, versions) and, with params="argument", `params.npz` holding `model.params`.
    Returns the directory."""
    _check_params_mode(params)
    static = _static_values(model, static_inputs)
    names = [name for name in model.inputs if name not in static]
    args, _ = jax.tree_util.tree_unflatten(exported.in_tree, range(len(exported.in_avals)))
    weights, positions = (args[0], args[1:]) if params == "argument" else (None, args)
    if len(positions) != len(names) or not isinstance(weights, (dict, type(None))):
        expected = len(names) + (params == "argument")
        raise ExportError(
            f"the program takes {len(args)} arguments; with params={params!r} and static inputs "
            f"{sorted(static)}, {model.source or 'the model'} takes {expected}: pass the model, "
            "params and static_inputs that export was given"
        )
    avals = [*exported.in_avals, *exported.out_avals]
    declared = {n: model.input_specs[n] for n in names}
    manifest = {
        "transmuter_version": importlib.metadata.version("transmuter"),
        "jax_version": jax.__version__,
        "source": model.source,
        "params_mode": params,
        "call": f"exported.call({'params, ' if weights is not None else ''}*inputs)",
        "platforms": list(exported.platforms),
        # 64-bit inputs or outputs: the caller enables x64 (jax.enable_x64) to pass or get them.
        "x64": any(np.dtype(a.dtype).name in _X64_TYPES for a in avals),
        "inputs": [
            _describe(n, exported.in_avals[i], declared[n]) for n, i in zip(names, positions)
        ],
        "outputs": [_describe(n, a) for n, a in zip(model.outputs, exported.out_avals)],
        "constraints": [*constraints, *derived_constraints(exported)],
        # Added by export from bounds the graph states (a Slice of a 64-row table).
        "derived_constraints": list(derived_constraints(exported)),
        "static_inputs": {
            name: {"dtype": value.dtype.name, "value": value.tolist()}
            for name, value in static.items()
        },
    }
    if weights is not None:
        # Flattening a dict orders its keys: the order in which the program takes the params.
        flat, _ = jax.tree_util.tree_flatten_with_path(weights)
        manifest["params"] = [_describe(path[0].key, exported.in_avals[i]) for path, i in flat]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.jax_exported").write_bytes(exported.serialize())
    (directory / "model.mlir").write_text(exported.mlir_module())
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if weights is not None:
        np.savez(directory / "params.npz", **{k: np.asarray(v) for k, v in model.params.items()})
    return directory


def _check_params_mode(params: str) -> None:
    if params not in PARAMS_MODES:
        raise ExportError(f"params must be one of {list(PARAMS_MODES)}, got {params!r}")


def _static_values(model, static_inputs: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
    return {
        name: np.asarray(model.check_input(name, value))
        for name, value in (static_inputs or {}).items()
    }


def _input_specs(model, names, overrides, constraints) -> list[jax.ShapeDtypeStruct]:
    unknown = sorted(set(overrides) - set(model.inputs))
    if unknown:
        raise InputError(f"input_specs names {unknown}, not inputs of the model ({model.inputs})")
    dims = _DimNames(_scope(overrides.values(), constraints))
    specs = []
    for name in names:
        declared = model.input_specs[name]
        if not isinstance(declared, ir.TensorType) or declared.dtype == np.dtype(object):
            raise ExportError(
                f"input {name!r} is {declared}: a program input must be a tensor of numbers; "
                "give its value in static_inputs"
            )
        given = overrides.get(name)
        if isinstance(given, jax.ShapeDtypeStruct):
            shape, dtype = tuple(given.shape), np.dtype(given.dtype)
        else:
            shape, dtype = given if given is not None else declared.shape, declared.dtype
            if shape is None:
                raise ExportError(f"input {name!r} declares no shape: give one in input_specs")
            shape = tuple(dims.dim(d) for d in shape)
        _check_spec(name, shape, dtype, declared)
        specs.append(jax.ShapeDtypeStruct(shape, dtype))
    return specs


def _scope(overrides, constraints) -> jax.export.SymbolicScope:
    """The scope of the symbolic dims the given ShapeDtypeStructs carry, else a new one."""
    scopes = [
        d.scope
        for given in overrides
        if isinstance(given, jax.ShapeDtypeStruct)
        for d in given.shape
        if jax.export.is_symbolic_dim(d)
    ]
    if not scopes:
        return jax.export.SymbolicScope(list(constraints))
    if constraints:
        raise ExportError(
            "constraints cannot be added to the scope of the dims in a given ShapeDtypeStruct: "
            "create that scope with them (jax.export.SymbolicScope(constraints))"
        )
    return scopes[0]


def _check_spec(name: str, shape: tuple, dtype: np.dtype, declared: ir.TensorType) -> None:
    if dtype != declared.dtype:
        raise InputError(
            f"input_specs gives {name!r} dtype {dtype.name}; the model declares {declared}"
        )
    if declared.shape is None:
        return
    wrong_rank = len(shape) != len(declared.shape)
    if wrong_rank or any(
        isinstance(want, int) and not jax.export.is_symbolic_dim(have) and have != want
        for want, have in zip(declared.shape, shape)
    ):
        raise InputError(
            f"input_specs gives {name!r} shape {list(shape)}; the model declares {declared}"
        )


# Words of jax.export's dim expressions, which a variable cannot be named.
_DIM_OPERATORS = ("floordiv", "max", "min", "mod")


class _DimNames:
    """Dims as `jax.export` symbolic dims in one scope: the same name is the same dim. The
    file's dim names are names, made into valid variables ("batch-size" -> "batch_size");
    strings given in input_specs are dim expressions ("2*sequence", "batch")."""

    def __init__(self, scope: jax.export.SymbolicScope):
        self.scope = scope
        self.variables: dict[str, str] = {}  # file dim name -> its variable's name

    def dim(self, d) -> Any:
        if isinstance(d, (int, np.integer)) or jax.export.is_symbolic_dim(d):
            return d
        if isinstance(d, ir.SymbolicDim):
            d = self.variables.setdefault(d.name, self._variable(d.name))
        try:
            (parsed,) = jax.export.symbolic_shape(d, scope=self.scope)
        except ValueError as exc:
            raise InputError(f"input_specs dim {d!r} is not a dim expression: {exc}") from None
        return parsed

    def _variable(self, name: str) -> str:
        variable = re.sub(r"\W", "_", name)
        if not variable[:1].isalpha() or variable in _DIM_OPERATORS:
            variable = "d_" + variable
        taken = set(self.variables.values())
        while variable in taken:  # two file names made alike ("a-b", "a_b") stay two dims
            variable += "_"
        return variable


def _program_output(name: str, value: Any) -> Any:
    if is_symbolic(value):  # a shape computed on the host: its values, in the program
        return dims_to_device(value)
    if isinstance(value, jax.Array) or (isinstance(value, np.ndarray) and value.dtype != object):
        return value
    raise ExportError(
        f"output {name!r} is {type(value).__name__}: only tensors of numbers can be outputs of an "
        "exported program (not strings, sequences or optionals)"
    )


def _break_error(model, exc: HostValueNeeded, static: Mapping[str, Any]) -> ExportError:
    # Tracing stops at the first break; the static analysis names the others too.
    others = [b for b in graph_breaks(model, frozenset(static)) if b.node != exc.node]
    message = (
        f"{model.source or 'the model'} cannot be exported as one program: {exc.op_type} node "
        f"{exc.node!r} needs a value computed from the inputs on the host ({exc.input_name!r}: "
        f"{exc.reason}), which only a graph break can give."
    )
    if others:
        message += f" Other break nodes: {'; '.join(map(str, others))}."
    message += (
        " Give inputs known at export time as static_inputs (a use_cache flag, a fixed count), "
        "or run the model with transmuter.compile, which splits the graph at breaks."
    )
    return ExportError(message, nodes=[exc.node, *(b.node for b in others)])


def _describe(name: str, aval, declared=None) -> dict[str, Any]:
    described = {
        "name": name,
        "dtype": np.dtype(aval.dtype).name,
        "shape": [d if isinstance(d, int) else str(d) for d in aval.shape],
    }
    if isinstance(declared, ir.TensorType) and declared.dtype != np.dtype(aval.dtype):
        described["model_dtype"] = declared.dtype.name  # int64_inputs="int32"
    return described
