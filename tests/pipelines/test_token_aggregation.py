"""token-classification's aggregation (transmuter/pipelines/text/token_aggregation.py) on
hand-made tokens, and its options' checks on the BERT NER fixture; the answers against
transformers' are tests/pipelines/differential/test_diff_text.py's text-bert-ner calls."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import transmuter
from transmuter.errors import InputError
from transmuter.pipelines.text import token_aggregation as aggregation

NER = Path(__file__).resolve().parents[1] / "fixtures" / "differential" / "text-bert-ner"
LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def decode(words):
    """WordPiece's decoder: "##" pieces join the word before them (a first one stays)."""
    rest = "".join(w[2:] if w.startswith("##") else f" {w}" for w in words[1:])
    return words[0] + rest


def scores(*best: tuple[int, float]) -> np.ndarray:
    """One row per token: its best label's score, the rest shared by the others."""
    rows = np.zeros((len(best), len(LABELS)), np.float32)
    for row, (label, score) in zip(rows, best):
        row[:] = (1 - score) / (len(LABELS) - 1)
        row[label] = score
    return rows


def encoding(tokens, offsets, ids=None):
    special = [int(t in ("[CLS]", "[SEP]")) for t in tokens]
    return SimpleNamespace(
        tokens=tokens, offsets=offsets, special_tokens_mask=special, ids=ids or [5] * len(tokens)
    )


WORDPIECE = SimpleNamespace(model=SimpleNamespace(continuing_subword_prefix="##"))

# "ann lives": ann = an|##n, lives = lives; [CLS] and [SEP] around.
TEXT = "ann lives"
ENCODING = encoding(
    ["[CLS]", "an", "##n", "lives", "[SEP]"], [(0, 0), (0, 2), (2, 3), (4, 9), (0, 0)]
)
SCORES = scores((0, 0.9), (1, 0.6), (3, 0.8), (0, 0.7), (0, 0.9))


def run(strategy):
    found = aggregation.tokens(TEXT, ENCODING, SCORES, WORDPIECE, None, strategy)
    return aggregation.entities(found, strategy, LABELS, decode)


def test_tokens_leave_out_special_ones_and_mark_subwords_by_their_length():
    found = aggregation.tokens(TEXT, ENCODING, SCORES, WORDPIECE, None, "none")
    assert [(t.index, t.word, t.is_subword) for t in found] == [
        (1, "an", False),
        (2, "##n", True),
        (3, "lives", False),
    ]


def test_an_unknown_token_is_the_text_it_covers_and_starts_a_word():
    unknown = encoding(["[CLS]", "an", "[UNK]", "[SEP]"], [(0, 0), (0, 2), (2, 3), (0, 0)])
    unknown.ids = [1, 5, 100, 2]
    found = aggregation.tokens("anñ", unknown, SCORES[:4], WORDPIECE, 100, "first")
    assert [(t.word, t.is_subword) for t in found] == [("an", False), ("ñ", False)]


def test_without_a_subword_prefix_words_are_guessed_at_spaces_with_a_warning():
    bpe = SimpleNamespace(model=SimpleNamespace(continuing_subword_prefix=None))
    with pytest.warns(UserWarning, match="marks no subwords"):
        found = aggregation.tokens(TEXT, ENCODING, SCORES, bpe, None, "average")
    assert [t.is_subword for t in found] == [False, True, False]


def test_none_and_simple_label_tokens_and_group_them():
    assert [(e["entity"], e["word"], e["index"]) for e in run("none")] == [
        ("B-PER", "an", 1),
        ("B-LOC", "##n", 2),
        ("O", "lives", 3),
    ]
    # B- starts a group: each token is its own.
    assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in run("simple")] == [
        ("PER", "an", 0, 2),
        ("LOC", "##n", 2, 3),
        ("O", "lives", 4, 9),
    ]


def test_word_strategies_join_subwords_first():
    first, average, maximum = run("first"), run("average"), run("max")
    assert [(e["entity_group"], e["word"]) for e in first] == [("PER", "ann"), ("O", "lives")]
    assert first[0]["score"] == pytest.approx(0.6)
    assert (maximum[0]["entity_group"], maximum[0]["score"]) == ("LOC", pytest.approx(0.8))
    # The mean of an's and ##n's rows: B-PER (0.6 + 0.05) / 2, B-LOC (0.1 + 0.8) / 2.
    assert (average[0]["entity_group"], average[0]["score"]) == ("LOC", pytest.approx(0.45))
    assert (average[0]["start"], average[0]["end"]) == (0, 3)


def test_groups_join_i_tags_of_one_type_and_labels_without_a_prefix():
    def entity(label, word, start, score=0.5):
        return {"entity": label, "score": score, "word": word, "start": start, "end": start + 1}

    found = aggregation.groups(
        [
            entity("B-PER", "a", 0, 0.2),
            entity("I-PER", "b", 2, 0.4),
            entity("I-LOC", "c", 4),
            entity("B-LOC", "d", 6),
            entity("MISC", "e", 8),
            entity("MISC", "f", 10),
        ],
        decode,
    )
    assert [(g["entity_group"], g["word"], g["start"], g["end"]) for g in found] == [
        ("PER", "a b", 0, 3),
        ("LOC", "c", 4, 5),
        ("LOC", "d", 6, 7),
        ("MISC", "e f", 8, 11),
    ]
    assert found[0]["score"] == pytest.approx(0.3)


def test_kept_drops_ignored_labels_before_and_after_grouping():
    found = [{"entity": "O"}, {"entity": "B-PER"}, {"entity_group": "O"}, {"entity_group": "PER"}]
    assert aggregation.kept(found, frozenset({"O"})) == [found[1], found[3]]


def test_windows_keep_the_longer_of_overlapping_entities_then_the_higher_score():
    def entity(start, end, score):
        return {"entity_group": "PER", "score": score, "word": "w", "start": start, "end": end}

    found = [entity(0, 3, 0.5), entity(5, 6, 0.4), entity(0, 4, 0.1), entity(5, 6, 0.9)]
    assert aggregation.merge_windows(found) == [entity(0, 4, 0.1), entity(5, 6, 0.9)]


def test_options_are_checked_here_and_per_call():
    tag = transmuter.pipeline("token-classification", NER, aggregation_strategy="SIMPLE")
    assert "entity_group" in tag("john smith")[0]
    assert "index" in tag("john smith", aggregation_strategy="none")[0]
    with pytest.raises(InputError, match="aggregation_strategy must be one of none, simple"):
        tag("john smith", aggregation_strategy="wrong")
    with pytest.raises(InputError, match="ignore_labels must be a list"):
        tag("john smith", ignore_labels="O")
    # BERT's fixture reads 64 positions: 62 text tokens a window.
    with pytest.raises(InputError, match="stride must be less than the 62 text tokens"):
        tag("john smith", stride=62)
    with pytest.raises(InputError, match="an aggregation_strategy other than"):
        tag("john smith", stride=8, aggregation_strategy="none")
    with pytest.raises(InputError, match="stride must be an integer"):
        transmuter.pipeline("token-classification", NER, stride=-1)


def test_a_stride_runs_a_long_text_in_windows_and_a_short_one_alone():
    tag = transmuter.pipeline("token-classification", NER, aggregation_strategy="first")
    long = "john smith lives in paris " * 30
    whole = tag(long, stride=8)
    assert whole[-1]["end"] == len(long.rstrip())  # past the 64 positions one window reads
    assert tag(long)[-1]["end"] < whole[-1]["end"]
    assert tag("john smith", stride=8) == tag("john smith")


def test_joined_words_start_after_each_delimiter():
    assert aggregation.joined(["ann", "lives"], " ") == ("ann lives", [0, 4])
    assert aggregation.joined(["ann", "", "x.y"], "--") == ("ann----x.y", [0, 5, 7])


def test_pre_tokenized_offsets_shift_to_where_their_word_starts():
    # ["ann", "lives"] encoded with is_pretokenized: each word's offsets start at 0.
    words = encoding(
        ["[CLS]", "an", "##n", "lives", "[SEP]"], [(0, 0), (0, 2), (2, 3), (0, 5), (0, 0)]
    )
    words.word_ids = [None, 0, 0, 1, None]
    text, starts = aggregation.joined(["ann", "lives"], "--")
    found = aggregation.tokens(text, words, SCORES, WORDPIECE, None, "none", word_starts=starts)
    assert [(t.word, t.start, t.end, t.is_subword) for t in found] == [
        ("an", 0, 2, False),
        ("##n", 2, 3, True),
        ("lives", 5, 10, False),
    ]


def test_split_words_tokenize_as_the_joined_text_and_answer_in_a_list():
    tag = transmuter.pipeline("token-classification", NER, aggregation_strategy="first")
    words = ["Ann", "lives", "in", "x.y"]
    # BERT's pre-tokenizer splits at spaces and punctuation, so the words tokenize as the text.
    assert tag(words, is_split_into_words=True) == [tag("Ann lives in x.y")]
    assert tag([words[:2], words[2:]], is_split_into_words=True) == tag(["Ann lives", "in x.y"])
    dashed = tag(words, is_split_into_words=True, delimiter="--")[0]
    assert [(e["word"], e["start"], e["end"]) for e in dashed] == [
        ("ann lives", 0, 10),
        ("x", 16, 17),
        (". y", 17, 19),
    ]
    assert "Ann--lives--in--x.y"[16:19] == "x.y"
    with pytest.raises(InputError, match="is_split_into_words=True each input must be"):
        tag("Ann lives", is_split_into_words=True)
    with pytest.raises(InputError, match="the inputs must be strings"):
        tag([words], is_split_into_words=False)
    with pytest.raises(InputError, match="is_split_into_words must be True or False"):
        tag(words, is_split_into_words="yes")
    with pytest.raises(InputError, match="delimiter"):
        tag("Ann lives", delimiter="-")
