"""Graph breaks, the segment cache, static inputs, the persistent cache and telemetry, on graphs
where values decide shapes or branches, checked against ONNX Runtime."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from opcheck import make_model, ort_run

import transmuter
from transmuter import telemetry

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
SEQUENCE_I64 = helper.make_sequence_type_proto(helper.make_tensor_type_proto(I64, None))


def chain(prefix, x, n, out):
    """n cheap nodes so a segment is long enough to be compiled (the eager threshold is 20)."""
    nodes, current = [], x
    for i in range(n):
        name = out if i == n - 1 else f"{prefix}{i}"
        nodes.append(helper.make_node("Sin" if i % 2 else "Cos", [current], [name]))
        current = name
    return nodes


def nonzero_model():
    """x -> 24 ops -> NonZero(x > 0) -> gather the positive values -> 24 ops -> y."""
    nodes = chain("a", "x", 24, "h")
    nodes += [
        helper.make_node("Greater", ["h", "zero"], ["positive"]),
        helper.make_node("NonZero", ["positive"], ["where"], name="nonzero"),
        helper.make_node("Transpose", ["where"], ["where_t"]),
        helper.make_node("GatherND", ["h", "where_t"], ["picked"]),
    ]
    nodes += chain("b", "picked", 24, "y")
    return make_model(
        nodes,
        [helper.make_tensor_value_info("x", F, ["n", 3])],
        [helper.make_tensor_value_info("y", F, ["k"])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )


class Recorder:
    def __init__(self, events):
        self.seen = []
        self.id = object()
        telemetry.attach(self.id, events, lambda e, m, md: self.seen.append((e, m, md)))

    def names(self):
        return [e for e, _, _ in self.seen]

    def close(self):
        telemetry.detach(self.id)


@pytest.fixture
def recorder():
    made = []

    def make(events):
        made.append(Recorder(events))
        return made[-1]

    yield make
    for r in made:
        r.close()


def test_nonzero_mid_graph_breaks_and_matches(rng):
    proto = nonzero_model()
    model = transmuter.load(proto)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    fn = transmuter.compile(model, {"x": x})
    assert fn.segments == [(0, 25, True), (26, "end", True)]
    for n in (5, 5, 7):
        x = rng.standard_normal((n, 3)).astype(np.float32)
        got = fn({"x": x})["y"]
        np.testing.assert_allclose(got, ort_run(proto, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_short_segments_after_a_break_run_eagerly(rng):
    proto = nonzero_model()
    model = transmuter.load(proto)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    fn = transmuter.compile(model, {"x": x}, eager_threshold=30)
    assert fn.segments == [(0, 25, False), (26, "end", False)]
    np.testing.assert_allclose(fn({"x": x})["y"], ort_run(proto, {"x": x})[0], rtol=1e-5, atol=1e-6)


def if_model(then_shape, else_shape):
    """An If on an input flag; each branch reshapes x differently."""

    def branch(name, shape):
        return helper.make_graph(
            [helper.make_node("Reshape", ["x", f"{name}_shape"], [f"{name}_out"])],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_out", F, None)],
            [numpy_helper.from_array(np.array(shape, np.int64), f"{name}_shape")],
        )

    nodes = (
        chain("a", "x0", 22, "x")
        + [
            helper.make_node(
                "If",
                ["flag"],
                ["chosen"],
                name="the_if",
                then_branch=branch("then", then_shape),
                else_branch=branch("else", else_shape),
            ),
        ]
        + chain("b", "chosen", 22, "y")
    )
    return make_model(
        nodes,
        [
            helper.make_tensor_value_info("x0", F, [4, 6]),
            helper.make_tensor_value_info("flag", BOOL, []),
        ],
        [helper.make_tensor_value_info("y", F, None)],
    )


def test_if_with_different_branch_shapes_breaks(rng, recorder):
    proto = if_model([3, 8], [24])
    model = transmuter.load(proto)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    events = recorder(["transmuter.segment.compile.stop", "transmuter.break.stop"])
    fn = transmuter.compile(model, {"x0": x, "flag": np.array(True)})
    for flag in (True, False, True):
        inputs = {"x0": x, "flag": np.array(flag)}
        got = fn(inputs)["y"]
        assert got.shape == ((3, 8) if flag else (24,))
        np.testing.assert_allclose(got, ort_run(proto, inputs)[0], rtol=1e-5, atol=1e-6)
    first = [md for e, _, md in events.seen if e == "transmuter.segment.compile.stop"][0]
    assert first["stop"] == 22 and first["reason"] == "the If condition" and first["compiled"]
    breaks = [md for e, _, md in events.seen if e == "transmuter.break.stop"]
    assert breaks[0]["op_type"] == "If" and breaks[0]["node"] == "the_if"


def test_if_with_equal_branch_shapes_stays_compiled(rng):
    proto = if_model([3, 8], [3, 8])
    model = transmuter.load(proto)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    fn = transmuter.compile(model, {"x0": x, "flag": np.array(True)})
    assert fn.segments == [(0, "end", True)]
    np.testing.assert_allclose(
        fn({"x0": x, "flag": np.array(False)})["y"],
        ort_run(proto, {"x0": x, "flag": np.array(False)})[0],
        rtol=1e-5,
        atol=1e-6,
    )


def test_static_input_decides_the_branch_without_a_break(rng, recorder):
    """A merged-decoder-style If on use_cache_branch, given as a static input."""
    proto = if_model([3, 8], [24])
    model = transmuter.load(proto)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    misses = recorder(["transmuter.cache.miss"])
    fn = transmuter.compile(model, {"x0": x}, static_inputs={"flag": np.array(False)})
    assert fn.segments == [(0, "end", True)]
    assert fn({"x0": x})["y"].shape == (24,)  # the compile-time value is used
    assert len(misses.seen) == 1
    got = fn({"x0": x, "flag": np.array(True)})["y"]  # a new value compiles again
    assert got.shape == (3, 8) and len(misses.seen) == 2
    np.testing.assert_allclose(got, ort_run(proto, {"x0": x, "flag": np.array(True)})[0], rtol=1e-5)


def vad_model(rng):
    """A voice-activity-style graph: x[1, n] -> 22 ops -> If(sr == 16000) picks a 16 kHz or an
    8 kHz LSTM, each valid only for its own rate's input (x[1, 64] or x[1, 32]) -> 22 ops -> a
    second If on the same condition, whose branches give different shapes."""

    def lstm_branch(name, reshape):
        weights = {
            f"{name}_shape": np.array(reshape, np.int64),
            f"{name}_W": rng.standard_normal((1, 12, 32)).astype(np.float32) * 0.3,
            f"{name}_R": rng.standard_normal((1, 12, 3)).astype(np.float32) * 0.3,
        }
        return helper.make_graph(
            [
                helper.make_node("Reshape", ["x", f"{name}_shape"], [f"{name}_seq"]),
                helper.make_node(
                    "LSTM",
                    [f"{name}_seq", f"{name}_W", f"{name}_R"],
                    ["", f"{name}_h"],
                    hidden_size=3,
                ),
            ],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_h", F, None)],
            [numpy_helper.from_array(v, k) for k, v in weights.items()],
        )

    def post_branch(name, node):
        return helper.make_graph(
            [node], name, [], [helper.make_tensor_value_info(node.output[0], F, None)]
        )

    nodes = chain("a", "x0", 22, "x") + [
        helper.make_node("Equal", ["sr", "rate16k"], ["is16k"]),
        helper.make_node(
            "If",
            ["is16k"],
            ["h"],
            name="pick_rate",
            then_branch=lstm_branch("at16k", [2, 1, 32]),  # 64 samples: 2 steps of 32
            else_branch=lstm_branch("at8k", [1, 1, 32]),  # 32 samples: 1 step
        ),
    ]
    nodes += chain("b", "h", 22, "g") + [
        helper.make_node(
            "If",
            ["is16k"],
            ["y"],
            name="post",
            then_branch=post_branch("double", helper.make_node("Add", ["g", "g"], ["d"])),
            else_branch=post_branch(
                "repeat", helper.make_node("Concat", ["g", "g"], ["c"], axis=0)
            ),
        )
    ]
    return make_model(
        nodes,
        [
            helper.make_tensor_value_info("x0", F, [1, "samples"]),
            helper.make_tensor_value_info("sr", I64, []),
        ],
        [helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(np.array(16000, np.int64), "rate16k")],
    )


def test_if_whose_untaken_branch_cannot_be_traced_breaks(rng, recorder):
    """Compiling for 16 kHz traces the 8 kHz branch with 16 kHz shapes, where its Reshape and
    LSTM fail: that is a break on the condition, not an error, and the condition then stays a
    host value, so the second If on it traces only its taken branch (no second break)."""
    proto = vad_model(rng)
    model = transmuter.load(proto)
    events = recorder(["transmuter.segment.compile.stop", "transmuter.break.stop"])
    at16k = {"x0": rng.standard_normal((1, 64)).astype(np.float32), "sr": np.array(16000)}
    at8k = {"x0": rng.standard_normal((1, 32)).astype(np.float32), "sr": np.array(8000)}
    fn = transmuter.compile(model, at16k)
    for inputs in (at16k, at8k, at16k):
        got = fn(inputs)["y"]
        want = ort_run(proto, inputs)[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        eager = transmuter.run(model, inputs)["y"]
        np.testing.assert_allclose(eager, want, rtol=1e-5, atol=1e-6)
    breaks = [md for e, _, md in events.seen if e == "transmuter.break.stop"]
    assert {md["node"] for md in breaks} == {"pick_rate"}
    compiles = [md for e, _, md in events.seen if e == "transmuter.segment.compile.stop"]
    first = compiles[0]
    assert first["compiled"] and "else_branch cannot be traced" in first["reason"]
    after = [md for md in compiles if md["position"] > first["stop"]]
    assert after and all(md["stop"] == "end" for md in after)  # the second If did not break
    # The condition is a host value of the next segment's key: one program per rate.
    assert all("is16k" in md["host_values"] for md in after) and len(after) == 2


def test_loop_with_a_trip_count_from_data(rng):
    """The trip count is computed from an input value: a break at the Loop."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Mul", ["acc_in", "two"], ["acc_out"]),
            helper.make_node("Cast", ["i"], ["i_f"], to=F),
            helper.make_node("Add", ["acc_out", "i_f"], ["scan_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("cond_in", BOOL, []),
            helper.make_tensor_value_info("acc_in", F, [2]),
        ],
        [
            helper.make_tensor_value_info("cond_out", BOOL, []),
            helper.make_tensor_value_info("acc_out", F, [2]),
            helper.make_tensor_value_info("scan_out", F, [2]),
        ],
        [numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )
    nodes = [
        helper.make_node("ReduceSum", ["counts"], ["total"], keepdims=0),
        helper.make_node("Loop", ["total", "", "start"], ["final", "scanned"], body=body),
    ]
    proto = make_model(
        nodes,
        [
            helper.make_tensor_value_info("counts", I64, [2]),
            helper.make_tensor_value_info("start", F, [2]),
        ],
        [
            helper.make_tensor_value_info("final", F, [2]),
            helper.make_tensor_value_info("scanned", F, None),
        ],
    )
    model = transmuter.load(proto)
    start = rng.standard_normal(2).astype(np.float32)
    fn = transmuter.compile(model, {"counts": np.array([1, 2]), "start": start})
    for counts in ([1, 2], [0, 5], [2, 2]):
        inputs = {"counts": np.array(counts), "start": start}
        got = fn(inputs)
        want = ort_run(proto, inputs)
        np.testing.assert_allclose(got["final"], want[0], rtol=1e-5)
        np.testing.assert_allclose(got["scanned"], want[1], rtol=1e-5)


def repeat_interleave_model():
    """torch.onnx's repeat_interleave(arange(n), counts): a Loop over the tokens whose body
    inserts each token's index `counts[i]` times into a sequence (a tensor per token, as long as
    its count), ConcatFromSequence, then 24 ops on the frames."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Unsqueeze", ["i", "axis0"], ["i_1"]),
            helper.make_node("Gather", ["counts", "i"], ["count"]),
            helper.make_node("Unsqueeze", ["count", "axis0"], ["count_1"]),
            helper.make_node("Expand", ["i_1", "count_1"], ["repeated"]),
            helper.make_node("SequenceInsert", ["seq_in", "repeated"], ["seq_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("cond_in", BOOL, []),
            helper.make_value_info("seq_in", SEQUENCE_I64),
        ],
        [
            helper.make_tensor_value_info("cond_out", BOOL, []),
            helper.make_value_info("seq_out", SEQUENCE_I64),
        ],
    )
    nodes = [
        helper.make_node("Shape", ["counts"], ["n"]),
        helper.make_node("Squeeze", ["n"], ["trips"]),
        helper.make_node("SequenceEmpty", [], ["empty"], dtype=I64),
        helper.make_node("Loop", ["trips", "", "empty"], ["pieces"], body=body),
        helper.make_node("ConcatFromSequence", ["pieces"], ["frames"], axis=0),
        helper.make_node("Cast", ["frames"], ["frames_f"], to=F),
        helper.make_node("Mul", ["frames_f", "x"], ["scaled"]),
    ]
    nodes += chain("c", "scaled", 24, "y")
    return make_model(
        nodes,
        [
            helper.make_tensor_value_info("counts", I64, ["n"]),
            helper.make_tensor_value_info("x", F, [1]),
        ],
        [helper.make_tensor_value_info("y", F, ["frames"])],
        [numpy_helper.from_array(np.array([0], np.int64), "axis0")],
    )


def test_a_ragged_sequence_from_a_break_keys_the_next_segment_by_its_total(rng, recorder):
    """The Loop breaks; the sequence it builds (one tensor per token, of data-dependent
    lengths) is concatenated with the break, so the segment after is compiled once per total
    length, not once per pattern of counts."""
    proto = repeat_interleave_model()
    model = transmuter.load(proto)
    x = np.array([0.5], np.float32)
    fn = transmuter.compile(model, {"counts": np.array([1, 2, 3]), "x": x})
    events = recorder(["transmuter.segment.compile.stop"])
    for counts in ([3, 2, 1], [2, 2, 2], [0, 6, 0], [1, 1, 1, 3]):
        inputs = {"counts": np.array(counts), "x": x}
        np.testing.assert_allclose(fn(inputs)["y"], ort_run(proto, inputs)[0], rtol=1e-5)
    # Six frames each time: the segment compiled by `compile` serves them all (the one before
    # the Loop is short, so it runs eagerly).
    assert not [md for _, _, md in events.seen if md.get("compiled")]


def test_eviction_keeps_the_most_recent(rng, recorder):
    proto = nonzero_model()
    model = transmuter.load(proto)
    events = recorder(["transmuter.cache.evict", "transmuter.cache.hit"])
    fn = transmuter.compile(model, {"x": np.ones((2, 3), np.float32)}, cache_size=2)
    for n in (3, 4):  # position 0 now holds n=3 and n=4; n=2 is evicted
        fn({"x": np.ones((n, 3), np.float32)})
    evicted = [md for e, _, md in events.seen if e == "transmuter.cache.evict"]
    assert evicted and evicted[0]["cache_size"] == 2 and evicted[0]["position"] == 0
    assert [s[0][0][1][0] for s in fn.runner.caches[0]] == [(3, 3), (4, 3)]
    fn({"x": np.ones((4, 3), np.float32)})
    assert any(e == "transmuter.cache.hit" and md["position"] == 0 for e, _, md in events.seen)


def test_break_free_graph_at_compile_shapes_skips_the_cache(rng, recorder):
    proto = make_model(
        chain("a", "x", 3, "y"),
        [helper.make_tensor_value_info("x", F, ["n"])],
        [helper.make_tensor_value_info("y", F, ["n"])],
    )
    model = transmuter.load(proto)
    events = recorder(["transmuter.cache.hit", "transmuter.cache.miss"])
    fn = transmuter.compile(model, {"x": np.ones(3, np.float32)})
    fn({"x": np.ones(3, np.float32)})
    assert events.names() == ["transmuter.cache.miss"]
    fn({"x": np.ones(4, np.float32)})
    fn({"x": np.ones(4, np.float32)})
    assert events.names() == [
        "transmuter.cache.miss",
        "transmuter.cache.miss",
        "transmuter.cache.hit",
    ]


def test_events_in_order_with_metadata(rng, recorder, tmp_path):
    proto = nonzero_model()
    path = tmp_path / "nz.onnx"
    onnx.save(proto, path)
    events = recorder(
        [
            f"transmuter.{name}.{kind}"
            for name in ("load", "compile", "call", "segment.compile", "break")
            for kind in ("start", "stop")
        ]
        + ["transmuter.cache.miss"]
    )
    model = transmuter.load(path)
    transmuter.compile(model, {"x": np.ones((2, 3), np.float32)})
    assert events.names() == [
        "transmuter.load.start",
        "transmuter.load.stop",
        "transmuter.compile.start",
        "transmuter.call.start",
        "transmuter.cache.miss",
        "transmuter.segment.compile.start",
        "transmuter.segment.compile.stop",
        "transmuter.break.start",
        "transmuter.break.stop",
        "transmuter.cache.miss",
        "transmuter.segment.compile.start",
        "transmuter.segment.compile.stop",
        "transmuter.call.stop",
        "transmuter.compile.stop",
    ]
    by_name = {e: (m, md) for e, m, md in events.seen}
    measurements, metadata = by_name["transmuter.load.stop"]
    assert metadata == {"source": str(path), "node_count": 52, "opset": 17}
    assert measurements["duration"] > 0
    assert set(by_name["transmuter.load.start"][0]) == {"system_time", "monotonic_time"}
    assert by_name["transmuter.compile.stop"][1]["graph_break"] is True
    stop = [md for e, _, md in events.seen if e == "transmuter.segment.compile.stop"]
    assert stop[0]["stop"] == 25 and stop[0]["compiled"] is True
    assert stop[0]["shapes"] == [("x", ((2, 3), "float32"))] and stop[0]["disk_cache"] is None
    assert stop[1]["stop"] == "end" and stop[1]["reason"] is None
    assert "NonZero" in by_name["transmuter.break.stop"][1]["op_type"]


def test_exception_events_carry_the_reason(recorder):
    events = recorder(["transmuter.load.exception"])
    with pytest.raises(transmuter.ModelLoadError):
        transmuter.load(b"not a model")
    ((event, measurements, metadata),) = events.seen
    assert metadata["kind"] == "ModelLoadError" and "not a valid ONNX model" in metadata["reason"]
    assert "stacktrace" in metadata and "duration" in measurements


def test_a_failing_handler_is_detached(caplog):
    telemetry.attach("broken", ["transmuter.load.start"], lambda *a: 1 / 0)
    transmuter.load(nonzero_model())
    assert not telemetry.listening("transmuter.load.start")
    assert "detaching" in caplog.text


def test_second_process_hits_the_disk_cache(tmp_path):
    onnx.save(nonzero_model(), tmp_path / "nz.onnx")
    script = textwrap.dedent(f"""
        import numpy as np, transmuter
        seen = []
        transmuter.telemetry.attach("t", ["transmuter.segment.compile.stop"],
                                    lambda e, m, md: seen.append(md["disk_cache"]))
        model = transmuter.load({str(tmp_path / "nz.onnx")!r})
        transmuter.compile(model, {{"x": np.ones((3, 3), np.float32)}}, cache_dir={str(tmp_path / "cache")!r})
        print(",".join(seen))
    """)
    runs = [
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    assert runs[0].stdout.strip() == "miss,miss", runs[0].stderr
    assert runs[1].stdout.strip() == "hit,hit", runs[1].stderr


def test_nested_breaks_inside_if_and_loop_bodies(rng):
    """NonZero inside an If branch and inside a Loop body: the enclosing node breaks and runs
    on the host, where the nested data-dependent op can run."""
    then_branch = helper.make_graph(
        [
            helper.make_node("Greater", ["x", "zero"], ["pos"]),
            helper.make_node("NonZero", ["pos"], ["idx"]),
            helper.make_node("Cast", ["idx"], ["then_out"], to=F),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("then_out", F, None)],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["else_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("else_out", F, None)],
    )
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Less", ["x", "zero"], ["neg"]),
            helper.make_node("NonZero", ["neg"], ["where"]),
            helper.make_node("ReduceSum", ["where"], ["count"], keepdims=0),
            helper.make_node("Add", ["acc_in", "count"], ["acc_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("cond_in", BOOL, []),
            helper.make_tensor_value_info("acc_in", I64, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", BOOL, []),
            helper.make_tensor_value_info("acc_out", I64, []),
        ],
    )
    nodes = chain("a", "x0", 22, "x") + [
        helper.make_node(
            "If", ["flag"], ["branch"], then_branch=then_branch, else_branch=else_branch
        ),
        helper.make_node("Loop", ["three", "", "acc0"], ["acc"], body=body),
    ]
    proto = make_model(
        nodes,
        [
            helper.make_tensor_value_info("x0", F, ["n"]),
            helper.make_tensor_value_info("flag", BOOL, []),
        ],
        [
            helper.make_tensor_value_info("branch", F, None),
            helper.make_tensor_value_info("acc", I64, []),
        ],
        [
            numpy_helper.from_array(np.array(0.5, np.float32), "zero"),
            numpy_helper.from_array(np.array(3, np.int64), "three"),
            numpy_helper.from_array(np.array(0, np.int64), "acc0"),
        ],
    )
    model = transmuter.load(proto)
    x = rng.standard_normal(7).astype(np.float32)
    fn = transmuter.compile(model, {"x0": x, "flag": np.array(True)})
    assert fn.segments[0] == (0, 22, True)  # the If breaks
    for flag in (True, False):
        x = rng.standard_normal(7).astype(np.float32)
        inputs = {"x0": x, "flag": np.array(flag)}
        got, want = fn(inputs), ort_run(proto, inputs)
        np.testing.assert_allclose(got["branch"], want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got["acc"], want[1])


def test_detector_head_keeps_a_data_dependent_number_of_boxes(rng):
    """Conv backbone -> boxes and scores -> NonMaxSuppression -> Gather of the kept boxes: the
    number kept depends on the image, so the graph breaks at NMS and compiles after it."""
    boxes_per_image = 16
    nodes = [
        helper.make_node("Conv", ["image", "w1"], ["f1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["f1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["f2"], strides=[2, 2]),  # [1, 5, 4, 4]
        helper.make_node("Reshape", ["f2", "flat_shape"], ["flat"]),  # [1, 5, 16]
        helper.make_node("Transpose", ["flat"], ["per_box"], perm=[0, 2, 1]),  # [1, 16, 5]
        helper.make_node("Slice", ["per_box", "s0", "s4", "s2"], ["raw_boxes"]),  # [1, 16, 4]
        helper.make_node("Slice", ["per_box", "s4", "s5", "s2"], ["logit"]),  # [1, 16, 1]
        helper.make_node("Sigmoid", ["logit"], ["score_col"]),
        helper.make_node("Transpose", ["score_col"], ["scores"], perm=[0, 2, 1]),  # [1, 1, 16]
        helper.make_node("Mul", ["raw_boxes", "scale"], ["boxes"]),
        helper.make_node(
            "NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "min_score"], ["selected"]
        ),
        helper.make_node("Gather", ["selected", "two"], ["box_index"], axis=1),
        helper.make_node("Squeeze", ["boxes", "zero_axis"], ["all_boxes"]),
        helper.make_node("Gather", ["all_boxes", "box_index"], ["kept"], axis=0),
    ] + chain("post", "kept", 21, "out")
    initializers = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((5, 4, 2, 2)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array([1, 5, boxes_per_image], np.int64), "flat_shape"),
        numpy_helper.from_array(np.array([0], np.int64), "s0"),
        numpy_helper.from_array(np.array([4], np.int64), "s4"),
        numpy_helper.from_array(np.array([5], np.int64), "s5"),
        numpy_helper.from_array(np.array([2], np.int64), "s2"),
        numpy_helper.from_array(np.array(4.0, np.float32), "scale"),
        numpy_helper.from_array(np.array([10], np.int64), "max_out"),
        numpy_helper.from_array(np.array([0.3], np.float32), "iou"),
        numpy_helper.from_array(np.array([0.5], np.float32), "min_score"),
        numpy_helper.from_array(np.array(2, np.int64), "two"),
        numpy_helper.from_array(np.array([0], np.int64), "zero_axis"),
    ]
    proto = make_model(
        nodes,
        [helper.make_tensor_value_info("image", F, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("out", F, ["kept", 4])],
        initializers,
    )
    model = transmuter.load(proto)
    images = [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(6)]
    detect = transmuter.compile(model, {"image": images[0]})
    kept = set()
    for image in images:
        got = detect({"image": image})["out"]
        want = ort_run(proto, {"image": image})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        kept.add(got.shape[0])
    assert len(kept) > 1, f"the images should keep different numbers of boxes, kept {kept}"
    stop = next(start_stop[1] for start_stop in detect.segments if start_stop[0] == 0)
    assert model.ir.graph.nodes[stop].op_type == "NonMaxSuppression"
