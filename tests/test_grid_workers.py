"""One grid shared by several workers on one study database (SQLite, and a real PostgreSQL server): every
point runs exactly once, every worker writes the same report as a single worker, and a dead worker's point is
taken over by another: at once on its own host, after the heartbeat grace period from another host. The
command that starts its own workers (--workers_per_gpu, --gpus) stops them all with itself and resumes; a trial
that cannot beat the best finished one writes no checkpoint."""

import csv
import io
import json
import os
import re
import signal
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


# ------------------------------------------------------------------ bert-suite grid --workers_per_gpu K --gpus ...
# BERT_SUITE_FAKE_GPUS=1 (tests only) lets --gpus name devices on a machine without CUDA: each worker gets
# CUDA_VISIBLE_DEVICES=<its id> and trains on the CPU, so the launcher is tested here as it runs on GPUs.

def launcher(data: Path, out: Path, log: Path, *extra: str, failpoint: str | None = None) -> subprocess.Popen:
    """`bert-suite grid` starting its own workers (fake GPUs); its output (the workers' lines too) in `log`."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "BERT_SUITE_FAKE_GPUS": "1"}
    env.pop("BERT_SUITE_FAILPOINT", None)
    if failpoint:
        env["BERT_SUITE_FAILPOINT"] = failpoint
    with open(log, "w") as handle:
        return subprocess.Popen([sys.executable, "-m", "bert_suite", "grid", "rte", *run_args(data, out), *GRID,
                                 *extra], env=env, stdout=handle, stderr=subprocess.STDOUT)


def workers_started(log: Path) -> dict[int, str]:
    """pid -> CUDA_VISIBLE_DEVICES of each worker, from the launcher's line naming them."""
    line = next(line for line in log.read_text().splitlines() if line.startswith("[grid] ") and " workers, " in line)
    return {int(pid): device for device, pid in re.findall(r"CUDA_VISIBLE_DEVICES=(\w+), pid (\d+)", line)}


def trials_of(storage: str) -> list[optuna.trial.FrozenTrial]:
    (summary,) = optuna.get_all_study_summaries(storage)
    return optuna.load_study(study_name=summary.study_name, storage=storage).trials


def check_each_point_once_on_its_workers_device(out: Path, pids: dict[int, str]) -> None:
    trials = trials_of(f"sqlite:///{out / 'grid.db'}")
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}  # nothing left running or waiting
    assert len(complete) == 4 and len({tuple(t.params[a] for a in AXES) for t in complete}) == 4
    for t in complete:  # each trial records the device of the worker that ran it, from its environment
        assert t.user_attrs["device"] == f"cpu (CUDA_VISIBLE_DEVICES={pids[t.user_attrs['worker']['pid']]})"


def best_record(out: Path) -> dict:
    """best_trial.json without what differs between two identical runs (timing) or names the worker (device)."""
    best = json.loads((out / "best_trial.json").read_text())
    for key in ("train_runtime", "history", "device"):
        best.pop(key)
    return best


def test_sigterm_stops_every_worker_and_the_same_command_resumes_each_point_once(data, alone, tmp_path):
    """Two workers on (fake) GPU 0 hang after training their first trial; SIGTERM to the command stops them, leaving
    no process of theirs; the same command then runs the two interrupted trials and the two never started, each
    point once, each trial recording its worker's device, and writes the single worker's report, once."""
    out, log, again = tmp_path / "grid", tmp_path / "first.log", tmp_path / "again.log"
    # a worker with nothing left to take looks at the others' trials every heartbeat interval (at most 5 s): 1 s here
    command = ("--workers_per_gpu", "2", "--gpus", "0", "--heartbeat_interval", "1", "--grace_period", "60")
    proc = launcher(data, out, log, *command, failpoint="grid.trial_trained:1:hang")
    deadline = time.time() + 300
    while log.read_text().count("hanging until killed") < 2:
        assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    pids = workers_started(log)
    assert sorted(pids.values()) == ["0", "0"]
    assert "[gpu0.w0] " in log.read_text() and "[gpu0.w1] " in log.read_text()  # the workers' lines, each named
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert "stopped by SIGTERM; its workers were stopped; rerun the same command" in log.read_text()
    for pid in pids:  # each worker and everything in its process group is gone (and reaped: no zombie either)
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
    assert sorted(t.state.name for t in trials_of(f"sqlite:///{out / 'grid.db'}")) == ["RUNNING", "RUNNING",
                                                                                      "WAITING", "WAITING"]
    proc = launcher(data, out, again, *command)
    assert proc.wait(timeout=600) == 0, again.read_text()[-3000:]
    output = again.read_text()
    assert output.count("was interrupted: running it again") == 2
    assert output.count("# Grid search: rte") == 1  # the report once, by the command (its workers write none)
    check_each_point_once_on_its_workers_device(out, workers_started(again))
    assert table(out) == table(alone)
    assert best_record(out) == best_record(alone)
    assert json.loads((out / "best" / "best_trial.json").read_text())["trial"] == best_record(alone)["trial"]


@pytest.mark.slow  # a third grid command with its workers (40 s on 2 busy cores): make test-all
def test_one_worker_per_gpu_on_two_gpus_runs_each_point_once_and_writes_the_single_worker_report(data, alone, tmp_path):
    out, log = tmp_path / "grid", tmp_path / "grid.log"
    proc = launcher(data, out, log, "--gpus", "0,1")
    assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
    pids = workers_started(log)
    assert sorted(pids.values()) == ["0", "1"]
    assert log.read_text().count("# Grid search: rte") == 1
    check_each_point_once_on_its_workers_device(out, pids)
    assert table(out) == table(alone)
    assert best_record(out) == best_record(alone)


def test_workers_per_gpu_and_gpus_are_refused_without_cuda_in_one_line(monkeypatch, capsys, tmp_path):
    import torch

    from bert_suite_cli import main

    monkeypatch.delenv("BERT_SUITE_FAKE_GPUS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    for flags, message in ((["--workers_per_gpu", "2"], "--workers_per_gpu 2: no CUDA device is visible here"),
                           (["--gpus", "0"], "--gpus 0: no CUDA device is visible here"),
                           (["--workers_per_gpu", "0"], "--workers_per_gpu must be at least 1, got 0"),
                           (["--gpus", "0,x"], "--gpus 0,x: expected distinct CUDA device numbers")):
        assert main(["grid", "rte", "--model", "preset:tiny", "--output_dir", str(tmp_path / "out"), *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"bert-suite grid: error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_make_glue_passes_workers_per_gpu_and_gpus_through_to_the_grid():
    """`make glue WORKERS_PER_GPU=2 GPUS=0,1` runs `bert-suite grid ... --workers_per_gpu 2 --gpus 0,1`; unset, neither
    flag (make -n: the command printed, nothing run)."""
    import shlex
    import shutil

    if shutil.which("make") is None:
        pytest.skip("no make")
    repo = Path(__file__).resolve().parents[1]

    def grid_command(*variables):
        # an outer make's variables (MAKEFLAGS) or the shell's would reach the plain command: none of them
        env = {k: v for k, v in os.environ.items()
               if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "WORKERS_PER_GPU", "GPUS", "GRID_ARGS", "TASK")}
        done = subprocess.run(["make", "-s", "-n", "glue", *variables], cwd=repo, capture_output=True, text=True,
                              check=True, env=env)
        line = done.stdout.replace("\\\n", " ").strip().splitlines()[-1]
        return shlex.split(line)

    command = grid_command("WORKERS_PER_GPU=2", "GPUS=0,1", "TASK=mrpc")
    assert command[0].endswith("bert-suite") and command[1:3] == ["grid", "mrpc"]
    assert command[command.index("--workers_per_gpu") + 1] == "2" and command[command.index("--gpus") + 1] == "0,1"
    plain = grid_command()
    assert "--workers_per_gpu" not in plain and "--gpus" not in plain


def test_worker_devices_number_gpus_as_torch_does_and_workers_drop_the_launch_flags(monkeypatch):
    import torch

    from bert_suite.grid import RunError, worker_command, worker_devices

    monkeypatch.delenv("BERT_SUITE_FAKE_GPUS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert worker_devices(None, None) == [] and worker_devices(None, 1) == []  # one worker: this process
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")  # torch's device 1 is the machine's GPU 7
    assert worker_devices(None, 2) == [("gpu0.w0", "5"), ("gpu0.w1", "5"), ("gpu1.w0", "7"), ("gpu1.w1", "7")]
    assert worker_devices("1", None) == [("gpu1.w0", "7")]
    with pytest.raises(RunError, match="--gpus 0,2: there is no CUDA device 2 here; expected numbers from 0 to 1"):
        worker_devices("0,2", None)
    with pytest.raises(RunError, match="--gpus 1,1: expected distinct"):
        worker_devices("1,1", None)
    argv = ["--debug", "grid", "rte", "--gpus", "0,1", "--model", "m", "--workers_per_gpu=2", "--seeds", "1"]
    assert worker_command(argv)[1:] == ["-m", "bert_suite", "--debug", "grid", "rte", "--model", "m", "--seeds", "1",
                                        "--grid_worker"]


# ------------------------------------------------------------------ a trial behind the best writes no checkpoint

def test_a_trial_that_cannot_beat_the_best_writes_no_checkpoint_and_the_report_is_unchanged(
        data, alone, tmp_path, monkeypatch):
    """A trial told it cannot be kept (its score below the best finished one's, or equal to it with a higher trial
    number: select_best's tie rule) writes no model; the best one's checkpoint is installed in best/; the report is
    the one a grid keeping every checkpoint until the end wrote. With --keep_all every trial keeps its own."""
    import torch

    import bert_suite.grid as grid
    from bert_suite_cli import main

    real, seen = grid.train_and_evaluate, []

    def spy(prepared, model, args, save_to=None, keep=None, **kwargs):
        result = real(prepared, model, args, save_to=save_to, keep=keep, **kwargs)
        seen.append((keep is None, result["saved"], (save_to / "model.safetensors").exists()))
        return result

    monkeypatch.setattr(grid, "train_and_evaluate", spy)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the single worker's process (OMP_NUM_THREADS=1): the same numbers
    try:
        assert main(["grid", "rte", *run_args(data, tmp_path / "grid"), *GRID]) == 0
        assert table(tmp_path / "grid") == table(alone)
        scores = [float(r["eval_accuracy"]) for r in table(alone)]  # one worker: trials finish in number order
        expected = [all(s > earlier for earlier in scores[:i]) for i, s in enumerate(scores)]
        assert False in expected, "no trial lost: the test proves nothing"
        assert seen == [(False, keep, keep) for keep in expected]
        best = json.loads((tmp_path / "grid" / "best_trial.json").read_text())["trial"]
        assert json.loads((tmp_path / "grid" / "best" / "best_trial.json").read_text())["trial"] == best
        assert (tmp_path / "grid" / "best" / "model.safetensors").is_file()
        assert not list((tmp_path / "grid" / "trials").glob("*/checkpoint"))

        seen.clear()
        assert main(["grid", "rte", *run_args(data, tmp_path / "all"), *GRID[:-1], "--keep_all"]) == 0  # seed 1
        assert seen == [(True, True, True)] * 2
        assert len(list((tmp_path / "all" / "trials").glob("*/checkpoint/model.safetensors"))) == 2
    finally:
        torch.set_num_threads(threads)


def test_a_trial_is_kept_only_when_select_best_would_choose_it_now():
    from bert_suite.grid import _would_be_best

    study = optuna.create_study(direction="maximize")
    space = {"learning_rate": [1e-3, 5e-4], "per_device_train_batch_size": [8], "num_train_epochs": [1.0],
             "seed": [1, 2, 3]}
    distributions = {a: optuna.distributions.CategoricalDistribution(v) for a, v in space.items()}

    def point(lr, seed):
        return {"learning_rate": lr, "per_device_train_batch_size": 8, "num_train_epochs": 1.0, "seed": seed}

    for lr, seed, value in ((1e-3, 1, 0.6), (1e-3, 2, 0.7)):  # trials 0 and 1 finished; 1 is the best
        study.add_trial(optuna.trial.create_trial(params=point(lr, seed), distributions=distributions, value=value,
                                                  user_attrs={"metrics": {"eval_accuracy": value}}))

    def keep(number, value, lr=5e-4, seed=1):
        return _would_be_best(study, "eval_accuracy", number, point(lr, seed), {"eval_accuracy": value})

    assert keep(2, 0.71) and not keep(2, 0.69)
    assert not keep(2, 0.7)  # a tie goes to the lower trial number: trial 1 stays the best
    assert keep(0, 0.7, 1e-3, 1)  # trial 0 run again (its worker died) ties with 1 and wins: kept
    assert not keep(2, float("nan")) and not _would_be_best(study, "eval_accuracy", 2, point(5e-4, 1), {})
    assert _would_be_best(optuna.create_study(direction="maximize"), "eval_accuracy", 0, point(5e-4, 1),
                          {"eval_accuracy": 0.0})  # the first trial to finish is the best so far
