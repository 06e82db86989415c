"""The convolutions inside loops of an optimized XLA program, and which of them XLA:CPU runs slowly.

XLA:CPU rewrites a convolution into the form its fast (Eigen) kernel takes, channels last, only
in the entry computation (conv_canonicalization visits nothing else). A convolution inside a
while body reaches the backend as the program wrote it: anything but channels-last activations
with (spatial..., in, out) kernels falls back to the unoptimized emitter, about 100x slower for
NCHW and 10x for OHWI kernels (JAX 0.10.2). So every convolution a loop runs must already read
`b01f_01io->b01f` (for two spatial dims; `b0f_0io->b0f` for one, and so on).

`slow_loop_convolutions(compiled.as_text())` lists the others; tests and benchmarks call it on
the programs they compile.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The start of a computation: `%name (params) -> type {`, or `ENTRY %name ...`.
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
# Computations an instruction runs: while bodies and conditions, fusions, calls, branches.
_CALLED = re.compile(
    r"\b(?:body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)"
)
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_WHILE_BODY = re.compile(r"\bwhile\(.*\bbody=%?([\w.\-]+)")
_DIM_LABELS = re.compile(r"\bdim_labels=([\w>\-]+)")
# After `name = `: the shape (a tuple's nests braces and parentheses), then the opcode.
_OPCODE = re.compile(r"^(?:\S+|\(.*?\))\s+([\w\-]+)\(")
_OPERANDS = re.compile(r"%([\w.\-]+)")


@dataclass(frozen=True)
class Convolution:
    computation: str  # the computation holding it (a while body, or one the body calls)
    name: str
    dim_labels: str  # e.g. b01f_01io->b01f
    kernel: str  # the opcode giving its kernel: get-tuple-element where the loop state holds it


def channels_last_labels(spatial: int) -> str:
    """The dim_labels XLA:CPU runs fast everywhere: NHWC activations, HWIO kernels."""
    dims = "".join(str(i) for i in range(spatial))
    return f"b{dims}f_{dims}io->b{dims}f"


@dataclass(frozen=True)
class _Instruction:
    opcode: str
    operands: tuple[str, ...]
    text: str


def _parse(hlo_text: str) -> dict[str, dict[str, _Instruction]]:
    """computation -> instruction name -> its opcode, operands and text."""
    computations: dict[str, dict[str, _Instruction]] = {}
    current = None
    for line in hlo_text.splitlines():
        if current is None:
            match = _COMPUTATION.match(line)
            if match and "->" in line:
                current = computations.setdefault(match.group(2), {})
        elif line.strip() == "}":
            current = None
        elif match := _INSTRUCTION.match(line):
            name, text = match.groups()
            opcode = _OPCODE.match(text)
            operands = ()
            if opcode:
                inside = text[opcode.end() :].split(")", 1)[0]
                operands = tuple(_OPERANDS.findall(inside))
            current[name] = _Instruction(opcode.group(1) if opcode else "", operands, text)
    return computations


def _called(text: str) -> list[str]:
    names = _CALLED.findall(text)
    for group in _BRANCHES.findall(text):
        names.extend(n.strip().lstrip("%") for n in group.split(",") if n.strip())
    return names


def loop_convolutions(hlo_text: str) -> list[Convolution]:
    """Every convolution in a while body of `hlo_text` (an HloModule's text, as
    `compiled.as_text()` gives it) or in a computation such a body calls, nested loops too."""
    computations = _parse(hlo_text)
    callers: dict[str, tuple[str, _Instruction]] = {}  # computation -> (caller's, the call)
    for caller, instructions in computations.items():
        for instruction in instructions.values():
            for callee in _called(instruction.text):
                callers.setdefault(callee, (caller, instruction))

    def source(computation: str, name: str) -> str:
        """The opcode producing `name`, followed out of fusions and calls through parameters."""
        instruction = computations[computation].get(name)
        while instruction is not None and instruction.opcode == "parameter":
            if computation not in callers or callers[computation][1].opcode == "while":
                break  # a loop's own parameter: get-tuple-element reads the state
            index = int(re.search(r"parameter\((\d+)\)", instruction.text).group(1))
            computation, call = callers[computation]
            if index >= len(call.operands):
                break
            instruction = computations[computation].get(call.operands[index])
        return instruction.opcode if instruction is not None else ""

    bodies = [
        body
        for instructions in computations.values()
        for instruction in instructions.values()
        for body in _WHILE_BODY.findall(instruction.text)
    ]
    seen: set[str] = set()
    stack = list(bodies)
    while stack:  # the bodies and everything they run
        name = stack.pop()
        if name in seen or name not in computations:
            continue
        seen.add(name)
        for instruction in computations[name].values():
            stack.extend(_called(instruction.text))
    found = []
    for computation in sorted(seen):
        for name, instruction in computations[computation].items():
            if instruction.opcode == "convolution":
                labels = _DIM_LABELS.search(instruction.text)
                kernel = instruction.operands[1] if len(instruction.operands) > 1 else ""
                found.append(
                    Convolution(
                        computation,
                        name,
                        labels.group(1) if labels else "",
                        source(computation, kernel),
                    )
                )
    return found


def slow_loop_convolutions(hlo_text: str) -> list[Convolution]:
    """The convolutions in loops of `hlo_text` that are not channels last with HWIO kernels."""
    slow = []
    for conv in loop_convolutions(hlo_text):
        spatial = len(conv.dim_labels.split("_", 1)[0]) - 2  # the digits between b and f
        if conv.dim_labels != channels_last_labels(max(spatial, 0)):
            slow.append(conv)
    return slow
