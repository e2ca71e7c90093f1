# Command: .venv/bin/python benchmarks/cli_startup.py [--repeat 5]
"""Start-up of the `bert-suite` command line: wall time of `--help`, a subcommand's `--help` and a usage error (a
mistyped command), each the median of --repeat fresh processes, cold and warm, beside `python -c "import bert_suite"`
(what every command that runs imports). Then the import of the modules the data commands run on (goal for
`bert_suite.pretraining.tokenizer`: under 0.5 s and 100 MB, without torch) beside the model's, each in a fresh
process: its wall time (median, warm) and the process's peak memory (VmHWM). cold: every process compiles its
bytecode anew (PYTHONPYCACHEPREFIX an empty folder), as the first run after an install; warm: the caches are used
(the OS page cache is warm in both). Results: runs/bench/cli_startup.json and tables."""

from __future__ import annotations

import argparse
import json
import os
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
MODULES = ("bert_suite.pretraining.tokenizer", "bert_suite.pretraining.instances", "bert_suite.pretraining.decontaminate",
           "bert_suite.modeling_bert_suite")
IMPORT = """import sys, time
started = time.perf_counter()
import {module}
seconds = time.perf_counter() - started
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")) / 1024
print(seconds, peak, "torch" in sys.modules)"""


def imported(module: str, repeat: int) -> dict:
    """The median seconds of importing `module` in a fresh process, its process's peak MiB and whether torch came."""
    runs = []
    for _ in range(repeat + 1):  # the first fills the bytecode caches
        out = subprocess.run([sys.executable, "-c", IMPORT.format(module=module)], capture_output=True, text=True,
                             env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=300, check=True).stdout.split()
        runs.append((float(out[0]), float(out[1]), out[2] == "True"))
    runs = runs[1:]
    return {"seconds": statistics.median(r[0] for r in runs), "peak_mib": statistics.median(r[1] for r in runs),
            "torch": runs[0][2]}


def timed(argv: list[str], cold: bool) -> float:
    """The wall time of one process; cold: with an empty bytecode cache of its own."""
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        subprocess.run([sys.executable, *argv], env=dict(os.environ, HF_HUB_OFFLINE="1", **(
            {"PYTHONPYCACHEPREFIX": cache} if cold else {})), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=300)
        return time.perf_counter() - start


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
    imports = {module: imported(module, args.repeat) for module in MODULES}
    print("\n| import | seconds (warm) | peak MiB | torch |\n|---|---:|---:|---|")
    for module, r in imports.items():
        print(f"| `{module}` | {r['seconds']:.2f} | {r['peak_mib']:.0f} | {'yes' if r['torch'] else 'no'} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"repeat": args.repeat, "results": results, "imports": imports}, indent=2))
    return results


if __name__ == "__main__":
    main()
