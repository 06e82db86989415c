"""Fine-tune an ONNX cross-encoder with JAX and optax, then save it back to ONNX.

The model is tests/fixtures/finetune/cross_encoder.onnx: a small BERT sequence classifier (two
labels, seeded random weights) exported with torch.onnx by tests/fixtures/make_finetune.py. It
reads a (query, passage) pair and says whether the passage answers the query. Transmuter loads
every float initializer as a trainable param, the cross-entropy loss is computed in JAX on the
ONNX model's logits, optax's AdamW updates the params, and `transmuter.save` writes them back
into the ONNX file, which ONNX Runtime (when installed) then runs to check it computes what
Transmuter does.

    python examples/finetune.py [--out DIR] [--data-parallel]

--data-parallel trains over every device JAX sees, each batch split across them (on a CPU,
XLA_FLAGS=--xla_force_host_platform_device_count=8 makes eight): the losses are the
single-device ones up to float rounding.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

import transmuter

MODEL = (
    Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "finetune" / "cross_encoder.onnx"
)
STEPS = 30
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.01
BATCH_SIZE = 8
LENGTH = 24  # every batch is padded to this many tokens, so the training step compiles once

# (query, passage, label): 1 when the passage answers the query.
PAIRS = [
    ("how do i boil an egg", "put the egg in boiling water for nine minutes", 1),
    ("how do i boil an egg", "the train leaves the station at noon", 0),
    ("when does the train leave", "the train leaves the station at noon", 1),
    ("when does the train leave", "water the tomatoes every morning in summer", 0),
    ("how often should i water tomatoes", "water the tomatoes every morning in summer", 1),
    ("how often should i water tomatoes", "the striker scored twice in the final", 0),
    ("who scored in the final", "the striker scored twice in the final", 1),
    ("who scored in the final", "put the egg in boiling water for nine minutes", 0),
    ("what is the capital of france", "paris is the capital and largest city of france", 1),
    ("what is the capital of france", "cats sleep for most of the day", 0),
    ("how long do cats sleep", "cats sleep for most of the day", 1),
    ("how long do cats sleep", "a python list keeps items in order", 0),
    ("does a python list keep order", "a python list keeps items in order", 1),
    ("does a python list keep order", "the moon circles the earth every month", 0),
    ("how long does the moon take to orbit", "the moon circles the earth every month", 1),
    ("how long does the moon take to orbit", "paris is the capital and largest city of france", 0),
    ("what should i eat before a run", "eat a banana an hour before you run", 1),
    ("what should i eat before a run", "the bank raised interest rates again", 0),
    ("did interest rates go up", "the bank raised interest rates again", 1),
    ("did interest rates go up", "eat a banana an hour before you run", 0),
    ("how do i tune a guitar", "tune each guitar string against a reference note", 1),
    ("how do i tune a guitar", "rain is expected all weekend in the north", 0),
    ("will it rain this weekend", "rain is expected all weekend in the north", 1),
    ("will it rain this weekend", "tune each guitar string against a reference note", 0),
]

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]


def vocabulary() -> dict[str, int]:
    """Word -> id: the special tokens, then every word of PAIRS in sorted order."""
    words = sorted({w for q, p, _ in PAIRS for w in _words(q) + _words(p)})
    return {token: i for i, token in enumerate(SPECIAL + words)}


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def encode(query: str, passage: str, vocab: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """[CLS] query [SEP] passage [SEP], padded to LENGTH: the token ids and the token types."""
    unk = vocab["[UNK]"]
    first = [vocab["[CLS]"], *(vocab.get(w, unk) for w in _words(query)), vocab["[SEP]"]]
    second = [*(vocab.get(w, unk) for w in _words(passage)), vocab["[SEP]"]]
    if len(first) + len(second) > LENGTH:
        raise ValueError(f"({query!r}, {passage!r}) takes more than {LENGTH} tokens")
    ids = np.zeros(LENGTH, np.int64)
    types = np.zeros(LENGTH, np.int64)
    ids[: len(first) + len(second)] = first + second
    types[len(first) : len(first) + len(second)] = 1
    return ids, types


def batches() -> list[dict[str, np.ndarray]]:
    """PAIRS in batches of BATCH_SIZE: the model's three inputs and the labels."""
    vocab = vocabulary()
    out = []
    for start in range(0, len(PAIRS), BATCH_SIZE):
        chunk = PAIRS[start : start + BATCH_SIZE]
        ids, types = map(np.stack, zip(*(encode(q, p, vocab) for q, p, _ in chunk)))
        out.append(
            {
                "input_ids": ids,
                "attention_mask": (ids != vocab["[PAD]"]).astype(np.int64),
                "token_type_ids": types,
                "labels": np.array([label for _, _, label in chunk], np.int64),
            }
        )
    return out


def loss(params, model: transmuter.Model, batch: dict[str, np.ndarray]) -> jax.Array:
    """Mean cross-entropy of the model's logits against the batch's labels."""
    inputs = {name: batch[name] for name in model.inputs}
    logits = transmuter.run(model, inputs, params=params)["logits"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()


def train(
    model: transmuter.Model,
    data: list[dict[str, np.ndarray]],
    *,
    steps: int = STEPS,
    learning_rate: float = LEARNING_RATE,
    weight_decay: float = WEIGHT_DECAY,
    mesh: Mesh | None = None,
) -> tuple[dict[str, jax.Array], list[float]]:
    """`steps` AdamW steps over `data` in turn, from `model.params`: the params and the losses.

    With `mesh`, data parallelism: the params are replicated on its devices and each batch is
    split over all of them; jit's partitioner adds the all-reduce of the gradients."""
    # optax's defaults (b1 0.9, b2 0.999, eps 1e-8) are torch.optim.AdamW's, and both decay the
    # weights by lr * weight_decay * param before the Adam step's own change.
    optimizer = optax.adamw(learning_rate, weight_decay=weight_decay)

    @jax.jit
    def step(params, state, batch):
        value, grads = jax.value_and_grad(loss)(params, model, batch)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    params, rows = model.params, None
    if mesh is not None:
        params = jax.device_put(params, NamedSharding(mesh, PartitionSpec()))
        rows = NamedSharding(mesh, PartitionSpec(mesh.axis_names))  # the batch over every device
    state = optimizer.init(params)
    losses = []
    # The ids are int64, as the model declares; a jitted function's int64 arguments stay int64
    # only with x64 on (README, "64-bit").
    with jax.enable_x64(True):
        for i in range(steps):
            batch = data[i % len(data)]
            if rows is not None:
                batch = jax.device_put(batch, rows)
            params, state, value = step(params, state, batch)
            losses.append(float(value))
    return params, losses


def data_mesh() -> Mesh:
    """Every device on one "data" axis, of the partitioner's Auto type (Transmuter's operators
    are plain jax.numpy, which explicit axes would ask for output shardings)."""
    return jax.make_mesh((len(jax.devices()),), ("data",), axis_types=(AxisType.Auto,))


def predictor(model: transmuter.Model):
    """(params, batch) -> the model's logits, as one compiled program per batch shape."""
    forward = jax.jit(lambda params, inputs: transmuter.run(model, inputs, params=params))

    def predict(params, batch: dict[str, np.ndarray]) -> jax.Array:
        with jax.enable_x64(True):  # int64 ids, as in train
            return forward(params, {name: batch[name] for name in model.inputs})["logits"]

    return predict


def accuracy(predict, params, data: list[dict[str, np.ndarray]]) -> float:
    """The fraction of pairs whose larger logit is their label."""
    right = sum(int((jnp.argmax(predict(params, b), -1) == b["labels"]).sum()) for b in data)
    return right / sum(len(b["labels"]) for b in data)


def check_with_onnxruntime(path: Path, predict, params, data) -> float | None:
    """Max |ONNX Runtime - Transmuter| over the saved model's logits; None without onnxruntime."""
    try:
        import onnxruntime
    except ImportError:
        return None
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    error = 0.0
    for batch in data:
        theirs = session.run(["logits"], {name: batch[name] for name in names})[0]
        error = max(error, float(np.abs(theirs - np.asarray(predict(params, batch))).max()))
    return error


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="folder for the fine-tuned model (default: temp)")
    parser.add_argument(
        "--data-parallel", action="store_true", help="split each batch over every device"
    )
    args = parser.parse_args(argv)
    model = transmuter.load(MODEL, trainable=True)
    data = batches()
    size = sum(p.size for p in model.params.values())
    print(f"{MODEL.name}: {len(model.params)} params, {size} weights; {len(PAIRS)} pairs")
    predict = predictor(model)
    print(f"accuracy before: {accuracy(predict, model.params, data):.2f}")
    mesh = data_mesh() if args.data_parallel else None
    if mesh is not None:
        print(f"data parallel over {mesh.size} devices")
    params, losses = train(model, data, mesh=mesh)
    for i, value in enumerate(losses):
        print(f"step {i:2d}  loss {value:.4f}")
    print(f"accuracy after: {accuracy(predict, params, data):.2f}")

    with tempfile.TemporaryDirectory() as scratch:
        folder = args.out or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "cross_encoder_finetuned.onnx"
        transmuter.save(model, path, params=params)
        print(f"saved {path.name} ({path.stat().st_size} bytes)")
        error = check_with_onnxruntime(path, predict, params, data)
        if error is None:
            print("onnxruntime is not installed: the saved model was not checked")
        else:
            print(f"max |onnxruntime - transmuter| on the saved model's logits: {error:.2e}")


if __name__ == "__main__":
    main()
