"""Fine-tuning every variant alike: `compare`'s grids on every task (OUT/compare), the curve of each curve
variant's snapshots (OUT/curve/TASK/NAME@STEP), and the feature-based route of NER tasks (OUT/features). Several
processes may run this at once on one folder (`--workers`, `--storage`): each grid's trials are shared through
its study."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from pathlib import Path

from ..compare import (
    CompareError,
    Model,
    Task,
    build_result,
    check_tasks,
    grid_folder,
    grid_scores,
    grid_space,
    resolve_task,
    run_compare,
    same_models,
)
from ..io import atomic_write_text
from .stages import Progress, file_digest
from .study import AblationError, Study, TaskEntry

FEATURE_LAYERS = 4  # Table 8's feature-based column: the last four layers (all, in a smaller model), concatenated


def fine_tuning_config(folder: Path, size: str) -> dict | None:
    """The config a grid fine-tunes `folder` with: None when its dropout is its preset's (`size`; the folder's own
    config), else the folder's config with the preset's dropout (it was pre-trained with another)."""
    from ..configuration_bert_suite import BertSuiteConfig

    config = json.loads((folder / "config.json").read_text())
    preset = BertSuiteConfig.from_preset(size)
    if all(config.get(k) == getattr(preset, k) for k in DROPOUT_KEYS):
        return None
    return {**config, **{k: getattr(preset, k) for k in DROPOUT_KEYS}}


DROPOUT_KEYS = ("hidden_dropout_prob", "attention_probs_dropout_prob")


def fine_tuning_checkpoint(folder: Path, size: str) -> Path:
    """The checkpoint a grid starts from: `folder`, or, when it was pre-trained with other dropout than its
    preset's (`size`), a twin folder (links to its files) whose config has the preset's dropout, so every
    variant and its random twin fine-tune with the same config."""
    config = fine_tuning_config(folder, size)
    if config is None:
        return folder
    twin = folder.parent / f"{folder.name}-finetune"
    twin.mkdir(exist_ok=True)
    for path in folder.iterdir():
        with contextlib.suppress(FileExistsError):  # another --workers process made it first
            if path.name != "config.json" and not (twin / path.name).exists():
                (twin / path.name).symlink_to(path.resolve())
    atomic_write_text(twin / "config.json", json.dumps(config, indent=2))
    return twin


def checkpoints_of(study: Study) -> list[tuple[str, str, object, int]]:
    """(checkpoint name, variant, the pre-training run it starts from, its position among the variant's seeds) for
    every variant's checkpoints, in the file's order: one per pre-training seed (`Study.runs` of the variant or
    its source), named by `run_name`."""
    from .study import run_name

    found = []
    for name, variant in study.variants.items():
        seeds = study.seeds_of(name)
        for position, run in enumerate(study.runs([variant.source or name]), start=1):
            found.append((run_name(name, seeds, run.seed), name, run, position))
    return found


def models_of(study: Study, runs: dict[str, Path], ready: list[str] | None = None) -> dict[str, Model]:
    """Every variant's checkpoints (`checkpoints_of`; with `ready`, those whose run is among these run names) as
    compare's Models: a pre-trained run's final checkpoint, or its source's run with fresh weights (random_init:
    one draw per seed, `random@K:`) or a BiLSTM before the head; each keyed by its seed in the variant's row."""
    models = {}
    for label, name, run, position in checkpoints_of(study):
        if ready is not None and run.name not in ready:
            continue
        variant = study.variants[name]
        start = str(fine_tuning_checkpoint(runs[run.name] / "final", study.size(run.variant)))
        prefix = (f"random@{position}:" if position > 1 else "random:") if variant.random_init else \
            "bilstm:" if variant.bilstm else ""
        models[label] = Model(label, prefix + start, start, variant.random_init, variant.bilstm, name, str(run.seed))
    return models


def space_of(study: Study, task: Task, entry: TaskEntry | None) -> dict:
    """The task's grid: its own axes where the file gives them, else compare's."""
    axes = {axis: getattr(entry, axis, None) or getattr(study.compare, axis)
            for axis in ("learning_rates", "batch_sizes", "epochs")}
    return grid_space(task, study.compare.seeds, **axes)


def tuned_tasks(study: Study, data_dirs: list) -> tuple[dict[str, Task], dict[str, dict]]:
    """The tasks fine-tuned through compare's grids (not the feature-based ones) and each one's grid."""
    tuned = [t for t in study.tasks if not t.feature_based]
    tasks = {t.key: resolve_task(t.key, data_dirs or None, t.metric, flag="task") for t in tuned}
    return tasks, {t.key: space_of(study, tasks[t.key], t) for t in tuned}


def check_study_tasks(study: Study, data_dirs: list, data: dict) -> None:
    """Before any pre-training: every compared task's train split reads, its label count fits, and its first
    examples encode at the study's length with each vocabulary a variant uses (a SQuAD window shorter than its
    questions would otherwise stop the study after hours of pre-training)."""
    from ..tokenization import load_pretraining_tokenizer

    tasks = {t.key: resolve_task(t.key, data_dirs or None, t.metric, flag="task") for t in study.tasks
             if not t.feature_based}
    for vocab in dict.fromkeys(d.vocab for d in data.values()):
        try:
            check_tasks(tasks, None, study.compare.max_seq_length, load_pretraining_tokenizer(str(vocab)))
        except CompareError as err:
            raise AblationError(f"{study.path}: compare: {err}") from None


def fine_tune(study: Study, out: Path, runs: dict[str, Path], steps: int, data_dirs: list, storage: str | None,
              progress: Progress | None, worker: bool = False) -> tuple[dict, dict]:
    """`compare` of every variant's checkpoints (OUT/compare), the feature-based route (not in a `worker`), then
    the curve's grids (OUT/curve): compare.json's content and {variant: {task: [{step, mean, se, scores,
    pretraining_scores}]}}. `runs`: every run's folder, by run name."""
    models = models_of(study, runs)
    tasks, spaces = tuned_tasks(study, data_dirs)
    max_len = study.compare.max_seq_length
    try:
        check_tasks(tasks, next(iter(models.values())), max_len)
    except CompareError as err:
        raise AblationError(f"{study.path}: compare: {err}") from None
    seeds = study.compare.seeds
    checkpoints = study.pretraining.checkpoints
    curve_runs = sum(len(study.seeds_of(n)) for n in study.curve_variants)
    total = len(tasks) * len(models) + curve_runs * len(study.curve_tasks) * len(checkpoints) \
        + (len(study.tasks) - len(tasks)) * len(models)
    clock = {"done": 0, "started": time.time()}

    def log(line: str) -> None:
        if progress is not None and not worker:
            done, spent = clock["done"], time.time() - clock["started"]
            progress.stage("compare", f"grid {done + 1} of {total}, {line.split(': ', 1)[-1]}; "
                           + progress.left(spent / done * (total - done) if done else None))
        clock["done"] += 1

    result = run_compare(models, tasks, study.compare.baseline, seeds, spaces, out / "compare", storage, max_len,
                         None, FINE_TUNING, heartbeat_interval=30, grace_period=120, log=log) if tasks else \
        build_result(study.compare.baseline, seeds, models, {}, {})
    if not worker:  # the feature route is not shared with the helpers
        features = {t.record_key: feature_route(study, t, models, out, data_dirs, log) for t in study.tasks
                    if t.feature_based}
        result["tasks"] = {t.record_key: result["tasks"].get(t.record_key) or features[t.record_key]
                           for t in study.tasks}
    curve_tasks = {key: resolve_task(key, data_dirs or None, flag="task") for key in study.curve_tasks}

    def final(name: str, key: str) -> dict | None:
        if key in result["tasks"]:  # the compare stage's own grids
            clock["done"] += len(study.seeds_of(name))
            return result["tasks"][key]["models"][name]
        return None

    def grid(run, key: str, step: int) -> dict:
        return curve_grid(study, out, runs, steps, run.name, curve_tasks[key], step, spaces, storage, log)[1]

    def skip() -> None:
        clock["done"] += 1

    curve = curve_of(study, out, list(curve_tasks), steps, grid, final, skip)
    return result, curve


FINE_TUNING = {"disable_tqdm": True}  # the grids' TrainingArguments overrides


def curve_grid(study: Study, out: Path, runs: dict[str, Path], steps: int, name: str, task: Task, step: int,
               spaces: dict, storage: str | None, log) -> tuple[Model, dict]:
    """One run's point of the curve: run `name`'s snapshot at `step` (its final checkpoint at the last step)
    through the task's grid in OUT/curve/TASK/NAME@STEP."""
    folder = runs[name] / ("final" if step == steps else f"snapshots/step-{step}")
    size = study.size(next(r.variant for r in study.runs() if r.name == name))
    start = str(fine_tuning_checkpoint(folder, size))
    model = Model(f"{name}@{step}", start, start, False, False)
    log(f"curve: curve, {task.key} with {model.name} ({start})")
    return model, grid_scores(task, model, spaces.get(task.key) or space_of(study, task, None),
                              out / "curve" / task.key / model.name, storage, study.compare.max_seq_length, None,
                              FINE_TUNING)


def kept_past(run: Path, step: int) -> bool:
    """Whether an unfinished run has a complete checkpoint at `step` or later: a resume starts there, so its
    snapshot of `step` is never written again (written before the checkpoint that follows, it would be by a
    run stopped in between, and on another device or thread count perhaps with other bytes)."""
    from ..pretraining.checkpoints import complete_checkpoints

    return any(int(c.name.split("-")[1]) >= step for c in complete_checkpoints(run / "checkpoints"))


def ready_runs(study: Study, runs: dict[str, Path], steps: int) -> list[str]:
    """The runs whose fine-tuning can start: those finished, in `Study.runs`' order."""
    from .stages import finished_steps

    return [run.name for run in study.runs() if finished_steps(runs[run.name]) == steps]


def early_grids(study: Study, out: Path, runs: dict[str, Path], steps: int, data_dirs: list, storage: str | None,
                progress: Progress | None, worker: bool = False) -> int:
    """While other processes still pre-train some runs: the grids that need only what is done already, in the
    folders the compare stage will use (it then finds them done): compare's for each checkpoint whose run is
    finished (a fine-tuning-only variant's once its source run is), and the curve's for each snapshot written, a
    run's last step once it is finished. A grid whose model could yet turn out to be another's (a random twin
    behind one not ready, a snapshot behind an earlier curve point's missing one) waits for the compare stage,
    and so does the snapshot of an unfinished run past its last checkpoint (`kept_past`). Returns how many grids
    it went through (done ones included)."""
    ready = ready_runs(study, runs, steps)
    tasks, spaces = tuned_tasks(study, data_dirs)
    models = models_of(study, runs, ready)
    variant_of = {label: name for label, name, *_ in checkpoints_of(study)}
    order = sorted(variant_of, key=lambda label: variant_of[label] != study.compare.baseline)  # compare's order
    fresh = [label for label in order if study.variants[variant_of[label]].random_init]
    twins = same_models(models, study.compare.baseline)
    todo = [name for name in models if name not in twins
            and (name not in fresh or all(n in models for n in fresh[:fresh.index(name)]))]
    ran = 0

    def log(line: str) -> None:
        if progress is not None and not worker:
            waiting = [r.name for r in study.runs() if r.name not in ready]
            progress.stage("compare", f"early, while {', '.join(waiting)} pre-train{'s' * (len(waiting) == 1)}: "
                           f"{line.split(': ', 1)[-1]}")

    for key, task in tasks.items():
        for name in todo:
            model = models[name]
            log(f"compare: {key} with {name} ({model.model})")
            grid_scores(task, model, spaces[key], grid_folder(out / "compare", task, model), storage,
                        study.compare.max_seq_length, None, FINE_TUNING)
            ran += 1
    curve_tasks = {key: resolve_task(key, data_dirs or None, flag="task") for key in study.curve_tasks}
    first, missing = set(), False  # curve_of's order: a point after a missing snapshot may yet be its copy
    for name in study.curve_variants:
        for key, task in curve_tasks.items():
            for step in study.pretraining.checkpoints:
                for run in study.runs([name]):
                    if step == steps:  # the final checkpoint: compare's grid, or its own once the run is finished
                        if key not in tasks and run.name in ready:
                            curve_grid(study, out, runs, steps, run.name, task, step, spaces, storage, log)
                            ran += 1
                        continue
                    digest = snapshot_digest(runs[run.name] / "snapshots" / f"step-{step}")
                    if digest is not None and (digest, key) in first:
                        continue  # a copy of one fine-tuned here: the compare stage takes that point
                    if digest is None or not (run.name in ready or kept_past(runs[run.name], step)):
                        missing = True  # not written, or a resume could write it again: not yet
                        continue
                    first.add((digest, key))
                    if not missing:
                        curve_grid(study, out, runs, steps, run.name, task, step, spaces, storage, log)
                        ran += 1
    return ran


def curve_of(study: Study, out: Path, keys: list[str], steps: int, grid, final=lambda name, key: None,
             skip=lambda: None) -> dict:
    """{variant: {task: [{step, mean, se, scores, pretraining_scores}]}} over the study's checkpoints: at each step
    the variant's row over its runs (`recipe_scores` of `grid(run, task, step)`, each run's grid scores), or at the
    last step `final(variant, task)` where it gives the compare stage's row. A snapshot that is byte for byte one
    fine-tuned already (a biphasic run started from the left-to-right run's checkpoint has copies of its
    snapshots up to that step) takes that grid, and `skip()` is called instead; a point whose every run did so
    is marked `"from": variant`: the same weights, the same grid."""
    from ..compare import recipe_scores

    curve: dict = {}
    first: dict[tuple, tuple[str, dict]] = {}  # (snapshot digest, task) -> the variant and the grid fine-tuned
    for name in study.curve_variants:
        for key in keys:
            points = []
            for step in study.pretraining.checkpoints:
                entry = final(name, key) if step == steps else None
                donors = []
                if entry is None:
                    grids = {}
                    for run in study.runs([name]):
                        folder = out / "pretraining" / run.name / "snapshots" / f"step-{step}"
                        digest = snapshot_digest(folder) if step < steps else None
                        if digest and (digest, key) in first:
                            donor, grids[str(run.seed)] = first[digest, key]
                            donors.append(donor)
                            skip()
                            continue
                        grids[str(run.seed)] = grid(run, key, step)
                        if digest:
                            first[digest, key] = (name, grids[str(run.seed)])
                    try:
                        entry = recipe_scores(grids, study.compare.seeds, f"curve: {key} with {name} at step {step:,}")
                    except CompareError as err:
                        raise AblationError(f"{err} ({out / 'curve' / key})") from None
                point = {"step": step, **{k: entry[k] for k in ("mean", "se", "scores", "pretraining_scores")}}
                if donors and len(donors) == len(study.seeds_of(name)) and len(set(donors)) == 1:
                    point["from"] = donors[0]
                points.append(point)
            curve.setdefault(name, {})[key] = points
    return curve


def snapshot_digest(folder: Path) -> str | None:
    """SHA-256 of a snapshot's config and weights (None when it has none): equal digests, the same model."""
    files = [folder / "config.json", *sorted(folder.glob("*.safetensors"))]
    if not all(f.is_file() for f in files) or len(files) < 2:
        return None
    digest = hashlib.sha256()
    for file in files:
        file_digest(file, digest)
    return digest.hexdigest()


def tagger_settings(entry: TaskEntry) -> tuple[list, list, int]:
    """The feature-based route's learning rates, epochs and batch size: the task's own, else 1e-3, 4 and 32."""
    return entry.learning_rates or [1e-3], entry.epochs or [4], (entry.batch_sizes or [32])[0]


def feature_route(study: Study, entry: TaskEntry, models: dict, out: Path, data_dirs: list, log) -> dict:
    """The feature-based route of Table 8's last column (Table 7's method) for an NER task: each variant's frozen
    last four layers, concatenated, feed a two-layer BiLSTM tagger (as wide as the model) trained once per seed
    and setting; its dev entity F1 is the score. Features in OUT/features/TASK/NAME, taggers beside them, each
    variant's under a lock (two runs of the study on one folder)."""
    import datasets

    from ..feature_based import extract_features, train_tagger
    from .locks import task_lock

    task = resolve_task(entry.key, data_dirs or None, flag="task")
    train_file, dev_file = (task.card.splits[s].file for s in (task.card.train_split, task.card.eval_splits[0]))
    rates, epochs, batch = tagger_settings(entry)
    found = {}
    for name, model in models.items():
        log(f"features: feature-based, {entry.key} with {name}")
        folder = out / "features" / task.card.name / name
        config = json.loads((Path(model.path) / "config.json").read_text())
        layers = ",".join(str(-i) for i in range(1, min(FEATURE_LAYERS, config["num_hidden_layers"]) + 1))
        scores: dict = {}
        with task_lock(out, task.card.name, name):
            for split, file in (("train", train_file), ("dev", dev_file)):
                if not (folder / split / "dataset_info.json").is_file():
                    extract_features(model.path, Path(task.data_dir) / file, folder / split, task.card, layers,
                                     "concat", disable_tqdm=True)
            train, dev = (datasets.load_from_disk(str(folder / split)) for split in ("train", "dev"))
            if task.labels:
                train = train.select(range(min(task.labels, len(train))))
            for rate in rates:
                for count in epochs:
                    for seed in study.compare.seeds:
                        tagger = folder / f"tagger-lr{rate:g}-e{count:g}-seed{seed}"
                        done = tagger / "all_results.json"
                        result = json.loads(done.read_text()) if done.is_file() else train_tagger(
                            train, dev, task.card.labels, tagger, int(count), rate, batch, config["hidden_size"], seed,
                            disable_tqdm=True)
                        scores.setdefault((rate, batch, float(count)), {})[seed] = result["eval_f1"]
        found[name] = scores
    keyed = Task(entry.record_key, task.card, task.labels, "f1", task.data_dir)
    return build_result(study.compare.baseline, study.compare.seeds, models, {keyed.key: keyed},
                        {keyed.key: found})["tasks"][keyed.key]
