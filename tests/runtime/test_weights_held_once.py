"""A model's weights are held once on CPU: the device arrays (params, device constants) run on
the graph's own host arrays (`jax.device_put` aliases memory that is aligned and read-only),
whether the weights were inline in the file, external at any offset, or made by a graph pass.
Before, every weight was held twice: once by the graph, once by the device (ir/arrays.py). And
a pass that rearranges weights read from a mapped file drops the file's pages once copied, so
that loading does not peak at both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import onnx
import pytest
from layered import layered_inputs, layered_model
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data
from opcheck import ort_run

import transmuter
from transmuter.frontend.loader import load_model
from transmuter.ir import arrays

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU aliasing")


def weights_model(rng, pad: int = 7) -> onnx.ModelProto:
    """y = Conv(x, K) flattened @ W, and z = MatMulInteger of x's quantized values with an int8
    table (a device constant): float params, a kernel the layout pass rewrites, and an integer
    weight. z quantizes the input, not y: a float product's last bit differs between CPUs' dot
    kernels, and a dynamic quantizer's range turns it into other integers. `pad` float32 values come before the weights in an external data file as onnx.save
    packs it: 7 put W and T at offsets on a 64-byte boundary, 8 off it."""
    kernel = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    w = rng.standard_normal((8 * 6 * 6, 256)).astype(np.float32)
    # 7-bit values, as ORT's quantizer's reduce_range makes them: its u8 x s8 kernel on AVX2
    # without VNNI adds products in pairs in int16 and saturates past that (onnx.reference and
    # Transmuter agree on the full range; that ORT does not). 96 KiB: a device constant.
    table = rng.integers(-64, 64, (3 * 8 * 8, 512)).astype(np.int8)
    nodes = [
        helper.make_node("Conv", ["x", "K"], ["c"]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Reshape", ["r", "flat"], ["f"]),
        helper.make_node("MatMul", ["f", "W"], ["y"]),
        helper.make_node("Reshape", ["x", "flat"], ["rows"]),
        helper.make_node("Add", ["rows", "lead"], ["shifted"]),
        helper.make_node("DynamicQuantizeLinear", ["shifted"], ["q", "q_scale", "q_zero"]),
        helper.make_node("MatMulInteger", ["q", "T", "q_zero"], ["z"]),
    ]
    initializers = [
        numpy_helper.from_array(np.array(0.5, np.float32), "lead"),
        numpy_helper.from_array(np.zeros(pad, np.float32), "padding"),
        numpy_helper.from_array(kernel, "K"),
        numpy_helper.from_array(w, "W"),
        numpy_helper.from_array(table, "T"),
        numpy_helper.from_array(np.array([2, -1], np.int64), "flat"),
    ]
    graph = helper.make_graph(
        nodes,
        "weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 256]),
            helper.make_tensor_value_info("z", TensorProto.INT32, [2, 512]),
        ],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def assert_held_once(model: transmuter.Model) -> None:
    held = model.ir.graph.initializers
    device = {**model.params, **model.device_constants}
    assert {"W", "T"} <= set(device)
    for name, value in device.items():
        assert arrays.is_shareable(held[name]), name
        assert np.shares_memory(np.asarray(value), held[name]), f"{name} is held twice"


@pytest.mark.parametrize("where", ["inline", "external aligned", "external unaligned"])
@pytest.mark.parametrize("optimize", [False, True])
def test_device_weights_are_the_graphs_own_arrays(tmp_path, where, optimize):
    rng = np.random.default_rng(0)
    proto = weights_model(rng, pad=8 if where == "external unaligned" else 7)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    expected = ort_run(proto, {"x": x})
    path = tmp_path / "m.onnx"
    external = where != "inline"
    onnx.save(proto, path, save_as_external_data=external, location="m.bin", size_threshold=0)
    if external:  # the case is what it says: an offset of the file's weights is (un)aligned
        offsets = [
            int(entry.value)
            for t in onnx.load(path, load_external_data=False).graph.initializer
            for entry in t.external_data
            if entry.key == "offset" and t.name in ("W", "T")
        ]
        aligned = [offset % arrays.ALIGNMENT == 0 for offset in offsets]
        assert all(aligned) if where == "external aligned" else not any(aligned), offsets
    model = transmuter.load(path, optimize=optimize)
    if optimize:  # the layout pass stored the kernel spatial axes first: an array it made
        assert "K__spatial_first" in model.params
    assert_held_once(model)
    # At an aligned offset the weight is the file's pages themselves; elsewhere it was read.
    in_file = arrays.file_pages(model.ir.graph.initializers["W"]) is not None
    assert in_file == (where == "external aligned")
    out = transmuter.run(model, {"x": x})
    np.testing.assert_allclose(out["y"], expected[0], rtol=1e-5, atol=1e-4)  # |y| to 100
    np.testing.assert_array_equal(out["z"], expected[1])


def test_a_callers_writable_arrays_are_copied_not_shared():
    """An ir.Model built by the caller keeps its own arrays: writing to them later changes
    neither the params nor the answers."""
    rng = np.random.default_rng(1)
    proto = weights_model(rng)
    graph = load_model(proto)
    w = arrays.empty((8 * 6 * 6, 256), np.float32)  # aligned, but writable
    w[...] = graph.graph.initializers["W"]
    graph.graph.initializers["W"] = w
    model = transmuter.Model(graph)
    assert graph.graph.initializers["W"] is w and model.ir.graph.initializers["W"] is not w
    assert_held_once(model)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    before = np.asarray(transmuter.run(model, {"x": x})["y"])
    w[...] = 0
    np.testing.assert_array_equal(transmuter.run(model, {"x": x})["y"], before)


def test_held_arrays_are_read_only():
    model = transmuter.load(weights_model(np.random.default_rng(2)))
    with pytest.raises(ValueError, match="read-only"):
        model.ir.graph.initializers["W"][0, 0] = 1.0


RESIDENT = """
import sys
from pathlib import Path
import numpy as np
import transmuter

def resident_mib():
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) / 1024

x = {"x": np.ones((4, 1024), np.float32)}
transmuter.compile(transmuter.load(sys.argv[2]), x)(x)  # JAX and XLA warmed up: not counted
start = resident_mib()
model = transmuter.load(sys.argv[1])
transmuter.compile(model, x)(x)
print(round(resident_mib() - start, 1))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_resident_memory_is_the_weights_once(tmp_path):
    """192 MiB of inline float32 weights cost about that resident after load, compile and a
    run (384 and more before, the graph's copy and the device's)."""
    rng = np.random.default_rng(3)

    def chain(count: int) -> onnx.ModelProto:
        nodes, weights, h = [], [], "x"
        for i in range(count):
            w = (rng.standard_normal((1024, 1024), dtype=np.float32) / 32).astype(np.float32)
            weights.append(numpy_helper.from_array(w, f"w{i}"))
            nodes += [
                helper.make_node("MatMul", [h, f"w{i}"], [f"m{i}"]),
                helper.make_node("Tanh", [f"m{i}"], [f"t{i}"]),
            ]
            h = f"t{i}"
        io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 1024]) for n in ("x", h)]
        graph = helper.make_graph(nodes, "chain", io[:1], io[1:], weights)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    onnx.save(chain(48), tmp_path / "big.onnx")  # 48 x 4 MiB
    onnx.save(chain(1), tmp_path / "warm.onnx")
    command = [
        sys.executable,
        "-c",
        RESIDENT,
        str(tmp_path / "big.onnx"),
        str(tmp_path / "warm.onnx"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    growth = float(done.stdout.strip().splitlines()[-1])
    assert growth < 1.4 * 192, f"RSS grew {growth} MiB for 192 MiB of weights"


def resident_file_mib() -> float:
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("RssFile")).split()[1]) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_release_drops_a_mapped_files_pages_and_nothing_else(tmp_path):
    """A pass that copied a mapped weight releases the file's pages: they leave this process's
    memory and come back from the page cache if read again. Process memory is never released
    (MADV_DONTNEED would zero it)."""
    values = np.arange(16 << 20, dtype=np.float32)  # 64 MiB
    values.tofile(tmp_path / "w.bin")
    mapped = arrays.mapped_file(tmp_path / "w.bin", 0, values.nbytes).view(np.float32)
    before = resident_file_mib()
    assert float(mapped.sum(dtype=np.float64)) == float(values.sum(dtype=np.float64))
    touched = resident_file_mib()
    arrays.release(mapped.reshape(4, -1).T)  # through views, as a pass holds it
    released = resident_file_mib()
    assert touched - before > 48 and touched - released > 48, (before, touched, released)
    np.testing.assert_array_equal(mapped, values)  # read back from the page cache

    own = arrays.shareable(values)  # process memory, and a numpy array: both left alone
    arrays.release(own)
    arrays.release(values)
    np.testing.assert_array_equal(own, values)
    assert values[-1] == (16 << 20) - 1


PEAK = """
import sys
from pathlib import Path
import transmuter

def peak_mib():
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmHWM")).split()[1]) / 1024

start = peak_mib()
model = transmuter.load(sys.argv[1])
assert all(f"k{i}__spatial_first" in model.params for i in range(16)), list(model.params)
print(round(peak_mib() - start, 1))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_loading_rearranged_kernels_peaks_at_the_kernels_once(tmp_path):
    """The layout pass releases the file's pages of each kernel it stores rearranged: SD 1.5's
    UNet held its 2.3 GB of kernels twice while loading, the file's pages and the copies (4.9 GB
    at its peak, 2.5 after; now 2.5 throughout)."""
    rng = np.random.default_rng(4)
    kernel = rng.standard_normal((512, 512, 3, 3)).astype(np.float32)  # 9 MiB each
    nodes, weights, h = [], [], "x"
    for i in range(16):
        weights.append(numpy_helper.from_array(kernel + i, f"k{i}"))
        nodes.append(helper.make_node("Conv", [h, f"k{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        h = f"c{i}"
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 512, 4, 4]) for n in ("x", h)]
    graph = helper.make_graph(nodes, "convs", io[:1], io[1:], weights)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(proto, tmp_path / "m.onnx", save_as_external_data=True, location="m.bin")
    done = subprocess.run(
        [sys.executable, "-c", PEAK, str(tmp_path / "m.onnx")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    growth = float(done.stdout.strip().splitlines()[-1])
    assert growth < 1.4 * 144, f"the peak grew {growth} MiB loading 144 MiB of kernels"


def save_aligned(proto: onnx.ModelProto, path: Path) -> None:
    """`proto` with every initializer in `<path>.bin` at a 64-byte aligned offset (onnx.save
    packs them end to end), so that each is memory-mapped when loaded."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    data = bytearray()
    for tensor in proto.graph.initializer:
        data += bytes(-len(data) % arrays.ALIGNMENT)
        raw = numpy_helper.to_array(tensor).tobytes()
        set_external_data(tensor, path.name + ".bin", len(data), len(raw))
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        data += raw
    (path.parent / (path.name + ".bin")).write_bytes(bytes(data))
    onnx.save(proto, path)


def test_the_layers_pass_releases_the_file_pages_it_stacked(tmp_path, monkeypatch):
    """Each layer's weight the layers pass stacks is released once copied: read from a mapped
    file, its pages leave the process (the mechanism the layout case above measures)."""
    proto, shapes = layered_model(18)
    path = tmp_path / "m.onnx"
    save_aligned(proto, path)
    released, release = [], arrays.release
    monkeypatch.setattr(arrays, "release", lambda a: released.append(a) or release(a))
    model = transmuter.load(path)
    stacked = [a for n, a in model.params.items() if n.endswith("__layers")]
    assert len(stacked) == 5
    mapped = [a for a in released if arrays.file_pages(a) is not None]
    assert len(mapped) == sum(a.shape[0] for a in stacked)
    inputs = layered_inputs(shapes)
    want = transmuter.run(transmuter.load(proto, optimize=False), inputs)["y"]
    np.testing.assert_allclose(np.asarray(transmuter.run(model, inputs)["y"]), want, 1e-5, 1e-5)
