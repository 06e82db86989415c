"""The long fuzz run (issue 18), outside CI: the cases of fuzz_cases.py by the hundred thousand,
in worker subprocesses, so that a crash (an abort in XLA, a segfault) or a hang is counted and
the worker replaced, instead of ending the run.

    python tests/fuzz/run_long.py --count 100000 --workers 2 [--load-only] [--seed 0]

Case i is reproducible alone: kind KINDS[i % len(KINDS)], fixture and mutation drawn from
random.Random(seed * 10**9 + i) (--case i prints its outcome in this process). Prints counts
per kind and outcome (ran / loaded, TransmuterError by class, other exceptions by type with a
sample, crashes by signal, timeouts), and exits 1 if any case was not a result or a
TransmuterError.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import selectors
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def case(index: int, seed: int, folder: str):
    import fuzz_cases as fc

    kinds = fc.KINDS
    rng = random.Random(seed * 10**9 + index)
    kind = kinds[index % len(kinds)]
    fixture = rng.choice(sorted(fc.FIXTURES))
    return kind, fixture, fc.make_case(kind, fixture, rng, folder)


def worker(seed: int, run: bool, timeout: float) -> None:
    """Reads case numbers from stdin, writes one JSON line per case to stdout."""
    import fuzz_cases as fc

    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints go to stderr, not into the protocol
    for line in sys.stdin:
        index = int(line)
        with tempfile.TemporaryDirectory() as folder:
            try:
                kind, fixture, source = case(index, seed, folder)
            except Exception as exc:  # a bug of the generator, not of Transmuter
                out.write(json.dumps([index, "?", "?", "generator", repr(exc)[:300]]) + "\n")
                continue
            result, detail = fc.outcome(source, run=run, timeout=timeout)
        out.write(json.dumps([index, kind, fixture, result, detail]) + "\n")


class Worker:
    def __init__(self, args):
        command = [sys.executable, os.path.abspath(__file__), "--worker", "--seed", str(args.seed)]
        command += ["--timeout", str(args.timeout)] + (["--load-only"] if args.load_only else [])
        env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.setdefault("JAX_PLATFORMS", "cpu")
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=env,
        )
        self.index: int | None = None
        self.started = 0.0

    def send(self, index: int) -> None:
        self.index, self.started = index, time.monotonic()
        self.proc.stdin.write(f"{index}\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    parser.add_argument("--load-only", action="store_true", help="load, do not run")
    parser.add_argument("--case", type=int, help="run one case here and print its outcome")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, HERE)
    if args.worker:
        worker(args.seed, not args.load_only, args.timeout)
        return 0
    if args.case is not None:
        import fuzz_cases as fc

        with tempfile.TemporaryDirectory() as folder:
            kind, fixture, source = case(args.case, args.seed, folder)
            print(kind, fixture, fc.outcome(source, run=not args.load_only, timeout=args.timeout))
        return 0

    counts: collections.Counter = collections.Counter()
    samples: dict = {}
    selector = selectors.DefaultSelector()
    workers = [Worker(args) for _ in range(args.workers)]
    for w in workers:
        selector.register(w.proc.stdout, selectors.EVENT_READ, w)
    next_index, done, start = 0, 0, time.monotonic()

    def record(kind, fixture, result, detail, index):
        nonlocal done
        done += 1
        key = (kind, result, detail.split(":")[0] if result == "foreign" else detail)
        counts[key] += 1
        if result not in ("ran", "loaded", "TransmuterError"):
            samples.setdefault(key, (index, fixture, detail))

    for w in workers:
        if next_index < args.count:
            w.send(next_index)
            next_index += 1
    while done < args.count:
        for key, _ in selector.select(timeout=1.0):
            w = key.data
            line = w.proc.stdout.readline()
            if line:
                index, kind, fixture, result, detail = json.loads(line)
                record(kind, fixture, result, detail, index)
                w.index = None
            else:  # the worker died on w.index: a crash
                code = w.proc.wait()
                kind = KINDS[w.index % len(KINDS)]
                why = f"signal {-code}" if code < 0 else f"exit {code}"
                record(kind, "?", "crash", why, w.index)
                selector.unregister(w.proc.stdout)
                w = replace(workers, w, args, selector)
            if w.index is None and next_index < args.count:
                w.send(next_index)
                next_index += 1
        for w in list(workers):  # a hang the in-process alarm could not interrupt
            if w.index is not None and time.monotonic() - w.started > 2 * args.timeout + 30:
                kind = KINDS[w.index % len(KINDS)]
                record(kind, "?", "timeout", "killed", w.index)
                selector.unregister(w.proc.stdout)
                w.stop()
                w = replace(workers, w, args, selector)
                if next_index < args.count:
                    w.send(next_index)
                    next_index += 1
        if done and done % 5000 < args.workers:
            rate = done / (time.monotonic() - start)
            print(f"... {done} cases, {rate:.1f}/s", file=sys.stderr, flush=True)
    for w in workers:
        w.stop()
    elapsed = time.monotonic() - start
    mode = "load only" if args.load_only else "load and run eagerly"
    print(f"{done} cases ({mode}, seed {args.seed}) in {elapsed:.0f} s: {done / elapsed:.1f}/s")
    totals: collections.Counter = collections.Counter()
    for (kind, result, detail), n in sorted(counts.items()):
        totals[(result, detail if result != "loaded" else "")] += n
        print(f"{n:8d}  {kind:10s} {result} {detail}")
    print("totals:")
    for (result, detail), n in sorted(totals.items()):
        print(f"{n:8d}  {result} {detail}")
    for key, (index, fixture, detail) in samples.items():
        print(f"sample {key}: case {index} ({fixture}): {detail}")
    return 1 if samples else 0


def replace(workers: list, old: Worker, args, selector) -> Worker:
    new = Worker(args)
    workers[workers.index(old)] = new
    selector.register(new.proc.stdout, selectors.EVENT_READ, new)
    return new


KINDS = ("truncate", "flip", "dims", "opset", "attribute", "external", "graph")

if __name__ == "__main__":
    sys.exit(main())
