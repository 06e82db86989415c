"""Tree ensembles of the ai.onnx.ml domain: TreeEnsemble-5 and the legacy TreeEnsembleClassifier /
TreeEnsembleRegressor (opsets 1 and 3) that skl2onnx, onnxmltools (LightGBM, XGBoost) and most
exports in the wild still emit.

All three ops lower to one traversal. The nodes and leaves of every tree share one index space
(interior nodes first, then leaves, which point to themselves), and every (row, tree) pair moves
one level per step, by gathers over the node tables, for as many steps as the deepest tree has
interior nodes: an [N, T] array of positions, no loop over trees or rows. Leaves then index a
dense [leaves, targets] weight table, so the per-target aggregate is a gather and a reduction
over the tree axis, which XLA fuses.

Where the spec is silent the legacy ops follow ONNX Runtime's CPU kernels
(tree_ensemble_aggregator.h): the binary classifier's complementary score, base_values, and which
classes "have a score" (a class no reached leaf names is skipped by the label's argmax).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from transmuter.errors import ShapeError
from transmuter.lowering import op, variant
from transmuter.lowering.ops.ml import (
    ML,
    TRANSFORM_CODES,
    apply_post_transform,
    as_rows,
    class_labels,
)
from transmuter.lowering.shared import arg_extreme

# Modes 0..5 (BRANCH_LEQ, LT, GTE, GT, EQ, NEQ) as TreeEnsemble-5 numbers them; 6 is BRANCH_MEMBER.
_COMPARE = (jnp.less_equal, jnp.less, jnp.greater_equal, jnp.greater, jnp.equal, jnp.not_equal)
_MEMBER = 6
_LEGACY_MODES = {
    "BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4,
    "BRANCH_NEQ": 5,
}  # fmt: skip
_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")
# Up to this many levels the traversal is unrolled (one fused gather step per level); deeper
# ensembles loop on the device.
_UNROLL_STEPS = 32


@dataclass(frozen=True)
class _Forest:
    """Trees as arrays over one index space: interior nodes first, then leaves (which point to
    themselves). `steps` is the most interior nodes on any root-to-leaf path."""

    roots: np.ndarray  # [T] interior nodes or leaves
    feature: np.ndarray  # [K]
    split: np.ndarray  # [K]
    mode: np.ndarray  # [K] 0..6 as in TreeEnsemble-5; leaves 0
    true_next: np.ndarray  # [K]
    false_next: np.ndarray  # [K]
    nan_true: np.ndarray  # [K] bool
    members: np.ndarray  # [K, M] the set of a BRANCH_MEMBER node, NaN-padded
    n_nodes: int
    steps: int


def _forest(
    op_type, roots, feature, split, mode, true_next, false_next, nan_true, members, n_leaves
):
    """Check the structure and measure its depth on the host."""
    n_nodes = len(feature)
    size = n_nodes + n_leaves
    for name, ids in (("true", true_next), ("false", false_next)):
        if ids.size and (ids.min() < 0 or ids.max() >= size):
            raise ShapeError(f"{op_type}: a {name} branch points outside the {size} nodes/leaves")
    if roots.size and (roots.min() < 0 or roots.max() >= size):
        raise ShapeError(f"{op_type}: a tree root is not one of the {size} nodes and leaves")
    steps, level = 0, np.unique(roots[roots < n_nodes])
    while level.size:
        steps += 1
        if steps > n_nodes:
            raise ValueError(f"{op_type}: the trees contain a cycle")
        children = np.concatenate([true_next[level], false_next[level]])
        level = np.unique(children[children < n_nodes])
    leaves = np.arange(n_nodes, size)

    def extend(values, leaf_value):
        return np.concatenate([values, np.full(n_leaves, leaf_value, values.dtype)])

    return _Forest(
        roots.astype(np.int64),
        extend(feature.astype(np.int64), 0),
        extend(split, 0),
        extend(mode.astype(np.int64), 0),
        np.concatenate([true_next, leaves]).astype(np.int64),
        np.concatenate([false_next, leaves]).astype(np.int64),
        extend(nan_true.astype(bool), False),
        np.concatenate([members, np.full((n_leaves, members.shape[1]), np.nan, members.dtype)]),
        n_nodes,
        steps,
    )


def _walk(op_type: str, x, forest: _Forest):
    """The leaf (position among the leaves) each row reaches in each tree: [N, T]."""
    if x.ndim != 2:
        raise ShapeError(f"{op_type}: X must be [N, F], got shape {list(x.shape)}")
    interior = forest.feature[: forest.n_nodes]
    split_only = forest.true_next[: forest.n_nodes] != forest.false_next[: forest.n_nodes]
    used_features = interior[split_only]
    if used_features.size and (used_features.min() < 0 or used_features.max() >= x.shape[1]):
        raise ShapeError(
            f"{op_type}: nodes split on features {used_features.min()}..{used_features.max()} "
            f"but X has {x.shape[1]}"
        )
    feature = jnp.asarray(np.where(forest.feature < x.shape[1], forest.feature, 0))
    with jax.numpy_dtype_promotion("standard"):  # thresholds may be wider than X (as_tensor)
        dtype = jnp.promote_types(x.dtype, forest.split.dtype)
    x = x.astype(dtype)
    split, members = jnp.asarray(forest.split, dtype), jnp.asarray(forest.members, dtype)
    mode, nan_true = jnp.asarray(forest.mode), jnp.asarray(forest.nan_true)
    true_next, false_next = jnp.asarray(forest.true_next), jnp.asarray(forest.false_next)
    used = sorted(set(forest.mode[: forest.n_nodes].tolist()))
    tracks_nan = bool(forest.nan_true.any())

    def hit(m, value, at):
        if m == _MEMBER:
            return jnp.any(value[..., None] == members[at], axis=-1)
        return _COMPARE[m](value, split[at])

    def step(_, at):
        value = jnp.take_along_axis(x, feature[at], axis=1)
        if len(used) == 1:  # the common case (every node BRANCH_LEQ): no mode lookup
            go_true = hit(used[0], value, at)
        else:
            node_mode = mode[at]
            go_true = jnp.zeros(at.shape, bool)
            for m in used:
                go_true = go_true | ((node_mode == m) & hit(m, value, at))
        if tracks_nan:
            go_true = go_true | (nan_true[at] & jnp.isnan(value))
        return jnp.where(go_true, true_next[at], false_next[at])

    at = jnp.broadcast_to(jnp.asarray(forest.roots), (x.shape[0], forest.roots.size))
    if forest.steps <= _UNROLL_STEPS:
        for level in range(forest.steps):
            at = step(level, at)
    else:
        at = lax.fori_loop(0, forest.steps, step, at)
    return at - forest.n_nodes


@dataclass(frozen=True)
class _Leaves:
    """What each leaf contributes, as dense [leaves, targets] tables: the summed weights, the
    smallest and largest weight (for MIN / MAX), and whether the leaf names the target at all."""

    total: np.ndarray
    low: np.ndarray
    high: np.ndarray
    named: np.ndarray  # bool


def _leaves(n_leaves: int, n_targets: int, leaf, target, weight, dtype) -> _Leaves:
    """Tables from parallel (leaf position, target, weight) lists; a leaf may name several
    targets, and a target twice (the weights add, as in ONNX Runtime)."""
    total = np.zeros((n_leaves, n_targets), dtype)
    low = np.full((n_leaves, n_targets), np.inf, dtype)
    high = np.full((n_leaves, n_targets), -np.inf, dtype)
    named = np.zeros((n_leaves, n_targets), bool)
    np.add.at(total, (leaf, target), weight)
    np.minimum.at(low, (leaf, target), weight)
    np.maximum.at(high, (leaf, target), weight)
    named[leaf, target] = True
    return _Leaves(total, low, high, named)


def _aggregate(leaf, leaves: _Leaves, aggregate: str, dtype):
    """Scores [N, targets] over the trees (a target no reached leaf names scores 0, as in ONNX
    Runtime; onnx.reference leaves the float type's extreme there) and whether any reached leaf
    names each target ([N, targets] bool)."""
    # float16 scores accumulate in float32 and round once.
    acc = jnp.float64 if dtype == jnp.float64 else jnp.float32
    named = jnp.asarray(leaves.named)[leaf].any(axis=1)
    if aggregate in ("SUM", "AVERAGE"):
        scores = jnp.sum(jnp.asarray(leaves.total, acc)[leaf], axis=1)
        trees = leaf.shape[1]
        return (scores / trees if aggregate == "AVERAGE" and trees else scores), named
    if aggregate == "MIN":
        scores = jnp.min(jnp.asarray(leaves.low, acc)[leaf], axis=1, initial=jnp.inf)
    else:
        scores = jnp.max(jnp.asarray(leaves.high, acc)[leaf], axis=1, initial=-jnp.inf)
    return jnp.where(named, scores, 0).astype(acc), named


# ---------------------------------------------------------------------------- TreeEnsemble-5


@op("TreeEnsemble", since=5, domain=ML)
def tree_ensemble(
    X,
    *,
    aggregate_function=1,
    leaf_targetids,
    leaf_weights,
    membership_values=None,
    n_targets=None,
    nodes_falseleafs,
    nodes_falsenodeids,
    nodes_featureids,
    nodes_hitrates=None,
    nodes_missing_value_tracks_true=None,
    nodes_modes,
    nodes_splits,
    nodes_trueleafs,
    nodes_truenodeids,
    post_transform=0,
    tree_roots,
):
    """ONNX-ML TreeEnsemble-5: per-target aggregate of the leaf weights each sample reaches."""
    op_type = "TreeEnsemble"
    x = jnp.asarray(X)
    modes = np.asarray(nodes_modes).reshape(-1).astype(np.int64)
    n_nodes, n_leaves = len(nodes_featureids), len(leaf_targetids)
    lengths = {
        "nodes_modes": modes.size, "nodes_splits": np.asarray(nodes_splits).size,
        "nodes_truenodeids": len(nodes_truenodeids), "nodes_falsenodeids": len(nodes_falsenodeids),
        "nodes_trueleafs": len(nodes_trueleafs), "nodes_falseleafs": len(nodes_falseleafs),
    }  # fmt: skip
    if nodes_missing_value_tracks_true is not None:
        lengths["nodes_missing_value_tracks_true"] = len(nodes_missing_value_tracks_true)
    wrong = {k: v for k, v in lengths.items() if v != n_nodes}
    if wrong or np.asarray(leaf_weights).size != n_leaves:
        raise ShapeError(
            f"{op_type}: every nodes_* attribute must have nodes_featureids' length {n_nodes} "
            f"(got {wrong}) and leaf_weights leaf_targetids' length {n_leaves}"
        )
    if modes.size and (modes.min() < 0 or modes.max() > _MEMBER):
        raise ValueError(f"{op_type}: nodes_modes must be in [0, 6], got {sorted(set(modes))}")
    split = np.asarray(nodes_splits).reshape(-1)
    members = _member_sets(op_type, modes, membership_values, split.dtype)

    def next_ids(ids, leafs):
        ids, leafs = np.asarray(ids, np.int64), np.asarray(leafs, bool)
        if ids.size and ids.min() < 0:
            raise ShapeError(f"{op_type}: a branch points to a negative node or leaf id")
        return np.where(leafs, ids + n_nodes, ids)

    roots = np.asarray(tree_roots, np.int64)
    if roots.size and (roots.min() < 0 or roots.max() >= n_nodes):
        raise ShapeError(f"{op_type}: a tree root is not one of the {n_nodes} nodes")
    forest = _forest(
        op_type,
        roots,
        np.asarray(nodes_featureids, np.int64),
        split,
        modes,
        next_ids(nodes_truenodeids, nodes_trueleafs),
        next_ids(nodes_falsenodeids, nodes_falseleafs),
        np.asarray(nodes_missing_value_tracks_true or np.zeros(n_nodes), bool),
        members,
        n_leaves,
    )
    targets = np.asarray(leaf_targetids, np.int64)
    if n_targets is None:
        n_targets = int(targets.max()) + 1 if targets.size else 0
    if not 0 <= aggregate_function < len(_AGGREGATES):
        raise ValueError(f"{op_type}: aggregate_function must be in [0, 3]")
    if not 0 <= post_transform < len(TRANSFORM_CODES):
        raise ValueError(f"{op_type}: post_transform must be in [0, 4]")
    if targets.size and (targets.min() < 0 or targets.max() >= n_targets):
        raise ShapeError(f"{op_type}: leaf_targetids must be in [0, {n_targets})")
    weights = np.asarray(leaf_weights).reshape(-1)
    leaves = _leaves(n_leaves, n_targets, np.arange(n_leaves), targets, weights, weights.dtype)
    leaf = _walk(op_type, x, forest)
    scores, _ = _aggregate(leaf, leaves, _AGGREGATES[aggregate_function], x.dtype)
    return apply_post_transform(op_type, scores, TRANSFORM_CODES[post_transform]).astype(x.dtype)


def _member_sets(op_type: str, modes: np.ndarray, membership_values, dtype) -> np.ndarray:
    """[nodes, M] with the NaN-delimited sets of membership_values on the BRANCH_MEMBER nodes,
    in order, NaN-padded."""
    member_nodes = np.flatnonzero(modes == _MEMBER)
    values = np.asarray([] if membership_values is None else membership_values, dtype).reshape(-1)
    breaks = np.flatnonzero(np.isnan(values))
    if values.size and not np.isnan(values[-1]):
        breaks = np.append(breaks, values.size)  # the last set needs no closing NaN
    if len(breaks) < len(member_nodes):
        raise ValueError(
            f"{op_type}: {len(member_nodes)} nodes are BRANCH_MEMBER but membership_values "
            f"holds {len(breaks)} NaN-delimited sets"
        )
    sets = np.split(values, breaks[:-1] + 1) if len(breaks) else []
    sets = [s[~np.isnan(s)] for s in sets][: len(member_nodes)]
    out = np.full((len(modes), max((len(s) for s in sets), default=0)), np.nan, dtype)
    for node, members in zip(member_nodes, sets):
        out[node, : len(members)] = members
    return out


# ------------------------------------------------------------- legacy TreeEnsemble* (1, 3)


def _floats(op_type: str, name: str, values, tensor, *, required: bool = False):
    """A float attribute given as a list (float32) or, from opset 3, as `name`_as_tensor (its
    own type, float64 in practice); None when neither is set and it is optional."""
    if values is not None and tensor is not None:
        raise ValueError(f"{op_type}: set {name} or {name}_as_tensor, not both")
    if tensor is not None:
        return np.asarray(tensor).reshape(-1)
    if values is not None:
        return np.asarray(values, np.float32).reshape(-1)
    if required:
        raise ValueError(f"{op_type}: {name} (or {name}_as_tensor) is required")
    return None


def _legacy_forest(op_type, nodes: dict, weights: dict, n_targets: int | None):
    """The shared forest and leaf tables from the legacy attributes: nodes named by (tree id,
    node id), branches by node id within the tree, weights attached to leaves by (tree, node)."""
    tree_ids = np.asarray(nodes["treeids"] or (), np.int64)
    node_ids = np.asarray(nodes["nodeids"] or (), np.int64)
    count = tree_ids.size
    modes = list(nodes["modes"] or ())
    values = nodes["values"]
    columns = {
        "nodes_nodeids": node_ids.size, "nodes_featureids": len(nodes["featureids"] or ()),
        "nodes_modes": len(modes), "nodes_values": 0 if values is None else values.size,
        "nodes_truenodeids": len(nodes["truenodeids"] or ()),
        "nodes_falsenodeids": len(nodes["falsenodeids"] or ()),
    }  # fmt: skip
    tracks = nodes["missing_value_tracks_true"]
    if tracks:
        columns["nodes_missing_value_tracks_true"] = len(tracks)
    wrong = {k: v for k, v in columns.items() if v != count}
    if wrong or count == 0:
        raise ShapeError(
            f"{op_type}: every nodes_* attribute must have nodes_treeids' length {count} (> 0); "
            f"got {wrong}"
        )
    unknown = sorted({m for m in modes if m != "LEAF" and m not in _LEGACY_MODES})
    if unknown:
        raise ValueError(
            f"{op_type}: nodes_modes {unknown} are not LEAF or one of {', '.join(_LEGACY_MODES)}"
        )
    position = {}
    for i, key in enumerate(zip(tree_ids.tolist(), node_ids.tolist())):
        if key in position:
            raise ValueError(f"{op_type}: node {key[1]} of tree {key[0]} is listed twice")
        position[key] = i
    is_leaf = np.array([m == "LEAF" for m in modes])
    # Interior nodes first, then leaves: the index space of _Forest.
    order = np.concatenate([np.flatnonzero(~is_leaf), np.flatnonzero(is_leaf)])
    index = np.empty(count, np.int64)
    index[order] = np.arange(count)
    interior = np.flatnonzero(~is_leaf)
    n_interior = interior.size

    def branch(name):
        ids = np.asarray(nodes[name], np.int64)
        out = np.empty(n_interior, np.int64)
        for k, i in enumerate(interior):
            key = (int(tree_ids[i]), int(ids[i]))
            if key not in position:
                raise ShapeError(
                    f"{op_type}: node {node_ids[i]} of tree {tree_ids[i]} branches to node "
                    f"{ids[i]} ({name}), which the tree does not have"
                )
            out[k] = index[position[key]]
        return out

    # Each tree's root is its first listed node (ONNX Runtime, onnx.reference).
    _, first = np.unique(tree_ids, return_index=True)
    roots = index[np.sort(first)]
    tracks = np.asarray(tracks, bool) if tracks else np.zeros(count, bool)
    split = values[interior]
    forest = _forest(
        op_type,
        roots,
        np.asarray(nodes["featureids"], np.int64)[interior],
        split,
        np.array([_LEGACY_MODES[modes[i]] for i in interior], np.int64),
        branch("truenodeids"),
        branch("falsenodeids"),
        tracks[interior],
        np.zeros((n_interior, 0), split.dtype),
        count - n_interior,
    )

    w_trees = np.asarray(weights["treeids"] or (), np.int64)
    w_nodes = np.asarray(weights["nodeids"] or (), np.int64)
    w_ids = np.asarray(weights["ids"] or (), np.int64)
    w_values = weights["values"] if weights["values"] is not None else np.zeros(0, np.float32)
    prefix = weights["prefix"]
    sizes = {len(w_trees), len(w_nodes), len(w_ids), w_values.size}
    if len(sizes) != 1:
        raise ShapeError(
            f"{op_type}: {prefix}_treeids, {prefix}_nodeids, {prefix}_ids and {prefix}_weights "
            f"must have one length, got {len(w_trees)}, {len(w_nodes)}, {len(w_ids)}, "
            f"{w_values.size}"
        )
    if n_targets is None:
        n_targets = int(w_ids.max()) + 1 if w_ids.size else 1
    if w_ids.size and (w_ids.min() < 0 or w_ids.max() >= n_targets):
        raise ShapeError(f"{op_type}: {prefix}_ids must be in [0, {n_targets})")
    leaf, keep = [], []
    for k, key in enumerate(zip(w_trees.tolist(), w_nodes.tolist())):
        if key not in position:
            raise ShapeError(f"{op_type}: a weight names node {key[1]} of tree {key[0]}, unknown")
        if is_leaf[position[key]]:  # weights on interior nodes are never reached
            leaf.append(index[position[key]] - n_interior)
            keep.append(k)
    keep = np.asarray(keep, np.int64)
    leaves = _leaves(
        count - n_interior,
        n_targets,
        np.asarray(leaf, np.int64),
        w_ids[keep],
        w_values[keep],
        np.promote_types(w_values.dtype, np.float32),
    )
    return forest, leaves, n_targets


def _nodes(treeids, nodeids, featureids, modes, values, truenodeids, falsenodeids, tracks):
    return {
        "treeids": treeids, "nodeids": nodeids, "featureids": featureids, "modes": modes,
        "values": values, "truenodeids": truenodeids, "falsenodeids": falsenodeids,
        "missing_value_tracks_true": tracks,
    }  # fmt: skip


def _tree_regressor(op_type, X, forest, leaves, n_targets, base, aggregate, post_transform):
    if aggregate not in _AGGREGATES:
        raise ValueError(f"{op_type}: aggregate_function {aggregate!r} is not one of {_AGGREGATES}")
    x = as_rows(op_type, X)
    scores, named = _aggregate(_walk(op_type, x, forest), leaves, aggregate, leaves.total.dtype)
    if base is not None and base.size:
        if base.size != n_targets:
            raise ShapeError(
                f"{op_type}: base_values holds {base.size} values for {n_targets} targets"
            )
        scores = scores + jnp.asarray(base, scores.dtype)  # after averaging (ONNX Runtime)
    if n_targets > 1:
        # ONNX Runtime writes 0 for a target no reached leaf names, base value or not.
        scores = jnp.where(named, scores, 0)
    # ONNX Runtime applies only PROBIT to a single target; the spec applies every post_transform,
    # as Transmuter does (tests/ops/test_ml.py pins it).
    return apply_post_transform(op_type, scores, post_transform).astype(jnp.float32)


@op("TreeEnsembleRegressor", since=3, domain=ML)
def tree_ensemble_regressor(
    X,
    *,
    aggregate_function="SUM",
    base_values=None,
    base_values_as_tensor=None,
    n_targets=None,
    nodes_falsenodeids=None,
    nodes_featureids=None,
    nodes_hitrates=None,
    nodes_hitrates_as_tensor=None,
    nodes_missing_value_tracks_true=None,
    nodes_modes=None,
    nodes_nodeids=None,
    nodes_treeids=None,
    nodes_truenodeids=None,
    nodes_values=None,
    nodes_values_as_tensor=None,
    post_transform="NONE",
    target_ids=None,
    target_nodeids=None,
    target_treeids=None,
    target_weights=None,
    target_weights_as_tensor=None,
):
    """ONNX-ML TreeEnsembleRegressor-3: per-target aggregate of the reached leaves' weights,
    plus base_values, then post_transform, as float32."""
    op_type = "TreeEnsembleRegressor"
    values = _floats(op_type, "nodes_values", nodes_values, nodes_values_as_tensor, required=True)
    nodes = _nodes(nodes_treeids, nodes_nodeids, nodes_featureids, nodes_modes, values,
                   nodes_truenodeids, nodes_falsenodeids, nodes_missing_value_tracks_true)  # fmt: skip
    weights = {
        "prefix": "target", "treeids": target_treeids, "nodeids": target_nodeids,
        "ids": target_ids,
        "values": _floats(op_type, "target_weights", target_weights, target_weights_as_tensor),
    }  # fmt: skip
    forest, leaves, n_targets = _legacy_forest(op_type, nodes, weights, n_targets)
    base = _floats(op_type, "base_values", base_values, base_values_as_tensor)
    return _tree_regressor(
        op_type, X, forest, leaves, n_targets, base, aggregate_function, post_transform
    )


tree_ensemble_regressor_v1 = op("TreeEnsembleRegressor", since=1, domain=ML)(variant(
    tree_ensemble_regressor, "tree_ensemble_regressor_v1",
    "ONNX-ML TreeEnsembleRegressor-1: TreeEnsembleRegressor-3 without the *_as_tensor forms.",
    fixed={"base_values_as_tensor": None, "nodes_hitrates_as_tensor": None,
           "nodes_values_as_tensor": None, "target_weights_as_tensor": None},
))  # fmt: skip


@op("TreeEnsembleClassifier", since=3, domain=ML, context=True, strings_on_host=True)
def tree_ensemble_classifier(
    ctx,
    X,
    *,
    base_values=None,
    base_values_as_tensor=None,
    class_ids=None,
    class_nodeids=None,
    class_treeids=None,
    class_weights=None,
    class_weights_as_tensor=None,
    classlabels_int64s=None,
    classlabels_strings=None,
    nodes_falsenodeids=None,
    nodes_featureids=None,
    nodes_hitrates=None,
    nodes_hitrates_as_tensor=None,
    nodes_missing_value_tracks_true=None,
    nodes_modes=None,
    nodes_nodeids=None,
    nodes_treeids=None,
    nodes_truenodeids=None,
    nodes_values=None,
    nodes_values_as_tensor=None,
    post_transform="NONE",
):
    """ONNX-ML TreeEnsembleClassifier-3: per-class sums of the reached leaves' weights, plus
    base_values, post_transform, and the label of the best class."""
    op_type = "TreeEnsembleClassifier"
    labels, X = class_labels(
        ctx, op_type, X,
        classlabels_int64s=classlabels_int64s, classlabels_strings=classlabels_strings,
    )  # fmt: skip
    if len(labels) < 2:
        raise ValueError(
            f"{op_type}: the class labels must name at least 2 classes, got {len(labels)}"
        )
    values = _floats(op_type, "nodes_values", nodes_values, nodes_values_as_tensor, required=True)
    nodes = _nodes(nodes_treeids, nodes_nodeids, nodes_featureids, nodes_modes, values,
                   nodes_truenodeids, nodes_falsenodeids, nodes_missing_value_tracks_true)  # fmt: skip
    class_values = _floats(op_type, "class_weights", class_weights, class_weights_as_tensor)
    weights = {
        "prefix": "class", "treeids": class_treeids, "nodeids": class_nodeids, "ids": class_ids,
        "values": class_values,
    }  # fmt: skip
    forest, leaves, _ = _legacy_forest(op_type, nodes, weights, len(labels))
    base = _floats(op_type, "base_values", base_values, base_values_as_tensor)
    base = np.zeros(0, np.float32) if base is None else base
    if base.size > len(labels):
        raise ShapeError(f"{op_type}: {base.size} base_values for {len(labels)} classes")
    x = as_rows(op_type, X)
    dtype = leaves.total.dtype
    sums, named = _aggregate(_walk(op_type, x, forest), leaves, "SUM", dtype)
    ids = np.asarray(class_ids or (), np.int64)
    weight_values = np.zeros(0) if class_values is None else class_values
    if len(labels) > 2:
        best, scores = _multiclass(sums, named, base, post_transform, op_type)
    else:
        best, scores = _binary(
            sums, named, base, post_transform, op_type,
            binary=len(set(ids.tolist())) == 1, positive=bool((weight_values >= 0).all()),
        )  # fmt: skip
    if labels.dtype == object:
        return labels[np.asarray(best)], scores.astype(jnp.float32)
    return jnp.asarray(labels)[best], scores.astype(jnp.float32)


tree_ensemble_classifier_v1 = op(
    "TreeEnsembleClassifier", since=1, domain=ML, context=True, strings_on_host=True
)(variant(
    tree_ensemble_classifier, "tree_ensemble_classifier_v1",
    "ONNX-ML TreeEnsembleClassifier-1: TreeEnsembleClassifier-3 without the *_as_tensor forms.",
    fixed={"base_values_as_tensor": None, "class_weights_as_tensor": None,
           "nodes_hitrates_as_tensor": None, "nodes_values_as_tensor": None},
))  # fmt: skip


def _multiclass(sums, named, base, post_transform, op_type):
    """Three or more classes: base_values added (a class with a base value has a score), the
    label is the best class among those with a score, the scores are post-transformed."""
    n = sums.shape[1]
    padded = np.zeros(n, base.dtype)
    padded[: base.size] = base
    scores = sums + jnp.asarray(padded, sums.dtype)
    scored = named | jnp.asarray(np.arange(n) < base.size)
    best = arg_extreme(jnp.where(scored, scores, -jnp.inf), 1)  # not jnp.argmax (see arg_extreme)
    return best, apply_post_transform(op_type, scores, post_transform)


def _binary(sums, named, base, post_transform, op_type, *, binary: bool, positive: bool):
    """Two classes, as ONNX Runtime's TreeAggregatorClassifier computes them (the spec says
    nothing of it). `binary`: every weight is on one class id; `positive`: no weight is negative.

    Per row, s0 / s1 are the class sums and h0 / h1 whether a reached leaf names the class. With
    one score (no weight reached class 1 and no second base value), the other column is made
    from it: logistic(-s) / logistic(s) with LOGISTIC, else 1 - s / s for all-positive weights
    and -s / s for mixed ones (SOFTMAX and SOFTMAX_ZERO are not applied to a single score)."""
    s0, s1 = sums[:, 0], sums[:, 1]
    h0, h1 = named[:, 0], named[:, 1]
    dtype = sums.dtype
    if base.size == 2:
        b0, b1 = (jnp.asarray(b, dtype) for b in base)
        # ONNX Runtime's "base_value_[0] is not used" branch: with a class-1 score, class 1
        # becomes b1 + s0 and class 0 its negation.
        p1 = jnp.where(h1, b1 + s0, s1 + b1)
        p0 = jnp.where(h1, -(b1 + s0), s0 + b0)
        two, complement = jnp.ones_like(h1), "first"
    else:
        p0 = s0 + jnp.asarray(base[0], dtype) if base.size == 1 else s0
        p1, two = s1, h1
        complement = "negate" if base.size == 0 else "first"
    r0, r1 = jnp.where(h0, p0, 0), jnp.where(h1, p1, 0)
    pos = jnp.where(two & h1, r1, r0)
    if binary:
        best = (pos > 0.5) if positive else (pos > 0)
        complement = "one_minus" if positive else "negate"
    else:
        # ONNX Runtime returns the raw numbers 1 / 0 here, not the class labels; the label
        # output holds class labels (the spec), so Transmuter indexes them.
        best = pos > 0
    both = apply_post_transform(op_type, jnp.stack([r0, r1], axis=1), post_transform)
    if post_transform == "PROBIT":
        single = jnp.stack(
            [apply_post_transform(op_type, r0, "PROBIT"), jnp.zeros_like(r0)], axis=1
        )
    elif complement != "first" and post_transform == "LOGISTIC":
        single = jnp.stack([jax.nn.sigmoid(-r0), jax.nn.sigmoid(r0)], axis=1)
    elif complement == "one_minus":
        single = jnp.stack([1 - r0, r0], axis=1)
    elif complement == "negate":
        single = jnp.stack([-r0, r0], axis=1)
    else:
        # ONNX Runtime writes the first column only (the second is left unset); Transmuter
        # writes 0 there.
        single = jnp.stack([r0, jnp.zeros_like(r0)], axis=1)
    return best.astype(jnp.int64), jnp.where(two[:, None], both, single)
