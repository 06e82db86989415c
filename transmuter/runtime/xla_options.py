"""The XLA compiler options each program the runtime compiles gets, chosen by its platform and
its dots (and each program `transmuter.jit` makes: the pipelines' loops, a user's own function
around `run`).

CPU: XLA:CPU has two libraries for a dot, YNNPACK and its own (Eigen), and which is faster
depends on the dot's types (bench/README.md, "YNNPACK for the dots that need it"):
- YNNPACK runs int8 dots 3-3.5x as fast as Eigen, and bf16 ones 1.7x at 4-16 rows, so a
  program holding one keeps YNNPACK, for single dots only. Its fusion pass (on by default in
  jaxlib 0.10) would merge chains of matmuls and the elementwise work between them into one
  library call, computing every broadcast operand of that work (a bias, GELU's constants) as a
  full-size array first: MiniLM b32 18% slower, ResNet-50 15%, the YOLO detector 25%.
- float32 programs run as fast or faster on Eigen: 1.3-1.6x at a decode step's 4 to 16 rows
  (a GPT-2-small-sized step of 16 rows 161 -> 102 ms on AVX2), 0.85-1.04x the time on whole
  models. So a program whose dots are all float32 (or float64, float16) leaves YNNPACK off.
A user's own XLA_FLAGS setting of the option wins.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from typing import Any

import jax
from jaxlib.mlir import ir

_YNN = "xla_cpu_experimental_ynn_fusion_type"
LIBRARY_DOTS = {_YNN: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
OWN_DOTS = {_YNN: ""}


def compiler_options(lowered: Any, args: Any) -> dict[str, str]:
    """The options for `lowered` (a `jax.stages.Lowered`), a program of the arrays `args` (a
    pytree): by their devices' platform and the program's dots."""
    return for_program(lowered, _platform(jax.tree_util.tree_leaves(args)))


def for_program(lowered: Any, platform: str) -> dict[str, str]:
    """The options for `lowered` compiled for `platform` ("cpu", "gpu", ...)."""
    if platform != "cpu":
        return {}
    return _unless_users(LIBRARY_DOTS if needs_library_dots(lowered.compiler_ir()) else OWN_DOTS)


def needs_library_dots(module: ir.Module) -> bool:
    """Whether a dot of the StableHLO `module` (loop bodies and called functions included)
    multiplies integers or bf16, which XLA:CPU's own dot is slow at."""
    found = False

    def visit(op: ir.Operation) -> ir.WalkResult:
        nonlocal found
        if op.name in ("stablehlo.dot_general", "stablehlo.dot"):
            kind = str(ir.RankedTensorType(op.operands[0].type).element_type)
            if kind == "bf16" or kind.startswith(("i", "ui", "si")):  # i8, ui8, ...
                found = True
        return ir.WalkResult.INTERRUPT if found else ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


class Jitted:
    """`jax.jit(fun, **jit_kwargs)` whose programs each compile with the options their own dots
    choose. A call with new argument types (the pytree and each leaf's dtype) first traces and
    lowers the program to read them, through the `jax.jit` of the options it guesses (the last
    choice; float dots at first): JAX reuses the trace either way, and the lowering where the
    guess holds. Shapes of the same types share a choice: a wrong one costs speed, never an answer.
    Options in `compiler_options=` win."""

    def __init__(self, fun: Callable, jit_kwargs: dict[str, Any]):
        self._fun = fun
        self._users = jit_kwargs.pop("compiler_options", None) or {}
        self._jit_kwargs = jit_kwargs
        self._by_options: dict[tuple, Any] = {}
        self._by_types: dict[Any, Any] = {}
        self._guess = _unless_users(OWN_DOTS) if jax.default_backend() == "cpu" else {}
        functools.update_wrapper(self, fun)

    def __call__(self, *args, **kwargs):
        return self._for(args, kwargs)(*args, **kwargs)

    def lower(self, *args, **kwargs):
        return self._for(args, kwargs).lower(*args, **kwargs)

    def _for(self, args: tuple, kwargs: dict) -> Any:
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        types = (tree, tuple(getattr(leaf, "dtype", type(leaf)) for leaf in leaves))
        jitted = self._by_types.get(types)
        if jitted is None:
            lowered = self._jitted(self._guess).trace(*args, **kwargs).lower()
            self._guess = for_program(lowered, _platform(leaves))
            jitted = self._by_types[types] = self._jitted(self._guess)
        return jitted

    def _jitted(self, options: dict[str, str]) -> Any:
        options = {**options, **self._users}
        key = tuple(sorted(options.items()))
        if key not in self._by_options:
            self._by_options[key] = jax.jit(
                self._fun, compiler_options=options or None, **self._jit_kwargs
            )
        return self._by_options[key]


def _unless_users(options: dict[str, str]) -> dict[str, str]:
    """`options` less those the user's XLA_FLAGS sets."""
    return {k: v for k, v in options.items() if k not in os.environ.get("XLA_FLAGS", "")}


def _platform(leaves: Iterable[Any]) -> str:
    for leaf in leaves:
        if isinstance(leaf, jax.Array):
            return next(iter(leaf.devices())).platform
    return jax.default_backend()
