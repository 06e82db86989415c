"""Support vector machines of the ai.onnx.ml domain: SVMClassifier and SVMRegressor (libsvm and
liblinear exports, as skl2onnx writes SVC, NuSVC, SVR, NuSVR and OneClassSVM).

The kernel is one matrix product against the support vectors (RBF: the squared distances,
which XLA fuses into one reduction); the one-versus-one decision values are a second product
with a [vectors, pairs] matrix built on the host. Where the spec is silent (votes, binary
scores, the probability coupling), the ops follow ONNX Runtime's CPU kernels (svmclassifier.cc,
ml_common.h), which compute in float32 with the pairwise sums in float64.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from transmuter.errors import ShapeError
from transmuter.lowering import op
from transmuter.lowering.ops.ml import (
    ML,
    apply_post_transform,
    as_rows,
    class_labels,
)
from transmuter.lowering.shared import arg_extreme

_KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")
_HIGHEST = lax.Precision.HIGHEST  # no reduced-precision (TF32) products on accelerators


def _kernel(op_type: str, x, vectors: np.ndarray, kernel_type: str, kernel_params):
    """K(x, v) for every row and support vector: [N, V], float32."""
    if kernel_type not in _KERNELS:
        raise ValueError(f"{op_type}: kernel_type {kernel_type!r} is not one of {_KERNELS}")
    gamma, coef0, degree = (list(kernel_params or ()) + [0.0, 0.0, 0.0])[:3]
    v = jnp.asarray(vectors, jnp.float32)
    if kernel_type == "RBF":
        distance = jnp.sum(jnp.square(x[:, None, :] - v[None, :, :]), axis=-1)
        return jnp.exp(-jnp.float32(gamma) * distance)
    dot = jnp.matmul(x, v.T, precision=_HIGHEST)
    if kernel_type == "LINEAR":
        return dot
    dot = jnp.float32(gamma) * dot + jnp.float32(coef0)
    if kernel_type == "POLY":
        return dot ** int(degree) if float(degree).is_integer() else dot ** jnp.float32(degree)
    return jnp.tanh(dot)


def _features(op_type: str, x, count: int):
    x = as_rows(op_type, x).astype(jnp.float32)  # ONNX Runtime computes in float32
    if x.shape[1] != count:
        raise ShapeError(f"{op_type}: X has {x.shape[1]} features, the model {count}")
    return x


def _logistic(v):
    # ONNX Runtime's ComputeLogistic: 1 / (1 + exp(-|v|)), mirrored for negative v.
    positive = 1 / (1 + jnp.exp(-jnp.abs(v)))
    return jnp.where(v < 0, 1 - positive, positive)


def _coupling(r, k: int, iterations: int = 100):
    """Class probabilities [N, k] from pairwise ones r [N, k, k] (Wu, Lin and Weng 2004, as
    libsvm and ONNX Runtime's multiclass_probability iterate it, in float32, per row stopping
    once the error is under 0.005 / k)."""
    q = [[None] * k for _ in range(k)]
    for i in range(k):
        diagonal = jnp.zeros(r.shape[0], jnp.float32)
        for j in range(k):
            if j != i:
                diagonal = diagonal + r[:, j, i] * r[:, j, i]
                q[i][j] = -r[:, j, i] * r[:, i, j] if j > i else q[j][i]
        q[i][i] = diagonal
    eps = jnp.float32(0.005 / k)

    def products(p):
        qp = []
        pqp = jnp.zeros(r.shape[0], jnp.float32)
        for i in range(k):
            total = jnp.zeros(r.shape[0], jnp.float32)
            for j in range(k):
                total = total + q[i][j] * p[j]
            qp.append(total)
            pqp = pqp + p[i] * total
        return qp, pqp

    def sweep(_, state):
        p, done = state
        qp, pqp = products(p)
        error = jnp.max(jnp.stack([jnp.abs(v - pqp) for v in qp]), axis=0)
        done = done | (error < eps)
        new = list(p)
        for i in range(k):
            diff = (-qp[i] + pqp) / q[i][i]
            new[i] = new[i] + diff
            pqp = (pqp + diff * (diff * q[i][i] + 2 * qp[i])) / (1 + diff) / (1 + diff)
            for j in range(k):
                qp[j] = (qp[j] + diff * q[i][j]) / (1 + diff)
                new[j] = new[j] / (1 + diff)
        return [jnp.where(done, a, b) for a, b in zip(p, new)], done

    start = [jnp.full(r.shape[0], 1 / k, jnp.float32) for _ in range(k)]
    p, _ = lax.fori_loop(0, iterations, sweep, (start, jnp.zeros(r.shape[0], bool)))
    return jnp.stack(p, axis=1)


@op("SVMClassifier", since=1, domain=ML, context=True, strings_on_host=True)
def svm_classifier(
    ctx,
    X,
    *,
    classlabels_ints=None,
    classlabels_strings=None,
    coefficients=None,
    kernel_params=None,
    kernel_type="LINEAR",
    post_transform="NONE",
    prob_a=None,
    prob_b=None,
    rho=None,
    support_vectors=None,
    vectors_per_class=None,
):
    """ONNX-ML SVMClassifier-1: one-versus-one votes over the support vectors (or liblinear
    scores), with Platt-coupled probabilities when prob_a / prob_b are given."""
    op_type = "SVMClassifier"
    labels, X = class_labels(
        ctx, op_type, X, classlabels_ints=classlabels_ints, classlabels_strings=classlabels_strings
    )
    classes = len(labels)
    coefs = np.asarray(coefficients or (), np.float32)
    rho = np.asarray(rho or (), np.float32)
    prob_a, prob_b = (np.asarray(p or (), np.float32) for p in (prob_a, prob_b))
    if classes < 2 or not coefs.size or not rho.size or prob_a.size != prob_b.size:
        raise ValueError(
            f"{op_type}: needs 2+ class labels (got {classes}), coefficients and rho, and as "
            f"many prob_a as prob_b values (got {prob_a.size}, {prob_b.size})"
        )
    per_class = np.asarray(vectors_per_class or (), np.int64)
    vectors = int(per_class.sum())
    if vectors == 0:
        best, scores = _liblinear(op_type, X, coefs, rho, classes, kernel_type, post_transform)
    else:
        if per_class.size != classes:
            raise ShapeError(
                f"{op_type}: vectors_per_class has {per_class.size} entries for {classes} classes"
            )
        best, scores = _libsvm(
            op_type, X, coefs, rho, per_class, np.asarray(support_vectors or (), np.float32),
            kernel_type, kernel_params, post_transform, prob_a, prob_b,
        )  # fmt: skip
    if labels.dtype == object:
        return labels[np.asarray(best)], scores
    return jnp.asarray(labels)[best], scores


def _liblinear(op_type, X, coefs, rho, classes, kernel_type, post_transform):
    """No support vectors: one linear score per class, x . w_c + rho[0] (ONNX Runtime adds the
    first rho to every class)."""
    if coefs.size % classes:
        raise ShapeError(f"{op_type}: {coefs.size} coefficients do not split into {classes} rows")
    weights = coefs.reshape(classes, -1)
    x = _features(op_type, X, weights.shape[1])
    scores = jnp.matmul(x, jnp.asarray(weights.T), precision=_HIGHEST) + rho[0]
    best = arg_extreme(scores, 1)  # not jnp.argmax (see arg_extreme)
    if classes == 2:
        # ONNX Runtime's ChooseClass without probabilities.
        high = jnp.max(scores, axis=1)
        second = (high >= 0.5) if bool((coefs >= 0).all()) else (high > 0)
        best = jnp.where(second, 1, best)
    return best, apply_post_transform(op_type, scores, post_transform).astype(jnp.float32)


def _libsvm(op_type, X, coefs, rho, per_class, vectors, kernel_type, kernel_params,
            post_transform, prob_a, prob_b):  # fmt: skip
    classes = per_class.size
    count = int(per_class.sum())
    pairs = classes * (classes - 1) // 2
    if vectors.size % count or coefs.size < (classes - 1) * count or rho.size < pairs:
        raise ShapeError(
            f"{op_type}: support_vectors ({vectors.size}), coefficients ({coefs.size}) or rho "
            f"({rho.size}) do not fit {count} vectors in {classes} classes"
        )
    if prob_a.size and prob_a.size < pairs:
        raise ShapeError(f"{op_type}: prob_a / prob_b need {pairs} values, got {prob_a.size}")
    vectors = vectors.reshape(count, -1)
    x = _features(op_type, X, vectors.shape[1])
    kernel = _kernel(op_type, x, vectors, kernel_type, kernel_params)
    coefs = coefs[: (classes - 1) * count].reshape(classes - 1, count)
    start = np.concatenate([[0], np.cumsum(per_class)[:-1]])
    # Pair (i, j), i < j, in libsvm's order: class i's vectors weighted by row j - 1 of the
    # coefficients and class j's by row i.
    mix = np.zeros((count, pairs), np.float64)
    first, second = [], []
    pairings = [(i, j) for i in range(classes) for j in range(i + 1, classes)]
    for p, (i, j) in enumerate(pairings):
        for c, row in ((i, j - 1), (j, i)):
            span = slice(start[c], start[c] + per_class[c])
            mix[span, p] = coefs[row, span]
        first.append(i)
        second.append(j)
    # ONNX Runtime sums each pair in float64 and rounds once.
    decision = jnp.matmul(kernel.astype(jnp.float64), jnp.asarray(mix), precision=_HIGHEST)
    decision = (decision + rho[:pairs].astype(np.float64)).astype(jnp.float32)
    wins = decision > 0
    won = wins.astype(jnp.int32)
    votes = won @ jax.nn.one_hot(first, classes, dtype=jnp.int32) + (1 - won) @ jax.nn.one_hot(
        second, classes, dtype=jnp.int32
    )
    best = arg_extreme(votes, 1)  # the first class with the most votes
    if prob_a.size:
        pairwise = 1 - _logistic(decision * prob_a[:pairs] + prob_b[:pairs])
        pairwise = jnp.clip(pairwise, np.float32(1e-7), np.float32(1 - 1e-7))
        r = jnp.zeros((x.shape[0], classes, classes), jnp.float32)
        r = r.at[:, first, second].set(pairwise).at[:, second, first].set(1 - pairwise)
        scores = apply_post_transform(op_type, _coupling(r, classes), post_transform)
        return best, scores.astype(jnp.float32)
    if pairs == 1:
        # One decision value s: ONNX Runtime writes [-s, s] with NONE, [1 - p, p] with p its
        # logistic for LOGISTIC, else [1 - s, s] (a PROBIT score fills the first column only;
        # Transmuter writes 0 in the second).
        s = decision[:, 0]
        if post_transform == "NONE":
            return best, jnp.stack([-s, s], axis=1)
        if post_transform == "LOGISTIC":
            s = _logistic(s)
        if post_transform == "PROBIT":
            probit = apply_post_transform(op_type, s, "PROBIT")
            return best, jnp.stack([probit, jnp.zeros_like(s)], axis=1).astype(jnp.float32)
        return best, jnp.stack([1 - s, s], axis=1)
    return best, apply_post_transform(op_type, decision, post_transform).astype(jnp.float32)


@op("SVMRegressor", since=1, domain=ML)
def svm_regressor(
    X,
    *,
    coefficients=None,
    kernel_params=None,
    kernel_type="LINEAR",
    n_supports=0,
    one_class=0,
    post_transform="NONE",
    rho=None,
    support_vectors=None,
):
    """ONNX-ML SVMRegressor-1: sum_v coef_v K(x, v) + rho (or x . coef + rho without support
    vectors); one_class gives +1 / -1 by the sign."""
    op_type = "SVMRegressor"
    coefs = np.asarray(coefficients or (), np.float32)
    rho = np.asarray(rho or (), np.float32)
    if not coefs.size or not rho.size:
        raise ValueError(f"{op_type}: coefficients and rho are required")
    if n_supports > 0:
        vectors = np.asarray(support_vectors or (), np.float32)
        if vectors.size % n_supports or coefs.size != n_supports:
            raise ShapeError(
                f"{op_type}: {vectors.size} support_vector values and {coefs.size} coefficients "
                f"for n_supports={n_supports}"
            )
        vectors = vectors.reshape(n_supports, -1)
        x = _features(op_type, X, vectors.shape[1])
        kernel = _kernel(op_type, x, vectors, kernel_type, kernel_params)
        y = jnp.matmul(kernel, jnp.asarray(coefs)[:, None], precision=_HIGHEST) + rho[0]
    else:
        x = _features(op_type, X, coefs.size)
        y = jnp.matmul(x, jnp.asarray(coefs)[:, None], precision=_HIGHEST) + rho[0]
    if one_class:
        y = jnp.where(y > 0, 1.0, -1.0).astype(jnp.float32)
    # ONNX Runtime ignores post_transform here; the spec applies it, and so does Transmuter.
    return apply_post_transform(op_type, y, post_transform).astype(jnp.float32)
