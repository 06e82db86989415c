"""Large graphs: linear bookkeeping, host values computed in the program, breaks that merge,
and the static input that would remove a break."""

from __future__ import annotations

import logging

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from opcheck import make_model

import transmuter
from transmuter import ir, telemetry
from transmuter.runtime.segments import ReadsAfter

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def const(name, value, dtype=np.int64):
    return numpy_helper.from_array(np.array(value, dtype), name)


def test_reads_after_matches_the_names_read_from_each_position():
    then = helper.make_graph(
        [helper.make_node("Add", ["a", "outer"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", F, None)],
    )
    nodes = [
        helper.make_node("Neg", ["x"], ["a"]),
        helper.make_node("Abs", ["a"], ["b"]),
        helper.make_node("If", ["cond"], ["c"], then_branch=then, else_branch=then),
        helper.make_node("Add", ["b", "c"], ["y"]),
    ]
    model = make_model(
        nodes,
        [
            helper.make_tensor_value_info("x", F, [2]),
            helper.make_tensor_value_info("cond", BOOL, []),
            helper.make_tensor_value_info("outer", F, [2]),
        ],
        [helper.make_tensor_value_info("y", F, [2])],
    )
    plan = transmuter.load(model, optimize=False).plan
    reads = ReadsAfter(plan)
    steps = plan.steps
    for position in range(len(steps) + 1):
        want = {"y"}
        for step in steps[position:]:
            want |= {n for n in step.node.inputs if n}
            for sub in ir.subgraphs(step.node):
                want |= sub.outer_names
        assert reads[position] == want, position
    assert reads[-1] == {"y"}


def position_table():
    """table = sin(0 .. n - 1) for n = x.shape[1], and n: host values computed from x's shape."""
    return [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["n"], axis=0),
        helper.make_node("Range", ["zero", "n", "step"], ["positions"]),
        helper.make_node("Cast", ["positions"], ["positions_f"], to=F),
        helper.make_node("Sin", ["positions_f"], ["table"]),
    ]


def masked_model():
    """y = x * mask + a table: the mask and the table are computed from constants and x's shape
    (host values), the Reshape target too; only the target is needed on the host."""
    nodes = [
        *position_table(),
        helper.make_node("Less", ["positions", "limit"], ["keep"]),
        helper.make_node("Cast", ["keep"], ["mask"], to=F),
        helper.make_node("Mul", ["x", "mask"], ["masked"]),
        helper.make_node("Add", ["masked", "table"], ["sum"]),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["minus_one", "n1"], ["target"], axis=0),
        helper.make_node("Reshape", ["sum", "target"], ["y"]),
    ]
    return make_model(
        nodes,
        [helper.make_tensor_value_info("x", F, ["b", "n"])],
        [helper.make_tensor_value_info("y", F, ["b", "n"])],
        [
            const("one", 1),
            const("zero", 0),
            const("step", 1),
            const("limit", 3),
            const("axes", [0]),
            const("minus_one", [-1]),
        ],
    )


def test_host_values_no_node_needs_on_the_host_are_computed_in_the_program():
    model = transmuter.load(masked_model(), optimize=False)
    plan = model.plan
    assert {"target", "n1", "n"} <= plan.host_needed
    assert {"table", "mask", "positions_f", "keep"} <= plan.stageable
    assert "target" not in plan.stageable
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    positions = np.arange(5)
    want = x * (positions < 3) + np.sin(positions.astype(np.float32))
    compiled = transmuter.compile(model, {"x": x})
    assert compiled.segments == [(0, "end", True)]
    np.testing.assert_allclose(np.asarray(compiled({"x": x})["y"]), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(transmuter.run(model, {"x": x})["y"]), want, rtol=1e-6)
    # The host value that decides a shape stays one: the program has no host constants for the
    # table, and the segment computes no host outputs but the shape arithmetic.
    segment = next(iter(compiled.runner.caches[0].values()))
    assert "table" not in segment.host_outputs and "mask" not in segment.host_outputs


def test_a_scan_body_keeps_on_the_host_only_what_it_needs_there():
    """A Scan body reads two outer values computed from x's shape: a table it adds (data:
    computed in the program, as the layers pass's Scans read position tables) and a Reshape
    target (needed on the host, in the body too)."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "table"], ["added"]),
            helper.make_node("Reshape", ["added", "target"], ["s_out"]),
            helper.make_node("Identity", ["x_t"], ["y_t"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("s_in", F, None),
            helper.make_tensor_value_info("x_t", F, None),
        ],
        [
            helper.make_tensor_value_info("s_out", F, None),
            helper.make_tensor_value_info("y_t", F, None),
        ],
    )
    nodes = [
        *position_table(),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["minus_one", "n1"], ["target"], axis=0),
        helper.make_node("Scan", ["s0", "x"], ["s_final", "ys"], body=body, num_scan_inputs=1),
        helper.make_node("Identity", ["s_final"], ["y"]),
    ]
    proto = make_model(
        nodes,
        [
            helper.make_tensor_value_info("x", F, [4, "n"]),
            helper.make_tensor_value_info("s0", F, [1, "n"]),
        ],
        [helper.make_tensor_value_info("y", F, None)],
        [
            const("one", 1),
            const("zero", 0),
            const("step", 1),
            const("axes", [0]),
            const("minus_one", [-1]),
        ],
    )
    model = transmuter.load(proto, optimize=False)
    assert {"target", "n1", "n"} <= model.plan.host_needed
    assert {"table", "positions_f"} <= model.plan.stageable
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((4, 5)).astype(np.float32),
        "s0": np.zeros((1, 5), np.float32),
    }
    want = 4 * np.sin(np.arange(5, dtype=np.float32))[None]
    np.testing.assert_allclose(np.asarray(transmuter.compile(model, feeds)(feeds)["y"]), want, 1e-6)


def sliced_model(n_slices=3, filler=24):
    """Grounding DINO's mask idiom: NonZero on the ids, then Slices whose bounds are read from
    its result (data-dependent, needed on the host), each between long device chains."""
    nodes, initializers = [], [const("zero", 0), const("one", 1), const("axes", [0])]
    nodes.append(helper.make_node("Equal", ["ids", "special"], ["is_special"]))
    nodes.append(helper.make_node("NonZero", ["is_special"], ["where"], name="nonzero"))
    current = "h"
    nodes.append(helper.make_node("Cos", ["x"], ["h"]))
    for i in range(n_slices):
        nodes += [
            helper.make_node("Gather", ["where", "one"], [f"cols{i}"], axis=0),
            helper.make_node("Gather", [f"cols{i}", f"i{i}"], [f"end{i}"], axis=0),
            helper.make_node("Unsqueeze", [f"end{i}", "axes"], [f"end{i}_1"]),
            helper.make_node("Slice", [current, "zero1", f"end{i}_1", "axes"], [f"s{i}"]),
            helper.make_node("Pad", [f"s{i}", f"pads{i}"], [f"p{i}"]),
        ]
        initializers.append(const(f"i{i}", i))
        previous = f"p{i}"
        for j in range(filler):
            out = f"f{i}_{j}"
            nodes.append(helper.make_node("Sin" if j % 2 else "Cos", [previous], [out]))
            previous = out
        current = previous
        nodes.append(helper.make_node("Shape", [f"s{i}"], [f"sh{i}"]))
        nodes.append(helper.make_node("Sub", ["len", f"sh{i}"], [f"pads{i}_end"]))
        nodes.append(helper.make_node("Concat", ["zero1", f"pads{i}_end"], [f"pads{i}"], axis=0))
    nodes.append(helper.make_node("Identity", [current], ["y"]))
    initializers += [const("zero1", [0]), const("special", 7), const("len", [8])]
    # Pads are computed from Shape(s_i), which is known: reorder so producers come first.
    order = _sorted(nodes, initializers, ["ids", "x"])
    return make_model(
        order,
        [
            helper.make_tensor_value_info("ids", I64, [1, 8]),
            helper.make_tensor_value_info("x", F, [8]),
        ],
        [helper.make_tensor_value_info("y", F, [8])],
        initializers,
    )


def _sorted(nodes, initializers, inputs):
    known = set(inputs) | {t.name for t in initializers}
    done, pending = [], list(nodes)
    while pending:
        for node in pending:
            if all(n in known for n in node.input if n):
                done.append(node)
                known.update(node.output)
                pending.remove(node)
                break
    return done


def reference(ids, x, n_slices=3):
    cols = np.nonzero(ids == 7)[1]
    h = np.cos(x)
    for i in range(n_slices):
        s = h[: cols[i]]
        h = np.pad(s, (0, 8 - len(s)))
        for j in range(24):
            h = np.sin(h) if j % 2 else np.cos(h)
    return h


def test_small_break_results_later_nodes_need_on_the_host_stay_there():
    model = transmuter.load(sliced_model(), optimize=False)
    ids = np.array([[1, 7, 2, 3, 7, 5, 7, 0]], np.int64)
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    compiled = transmuter.compile(model, {"ids": ids, "x": x})
    # One break (the NonZero); its indices decide the Slices on the host: no break per Slice.
    assert len(compiled.segments) == 2, compiled.segments
    np.testing.assert_allclose(
        np.asarray(compiled({"ids": ids, "x": x})["y"]), reference(ids, x), rtol=1e-5
    )
    other = np.array([[7, 0, 7, 1, 1, 1, 7, 7]], np.int64)
    np.testing.assert_allclose(
        np.asarray(compiled({"ids": other, "x": x})["y"]), reference(other, x), rtol=1e-5
    )
    want = reference(ids, x)
    np.testing.assert_allclose(np.asarray(compiled({"ids": ids, "x": x})["y"]), want, rtol=1e-5)


def test_a_break_names_the_input_to_make_static(caplog):
    model = transmuter.load(sliced_model(), optimize=False)
    (found,) = model.graph_breaks()
    assert found.node == "nonzero" and found.static == ("ids",)
    assert "static_inputs=['ids'] removes this break" in str(found)
    assert model.graph_breaks(["ids"]) == []
    ids = np.array([[1, 7, 2, 3, 7, 5, 7, 0]], np.int64)
    x = np.zeros(8, np.float32)
    handler = telemetry.log_compile_work(logging.INFO)
    try:
        with caplog.at_level(logging.INFO, logger="transmuter"):
            transmuter.compile(model, {"ids": ids, "x": x})
    finally:
        telemetry.detach(handler)
    assert any("static_inputs={'ids': ...}" in r.getMessage() for r in caplog.records)
    static = transmuter.compile(model, {"ids": ids, "x": x}, static_inputs={"ids": ids})
    assert static.segments == [(0, "end", True)]
    np.testing.assert_allclose(np.asarray(static({"x": x})["y"]), reference(ids, x), rtol=1e-5)


def test_no_static_hint_for_a_break_on_values_computed_from_weights():
    weight = numpy_helper.from_array(np.arange(100, dtype=np.float32) - 50, "w")
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["xw"]),
        helper.make_node("Greater", ["xw", "zero"], ["positive"]),
        helper.make_node("NonZero", ["positive"], ["where"], name="nonzero"),
    ]
    model = transmuter.load(
        make_model(
            nodes,
            [helper.make_tensor_value_info("x", F, [100])],
            [helper.make_tensor_value_info("where", I64, [1, "k"])],
            [weight, numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
        ),
        optimize=False,
    )
    (found,) = model.graph_breaks()
    assert found.static == () and "removes this break" not in str(found)
