"""String operators: StringNormalizer, StringConcat, StringSplit and RegexFullMatch.

String tensors are numpy object arrays of Python `str` and live on the host (DESIGN.md), so these
ops take and return numpy arrays; they never reach the device. A node whose inputs are all host
values runs on the host under `transmuter.compile` too, so they need no graph break of their own.
TfIdfVectorizer also takes integer tokens: those may be device arrays; only its attributes (the
n-gram pool) are prepared on the host.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from transmuter.errors import ShapeError
from transmuter.lowering import op


def _strings(values: list[str], shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(shape)


# ----------------------------------------------------------------------------- case mapping
# ONNX Runtime changes case one character at a time with the C++ `towlower`/`towupper` of the
# node's locale (glibc on Linux). Python's str.lower/upper apply the full Unicode mappings instead
# (ß -> SS, final sigma, İ -> i + combining dot). The per-character rules below reproduce
# glibc's tables exactly (checked with glibc 2.36 against every cased code point, for
# en_US.UTF-8, de_DE.UTF-8 and C.UTF-8): Python's mapping where it is one character; where it
# is longer, the simple mapping, which is the titlecase form for upper case (ᾳ -> ᾼ), "i" for
# İ, and otherwise the character itself.


@functools.lru_cache(maxsize=4096)
def _lower_char(c: str) -> str:
    lower = c.lower()
    if len(lower) == 1:
        return lower
    return "i" if c == "\u0130" else c


@functools.lru_cache(maxsize=4096)
def _upper_char(c: str) -> str:
    upper = c.upper()
    if len(upper) == 1:
        return upper
    title = c.title()
    return title if len(title) == 1 else c


# glibc locales whose LC_CTYPE copies tr_TR: I <-> ı and İ <-> i.
_TURKIC_LANGUAGES = ("tr", "az", "crh")
_TURKIC_LOCALES = ("ku_TR", "tt_RU@iqtelif")
_TURKIC_LOWER = str.maketrans({"I": "\u0131"})
_TURKIC_UPPER = str.maketrans({"i": "\u0130"})
_ASCII_LOWER = str.maketrans({chr(c): chr(c + 32) for c in range(ord("A"), ord("Z") + 1)})
_ASCII_UPPER = str.maketrans({chr(c + 32): chr(c) for c in range(ord("A"), ord("Z") + 1)})


class _CaseMapping:
    """Lower and upper case as ONNX Runtime's `locale` gives them: ASCII only for "C"/"POSIX",
    Turkic dotted/dotless i for Turkish-like locales, Unicode simple case mapping otherwise.

    An absent locale is ONNX Runtime's default, en_US.UTF-8. Other locale names all share the
    Unicode tables in glibc; ONNX Runtime fails when the named locale is not installed, which a
    pure-Python mapping does not need. "" (the process environment's locale there) is taken as
    a UTF-8 one.
    """

    def __init__(self, locale: str | None):
        name = re.sub(r"\.[^@]*", "", locale or "")  # drop the codeset: tr_TR.UTF-8 -> tr_TR
        self.ascii = locale in ("C", "POSIX")
        language = re.split(r"[_@]", name)[0]
        self.turkic = language in _TURKIC_LANGUAGES or name in _TURKIC_LOCALES

    def lower(self, s: str) -> str:
        if self.ascii:
            return s.translate(_ASCII_LOWER)
        if self.turkic:
            s = s.translate(_TURKIC_LOWER)
        return s.lower() if s.isascii() else "".join(map(_lower_char, s))

    def upper(self, s: str) -> str:
        if self.ascii:
            return s.translate(_ASCII_UPPER)
        if self.turkic:
            s = s.translate(_TURKIC_UPPER)
        return s.upper() if s.isascii() else "".join(map(_upper_char, s))


# ---------------------------------------------------------------------------------- operators


@op("StringNormalizer", since=10, data_dependent=True)
def string_normalizer(
    X, *, case_change_action="NONE", is_case_sensitive=0, locale=None, stopwords=None
):
    """ONNX StringNormalizer-10: drop stopwords from a [C] or [1, C] tensor, then change case."""
    shape = tuple(X.shape)
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[0] != 1) or shape[-1] == 0:
        # The schema's shape inference and ONNX Runtime both require C > 0.
        raise ShapeError(f"StringNormalizer input X must be [C] or [1, C] with C > 0, got {shape}")
    if case_change_action not in ("NONE", "LOWER", "UPPER"):
        raise ValueError(
            f"StringNormalizer case_change_action must be NONE, LOWER or UPPER, "
            f"got {case_change_action!r}"
        )
    cases = _CaseMapping(locale)
    words = X.reshape(-1).tolist()
    if stopwords:
        if is_case_sensitive:
            stop = set(stopwords)
            words = [w for w in words if w not in stop]
        else:
            stop = {cases.lower(w) for w in stopwords}
            words = [w for w in words if cases.lower(w) not in stop]
    if case_change_action == "LOWER":
        words = [cases.lower(w) for w in words]
    elif case_change_action == "UPPER":
        words = [cases.upper(w) for w in words]
    if not words:  # the spec: everything dropped gives one empty string, rank kept
        words = [""]
    return _strings(words, shape[:-1] + (len(words),))


@op("StringConcat", since=20)
def string_concat(X, Y):
    """ONNX StringConcat-20: element-wise X + Y with numpy broadcasting."""
    try:
        shape = np.broadcast_shapes(X.shape, Y.shape)
    except ValueError:
        raise ShapeError(
            f"StringConcat inputs X {list(X.shape)} and Y {list(Y.shape)} do not broadcast"
        ) from None
    out = np.empty(shape, dtype=object)
    np.add(X, Y, out=out)
    return out


@op("StringSplit", since=20, data_dependent=True)
def string_split(X, *, delimiter=None, maxsplit=None):
    """ONNX StringSplit-20: substrings padded with "" in a new last axis, and int64 counts."""
    # The spec is Python's str.split (its wording is str.split's documentation), with two
    # points made explicit. ONNX Runtime 1.32 differs in both of these, and onnx.reference in
    # the second:
    # - no delimiter (or ""): runs of whitespace separate, and leading *and trailing* whitespace
    #   is removed even from the unsplit rest after `maxsplit` splits (str.split keeps trailing
    #   whitespace there, onnx.reference too). "Whitespace" is Python's (str.isspace); ONNX
    #   Runtime splits on the space character only.
    # - with a delimiter, "" gives one empty substring, as str.split does; ONNX Runtime gives
    #   none.
    # A negative maxsplit means no limit, as in Python and ONNX Runtime.
    limit = -1 if maxsplit is None or maxsplit < 0 else maxsplit
    flat = X.reshape(-1).tolist()
    if delimiter:
        parts = [s.split(delimiter, limit) for s in flat]
    else:
        parts = [s.strip().split(None, limit) for s in flat]
    counts = [len(p) for p in parts]
    width = max(counts, default=0)
    substrings = np.full((len(parts), width), "", dtype=object)
    for row, part in zip(substrings, parts):
        row[: len(part)] = part
    shape = tuple(X.shape)
    return substrings.reshape(shape + (width,)), np.array(counts, dtype=np.int64).reshape(shape)


# RE2 (the syntax the spec names) and Python's `re` agree on most patterns; where they differ:
# - \d \w \s \b are ASCII in RE2, Unicode in Python: patterns compile with re.ASCII. That also
#   makes Python's (?i) fold ASCII letters only, where RE2 folds all of Unicode ((?i)é does not
#   match "É" here). RE2's \s lacks \v, Python's ASCII \s has it.
# - POSIX classes ([[:alpha:]]) are RE2 syntax that Python reads as a plain set: rejected.
# - RE2-only syntax that Python rejects (\pL, \p{Greek}, \Q..\E, \C, \z before Python 3.14,
#   (?U), (?<name>...)) is an error.
# - Python accepts what RE2 rejects (backreferences, lookaround, atomic groups, possessive
#   quantifiers); ONNX Runtime refuses such a model, here it runs.
# - $ without (?m) also matches before a final "\n" in Python, only at the very end in RE2; it
#   makes a difference only for a pattern that goes on to match that "\n" after the $.
_POSIX_CLASS = re.compile(
    r"\[:\^?(alnum|alpha|ascii|blank|cntrl|digit|graph|lower|print|punct|space|upper|word"
    r"|xdigit):\]"
)


@functools.lru_cache(maxsize=64)
def _compile_re2(pattern: str) -> re.Pattern:
    posix = _POSIX_CLASS.search(pattern)
    if posix:
        raise ValueError(
            f"RegexFullMatch pattern {pattern!r} uses the POSIX class {posix.group()!r}, which "
            "Python's re module (used here for RE2 patterns) does not support; write the set "
            "out, e.g. [a-zA-Z] for [:alpha:]"
        )
    try:
        return re.compile(pattern, re.ASCII)
    except re.error as exc:
        raise ValueError(
            f"RegexFullMatch pattern {pattern!r} is not valid for Python's re module ({exc}). "
            "ONNX specifies RE2 syntax, which is matched here with Python's re: RE2-only "
            "syntax such as \\p{...} classes, \\Q...\\E, \\C, \\z and (?U) is not supported"
        ) from None


@op("RegexFullMatch", since=20)
def regex_full_match(X, *, pattern=None):
    """ONNX RegexFullMatch-20: whether each string fully matches the RE2 `pattern` (bool)."""
    if pattern is None:
        raise ValueError("RegexFullMatch needs its pattern attribute")
    regex = _compile_re2(pattern)
    matches = (regex.fullmatch(s) is not None for s in X.reshape(-1).tolist())
    return np.fromiter(matches, dtype=np.bool_, count=X.size).reshape(X.shape)


# ------------------------------------------------------------------------------------ n-grams
# The pool's n-grams form a trie kept as sorted arrays, one level per n-gram length, so that the
# walk runs on the device for integer tokens. A token's code is 1 + its rank among the pool's
# tokens (0: not in the pool). A node at level 1 is numbered by its token's code; a node at level
# d > 1 by 1 + the rank of its key, parent * base + code, among that level's keys (0: no node).
# Keys stay below (pool size + 1)^2, so they fit in int64 for any pool.


@dataclass(frozen=True)
class _NgramTrie:
    tokens: dict | np.ndarray  # str -> code for string pools; sorted int64 tokens otherwise
    base: int
    keys: tuple[np.ndarray, ...]  # level d (d >= 2) at index d - 2: sorted int64 node keys
    slots: tuple[np.ndarray, ...]  # level d at d - 1: node -> its n-gram's slot (or `grams`)
    coordinates: np.ndarray  # slot -> output coordinate
    numbers: np.ndarray  # slot -> position of the n-gram in the pool (indexes `weights`)
    size: int  # the output length, max(ngram_indexes) + 1

    @property
    def grams(self) -> int:
        return len(self.numbers)


@functools.lru_cache(maxsize=32)
def _ngram_trie(strings, pool, ngram_counts, ngram_indexes, min_gram_length, max_gram_length):
    bounds = (*ngram_counts, len(pool))
    if any(not 0 <= a <= b <= len(pool) for a, b in zip(bounds, bounds[1:])):
        raise ValueError(
            f"TfIdfVectorizer ngram_counts {list(ngram_counts)} must be non-decreasing starts "
            f"into the pool of {len(pool)} items"
        )
    grams: dict[tuple, int] = {}  # n-gram -> its position among the pool's n-grams
    number = 0
    for length, (start, end) in enumerate(zip(bounds, bounds[1:]), start=1):
        count = (end - start) // length
        if number + count > len(ngram_indexes):
            raise ShapeError(
                f"TfIdfVectorizer ngram_indexes has {len(ngram_indexes)} entries, fewer than the "
                f"{number + count} n-grams in the pool"
            )
        if min_gram_length <= length <= max_gram_length:
            for i in range(count):
                gram = tuple(pool[start + i * length : start + (i + 1) * length])
                if gram in grams:  # onnx.reference counts it once, at the last; ORT refuses
                    raise ValueError(f"TfIdfVectorizer pool holds the n-gram {gram} twice")
                grams[gram] = number + i
        number += count
    vocab = sorted({token for gram in grams for token in gram})
    code = {token: c for c, token in enumerate(vocab, start=1)}
    coded = [tuple(code[t] for t in gram) for gram in grams]
    base = len(vocab) + 1
    node = {(c,): c for c in range(1, base)}  # coded prefix -> its node number at its level
    keys = []
    for level in range(2, max(map(len, coded), default=0) + 1):
        keyed = {
            g[:level]: node[g[: level - 1]] * base + g[level - 1] for g in coded if len(g) >= level
        }
        level_keys = np.unique(np.fromiter(keyed.values(), dtype=np.int64, count=len(keyed)))
        rank = {int(k): n for n, k in enumerate(level_keys, start=1)}
        node.update({prefix: rank[key] for prefix, key in keyed.items()})
        keys.append(level_keys)
    slots = [np.full(base, len(coded), dtype=np.int64)]
    slots += [np.full(len(k) + 1, len(coded), dtype=np.int64) for k in keys]
    for slot, gram in enumerate(coded):
        slots[len(gram) - 1][node[gram]] = slot
    numbers = np.fromiter(grams.values(), dtype=np.int64, count=len(grams))
    return _NgramTrie(
        tokens=code if strings else np.array(vocab, dtype=np.int64),
        base=base,
        keys=tuple(keys),
        slots=tuple(slots),
        coordinates=np.asarray(ngram_indexes, dtype=np.int64)[numbers],
        numbers=numbers,
        size=max(ngram_indexes) + 1,
    )


def _add_at(xp, target, index: tuple, values):
    """`target` plus `values` added at `index`, repeated indices accumulating."""
    if xp is np:
        np.add.at(target, index, values)
        return target
    return target.at[index].add(values)


def _token_codes(xp, trie: _NgramTrie, X):
    if isinstance(trie.tokens, dict):
        flat = [trie.tokens.get(s, 0) for s in X.reshape(-1).tolist()]
        return np.array(flat, dtype=np.int64).reshape(X.shape)
    if not trie.tokens.size:
        return xp.zeros(X.shape, np.int64)
    x, tokens = X.astype(np.int64), xp.asarray(trie.tokens)
    rank = xp.minimum(xp.searchsorted(tokens, x), tokens.size - 1).astype(np.int64)
    return xp.where(tokens[rank] == x, rank + 1, 0)


def _ngram_counts(xp, trie: _NgramTrie, codes, min_gram_length, max_gram_length, max_skip_count):
    """Occurrences of each pool n-gram (by slot) in each row of token codes: int32 [rows, grams]."""
    rows, length = codes.shape
    depth = min(max_gram_length, len(trie.slots))
    skips = max_skip_count if depth >= 2 else 0
    # Tokens past the row end read as code 0, which no n-gram contains.
    codes = xp.pad(codes, ((0, 0), (0, (depth - 1) * (skips + 1))))
    # Walk every skip at once: axis 1 is the skip, level d reads the token (d - 1) * (skip + 1)
    # after each start. Level 1 is the same for all skips, so unigrams count once.
    steps = xp.arange(1, skips + 2)[:, None]
    starts = xp.arange(length)[None, :]  # xp: the length may be a symbolic dim when exporting
    nodes = codes[:, None, :length]
    found = []
    for level in range(1, depth + 1):
        if level > 1:
            keys = xp.asarray(trie.keys[level - 2])
            key = nodes * trie.base + codes[:, starts + (level - 1) * steps]
            rank = xp.minimum(xp.searchsorted(keys, key), keys.size - 1).astype(np.int64)
            nodes = xp.where(keys[rank] == key, rank + 1, 0)
        if level >= min_gram_length:
            slots = xp.asarray(trie.slots[level - 1])[nodes]
            found.append(slots.reshape(rows, nodes.shape[1] * length))
    counts = xp.zeros((rows, trie.grams + 1), np.int32)  # the last column collects the misses
    if found:
        slots = xp.concatenate(found, axis=1)
        row = xp.broadcast_to(xp.arange(rows)[:, None], slots.shape)
        counts = _add_at(xp, counts, (row, slots), 1)
    return counts[:, : trie.grams]


@op("TfIdfVectorizer", since=9)
def tf_idf_vectorizer(
    X,
    *,
    max_gram_length,
    max_skip_count,
    min_gram_length,
    mode,
    ngram_counts,
    ngram_indexes,
    pool_int64s=None,
    pool_strings=None,
    weights=None,
):
    """ONNX TfIdfVectorizer-9: counts of pool n-grams (with skips) in each row, TF/IDF-weighted."""
    strings = isinstance(X, np.ndarray) and X.dtype == object
    pool = pool_strings if strings else pool_int64s
    if (pool_strings is None) == (pool_int64s is None) or pool is None:
        raise ValueError(
            "TfIdfVectorizer needs exactly one of pool_strings and pool_int64s, matching its "
            f"{'string' if strings else 'integer'} input"
        )
    if mode not in ("TF", "IDF", "TFIDF"):
        raise ValueError(f"TfIdfVectorizer mode must be TF, IDF or TFIDF, got {mode!r}")
    if not 1 <= min_gram_length <= max_gram_length or max_skip_count < 0:
        raise ValueError(
            "TfIdfVectorizer needs 1 <= min_gram_length <= max_gram_length and max_skip_count "
            f">= 0; got {min_gram_length}, {max_gram_length} and {max_skip_count}"
        )
    if not ngram_indexes or min(ngram_indexes) < 0:
        raise ValueError(
            f"TfIdfVectorizer ngram_indexes must be non-empty and non-negative; got {ngram_indexes}"
        )
    if weights and len(weights) != len(ngram_indexes):
        raise ShapeError(
            f"TfIdfVectorizer weights has {len(weights)} values; it needs one per n-gram of the "
            f"pool, as ngram_indexes has ({len(ngram_indexes)})"
        )
    if X.ndim not in (1, 2):
        raise ShapeError(f"TfIdfVectorizer input X must be [C] or [N, C]; got {list(X.shape)}")
    trie = _ngram_trie(
        strings,
        tuple(pool),
        tuple(ngram_counts),
        tuple(ngram_indexes),
        min_gram_length,
        max_gram_length,
    )
    weights = weights if mode != "TF" else None  # TF counts, unweighted
    if mode == "IDF" and weights and len(set(trie.coordinates.tolist())) < trie.grams:
        # ONNX Runtime writes the weight of the n-gram found last in the row there.
        raise ValueError(
            "TfIdfVectorizer in IDF mode with weights needs one output coordinate per pool "
            "n-gram: the spec leaves the weight of a coordinate shared by several undefined"
        )
    # Host tokens (strings, constants) are counted with numpy: no XLA dispatch per step.
    xp = np if isinstance(X, np.ndarray) else jnp
    rows, length = X.shape[0] if X.ndim == 2 else 1, X.shape[-1]
    codes = _token_codes(xp, trie, X.reshape(rows, length))
    counts = _ngram_counts(xp, trie, codes, min_gram_length, max_gram_length, max_skip_count)
    if mode == "IDF":
        counts = xp.minimum(counts, 1)
    # weights[i] scales the i-th n-gram of the pool, as the spec says and ONNX Runtime does;
    # onnx.reference reads weights[c] for output coordinate c instead.
    scale = np.asarray(weights if weights else np.ones(len(ngram_indexes)), np.float32)
    values = counts.astype(np.float32) * xp.asarray(scale[trie.numbers])
    y = xp.zeros((rows, trie.size), np.float32)
    y = _add_at(xp, y, (slice(None), trie.coordinates), values)
    if mode == "IDF" and not weights:
        y = xp.minimum(y, np.float32(1))  # a coordinate that several found n-grams share is 1
    return y.reshape(-1) if X.ndim == 1 else y
