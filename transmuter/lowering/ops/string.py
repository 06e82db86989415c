"""String operators: StringNormalizer, StringConcat, StringSplit and RegexFullMatch.

String tensors are numpy object arrays of Python `str` and live on the host (DESIGN.md), so these
ops take and return numpy arrays; they never reach the device. A node whose inputs are all host
values runs on the host under `transmuter.compile` too, so they need no graph break of their own.
"""

from __future__ import annotations

import functools
import re

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
