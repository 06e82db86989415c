"""The question-answering task (extractive: BertForQuestionAnswering-style exports, Optimum's
model.onnx with input_ids / attention_mask / token_type_ids -> start_logits, end_logits), as
transformers' pipeline (4.x: transformers 5 dropped it): the question and its context encoded as
a pair, a context too long for `max_seq_len` split into windows that overlap by `doc_stride`
tokens, the best spans of all windows as {"score", "start", "end", "answer"} with character
offsets into the context.

The windows of all questions run through encoders.py's `Encoder`: batched, the batch padded to a
power of two and the sequence to a multiple of 16 (the bucketed dims).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.base import Task, positive_int
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.text.encoders import Encoder

_OUTPUTS = ("start_logits", "end_logits")
# transformers' masked logit for tokens that cannot be in an answer.
_MASKED = -10000.0
# transformers' starting "no answer" score: above any probability, so the first window sets it.
_NO_NULL = 1000000.0


class QuestionAnswering(Task):
    """{"question", "context"} (a dict, a list of them, `question=`/`context=` keywords with
    a string or lists, or question and context as two strings) -> the `top_k` best answers:
    one {"score", "start", "end", "answer"} where a single answer comes, else a list; a list
    of those for several questions. Options, here or per call, as transformers': top_k (1),
    max_answer_len (15 tokens), max_seq_len (tokenizer_config.json's model_max_length, at
    most 384), doc_stride (half of max_seq_len, at most 128), handle_impossible_answer
    (False: True adds the empty answer with its score), align_to_words (True: a span widened
    to the whole words it touches; False: the characters of its own tokens), max_question_len
    (64; taken and unused, as by transformers with a fast tokenizer: a question that leaves no
    room for the context is an error)."""

    def __init__(self, repo: Repo, *, batch_size: int = 8, **options: Any):
        self.encoder = Encoder(repo, "question-answering", batch_size)
        self.batch_size = self.encoder.batch_size
        if repo.tokenizer_config.get("padding_side", "right") != "right":
            raise ModelLoadError(
                f"{repo.source}: question-answering puts the question first, as tokenizers "
                "padding on the right do; tokenizer_config.json pads on the left"
            )
        # Windows set the tokenizer's truncation per call, which Encoder's must not see.
        self.tokenizer = repo.require_tokenizer("question-answering")
        self.cls_id = self.tokenizer.token_to_id(repo.tokenizer_config.get("cls_token", "[CLS]"))
        # transformers' default window: 384 tokens, or fewer where the model reads fewer.
        self.defaults = {
            "top_k": 1,
            "max_answer_len": 15,
            "max_seq_len": min(384, self.encoder.limit or 384),
            "doc_stride": None,
            "max_question_len": 64,
            "handle_impossible_answer": False,
            "align_to_words": True,
            # transformers' per-call batching: checked, answers do not depend on it.
            "batch_size": self.batch_size,
        }
        self.defaults = self._options(options)

    def _options(self, options: dict[str, Any]) -> dict[str, Any]:
        """The defaults updated with `options`, checked."""
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            raise InputError(
                f"question-answering has no option {unknown}; it takes {sorted(self.defaults)}"
            )
        given = {**self.defaults, **options}
        for name in ("top_k", "max_answer_len", "max_seq_len", "max_question_len", "batch_size"):
            positive_int(given[name], name)
        if not isinstance(given["align_to_words"], (bool, np.bool_)):
            raise InputError(
                f"align_to_words must be True or False; got {given['align_to_words']!r}"
            )
        limit = self.encoder.limit
        if limit and given["max_seq_len"] > limit:
            raise InputError(
                f"max_seq_len={given['max_seq_len']} is past the model's {limit} positions"
            )
        stride = given["doc_stride"]
        if stride is not None and (not isinstance(stride, int) or stride < 0):
            raise InputError(f"doc_stride must be an integer of at least 0; got {stride!r}")
        if stride is not None and stride > given["max_seq_len"]:
            raise InputError(
                f"doc_stride ({stride}) is larger than max_seq_len ({given['max_seq_len']})"
            )
        return given

    def __call__(
        self,
        *args: Any,
        question: str | Sequence[str] | None = None,
        context: str | Sequence[str] | None = None,
        **options: Any,
    ) -> Any:
        self._options(options)  # before any input is read, as a list call checks them
        if len(args) == 1 and isinstance(args[0], Iterator):
            return super().__call__(args[0], **options)
        examples = _examples(args, question, context)
        results = self.run_items(examples, **options)
        # transformers answers one question (or a list of one) with its answer.
        return results[0] if len(results) == 1 else results

    def run_items(self, items: list, **options: Any) -> list:
        """The answers of each {"question", "context"} item."""
        given = self._options(options)
        examples = [_example(item) for item in items]
        windows = [self._windows(q, c, given) for q, c in examples]
        flat = [w for found in windows for w in found]
        logits = iter(self.encoder.run_outputs(flat, _OUTPUTS))
        results = []
        for (_, context_text), found in zip(examples, windows):
            outputs = [next(logits) for _ in found]
            results.append(self._answers(context_text, found, outputs, given))
        return results

    def _windows(self, question: str, context: str, given: dict[str, Any]) -> list[Any]:
        """The question paired with each window of the context: the tokenizer's overflowing
        encodings, truncating only the context, consecutive windows sharing doc_stride
        tokens."""
        length = given["max_seq_len"]
        stride = given["doc_stride"]
        stride = min(length // 2, 128) if stride is None else stride
        try:
            self.tokenizer.enable_truncation(length, stride=stride, strategy="only_second")
            first = self.tokenizer.encode(question, context)
        except Exception as exc:  # tokenizers raises its own Exception for impossible windows
            raise InputError(
                f"the question and windows of max_seq_len={length}, doc_stride={stride} do "
                f"not fit: {exc}"
            ) from None
        return [first, *first.overflowing]

    def _answers(
        self, context: str, windows: list[Any], outputs: list[dict], given: dict[str, Any]
    ) -> Any:
        """The best answers over all windows; equal answers (ignoring case) found in several
        windows add their scores, as in transformers."""
        top_k = given["top_k"]
        null = _NO_NULL
        answers: list[dict[str, Any]] = []
        for window, found in zip(windows, outputs):
            length = len(window.ids)
            starts, ends, scores, null = self._spans(
                window,
                found["start_logits"][:length],
                found["end_logits"][:length],
                null,
                given,
            )
            for s, e, score in zip(starts, ends, scores):
                begin, end = _characters(window, int(s), int(e), given["align_to_words"])
                text = context[begin:end]
                same = next((a for a in answers if a["answer"].lower() == text.lower()), None)
                if same is not None:
                    same["score"] += float(score)
                else:
                    answers.append(
                        {"score": float(score), "start": begin, "end": end, "answer": text}
                    )
        if given["handle_impossible_answer"]:
            answers.append({"score": null, "start": 0, "end": 0, "answer": ""})
        answers = sorted(answers, key=lambda a: a["score"], reverse=True)[:top_k]
        return answers[0] if len(answers) == 1 else answers

    def _spans(
        self, window: Any, start: np.ndarray, end: np.ndarray, null: float, given: dict[str, Any]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """transformers' span choice in one window: start and end probabilities softmaxed over
        the context tokens and the first [CLS], the null score (both at position 0) kept if
        lower than `null`, then the best start x end products of spans up to max_answer_len
        tokens. transformers takes top_k * 2 + 10 candidates when aligning to words (which may
        merge some), else top_k, in numpy's order (the first best for one)."""
        # Allowed: the context (sequence 1), and [CLS] tokens, the null answer's place.
        allowed = np.array([sid == 1 for sid in window.sequence_ids])
        if self.cls_id is not None:
            allowed |= np.asarray(window.ids) == self.cls_id
        start = _softmax_masked(np.where(allowed, start, _MASKED).astype(np.float32))
        end = _softmax_masked(np.where(allowed, end, _MASKED).astype(np.float32))
        if given["handle_impossible_answer"]:
            null = min(null, float(start[0] * end[0]))
        start[0] = end[0] = 0.0
        outer = start[:, None] * end[None, :]
        candidates = np.tril(np.triu(outer), given["max_answer_len"] - 1)
        flat = candidates.flatten()
        wanted = given["top_k"] * 2 + 10 if given["align_to_words"] else given["top_k"]
        if wanted == 1:
            order = np.array([np.argmax(flat)])
        elif len(flat) < wanted:
            order = np.argsort(-flat)
        else:
            chosen = np.argpartition(-flat, wanted)[:wanted]
            order = chosen[np.argsort(-flat[chosen])]
        starts, ends = np.unravel_index(order, candidates.shape)
        keep = allowed[starts] & allowed[ends]
        starts, ends = starts[keep], ends[keep]
        return starts, ends, candidates[starts, ends], null


def _softmax_masked(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _characters(window: Any, start: int, end: int, align_to_words: bool) -> tuple[int, int]:
    """The character span of tokens start..end in the context: with `align_to_words`, widened
    to whole words (the word's characters in sequence 1), or the tokens' own offsets where a
    token belongs to no word (special tokens), as transformers' align_to_words does; without,
    the tokens' own offsets."""
    if not align_to_words:
        return window.offsets[start][0], window.offsets[end][1]
    first, last = window.token_to_word(start), window.token_to_word(end)
    if first is not None and last is not None:
        begin = window.word_to_chars(first, 1)
        finish = window.word_to_chars(last, 1)
        if begin is not None and finish is not None:
            return begin[0], finish[1]
    return window.offsets[start][0], window.offsets[end][1]


def _examples(args: tuple, question: Any, context: Any) -> list[Any]:
    """The {"question", "context"} items of what transformers' argument handler takes."""
    if args and (question is not None or context is not None):
        raise InputError("give the inputs either positionally or as question= and context=")
    if len(args) == 2 and all(isinstance(a, str) for a in args):
        items: Any = [{"question": args[0], "context": args[1]}]
    elif len(args) == 1:
        items = [args[0]] if isinstance(args[0], dict) else args[0]
        items = list(items) if isinstance(items, tuple) else items
    elif args:
        items = list(args)
    elif isinstance(question, str) and isinstance(context, str):
        items = [{"question": question, "context": context}]
    elif isinstance(question, list) and isinstance(context, str):
        items = [{"question": q, "context": context} for q in question]
    elif isinstance(question, list) and isinstance(context, list):
        if len(question) != len(context):
            raise InputError(
                f"{len(question)} questions and {len(context)} contexts: give one context per "
                "question, or one context for all"
            )
        items = [{"question": q, "context": c} for q, c in zip(question, context)]
    else:
        raise InputError(
            'give question= and context= (strings, or lists), {"question", "context"} dicts, '
            f"or a question and a context; got question={question!r}, context={context!r}"
        )
    if not isinstance(items, list) or not items:
        raise InputError(f'give {{"question", "context"}} dicts or a list of them; got {items!r}')
    return items


def _example(item: Any) -> tuple[str, str]:
    if not isinstance(item, dict) or not {"question", "context"} <= set(item):
        raise InputError(f'each input must be a {{"question", "context"}} dict; got {item!r}')
    for key in ("question", "context"):
        if not isinstance(item[key], str) or not item[key]:
            raise InputError(f"the {key} must be a non-empty string; got {item[key]!r}")
    return item["question"], item["context"]
