"""String operators against ONNX Runtime, and onnx.reference where the spec sides with it."""

import locale

import numpy as np
import pytest
from onnx import TensorProto, helper
from opcheck import (
    assert_close,
    check_node,
    make_node_model,
    ort_run,
    reference_run,
    transmuter_runs,
)

import transmuter
from transmuter.errors import TransmuterError


def strings(*values):
    return np.array(values, dtype=object)


def _has_locale(name: str) -> bool:
    """ONNX Runtime builds the C++ locale of StringNormalizer's `locale` attribute (en_US.UTF-8
    when absent) as soon as it changes case or compares without case, and fails when that locale
    is not installed on the machine (Debian: the `locales` package and locale-gen)."""
    saved = locale.setlocale(locale.LC_CTYPE)
    try:
        locale.setlocale(locale.LC_CTYPE, name)
        return True
    except locale.Error:
        return False
    finally:
        locale.setlocale(locale.LC_CTYPE, saved)


def needs_locale(name):
    return pytest.mark.skipif(
        not _has_locale(name), reason=f"ONNX Runtime needs the {name} locale installed"
    )


def expect(op_type, inputs, attrs, expected, *, opset=20, outputs=1):
    """Transmuter's outputs (eager and compiled) against values written out in the test."""
    model = make_node_model(op_type, inputs, attrs, opset=opset, outputs=outputs)
    for mode, got in transmuter_runs(model, inputs).items():
        for i, (g, want) in enumerate(zip(got, expected, strict=True)):
            assert_close(g, want, rtol=0, atol=0, what=f"{op_type} output {i} ({mode})")


def raises(op_type, inputs, attrs, match, *, opset=20, outputs=1):
    model = make_node_model(op_type, inputs, attrs, opset=opset, outputs=outputs)
    with pytest.raises(TransmuterError, match=match):
        transmuter_runs(model, inputs, compiled=False)


# ------------------------------------------------------------------------- StringNormalizer

# Case changes beyond ASCII: ß and ﬁ keep their case (no one-character upper case), İ lowers to
# i, final sigma is σ, ᾳ uppers to its titlecase ᾼ, ǅ has both a lower and an upper form.
WORDS = strings("Monday", "tuesday", "Ärger", "straße", "İstanbul", "ΣΊΣΥΦΟΣ", "ǅemal", "ﬁ", "ᾳ")
STOPWORDS = ["monday", "ärger", "ΣΊΣΥΦΟΣ", "İSTANBUL"]


@pytest.mark.parametrize("action", ["NONE", "LOWER", "UPPER"])
@pytest.mark.parametrize("case_sensitive", [0, 1])
@pytest.mark.parametrize("stopwords", [None, STOPWORDS])
@pytest.mark.parametrize("rank", [1, 2])
def test_string_normalizer(action, case_sensitive, stopwords, rank):
    attrs = {"case_change_action": action, "is_case_sensitive": case_sensitive}
    if stopwords:
        attrs["stopwords"] = stopwords
    # C.UTF-8 ships with glibc, so ONNX Runtime can build it on any machine.
    attrs["locale"] = "C.UTF-8"
    x = WORDS if rank == 1 else WORDS[None]
    check_node("StringNormalizer", {"X": x}, attrs, opset=10)


@pytest.mark.parametrize("locale_name", ["C", "POSIX"])
def test_string_normalizer_ascii_locales(locale_name):
    for action in ["LOWER", "UPPER"]:
        attrs = {"case_change_action": action, "locale": locale_name, "stopwords": ["ÄRGER"]}
        check_node("StringNormalizer", {"X": WORDS}, attrs, opset=10)


@pytest.mark.parametrize("action", ["LOWER", "UPPER"])
def test_string_normalizer_default_locale_ascii(action):
    # onnx.reference changes case with Python's str methods (and strips accents, so ASCII
    # only), and gives a numpy "<U" array; ONNX Runtime's default locale may be missing, see
    # the test below.
    x = strings("Monday", "tuesday", "WEDNESDAY", "the")
    attrs = {"case_change_action": action, "stopwords": ["THE", "monday"]}
    model = make_node_model("StringNormalizer", {"X": x}, attrs, opset=10)
    want = reference_run(model, {"X": x})[0].astype(object)
    expect("StringNormalizer", {"X": x}, attrs, [want], opset=10)


@needs_locale("en_US.UTF-8")
@pytest.mark.parametrize("action", ["NONE", "LOWER", "UPPER"])
def test_string_normalizer_default_locale(action):
    attrs = {"case_change_action": action, "stopwords": STOPWORDS}
    check_node("StringNormalizer", {"X": WORDS}, attrs, opset=10)


TURKISH = strings("Istanbul", "istanbul", "İzmir", "ırmak", "KILIÇ")


@needs_locale("tr_TR.UTF-8")
@pytest.mark.parametrize("action", ["LOWER", "UPPER"])
def test_string_normalizer_turkish_locale(action):
    attrs = {"case_change_action": action, "locale": "tr_TR.UTF-8", "stopwords": ["ISTANBUL"]}
    check_node("StringNormalizer", {"X": TURKISH}, attrs, opset=10)


@pytest.mark.parametrize("locale_name", ["tr_TR.UTF-8", "az_AZ", "tt_RU.UTF-8@iqtelif"])
def test_string_normalizer_turkish_values(locale_name):
    # What ONNX Runtime gives with tr_TR.UTF-8 installed: I <-> ı and İ <-> i.
    attrs = {"locale": locale_name, "stopwords": ["ISTANBUL"]}
    lower = strings("istanbul", "izmir", "ırmak", "kılıç")
    upper = strings("İSTANBUL", "İZMİR", "IRMAK", "KILIÇ")
    x = {"X": TURKISH}
    expect("StringNormalizer", x, {**attrs, "case_change_action": "LOWER"}, [lower], opset=10)
    expect("StringNormalizer", x, {**attrs, "case_change_action": "UPPER"}, [upper], opset=10)


@pytest.mark.parametrize("rank", [1, 2])
def test_string_normalizer_all_dropped(rank):
    # Everything dropped gives one empty string: [1], or [1, 1] for a [1, C] input.
    x = strings("a", "B", "a") if rank == 1 else strings(["a", "B", "a"])
    attrs = {"stopwords": ["A", "b"], "locale": "C.UTF-8"}
    out = check_node("StringNormalizer", {"X": x}, attrs, opset=10)
    assert out[0].shape == (1,) * rank


@pytest.mark.parametrize(
    "x",
    [strings(["a"], ["b"]), np.zeros(0, object), np.zeros((1, 0), object), np.array("a", object)],
)
def test_string_normalizer_bad_shapes_raise(x):
    raises("StringNormalizer", {"X": x}, {}, r"\[C\] or \[1, C\] with C > 0", opset=10)


def test_string_normalizer_bad_action_raises():
    raises(
        "StringNormalizer", {"X": strings("a")}, {"case_change_action": "TITLE"}, "TITLE", opset=10
    )


# ----------------------------------------------------------------------------- StringConcat


@pytest.mark.parametrize(
    "x, y",
    [
        (strings("abc", "def"), strings(".com", ".net")),
        (strings("cat", "dog", "snake"), strings("s")),
        (np.array("cat", object), np.array("s", object)),
        (strings("abc", ""), strings("", "abc")),
        (strings("的", "中"), strings("的", "中")),
        (strings(["a"], ["bb"]), strings("x", "y", "é")),  # both sides broadcast
        (np.array("pre-", object), strings(["x", "y"], ["z", "w"])),
        (np.zeros((0, 2), object), strings("x", "y")),
    ],
)
def test_string_concat(x, y):
    check_node("StringConcat", {"X": x, "Y": y}, opset=20)


def test_string_concat_mismatched_shapes_raise():
    raises("StringConcat", {"X": strings("a", "b"), "Y": strings("x", "y", "z")}, {}, "broadcast")


# ------------------------------------------------------------------------------ StringSplit

SENTENCES = strings(
    "a,b,,c", ",", "  hello   world  ", "a  b", "no", "x,y,z,w", "the quick brown fox", "o-n--x-"
)


@pytest.mark.parametrize("delimiter", [None, "", ",", "-", ", ", "  "])
@pytest.mark.parametrize("maxsplit", [None, 0, 1, 2, -1])
def test_string_split(delimiter, maxsplit):
    attrs = {}
    if delimiter is not None:
        attrs["delimiter"] = delimiter
    if maxsplit is not None:
        attrs["maxsplit"] = maxsplit
    check_node("StringSplit", {"X": SENTENCES}, attrs, opset=20, outputs=2)


@pytest.mark.parametrize(
    "x",
    [
        strings(["hello world", "def.net"], ["o n n x", "the quick brown fox"]),
        np.array("a b  c", object),  # a scalar gives [n] substrings and a scalar count
        np.zeros((0, 3), object),
        strings("", " ", "   "),  # no substrings at all: a last axis of 0
    ],
)
def test_string_split_shapes(x):
    check_node("StringSplit", {"X": x}, {"maxsplit": 2}, opset=20, outputs=2)


def test_string_split_follows_python_where_onnxruntime_differs():
    # "" split on a delimiter is one empty substring (str.split; ONNX Runtime: none), and
    # whitespace is every str.isspace character (ONNX Runtime: the space only).
    x = strings("", "a,", "a\tb\nc\x0bd\x0ce\rf\u00a0g\u2003h", " \t x \n")
    check_node("StringSplit", {"X": x}, {"delimiter": ","}, opset=20, outputs=2, reference="onnx")
    check_node("StringSplit", {"X": x}, {}, opset=20, outputs=2, reference="onnx")


def test_string_split_strips_trailing_whitespace_after_maxsplit():
    # The spec removes trailing whitespace (as ONNX Runtime does); str.split and onnx.reference
    # keep it on the unsplit rest.
    x = strings("  hello \t world  ", " one two three \n")
    y = strings(["hello", "world"], ["one", "two three"])
    expect("StringSplit", {"X": x}, {"maxsplit": 1}, [y, np.array([2, 2], np.int64)], outputs=2)


def test_string_split_counts_feed_device_ops():
    # StringSplit's counts (host values after the break) go on into a numeric op on the device.
    nodes = [
        helper.make_node("StringSplit", ["X"], ["Y", "Z"]),
        helper.make_node("Add", ["Z", "N"], ["S"]),
    ]
    graph = helper.make_graph(
        nodes,
        "split_then_add",
        [
            helper.make_tensor_value_info("X", TensorProto.STRING, ["n"]),
            helper.make_tensor_value_info("N", TensorProto.INT64, ["n"]),
        ],
        [helper.make_value_info(name, helper.TypeProto()) for name in ("Y", "S")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    compiled = None
    for x in (strings("a b", "c d e"), strings("one", "two three", "")):
        inputs = {"X": x, "N": np.arange(x.size, dtype=np.int64)}
        want = ort_run(model, inputs)
        loaded = transmuter.load(model)
        compiled = compiled or transmuter.compile(loaded, inputs)
        for got in (transmuter.run(loaded, inputs), compiled(inputs)):
            for name, expected in zip(("Y", "S"), want):
                assert_close(got[name], expected, rtol=0, atol=0, what=name)


# --------------------------------------------------------------------------- RegexFullMatch

TEXTS = strings(
    ["www.google.com", "www.bbc.co.uk", "account@gmail.com", "not email"],
    ["abc", "é", "_1", "a\nb"],
    ["a\tb", "١٢", "ABC", "Straße"],
)


@pytest.mark.parametrize(
    "pattern",
    [
        r"www\.[\w.-]+\.\bcom\b",
        r"(\W|^)[\w.\-]{0,25}@(yahoo|gmail)\.com(\W|$)",
        r"\w+",  # \w, \d, \s and \b are ASCII, as in RE2
        r"\d+",
        r"a\sb",
        r"\S+",
        r"a.b",  # . does not match a newline ...
        r"(?s)a.b",  # ... unless (?s)
        r"(?i)[a-z]+",
        r"abc|ab",  # full match: the alternative that covers the whole string
        r"(?P<first>a)bc",
        r"",
        r"[^@]*@.*",
    ],
)
def test_regex_full_match(pattern):
    check_node("RegexFullMatch", {"X": TEXTS}, {"pattern": pattern}, opset=20)


def test_regex_full_match_empty_tensor_and_scalar():
    check_node("RegexFullMatch", {"X": np.zeros((2, 0), object)}, {"pattern": "a+"}, opset=20)
    check_node("RegexFullMatch", {"X": np.array("aaa", object)}, {"pattern": "a+"}, opset=20)


@pytest.mark.parametrize(
    "pattern, match",
    [
        (r"\pL+", "RE2-only syntax"),  # RE2 Unicode classes
        (r"\Qa.b\E", "RE2-only syntax"),
        (r"[[:alpha:]]+", r"POSIX class '\[:alpha:\]'"),  # Python would read a plain set
        (r"[a-", "not valid"),
    ],
)
def test_regex_full_match_unsupported_patterns_raise(pattern, match):
    raises("RegexFullMatch", {"X": strings("a")}, {"pattern": pattern}, match)


def test_regex_full_match_needs_a_pattern():
    raises("RegexFullMatch", {"X": strings("a")}, {}, "pattern attribute")


# -------------------------------------------------------------------------- TfIdfVectorizer
# The pool of the onnx backend cases: 1-grams 2, 3, 5, 4 and 2-grams (5, 6), (7, 8), (6, 7).
POOL = [2, 3, 5, 4, 5, 6, 7, 8, 6, 7]
TOKENS = np.array([[1, 1, 3, 3, 3, 7], [8, 6, 7, 5, 6, 8]], np.int64)


def tfidf(mode="TF", lengths=(1, 2), skip=0, **attrs):
    base = {
        "mode": mode,
        "min_gram_length": lengths[0],
        "max_gram_length": lengths[1],
        "max_skip_count": skip,
        "ngram_counts": [0, 4],
        "ngram_indexes": [0, 1, 2, 3, 4, 5, 6],
        "pool_int64s": POOL,
    }
    return {**base, **attrs}


@pytest.mark.parametrize("lengths", [(1, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("skip", [0, 1, 3])
def test_tfidf_vectorizer_ngrams_and_skips(lengths, skip):
    dtype = np.int32 if skip == 1 else np.int64
    check_node("TfIdfVectorizer", {"X": TOKENS.astype(dtype)}, tfidf("TF", lengths, skip), opset=9)


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize(
    "indexes",
    [[6, 4, 2, 0, 1, 3, 5], [0, 3, 5, 8, 9, 11, 20]],
    ids=["permuted", "sparse"],
)
@pytest.mark.parametrize("weighted", [False, True])
def test_tfidf_vectorizer_modes(mode, indexes, weighted):
    # weights[i] scales the i-th n-gram of the pool (the spec, ONNX Runtime); onnx.reference
    # reads weights[c] for output coordinate c, which differs when ngram_indexes permutes.
    weights = {"weights": [0.5, -2.0, 3.0, 0.25, 1.5, 4.0, -1.0]} if weighted else {}
    attrs = tfidf(mode, (1, 2), 1, ngram_indexes=indexes, **weights)
    check_node("TfIdfVectorizer", {"X": TOKENS}, attrs, opset=9)


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
def test_tfidf_vectorizer_shared_coordinates(mode):
    # Several pool n-grams on one output coordinate add up (IDF unweighted: still 1).
    weights = {"weights": [0.5, -2.0, 3.0, 0.25, 1.5, 4.0, -1.0]} if mode == "TFIDF" else {}
    attrs = tfidf(mode, (1, 2), 2, ngram_indexes=[0, 0, 1, 1, 2, 0, 2], **weights)
    x = np.array([[2, 3, 5, 4, 5, 6], [6, 7, 8, 5, 2, 2]], np.int64)
    check_node("TfIdfVectorizer", {"X": x}, attrs, opset=9)


def test_tfidf_vectorizer_longer_ngrams_and_skipped_sizes():
    # 3-grams (1, 2, 3), (2, 3, 1), (4, 4, 4), (1, 2, 9); no 2-grams; 1-grams outside the range.
    attrs = {
        "mode": "TF",
        "min_gram_length": 3,
        "max_gram_length": 3,
        "max_skip_count": 2,
        "ngram_counts": [0, 2, 2],
        "ngram_indexes": [5, 4, 3, 2, 1, 0],
        "pool_int64s": [1, 2, 1, 2, 3, 2, 3, 1, 4, 4, 4, 1, 2, 9],
    }
    x = np.array(
        [[1, 2, 3, 1, 2, 3, 1, 4, 4, 4, 4, 2, 9, 3], [1, 9, 2, 4, 3, 4, 1, 2, 3, 4, 4, 4, 9, 9]]
    )
    check_node("TfIdfVectorizer", {"X": x}, attrs, opset=9)


def test_tfidf_vectorizer_strings():
    pool = ["a", "b", "c", "d", "b", "c", "a", "b", "c", "d", "a"]
    attrs = {
        "mode": "TFIDF",
        "min_gram_length": 1,
        "max_gram_length": 3,
        "max_skip_count": 1,
        "ngram_counts": [0, 4, 8],
        "ngram_indexes": [0, 1, 2, 3, 4, 5, 6],
        "pool_strings": pool,
        "weights": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
    }
    x = strings("a", "b", "c", "x", "b", "c", "d", "a", "b", "a").reshape(2, 5)
    check_node("TfIdfVectorizer", {"X": x}, attrs, opset=9)
    check_node("TfIdfVectorizer", {"X": x.reshape(-1)}, attrs, opset=9)
    check_node("TfIdfVectorizer", {"X": x}, attrs, opset=9, constants=["X"])


def test_tfidf_vectorizer_special_inputs():
    attrs = tfidf("TF", (1, 2), 1)
    check_node("TfIdfVectorizer", {"X": TOKENS[0]}, attrs, opset=9)  # 1-D: 1-D output
    check_node("TfIdfVectorizer", {"X": TOKENS}, attrs, opset=9, symbolic={"X": [0, 1]})
    check_node("TfIdfVectorizer", {"X": TOKENS}, attrs, opset=9, constants=["X"])
    check_node("TfIdfVectorizer", {"X": np.zeros((2, 0), np.int64)}, attrs, opset=9)
    check_node("TfIdfVectorizer", {"X": np.zeros(0, np.int32)}, attrs, opset=9)
    # ONNX Runtime refuses no rows; the spec does not.
    expect(
        "TfIdfVectorizer",
        {"X": np.zeros((0, 3), np.int64)},
        attrs,
        [np.zeros((0, 7), np.float32)],
        opset=9,
    )
    # No pool n-gram has a length in range: all zeros.
    expect(
        "TfIdfVectorizer",
        {"X": TOKENS},
        tfidf("TF", (3, 3)),
        [np.zeros((2, 7), np.float32)],
        opset=9,
    )


@pytest.mark.parametrize(
    "attrs, match",
    [
        (tfidf(pool_int64s=[2, 3, 2, 4, 5, 6, 7, 8, 6, 7]), "holds the n-gram .* twice"),
        (
            tfidf("IDF", ngram_indexes=[0, 0, 1, 2, 3, 4, 5], weights=[1.0] * 7),
            "one output coordinate per",
        ),
        (tfidf("TFIDF", weights=[1.0, 2.0]), "weights has 2 values"),
        (tfidf(ngram_indexes=[0, 1, 2]), "fewer than the 4 n-grams"),
        (tfidf(ngram_counts=[0, 12]), "ngram_counts"),
        (tfidf(mode="BM25"), "mode must be"),
        (tfidf(lengths=(2, 1)), "min_gram_length <= max_gram_length"),
        (tfidf(pool_strings=["a"]), "exactly one of pool_strings and pool_int64s"),
    ],
)
def test_tfidf_vectorizer_rejects_bad_attributes(attrs, match):
    raises("TfIdfVectorizer", {"X": TOKENS}, attrs, match, opset=9)


def test_tfidf_vectorizer_rejects_other_ranks():
    # The schema's shape inference (and so ONNX Runtime) takes rank 1 or 2 only.
    for x in (np.array(5, np.int64), TOKENS[None]):
        raises("TfIdfVectorizer", {"X": x}, tfidf(), r"must be \[C\] or \[N, C\]", opset=9)


def test_tfidf_vectorizer_rejects_mismatched_pool():
    raises(
        "TfIdfVectorizer", {"X": strings("a", "b")}, tfidf(), "matching its string input", opset=9
    )
