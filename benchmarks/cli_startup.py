# Command: .venv/bin/python benchmarks/cli_startup.py [--repeat 5]
"""Start-up of the `bert-suite` command line: wall time of `--help`, a subcommand's `--help` and a usage
error (a mistyped command), each the median of --repeat fresh processes, cold and warm, beside
`python -c "import bert_suite"` (what the command line imported before it moved to `bert_suite_cli`,
and what every command that runs still imports).

cold: every process compiles its Python bytecode anew (PYTHONPYCACHEPREFIX set to an empty folder),
      as on the first run after an install; warm: the bytecode caches are used. The OS page cache is
      warm in both (dropping it needs root). Results: runs/bench/cli_startup.json and a table."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = {
    "bert-suite --help": ["-m", "bert_suite_cli", "--help"],
    "bert-suite finetune --help": ["-m", "bert_suite_cli", "finetune", "--help"],
    "bert-suite fintune (usage error)": ["-m", "bert_suite_cli", "fintune"],
    'python -c "import bert_suite"': ["-c", "import bert_suite"],
}


def timed(argv: list[str], cold: bool) -> float:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    cache = tempfile.mkdtemp() if cold else None
    if cache:
        env["PYTHONPYCACHEPREFIX"] = cache
    start = time.perf_counter()
    subprocess.run([sys.executable, *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=300)
    elapsed = time.perf_counter() - start
    if cache:
        shutil.rmtree(cache, ignore_errors=True)
    return elapsed


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="runs/bench/cli_startup.json")
    args = parser.parse_args(argv)
    results = {}
    for name, case in CASES.items():
        timed(case, cold=False)  # fill the bytecode caches and the page cache once
        results[name] = {mode: statistics.median(timed(case, mode == "cold") for _ in range(args.repeat))
                         for mode in ("cold", "warm")}
    print("| command | cold (s) | warm (s) |\n|---|---:|---:|")
    for name, r in results.items():
        print(f"| `{name}` | {r['cold']:.2f} | {r['warm']:.2f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"repeat": args.repeat, "results": results}, indent=2))
    return results


if __name__ == "__main__":
    main()
