"""The runtime: runs lowered graphs; owns jax.jit and the compile cache."""

from transmuter.runtime.compiled import CompiledModel
from transmuter.runtime.execute import run, x64_scope
from transmuter.runtime.model import Model

__all__ = ["CompiledModel", "Model", "run", "x64_scope"]
