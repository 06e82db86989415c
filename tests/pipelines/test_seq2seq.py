"""text2text-generation (T5, BART) and automatic-speech-recognition (Whisper) against
transformers' greedy generate() (num_beams=1: the tasks default to 4 beams, Whisper's to 5,
as transformers' pipelines), recorded by tests/fixtures/make_pipelines.py at 40 tokens with
min_new_tokens=40, and the number of programs each decoding compiles. decoding="past" compiles
a program per step the first time (Optimum's exports take no self-attention mask), so it is
compared on the first few tokens and "padded", the same tokens through bucketed programs, on
all 40. Each pipeline is built once per module: programs of the same batch size and settings
are shared between tests."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import REPOS, expected
from fixtures.waveforms import waveforms

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.audio.features import log_mel
from transmuter.pipelines.generation import seq2seq
from transmuter.pipelines.shapes import ProgramBudget


@pytest.fixture(scope="module")
def t5():
    return transmuter.pipeline("text2text-generation", REPOS / "t5", num_beams=1)


@pytest.fixture(scope="module")
def t5_padded():
    return transmuter.pipeline("text2text-generation", REPOS / "t5", decoding="padded", num_beams=1)


@pytest.fixture(scope="module")
def bart_padded():
    return transmuter.pipeline(
        "text2text-generation", REPOS / "bart", decoding="padded", num_beams=1
    )


# decoding="past" compiles a program per token for each batch size and decoder: its
# comparisons stop at PAST_TOKENS, past the first steps where the cache starts.
PAST_TOKENS = 6
RECORDED = 40  # the recorded new tokens, and their min_new_tokens


def first(rows: list[list[int]], n: int, repo: str) -> list[list[int]]:
    """transformers' first `n` tokens of `rows` (recorded at 40) as a generation stopping at
    `n` makes them: with forced_eos_token_id the last is forced to it."""
    forced = expected_forced_eos(repo)
    if n == len(rows[0]) or forced is None:
        return [row[:n] for row in rows]
    return [row[: n - 1] + [forced] for row in rows]


def expected_forced_eos(repo: str) -> int | None:
    config = json.loads((REPOS / repo / "generation_config.json").read_text())
    return config.get("forced_eos_token_id")


def test_t5_first_tokens_and_no_recompiles(t5):
    # T5's decoder_model.onnx and decoder_with_past_model.onnx, decoding="past" on a batch.
    assert not t5.decoder.merged
    want = expected("t5")["batch"]
    got = t5.generate(want["input_ids"], max_new_tokens=6, **want["options"])
    assert got == [row[:6] for row in want["new_tokens"]]
    before = t5.programs
    assert t5.generate(want["input_ids"], max_new_tokens=4, **want["options"]) == [
        row[:4] for row in want["new_tokens"]
    ]
    assert t5.programs == before  # the same (batch, encoder bucket, step) programs
    texts = t5(want["texts"], max_new_tokens=4, **want["options"])
    assert len(texts) == 3 and all(isinstance(t["generated_text"], str) for t in texts)
    assert t5.programs == before


def test_the_token_choice_is_one_program_for_every_step_and_pipeline(monkeypatch):
    # "past" compiles a program per step; the token choice (the sort, softmax and draws that
    # sampling needs: a third of such a program's compile) is traced once for the process, not
    # in each of them (six here), and not at all where an earlier test traced it.
    traced = []
    choose = seq2seq.choose
    monkeypatch.setattr(seq2seq, "choose", lambda *a, **k: traced.append(1) or choose(*a, **k))
    want = expected("t5")["batch"]
    for _ in range(2):
        t5 = transmuter.pipeline("text2text-generation", REPOS / "t5", num_beams=1)
        got = t5.generate(want["input_ids"], max_new_tokens=3, **want["options"])
        assert got == [row[:3] for row in want["new_tokens"]]
        assert t5.programs == 3  # the first step (with the encoder) and two more
    assert len(traced) <= 1


def test_padded_decoding_of_forty_tokens_compiles_four_programs(t5_padded):
    assert not t5_padded.decoder.merged
    want = expected("t5")["single"]
    before = t5_padded.programs
    got = t5_padded.generate(want["input_ids"], max_new_tokens=40, **want["options"])
    assert got == want["new_tokens"]
    # The encoder with the first step, then a step program for each decoder bucket 16, 32, 64.
    assert t5_padded.programs - before == 4
    assert t5_padded.generate(want["input_ids"], max_new_tokens=40, **want["options"]) == got
    assert t5_padded.programs - before == 4


def test_programs_past_the_budget_are_dropped_and_compile_again():
    # "past" decoding compiles a program per step, batch and encoder length, which no bucket
    # bounds: a long-lived pipeline drops them all once its budget is spent (each program
    # holds memory maps, and a process past the kernel's limit crashes in XLA's compiler).
    t5 = transmuter.pipeline("text2text-generation", REPOS / "t5", num_beams=1)
    t5.decoder.budget = ProgramBudget(limit=3)
    want = expected("t5")["batch"]
    got = t5.generate(want["input_ids"], max_new_tokens=4, **want["options"])
    assert got == [row[:4] for row in want["new_tokens"]]
    first_time = t5.programs  # the first step and three more: past the budget of 3
    assert first_time >= 4 and t5.decoder.budget.drops == 0
    assert t5.generate(want["input_ids"], max_new_tokens=4, **want["options"]) == got
    assert t5.decoder.budget.drops == 1
    assert t5.programs == 2 * first_time  # each one compiled again, the same tokens
    assert t5.generate(want["input_ids"], max_new_tokens=4, **want["options"]) == got
    assert t5.decoder.budget.drops == 2 and t5.programs == 3 * first_time


# Batches of three right-padded texts: T5 "past" is test_t5_first_tokens_and_no_recompiles's,
# T5's single text through "padded" test_padded_decoding_of_forty_tokens_compiles_four_programs's.
@pytest.mark.parametrize(
    "name, decoding",
    [("t5", "padded"), ("bart", "padded"), pytest.param("bart", "past", marks=pytest.mark.slow)],
)
def test_greedy_tokens_are_transformers(name, decoding, request):
    want = expected(name)["batch"]
    if decoding == "padded":
        generate = request.getfixturevalue(f"{name}_padded")
    else:
        generate = transmuter.pipeline(
            "text2text-generation", REPOS / name, decoding=decoding, num_beams=1
        )
    assert generate.decoder.merged == (name == "bart")
    n = PAST_TOKENS if decoding == "past" else RECORDED
    got = generate.generate(want["input_ids"], max_new_tokens=n, **want["options"])
    assert got == first(want["new_tokens"], n, name)


def test_t5_repetition_penalty_is_transformers(t5_padded):
    # The penalty is applied where both decodings choose tokens (generation.choose). It
    # changes the second row at its second token and the first at its eighth: 12 show both.
    want = expected("t5")["penalty"]
    got = t5_padded.generate(want["input_ids"], max_new_tokens=12, **want["options"])
    assert got == first(want["new_tokens"], 12, "t5")


def test_text2text_options_are_checked(t5):
    with pytest.raises(InputError, match=r"has no option \['return_full_text'\]"):
        t5("Hello", return_full_text=False)
    with pytest.raises(InputError, match="max_new_tokens must be at least 1"):
        t5("Hello", max_new_tokens=0)
    with pytest.raises(InputError, match="a text, a list of texts or a generator"):
        t5([])
    with pytest.raises(InputError, match="decoding must be one of past, padded; got 'fast'"):
        transmuter.pipeline("text2text-generation", REPOS / "t5", decoding="fast")
    # transformers' per-call options and beam search's, checked before anything runs.
    for name in ("truncation", "return_tensors", "return_text", "clean_up_tokenization_spaces"):
        with pytest.raises(InputError, match=f"{name} must be True or False; got 'yes'"):
            t5("Hello", **{name: "yes"})
    with pytest.raises(InputError, match="batch_size must be an integer"):
        t5("Hello", batch_size=0)
    with pytest.raises(InputError, match="num_return_sequences=3 needs at least as many beams"):
        t5("Hello", num_beams=2, num_return_sequences=3)
    with pytest.raises(InputError, match=r"cannot be combined with \['do_sample'\]"):
        t5("Hello", num_beams=2, do_sample=True)
    with pytest.raises(InputError, match=r"cannot be combined with \['stop'\]"):
        t5("Hello", num_beams=2, stop=".")
    with pytest.raises(InputError, match="early_stopping must be True, False or 'never'"):
        t5("Hello", num_beams=2, early_stopping="soon")
    with pytest.raises(InputError, match="num_beams must be an integer"):
        t5("Hello", num_beams=0)


def test_clean_up_tokenization_is_transformers():
    from transmuter.pipelines.text.text2text_generation import clean_up_tokenization

    text = "I do n't know , he 's here . Is it ? We 're sure ! I 'm off ' "
    assert clean_up_tokenization(text) == "I don't know, he's here. Is it? We're sure! I'm off'"


def test_translation_languages_are_the_tasks(tmp_path):
    # T5's tokenizer has no language codes: src_lang / tgt_lang only name the task's languages.
    german = transmuter.pipeline("translation_en_to_de", REPOS / "t5-tasks")
    with pytest.raises(InputError, match="tgt_lang='fr': this pipeline's task is translation_en"):
        german("Hello", src_lang="en", tgt_lang="fr")
    with pytest.raises(InputError, match=r"has no option \['src_lang'\]"):
        transmuter.pipeline("summarization", REPOS / "t5-tasks")("Hello", src_lang="en")


def test_a_text_past_learned_positions_is_refused_or_truncated(bart_padded):
    # BART's encoder has a position table (128 here); T5's relative positions have none.
    long = " ".join(["word"] * 150)
    with pytest.raises(InputError, match="tokens; the encoder has 128 positions: pass truncation"):
        bart_padded(long, max_new_tokens=2)
    assert len(bart_padded.generate(bart_padded._encode([long], True), max_new_tokens=2)[0]) == 2


@pytest.fixture(scope="module")
def whisper():
    # Greedy, as recorded (the task's default is transformers' 5 beams).
    return transmuter.pipeline("automatic-speech-recognition", REPOS / "whisper", num_beams=1)


def test_log_mel_is_whisper_feature_extractors(whisper):
    features = log_mel(waveforms(), whisper.features)
    assert features.shape == (2, 80, 400) and features.dtype == np.float32
    np.testing.assert_allclose(features[:1], np.load(REPOS / "whisper" / "features.npy"), atol=1e-5)


def test_whisper_prompt_from_generation_config(whisper):
    assert whisper.prompt() == expected("whisper")["single"]["prompt"]
    assert whisper.prompt("fr", "translate") == expected("whisper")["french"]["prompt"]
    assert whisper.prompt("<|fr|>")[1:3] == whisper.prompt("fr", "transcribe")[1:3]
    with pytest.raises(InputError, match="language 'de' is not one of"):
        whisper.prompt("de")


def test_whisper_transcribes_waveforms(whisper):
    want = expected("whisper")["batch"]
    waves = waveforms()
    # min_new_tokens as the greedy tests pass it (the recording's), so their programs serve.
    out = whisper(waves, max_new_tokens=3, min_new_tokens=RECORDED)
    assert [o["text"] for o in out] == [
        whisper.tokenizer.decode(r[:3], skip_special_tokens=True) for r in want["new_tokens"]
    ]
    # The tokens themselves, through the same programs.
    features = log_mel(waves, whisper.features)
    got = whisper.generate(features, max_new_tokens=3, min_new_tokens=RECORDED)
    assert got == first(want["new_tokens"], 3, "whisper")
    one = whisper(
        {"array": waves[0], "sampling_rate": 16000}, max_new_tokens=3, min_new_tokens=RECORDED
    )
    assert one == out[0]
    with pytest.raises(InputError, match="resample it first"):
        whisper({"array": waves[0], "sampling_rate": 8000})
    with pytest.raises(InputError, match="1-D float array"):
        whisper(np.zeros((2, 100), np.float32))


@pytest.fixture(scope="module")
def whisper_padded():
    return transmuter.pipeline(
        "automatic-speech-recognition", REPOS / "whisper", decoding="padded", num_beams=1
    )


# "batch" is "single"'s waveform and another; "french" is single's with another prompt.
@pytest.mark.parametrize(
    "case, decoding",
    [
        ("single", "padded"),
        ("batch", "padded"),
        ("french", "padded"),
        pytest.param("batch", "past", marks=pytest.mark.slow),
    ],
)
def test_whisper_greedy_tokens_are_transformers(case, decoding, request):
    # One pipeline per decoding: batch 1's programs serve both single and french.
    whisper = request.getfixturevalue("whisper" if decoding == "past" else "whisper_padded")
    want = expected("whisper")[case]
    features = log_mel(waveforms()[: len(want["new_tokens"])], whisper.features)
    n = PAST_TOKENS if decoding == "past" else RECORDED
    got = whisper.generate(features, max_new_tokens=n, min_new_tokens=RECORDED, **want["options"])
    assert got == first(want["new_tokens"], n, "whisper")


def test_the_padded_decoder_bucket_stops_at_the_position_table(whisper_padded):
    want = expected("whisper")["single"]
    features = log_mel(waveforms()[:1], whisper_padded.features)
    decoder, positions = whisper_padded.decoder, whisper_padded.decoder.positions
    # As if the table were 40 long: buckets 16, 32 (the greedy tests' programs), then 40.
    decoder.positions = 40
    try:
        with pytest.raises(InputError, match="need 44 positions; the model has 40"):
            whisper_padded.generate(features, max_new_tokens=40, **want["options"])
        # min_new_tokens as recorded (past 36: no end of sequence), the greedy tests' settings.
        got = whisper_padded.generate(
            features, max_new_tokens=36, min_new_tokens=RECORDED, **want["options"]
        )
        assert got == [row[:36] for row in want["new_tokens"]]
        assert decoder._bucket(33) == 40
    finally:
        decoder.positions = positions


def test_padded_decoding_refuses_a_decoder_fixed_to_one_token(tmp_path):
    onnx = pytest.importorskip("onnx")
    shutil.copytree(REPOS / "bart", tmp_path / "bart")
    path = tmp_path / "bart" / "decoder_model_merged.onnx"
    model = onnx.load(str(path))
    ids = next(v for v in model.graph.input if v.name == "input_ids")
    ids.type.tensor_type.shape.dim[1].ClearField("dim_param")
    ids.type.tensor_type.shape.dim[1].dim_value = 1
    onnx.save(model, str(path))
    with pytest.raises(ModelLoadError, match=r"input_ids is declared as .*\[batch_size, 1\]"):
        transmuter.pipeline("text2text-generation", tmp_path / "bart", decoding="padded")


def _tiny_vision_decoder(folder, *, naming: str) -> None:
    """A VisionEncoderDecoder export in the layout of Optimum's ViT + GPT-2, built here: an
    encoder from pixel_values, and decoders (no past, with past) whose self-attention past is
    named as `naming` gives it ("past_key_values.0.key"), with no cross-attention past (GPT-2
    reads encoder_hidden_states at every step)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    vocab, width = 16, 8

    def save(name, nodes, inputs, outputs, weights):
        graph = helper.make_graph(
            nodes,
            name,
            inputs,
            outputs,
            [numpy_helper.from_array(v, k) for k, v in weights.items()],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.save(model, str(folder / f"{name}.onnx"))

    def tensor(name, dtype, shape):
        return helper.make_tensor_value_info(name, dtype, shape)

    save(
        "encoder_model",
        [helper.make_node("Reshape", ["pixel_values", "shape"], ["last_hidden_state"])],
        [tensor("pixel_values", TensorProto.FLOAT, ["batch", 3, 4, 4])],
        [tensor("last_hidden_state", TensorProto.FLOAT, ["batch", 6, width])],
        {"shape": np.array([0, 6, width], np.int64)},
    )
    key, value = (naming.format(kind) for kind in ("key", "value"))
    present_key, present_value = (n.replace("past_key_values.", "present.") for n in (key, value))
    weights = {
        "embed": rng.standard_normal((vocab, width)).astype(np.float32),
        "head": rng.standard_normal((width, vocab)).astype(np.float32),
        "one": np.array([1], np.int64),
        "half": np.array(0.5, np.float32),
    }
    for with_past in (False, True):
        nodes = [
            helper.make_node("Gather", ["embed", "input_ids"], ["token"]),  # [b, s, w]
            helper.make_node("Unsqueeze", ["token", "one"], ["new"]),  # [b, 1, s, w]
            helper.make_node("Mul", ["new", "half"], ["new_value"]),
            helper.make_node("ReduceMean", ["encoder_hidden_states"], ["context"], axes=[1]),
        ]
        if with_past:
            nodes += [
                helper.make_node("Concat", [key, "new"], [present_key], axis=2),
                helper.make_node("Concat", [value, "new_value"], [present_value], axis=2),
            ]
        else:
            nodes += [
                helper.make_node("Identity", ["new"], [present_key]),
                helper.make_node("Identity", ["new_value"], [present_value]),
            ]
        nodes += [
            helper.make_node("ReduceMean", [present_value], ["memory"], axes=[1, 2], keepdims=0),
            helper.make_node("Unsqueeze", ["memory", "one"], ["memory_row"]),  # [b, 1, w]
            helper.make_node("Add", ["token", "context"], ["mixed"]),
            helper.make_node("Add", ["mixed", "memory_row"], ["hidden"]),
            helper.make_node("MatMul", ["hidden", "head"], ["logits"]),
        ]
        inputs = [
            tensor("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            tensor("encoder_hidden_states", TensorProto.FLOAT, ["batch", "encoded", width]),
        ]
        if with_past:
            inputs += [
                tensor(n, TensorProto.FLOAT, ["batch", 1, "past", width]) for n in (key, value)
            ]
        outputs = [tensor("logits", TensorProto.FLOAT, ["batch", "sequence", vocab])] + [
            tensor(n, TensorProto.FLOAT, ["batch", 1, "total", width])
            for n in (present_key, present_value)
        ]
        name = "decoder_with_past_model" if with_past else "decoder_model"
        save(name, nodes, inputs, outputs, weights)
    (folder / "config.json").write_text(json.dumps({"model_type": "vision-encoder-decoder"}))


def _ort_greedy(folder, pixels, start, count):
    """Greedy tokens from ONNX Runtime running the same files in a plain loop: the no-past
    decoder on the start token, then the with-past decoder on each chosen token."""
    ort = pytest.importorskip("onnxruntime")

    def session(name):
        return ort.InferenceSession(str(folder / f"{name}.onnx"))

    encoder, first, step = (
        session("encoder_model"),
        session("decoder_model"),
        session("decoder_with_past_model"),
    )
    hidden = encoder.run(None, {"pixel_values": pixels})[0]
    ids = np.full((pixels.shape[0], 1), start, np.int64)
    names = [o.name for o in first.get_outputs()]
    out = dict(zip(names, first.run(None, {"input_ids": ids, "encoder_hidden_states": hidden})))
    rows = []
    for _ in range(count):
        token = out["logits"][:, -1].argmax(-1)
        rows.append(token.tolist())
        feed = {"input_ids": token[:, None].astype(np.int64), "encoder_hidden_states": hidden}
        past_names = [i.name for i in step.get_inputs() if i.name.startswith("past_key_values.")]
        for name in past_names:
            feed[name] = out[name.replace("past_key_values.", "present.")]
        out = dict(zip(names, step.run(None, feed)))
    return [list(r) for r in zip(*rows)]


@pytest.mark.parametrize("naming", ["past_key_values.0.{}", "past_key_values.0.decoder.{}"])
def test_optimums_namings_of_the_past_decode_as_onnx_runtime(tmp_path, naming):
    # Optimum's ViT + GPT-2 export names its past past_key_values.N.key (no cross-attention
    # past); its encoder-decoders past_key_values.N.decoder.key: one place reads both.
    from transmuter.pipelines.generation.seq2seq import Seq2SeqDecoder

    _tiny_vision_decoder(tmp_path, naming=naming)
    decoder = Seq2SeqDecoder(transmuter.load_repo(tmp_path), "image-to-text")
    assert decoder.own == [naming.format("key"), naming.format("value")] and decoder.cross == []
    pixels = np.random.default_rng(5).standard_normal((2, 3, 4, 4)).astype(np.float32)
    got = decoder.generate({"pixel_values": pixels}, [0], max_new_tokens=5)
    assert got == _ort_greedy(tmp_path, pixels, 0, 5)


def test_a_past_without_its_present_names_what_was_looked_for(tmp_path):
    onnx = pytest.importorskip("onnx")
    from transmuter.pipelines.generation.seq2seq import Seq2SeqDecoder

    _tiny_vision_decoder(tmp_path, naming="past_key_values.0.{}")
    path = tmp_path / "decoder_with_past_model.onnx"
    model = onnx.load(str(path))
    for node in model.graph.node:
        node.output[:] = ["kept" if o == "present.0.key" else o for o in node.output]
    for output in model.graph.output:
        if output.name == "present.0.key":
            output.name = "kept"
    onnx.save(model, str(path))
    with pytest.raises(
        ModelLoadError, match=r"takes 'past_key_values.0.key' but returns none of \['present.0.key'"
    ):
        Seq2SeqDecoder(transmuter.load_repo(tmp_path), "image-to-text")


def _ort_t5_greedy(folder, rows, count, *, min_length=0, no_repeat=0, eos=1, start=0):
    """ONNX Runtime's greedy tokens on T5's files in a plain loop, one text at a time, with
    transformers' MinLength and NoRepeatNGram logits processors written out."""
    ort = pytest.importorskip("onnxruntime")

    def session(name):
        return ort.InferenceSession(str(folder / f"{name}.onnx"))

    encoder, first, step = (
        session(n) for n in ("encoder_model", "decoder_model", "decoder_with_past_model")
    )
    found = []
    for row in rows:
        ids = np.array([row], np.int64)
        mask = np.ones_like(ids)
        hidden = encoder.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        context = {"encoder_attention_mask": mask, "encoder_hidden_states": hidden}
        names = [o.name for o in first.get_outputs()]
        out = dict(zip(names, first.run(None, {"input_ids": np.array([[start]]), **context})))
        past = {n.replace("present", "past_key_values"): v for n, v in out.items() if "." in n}
        decoded = [start]
        for _ in range(count):
            logits = out["logits"][0, -1].astype(np.float64)
            if len(decoded) < min_length:
                logits[eos] = -np.inf
            if no_repeat and len(decoded) >= no_repeat:
                tail = decoded[len(decoded) - no_repeat + 1 :]
                for i in range(len(decoded) - no_repeat + 1):
                    if decoded[i : i + no_repeat - 1] == tail:
                        logits[decoded[i + no_repeat - 1]] = -np.inf
            token = int(logits.argmax())
            decoded.append(token)
            wanted = [i.name for i in step.get_inputs()]
            feed = {"input_ids": np.array([[token]], np.int64), **context, **past}
            names = [o.name for o in step.get_outputs()]
            out = dict(zip(names, step.run(None, {k: v for k, v in feed.items() if k in wanted})))
            past.update(
                {n.replace("present", "past_key_values"): v for n, v in out.items() if "." in n}
            )
        found.append(decoded[1:])
    return found


@pytest.mark.parametrize("decoding", ["padded", "past"])
def test_summarization_applies_the_tasks_generation_settings(tmp_path, decoding):
    # T5's task_specific_params["summarization"] carries min_length and no_repeat_ngram_size
    # (t5-small: 30 and 3) beside num_beams; transformers' pipeline applies them to greedy
    # decoding too, and ONNX Runtime's tokens through the same processors equal its own. They
    # were dropped with a warning, so the text parted from transformers' at the first n-gram
    # that repeats. Here: bigrams, on texts whose greedy tokens repeat one.
    shutil.copytree(REPOS / "t5-tasks", tmp_path / "t5")
    repo = tmp_path / "t5"
    config = json.loads((repo / "config.json").read_text())
    config["task_specific_params"]["summarization"].update(
        min_length=8, no_repeat_ngram_size=2, max_length=13, num_beams=1
    )
    (repo / "config.json").write_text(json.dumps(config))
    summarize = transmuter.pipeline("summarization", repo, decoding=decoding)
    texts = expected("t5-tasks")["texts"]
    rows = [summarize.tokenizer.encode(summarize.prefix + t).ids for t in texts]
    want = _ort_t5_greedy(repo, rows, 12, min_length=8, no_repeat=2)
    assert want[2][:3] != [want[2][0]] * 3  # the third text's repeated token is banned
    got = summarize.generate(rows)  # max_length=13: 12 tokens after the start token
    assert got == [row[: row.index(1) + 1] if 1 in row else row for row in want]


def test_merge_overlapping_is_whispers_longest_common_sequence():
    from transmuter.pipelines.audio.speech_recognition import merge_overlapping

    # Aligned on [3, 4] and cut at the overlap's middle: the left's 3, the right's 4.
    assert merge_overlapping([[1, 2, 3, 4], [3, 4, 5]]) == [1, 2, 3, 4, 5]
    assert merge_overlapping([[1, 2, 3, 4], [3, 9, 5]]) == [1, 2, 3, 4, 3, 9, 5]  # one match
    assert merge_overlapping([[7, 1, 2, 3], [1, 2, 3, 8], [3, 8, 6]]) == [7, 1, 2, 3, 8, 6]
    assert merge_overlapping([[1, 2], [], [3]]) == [1, 2, 3]
    assert merge_overlapping([]) == []


def test_whisper_transcribes_long_audio_in_chunks(whisper):
    # The fixture's window is 4 s (its n_samples): a 10 s clip is "long audio".
    from transmuter.pipelines.audio.speech_recognition import merge_overlapping

    waves = waveforms()
    clip = np.concatenate([waves[1], waves[0], waves[1], waves[0], waves[1][:32000]])
    assert clip.shape[0] == 160000
    options = dict(max_new_tokens=3, min_new_tokens=RECORDED)
    with pytest.raises(InputError, match=r"the audio is 10.0 s .* pass chunk_length_s"):
        whisper(clip, **options)
    got = whisper(clip, chunk_length_s=4, stride_length_s=1, **options)
    # transformers' chunk_iter: 4 s windows every 2 s (1 s strides), the last at the end.
    chunks = [clip[start : start + 64000] for start in (0, 32000, 64000, 96000)]
    rows = [whisper.generate(log_mel([c], whisper.features), **options)[0] for c in chunks]
    special = set(whisper.tokenizer.get_added_tokens_decoder())
    merged = merge_overlapping([[t for t in row if t not in special] for row in rows])
    assert got == {"text": whisper.tokenizer.decode(merged, skip_special_tokens=True)}
    # The chunks of several clips batch together; each clip gets its own text.
    both = whisper([clip, waves[0]], chunk_length_s=4, stride_length_s=1, **options)
    assert both[0] == got and both[1] == whisper(waves[0], **options)
    with pytest.raises(InputError, match="must be longer than its strides"):
        whisper(clip, chunk_length_s=2, stride_length_s=1)
    with pytest.raises(InputError, match="longer than the 4 s Whisper hears"):
        whisper(clip, chunk_length_s=8)
