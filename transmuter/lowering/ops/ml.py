"""Classical machine-learning operators of the ai.onnx.ml domain (scikit-learn style exports).

String tensors live on the host (DESIGN.md), so an op that reads or writes strings runs with
numpy; when its numeric input is traced, it asks for it on the host (`ctx.need_host`) and the
compiling runtime runs the node eagerly. Everything numeric runs with jax.numpy, on the host or the device.

Tree ensembles live in ml_trees.py, support vector machines in ml_svm.py, and the operators on
maps (ZipMap, CastMap, DictVectorizer) in ml_maps.py; they share this module's helpers.

Post transforms follow ONNX Runtime where the spec gives no formula: SOFTMAX_ZERO leaves zero
scores at zero (all 0.5 when every score is zero), PROBIT uses ONNX Runtime's closed-form erfinv
approximation (a = 0.147), so that scores match it rather than an exact erfinv.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from transmuter.errors import ShapeError
from transmuter.lowering import op, variant
from transmuter.lowering.shared import arg_extreme

ML = "ai.onnx.ml"


def _is_strings(value) -> bool:
    return isinstance(value, np.ndarray) and value.dtype == object


def strings_array(values, shape) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out.reshape(shape)


def one_of(op_type: str, what: str, **candidates):
    """The name and value of the single attribute among `candidates` that is set."""
    given = [(name, value) for name, value in candidates.items() if value is not None]
    if len(given) != 1:
        names = ", ".join(candidates)
        raise ValueError(
            f"{op_type}: exactly one of {names} must be set ({what}); got {len(given)}"
        )
    return given[0]


def class_labels(ctx, op_type: str, X, **candidates):
    """A classifier's labels, from whichever of the `candidates` attributes is set, and its X:
    int64 labels, or strings, which need X on the host (the label output is a string tensor
    picked by its scores there)."""
    name, labels = one_of(op_type, "the class labels", **candidates)
    if name == "classlabels_strings":
        X = ctx.host_value(0, X, "the input of a classifier with string labels")
        return strings_array(labels, (-1,)), X
    return np.asarray(labels, np.int64), X


def as_rows(op_type: str, x):
    """X as [N, C]: a vector is one row."""
    x = jnp.asarray(x)
    if x.ndim == 1:
        return x[None, :]
    if x.ndim != 2:
        raise ShapeError(f"{op_type}: X must be [N, C] or [C], got shape {list(x.shape)}")
    return x


def _feature_vector(op_type: str, name: str, values, features: int, dtype):
    """A per-feature attribute of length 1 or `features`, broadcast over the last axis."""
    array = np.asarray(values, dtype)
    if array.size not in (1, features):
        raise ShapeError(
            f"{op_type}: {name} must hold 1 or {features} values (one per feature), "
            f"got {array.size}"
        )
    return jnp.asarray(array)


# ------------------------------------------------------------------------- post transforms


def _erfinv(x):
    # ONNX Runtime's erfinv (Winitzki's approximation); PROBIT scores match it to rounding.
    sign = jnp.where(x < 0, -1.0, 1.0).astype(x.dtype)
    log = jnp.log((1 - x) * (1 + x))
    a = 2 / (math.pi * 0.147) + 0.5 * log
    return sign * jnp.sqrt(-a + jnp.sqrt(a * a - log / 0.147))


def _softmax_zero(scores):
    nonzero = jnp.abs(scores) > 1e-7
    high = jnp.max(scores, axis=-1, keepdims=True)
    exp = jnp.where(nonzero, jnp.exp(scores - high), 0)
    total = jnp.sum(exp, axis=-1, keepdims=True)
    return jnp.where(total == 0, 0.5, exp / jnp.where(total == 0, 1, total)).astype(scores.dtype)


_POST_TRANSFORMS = {
    "NONE": lambda s: s,
    "SOFTMAX": lambda s: jax.nn.softmax(s, axis=-1),
    "LOGISTIC": jax.nn.sigmoid,
    "SOFTMAX_ZERO": _softmax_zero,
    "PROBIT": lambda s: (math.sqrt(2) * _erfinv(2 * s - 1)).astype(s.dtype),
}


TRANSFORM_CODES = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")  # TreeEnsemble-5


def apply_post_transform(op_type: str, scores, name: str):
    if name not in _POST_TRANSFORMS:
        raise ValueError(
            f"{op_type}: post_transform {name!r} is not one of {', '.join(_POST_TRANSFORMS)}"
        )
    return _POST_TRANSFORMS[name](scores)


# --------------------------------------------------------------------------- element maps


@op("Binarizer", since=1, domain=ML)
def binarizer(X, *, threshold=0.0):
    """ONNX-ML Binarizer-1: 1 where X > threshold, else 0, in X's type (NaN gives 0)."""
    x = jnp.asarray(X)
    compare = x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float64)
    return (compare > jnp.asarray(threshold, compare.dtype)).astype(x.dtype)


@op("ArrayFeatureExtractor", since=1, domain=ML, context=True, strings_on_host=True)
def array_feature_extractor(ctx, X, Y):
    """ONNX-ML ArrayFeatureExtractor-1: X[..., Y.flatten()]; a vector X gives one row."""
    if _is_strings(X):
        indices = ctx.host_value(1, Y, "indices into a string tensor").reshape(-1)
        xp = np
    else:
        indices, xp = Y.reshape(-1), jnp
    if X.ndim == 0:
        raise ShapeError("ArrayFeatureExtractor: X must have at least one dimension, got a scalar")
    size = X.shape[-1]
    if isinstance(indices, np.ndarray) and indices.size:
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= size:
            raise ShapeError(
                f"ArrayFeatureExtractor: Y holds {low if low < 0 else high}, outside [0, {size})"
            )
    out = xp.take(X, indices, axis=-1)
    return out.reshape(1, -1) if X.ndim == 1 else out


@op("Imputer", since=1, domain=ML)
def imputer(
    X,
    *,
    imputed_value_floats=None,
    imputed_value_int64s=None,
    replaced_value_float=0.0,
    replaced_value_int64=0,
):
    """ONNX-ML Imputer-1: entries equal to the replaced value (NaN matches NaN) take the
    imputed value of their feature (last axis)."""
    x = jnp.asarray(X)
    floats = jnp.issubdtype(x.dtype, jnp.floating)
    values = imputed_value_floats if floats else imputed_value_int64s
    if not values:
        kind = "imputed_value_floats" if floats else "imputed_value_int64s"
        raise ValueError(f"Imputer: X is {x.dtype}, so {kind} must be set")
    features = x.shape[-1] if x.ndim else 1
    imputed = _feature_vector("Imputer", "the imputed values", values, features, x.dtype)
    if floats:
        replaced = jnp.asarray(replaced_value_float, x.dtype)
        hit = jnp.isnan(x) if math.isnan(replaced_value_float) else x == replaced
    else:
        hit = x == jnp.asarray(replaced_value_int64, x.dtype)
    return jnp.where(hit, imputed, x)


@op("Scaler", since=1, domain=ML)
def scaler(X, *, offset=None, scale=None):
    """ONNX-ML Scaler-1: (X - offset) * scale per feature (last axis), as float32."""
    x = jnp.asarray(X).astype(jnp.float32)
    features = x.shape[-1] if x.ndim else 1
    if offset is not None and scale is not None and len(offset) != len(scale):
        raise ShapeError(
            f"Scaler: offset ({len(offset)}) and scale ({len(scale)}) differ in length"
        )
    if offset is not None:
        x = x - _feature_vector("Scaler", "offset", offset, features, np.float32)
    if scale is not None:
        x = x * _feature_vector("Scaler", "scale", scale, features, np.float32)
    return x


@op("Normalizer", since=1, domain=ML)
def normalizer(X, *, norm="MAX"):
    """ONNX-ML Normalizer-1: each row divided by its max, L1 or L2 norm, as float32."""
    x = jnp.asarray(X)
    dtype = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    rows = as_rows("Normalizer", x).astype(dtype)
    # MAX divides by the largest value, signed (the spec and ONNX Runtime; onnx.reference takes
    # the largest |x|); L1 and L2 are the norms of |x| (ONNX Runtime; the spec's formulas drop
    # the absolute values). A zero divisor leaves the row as it is.
    if norm == "MAX":
        divisor = jnp.max(rows, axis=1, keepdims=True, initial=-jnp.inf)
    elif norm == "L1":
        divisor = jnp.sum(jnp.abs(rows), axis=1, keepdims=True)
    elif norm == "L2":
        divisor = jnp.sqrt(jnp.sum(rows * rows, axis=1, keepdims=True))
    else:
        raise ValueError(f"Normalizer: norm must be 'MAX', 'L1' or 'L2', got {norm!r}")
    out = rows / jnp.where(divisor == 0, 1, divisor)
    return out.reshape(x.shape).astype(jnp.float32)


@op("FeatureVectorizer", since=1, domain=ML)
def feature_vectorizer(*X, inputdimensions=None):
    """ONNX-ML FeatureVectorizer-1: inputs as [N, C_i] side by side, each cut or zero-padded to
    its inputdimensions entry, as float32."""
    if inputdimensions is None or len(inputdimensions) != len(X):
        raise ValueError(
            f"FeatureVectorizer: inputdimensions must give one size per input ({len(X)}), "
            f"got {inputdimensions}"
        )
    parts = []
    for i, (x, width) in enumerate(zip(X, inputdimensions)):
        x = jnp.asarray(x)
        x = x[None, :] if x.ndim == 1 else x
        if x.ndim != 2:
            raise ShapeError(f"FeatureVectorizer: input {i} must be 1-D or 2-D, got {x.shape}")
        x = x[:, :width].astype(jnp.float32)
        parts.append(jnp.pad(x, ((0, 0), (0, width - x.shape[1]))))
    return jnp.concatenate(parts, axis=1)


@op("OneHotEncoder", since=1, domain=ML, context=True)
def one_hot_encoder(ctx, X, *, cats_int64s=None, cats_strings=None, zeros=1):
    """ONNX-ML OneHotEncoder-1: a trailing axis with 1.0 at the category's position (float32);
    numeric inputs are truncated to int64 first."""
    name, cats = one_of(
        "OneHotEncoder", "the categories", cats_int64s=cats_int64s, cats_strings=cats_strings
    )
    if _is_strings(X) != (name == "cats_strings"):
        raise ValueError(f"OneHotEncoder: X of type {X.dtype} needs cats_strings/cats_int64s")
    if _is_strings(X):
        position = {c: i for i, c in reversed(list(enumerate(cats)))}
        index = np.array([position.get(v, -1) for v in X.reshape(-1)]).reshape(X.shape)
        xp, cats = np, np.arange(len(cats))
    else:
        index, xp, cats = jnp.asarray(X).astype(jnp.int64), jnp, np.asarray(cats, np.int64)
    hot = index[..., None] == xp.asarray(cats)
    # Unknown categories with zeros=0 are an error where the values are known (not traced).
    if not zeros and not isinstance(hot, jax.core.Tracer) and not np.asarray(hot).any(-1).all():
        raise ValueError("OneHotEncoder: X holds a value that is not a category and zeros=0")
    return hot.astype(np.float32)


# --------------------------------------------------------------------------- linear models


def _linear(op_type: str, x, coefficients, intercepts):
    """X [N, F] (a vector is one row) times the [targets, F] coefficients, plus intercepts, in
    float32 (float64 for float64 X)."""
    x = as_rows(op_type, x)
    dtype = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    weights = np.asarray(coefficients or (), np.float64)
    features = x.shape[1]
    if features == 0 or weights.size % features:
        raise ShapeError(
            f"{op_type}: {weights.size} coefficients do not split into rows of {features} features"
        )
    weights = weights.reshape(-1, features)
    scores = x.astype(dtype) @ jnp.asarray(weights.T, dtype)
    if intercepts is not None:
        if len(intercepts) != weights.shape[0]:
            raise ShapeError(
                f"{op_type}: {len(intercepts)} intercepts for {weights.shape[0]} score columns"
            )
        scores = scores + jnp.asarray(intercepts, dtype)
    return scores


@op("LinearRegressor", since=1, domain=ML)
def linear_regressor(X, *, coefficients=None, intercepts=None, post_transform="NONE", targets=1):
    """ONNX-ML LinearRegressor-1: post_transform(X W' + b) with W [targets, F], as float32."""
    scores = _linear("LinearRegressor", X, coefficients, intercepts)
    if scores.shape[1] != targets:
        raise ShapeError(
            f"LinearRegressor: the coefficients give {scores.shape[1]} targets, not {targets}"
        )
    return apply_post_transform("LinearRegressor", scores, post_transform).astype(jnp.float32)


@op("LinearClassifier", since=1, domain=ML, context=True, strings_on_host=True)
def linear_classifier(
    ctx,
    X,
    *,
    classlabels_ints=None,
    classlabels_strings=None,
    coefficients,
    intercepts=None,
    multi_class=0,
    post_transform="NONE",
):
    """ONNX-ML LinearClassifier-1: scores post_transform(X W' + b) [N, E] and the label of the
    best score per row. multi_class does not change the result (nor in ONNX Runtime)."""
    labels, X = class_labels(
        ctx, "LinearClassifier", X,
        classlabels_ints=classlabels_ints, classlabels_strings=classlabels_strings,
    )  # fmt: skip
    scores = _linear("LinearClassifier", X, coefficients, intercepts)
    if scores.shape[1] == 1:
        # One score column is a binary classifier (ONNX Runtime): the score s (or its logistic
        # p) is the second class's, the first class gets 1 - s (1 - p); s > 0 picks the second.
        if len(labels) != 2 or post_transform not in ("NONE", "LOGISTIC"):
            raise ValueError(
                "LinearClassifier: one score column needs exactly 2 class labels and "
                f"post_transform NONE or LOGISTIC; got {len(labels)} labels, {post_transform!r}"
            )
        second = apply_post_transform("LinearClassifier", scores, post_transform)
        best = (scores[:, 0] > 0).astype(jnp.int64)
        scores = jnp.concatenate([1 - second, second], axis=1)
    else:
        if len(labels) != scores.shape[1]:
            raise ShapeError(
                f"LinearClassifier: {len(labels)} class labels for {scores.shape[1]} score columns"
            )
        scores = apply_post_transform("LinearClassifier", scores, post_transform)
        best = arg_extreme(scores, 1)  # not jnp.argmax (see arg_extreme)
    if labels.dtype == object:
        return labels[np.asarray(best)], scores.astype(jnp.float32)
    return jnp.asarray(labels)[best], scores.astype(jnp.float32)


# ----------------------------------------------------------------------------- label maps


@dataclass(frozen=True)
class _Table:
    """A host lookup table: numeric keys sorted without repeats (the last of a repeated key
    wins), the position in `values` of each, and the position for NaN inputs (None: unmapped)."""

    keys: np.ndarray
    positions: np.ndarray
    nan_position: int | None


def _table(keys: np.ndarray) -> _Table:
    latest: dict = {}
    nan_position = None
    for i, key in enumerate(keys.tolist()):
        if key != key:  # NaN keys match any NaN input (ONNX-ML LabelEncoder-4)
            nan_position = i
        else:
            latest[key] = i
    ordered = sorted(latest)
    return _Table(
        np.array(ordered, keys.dtype),
        np.array([latest[k] for k in ordered], np.int64),
        nan_position,
    )


def _map(ctx, x, keys: np.ndarray, values: np.ndarray, default) -> object:
    """Each element of x replaced by the value of its key, or `default`; NaN matches NaN."""
    op_type = ctx.node.op_type
    table = np.concatenate([values, np.array([default], values.dtype)])
    missing = len(values)  # the default's position
    if _is_strings(x) != (keys.dtype == object):
        raise ValueError(f"{op_type}: X of type {x.dtype} does not match keys of type {keys.dtype}")
    if _is_strings(x):
        latest = {k: i for i, k in enumerate(keys.tolist())}
        found = [latest.get(v, missing) for v in x.reshape(-1)]
        return table[np.asarray(found, np.int64)].reshape(x.shape)
    if values.dtype == object:
        xp, x = np, ctx.host_value(0, x, "values mapped to strings")
    else:
        xp, x = jnp, jnp.asarray(x)
    if np.dtype(x.dtype) != keys.dtype:
        raise ValueError(f"{op_type}: X is {np.dtype(x.dtype)} but the keys are {keys.dtype}")
    lookup = _table(keys)
    position = xp.full(x.shape, missing, np.int64)
    if lookup.keys.size:
        at = xp.clip(xp.searchsorted(xp.asarray(lookup.keys), x), 0, lookup.keys.size - 1)
        hit = xp.asarray(lookup.keys)[at] == x
        position = xp.where(hit, xp.asarray(lookup.positions)[at], position)
    if lookup.nan_position is not None:
        position = xp.where(xp.isnan(x), lookup.nan_position, position)
    return xp.asarray(table)[position]


@op("LabelEncoder", since=1, domain=ML, context=True, strings_on_host=True)
def label_encoder_v1(ctx, X, *, classes_strings=None, default_int64=-1, default_string="_Unused"):
    """ONNX-ML LabelEncoder-1: strings to their index in classes_strings, or int64 indices to
    the string there; the input type picks the direction."""
    classes = strings_array(classes_strings or (), (-1,))
    indices = np.arange(len(classes), dtype=np.int64)
    if _is_strings(X):
        return _map(ctx, X, classes, indices, default_int64)
    return _map(ctx, X, indices, classes, default_string)


def _typed(op_type: str, name: str, value):
    """A keys_*/values_* attribute as a 1-D numpy array of its ONNX type."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise ShapeError(f"{op_type}: {name} must be 1-D, got shape {list(value.shape)}")
        return value
    if name.endswith("strings"):
        return strings_array(value, (-1,))
    return np.asarray(value, np.int64 if name.endswith("int64s") else np.float32)


def _label_encoder(ctx, x, keys, values, defaults, default_tensor=None):
    op_type = ctx.node.op_type
    key_name, keys = one_of(op_type, "the keys", **keys)
    value_name, values = one_of(op_type, "the values", **values)
    keys, values = _typed(op_type, key_name, keys), _typed(op_type, value_name, values)
    if len(keys) != len(values):
        raise ShapeError(
            f"{op_type}: {key_name} has {len(keys)} entries but {value_name} has {len(values)}"
        )
    if default_tensor is not None:
        if default_tensor.size != 1 or default_tensor.dtype != values.dtype:
            raise ValueError(
                f"{op_type}: default_tensor must hold one {values.dtype} value, got "
                f"{default_tensor.dtype}{list(default_tensor.shape)}"
            )
        default = default_tensor.reshape(-1)[0]
    elif values.dtype == object:
        default = defaults["string"]
    else:
        # values_tensor without default_tensor: ONNX Runtime takes default_int64 / default_float
        # (whose own defaults, -1 and -0.0, are what the spec gives for that case).
        default = defaults["int" if np.issubdtype(values.dtype, np.integer) else "float"]
    return _map(ctx, x, keys, values, default)


@op("LabelEncoder", since=4, domain=ML, context=True, strings_on_host=True)
def label_encoder_v4(
    ctx,
    X,
    *,
    default_float=-0.0,
    default_int64=-1,
    default_string="_Unused",
    default_tensor=None,
    keys_floats=None,
    keys_int64s=None,
    keys_strings=None,
    keys_tensor=None,
    values_floats=None,
    values_int64s=None,
    values_strings=None,
    values_tensor=None,
):
    """ONNX-ML LabelEncoder-4: LabelEncoder-2 plus keys/values/default as tensors of more types."""
    return _label_encoder(
        ctx,
        X,
        dict(keys_floats=keys_floats, keys_int64s=keys_int64s, keys_strings=keys_strings,
             keys_tensor=keys_tensor),
        dict(values_floats=values_floats, values_int64s=values_int64s,
             values_strings=values_strings, values_tensor=values_tensor),
        {"float": default_float, "int": default_int64, "string": default_string},
        default_tensor,
    )  # fmt: skip


label_encoder_v2 = op(
    "LabelEncoder", since=2, domain=ML, context=True, strings_on_host=True
)(variant(
    label_encoder_v4, "label_encoder_v2",
    "ONNX-ML LabelEncoder-2: LabelEncoder-4 without the keys/values/default tensors.",
    fixed={"default_tensor": None, "keys_tensor": None, "values_tensor": None},
))  # fmt: skip


@op("CategoryMapper", since=1, domain=ML, context=True, strings_on_host=True)
def category_mapper(
    ctx, X, *, cats_int64s=None, cats_strings=None, default_int64=-1, default_string="_Unused"
):
    """ONNX-ML CategoryMapper-1: strings to int64 or int64 to strings through the parallel
    cats_strings/cats_int64s lists; the input type picks the direction."""
    strings = strings_array(cats_strings or (), (-1,))
    ints = np.asarray(cats_int64s or (), np.int64)
    if len(strings) != len(ints):
        raise ShapeError(
            f"CategoryMapper: cats_strings has {len(strings)} entries, cats_int64s {len(ints)}"
        )
    if _is_strings(X):
        return _map(ctx, X, strings, ints, default_int64)
    return _map(ctx, X, ints, strings, default_string)
