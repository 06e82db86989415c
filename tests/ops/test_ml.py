"""ai.onnx.ml operators against ONNX Runtime, or onnx.reference / written-out values where ORT
lacks a case or departs from the spec (each such place says why)."""

import functools

import numpy as np
import pytest
from onnx import numpy_helper
from opcheck import assert_close, check_node, feeds, make_node_model, ort_run, transmuter_runs

import transmuter
from transmuter.errors import TransmuterError

ML = "ai.onnx.ml"
check = functools.partial(check_node, domain=ML, opset=1)

# String graph inputs run eagerly only (see tests/ops/test_shape.py).
STRINGS = {"compiled": False}

rng = np.random.default_rng(0)
X = rng.standard_normal((4, 5)).astype(np.float32)


def strings(*values):
    return np.array(values, dtype=object)


def tensor(array, name="t"):
    return numpy_helper.from_array(np.asarray(array), name)


def expect(op_type, inputs, attrs, expected, *, opset=1, outputs=1, compiled=True):
    """Transmuter's outputs (eager and compiled) against values written out in the test."""
    model = make_node_model(op_type, inputs, attrs, opset=opset, domain=ML, outputs=outputs)
    for mode, got in transmuter_runs(model, inputs, compiled=compiled).items():
        for i, (g, want) in enumerate(zip(got, expected, strict=True)):
            assert_close(g, want, rtol=1e-6, atol=1e-6, what=f"{op_type} output {i} ({mode})")


def raises(op_type, inputs, attrs, match, *, opset=1, outputs=1, constants=()):
    model = make_node_model(
        op_type, inputs, attrs, opset=opset, domain=ML, outputs=outputs, constants=constants
    )
    with pytest.raises(TransmuterError, match=match):
        transmuter.run(transmuter.load(model), feeds(model, inputs))


# ------------------------------------------------------------------------------- Binarizer


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
@pytest.mark.parametrize("threshold", [0.0, 0.5, -1.0])
def test_binarizer(dtype, threshold):
    # ONNX Runtime has a float32 kernel only.
    reference = "ort" if dtype == np.float32 else "onnx"
    x = (X * 3).astype(dtype)
    check("Binarizer", {"X": x}, {"threshold": threshold}, symbolic={"X": [0]}, reference=reference)


def test_binarizer_nan_and_empty():
    # ONNX Runtime refuses NaN inputs; NaN > threshold is false, as onnx.reference has it.
    check("Binarizer", {"X": np.array([np.nan, 1.0, -1.0], np.float32)}, reference="onnx")
    check("Binarizer", {"X": np.zeros((0, 3), np.float32)}, {"threshold": 1.0})


# -------------------------------------------------------------------- ArrayFeatureExtractor


@pytest.mark.parametrize("shape", [(5,), (4, 5), (2, 3, 5)])
@pytest.mark.parametrize(
    "indices", [np.array([4, 0, 0]), np.array(2), np.array([[1, 3]]), np.array([[1], [4]])]
)
def test_array_feature_extractor(shape, indices):
    x = rng.standard_normal(shape).astype(np.float32)
    check("ArrayFeatureExtractor", {"X": x, "Y": indices})
    check("ArrayFeatureExtractor", {"X": x, "Y": indices}, constants=["Y"])


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int32])
def test_array_feature_extractor_dtypes(dtype):
    x = (X * 3).astype(dtype)
    check("ArrayFeatureExtractor", {"X": x, "Y": np.array([3, 1])}, symbolic={"X": [0]})


def test_array_feature_extractor_strings_and_empty():
    data = strings("a", "b", "c", "d", "e", "f").reshape(2, 3)
    check("ArrayFeatureExtractor", {"X": data, "Y": np.array([2, 0])}, **STRINGS)
    check("ArrayFeatureExtractor", {"X": X[:0], "Y": np.array([1])})


def test_array_feature_extractor_strings_with_traced_indices():
    # Indices into host strings that come from the device: the compiled model breaks there.
    data = strings("a", "b", "c", "d", "e", "f").reshape(2, 3)
    check("ArrayFeatureExtractor", {"X": data, "Y": np.array([2, 0])}, constants=["X"])


def test_array_feature_extractor_out_of_range():
    for index in (5, -1):
        raises("ArrayFeatureExtractor", {"X": X, "Y": np.array([index])}, {},
               r"outside \[0, 5\)", constants=["Y"])  # fmt: skip


# ---------------------------------------------------------------------------- LabelEncoder


def test_label_encoder_v1():
    # Repeated classes: the last position wins, as in ONNX Runtime.
    check(
        "LabelEncoder", {"X": strings("a", "b", "zz", "a", "c")},
        {"classes_strings": ["a", "b", "c", "a"], "default_int64": 7}, **STRINGS,
    )  # fmt: skip
    check(
        "LabelEncoder", {"X": np.array([[0, 2], [5, -1]])},
        {"classes_strings": ["a", "b", "c"], "default_string": "q"},
    )  # fmt: skip
    check("LabelEncoder", {"X": np.array([0, 1, 2])}, {"classes_strings": ["a", "b"]})


@pytest.mark.parametrize("opset", [2, 4])
@pytest.mark.parametrize(
    "x, attrs",
    [
        (strings("a", "b", "c", "x"), {"keys_strings": ["a", "b", "c"], "values_int64s": [3, 4, 5]}),
        (strings("a", "x"), {"keys_strings": ["a"], "values_strings": ["A"], "default_string": "?"}),
        (strings("a", "x"), {"keys_strings": ["a", "x"], "values_floats": [0.5, 1.5]}),
        (np.array([[1, 7], [3, 2]]), {"keys_int64s": [1, 2, 3], "values_strings": ["p", "q", "r"]}),
        (np.array([1, 7, 3]), {"keys_int64s": [3, 1], "values_floats": [0.5, 1.5], "default_float": 9.0}),
        (np.array([1, 7, -3]), {"keys_int64s": [-3, 1], "values_int64s": [10, 11], "default_int64": 42}),
        (np.array([0.5, 1.5, 2.0], np.float32), {"keys_floats": [1.5, 0.5], "values_int64s": [1, 2]}),
        (np.array([0.5, -0.0, 2.0], np.float32), {"keys_floats": [0.0, 0.5], "values_floats": [8.0, 9.0]}),
        (np.array([[0.5], [3.0]], np.float32), {"keys_floats": [0.5], "values_strings": ["h"]}),
        (np.zeros((0, 2), np.int64), {"keys_int64s": [1], "values_int64s": [2]}),
    ],
)  # fmt: skip
def test_label_encoder_lists(opset, x, attrs):
    kw = STRINGS if x.dtype == object else {"symbolic": {"X": [0]}}
    check("LabelEncoder", {"X": x}, attrs, opset=opset, **kw)


@pytest.mark.parametrize(
    "x, attrs",
    [
        (strings("a", "b", "d"), {"keys_tensor": tensor(strings("a", "b")),
                                  "values_tensor": tensor(np.array([5, 6], np.int16)),
                                  "default_tensor": tensor(np.array([42], np.int16))}),
        (strings("a", "b", "d"), {"keys_strings": ["a", "b"],
                                  "values_tensor": tensor(np.array([5, 6], np.int64))}),
        (np.array([1, 2, 9]), {"keys_int64s": [1, 2],
                               "values_tensor": tensor(strings("x", "y")), "default_string": "dd"}),
        (np.array([1, 2, 9]), {"keys_int64s": [1, 2],
                               "values_tensor": tensor(np.array([1.5, 2.5], np.float32))}),
        (np.array([1.0, 2.5, 9.0]), {"keys_tensor": tensor(np.array([2.5, 1.0])),
                                     "values_tensor": tensor(strings("x", "y"))}),
    ],
)  # fmt: skip
def test_label_encoder_v4_tensors(x, attrs):
    kw = STRINGS if x.dtype == object else {}
    check("LabelEncoder", {"X": x}, attrs, opset=4, **kw)


def test_label_encoder_v4_types_ort_lacks():
    # ONNX Runtime has no int32 -> float or int64 -> int32 kernels; onnx.reference has them
    # when default_tensor is given.
    attrs = {
        "keys_tensor": tensor(np.array([1, 2], np.int32)),
        "values_tensor": tensor(np.array([1.5, 2.5], np.float64)),
        "default_tensor": tensor(np.array([-7.0])),
    }
    check(
        "LabelEncoder",
        {"X": np.array([[1, 2], [9, 1]], np.int32)},
        attrs,
        opset=4,
        reference="onnx",
    )
    attrs = {
        "keys_int64s": [1, 2],
        "values_tensor": tensor(np.array([5, 6], np.int32)),
        "default_tensor": tensor(np.array([0], np.int32)),
    }
    check("LabelEncoder", {"X": np.array([1, 2, 9])}, attrs, opset=4, reference="onnx")
    # Without default_tensor, an int32 mapping falls back to default_int64's -1 (the spec's
    # {-1}); onnx.reference needs default_tensor.
    attrs = {"keys_int64s": [1], "values_tensor": tensor(np.array([5], np.int16))}
    expect("LabelEncoder", {"X": np.array([1, 3])}, attrs, [np.array([5, -1], np.int16)], opset=4)


def test_label_encoder_nan_and_repeated_keys():
    # LabelEncoder-4: NaN keys match any NaN and the last repeated key wins. ONNX Runtime lets
    # the first repeated key win, onnx.reference matches no NaN: both depart from the spec.
    x = np.array([0.0, np.nan, 5.0, -0.0], np.float32)
    attrs = {"keys_floats": [0.0, np.nan, 5.0, 0.0], "values_int64s": [1, 2, 3, 4]}
    for opset in (2, 4):
        expect("LabelEncoder", {"X": x}, attrs, [np.array([4, 2, 3, 4])], opset=opset)


def test_label_encoder_errors():
    raises("LabelEncoder", {"X": np.array([1])}, {"keys_int64s": [1], "values_int64s": [1, 2]},
           "has 1 entries but values_int64s has 2", opset=2)  # fmt: skip
    raises("LabelEncoder", {"X": np.array([1])}, {"values_int64s": [1]}, "exactly one of", opset=2)
    raises("LabelEncoder", {"X": np.array([1.0], np.float32)},
           {"keys_int64s": [1], "values_int64s": [1]}, "X is float32", opset=2)  # fmt: skip


def test_category_mapper():
    attrs = {"cats_strings": ["a", "b", "c"], "cats_int64s": [5, 6, 7]}
    check("CategoryMapper", {"X": strings("a", "c", "x")}, {**attrs, "default_int64": 9}, **STRINGS)
    check("CategoryMapper", {"X": np.array([[6, 8], [5, 7]])}, {**attrs, "default_string": "?"})


# ---------------------------------------------------------------------------- TreeEnsemble


def random_forest(rng, *, trees, features, targets, depth, modes, dtype=np.float32):
    """TreeEnsemble-5 attributes for random trees over the grid of halves in [-2, 2]."""
    nodes = {k: [] for k in ("feat", "mode", "split", "tid", "tleaf", "fid", "fleaf", "nan")}
    leaves, weights, members = [], [], []

    def leaf():
        leaves.append(int(rng.integers(targets)))
        weights.append(float(rng.standard_normal()))
        return len(leaves) - 1, 1

    def node(level):
        if level == depth or (level and rng.random() < 0.25):
            return leaf()
        i = len(nodes["feat"])
        mode = int(rng.choice(modes))
        for key, value in (
            ("feat", int(rng.integers(features))),
            ("mode", mode),
            ("split", rng.integers(-4, 5) / 2),
            ("nan", int(rng.integers(2))),
        ):
            nodes[key].append(value)  # fmt: skip
        if mode == 6:  # ONNX Runtime takes whole-number members only
            members.extend(list(rng.choice(np.arange(-2, 3), 3, replace=False)) + [np.nan])
        for side in ("t", "f"):
            nodes[side + "id"].append(0)
            nodes[side + "leaf"].append(0)
        for side in ("t", "f"):
            nodes[side + "id"][i], nodes[side + "leaf"][i] = node(level + 1)
        return i, 0

    roots = [node(0)[0] for _ in range(trees)]
    attrs = {
        "tree_roots": roots,
        "nodes_featureids": nodes["feat"],
        "nodes_modes": tensor(np.array(nodes["mode"], np.uint8)),
        "nodes_splits": tensor(np.array(nodes["split"], dtype)),
        "nodes_truenodeids": nodes["tid"],
        "nodes_trueleafs": nodes["tleaf"],
        "nodes_falsenodeids": nodes["fid"],
        "nodes_falseleafs": nodes["fleaf"],
        "nodes_missing_value_tracks_true": nodes["nan"],
        "leaf_targetids": leaves,
        "leaf_weights": tensor(np.array(weights, dtype)),
        "n_targets": targets,
    }
    if members:
        attrs["membership_values"] = tensor(np.array(members, dtype))
    return attrs


def forest_input(rng, n, features, dtype=np.float32, step=0.5):
    x = (rng.integers(-5, 6, (n, features)) * step).astype(dtype)
    x[rng.random(x.shape) < 0.1] = np.nan
    return x


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
@pytest.mark.parametrize("modes", [(0,), (0, 1, 2, 3, 4, 5), (0, 6)])
def test_tree_ensemble(aggregate, modes):
    rng = np.random.default_rng(aggregate * 10 + len(modes))
    attrs = random_forest(rng, trees=6, features=4, targets=3, depth=5, modes=modes)
    # ONNX Runtime truncates inputs to integers before a set-membership test (its sets hold
    # whole numbers only): membership forests get whole-number inputs.
    x = forest_input(rng, 16, 4, step=1.0 if 6 in modes else 0.5)
    check("TreeEnsemble", {"X": x}, {**attrs, "aggregate_function": aggregate}, opset=5,
          symbolic={"X": [0]})  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_tree_ensemble_dtypes(dtype):
    rng = np.random.default_rng(1)
    attrs = random_forest(rng, trees=3, features=3, targets=2, depth=4, modes=(0, 3), dtype=dtype)
    # ONNX Runtime has no float16 kernel.
    kw = {"rtol": 1e-3, "reference": "onnx"} if dtype == np.float16 else {}
    check("TreeEnsemble", {"X": forest_input(rng, 8, 3, dtype)}, attrs, opset=5, **kw)


@pytest.mark.parametrize("post_transform", [0, 1, 2, 3, 4])
def test_tree_ensemble_post_transform(post_transform):
    # ONNX Runtime reads code 1 as LOGISTIC and 2 as SOFTMAX; the spec has 1 SOFTMAX and
    # 2 LOGISTIC, as Transmuter does: compare with ORT's run of the swapped code.
    rng = np.random.default_rng(2)
    attrs = random_forest(rng, trees=4, features=3, targets=3, depth=3, modes=(0, 2))
    x = forest_input(rng, 10, 3)
    ort_code = {1: 2, 2: 1}.get(post_transform, post_transform)
    model = make_node_model("TreeEnsemble", {"X": x}, {**attrs, "post_transform": post_transform},
                            opset=5, domain=ML)  # fmt: skip
    ort_model = make_node_model("TreeEnsemble", {"X": x}, {**attrs, "post_transform": ort_code},
                                opset=5, domain=ML)  # fmt: skip
    (want,) = ort_run(ort_model, {"X": x})
    for mode, (got,) in transmuter_runs(model, {"X": x}).items():
        assert_close(got, want, rtol=1e-5, atol=1e-6, what=f"TreeEnsemble ({mode})")


def test_tree_ensemble_single_leaf_tree_and_empty_batch():
    # A one-leaf tree: a node whose branches both point to the same leaf.
    attrs = {
        "tree_roots": [0, 1], "nodes_featureids": [0, 1],
        "nodes_modes": tensor(np.array([0, 0], np.uint8)),
        "nodes_splits": tensor(np.array([0.0, 0.5], np.float32)),
        "nodes_truenodeids": [0, 1], "nodes_trueleafs": [1, 1],
        "nodes_falsenodeids": [0, 2], "nodes_falseleafs": [1, 1],
        "leaf_targetids": [0, 1, 0], "leaf_weights": tensor(np.array([3.0, 1.0, 2.0], np.float32)),
        "n_targets": 2,
    }  # fmt: skip
    check("TreeEnsemble", {"X": X[:, :2]}, attrs, opset=5)
    check("TreeEnsemble", {"X": X[:0, :2]}, attrs, opset=5)


def test_tree_ensemble_errors():
    attrs = random_forest(np.random.default_rng(3), trees=1, features=2, targets=1, depth=2,
                          modes=(0,))  # fmt: skip
    raises("TreeEnsemble", {"X": X[:, :1]}, attrs, "but X has 1", opset=5)
    raises("TreeEnsemble", {"X": X[:, :2]}, {**attrs, "aggregate_function": 7}, "in \\[0, 3\\]",
           opset=5)  # fmt: skip
    cyclic = {**attrs, "nodes_truenodeids": [0] * len(attrs["nodes_featureids"]),
              "nodes_trueleafs": [0] * len(attrs["nodes_featureids"])}  # fmt: skip
    raises("TreeEnsemble", {"X": X[:, :2]}, cyclic, "cycle", opset=5)


# ---------------------------------------------------------------- scalers and encoders


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_normalizer(norm, dtype):
    # MAX divides by the signed maximum (the spec, ONNX Runtime); onnx.reference uses max |x|.
    x = np.concatenate([X * 3, np.zeros((1, 5)), -np.abs(X[:1])]).astype(dtype)
    check("Normalizer", {"X": x}, {"norm": norm}, rtol=1e-5)
    check("Normalizer", {"X": x[1]}, {"norm": norm}, rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
@pytest.mark.parametrize("attrs", [
    {"offset": [0.5], "scale": [2.0]},
    {"offset": [0.5, 1, -1, 0, 2], "scale": [2.0, 1, 0.5, 3, -1]},
])  # fmt: skip
def test_scaler(dtype, attrs):
    check("Scaler", {"X": (X * 3).astype(dtype)}, attrs, symbolic={"X": [0]})


@pytest.mark.parametrize(
    "x, attrs",
    [
        (np.array([[1, np.nan, 3], [np.nan, 2, 0]], np.float32),
         {"imputed_value_floats": [7.0, 8, 9], "replaced_value_float": np.nan}),
        (np.array([[1, 0, 3], [0, 2, 0]], np.float64),
         {"imputed_value_floats": [-1.0]}),
        (np.array([[1, 0, 3], [3, 2, 0]], np.int64),
         {"imputed_value_int64s": [7], "replaced_value_int64": 3}),
        (np.array([[1, 0, 3], [3, 2, 0]], np.int32),
         {"imputed_value_int64s": [7, 8, 9], "replaced_value_int64": 0}),
    ],
)  # fmt: skip
def test_imputer(x, attrs):
    # ONNX Runtime has float32 and int64 kernels only.
    check(
        "Imputer", {"X": x}, attrs, reference="ort" if x.dtype in (np.float32, np.int64) else "onnx"
    )


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float32, np.float64])
def test_one_hot_encoder(dtype):
    # Floats are truncated to integers (ONNX Runtime; onnx.reference matches none of them).
    x = np.array([[1, 5], [3, 2], [-2.5, 1.7]]).astype(dtype)
    # ONNX Runtime has no int32 kernel.
    reference = "onnx" if dtype == np.int32 else "ort"
    check("OneHotEncoder", {"X": x}, {"cats_int64s": [1, 2, 3, -2]}, reference=reference)


def test_one_hot_encoder_strings_and_zeros():
    check("OneHotEncoder", {"X": strings("a", "q", "b")}, {"cats_strings": ["q", "a"]}, **STRINGS)
    check("OneHotEncoder", {"X": strings("a", "q")}, {"cats_strings": ["q", "a"], "zeros": 0},
          **STRINGS)  # fmt: skip
    raises("OneHotEncoder", {"X": strings("a", "z")}, {"cats_strings": ["q", "a"], "zeros": 0},
           "not a category")  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_feature_vectorizer(dtype):
    a, b = (X[:, :2] * 3).astype(dtype), (X[:, 2:] * 3).astype(dtype)
    for dims in ([2, 3], [3, 2], [1, 4]):
        check("FeatureVectorizer", {"A": a, "B": b}, {"inputdimensions": dims})
    check("FeatureVectorizer", {"A": a[0]}, {"inputdimensions": [1]})


# --------------------------------------------------------------------------- linear models


@pytest.mark.parametrize(
    "post_transform", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"]
)
def test_linear_regressor(post_transform):
    attrs = {"coefficients": [0.3, -0.2, 0.1, 0.4], "intercepts": [0.1, -0.5], "targets": 2,
             "post_transform": post_transform}  # fmt: skip
    check("LinearRegressor", {"X": X[:, :2] / 4}, attrs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int32])
def test_linear_regressor_types(dtype):
    # ONNX Runtime has a float32 kernel only; onnx.reference returns X's type, not float32.
    x = np.array([[1, 0], [0, 0], [2, -1]], dtype)
    want = (x @ np.array([[0.3], [-0.2]]) + 0.5).astype(np.float32)
    expect("LinearRegressor", {"X": x}, {"coefficients": [0.3, -0.2], "intercepts": [0.5]}, [want])
    check("LinearRegressor", {"X": np.array([1.5, 2.0], np.float32)}, {"coefficients": [0.3, -0.2]})


@pytest.mark.parametrize("post_transform", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("labels", [{"classlabels_ints": [1, 2, 3]},
                                    {"classlabels_strings": ["a", "b", "c"]}])  # fmt: skip
def test_linear_classifier(post_transform, labels):
    attrs = {"coefficients": [0.3, -0.2, 0.1, 0.4, -1, 0], "intercepts": [0.1, 0, 0],
             "post_transform": post_transform, **labels}  # fmt: skip
    check("LinearClassifier", {"X": X[:, :2]}, attrs, outputs=2, rtol=1e-5)


@pytest.mark.parametrize("post_transform", ["NONE", "LOGISTIC"])
@pytest.mark.parametrize("labels", [{"classlabels_ints": [4, 7]},
                                    {"classlabels_strings": ["no", "yes"]}])  # fmt: skip
def test_linear_classifier_binary(post_transform, labels):
    # One score column: ONNX Runtime's [1 - s, s] (onnx.reference writes [-s, s]).
    attrs = {"coefficients": [0.3, -0.2], "intercepts": [0.1], "post_transform": post_transform,
             **labels}  # fmt: skip
    check("LinearClassifier", {"X": X[:, :2]}, attrs, outputs=2, rtol=1e-5)
    raises("LinearClassifier", {"X": X[:, :2]}, {**attrs, "post_transform": "SOFTMAX"},
           "one score column", outputs=2)  # fmt: skip


# ------------------------------------------------- legacy TreeEnsembleClassifier / Regressor

LEGACY_MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]
TRANSFORMS = ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"]


def legacy_forest(rng, *, trees, features, depth, modes=(0,), outputs=1, prefix="target",
                  classes=None, positive=False):  # fmt: skip
    """Legacy TreeEnsemble* attributes for random trees (nodes by tree and node id, LEAF nodes
    carrying weights for one or more of `classes`)."""
    a = {k: [] for k in ("treeids", "nodeids", "featureids", "modes", "values", "truenodeids",
                         "falsenodeids", "missing_value_tracks_true")}  # fmt: skip
    w = {k: [] for k in ("treeids", "nodeids", "ids", "weights")}
    classes = list(range(outputs)) if classes is None else list(classes)
    for t in range(trees):
        counter = [0]

        def node(level, t=t, counter=counter):
            i = counter[0]
            counter[0] += 1
            a["treeids"].append(t)
            a["nodeids"].append(i)
            if level == depth or (level and rng.random() < 0.25):
                for k in ("featureids", "values", "truenodeids", "falsenodeids",
                          "missing_value_tracks_true"):  # fmt: skip
                    a[k].append(0)
                a["modes"].append("LEAF")
                for c in rng.choice(classes, rng.integers(1, len(classes) + 1), replace=False):
                    v = float(rng.standard_normal())
                    for key, value in (("treeids", t), ("nodeids", i), ("ids", int(c)),
                                       ("weights", abs(v) / 4 if positive else v)):  # fmt: skip
                        w[key].append(value)
                return i
            at = len(a["treeids"]) - 1
            a["featureids"].append(int(rng.integers(features)))
            a["modes"].append(LEGACY_MODES[int(rng.choice(modes))])
            a["values"].append(float(rng.integers(-4, 5) / 2))
            a["missing_value_tracks_true"].append(int(rng.integers(2)))
            a["truenodeids"].append(0)
            a["falsenodeids"].append(0)
            a["truenodeids"][at] = node(level + 1, t, counter)
            a["falsenodeids"][at] = node(level + 1, t, counter)
            return i

        node(0)
    attrs = {f"nodes_{k}": v for k, v in a.items()}
    for key in ("treeids", "nodeids", "ids"):
        attrs[f"{prefix}_{key}"] = w[key]
    attrs[f"{prefix}_weights"] = w["weights"]
    return attrs


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("post_transform", TRANSFORMS)
def test_tree_ensemble_regressor(aggregate, post_transform):
    rng = np.random.default_rng(len(aggregate) * 7 + len(post_transform))
    attrs = legacy_forest(rng, trees=5, features=4, depth=4, modes=range(6), outputs=3)
    if post_transform == "PROBIT":  # probit of scores inside (0, 1)
        attrs["target_weights"] = [abs(v) / 20 for v in attrs["target_weights"]]
    attrs.update(n_targets=3, aggregate_function=aggregate, post_transform=post_transform,
                 base_values=[0.1, -0.2, 0.3])  # fmt: skip
    x = forest_input(rng, 16, 4)
    check("TreeEnsembleRegressor", {"X": x}, attrs, rtol=1e-5, atol=1e-5, symbolic={"X": [0]})
    check("TreeEnsembleRegressor", {"X": x}, attrs, opset=3, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_tree_ensemble_regressor_one_target(aggregate):
    rng = np.random.default_rng(5)
    attrs = legacy_forest(rng, trees=6, features=3, depth=5, modes=(0, 3))
    attrs.update(n_targets=1, aggregate_function=aggregate, base_values=[0.5])
    check("TreeEnsembleRegressor", {"X": forest_input(rng, 20, 3)}, attrs, rtol=1e-5, atol=1e-5)


def test_tree_ensemble_regressor_one_target_post_transform():
    # ONNX Runtime applies only PROBIT to a single target (it ignores LOGISTIC and the
    # softmaxes there); the spec applies post_transform to the scores, as Transmuter does.
    rng = np.random.default_rng(6)
    attrs = {**legacy_forest(rng, trees=3, features=3, depth=3), "n_targets": 1}
    x = forest_input(rng, 8, 3)
    (raw,) = ort_run(make_node_model("TreeEnsembleRegressor", {"X": x}, attrs, opset=1, domain=ML),
                     {"X": x})  # fmt: skip
    want = (1 / (1 + np.exp(-raw.astype(np.float64)))).astype(np.float32)
    expect("TreeEnsembleRegressor", {"X": x}, {**attrs, "post_transform": "LOGISTIC"}, [want])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tree_ensemble_as_tensor(dtype):
    # Opset 3's *_as_tensor attributes: float64 ones make the comparisons and sums float64
    # (ONNX Runtime takes them with float64 inputs only); thresholds sit 1e-9 off the inputs.
    rng = np.random.default_rng(7)
    attrs = legacy_forest(rng, trees=4, features=3, depth=4, modes=(0, 2), outputs=2)
    values, weights = attrs.pop("nodes_values"), attrs.pop("target_weights")
    attrs.update(n_targets=2, nodes_values_as_tensor=tensor(np.array(values, dtype) + 1e-9),
                 target_weights_as_tensor=tensor(np.array(weights, dtype)),
                 base_values_as_tensor=tensor(np.array([0.25, -0.5], dtype)))  # fmt: skip
    x = (rng.integers(-4, 5, (10, 3)) / 2).astype(dtype)
    check("TreeEnsembleRegressor", {"X": x}, attrs, opset=3, rtol=1e-6)
    classifier = legacy_forest(rng, trees=4, features=3, depth=4, outputs=3, prefix="class")
    weights = classifier.pop("class_weights")
    classifier.update(class_weights_as_tensor=tensor(np.array(weights, dtype)),
                      classlabels_int64s=[0, 1, 2], post_transform="SOFTMAX")  # fmt: skip
    check("TreeEnsembleClassifier", {"X": x}, classifier, opset=3, outputs=2, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_tree_ensemble_integer_inputs(dtype):
    rng = np.random.default_rng(12)
    attrs = {**legacy_forest(rng, trees=4, features=3, depth=4, modes=(0, 4)), "n_targets": 1}
    x = rng.integers(-3, 4, (10, 3))
    # ONNX Runtime has float kernels only for the legacy regressor: compare with its run on
    # the same values as floats.
    model = make_node_model("TreeEnsembleRegressor", {"X": x.astype(np.float32)}, attrs,
                            opset=1, domain=ML)  # fmt: skip
    want = ort_run(model, {"X": x.astype(np.float32)})
    expect("TreeEnsembleRegressor", {"X": x.astype(dtype)}, attrs, want)


@pytest.mark.parametrize("post_transform", TRANSFORMS)
@pytest.mark.parametrize("labels", [{"classlabels_int64s": [4, 7, 9]},
                                    {"classlabels_strings": ["a", "b", "c"]}])  # fmt: skip
@pytest.mark.parametrize("base", [False, True])
def test_tree_ensemble_classifier_multiclass(post_transform, labels, base):
    rng = np.random.default_rng(len(post_transform) + 3 * base)
    attrs = legacy_forest(rng, trees=4, features=4, depth=3, modes=(0, 3), outputs=3,
                          prefix="class", positive=post_transform == "PROBIT")  # fmt: skip
    attrs.update(post_transform=post_transform, **labels)
    if base:
        attrs["base_values"] = [0.1, -0.3, 0.2]
    kw = STRINGS if "classlabels_strings" in labels else {}
    check("TreeEnsembleClassifier", {"X": forest_input(rng, 16, 4)}, attrs, outputs=2,
          rtol=1e-5, atol=1e-5, **kw)  # fmt: skip


@pytest.mark.parametrize("post_transform", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("weights", ["class0", "class1", "both"])
@pytest.mark.parametrize("positive", [False, True])
@pytest.mark.parametrize("base", [False, True])
def test_tree_ensemble_classifier_binary(post_transform, weights, positive, base):
    # Two classes follow ONNX Runtime's TreeAggregatorClassifier: with every weight on one
    # class id (skl2onnx's gradient boosting, LightGBM) the other class's score is made from it:
    # 1 - p for all-positive weights, -s (logistic(-s) with LOGISTIC) for mixed ones, and the
    # label is decided at 0.5 or 0.
    rng = np.random.default_rng(len(post_transform) + len(weights) + 2 * positive + 5 * base)
    classes = {"class0": [0], "class1": [1], "both": [0, 1]}[weights]
    attrs = legacy_forest(rng, trees=4, features=4, depth=3, modes=(0, 1), outputs=2,
                          prefix="class", classes=classes, positive=positive)  # fmt: skip
    attrs.update(post_transform=post_transform, classlabels_int64s=[0, 1])
    if base:
        attrs["base_values"] = [0.2, 0.3]
    check("TreeEnsembleClassifier", {"X": forest_input(rng, 16, 4)}, attrs, outputs=2,
          rtol=1e-5, atol=1e-5)  # fmt: skip


def test_tree_ensemble_classifier_binary_labels_and_probit():
    # Weights on both classes and no single class id: ONNX Runtime returns the numbers 1 / 0
    # (its defaults), not the class labels; the label output holds class labels (the spec), so
    # Transmuter returns labels[1] / labels[0]. A single PROBIT score fills ORT's first column
    # only (the second is uninitialized memory); Transmuter writes 0 there.
    rng = np.random.default_rng(8)
    attrs = legacy_forest(rng, trees=3, features=3, depth=3, outputs=2, prefix="class")
    x = forest_input(rng, 10, 3)
    ints = {**attrs, "classlabels_int64s": [0, 1]}
    label, scores = ort_run(make_node_model("TreeEnsembleClassifier", {"X": x}, ints, opset=1,
                                            domain=ML, outputs=2), {"X": x})  # fmt: skip
    expect("TreeEnsembleClassifier", {"X": x}, {**attrs, "classlabels_int64s": [5, 8]},
           [np.where(label == 1, 8, 5), scores], outputs=2)  # fmt: skip
    one = legacy_forest(rng, trees=3, features=3, depth=3, outputs=2, prefix="class",
                        classes=[0], positive=True)  # fmt: skip
    one.update(classlabels_int64s=[0, 1], post_transform="PROBIT")
    model = make_node_model("TreeEnsembleClassifier", {"X": x}, one, opset=1, domain=ML,
                            outputs=2)  # fmt: skip
    label, scores = ort_run(model, {"X": x})
    for mode, (got_label, got) in transmuter_runs(model, {"X": x}).items():
        np.testing.assert_array_equal(np.asarray(got_label), label, err_msg=mode)
        np.testing.assert_allclose(np.asarray(got)[:, 0], scores[:, 0], rtol=1e-5, err_msg=mode)
        np.testing.assert_array_equal(np.asarray(got)[:, 1], 0, err_msg=mode)


def test_tree_ensemble_legacy_single_leaf_trees_and_errors():
    # A tree that is one leaf (LightGBM writes those), and node ids out of listing order.
    attrs = {
        "nodes_treeids": [0, 0, 0, 1], "nodes_nodeids": [0, 2, 1, 0],
        "nodes_featureids": [1, 0, 0, 0], "nodes_values": [0.5, 0, 0, 0],
        "nodes_modes": ["BRANCH_LEQ", "LEAF", "LEAF", "LEAF"],
        "nodes_truenodeids": [2, 0, 0, 0], "nodes_falsenodeids": [1, 0, 0, 0],
        "target_treeids": [0, 0, 1], "target_nodeids": [2, 1, 0], "target_ids": [0, 0, 0],
        "target_weights": [1.0, 2.0, 0.25], "n_targets": 1,
    }  # fmt: skip
    check("TreeEnsembleRegressor", {"X": X[:, :2]}, attrs)
    check("TreeEnsembleRegressor", {"X": X[:0, :2]}, attrs)
    raises("TreeEnsembleRegressor", {"X": X[:, :2]}, {**attrs, "nodes_truenodeids": [3, 0, 0, 0]},
           "does not have")  # fmt: skip
    raises("TreeEnsembleRegressor", {"X": X[:, :2]},
           {**attrs, "nodes_modes": ["BRANCH_XX", "LEAF", "LEAF", "LEAF"]}, "BRANCH_XX")  # fmt: skip
    raises("TreeEnsembleRegressor", {"X": X[:, :2]}, {**attrs, "base_values": [1.0, 2.0]},
           "base_values holds 2")  # fmt: skip
    raises("TreeEnsembleRegressor", {"X": X[:, :2]},
           {**attrs, "aggregate_function": "MEDIAN"}, "MEDIAN")  # fmt: skip


def test_tree_ensemble_vmap_and_jit():
    # The lowering is array code: jax.vmap and jax.jit of transmuter.run work on it.
    import jax

    rng = np.random.default_rng(9)
    attrs = legacy_forest(rng, trees=4, features=3, depth=4, outputs=2)
    attrs["n_targets"] = 2
    x = forest_input(rng, 6, 3)
    model_proto = make_node_model("TreeEnsembleRegressor", {"X": x}, attrs, opset=1, domain=ML,
                                  symbolic={"X": [0]})  # fmt: skip
    (want,) = ort_run(model_proto, {"X": x})
    model = transmuter.load(model_proto)

    def run(rows):
        return transmuter.run(model, {"X": rows})["out0"]

    np.testing.assert_allclose(jax.jit(run)(x), want, rtol=1e-6)
    batched = jax.vmap(run)(x.reshape(3, 2, 3))
    np.testing.assert_allclose(np.asarray(batched).reshape(6, 2), want, rtol=1e-6)


# ---------------------------------------------------------------------------------- SVMs

KERNELS = {"LINEAR": [0.0, 0.0, 0.0], "POLY": [0.3, 0.5, 3.0], "RBF": [0.3, 0.0, 0.0],
           "SIGMOID": [0.3, 0.5, 0.0]}  # fmt: skip


def svm_attrs(rng, classes, kernel, features=3, probability=False):
    per = [int(v) for v in rng.integers(1, 4, classes)]
    vectors, pairs = sum(per), classes * (classes - 1) // 2
    attrs = {
        "kernel_type": kernel, "kernel_params": KERNELS[kernel], "vectors_per_class": per,
        "support_vectors": list(rng.standard_normal(vectors * features)),
        "coefficients": list(rng.standard_normal((classes - 1) * vectors)),
        "rho": list(rng.standard_normal(pairs)),
    }  # fmt: skip
    if probability:
        attrs["prob_a"] = list(-rng.random(pairs) * 3)
        attrs["prob_b"] = list(rng.standard_normal(pairs) * 0.2)
    return attrs


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("classes", [2, 3, 4])
@pytest.mark.parametrize("probability", [False, True])
def test_svm_classifier(kernel, classes, probability):
    rng = np.random.default_rng(classes * 10 + len(kernel) + probability)
    attrs = svm_attrs(rng, classes, kernel, probability=probability)
    x = rng.standard_normal((20, 3)).astype(np.float32)
    labelings = [{"classlabels_ints": list(range(10, 10 + classes))}]
    if kernel == "RBF":  # string labels pick by the same votes or probabilities, any kernel
        labelings.append({"classlabels_strings": [f"c{i}" for i in range(classes)]})
    for labels in labelings:
        kw = STRINGS if "classlabels_strings" in labels else {"symbolic": {"X": [0]}}
        check("SVMClassifier", {"X": x}, {**attrs, **labels}, outputs=2, rtol=1e-5, atol=1e-5,
              **kw)  # fmt: skip


@pytest.mark.parametrize("post_transform", ["LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("classes", [2, 3])
def test_svm_classifier_post_transform(post_transform, classes):
    # Two classes without probabilities: ONNX Runtime's [-s, s] (NONE), [1 - p, p] with p the
    # logistic of s (LOGISTIC), [1 - s, s] otherwise.
    rng = np.random.default_rng(len(post_transform) + classes)
    attrs = svm_attrs(rng, classes, "RBF", probability=classes == 3)
    attrs.update(post_transform=post_transform, classlabels_ints=list(range(classes)))
    x = rng.standard_normal((12, 3)).astype(np.float32)
    check("SVMClassifier", {"X": x}, attrs, outputs=2, rtol=1e-5, atol=1e-5)


def test_svm_classifier_linear_mode_and_dtypes():
    # No support vectors: liblinear's x . w_c + rho[0] per class.
    rng = np.random.default_rng(11)
    attrs = {"coefficients": list(rng.standard_normal(9)), "rho": [0.25], "kernel_params": [0.0, 0.0, 0.0],
             "classlabels_ints": [1, 2, 3], "post_transform": "SOFTMAX"}  # fmt: skip
    for dtype in (np.float32, np.float64, np.int64, np.int32):
        x = (rng.standard_normal((8, 3)) * 3).astype(dtype)
        check("SVMClassifier", {"X": x}, attrs, outputs=2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("one_class", [0, 1])
def test_svm_regressor(kernel, one_class):
    rng = np.random.default_rng(len(kernel) + one_class)
    attrs = {"kernel_type": kernel, "kernel_params": KERNELS[kernel], "n_supports": 4,
             "support_vectors": list(rng.standard_normal(12)),
             "coefficients": list(rng.standard_normal(4)), "rho": [0.3],
             "one_class": one_class}  # fmt: skip
    x = rng.standard_normal((15, 3)).astype(np.float32)
    check("SVMRegressor", {"X": x}, attrs, rtol=1e-5, atol=1e-5, symbolic={"X": [0]})
    linear = {"coefficients": [0.5, -1.0, 2.0], "rho": [0.1], "one_class": one_class,
              "kernel_params": [0.0, 0.0, 0.0]}  # fmt: skip
    check("SVMRegressor", {"X": x}, linear, rtol=1e-5, atol=1e-5)


def test_svm_regressor_post_transform():
    # ONNX Runtime ignores post_transform; the spec applies it, and so does Transmuter.
    x = np.array([[1.0, 2.0], [-1.0, 0.5]], np.float32)
    attrs = {"coefficients": [0.5, -1.0], "rho": [0.1], "post_transform": "LOGISTIC",
             "kernel_params": [0.0, 0.0, 0.0]}  # fmt: skip
    score = x @ np.array([0.5, -1.0]) + 0.1
    expect(
        "SVMRegressor", {"X": x}, attrs, [(1 / (1 + np.exp(-score)))[:, None].astype(np.float32)]
    )


# ---------------------------------------------------------------------------------- maps


def ort_maps(model, feeds):
    """ONNX Runtime's one output for map inputs (opcheck's feeds() takes arrays only)."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def map_model(op_type, attrs, key, value, output, *, sequence=False):
    from onnx import TensorProto, helper

    kind = helper.make_map_type_proto(key, helper.make_tensor_type_proto(value, None))
    if sequence:
        kind = helper.make_sequence_type_proto(kind)
    node = helper.make_node(op_type, ["X"], ["Y"], domain=ML, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_value_info("X", kind)],
                              [helper.make_tensor_value_info("Y", output, None)])  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(ML, 3)]
    )
    model.ir_version = 10
    del TensorProto
    return model


@pytest.mark.parametrize("labels", [{"classlabels_int64s": [3, 5, 9]},
                                    {"classlabels_strings": ["a", "b", "c"]}])  # fmt: skip
@pytest.mark.parametrize("rows", [4, 1, 0])
def test_zip_map(labels, rows):
    from onnx import TensorProto, helper

    x = rng.random((rows, 3)).astype(np.float32)
    key = TensorProto.INT64 if "classlabels_int64s" in labels else TensorProto.STRING
    seq = helper.make_sequence_type_proto(
        helper.make_map_type_proto(key, helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    )
    node = helper.make_node("ZipMap", ["X"], ["Z"], domain=ML, **labels)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["X0"], ["X"]), node], "g",
        [helper.make_tensor_value_info("X0", TensorProto.FLOAT, ["N", 3])],
        [helper.make_value_info("Z", seq)],
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(ML, 1)]
    )
    model.ir_version = 10
    (want,) = ort_run(model, {"X0": x})
    for mode, (got,) in transmuter_runs(model, {"X0": x}).items():
        assert isinstance(got, list) and len(got) == len(want), mode
        for g, w in zip(got, want):
            assert list(g) == list(w), mode
            assert all(isinstance(v, np.float32) for v in g.values()), mode
            np.testing.assert_allclose([g[k] for k in w], [w[k] for k in w], rtol=1e-7)


def test_zip_map_compiles_what_comes_before():
    from onnx import TensorProto, helper

    seq = helper.make_sequence_type_proto(helper.make_map_type_proto(
        TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, None)))  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["X"], ["P"]),
         helper.make_node("ZipMap", ["P"], ["Z"], domain=ML, classlabels_int64s=[0, 1])],
        "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2])],
        [helper.make_value_info("Z", seq), helper.make_tensor_value_info("P", 1, ["N", 2])],
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(ML, 1)]
    )
    loaded = transmuter.load(model)
    compiled = transmuter.compile(loaded, {"X": X[:, :2]})
    # One compiled program for the Softmax, the maps built on the host after it.
    assert compiled.segments == [(0, 1, True)]
    out = compiled({"X": X[:3, :2]})
    assert len(out["Z"]) == 3 and out["Z"][0][1] == np.asarray(out["P"])[0, 1]
    with pytest.raises(TransmuterError, match="ZipMap"):
        __import__("jax").jit(lambda x: transmuter.run(loaded, {"X": x})["Z"])(X[:, :2])


@pytest.mark.parametrize("cast_to", ["TO_FLOAT", "TO_INT64", "TO_STRING"])
@pytest.mark.parametrize("map_form", ["DENSE", "SPARSE"])
def test_cast_map(cast_to, map_form):
    from onnx import TensorProto

    output = {"TO_FLOAT": TensorProto.FLOAT, "TO_INT64": TensorProto.INT64,
              "TO_STRING": TensorProto.STRING}[cast_to]  # fmt: skip
    attrs = {"cast_to": cast_to, "map_form": map_form, "max_map": 6}
    model = map_model("CastMap", attrs, TensorProto.INT64, TensorProto.FLOAT, output)
    data = {1: np.float32(1.5), 4: np.float32(2.5), 2: np.float32(-3.0)}
    want = ort_maps(model, {"X": data})
    if cast_to == "TO_STRING" and map_form == "SPARSE":
        # ONNX Runtime fills the gaps with the literal "0.f"; the spec names no fill value and
        # Transmuter writes a formatted zero like its other numbers.
        want = np.where(want == "0.f", "0.000000", want).astype(object)
    loaded = transmuter.load(model)
    runs = {"eager": transmuter.run(loaded, {"X": data}),
            "compiled": transmuter.compile(loaded, {"X": data})({"X": data})}  # fmt: skip
    for mode, got in runs.items():
        assert_close(got["Y"], want, rtol=0, atol=0, what=f"CastMap ({mode})")


def test_cast_map_strings():
    # ONNX Runtime's Python API takes no map(int64, string) input: values written out.
    from onnx import TensorProto

    data = {3: "2.5", 0: "-1"}
    for cast_to, output, want in (
        ("TO_FLOAT", TensorProto.FLOAT, np.array([[-1.0, 2.5]], np.float32)),
        ("TO_INT64", TensorProto.INT64, np.array([[-1, 2]])),
        ("TO_STRING", TensorProto.STRING, strings("-1", "2.5").reshape(1, 2)),
    ):
        model = map_model("CastMap", {"cast_to": cast_to}, TensorProto.INT64,
                          TensorProto.STRING, output)  # fmt: skip
        got = transmuter.run(transmuter.load(model), {"X": data})["Y"]
        assert_close(got, want, rtol=0, atol=0, what=cast_to)


@pytest.mark.parametrize(
    "key, value, data, vocabulary",
    [
        ("STRING", "FLOAT", {"a": 1.5, "c": 2.0, "z": 9.0}, {"string_vocabulary": ["a", "b", "c"]}),
        ("INT64", "DOUBLE", {1: 1.5, 3: 2.0}, {"int64_vocabulary": [3, 1, 7]}),
        ("STRING", "INT64", {"b": 3}, {"string_vocabulary": ["a", "b"]}),
        ("INT64", "STRING", {1: "x"}, {"int64_vocabulary": [1, 2]}),
    ],
)  # fmt: skip
def test_dict_vectorizer(key, value, data, vocabulary):
    # Y is 1-D (the spec, onnx.reference); ONNX Runtime returns [1, V].
    from onnx import TensorProto, helper

    key, value = getattr(TensorProto, key), getattr(TensorProto, value)
    model = map_model("DictVectorizer", vocabulary, key, value, value)
    words = next(iter(vocabulary.values()))
    dtype = helper.tensor_dtype_to_np_dtype(value)
    fill = "" if dtype.kind == "O" else 0
    want = np.array([data.get(k, fill) for k in words], dtype)
    loaded = transmuter.load(model)
    assert_close(transmuter.run(loaded, {"X": data})["Y"], want, rtol=0, atol=0, what="eager")
    compiled = transmuter.compile(loaded, {"X": data})
    assert_close(compiled({"X": data})["Y"], want, rtol=0, atol=0, what="compiled")
    if dtype.kind != "O":  # a numeric map is a program argument: new values, same program
        other = {k: v + 1 for k, v in data.items()}
        want = np.array([other.get(k, 0) for k in words], dtype)
        assert_close(compiled({"X": other})["Y"], want, rtol=0, atol=0, what="compiled again")
        assert compiled.segments == [(0, "end", True)]


def test_map_inputs_are_checked():
    from onnx import TensorProto

    model = transmuter.load(map_model("DictVectorizer", {"string_vocabulary": ["a"]},
                                      TensorProto.STRING, TensorProto.FLOAT, TensorProto.FLOAT))  # fmt: skip
    with pytest.raises(TransmuterError, match="a dict"):
        transmuter.run(model, {"X": [1.0]})
    with pytest.raises(TransmuterError, match="key 1"):
        transmuter.run(model, {"X": {1: 1.0}})
