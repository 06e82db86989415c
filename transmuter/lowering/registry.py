"""The operator registry: one JAX function per (domain, op type, since-version).

Lookup takes the highest registered since-version <= the model's opset for that domain. Domains
never fall back to one another: a com.microsoft op is looked up in com.microsoft only.
An older version that differs from a newer one only in its signature is registered as a
`variant` of the newer function rather than written out again.
"""

from __future__ import annotations

import bisect
import inspect
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from transmuter.errors import UnsupportedOpError


@dataclass(frozen=True)
class OpDef:
    """A registered lowering and what it needs from the runtime.

    host_inputs: positional input index -> why the op needs it as a concrete value ("the target
    shape"). A device value there is a graph break under `transmuter.compile`.
    data_dependent: the output shape depends on input values (NonZero), so every input is needed
    on the host.
    context: the function takes an `OpContext` as its first argument.
    random: draws from the runtime's random key, so it is never folded on the host.
    differentiable: False when JAX's derivative of the lowering is not the operator's (BitCast
    reads a float's bits as another float; JAX calls that derivative zero): a gradient reaching
    one of its outputs from a differentiated input raises instead of being silently wrong.
    Operators that are merely piecewise constant (Floor, ArgMax, a Cast to int) keep JAX's zero
    gradient and stay differentiable.
    host_outputs: the op builds host-only values (maps) from data it needs on the host: the
    compiling runtime runs it after the segment before it, which compiles whatever its length
    (the node is a graph's tail that XLA cannot hold, not a break that decides shapes).
    may_need_host: why the op may ask for a host value while tracing (`OpContext.need_host`)
    when only some values need one (an If whose branches differ). The runtime treats such a
    request like a declared host input; analysis reports the node as a possible break.
    strings_on_host: the op reads or makes strings, which live on the host, so given strings
    and a traced numeric input (Where's condition, Gather's indices, a Cast to strings) it asks
    for that input on the host (`OpContext.need_host`); analysis reports it as a possible break
    where the node's declared types include strings.
    reads_shape: the result depends on its input's shape alone (Shape, Size), so it is a host
    value whatever the input.
    symbolic: how the op treats host values holding `jax.export` symbolic dims (exporting with
    symbolic shapes): True when its own function moves them with numpy (Gather, Concat), a
    function when that function computes on them in its place (Add on dims); otherwise they
    reach it as int64 device values.
    weight: for a matmul whose weight input is stored quantized (MatMulNBits), a function of
    that node's inputs other than the activation, and of its attributes, giving the float32
    weight [K, N] the activation is multiplied by: what a graph pass needs to dequantize a
    constant weight once at load.
    converts: the op converts its first input element by element (Cast, CastLike,
    DequantizeLinear). Reading only weights, it converts a stored weight on every call
    (half-precision storage, QDQ weights), and the runtime runs it just before the node reading
    its result, waiting on that node's data (`Step.gate`): XLA:CPU's scheduler would start
    every such conversion at the program's start and hold all the converted weights at once.
    """

    domain: str
    op_type: str
    since: int
    fn: Callable
    host_inputs: dict[int, str]
    data_dependent: bool
    context: bool
    random: bool
    differentiable: bool
    host_outputs: bool = False
    may_need_host: str | None = None
    strings_on_host: bool = False
    reads_shape: bool = False
    symbolic: bool | Callable = False
    weight: Callable | None = None
    converts: bool = False

    @property
    def name(self) -> str:
        return f"{self.domain or 'ai.onnx'}::{self.op_type}-{self.since}"

    def host_input_indices(self, inputs: Sequence[str]) -> list[int]:
        """The positions of a node's present inputs (names, "" for absent) that it reads on the
        host: every input of a data-dependent op, else the declared ones."""
        needed = range(len(inputs)) if self.data_dependent else self.host_inputs
        return [i for i in needed if i < len(inputs) and inputs[i]]

    @property
    def asks_host(self) -> bool:
        """Whether the op may ask for a host value while tracing (`OpContext.need_host`)."""
        return self.may_need_host is not None or self.strings_on_host

    def host_reason(self, index: int) -> str:
        """Why input `index` is needed on the host."""
        if index in self.host_inputs:
            return self.host_inputs[index]
        return "its input values, which decide its output shape"


_REGISTRY: dict[tuple[str, str], dict[int, OpDef]] = {}


def op(
    op_type: str,
    since: int | Iterable[int],
    *,
    domain: str = "",
    host_inputs: dict[str, str] | None = None,
    data_dependent: bool = False,
    context: bool = False,
    random: bool = False,
    differentiable: bool = True,
    host_outputs: bool = False,
    may_need_host: str | None = None,
    strings_on_host: bool = False,
    reads_shape: bool = False,
    symbolic: bool | Callable = False,
    weight: Callable | None = None,
    converts: bool = False,
) -> Callable[[Callable], Callable]:
    """Register `fn` as the lowering of `op_type` for each since-version in `since`.

    host_inputs maps parameter names of `fn` to the reason the value must be concrete, e.g.
    `host_inputs={"shape": "the target shape"}`. The other options are `OpDef`'s fields.
    """
    if (may_need_host is not None or strings_on_host) and not context:
        raise ValueError(
            f"{op_type}: an op asks for host values through its context (context=True)"
        )
    versions = (since,) if isinstance(since, int) else tuple(since)
    domain = "" if domain == "ai.onnx" else domain

    def register(fn: Callable) -> Callable:
        indices = _input_indices(fn, host_inputs or {}, context)
        for version in versions:
            versions_of = _REGISTRY.setdefault((domain, op_type), {})
            if version in versions_of:
                raise ValueError(f"{domain or 'ai.onnx'}::{op_type}-{version} is registered twice")
            versions_of[version] = OpDef(
                domain,
                op_type,
                version,
                fn,
                indices,
                data_dependent,
                context,
                random,
                differentiable,
                host_outputs,
                may_need_host,
                strings_on_host,
                reads_shape,
                symbolic,
                weight,
                converts,
            )
        return fn

    return register


def _input_indices(fn: Callable, host_inputs: dict[str, str], context: bool) -> dict[int, str]:
    params = [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if context:
        params = params[1:]
    indices = {}
    for name, reason in host_inputs.items():
        if name not in params:
            raise ValueError(f"{fn.__name__} has no positional input {name!r} to declare as host")
        indices[params.index(name)] = reason
    return indices


REQUIRED = inspect.Parameter.empty  # the default of an attribute or input a version requires


class Attribute(NamedTuple):
    """An input of the newer function that an older version takes as the attribute `name`; its
    value reaches the newer function as a host array `np.asarray(value, dtype)` (None: absent)."""

    name: str
    default: Any = REQUIRED
    dtype: Any = None


def variant(
    fn: Callable,
    name: str,
    doc: str,
    *,
    fixed: Mapping[str, Any] | None = None,
    ignored: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    required: Iterable[str] = (),
    attributes: Mapping[str, Attribute] | None = None,
) -> Callable:
    """`fn` as another version of its operator (or the same operator in another domain), given
    by how that version's signature differs from `fn`'s; register the result with `op`.

    fixed: parameters of `fn` the version lacks, with the value it behaves as (an attribute a
    later version added, an input it lacks, an option of a shared implementation).
    ignored: attributes only the version has, with their defaults; they do not change the result.
    defaults: attributes whose default differs in the version.
    required: optional inputs of `fn` that the version requires.
    attributes: inputs of `fn` that the version takes as attributes (`Attribute`).

    The result has the version's signature (`__signature__`, which the registry's contract test
    checks against the schema), `name` and the one-line docstring `doc`; it binds its arguments
    and calls `fn`. A version whose semantics differ otherwise is a function of its own.
    """
    fixed, ignored = dict(fixed or {}), dict(ignored or {})
    defaults, attributes, required = dict(defaults or {}), dict(attributes or {}), set(required)
    params = inspect.signature(fn).parameters
    unknown = (set(fixed) | set(defaults) | set(attributes) | required) - set(params)
    if unknown:
        raise ValueError(f"{name}: {fn.__name__} has no parameters {sorted(unknown)}")
    if set(ignored) & set(params):
        raise ValueError(
            f"{name}: ignored names {sorted(set(ignored) & set(params))}, which {fn.__name__} "
            "takes (fixed or defaults describes those)"
        )
    for what, names, kind in (
        ("defaults", defaults, inspect.Parameter.KEYWORD_ONLY),
        ("required", required, inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("attributes", attributes, inspect.Parameter.POSITIONAL_OR_KEYWORD),
    ):
        wrong = sorted(n for n in names if params[n].kind is not kind)
        if wrong:
            raise ValueError(
                f"{name}: {what} names {wrong}, not {kind.description} in {fn.__name__}"
            )
    positional, keyword = [], []
    for p in params.values():
        if p.kind is p.VAR_KEYWORD:
            raise ValueError(f"{name}: {fn.__name__} takes **{p.name}, which no schema has")
        if p.name in fixed or p.name in attributes:
            continue
        if p.name in defaults:
            p = p.replace(default=defaults[p.name])
        if p.name in required:
            p = p.replace(default=REQUIRED)
        (keyword if p.kind is p.KEYWORD_ONLY else positional).append(p)
    only = [(a.name, a.default) for a in attributes.values()] + list(ignored.items())
    keyword += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d) for n, d in only]
    signature = inspect.Signature(positional + keyword)

    def forward(*args, **kwargs):
        values = signature.bind(*args, **kwargs)
        values.apply_defaults()
        given = values.arguments
        call, keywords = [], {}
        for p in params.values():
            if p.name in fixed:
                value = fixed[p.name]
            elif p.name in attributes:
                attribute = attributes[p.name]
                value = given[attribute.name]
                value = None if value is None else np.asarray(value, attribute.dtype)
            else:
                value = given[p.name]
            if p.kind is p.KEYWORD_ONLY:
                keywords[p.name] = value
            elif p.kind is p.VAR_POSITIONAL:
                call.extend(value)
            else:
                call.append(value)
        return fn(*call, **keywords)

    forward.__signature__ = signature
    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = doc
    # The calling module, as collections.namedtuple does: the family the version belongs to.
    forward.__module__ = sys._getframe(1).f_globals.get("__name__", fn.__module__)
    return forward


def lookup(domain: str, op_type: str, opset: int, node: str = "") -> OpDef:
    """The lowering for a node of `op_type` in a model importing `domain` at `opset`."""
    domain = "" if domain == "ai.onnx" else domain
    versions_of = _REGISTRY.get((domain, op_type))
    if not versions_of:
        raise UnsupportedOpError(domain, op_type, opset, node, "no lowering is registered")
    since = sorted(versions_of)
    position = bisect.bisect_right(since, opset)
    if position == 0:
        raise UnsupportedOpError(
            domain, op_type, opset, node, f"the earliest supported version is {since[0]}"
        )
    return versions_of[since[position - 1]]


def registered() -> Iterator[OpDef]:
    """Every registered lowering, ordered by domain, op type and since-version."""
    for key in sorted(_REGISTRY):
        versions_of = _REGISTRY[key]
        for version in sorted(versions_of):
            yield versions_of[version]
