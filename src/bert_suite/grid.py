"""The paper's exhaustive fine-tuning grid (learning rate x batch size x epochs) with random
restarts (seeds), recorded in an Optuna study so that it is resumable and shareable.

Every trial is recorded in the study (SQLite in the output folder by default, or any database
URL: several `bert-suite grid` processes pointed at one database share the grid). Rerunning the
same command skips finished trials. A trial whose process died (killed, crashed, power cut) is
recognised by its worker record (this host, a process that no longer exists) and run again under
its own trial number, before any new one, so a grid interrupted at any moment ends with the same
results table as an uninterrupted one (docs/RELIABILITY.md). Data are tokenised once for the whole
grid. `--workers_per_gpu K --gpus ...` starts K such workers per GPU itself (`run_workers`) and writes the
report once they are done. A trial that cannot beat the best finished one writes no checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import optuna
from optuna.samplers import GridSampler
from optuna.trial import TrialState
from tqdm.auto import tqdm
from transformers import TrainerCallback

from . import finetune_step
from .cards import TaskCard
from .faults import failpoint
from .io import atomic_write_text
from .lora import LoraError, LoraSettings
from .precision import Precision
from .processes import STOP_GRACE, Stopped, group_alive, start, stop_group, stopping  # noqa: F401  (grid's API too)
from .report import select_best, write_grid_report
from .runner import (
    TASK_SETTINGS_FILE,
    RunError,
    apply_precision,
    prepare,
    selection_key,
    train_and_evaluate,
    training_arguments,
    training_precision,
    write_manifest,
)

AXES = ("learning_rate", "per_device_train_batch_size", "num_train_epochs", "seed")
LORA_AXIS = "lora_r"  # an optional fifth axis (--lora_ranks); not a TrainingArguments field
PRESETS = {
    # Appendix A.3: works well across tasks.
    "paper": {"learning_rate": [5e-5, 3e-5, 2e-5], "per_device_train_batch_size": [16, 32],
              "num_train_epochs": [2, 3, 4]},
    # Section 4.1: the GLUE experiments (batch 32, 3 epochs, lr chosen on dev).
    "paper-glue": {"learning_rate": [5e-5, 4e-5, 3e-5, 2e-5], "per_device_train_batch_size": [32],
                   "num_train_epochs": [3]},
}


class _GridSampler(GridSampler):
    """GridSampler that leaves stopping to our loop: its own `study.stop()` only works inside
    `study.optimize`, and we drive trials with ask/tell to record failures with their reasons."""

    def after_trial(self, study, trial, state, values):
        pass


def search_space(card: TaskCard, preset: str | None = None, **axes) -> dict[str, list]:
    """Grid axes: explicit values win, then the preset, then the card's grid, then the paper's."""
    base = dict(PRESETS["paper"])
    base.update(card.grid)
    if preset:
        if preset not in PRESETS:
            raise RunError(f"unknown grid preset {preset!r}; choose one of {', '.join(PRESETS)}")
        base.update(PRESETS[preset])
    base.setdefault("seed", [42])
    for axis, values in axes.items():
        if values is not None:
            base[axis] = list(values)
    axes = AXES + ((LORA_AXIS,) if base.get(LORA_AXIS) is not None else ())
    for axis in axes:
        values = base.get(axis)
        if not values:
            raise RunError(f"grid axis {axis} is empty; give at least one value")
        if axis != "seed" and any(float(v) <= 0 for v in values):
            raise RunError(f"grid axis {axis} must be positive, got {values}")
        if len(set(values)) != len(values):
            raise RunError(f"grid axis {axis} repeats a value: {values}")
    return {axis: base[axis] for axis in axes}


def axes_of(params: dict) -> tuple[str, ...]:
    """The grid axes a trial's parameters (or a record) hold: the paper's four, and the LoRA rank when a
    grid has it (--lora_ranks)."""
    return AXES + ((LORA_AXIS,) if LORA_AXIS in params else ())


def study_name(card: TaskCard, space: dict[str, list], max_samples: dict | None = None,
               lora: LoraSettings | None = None) -> str:
    """One study per (task, grid): Optuna cannot change a parameter's value set inside a study, so
    a changed grid (another learning rate, more seeds) or changed card options in the same folder
    or database is its own study; rerunning the same grid finds its study and skips what is done."""
    digest = hashlib.sha256(json.dumps(grid_key(card, space, max_samples, lora), default=str).encode()).hexdigest()
    return f"{card.name}-grid-{digest[:10]}"


def grid_key(card: TaskCard, space: dict[str, list], max_samples: dict | None = None,
             lora: LoraSettings | None = None) -> dict:
    """What makes a grid's points comparable: the axes' values, the data they train and score on, and
    LoRA's settings (a LoRA grid is another study than full fine-tuning's)."""
    key = {k: sorted(map(float, v)) for k, v in space.items()}
    if lora is not None:
        key["lora"] = lora_record(lora, space)
    if card.options:  # e.g. NER's context or SQuAD's doc_stride: other data, so another study
        key["options"] = card.options
    files = {split: spec.data_file for split, spec in card.splits.items() if spec.data_file}
    if files:  # --train_file etc.: other data, so another study
        key["data_files"] = files
    if max_samples and any(v is not None for v in max_samples.values()):
        key["max_samples"] = max_samples
    return key


def lora_record(lora: LoraSettings, space: dict[str, list]) -> dict:
    """LoRA's settings as a grid has them: without the rank when it is an axis, and with alpha as the rule
    (2 x the rank) when no --lora_alpha fixed it, so the ranks' order does not change the grid."""
    record = {k: v for k, v in lora.record().items() if k not in space}
    if LORA_AXIS in space and lora.alpha is None:
        record["lora_alpha"] = f"2 x {LORA_AXIS}"
    return record


def describe_grid(key: dict) -> str:
    """A grid (`grid_key`, or just its axes) in one line, as the errors name it: `learning_rate 2e-05,3e-05 x
    per_device_train_batch_size 16 x ...`, then what else sets its data (`; max_samples {...}`)."""
    axes = " x ".join(f"{axis} {','.join(format(float(v), 'g') for v in sorted(map(float, key[axis])))}"
                      for axis in (*AXES, LORA_AXIS) if axis in key)
    return "; ".join([axes, *(f"{k} {json.dumps(key[k], sort_keys=True, default=str)}" for k in sorted(key)
                              if k not in (*AXES, LORA_AXIS))])


def check_study_grid(study: optuna.Study, grid: str, storage: str) -> None:
    """The first worker records the study's grid (`describe_grid`); a worker with another grid under the same
    study name (--study_name) is refused, naming both, before it adds a point: Optuna cannot change a
    parameter's values inside a study, and a report over two grids' points would compare what it should not."""
    with _storage_lock(study):
        stored = study.user_attrs.get("grid")
        if stored is None:
            study.set_user_attr("grid", grid)
        elif stored != grid:
            raise StorageError(f"--storage {safe_url(storage)}: study {study.study_name!r} was made by another grid "
                               f"({stored}); this grid is {grid}; expected the same grid flags for every worker of a "
                               "study, or another --study_name for this grid")


@contextlib.contextmanager
def folder_claim(out: Path, study_name: str, grid: str):
    """While a worker lives it holds a shared lock on OUT/.grid_workers/<study>.lock (the kernel drops it when
    the process dies, even by SIGKILL). A worker of another study finds a lock it cannot take and is refused,
    naming both grids: two grids writing best/ and the report into one folder would overwrite each other.
    A finished or dead grid's lock is free, so a changed grid then runs in the same folder."""
    import fcntl

    folder = out / ".grid_workers"
    folder.mkdir(parents=True, exist_ok=True)
    # named by a digest (a --study_name may hold any character); the study and its grid are written inside
    mine = folder / f"{hashlib.sha256(study_name.encode()).hexdigest()[:16]}.lock"
    with open(folder / ".guard", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # one worker at a time checks and claims
        try:
            for other in sorted(folder.glob("*.lock")):
                if other == mine:
                    continue
                with open(other, "a+") as held:
                    try:
                        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        held.seek(0)
                        raise RunError(f"{out}: workers of another grid are running in this folder ("
                                       f"{held.read().strip() or 'an unknown grid'}); this grid is study "
                                       f"{study_name}: {grid}; expected one grid per --output_dir: wait for them "
                                       "to finish, or give this grid another --output_dir") from None
                other.unlink(missing_ok=True)  # nobody holds it: that grid's workers are gone
            handle = open(mine, "a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_SH)
                handle.seek(0)
                if not handle.read():
                    handle.write(f"study {study_name}: {grid}\n")
                    handle.flush()
            except BaseException:
                handle.close()
                raise
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)
    try:
        yield
    finally:
        handle.close()  # releases the lock


HEARTBEAT_INTERVAL = 30  # seconds between a running trial's heartbeats
GRACE_PERIOD = 120  # seconds without a heartbeat after which a trial's worker counts as dead
POLL_SECONDS = 5  # how often a worker with nothing to pop looks at the others' trials


class StorageError(RunError):
    """A study storage that cannot be used (driver missing, database unreachable, another grid)."""


def engine_kwargs(storage: str) -> dict:
    """SQLAlchemy settings for a study storage shared by workers (and read by the dashboard)."""
    if storage.startswith("sqlite"):
        return {"connect_args": {"timeout": 60}}  # wait for another worker's write instead of failing
    if storage.startswith(("postgresql", "mysql")):
        return {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}  # an unreachable host: 10 s
    return {}


def safe_url(url: str) -> str:
    """The storage URL as messages show it: the password replaced by ***."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy can parse: say it as given, minus anything after a colon in the netloc
        return url.split("@")[-1]


def _requeue(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """heartbeat_stale_trial_callback: a trial failed because its worker stopped beating goes back in the queue."""
    if set(AXES) <= set(trial.params):
        study.enqueue_trial({a: trial.params[a] for a in axes_of(trial.params)},
                            user_attrs={"requeued_from": trial.number})


def open_study(storage: str, name: str, sampler=None, heartbeat_interval: int = HEARTBEAT_INTERVAL,
               grace_period: int = GRACE_PERIOD, attempts: int = 8) -> optuna.Study:
    """The grid's study on `storage` (created by the first worker), with heartbeats. Several workers
    starting together on a fresh database race to create its tables, enum types and the study: the loser's
    integrity error (or PostgreSQL's "already exists") is retried. A missing driver or an unreachable
    database is a StorageError naming the URL (without its password)."""
    import sqlalchemy.exc

    # Heartbeats are marked experimental, and Optuna expects them with Study.optimize; the grid drives
    # trials with ask/tell (to record failures with their reasons) and beats itself (_Heartbeat).
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning, module="optuna")
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    safe = safe_url(storage)
    kwargs = engine_kwargs(storage)
    for attempt in range(attempts):
        try:
            rdb = optuna.storages.RDBStorage(storage, engine_kwargs=kwargs, heartbeat_interval=heartbeat_interval,
                                             grace_period=grace_period, heartbeat_stale_trial_callback=_requeue)
            return optuna.create_study(study_name=name, storage=rdb, load_if_exists=True, direction="maximize",
                                       sampler=sampler)
        except ImportError as err:  # Optuna re-raises the driver's ModuleNotFoundError as an ImportError
            cause = err if isinstance(err, ModuleNotFoundError) else err.__cause__ or err.__context__
            name = getattr(cause, "name", None) or {"mysql": "pymysql", "postgresql": "psycopg"}.get(
                storage.split(":", 1)[0].split("+", 1)[0], "the driver")
            install = {"psycopg": "pip install 'bert-suite[postgres]'", "psycopg2": "pip install 'bert-suite[postgres]' "
                       "and write the URL as postgresql+psycopg://...", "pymysql": "pip install pymysql",
                       "MySQLdb": "pip install mysqlclient"}.get(name.split(".")[0])
            raise StorageError(f"--storage {safe}: the database driver {name!r} is not installed"
                               + (f"; {install}" if install else "")) from None
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError,
                optuna.exceptions.DuplicatedStudyError) as err:
            # PostgreSQL says a lost race either way: a unique violation, or (a ProgrammingError) "type
            # studydirection already exists" when another worker created the enum type or table between
            # Optuna's check and its CREATE; any other ProgrammingError is the user's
            lost_race = (not isinstance(err, sqlalchemy.exc.ProgrammingError)
                         or "already exists" in str(getattr(err, "orig", None) or err))
            if not lost_race or attempt == attempts - 1:
                raise
            time.sleep(0.1 * (attempt + 1) + 0.1 * random.random())  # another worker is creating it: again
        except sqlalchemy.exc.OperationalError as err:
            reason = str(err.orig if getattr(err, "orig", None) else err).strip().splitlines()[0][:200]
            # SQLite: "database is locked" (another worker writes), "table ... already exists" (another worker
            # created the tables between our check and our CREATE): both pass, try again
            if ("locked" in reason or "already exists" in reason) and attempt < attempts - 1:
                time.sleep(0.5 * (attempt + 1))
                continue
            raise StorageError(f"--storage {safe}: cannot open the database ({reason}); expected a reachable "
                               "database URL (sqlite:///FILE, postgresql+psycopg://USER@HOST/DB, mysql://...)") from None
        except sqlalchemy.exc.ArgumentError as err:
            raise StorageError(f"--storage {safe}: not a database URL ({err}); expected e.g. sqlite:///grid.db or "
                               "postgresql+psycopg://USER@HOST/DB") from None
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _storage_lock(study: optuna.Study):
    """One worker at a time between enter and exit, whatever machine it runs on: a PostgreSQL advisory lock,
    a MySQL named lock, or (SQLite: workers on one machine) a lock on a file beside the database."""
    backend = getattr(study._storage, "_backend", study._storage)
    engine = getattr(backend, "engine", None)
    dialect = engine.dialect.name if engine is not None else None
    if dialect == "sqlite" and engine.url.database:
        import fcntl

        with open(f"{engine.url.database}.enqueue.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
    elif dialect in ("postgresql", "mysql"):
        from sqlalchemy import text

        take, give = (("SELECT pg_advisory_lock(74656)", "SELECT pg_advisory_unlock(74656)") if dialect == "postgresql"
                      else ("SELECT GET_LOCK('bert_suite_grid', 600)", "SELECT RELEASE_LOCK('bert_suite_grid')"))
        with engine.connect() as conn:
            conn.execute(text(take))
            try:
                yield
            finally:
                conn.execute(text(give))
    else:
        yield


def enqueue_points(study: optuna.Study, space: dict[str, list]) -> int:
    """Enqueue every grid point no trial holds yet (waiting, running, finished), in grid order; returns how
    many. Workers do this one at a time (`_storage_lock`), so the points are enqueued once and numbered as a
    single worker numbers them; should a copy slip in anyway, `_taken` makes it a no-op."""
    with _storage_lock(study):
        return _enqueue_missing(study, space)


def _enqueue_missing(study: optuna.Study, space: dict[str, list]) -> int:
    held = {_point(_params(t)) for t in study.get_trials(deepcopy=False) if set(AXES) <= set(_params(t))
            and "skipped" not in t.user_attrs and not _interrupted(t)}
    added = 0
    for values in itertools.product(*space.values()):
        params = dict(zip(space, values, strict=True))
        if _point(params) not in held:
            study.enqueue_trial(params)
            added += 1
    return added


def _params(t: optuna.trial.FrozenTrial) -> dict:
    """A trial's grid point: its parameters, or for a waiting trial (no parameters yet) those it was
    enqueued with."""
    return t.params if set(AXES) <= set(t.params) else t.system_attrs.get("fixed_params") or {}


def _drop_leftovers(study: optuna.Study) -> None:
    """Waiting copies of finished points (enqueued twice by workers starting together) are popped and marked
    skipped, so the finished study holds no waiting trial."""
    for _ in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        trial = study.ask()
        trial.set_user_attr("skipped", True)
        study.tell(trial, state=TrialState.PRUNED)


def _interrupted(t: optuna.trial.FrozenTrial) -> bool:
    """A trial failed by `fail_stale_trials` (its worker stopped beating), not by its training."""
    return t.state == TrialState.FAIL and "error" not in t.user_attrs


def _taken(study: optuna.Study, number: int, point: tuple, done: set) -> bool:
    """Whether a popped trial's point is finished, or held (waiting, running, complete) by a trial numbered
    before it: a copy enqueued twice by two workers at once, which the earlier trial covers."""
    if point in done:
        return True
    return any(t.number < number and "skipped" not in t.user_attrs and set(AXES) <= set(_params(t))
               and _point(_params(t)) == point
               for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING,
                                                                 TrialState.COMPLETE)))


class _EpochReporter(TrainerCallback):
    """Reports the trial's dev metric after every evaluation as an Optuna intermediate value (step: the epoch,
    rounded up to a whole one), so a study viewer draws each trial's learning curve while the grid runs."""

    def __init__(self, trial: optuna.trial.Trial, metric: str):
        self.trial, self.metric = trial, metric

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        value = (metrics or {}).get(self.metric)
        if value is not None and math.isfinite(value):
            # written through the storage, not Trial.report: a trial run again after its worker died keeps its
            # id, and report() would keep the dead run's values for the epochs it had reached
            step = max(1, math.ceil(round(state.epoch or 0, 6)))
            self.trial.study._storage.set_trial_intermediate_value(self.trial._trial_id, step, float(value))


class _Heartbeat:
    """Records the trial's heartbeat in the study every `interval` seconds while it trains (Optuna's
    heartbeat table, which `fail_stale_trials` reads on every worker)."""

    def __init__(self, study: optuna.Study, trial_id: int, interval: int):
        self._storage, self._trial_id, self._interval = study._storage, trial_id, interval
        self._stop = threading.Event()
        self._storage.record_heartbeat(trial_id)
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"heartbeat-{trial_id}")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._storage.record_heartbeat(self._trial_id)
            except Exception as err:  # a lost connection: the next beat tries again
                tqdm.write(f"[grid] heartbeat of trial {self._trial_id} not recorded: {type(err).__name__}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process is not running it: a trial it left behind (or a reused pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def orphaned_trials(study: optuna.Study, grace_seconds: float = 60.0) -> list[optuna.trial.FrozenTrial]:
    """Running trials whose worker is gone: started on this host by a process that no longer
    exists, or never claimed by a worker (killed between `ask` and the claim) for longer than
    `grace_seconds`. Trials of live processes, and of other hosts, are left alone."""
    host, now = socket.gethostname(), time.time()
    orphans = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = t.user_attrs.get("worker")
        if worker is None:
            started = t.datetime_start.timestamp() if t.datetime_start else now
            if now - started > grace_seconds:
                orphans.append(t)
        elif worker.get("host") == host and not _alive(int(worker.get("pid", -1))):
            orphans.append(t)
    return orphans


def _claim(study: optuna.Study, orphans: list) -> optuna.trial.Trial | None:
    """The next trial this worker runs, claimed (this process written as its worker) under the storage lock:
    the first orphaned trial if one is still orphaned, else the next waiting point. Outside the lock two
    workers could take the same trial (SQLite does not serialise Optuna's pop of a waiting trial, and two
    workers may see the same orphan); the second would then find it finished and fail to record its result.
    None when the orphans seen were claimed by another worker meanwhile."""
    with _storage_lock(study):
        if orphans:
            orphans = orphaned_trials(study)
            if not orphans:
                return None
        trial = optuna.trial.Trial(study, orphans[0]._trial_id) if orphans else study.ask()
        trial.set_user_attr("worker", {"host": socket.gethostname(), "pid": os.getpid()})
        return trial


def _point(params: dict) -> tuple:
    return tuple(params[a] for a in axes_of(params))


def trial_records(study: optuna.Study) -> list[dict]:
    """One record per grid point: its latest finished trial (complete or failed)."""
    latest: dict[tuple, optuna.trial.FrozenTrial] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        if set(AXES) <= set(t.params) and "skipped" not in t.user_attrs and not _interrupted(t):
            latest[_point(t.params)] = t
    records = []
    for t in sorted(latest.values(), key=lambda t: t.number):
        records.append({
            "trial": t.number, **{a: t.params[a] for a in axes_of(t.params)},
            "state": "complete" if t.state == TrialState.COMPLETE else "failed",
            "error": t.user_attrs.get("error"),
            "metrics": t.user_attrs.get("metrics", {}),
            "history": t.user_attrs.get("history", []),
            "train_runtime": t.user_attrs.get("train_runtime"),
            "device": t.user_attrs.get("device"),
        })
    return records


def run_grid(card: TaskCard, model: str, output_dir: str, data_dir: str | None = None, tokenizer: str | None = None,
             max_seq_length: int | None = None, space: dict[str, list] | None = None, storage: str | None = None,
             keep_all: bool = False, overrides: dict | None = None, max_samples: dict | None = None,
             heartbeat_interval: int = HEARTBEAT_INTERVAL, grace_period: int = GRACE_PERIOD,
             name: str | None = None, precision: Precision | None = None, lora: LoraSettings | None = None,
             report: bool = True) -> dict:
    """Run every grid point not yet finished; keep the best checkpoint in output_dir/best; write
    the report. Returns {"best": record or None, "records": [...], "files": {...}}.

    Any number of workers (processes, on any machines) may run this on one storage: the points are
    enqueued once as waiting trials, and each worker pops the next (atomically, in the database), so
    each point runs once. A worker whose points are all taken waits for the others and then writes the
    same final report. A worker that dies is noticed by its heartbeat (every `heartbeat_interval` s):
    after `grace_period` s without one its trial is marked failed and its point enqueued again for
    any worker; on its own host a dead worker's trial is taken up at once, under its own number.
    A trial that cannot beat the best finished one when it ends writes no checkpoint (unless `keep_all`).
    `report=False` (a worker that `run_workers` started): the points only, no report and no best/ (the
    process that started the workers writes them once they are done). `name` is the study's (default:
    the task and a digest of the grid). `precision` (default: resolved from `overrides`, i.e. auto: bf16
    autocast where the CPU has it) applies to every trial and is recorded in run_manifest.json."""
    if grace_period <= heartbeat_interval:
        raise RunError(f"--grace_period ({grace_period} s) must be longer than --heartbeat_interval "
                       f"({heartbeat_interval} s), or live workers would be taken for dead")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    overrides = dict(overrides or {})
    precision = training_precision(overrides) if precision is None else apply_precision(overrides, precision)
    space = space or search_space(card)
    storage = storage or f"sqlite:///{(out / 'grid.db').resolve()}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if LORA_AXIS in space and lora is None:
        lora = LoraSettings(r=int(space[LORA_AXIS][0]))
    name = name or study_name(card, space, max_samples, lora)
    grid = describe_grid(grid_key(card, space, max_samples, lora))
    # a worker's trials of one shape of model share the captured step: compiled and captured once, not per trial
    with folder_claim(out, name, grid), finetune_step.trials():  # the claim first: a refused worker leaves no record
        study = open_study(storage, name, _GridSampler(space, seed=0), heartbeat_interval, grace_period)
        check_study_grid(study, grid, storage)
        return _run_points(study, storage, card, model, out, data_dir, tokenizer, max_seq_length, space, keep_all,
                           overrides, max_samples, heartbeat_interval, precision, lora, report)


def _run_points(study, storage, card, model, out, data_dir, tokenizer, max_seq_length, space, keep_all, overrides,
                max_samples, heartbeat_interval, precision, lora=None, report=True) -> dict:
    points = set(itertools.product(*space.values()))
    enqueue_points(study, space)
    metric = selection_key(card)
    device = _device_label(overrides)
    prepared = bar = None
    failed = False
    while True:
        done = {_point(r) for r in trial_records(study) if _point(r) in points}
        if bar is not None:
            bar.n = len(done)
            bar.refresh()
        if len(done) >= len(points):
            break
        prepared = prepared or prepare(card, model, data_dir, tokenizer, max_seq_length,
                                          max_samples=max_samples)
        # after prepare, so that a bad model, tokenizer or data file is an error line without a bar
        bar = bar or tqdm(total=len(points), initial=len(done), desc=f"grid {card.name}", unit="trial")
        with warnings.catch_warnings():  # "experimental" on every call (attributed to this file, so not filtered)
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)  # other hosts' dead workers: their points are enqueued again
        orphans = orphaned_trials(study)
        if not orphans and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            if not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                enqueue_points(study, space)  # e.g. a point whose trial was pruned: nothing left to pop
            else:  # every point is taken: wait for the other workers (or for their heartbeats to stop)
                time.sleep(min(POLL_SECONDS, heartbeat_interval))
            continue
        # An orphan keeps its number and grid point, so the finished grid numbers its trials exactly as an
        # uninterrupted run would; otherwise pop the next waiting point (the database hands it to one worker).
        trial = _claim(study, orphans)
        if trial is None:  # another worker claimed the orphan first
            continue
        trial.set_user_attr("precision", precision.label)  # each worker resolves its own (its CPU may differ)
        params = {axis: trial.suggest_categorical(axis, values) for axis, values in space.items()}
        if _taken(study, trial.number, _point(params), done):  # finished, or held by a trial before this one
            trial.set_user_attr("skipped", True)
            study.tell(trial, state=TrialState.PRUNED)
            continue
        beat = _Heartbeat(study, trial._trial_id, heartbeat_interval)
        trial_dir = out / "trials" / f"trial-{trial.number:03d}"
        # what a reader of the study (optuna-dashboard, `bert-suite dashboard`) needs beside the parameters
        for key, value in (("task", card.name), ("metric", metric), ("seed", params["seed"]),
                           ("run_folder", str(trial_dir.resolve())), ("device", device)):
            trial.set_user_attr(key, value)
        if orphans:
            tqdm.write(f"[grid] trial {trial.number} {params} was interrupted: running it again")
            shutil.rmtree(trial_dir, ignore_errors=True)  # whatever the dead run left half-written
        try:
            hparams = {k: v for k, v in params.items() if k != LORA_AXIS}  # the rest are TrainingArguments
            args = training_arguments(card, str(trial_dir), {**(overrides or {}), **hparams})
            trial_lora = lora.with_rank(params[LORA_AXIS]) if lora is not None and LORA_AXIS in params else lora
            # a trial behind the best finished one writes no checkpoint: it could never be kept (a grid of 72
            # BERT-large trials would otherwise write 72 x 1.3 GB to delete all but one)
            keep = None if keep_all else functools.partial(_would_be_best, study, metric, trial.number, params)
            result = train_and_evaluate(prepared, model, args, save_to=trial_dir / "checkpoint", lora=trial_lora,
                                        callbacks=[_EpochReporter(trial, metric)], keep=keep)
            failpoint("grid.trial_trained")
            value = result["metrics"].get(metric)
            # a diverged model can still score (argmax of NaN logits), so every loss is checked too
            bad = {k: v for k, v in result["metrics"].items() if (k == metric or k.endswith("loss"))
                   and isinstance(v, float) and not math.isfinite(v)}
            if value is None or bad:
                raise FloatingPointError("non-finite result: " + ", ".join(f"{k}={v}" for k, v in
                                                                         (bad or {metric: value}).items()))
        except (RunError, LoraError):  # the model or flags cannot work for any trial: stop, leaving no record
            beat.stop()
            trial.set_user_attr("skipped", True)
            study.tell(trial, state=TrialState.PRUNED)
            raise
        except Exception as err:  # a failed trial is recorded with its reason; the grid goes on
            beat.stop()
            failed = True  # the next trial starts from a new step, not from one a failure left
            trial.set_user_attr("error", f"{type(err).__name__}: {str(err)[:500]}")
            study.tell(trial, state=TrialState.FAIL)
            shutil.rmtree(trial_dir / "checkpoint", ignore_errors=True)
            tqdm.write(f"[grid] trial {trial.number} {params} failed: {type(err).__name__}: {err}")
        if failed:  # after the except clause: its traceback (which holds the step's frames) is gone by now
            finetune_step.release()
            failed = False
            continue
        beat.stop()
        result["metrics"] = {k: v for k, v in result["metrics"].items() if k in (metric, "train_loss")
                             or (k.startswith("eval_") and not k.endswith(("runtime", "_per_second", "samples")))}
        for key in ("metrics", "history", "train_runtime"):
            trial.set_user_attr(key, json.loads(json.dumps(result[key], default=float)))
        study.tell(trial, value)
        failpoint("grid.trial_told")
        _keep_if_best(study, metric, trial.number, trial_dir, out, keep_all)
        write_manifest(out / "run_manifest.json", prepared, model, data_dir, args,
                       {"grid": space, "study_storage": storage.split("///")[0] + "///...", "study_name": study.study_name,
                        "selection": metric,
                        "max_samples": max_samples, **precision.record(),
                        **({"lora": lora_record(lora, space)} if lora else {})})
    if bar is not None:
        bar.close()
    if not report:
        return {"best": None, "records": trial_records(study), "files": {}}
    _drop_leftovers(study)
    records = trial_records(study)
    files = write_grid_report(records, metric, out, task=card.name, paper=card.paper or None)
    best = select_best(records, metric)
    if best is not None:
        with _best_lock(out):
            _finish_best(out, best, records, keep_all)
        atomic_write_text(out / "best_trial.json", json.dumps(best, indent=2, default=float))
    return {"best": best, "records": records, "files": files}


def _device_label(overrides: dict) -> str:
    """Where this worker trains, as a trial records it (`device`): `cuda:0 NVIDIA H100 ... (CUDA_VISIBLE_DEVICES=3)`,
    `cpu`; the worker's CUDA_VISIBLE_DEVICES is named whenever it is set."""
    import torch

    label = "cpu"
    if torch.cuda.is_available() and not overrides.get("use_cpu"):
        label = f"cuda:{torch.cuda.current_device()} {torch.cuda.get_device_name()}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return label + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else "")


def _would_be_best(study: optuna.Study, metric: str, number: int, params: dict, metrics: dict) -> bool:
    """Whether trial `number` with these final `metrics` would be the grid's best among the trials finished now,
    as `select_best` chooses (the highest score; a tie goes to the lower trial number, e.g. a dead worker's
    trial run again after a later one finished). A score that cannot be ranked (missing, NaN) is never best."""
    value = metrics.get(metric)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    mine = {"trial": number, **params, "state": "complete", "metrics": {metric: float(value)}}
    others = [r for r in trial_records(study) if r["trial"] != number and _point(r) != _point(params)]
    return select_best([*others, mine], metric) is mine


@contextlib.contextmanager
def _best_lock(out: Path):
    """One worker at a time decides and installs out/best (workers started by `run_workers` share the folder):
    an exclusive lock on the folder's .grid_workers directory (held by no one else), which the kernel drops
    if the worker dies."""
    import fcntl

    folder = out / ".grid_workers"
    folder.mkdir(parents=True, exist_ok=True)
    handle = os.open(folder, os.O_RDONLY)  # a directory, opened to lock it: nothing is written
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # releases the lock


def _keep_if_best(study: optuna.Study, metric: str, number: int, trial_dir: Path, out: Path, keep_all: bool) -> None:
    """Move (or copy, with keep_all) the trial's checkpoint to out/best when it is the best so far (as
    `select_best` picks it, read from the study now: another worker's trial may have finished meanwhile);
    otherwise drop it, unless keep_all. A trial told it could not be kept wrote none."""
    checkpoint = trial_dir / "checkpoint"
    with _best_lock(out):
        best = select_best(trial_records(study), metric)
        if best is not None and best["trial"] == number:
            if (checkpoint / TASK_SETTINGS_FILE).is_file():  # written last by train_and_evaluate: complete
                _install_best(out, checkpoint, {"trial": number, **{a: best[a] for a in axes_of(best)}}, keep_all)
        elif not keep_all:
            shutil.rmtree(checkpoint, ignore_errors=True)


def _install_best(out: Path, checkpoint: Path, marker: dict, copy: bool) -> None:
    """out/best := checkpoint. The copy is staged in best.incoming and marked complete by its
    best_trial.json before the old best is removed, so a crash at any point leaves a complete
    checkpoint in best or in best.incoming (`_finish_best` completes the swap)."""
    staging = out / "best.incoming"
    shutil.rmtree(staging, ignore_errors=True)
    (shutil.copytree if copy else shutil.move)(str(checkpoint), str(staging))
    atomic_write_text(staging / "best_trial.json", json.dumps(marker, default=float))
    failpoint("grid.best_swap")
    shutil.rmtree(out / "best", ignore_errors=True)
    staging.rename(out / "best")


def _holds(folder: Path, trial: int) -> bool:
    marker = folder / "best_trial.json"
    return marker.is_file() and json.loads(marker.read_text()).get("trial") == trial


def _finish_best(out: Path, best: dict, records: list[dict], keep_all: bool) -> None:
    """After the loop: make out/best hold the best trial's checkpoint, whatever an interrupted run
    left (a swap half done, a finished trial killed before its checkpoint was kept), and drop the
    checkpoints that such a run left behind in other finished trials' folders (unless keep_all)."""
    own = out / "trials" / f"trial-{best['trial']:03d}" / "checkpoint"
    if _holds(out / "best.incoming", best["trial"]) and not _holds(out / "best", best["trial"]):
        shutil.rmtree(out / "best", ignore_errors=True)
        (out / "best.incoming").rename(out / "best")
    elif not _holds(out / "best", best["trial"]):
        if (own / TASK_SETTINGS_FILE).is_file():  # written last by train_and_evaluate: complete
            _install_best(out, own, {"trial": best["trial"], **{a: best[a] for a in axes_of(best)}}, keep_all)
        else:
            tqdm.write(f"[grid] warning: the best trial ({best['trial']}) has no checkpoint left in {own} or "
                       f"{out / 'best'} (deleted?); its results stand, but to get its weights run that point again")
    shutil.rmtree(out / "best.incoming", ignore_errors=True)
    if not keep_all:
        for r in records:
            if r["trial"] != best["trial"]:
                shutil.rmtree(out / "trials" / f"trial-{r['trial']:03d}" / "checkpoint", ignore_errors=True)


# ---------------------------------------------------------------------------------------- worker processes
# `bert-suite grid --workers_per_gpu K --gpus ...` starts K workers per GPU itself. Every process it starts runs
# in a process group of its own (processes.py, whose helpers also start and stop an ablation study's processes),
# so that stopping it stops all they started (data-loader workers included).

FAKE_GPUS = "BERT_SUITE_FAKE_GPUS"  # tests only: =1 lets --gpus name devices on a machine without CUDA (the
# workers get CUDA_VISIBLE_DEVICES=<id> and train on the CPU), so the launcher is tested on any machine


def worker_devices(gpus: str | None, workers_per_gpu: int | None) -> list[tuple[str, str]]:
    """The workers --gpus and --workers_per_gpu ask for, as (name, CUDA_VISIBLE_DEVICES value): K per GPU, GPU by
    GPU (`gpu0.w0`, `gpu0.w1`, `gpu1.w0`, ...). --gpus numbers devices as torch does here (default: every one,
    torch.cuda.device_count()); under a CUDA_VISIBLE_DEVICES of this process, device i is its i-th entry. [] when
    neither flag is given, or --workers_per_gpu 1 on a machine without CUDA: the command is then the one worker.
    Anything else without CUDA is refused: the workers would share the CPU, whose cores one worker already uses."""
    if gpus is None and workers_per_gpu is None:
        return []
    per_gpu = 1 if workers_per_gpu is None else workers_per_gpu
    if per_gpu < 1:
        raise RunError(f"--workers_per_gpu must be at least 1, got {per_gpu}")
    ids: list[int] | None = None
    if gpus is not None:
        words = [w.strip() for w in gpus.split(",")]
        if not all(w.isdigit() for w in words) or len(set(map(int, words))) != len(words):
            raise RunError(f"--gpus {gpus}: expected distinct CUDA device numbers separated by commas, such as 0,1")
        ids = [int(w) for w in words]
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    fake = os.environ.get(FAKE_GPUS) == "1"
    if count == 0 and not (fake and ids):
        if ids is None and per_gpu == 1:
            return []
        given = f"--gpus {gpus}" if gpus is not None else f"--workers_per_gpu {per_gpu}"
        raise RunError(f"{given}: no CUDA device is visible here (torch.cuda.device_count() is 0); expected a machine "
                       "with GPUs. On the CPU one worker uses every core; to share a grid between machines, start "
                       "`bert-suite grid` on each with the same --storage (docs/scaling-out.md)")
    if ids is None:
        ids = list(range(count))
    elif not fake and max(ids) >= count:
        raise RunError(f"--gpus {gpus}: there is no CUDA device {max(ids)} here; expected numbers from 0 to "
                       f"{count - 1} (torch.cuda.device_count() is {count})")
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return [(f"gpu{i}.w{k}", visible[i] if not fake and i < len(visible) else str(i))
            for i in ids for k in range(per_gpu)]


def worker_command(argv: list[str]) -> list[str]:
    """A started worker's command line: `python -m bert_suite` with the grid's arguments, minus --workers_per_gpu
    and --gpus, plus the hidden --grid_worker (it runs points, and leaves the report to the process that started
    it)."""
    kept, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in ("--workers_per_gpu", "--gpus"):
            skip = True
        elif not word.startswith(("--workers_per_gpu=", "--gpus=")):
            kept.append(word)
    return [sys.executable, "-m", "bert_suite", *kept, "--grid_worker"]


def run_workers(argv: list[str], workers: list[tuple[str, str]]) -> None:
    """Start a grid worker (`worker_command(argv)`) per entry of `workers`, each seeing only its GPU
    (CUDA_VISIBLE_DEVICES), and wait for them all. Their output comes here, each line prefixed with the worker's
    name (`[gpu0.w1] ...`). Ctrl-C, SIGTERM or SIGHUP of this process stops every worker's process group (and the
    kernel stops them should this process be killed outright) before Stopped/KeyboardInterrupt goes on; a trial
    they were running is run again when the command is rerun. A worker that fails is a RunError naming it, once
    all have ended (the others go on: they take over a dead worker's trial)."""
    cmd = worker_command(argv)
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), "TOKENIZERS_PARALLELISM": "false"}
    if "OMP_NUM_THREADS" not in os.environ:  # a share of the cores each (collation, tokenising), not all of them each
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // len(workers)))
    lock, started, relays = threading.Lock(), [], []
    with stopping():
        try:
            for name, device in workers:  # all started before the relay threads: start's preexec runs in a fork
                child = start(cmd, subprocess.PIPE, {**env, "CUDA_VISIBLE_DEVICES": device}, die_with_parent=True)
                started.append((name, child))
            for name, child in started:
                relays.append(threading.Thread(target=_relay, args=(child.stdout, f"[{name}] ".encode(), lock),
                                               daemon=True, name=f"relay-{name}"))
                relays[-1].start()
            print(f"[grid] {len(started)} workers, their lines prefixed [gpuN.wK]: " + ", ".join(
                f"{name} (CUDA_VISIBLE_DEVICES={device}, pid {child.pid})"
                for (name, device), (_, child) in zip(workers, started, strict=True)), file=sys.stderr, flush=True)
            while any(child.poll() is None for _, child in started):
                time.sleep(0.2)  # not a blocking wait: a signal must reach the handler of `stopping`
        except BaseException:
            for _, child in started:  # all at once, then wait for each
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGTERM)
            for _, child in started:
                stop_group(child)
            raise
        finally:
            for relay in relays:
                relay.join(timeout=5)
    failed = [f"{name} ({f'exit status {code}' if code > 0 else f'killed by {signal.Signals(-code).name}'})"
              for name, child in started if (code := child.returncode)]
    if failed:
        raise RunError(f"{len(failed)} of {len(started)} grid workers failed: {', '.join(failed)} (their lines above "
                       "are prefixed with their names); the report is not written: fix the cause and rerun the same "
                       "command (finished trials are kept)")


def _relay(stream, prefix: bytes, lock: threading.Lock) -> None:
    """Copy a worker's output to this process's stdout, each line (or progress-bar repaint, ended by \\r) after
    `prefix`, whole lines at a time so that workers' lines never mix."""
    out = getattr(sys.stdout, "buffer", None)
    pending = b""
    for chunk in iter(lambda: stream.read1(1 << 16), b""):
        *lines, pending = re.split(rb"(?<=[\r\n])", pending + chunk)
        _write(out, b"".join(prefix + line if line.strip() else line for line in lines), lock)  # blanks: as they are
    if pending:
        _write(out, prefix + pending + b"\n", lock)
    stream.close()


def _write(out, data: bytes, lock: threading.Lock) -> None:
    if not data:
        return
    with lock:
        if out is None:
            sys.stdout.write(data.decode(errors="replace"))
            sys.stdout.flush()
        else:
            out.write(data)
            out.flush()
