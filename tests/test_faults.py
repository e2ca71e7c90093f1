"""Faults (docs/RELIABILITY.md): a grid SIGKILLed at its most fragile moments and rerun ends with
the same study, results table and best checkpoint as an uninterrupted grid; a trial whose loss
becomes NaN is recorded as failed; pre-training killed while writing a checkpoint resumes exactly
from the last complete one; every results file is written atomically."""

import ast
import csv
import io
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bert_suite import faults
from bert_suite.cli import main as cli_main
from bert_suite.pretraining.checkpoints import complete_checkpoints, trim_log
from helpers import fresh_state, load_recipe, recipe_args, run_args, write_rte_like

REPO = Path(__file__).resolve().parents[1]
GRID = ["--max_steps", "2", "--learning_rates", "1e-3", "5e-4", "--batch_sizes", "16", "--epochs", "1"]


def grid_process(data: Path, out: Path, failpoint: str | None = None, **popen) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop(faults.ENV, None)
    if failpoint:
        env[faults.ENV] = failpoint
    return subprocess.Popen([sys.executable, "-m", "bert_suite.cli", "grid", "rte", *run_args(data, out), *GRID],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


def run_grid_process(data: Path, out: Path, failpoint: str | None = None) -> tuple[int, str]:
    proc = grid_process(data, out, failpoint)
    output, _ = proc.communicate(timeout=300)
    return proc.returncode, output


def table_without_runtime(out: Path) -> tuple[list[dict], str]:
    """grid_results.csv rows and grid_results.md, minus the wall-clock columns (the only values
    that differ between two identical runs)."""
    rows = list(csv.DictReader(io.StringIO((out / "grid_results.csv").read_text())))
    for row in rows:
        row.pop("train_runtime")
    lines = (out / "grid_results.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| trial"))
    column = [c.strip() for c in header.strip("|").split("|")].index("train_runtime")
    md = []
    for line in lines:
        if line.startswith("|") and line.count("|") == header.count("|") and not line.startswith("|---"):
            cells = line.strip("|").split("|")
            line = "|".join(cells[:column] + cells[column + 1:])
        md.append(line)
    return rows, "\n".join(md)


@pytest.fixture(scope="module")
def grid_data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    data = write_rte_like(tmp / "data", n_train=64, n_dev=32)
    started = time.monotonic()
    rc, output = run_grid_process(data, tmp / "whole")
    assert rc == 0, output
    return data, tmp / "whole", time.monotonic() - started  # the uninterrupted grid's wall time on this machine


def check_same_grid(out: Path, whole: Path) -> None:
    assert table_without_runtime(out) == table_without_runtime(whole)
    with sqlite3.connect(out / "grid.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        states = db.execute("SELECT number, state FROM trials ORDER BY number").fetchall()
    # each grid point ran under one trial number, the same as in the uninterrupted grid; no
    # trial was added for a point whose run was interrupted, and none is left running
    assert states == [(n, "COMPLETE") for n in range(2)]
    best = json.loads((out / "best_trial.json").read_text())
    assert json.loads((out / "best" / "best_trial.json").read_text())["trial"] == best["trial"]
    assert best["trial"] == json.loads((whole / "best_trial.json").read_text())["trial"]
    assert (out / "best" / "model.safetensors").read_bytes() == (whole / "best" / "model.safetensors").read_bytes()
    assert not (out / "best.incoming").exists()
    assert not list((out / "trials").rglob("model.safetensors"))  # only the best checkpoint is kept


def test_grid_killed_while_swapping_in_its_best_checkpoint_ends_as_an_uninterrupted_grid(grid_data, tmp_path):
    """The first of the fragile moments below (the other two are in make test elsewhere: a worker killed between
    training and recording, tests/test_grid_workers.py; a grid killed after recording, tests/test_compare.py)."""
    data, whole, _ = grid_data
    out = tmp_path / "killed"
    rc, output = run_grid_process(data, out, "grid.best_swap:1")
    assert rc == -signal.SIGKILL, output
    assert (out / "best.incoming" / "best_trial.json").is_file() and not (out / "best").exists()
    rc, output = run_grid_process(data, out)  # finishes the swap from best.incoming, then the grid
    assert rc == 0, output
    assert "running it again" not in output
    check_same_grid(out, whole)


@pytest.mark.slow  # five grid processes one after another (30 s on 2 cores): make test-all; the first kill above
def test_grid_killed_at_its_fragile_moments_ends_as_an_uninterrupted_grid(grid_data, tmp_path):
    data, whole, _ = grid_data
    out = tmp_path / "killed"
    # 1. killed while swapping in the first best checkpoint: staged, marked, the old best not yet replaced
    rc, output = run_grid_process(data, out, "grid.best_swap:1")
    assert rc == -signal.SIGKILL, output
    assert (out / "best.incoming" / "best_trial.json").is_file() and not (out / "best").exists()
    # 2. killed between the end of trial 1's training and its record in the study
    rc, output = run_grid_process(data, out, "grid.trial_trained:1")
    assert rc == -signal.SIGKILL, output
    # 3. the interrupted trial runs again under its own number; killed after it is recorded but
    #    before its checkpoint is kept or dropped
    rc, output = run_grid_process(data, out, "grid.trial_told:1")
    assert rc == -signal.SIGKILL, output
    assert "trial 1 " in output and "was interrupted: running it again" in output
    # 4. nothing left to train: the rerun only finishes the bookkeeping
    rc, output = run_grid_process(data, out)
    assert rc == 0, output
    assert "running it again" not in output
    check_same_grid(out, whole)


@pytest.mark.slow
def test_grid_killed_at_random_moments_ends_as_an_uninterrupted_grid(grid_data, tmp_path):
    data, whole, seconds = grid_data
    out, rng, kills = tmp_path / "killed", random.Random(0), 0
    for _ in range(12):
        proc = grid_process(data, out)
        try:  # a moment inside a run, whatever this machine's speed: a fraction of the measured uninterrupted
            proc.wait(timeout=rng.uniform(0.15, 0.8) * seconds)  # grid (a fixed 13 s never killed a slow run)
        except subprocess.TimeoutExpired:
            proc.kill()
            kills += 1
        proc.communicate()
        if proc.returncode == 0:
            break
    else:
        assert run_grid_process(data, out)[0] == 0
    assert kills >= 2
    check_same_grid(out, whole)


def test_a_trial_whose_loss_becomes_nan_is_recorded_as_failed(tmp_path):
    data = write_rte_like(tmp_path / "data", n_train=64, n_dev=32)
    out = tmp_path / "grid"
    # a learning rate of 1e30 sends the weights past float32's range: the dev loss is NaN (the
    # accuracy, an argmax over NaN logits, still looks like a score)
    assert cli_main(["grid", "rte", *run_args(data, out, "--max_steps", "3"), "--learning_rates", "1e30", "1e-3",
                     "--batch_sizes", "16", "--epochs", "1"]) == 0
    rows = {r["learning_rate"]: r for r in csv.DictReader(io.StringIO((out / "grid_results.csv").read_text()))}
    assert rows["1e+30"]["state"] == "failed" and "non-finite" in rows["1e+30"]["error"]
    assert "eval_loss=nan" in rows["1e+30"]["error"]
    assert rows["0.001"]["state"] == "complete" and rows["0.001"]["best"] == "1"
    report = (out / "grid_results.md").read_text()
    assert "## Failed trials" in report and "non-finite" in report.split("## Failed trials")[1]


def test_pretraining_killed_while_writing_a_checkpoint_resumes_from_the_last_complete_one(
        pretrain_setup, tmp_path, monkeypatch):
    recipe = load_recipe()
    args = recipe_args(pretrain_setup, tmp_path / "whole", "max_steps=12", "phase1_fraction=0.75", "save_steps=4",
                       "eval_fraction=0")
    fresh_state()
    whole = recipe.main(args)

    def killed(name):  # SIGKILL would take pytest with it: nothing after this point runs either way
        raise KeyboardInterrupt(name)

    run = tmp_path / "killed"
    monkeypatch.setattr(faults, "_fire", killed)
    monkeypatch.setenv(faults.ENV, "pretrain.checkpoint_write:2")
    fresh_state()
    with pytest.raises(KeyboardInterrupt, match="pretrain.checkpoint_write"):
        recipe.main([a.replace(str(tmp_path / "whole"), str(run)) for a in args])
    checkpoints = run / "checkpoints"
    # the step-8 state is on disk but was never marked complete, so it is not a checkpoint
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-4", "step-8.incomplete"]
    assert (checkpoints / "step-8.incomplete" / "model.safetensors").is_file()
    assert complete_checkpoints(checkpoints) == [checkpoints / "step-4"]

    monkeypatch.delenv(faults.ENV)
    import torch

    loads, real_load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: (loads.append(k.get("weights_only")), real_load(*a, **k))[1])
    fresh_state()
    resumed = recipe.main([a.replace(str(tmp_path / "whole"), str(run)) for a in args])
    assert [h["step"] for h in resumed] == list(range(5, 13))
    for a, b in zip(whole[-8:], resumed, strict=True):
        assert a["mlm_loss"] == pytest.approx(b["mlm_loss"], rel=1e-6, abs=1e-7)
        assert a["learning_rate"] == pytest.approx(b["learning_rate"], rel=1e-9)
    assert loads and all(w is True for w in loads)  # optimizer, RNG states: nothing unpickled freely
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-4", "step-8"]
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 13))  # each step logged once, the dead run's steps 5-8 replaced


def test_trim_log_drops_later_steps_and_a_line_torn_by_a_crash(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4, "mlm_lo')
    trim_log(log, 2)
    assert log.read_text() == '{"step": 1}\n{"step": 2}\n'


# Writes that are not results files: logs appended line by line, subprocess output, the temp file
# of the atomic writer itself, and intermediate files of a build whose output is renamed at the end.
NOT_RESULTS = {
    ("src/bert_suite/io.py", "atomic_write_with", "fdopen:wb"): "the atomic writer's own temp file",
    ("src/bert_suite/io.py", "save_figure", "savefig"): "into the atomic writer's temp file",
    ("src/bert_suite/demo.py", "_run", "open:w"): "a step's console log, streamed while it runs",
    ("src/bert_suite/pretraining/corpus.py", "build_embedded_corpus", "open:w"): "streamed under a temporary "
                                                                            "name, renamed when complete",
    ("src/bert_suite/pretraining/instances.py", "_generate", "open:w"): "a worker's counts, in a temporary folder",
    ("src/bert_suite/pretraining/instances.py", "_generate", "dump"): "the same",
    ("src/bert_suite/glue_package.py", "write_zip", "ZipFile:w"): "into the atomic writer's temp file",
    ("recipes/pretrain.py", "main", "open:a"): "metrics.jsonl, a line appended per logging step (trim_log "
                                               "drops a line torn by a crash)",
    ("src/bert_suite/grid.py", "_storage_lock", "open:a"): "an empty lock file beside the SQLite database, "
                                                           "opened to flock it; nothing is written",
    ("src/bert_suite/grid.py", "folder_claim", "open:a"): "the folder's guard lock, opened to flock it",
    ("src/bert_suite/grid.py", "folder_claim", "open:a+"): "a worker's lock, labelled with its grid for the "
                                                           "error another grid's worker prints; no result",
    ("src/bert_suite/ablation/locks.py", "file_lock", "open:a+"): "a lock file, opened to flock it; it names its "
                                                                  "holder for the line a waiting process prints",
    ("src/bert_suite/ablation/launch.py", "launch_recipe", "open:a"): "a pre-training's console log, streamed "
                                                                      "while it runs",
    ("src/bert_suite/ablation/launch.py", "start_helpers", "open:a"): "a --workers helper's console log",
}


def test_every_results_file_is_written_atomically():
    """No plain write_text / write_bytes / open(..., 'w') / savefig / json.dump outside the atomic
    writer (io.atomic_write_text, save_figure) and the listed log streams."""
    offenders = []
    for path in sorted([*(REPO / "src").rglob("*.py"), *(REPO / "recipes").glob("*.py")]):
        rel = path.relative_to(REPO).as_posix()
        tree = ast.parse(path.read_text())
        owner = {}  # each call -> its innermost enclosing function
        for func in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
            for node in ast.walk(func):
                owner[node] = func.name  # inner functions are walked later and overwrite
        for call in [n for n in ast.walk(tree) if isinstance(n, ast.Call)]:
            name = getattr(call.func, "attr", getattr(call.func, "id", ""))
            mode = next((a.value for a in call.args[1:2] if isinstance(a, ast.Constant)), "r")
            mode = next((k.value.value for k in call.keywords if k.arg == "mode"
                         and isinstance(k.value, ast.Constant)), mode)
            opens = name in ("open", "fdopen", "ZipFile") and any(c in str(mode) for c in "wax")
            if opens or name in ("write_text", "write_bytes", "savefig", "dump"):
                key = (rel, owner.get(call, "<module>"), f"{name}:{mode}" if opens else name)
                if key not in NOT_RESULTS:
                    offenders.append(f"{rel}:{call.lineno} in {key[1]}: {key[2]}")
    assert offenders == [], "\n".join(offenders)
