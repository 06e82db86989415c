"""Fuzz cases for the loader and the eager runtime, shared by test_fuzz.py (a short, seeded CI
run) and run_long.py (a long run in worker processes).

A case is a fixture file mutated one way (truncated, bytes flipped, dims, opsets, attribute
types or external-data fields edited) or a random small graph, each drawn from a
`random.Random`, so that hypothesis (`st.randoms`) and the long runner share the generators.
`outcome` loads a case, runs it eagerly on `example_inputs` when it loads, and names what
happened: a result, a TransmuterError (its class), or anything else (a bug).
"""

from __future__ import annotations

import math
import os
import random
import signal
from pathlib import Path

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper

import transmuter
from transmuter.checking import example_inputs
from transmuter.errors import TransmuterError

FIXTURES_DIR = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURES = {
    "bert": FIXTURES_DIR / "models" / "bert.onnx",
    "gpt2": FIXTURES_DIR / "models" / "gpt2.onnx",
    "resnet": FIXTURES_DIR / "models" / "resnet.onnx",
    "resnet_qdq": FIXTURES_DIR / "variants" / "resnet_qdq.onnx",
    "bert_opt_int8": FIXTURES_DIR / "variants" / "bert_opt_int8.onnx",
}
MUTATIONS = ("truncate", "flip", "dims", "opset", "attribute", "external")
KINDS = (*MUTATIONS, "graph")

# Example inputs larger than this are not made: a mutated file may declare any size, and the
# harness, not Transmuter, would then be what runs out of memory.
MAX_INPUT_ELEMENTS = 1 << 22

_bytes: dict[str, bytes] = {}
_protos: dict[str, onnx.ModelProto] = {}


def fixture_bytes(name: str) -> bytes:
    if name not in _bytes:
        _bytes[name] = FIXTURES[name].read_bytes()
    return _bytes[name]


def fixture_proto(name: str) -> onnx.ModelProto:
    """A fresh copy of the fixture's ModelProto, to edit."""
    if name not in _protos:
        _protos[name] = onnx.load_from_string(fixture_bytes(name))
    copy = onnx.ModelProto()
    copy.CopyFrom(_protos[name])
    return copy


# Values that break assumptions: negative, zero, huge, and 64-bit edges.
_DIMS = (-(2**63), -5, -1, 0, 1, 2, 3, 7, 64, 2**31, 2**40, 2**63 - 1)
_OPSETS = (-1, 0, 1, 6, 7, 9, 11, 13, 17, 18, 21, 22, 23, 28, 29, 99, 2**62)
_FIELD_VALUES = (
    "",
    "0",
    "-1",
    "-4",
    "abc",
    "4.5",
    "1e3",
    "0x10",
    " 8",
    "99999999999999999999999",
    "../outside.bin",
    "/etc/hostname",
    "data.bin",
    "missing.bin",
    ".",
    "data.bin\x00x",
    "x" * 5000,
    "data.bin/x",
)


def make_case(kind: str, fixture: str, rng: random.Random, folder: str) -> bytes | str:
    """The source of one case: bytes, or the path of a file written under `folder` (external
    data). `fixture` is ignored for "graph"."""
    if kind == "truncate":
        data = fixture_bytes(fixture)
        return data[: rng.randrange(len(data))]
    if kind == "flip":
        data = bytearray(fixture_bytes(fixture))
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= rng.randint(1, 255)
        return bytes(data)
    if kind == "graph":
        return random_graph(rng).SerializeToString()
    if kind == "external":
        return external_case(fixture, rng, folder)
    proto = fixture_proto(fixture)
    {"dims": edit_dims, "opset": edit_opset, "attribute": edit_attribute}[kind](proto, rng)
    return proto.SerializeToString()


def _dim_value(rng: random.Random) -> int:
    return rng.choice(_DIMS) if rng.random() < 0.5 else rng.randint(-3, 100)


def edit_dims(proto: onnx.ModelProto, rng: random.Random) -> None:
    """A dim of an initializer, a Constant's tensor, or a declared input / output / value_info
    set to an odd value, appended or removed."""
    g = proto.graph
    constants = [
        a.t for n in g.node for a in n.attribute if n.op_type == "Constant" and a.name == "value"
    ]
    tensors = list(g.initializer) + constants
    infos = list(g.input) + list(g.output) + list(g.value_info)
    action = rng.random()
    if tensors and (not infos or rng.random() < 0.6):
        dims = rng.choice(tensors).dims
        if action < 0.7 and len(dims):
            dims[rng.randrange(len(dims))] = _dim_value(rng)
        elif action < 0.85 or not len(dims):
            dims.append(_dim_value(rng))
        else:
            del dims[rng.randrange(len(dims))]
        return
    if not infos:
        return
    dims = rng.choice(infos).type.tensor_type.shape.dim
    if action < 0.7 and len(dims):
        dim = dims[rng.randrange(len(dims))]
        if rng.random() < 0.8:
            dim.dim_value = _dim_value(rng)
        else:
            dim.dim_param = rng.choice(["", "batch", "sequence", "x" * 300, "1"])
    elif action < 0.85 or not len(dims):
        dims.add().dim_value = _dim_value(rng)
    else:
        del dims[rng.randrange(len(dims))]


def edit_opset(proto: onnx.ModelProto, rng: random.Random) -> None:
    """An opset import's version or domain changed, or an import added or removed."""
    imports = proto.opset_import
    action = rng.random()
    if action < 0.6 and len(imports):
        rng.choice(imports).version = rng.choice(_OPSETS)
    elif action < 0.75 and len(imports):
        rng.choice(imports).domain = rng.choice(["", "ai.onnx", "ai.onnx.ml", "com.microsoft", "x"])
    elif action < 0.9:
        imports.add(domain=rng.choice(["", "ai.onnx.ml", "com.microsoft"]), version=99)
    elif len(imports):
        del imports[rng.randrange(len(imports))]


def _attributes(graph: onnx.GraphProto):
    for node in graph.node:
        for a in node.attribute:
            yield a
            if a.type == AttributeProto.GRAPH:
                yield from _attributes(a.g)


def edit_attribute(proto: onnx.ModelProto, rng: random.Random) -> None:
    """An attribute's type swapped (its payload kept, or moved to the new type's field), its
    value replaced by an odd one, or made a function-attribute reference."""
    attributes = list(_attributes(proto.graph))
    if not attributes:
        return
    a = rng.choice(attributes)
    action = rng.random()
    if action < 0.5:
        a.type = rng.randint(0, 14)  # 0 is UNDEFINED
    elif action < 0.7:
        try:
            payload = helper.get_attribute_value(a)
        except Exception:  # a type already swapped: no value to move
            payload = 0
        kind = rng.choice([AttributeProto.INT, AttributeProto.FLOAT, AttributeProto.INTS])
        name = a.name
        a.Clear()
        a.name = rng.choice([name, "axis", "perm", "to"])
        number = payload if isinstance(payload, (int, float)) else rng.randint(-9, 9)
        if kind == AttributeProto.INT:
            a.i = int(number) if math.isfinite(number) else 0
        elif kind == AttributeProto.FLOAT:
            a.f = float(number)
        else:
            a.ints.extend([rng.randint(-9, 9) for _ in range(rng.randint(0, 5))])
        a.type = kind
    elif action < 0.95:
        if a.type == AttributeProto.INT:
            a.i = rng.choice([-(2**63), -9, -1, 0, 1, 2, 5, 2**31, 2**63 - 1])
        elif a.type == AttributeProto.INTS:
            a.ints[:] = [rng.choice([-(2**63), -2, -1, 0, 1, 3, 2**40]) for _ in a.ints]
        elif a.type == AttributeProto.FLOAT:
            a.f = rng.choice([float("nan"), float("inf"), -1.0, 0.0, 1e30])
        elif a.type == AttributeProto.STRING:
            a.s = rng.choice([b"", b"\xff\xfe", b"NOTSET", b"x" * 50])
        else:
            a.type = AttributeProto.INT
    else:
        a.ref_attr_name = "outer"


def external_case(fixture: str, rng: random.Random, folder: str) -> str:
    """The fixture saved with its initializers in one external file, then one field of one
    tensor's external_data edited (or removed, or duplicated), or the data file truncated."""
    proto = fixture_proto(fixture)
    path = os.path.join(folder, "model.onnx")
    data_path = os.path.join(folder, "data.bin")
    onnx.save_model(
        proto,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="data.bin",
        size_threshold=0,
    )
    saved = onnx.load(path, load_external_data=False)
    tensors = [t for t in saved.graph.initializer if t.external_data]
    action = rng.random()
    if action < 0.15 or not tensors:
        size = os.path.getsize(data_path)
        with open(data_path, "r+b") as f:
            f.truncate(rng.randrange(size) if size else 0)
        return path
    t = rng.choice(tensors)
    if action < 0.75:
        key = rng.choice(["location", "offset", "length", "checksum", "bogus"])
        value = rng.choice(_FIELD_VALUES) if rng.random() < 0.7 else str(rng.randint(0, 2**20))
        entries = [e for e in t.external_data if e.key == key]
        entry = entries[0] if entries else t.external_data.add(key=key)
        entry.value = value
    elif action < 0.85:
        del t.external_data[rng.randrange(len(t.external_data))]
    elif action < 0.95:
        t.external_data.add(key="offset", value=str(rng.randint(0, 2**16)))
    else:
        t.data_location = TensorProto.DEFAULT  # says inline but holds no data
    with open(path, "wb") as f:
        f.write(saved.SerializeToString())
    return path


# Random small graphs: a chain of elementwise and shape ops over random shapes and dtypes.
_DTYPES = (TensorProto.FLOAT, TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32)
_DTYPES += (TensorProto.BOOL, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.UINT8)
_UNARY = ("Relu", "Neg", "Abs", "Exp", "Log", "Sqrt", "Sigmoid", "Tanh", "Floor", "Not")
_UNARY += ("Identity", "Reciprocal", "Sign", "IsNaN", "Erf")
_BINARY = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Less", "And", "MatMul")
_BINARY += ("Mod", "BitShift", "Greater", "PRelu")
_SHAPED = ("Softmax", "Cast", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "ReduceSum")
_SHAPED += ("ReduceMean", "ReduceMax", "ArgMax", "Reshape", "Expand", "Tile", "Concat", "Slice")
_SHAPED += ("Gather", "Pad", "Shape", "Size", "ConstantOfShape", "Where", "CumSum", "TopK")
_SHAPED += ("Split", "Range", "OneHot", "Clip", "Einsum", "GatherElements", "ScatterND")


def random_graph(rng: random.Random) -> onnx.ModelProto:
    opset = rng.choice([7, 11, 13, 17, 18, 21])
    names: list[str] = []
    inputs, initializers, nodes = [], [], []

    def ints(count: int, low: int = -3, high: int = 5) -> list[int]:
        return [rng.randint(low, high) for _ in range(count)]

    def const(values, dtype=np.int64) -> str:
        name = f"c{len(initializers)}"
        initializers.append(onnx.numpy_helper.from_array(np.asarray(values, dtype), name))
        return name

    for i in range(rng.randint(1, 3)):
        shape = [rng.choice([0, 1, 1, 2, 3, 4]) for _ in range(rng.randint(0, 4))]
        declared = [d if rng.random() < 0.8 else f"d{i}_{axis}" for axis, d in enumerate(shape)]
        inputs.append(helper.make_tensor_value_info(f"x{i}", rng.choice(_DTYPES), declared))
        names.append(f"x{i}")
    for i in range(rng.randint(1, 6)):
        out = f"v{i}"
        a, b = rng.choice(names), rng.choice(names)
        group = rng.random()
        attrs: dict = {}
        if group < 0.25:
            op, ins = rng.choice(_UNARY), [a]
        elif group < 0.5:
            op, ins = rng.choice(_BINARY), [a, b]
            if op == "BitShift":
                attrs["direction"] = rng.choice(["LEFT", "RIGHT", "UP"])
        else:
            op = rng.choice(_SHAPED)
            ins, attrs = _shaped(op, a, b, rng, ints, const, opset)
        attrs = {k: v for k, v in attrs.items() if not (isinstance(v, list) and not v)}
        nodes.append(helper.make_node(op, ins, [out], name=f"n{i}", **attrs))
        names.append(out)
    outputs = [onnx.ValueInfoProto(name=names[-1])]
    if rng.random() < 0.3 and len(names) > 2:
        outputs.append(onnx.ValueInfoProto(name=rng.choice(names[:-1])))
    graph = helper.make_graph(nodes, "random", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _shaped(op, a, b, rng, ints, const, opset) -> tuple[list[str], dict]:
    axis = rng.randint(-4, 4)
    axes_as_input = opset >= 13
    if op == "Softmax":
        return [a], {"axis": axis}
    if op == "Cast":
        return [a], {"to": rng.choice((*_DTYPES, TensorProto.STRING, 0, 99))}
    if op == "Transpose":
        perm = list(range(rng.randint(0, 4)))
        rng.shuffle(perm)
        return [a], ({"perm": perm} if rng.random() < 0.8 else {})
    if op == "Flatten":
        return [a], {"axis": axis}
    if op in ("Squeeze", "Unsqueeze"):
        axes = ints(rng.randint(0, 3), -4, 4)
        if axes_as_input or (op == "Unsqueeze" and opset >= 13):
            return [a, const(axes)], {}
        return [a], {"axes": axes}
    if op.startswith("Reduce"):
        axes = ints(rng.randint(0, 2), -4, 4)
        keep = {"keepdims": rng.randint(0, 1)}
        if op == "ReduceSum" and axes_as_input:
            return [a, const(axes)], keep
        if opset >= 18:
            return [a, const(axes)], keep
        return [a], {"axes": axes, **keep}
    if op == "ArgMax":
        return [a], {"axis": axis, "keepdims": rng.randint(0, 1)}
    if op in ("Reshape", "Expand", "Tile", "ConstantOfShape"):
        values = ints(rng.randint(0, 4), -1 if op == "Reshape" else 0, 4)
        return ([const(values)] if op == "ConstantOfShape" else [a, const(values)]), {}
    if op == "Concat":
        return [a, b], {"axis": axis}
    if op == "Slice":
        n = rng.randint(1, 3)
        ins = [a, const(ints(n, -5, 5)), const(ints(n, -5, 9)), const(ints(n, -4, 4))]
        if rng.random() < 0.5:
            ins.append(const([rng.choice([-2, -1, 1, 2, 0]) for _ in range(n)]))
        return ins, {}
    if op in ("Gather", "GatherElements"):
        return [a, const(ints(rng.randint(0, 3), -4, 4))], {"axis": axis}
    if op == "Pad":
        return [a, const(ints(2 * rng.randint(0, 4), -1, 3))], {}
    if op in ("Shape", "Size"):
        return [a], {}
    if op == "Where":
        return [const([True, False], np.bool_), a, b], {}
    if op == "CumSum":
        return [a, const(axis)], {"reverse": rng.randint(0, 1)}
    if op == "TopK":
        return [a, const([rng.randint(-1, 5)])], {"axis": axis}
    if op == "Split":
        return [a], {"axis": axis}
    if op == "Range":
        start, limit, delta = ints(3, -3, 6)
        return [const(start), const(limit), const(delta)], {}
    if op == "OneHot":
        return [a, const(rng.randint(-1, 5)), const([0, 1])], {"axis": axis}
    if op == "Clip":
        return [a], {}
    if op == "Einsum":
        return [a, b], {"equation": rng.choice(["ij,jk->ik", "i,i->", "...,...->...", "ab"])}
    if op == "ScatterND":
        return [a, const([[rng.randint(-2, 3)]]), b], {}
    raise AssertionError(op)


# Running a case.


class Timeout(BaseException):
    """A case ran past its time. A BaseException, so the runtime's `except Exception` (which
    turns an operator's failure into a NodeError) cannot swallow it."""


def _alarm(signum, frame):
    raise Timeout


def _declared_size(model: transmuter.Model) -> int:
    total = 0
    for spec in model.input_specs.values():
        shape = getattr(spec, "shape", None) or ()
        total += math.prod(d if isinstance(d, int) else 8 for d in shape)
    return total


def outcome(source: bytes | str, run: bool = True, timeout: float = 30.0) -> tuple[str, str]:
    """What loading (and, if it loads and `run`, running eagerly) `source` does: ("ran", ""),
    ("loaded", ""), ("TransmuterError", class name), ("timeout", ""), or ("foreign",
    "<type>: <message>") for any other exception: a bug."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    stage = "load"
    try:
        model = transmuter.load(source)
        if not run:
            return "loaded", ""
        if _declared_size(model) > MAX_INPUT_ELEMENTS:
            return "loaded", "inputs too large to make"
        stage = "inputs"
        inputs = example_inputs(model)
        stage = "run"
        transmuter.run(model, inputs)
        return "ran", ""
    except Timeout:
        return "timeout", stage
    except TransmuterError as exc:
        return "TransmuterError", type(exc).__name__
    except Exception as exc:  # the bugs a fuzzer is for
        return "foreign", f"{type(exc).__name__} at {stage}: {str(exc)[:300]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
