"""`compile`: ahead-of-time compiled programs of a model, one per input signature, kept LRU."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from transmuter.errors import HostValueNeeded, TransmuterError
from transmuter.runtime.execute import evaluate, x64_scope

Signature = tuple[tuple[str, tuple[int, ...], str], ...]


class CompiledModel:
    """A callable `inputs -> outputs` that compiles the whole graph as one XLA program per input
    signature (names, shapes, dtypes) and keeps the `cache_size` most recently used."""

    def __init__(self, model, example_inputs: Mapping[str, Any], *, cache_size: int = 8):
        if cache_size < 1:
            raise ValueError(f"cache_size must be at least 1, got {cache_size}")
        self.model = model
        self.cache_size = cache_size
        self._programs: OrderedDict[Signature, Callable] = OrderedDict()
        self._jitted = jax.jit(self._program)
        self(example_inputs)

    def _program(self, params, device_constants, inputs):
        return evaluate(self.model, inputs, params, device_constants)

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        arrays = self.model.check_inputs(inputs)
        signature = tuple((k, tuple(np.shape(v)), np.dtype(v.dtype).name) for k, v in arrays.items())
        program = self._programs.get(signature)
        if program is None:
            program = self._compile(signature, arrays)
        else:
            self._programs.move_to_end(signature)
        with x64_scope():
            return program(self.model.params, self.model.device_constants, arrays)

    @property
    def signatures(self) -> list[Signature]:
        """The input signatures compiled and cached, least recently used first."""
        return list(self._programs)

    def _compile(self, signature: Signature, arrays: Mapping[str, Any]) -> Callable:
        with x64_scope():
            try:
                lowered = self._jitted.lower(self.model.params, self.model.device_constants, arrays)
            except HostValueNeeded as exc:
                raise TransmuterError(
                    f"{exc} This graph needs a value on the host inside the program; graph "
                    "breaks are not implemented yet."
                ) from exc
            program = lowered.compile()
        self._programs[signature] = program
        while len(self._programs) > self.cache_size:
            self._programs.popitem(last=False)  # dropping the executable frees its memory
        return program
