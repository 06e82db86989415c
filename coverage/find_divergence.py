"""The first node where Transmuter and ONNX Runtime disagree on a model.

    python coverage/find_divergence.py MODEL.onnx INPUTS.npz [--prefix in/] [--rtol 1e-4 --atol 1e-5]

INPUTS.npz holds the model's inputs by name, or under a prefix given with --prefix (the fixture
files use `case0/in/`, the cases record_references.py writes `in/`). The search is
transmuter.checking.first_divergence, what `transmuter check` runs after a mismatch: ONNX Runtime
(optimizations off, on the model as `transmuter check` hands it over) exposes every intermediate
as an output; Transmuter runs eagerly and keeps every value; nodes are compared in graph order.
Random operators without a seed draw from jax.random.key(--seed): their values differ from ONNX
Runtime's, so the search stops at the first of them.
"""

from __future__ import annotations

import argparse
import sys

import jax
import numpy as np

import transmuter
from transmuter import checking, ir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("inputs")
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--atol", type=float, default=1e-5)
    parser.add_argument("--prefix", default="", help="key prefix of the inputs in the .npz")
    parser.add_argument("--seed", type=int, default=0, help="PRNG key of unseeded random ops")
    args = parser.parse_args(argv)
    model = transmuter.load(args.model)
    with np.load(args.inputs) as stored:
        named = {k[len(args.prefix) :]: k for k in stored.files if k.startswith(args.prefix)}
        inputs = {name: stored[key] for name, key in named.items() if name in model.inputs}
    found = checking.first_divergence(
        model, args.model, inputs, rtol=args.rtol, atol=args.atol, key=jax.random.key(args.seed)
    )
    if found is None:
        print("no divergence: every intermediate agrees within tolerance")
        return 0
    d = found.difference
    print(
        f"first divergence: node {found.node!r} ({found.op_type}) output {found.output!r}: "
        f"max abs {d.max_abs:.3g}, max rel {d.max_rel:.3g} {d.detail}".rstrip()
    )
    print(f"  inputs: {list(found.inputs)}")
    node = next(n for n in model.ir.graph.nodes if n.label == found.node)
    attrs = {k: v for k, v in node.attrs.items() if not isinstance(v, ir.Graph)}
    print(f"  attributes: {attrs}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
