"""Where the LLM engine's generation thread spends its steps: py-spy samples of
bench/llm_graphs.py at one setting, summed per function over every stack that holds it.

    python bench/llm_step_profile.py [--device cuda] [--setting thaw] [--streams 32]
                                     [--rounds 6] [--quick] [--rate 200] [--out DIR]

The companion of bench/llm_graphs.py: where that shows a step's time (TPOT), this
shows which part of transformers' step loop holds it: the forward and sampling (on a
GPU, a graph's replay), preparing the next batch (the static inputs' reset, the
attention mask, the cache's read and write indices) or updating the batch after it
(outputs to their requests). A function counts once a sample however deep it is, so a
caller's share holds its callees'. A host-bound step shows most of its time outside
the forward. Needs py-spy and the right to trace a child process (root, or ptrace
allowed). Writes OUT/step.txt (py-spy's raw format) and prints the generation
thread's share of the samples, then its functions by inclusive share.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GENERATION_THREAD = "_run_generation_loop"  # transformers' manager's loop
TOP_FUNCTIONS = 30
_LINE = re.compile(r" \(([^()]*?)(?::\d+)?\)$")  # "name (file:line)" -> name and file


def function_of(frame: str) -> str:
    """``name (path/file.py:12)`` as ``name file.py``: a function, whatever its line."""
    found = _LINE.search(frame)
    if found is None:
        return frame
    return f"{frame[: found.start()]} {Path(found.group(1)).name}"


def inclusive(raw: Path, thread: str = GENERATION_THREAD, top: int = TOP_FUNCTIONS) -> str:
    """The samples of a py-spy raw file whose stack runs through ``thread`` (a frame
    or thread name containing it), their share of all, and each function's share of
    them, a function counted once a sample."""
    if not raw.exists():
        return f"{raw}: no samples (py-spy could not attach?)"
    total = held = 0
    functions: collections.Counter[str] = collections.Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        if not any(thread in frame for frame in frames):
            continue
        held += n
        for name in {
            function_of(frame) for frame in frames if not frame.startswith(("process ", "thread "))
        }:
            functions[name] += n
    lines = [f"== {raw.name}: {total} samples, {held} in the {thread} thread"]
    for name, n in functions.most_common(top):
        lines.append(f"{100 * n / max(held, 1):5.1f}%  {name}")
    return "\n".join(lines)


def record_command(spy: str, out: Path, rate: int, bench: list[str]) -> list[str]:
    """py-spy recording ``bench`` (bench/llm_graphs.py's arguments) in a child process."""
    graphs = str(Path(__file__).resolve().parent / "llm_graphs.py")
    record = [spy, "record", "--rate", str(rate), "--format", "raw", "--output", str(out)]
    return [*record, "--", sys.executable, graphs, *bench]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--setting", default="thaw", help="one of bench/llm_graphs.py's settings")
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="the tiny example model")
    p.add_argument("--model", help="a model directory (default: the bench's example model)")
    p.add_argument("--rate", type=int, default=200, help="py-spy's samples a second")
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parent / ".data")
    p.add_argument("--out", type=Path, default=Path("llm-step-profile"))
    args = p.parse_args(argv)
    beside = Path(sys.executable).parent / "py-spy"  # a venv's, when it is not on PATH
    spy = str(beside) if beside.exists() else shutil.which("py-spy")
    if spy is None:
        p.error("py-spy is not installed: pip install py-spy")
    bench = ["--device", args.device, "--settings", args.setting, "--streams", str(args.streams)]
    bench += ["--rounds", str(args.rounds), "--max-tokens", str(args.max_tokens)]
    bench += ["--data-dir", str(args.data_dir)]
    bench += ["--quick"] if args.quick else []
    bench += ["--model", args.model] if args.model else []
    args.out.mkdir(parents=True, exist_ok=True)
    raw = args.out / "step.txt"
    ran = subprocess.run(record_command(spy, raw, args.rate, bench), check=False)
    print(inclusive(raw))
    return ran.returncode


if __name__ == "__main__":
    raise SystemExit(main())
