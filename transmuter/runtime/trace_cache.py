"""Traced segments on disk: the layer of the compile cache in front of JAX's.

JAX's persistent compilation cache is keyed by the lowered program, so a process that finds a
program there has already walked the graph, traced it and lowered it: on the real Kokoro-82M,
4.3 of the 7.2 seconds its two programs took to come back from disk. With `cache_dir` on, each
segment is also kept here as a serialized `jax.export.Exported` (with where it stops and the
host values it computes), under a key known before tracing: the model's fingerprint, the start
position, the segment's cache key (shapes and dtypes of its arguments, digests of its host
values), the platform, and the versions of JAX and of Transmuter's own source, which decides
every trace. A later process calls the exported program instead of tracing: JAX lowers its
serialized StableHLO and finds the executable in its own cache.

Every process compiles the exported program, the first included, so that the program the first
process writes to JAX's cache is the one later processes look up. A segment that JAX cannot
export (a host callback) or serialize (a 2-bit type) is compiled from its trace and not kept. An entry that does not
read back is removed, traced again and written afresh.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import threading
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

from transmuter import ir

FOLDER = "transmuter-traces"


def folder() -> Path | None:
    """Where traces are kept: beside JAX's persistent cache, when it is on."""
    cache_dir = jax.config.jax_compilation_cache_dir
    return Path(cache_dir) / FOLDER if cache_dir else None


def key(model, *parts: Any) -> str:
    """An entry's name: what a trace of `model` depends on (its fingerprint, Transmuter's source,
    JAX's version) and `parts`, which say what was traced for which arguments. Arrays among the
    parts count by value."""
    hasher = hashlib.blake2b(digest_size=20)
    hasher.update(f"{_code()} {jax.__version__} {model.fingerprint}".encode())
    # The process-wide settings that change what a trace emits (dot precision, type promotion).
    config = jax.config
    hasher.update(
        f"{config.jax_default_matmul_precision} {config.jax_numpy_dtype_promotion}".encode()
    )
    for part in parts:
        _value(hasher, part)
    return hasher.hexdigest()


def read(name: str) -> dict[str, Any] | None:
    """The entry `name` (its "exported" program, None or a `jax.export.Exported`, and the fields
    written with it), or None; one that does not read back is removed, with a warning."""
    path = folder() / name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        # Trusted as JAX's own entries beside it are (serialized executables): the cache folder
        # belongs to the user who runs the model.
        fields = pickle.loads(data)
        if fields["exported"] is not None:
            fields["exported"] = jax.export.deserialize(bytearray(fields["exported"]))
        return fields
    except Exception:  # any failure to read it back: the entry is damaged
        path.unlink(missing_ok=True)
        warnings.warn(
            f"removed a damaged traced program from the compile cache {str(path.parent)!r}; "
            "it is traced again and written afresh",
            stacklevel=3,
        )
        return None


def serialized(exported: Any) -> bytes | None:
    """`exported` as bytes, or None where JAX cannot serialize it (a 2-bit type, a map with
    integer keys among the arguments)."""
    try:
        return bytes(exported.serialize())
    except Exception:  # whatever serialization refuses, the program is not kept
        return None


def write(name: str, exported: bytes | None, **fields: Any) -> bool:
    """Keep `exported` (a serialized `jax.export.Exported`, or None) and `fields` as `name`,
    whole or not at all (written aside, then renamed); False where a field cannot be pickled."""
    try:
        data = pickle.dumps({**fields, "exported": exported}, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # a host value pickle cannot write: the segment is not kept
        return False
    where = folder()
    where.mkdir(parents=True, exist_ok=True)
    # Named per process and thread (not mkstemp's private mode): permissions follow the umask,
    # as JAX's own entries do.
    temporary = where / f".writing-{os.getpid()}-{threading.get_ident()}-{name}"
    temporary.write_bytes(data)
    os.replace(temporary, where / name)
    return True


def fingerprint(model) -> str:
    """What a trace of `model` depends on besides its arguments: its graph (subgraphs, value
    types and opsets included, which pick each node's lowering) and its host constants' values,
    which traces embed. Params and device constants are arguments, keyed by shape and dtype."""
    hasher = hashlib.blake2b(digest_size=20)
    hasher.update(repr(sorted(model.ir.opsets.items())).encode())
    _graph(hasher, model.ir.graph, initializers=False)
    for name in sorted(model.host_constants):
        hasher.update(name.encode())
        _value(hasher, model.host_constants[name])
    for name in sorted({**model.params, **model.device_constants}):
        hasher.update(name.encode())  # where an initializer lives decides what is an argument
    return hasher.hexdigest()


def _graph(hasher, graph: ir.Graph, initializers: bool = True) -> None:
    """The graph's structure, and the values of its initializers where `initializers` (a
    subgraph's are constants of the trace; the main graph's are counted by `fingerprint`)."""
    for values in (graph.inputs, graph.outputs, graph.value_info.values()):
        for value in values:
            hasher.update(f"{value.name}:{value.type};".encode())
    hasher.update(repr(sorted(graph.initializers)).encode())
    if initializers:
        for name in sorted(graph.initializers):
            _value(hasher, graph.initializers[name])
    for node in graph.nodes:
        hasher.update(f"{node.domain}.{node.op_type}{node.inputs}{node.outputs}".encode())
        for name in sorted(node.attrs):
            hasher.update(name.encode())
            _value(hasher, node.attrs[name])


def _value(hasher, value: Any) -> None:
    if isinstance(value, ir.Graph):
        _graph(hasher, value)
    elif isinstance(value, dict):
        _value(hasher, sorted(value.items()))
    elif isinstance(value, (list, tuple)):
        hasher.update(f"[{len(value)}".encode())
        for item in value:
            _value(hasher, item)
    elif isinstance(value, np.ndarray):
        hasher.update(f"{value.dtype.name}{value.shape}".encode())  # .str is |V1 for int4 and uint4
        if value.dtype == object:
            hasher.update(repr(value.ravel().tolist()).encode())
        else:
            hasher.update(np.ascontiguousarray(value).view(np.uint8))
    else:
        hasher.update(repr(value).encode())


@functools.cache
def _code() -> str:
    """A digest of Transmuter's source: any change to a lowering may change every trace."""
    hasher = hashlib.blake2b(digest_size=20)
    root = Path(__file__).resolve().parents[1]
    for path in sorted(root.rglob("*.py")):
        hasher.update(str(path.relative_to(root)).encode())
        hasher.update(path.read_bytes())
    return hasher.hexdigest()
