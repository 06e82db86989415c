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
