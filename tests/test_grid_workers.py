"""One grid shared by several workers on one study database (SQLite, and a real PostgreSQL server): every
point runs exactly once, every worker writes the same report as a single worker, and a dead worker's point is
taken over by another: at once on its own host, after the heartbeat grace period from another host."""

import csv
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from bert_suite.grid import AXES, open_study
from helpers import fresh_database, run_args, write_rte_like

GRID = ["--max_steps", "2", "--learning_rates", "1e-3", "5e-4", "--batch_sizes", "8", "--epochs", "1",
        "--seeds", "1", "2"]  # 4 points: more than the 3 workers, so they compete for the points


def worker(data: Path, out: Path, storage: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "bert_suite.cli", "grid", "rte", *run_args(data, out), *GRID,
                             "--storage", storage, *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(procs: list[subprocess.Popen]) -> list[str]:
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for p, output in zip(procs, outputs, strict=True):
        assert p.returncode == 0, output[-3000:]
    return outputs


def table(out: Path) -> list[dict]:
    rows = list(csv.DictReader(io.StringIO((out / "grid_results.csv").read_text())))
    for row in rows:
        row.pop("train_runtime")
    return rows


def trials_by_state(storage: str) -> dict[str, list]:
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    states: dict[str, list] = {}
    for t in study.trials:
        states.setdefault(t.state.name, []).append(tuple(t.params.get(a) for a in AXES))
    return states


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_rte_like(tmp_path_factory.mktemp("workers") / "data", n_train=48, n_dev=24)


@pytest.fixture(scope="module")
def alone(data, tmp_path_factory) -> Path:
    """The grid run by a single worker: the report every shared run must reproduce."""
    out = tmp_path_factory.mktemp("alone")
    finish([worker(data, out / "run", f"sqlite:///{out / 'alone.db'}")])
    return out / "run"


# Three workers on SQLite and on PostgreSQL: make test-all (20 s and 35 s); make test shares SQLite among workers in
# the killed-worker test below (each point once, every report the single worker's) and tests PostgreSQL's storage,
# the first start of several processes included, in tests/test_postgres_storage.py.
@pytest.fixture(params=[pytest.param("sqlite", marks=pytest.mark.slow), pytest.param("postgresql", marks=pytest.mark.slow)])
def storage(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    return fresh_database(request.getfixturevalue("postgres_url"))


def test_three_workers_run_each_point_once_and_write_the_single_worker_report(data, storage, alone, tmp_path):
    procs = [worker(data, tmp_path / f"w{i}", storage) for i in range(3)]
    finish(procs)
    states = trials_by_state(storage)
    assert sorted(states["COMPLETE"]) == sorted(set(states["COMPLETE"])) and len(states["COMPLETE"]) == 4
    assert "WAITING" not in states and "RUNNING" not in states
    for i in range(3):  # every worker waited for the others and wrote the complete report
        assert table(tmp_path / f"w{i}") == table(alone)


def test_a_worker_killed_mid_trial_leaves_its_point_to_the_others(data, alone, tmp_path):
    """Worker 0 is SIGKILLed after training its first trial, before recording it; the two others (same host)
    see the dead process and run that trial again under its own number; nobody reruns the command."""
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    env_kill = {"BERT_SUITE_FAILPOINT": "grid.trial_trained:1"}
    os.environ.update(env_kill)
    try:
        killed = worker(data, tmp_path / "w0", storage)
    finally:
        os.environ.pop("BERT_SUITE_FAILPOINT")
    others = [worker(data, tmp_path / f"w{i}", storage) for i in (1, 2)]
    killed.communicate(timeout=600)
    assert killed.returncode == -9
    outputs = finish(others)
    assert any("was interrupted: running it again" in output for output in outputs)
    states = trials_by_state(storage)
    assert len(states["COMPLETE"]) == 4 and len(set(states["COMPLETE"])) == 4
    assert set(states) <= {"COMPLETE", "PRUNED"}
    for i in (1, 2):
        assert table(tmp_path / f"w{i}") == table(alone)


def test_a_stale_trial_of_a_dead_worker_on_another_host_is_taken_over_after_the_grace_period(data, alone, tmp_path):
    """A trial left RUNNING by a worker on another host (its process cannot be checked from here) whose
    heartbeat stopped: after --grace_period a worker here marks it failed (interrupted), enqueues its point
    again and runs it; the report is the single worker's."""
    from bert_suite.cards import load_card
    from bert_suite.grid import enqueue_points, search_space, study_name

    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    space = search_space(load_card("rte"), None, learning_rate=[1e-3, 5e-4], per_device_train_batch_size=[8],
                         num_train_epochs=[1.0], seed=[1, 2])
    study = open_study(storage, study_name(load_card("rte"), space), heartbeat_interval=1, grace_period=3)
    enqueue_points(study, space)
    trial = study.ask()  # the other host's worker took the first point ...
    trial.set_user_attr("worker", {"host": "another-host", "pid": 1})
    params = {axis: trial.suggest_categorical(axis, values) for axis, values in space.items()}
    study._storage.record_heartbeat(trial._trial_id)  # ... beat once, and died
    started = time.time()
    output = finish([worker(data, tmp_path / "here", storage, "--heartbeat_interval", "1", "--grace_period", "3")])[0]
    assert time.time() - started > 3
    states = trials_by_state(storage)
    assert states["FAIL"] == [tuple(params[a] for a in AXES)]  # the stale trial, marked failed by the heartbeat check
    assert len(states["COMPLETE"]) == 4 and len(set(states["COMPLETE"])) == 4
    assert "failed:" not in output  # the interrupted trial is not a failed point: it ran again

    def by_point(out):  # the taken-over point ran under a new trial number (ties for best go to the lower one)
        return sorted(({k: v for k, v in r.items() if k not in ("trial", "best")} for r in table(out)), key=str)
    assert by_point(tmp_path / "here") == by_point(alone)


@pytest.mark.slow  # a grid of 80-step trials, so it is still running when the other starts (40 s): make test-all
def test_a_worker_of_another_grid_is_refused_while_the_folder_is_in_use_and_nothing_is_lost(data, alone, tmp_path):
    """Workers started with different grids on one output folder: the second is refused (both grids named)
    while the first grid's worker lives; that grid finishes with the single-worker report; afterwards the
    folder is free for the other grid."""
    out, storage = tmp_path / "grid", f"sqlite:///{tmp_path / 'grid.db'}"
    first = worker(data, out, storage, "--max_steps", "80")  # trials long enough to be running when the other starts
    deadline = time.time() + 120
    while not list((out / ".grid_workers").glob("*.lock")) and time.time() < deadline:
        time.sleep(0.2)
    other = [sys.executable, "-m", "bert_suite.cli", "grid", "rte", *run_args(data, out), "--max_steps", "2",
             "--learning_rates", "3e-4", "--batch_sizes", "8", "--epochs", "1", "--seeds", "1", "--storage", storage]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    refused = subprocess.run(other, env=env, capture_output=True, text=True, timeout=300)
    assert first.poll() is None, "the first grid ended before the second started: the check proved nothing"
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "workers of another grid are running in this folder" in refused.stderr
    assert "learning_rate 0.0005,0.001 x" in refused.stderr and ": learning_rate 0.0003 x" in refused.stderr
    finish([first])
    rows = table(out)  # the first grid lost nothing: its 4 points, each once, all complete
    assert len(rows) == 4 and {r["state"] for r in rows} == {"complete"}
    assert {tuple(r[a] for a in AXES) for r in rows} == {tuple(r[a] for a in AXES) for r in table(alone)}
    done = subprocess.run(other, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]  # its workers are gone: the folder is free
