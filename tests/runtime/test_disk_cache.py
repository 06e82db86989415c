"""The on-disk compile cache (cache_dir): a folder, never a file; damaged entries are removed
and written again instead of being read, warned about and recompiled by every process; a
program read from disk that XLA refuses is a CacheError, not XLA's own error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import transmuter
from transmuter.errors import CacheError, InputError
from transmuter.runtime.disk_cache import guarded

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models"

COMPILE = """
import sys, warnings
import numpy as np
import transmuter

events = []
transmuter.telemetry.attach(
    "t", ["transmuter.segment.compile.stop"], lambda e, m, md: events.append(md["disk_cache"])
)
model = transmuter.load(sys.argv[1])
ids = np.ones((1, 4), np.int64)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    transmuter.compile(model, {"input_ids": ids, "attention_mask": ids, "token_type_ids": 0 * ids},
                       cache_dir=sys.argv[2])
print(events, [str(w.message).split(";")[0] for w in caught if "cache" in str(w.message)])
"""


def test_a_cache_dir_that_is_a_file_is_an_input_error(tmp_path):
    model = transmuter.load(FIXTURES / "bert.onnx")
    ids = np.ones((1, 4), np.int64)
    inputs = {"input_ids": ids, "attention_mask": ids, "token_type_ids": 0 * ids}
    path = tmp_path / "cache"
    path.write_text("not a folder")
    with pytest.raises(InputError, match="cache_dir .* is a file"):
        transmuter.compile(model, inputs, cache_dir=path)


@pytest.mark.slow
def test_a_damaged_entry_is_written_again_once(tmp_path):
    def compile_in_a_new_process() -> str:
        command = [sys.executable, "-c", COMPILE, str(FIXTURES / "bert.onnx"), str(tmp_path)]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()

    assert compile_in_a_new_process() == "['miss'] []"
    entries = list(tmp_path.glob("jit_program-*-cache"))
    assert len(entries) == 1
    entries[0].write_bytes(entries[0].read_bytes()[:1000])  # truncated, as by a full disk
    repaired = compile_in_a_new_process()
    assert repaired.startswith("""['repaired'] ["removed 1 damaged entries from the compile""")
    assert compile_in_a_new_process() == "['hit'] []"


def test_a_program_from_disk_that_xla_refuses_is_a_cache_error():
    def refused(*args):
        raise jax.errors.JaxRuntimeError("INVALID_ARGUMENT: Executable expected parameter 0")

    with pytest.raises(CacheError, match="does not fit its call .* delete the folder"):
        guarded(refused, "/tmp/cache")()


def test_a_program_from_disk_keeps_its_optimized_hlo():
    """Readers of the optimized HLO (loop_convolutions, the sharding cases) read a program from
    disk as they read a fresh one."""
    compiled = jax.jit(lambda x: x * 2).lower(np.ones(3, np.float32)).compile()
    program = guarded(compiled, "/tmp/cache")
    assert program.as_text() == compiled.as_text()
    assert program(np.ones(3, np.float32)).tolist() == [2, 2, 2]
