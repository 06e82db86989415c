"""Graph optimization passes: each an IR -> IR function in its own module (DESIGN.md, "Graph
rewrites"), run at load by `transmuter.load(..., optimize=...)` before the plan is built.

`optimize(model, names, context)` runs the named passes in pipeline order. A pass never changes
the graph's inputs, outputs or their names; what it may change is bounded by `Context`:
`weights=False` (a trainable model) keeps every float initializer as the file has it, so
`model.params` stays what `jax.grad` and `transmuter.save` expect. Passes that evaluate
operators (constant folding) get the evaluator from `Context.evaluate`, which the runtime gives:
this layer imports neither onnx nor jax.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from transmuter.ir.graph import Model
from transmuter.ir.passes import (
    attention,
    conv_fold,
    cse,
    dce,
    dequantize,
    fold,
    layers,
    layout,
    qkv,
    transposed_matmul,
)
from transmuter.ir.passes.common import Context

__all__ = ["DEFAULT", "PASSES", "Context", "Pass", "optimize"]

Pass = Callable[[Model, Context], Model]

# Pipeline order. Folding first (it turns weight-only chains into initializers that Conv and
# MatMul rewrites can read), CSE next (it merges what folding made equal), the rewrites inside
# a layer before `layers` makes the repeated layers one Scan body, dead code last.
PASSES: dict[str, Pass] = {
    "fold": fold.run,
    "cse": cse.run,
    "dequantize": dequantize.run,
    "conv_fold": conv_fold.run,
    "layout": layout.run,
    "qkv": qkv.run,
    "attention": attention.run,
    "transposed_matmul": transposed_matmul.run,
    "layers": layers.run,
    "dce": dce.run,
}
# The passes `optimize=True` runs: those the benchmark shows pay (bench/README.md).
DEFAULT: tuple[str, ...] = ("fold", "cse", "layout", "transposed_matmul", "layers", "dce")


def optimize(model: Model, names: Iterable[str] | None, context: Context) -> Model:
    """`model` after the passes `names` (None: DEFAULT), in pipeline order."""
    chosen = _chosen(DEFAULT if names is None else names)
    for name in chosen:
        model = PASSES[name](model, context)
    return model


def _chosen(names: Iterable[str]) -> Sequence[str]:
    names = list(names)
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise ValueError(f"unknown optimization passes {unknown}; known: {', '.join(PASSES)}")
    return [n for n in PASSES if n in names]
