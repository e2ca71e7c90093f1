# Command: .venv/bin/python benchmarks/grid_workers.py --storage sqlite [--workers 1 2 3]
#          .venv/bin/python benchmarks/grid_workers.py --storage postgresql+psycopg://USER@HOST:PORT/DB
"""Grid throughput with 1, 2 and 3 workers sharing one study: the same 6-point grid (learning rate {1e-3,
5e-4, 2e-4} x batch {16, 32}, 1 epoch, 1 seed; tiny preset on GLUE RTE's real files, first 512 training and
all 277 dev examples, 64 tokens) run by N `bert-suite grid` processes started together on one storage, each
with OMP_NUM_THREADS=1 (on 2 cores the workers contend for CPU). Reports wall time, trials per minute,
duplicate points (must be 0), and the per-trial time outside training (trial duration in the study minus the
Trainer's train_runtime: the model's creation, the final dev prediction, saving the checkpoint and the
study's bookkeeping), and writes runs/bench/grid_workers_<storage>.json.

For PostgreSQL give a URL of an empty database per run: the script appends _w1, _w2, _w3 to the
database name and creates them (CREATE DATABASE, through psycopg)."""

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

from common import DEFAULT_DATA, RESULTS_DIR, ROOT, create_database

GRID = ["--learning_rates", "1e-3", "5e-4", "2e-4", "--batch_sizes", "16", "32", "--epochs", "1", "--seeds", "1"]
POINTS = 6


def storage_for(spec: str, workers: int, folder: Path) -> str:
    if spec == "sqlite":
        return f"sqlite:///{folder / 'shared.db'}"
    server, name = spec.rsplit("/", 1)
    return create_database(server, f"{name}_w{workers}_{int(time.time())}")


def run(workers: int, spec: str, data: Path, vocab: Path, folder: Path) -> dict:
    import optuna

    storage = storage_for(spec, workers, folder)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    start = time.time()
    procs = [subprocess.Popen([sys.executable, "-m", "bert_suite.cli", "grid", "rte", "--model", "preset:tiny",
                               "--tokenizer", str(vocab), "--data_dir", str(data), "--output_dir",
                               str(folder / f"w{i}"), "--max_seq_length", "64", "--max_train_samples", "512",
                               "--disable_tqdm", "true", "--storage", storage, *GRID],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i in range(workers)]
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            raise SystemExit(f"a worker failed:\n{err[-3000:]}")
    wall = time.time() - start
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    points = {tuple(sorted(t.params.items())) for t in complete}
    outside = [(t.datetime_complete - t.datetime_start).total_seconds() - t.user_attrs["train_runtime"]
               for t in complete]
    by_worker = {}
    for t in complete:
        by_worker.setdefault(t.user_attrs["worker"]["pid"], 0)
        by_worker[t.user_attrs["worker"]["pid"]] += 1
    return {"workers": workers, "wall_s": round(wall, 1), "trials": len(complete),
            "trials_per_minute": round(60 * len(complete) / wall, 2), "duplicate_points": len(complete) - len(points),
            "outside_training_s_median": round(statistics.median(outside), 2),
            "trials_per_worker": sorted(by_worker.values(), reverse=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", default="sqlite", help="sqlite, or a PostgreSQL URL (see the module docstring)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--data_dir", type=Path, default=DEFAULT_DATA / "glue" / "RTE")
    parser.add_argument("--tokenizer", type=Path, default=DEFAULT_DATA / "vocab" / "bert-base-uncased")
    args = parser.parse_args()
    rows = []
    for n in args.workers:
        with tempfile.TemporaryDirectory(dir=ROOT / "runs") as tmp:
            rows.append(run(n, args.storage, args.data_dir, args.tokenizer, Path(tmp)))
        print(json.dumps(rows[-1]), flush=True)
    kind = "sqlite" if args.storage == "sqlite" else "postgresql"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"grid_workers_{kind}.json").write_text(json.dumps(rows, indent=2))
    print("| storage | workers | wall (s) | trials/min | duplicate points | per trial outside training (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {kind} | {r['workers']} | {r['wall_s']} | {r['trials_per_minute']} | {r['duplicate_points']} | "
              f"{r['outside_training_s_median']} |")


if __name__ == "__main__":
    main()
