"""ONNX's backend API (`onnx.backend.base`) over Transmuter: what ONNX's own conformance suite
(`onnx.backend.test.BackendTest`) drives.

    rep = TransmuterBackend.prepare(model_proto)      # load once
    outputs = rep.run([x, y])                        # compiled on the first call, then cached

Every run goes through `transmuter.compile`: the first call compiles for the shapes it is given
and keeps the `CompiledModel`; later calls reuse it (a new input shape compiles again inside it).
Inputs are a list in graph input order (initializers excluded) or a dict by name; outputs come
back as a list in graph output order: numpy arrays, Python lists for sequences, None for an empty
optional, numpy object arrays for strings.

This module is the one place outside `transmuter.frontend` that imports onnx: the backend API is
ONNX's own interface, so it is written in ONNX's terms (ModelProto, NodeProto, Device strings).

Random operators draw from the compiled model's key stream, or from the `key=` given to `run`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

import transmuter
from transmuter import dtypes
from transmuter.errors import InputError

__all__ = [
    "TransmuterBackend",
    "TransmuterRep",
    "prepare",
    "run_model",
    "run_node",
    "supports_device",
]


class TransmuterRep(BackendRep):
    """A loaded model and, after its first run, its `CompiledModel`."""

    def __init__(self, model: transmuter.Model, device: jax.Device):
        self.model = model
        self.device = device
        self.compiled: transmuter.CompiledModel | None = None

    def run(self, inputs: Any, *, key: Any = None, **kwargs: Any) -> list[Any]:
        """Run on `inputs` (a list in graph input order, a dict by name, or one array for a
        single-input model); returns the outputs as a list in graph output order. `key` (a JAX
        PRNG key) seeds the random operators of this call; without it the compiled model draws
        from its own key stream."""
        if kwargs:
            raise TypeError(f"TransmuterRep.run takes no options but key; got {sorted(kwargs)}")
        feeds = self._feeds(inputs)
        with jax.default_device(self.device):
            if self.compiled is None:
                self.compiled = transmuter.compile(self.model, feeds)
            outputs = self.compiled(feeds) if key is None else self.compiled(feeds, key=key)
        return [_to_numpy(outputs[name]) for name in self.model.outputs]

    def _feeds(self, inputs: Any) -> dict[str, Any]:
        names = self.model.inputs
        if isinstance(inputs, Mapping):
            return dict(inputs)
        if isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
            inputs = [inputs]
        if len(inputs) > len(names):
            raise InputError(f"{len(inputs)} inputs given, but the model has {len(names)}: {names}")
        # Trailing optional inputs may be left out; the model's own check reports any other gap.
        return dict(zip(names, inputs))


class TransmuterBackend(Backend):
    """`onnx.backend.base.Backend` for Transmuter: prepare, run_model, run_node, supports_device."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> TransmuterRep:
        """Load `model` for `device` ("CPU", "CUDA" or "CUDA:1"). `optimize` is
        `transmuter.load`'s (default True: the graph passes run). Options the test runner
        passes along (rtol, atol) are not the backend's concern and are ignored."""
        optimize = kwargs.get("optimize", True)
        return TransmuterRep(transmuter.load(model, optimize=optimize), _jax_device(device))

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> list[Any]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Run one node on `inputs` (a list in the node's input order, absent optional inputs
        skipped, or a dict by input name). `opset_version` picks the ai.onnx opset."""
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        model = _node_model(node, inputs, outputs_info, opset)
        feeds = inputs if isinstance(inputs, Mapping) else list(inputs)
        return cls.run_model(model, feeds, device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            _jax_device(device)
        except (ValueError, RuntimeError, AttributeError, IndexError):
            return False
        return True


def _jax_device(device: str) -> jax.Device:
    """The JAX device for an ONNX device string; an error when this process has none."""
    parsed = Device(device)
    platform = "cpu" if parsed.type == DeviceType.CPU else "gpu"
    return jax.devices(platform)[parsed.device_id]


def _node_model(
    node: onnx.NodeProto,
    inputs: Any,
    outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None,
    opset: int,
) -> onnx.ModelProto:
    present = [name for name in node.input if name]
    if isinstance(inputs, Mapping):
        values = [inputs[name] for name in present]
    else:
        values = list(inputs)
        if len(values) != len(present):
            raise InputError(
                f"{node.op_type} node reads {len(present)} inputs {present}; got {len(values)}"
            )
    graph_inputs = [_value_info(name, value) for name, value in zip(present, values)]
    outputs = [name for name in node.output if name]
    if outputs_info is not None:
        graph_outputs = [
            helper.make_tensor_value_info(name, dtypes.to_onnx(np.dtype(dtype)), list(shape))
            for name, (dtype, shape) in zip(outputs, outputs_info)
        ]
    else:
        graph_outputs = [helper.make_value_info(name, onnx.TypeProto()) for name in outputs]
    graph = helper.make_graph([node], f"{node.op_type}_node", graph_inputs, graph_outputs)
    opsets = [helper.make_opsetid("", opset)]
    if node.domain not in ("", "ai.onnx"):
        opsets.append(helper.make_opsetid(node.domain, 1))
    return helper.make_model(graph, opset_imports=opsets)


def _value_info(name: str, value: Any) -> onnx.ValueInfoProto:
    if isinstance(value, list):
        elem = dtypes.to_onnx(np.asarray(value[0]).dtype) if value else onnx.TensorProto.FLOAT
        return helper.make_tensor_sequence_value_info(name, elem, None)
    array = np.asarray(value)
    return helper.make_tensor_value_info(name, dtypes.to_onnx(array.dtype), list(array.shape))


def _to_numpy(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [_to_numpy(v) for v in value]
    return np.asarray(value)


prepare = TransmuterBackend.prepare
run_model = TransmuterBackend.run_model
run_node = TransmuterBackend.run_node
supports_device = TransmuterBackend.supports_device
