"""The XLA compiler options every program the runtime compiles gets, per platform (and every
program `transmuter.jit` makes: the pipelines' loops, a user's own function around `run`).

CPU: XLA's YNNPACK fusion pass (on by default in jaxlib 0.10) merges chains of matmuls and the
elementwise work between them into one library call, and computes every broadcast operand of
that work (a bias, GELU's constants) as a full-size array first: at MiniLM batch 32 that is
tens of MB more read per layer, and 18% of the call. Keeping YNNPACK to single dots keeps its
GEMMs and leaves the elementwise work to XLA's own fusions, which broadcast as they go
(bench/README.md, "XLA options": MiniLM b32 -18%, ResNet-50 -15%, the YOLO detector -25%, ViT
+4%). A user's own XLA_FLAGS setting of the same option wins.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import jax

_YNN = "xla_cpu_experimental_ynn_fusion_type"
CPU = {_YNN: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


def compiler_options(args: Any) -> dict[str, str]:
    """The options for a program of the arrays `args` (a pytree), by their devices' platform."""
    return for_platform(_platform(jax.tree_util.tree_leaves(args)))


def for_platform(platform: str) -> dict[str, str]:
    """The options for a program compiled for `platform` ("cpu", "gpu", ...)."""
    if platform != "cpu":
        return {}
    return {k: v for k, v in CPU.items() if k not in os.environ.get("XLA_FLAGS", "")}


def _platform(leaves: Iterable[Any]) -> str:
    for leaf in leaves:
        if isinstance(leaf, jax.Array):
            return next(iter(leaf.devices())).platform
    return jax.default_backend()
