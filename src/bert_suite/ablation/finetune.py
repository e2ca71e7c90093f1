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
    chosen_scores,
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


def fine_tuning_checkpoint(folder: Path, size: str) -> Path:
    """The checkpoint a grid starts from: `folder`, or, when it was pre-trained with other dropout than its
    preset's (`size`), a twin folder (links to its files) whose config has the preset's dropout, so every
    variant and its random twin fine-tune with the same config."""
    from ..configuration_bert_suite import BertSuiteConfig

    config = json.loads((folder / "config.json").read_text())
    keys = ("hidden_dropout_prob", "attention_probs_dropout_prob")
    preset = BertSuiteConfig.from_preset(size)
    if all(config.get(k) == getattr(preset, k) for k in keys):
        return folder
    twin = folder.parent / f"{folder.name}-finetune"
    twin.mkdir(exist_ok=True)
    for path in folder.iterdir():
        with contextlib.suppress(FileExistsError):  # another --workers process made it first
            if path.name != "config.json" and not (twin / path.name).exists():
                (twin / path.name).symlink_to(path.resolve())
    config.update({k: getattr(preset, k) for k in keys})
    atomic_write_text(twin / "config.json", json.dumps(config, indent=2))
    return twin


def models_of(study: Study, runs: dict[str, Path], names=None) -> dict[str, Model]:
    """Every variant (or those in `names`) as compare's Model, in the file's order: a pre-trained one's final
    checkpoint, or its source's with fresh weights (random_init) or a BiLSTM before the head."""
    models = {}
    for name, variant in study.variants.items():
        if names is not None and name not in names:
            continue
        start = str(fine_tuning_checkpoint(runs[variant.source or name] / "final", study.size(variant.source or name)))
        prefix = "random:" if variant.random_init else "bilstm:" if variant.bilstm else ""
        models[name] = Model(name, prefix + start, start, variant.random_init, variant.bilstm)
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
    """`compare` of every variant (OUT/compare), the feature-based route (not in a `worker`), then the curve's
    grids (OUT/curve): compare.json's content and {variant: {task: [{step, mean, se, scores}]}}."""
    models = models_of(study, runs)
    tasks, spaces = tuned_tasks(study, data_dirs)
    max_len = study.compare.max_seq_length
    try:
        check_tasks(tasks, next(iter(models.values())), max_len)
    except CompareError as err:
        raise AblationError(f"{study.path}: compare: {err}") from None
    seeds = study.compare.seeds
    checkpoints = study.pretraining.checkpoints
    total = len(tasks) * len(models) + len(study.curve_variants) * len(study.curve_tasks) * len(checkpoints) \
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

    def grid(name: str, key: str, step: int) -> dict:
        if step == steps and key in result["tasks"]:  # the compare stage's own grid
            clock["done"] += 1
            return result["tasks"][key]["models"][name]
        model, scores = curve_grid(study, out, runs, steps, name, curve_tasks[key], step, spaces, storage, log)
        try:
            return chosen_scores(scores, seeds, f"curve: {key} with {model.name}")
        except CompareError as err:
            raise AblationError(f"{err} ({out / 'curve' / key / model.name})") from None

    def skip() -> None:
        clock["done"] += 1

    curve = curve_of(study, runs, list(curve_tasks), steps, grid, skip)
    return result, curve


FINE_TUNING = {"disable_tqdm": True}  # the grids' TrainingArguments overrides


def curve_grid(study: Study, out: Path, runs: dict[str, Path], steps: int, name: str, task: Task, step: int,
               spaces: dict, storage: str | None, log) -> tuple[Model, dict]:
    """One point of the curve: `name`'s snapshot at `step` (its final checkpoint at the last step) through the
    task's grid in OUT/curve/TASK/NAME@STEP."""
    folder = runs[name] / ("final" if step == steps else f"snapshots/step-{step}")
    start = str(fine_tuning_checkpoint(folder, study.size(name)))
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


def ready_variants(study: Study, runs: dict[str, Path], steps: int) -> list[str]:
    """The variants whose fine-tuning can start, in the file's order: a pre-trained one whose run is finished, a
    fine-tuning-only one whose source's is."""
    from .stages import finished_steps

    done = {name for name in study.pretrained if finished_steps(runs[name]) == steps}
    return [name for name, variant in study.variants.items() if (variant.source or name) in done]


def early_grids(study: Study, out: Path, runs: dict[str, Path], steps: int, data_dirs: list, storage: str | None,
                progress: Progress | None, worker: bool = False) -> int:
    """While other processes still pre-train some variants: the grids that need only what is done already, in
    the folders the compare stage will use (it then finds them done): compare's for each variant ready
    (`ready_variants`), and the curve's for each snapshot written, a run's last step once it is finished. A grid
    whose model could yet turn out to be another's (a random twin behind one not ready, a snapshot behind an
    earlier curve variant's missing one) waits for the compare stage, and so does the snapshot of an unfinished
    run past its last checkpoint (`kept_past`). Returns how many grids it went through (done ones included)."""
    ready = ready_variants(study, runs, steps)
    tasks, spaces = tuned_tasks(study, data_dirs)
    models = models_of(study, runs, ready)
    order = sorted(study.variants, key=lambda n: n != study.compare.baseline)  # compare's order for twins
    fresh = [n for n in order if study.variants[n].random_init]
    twins = same_models(models, study.compare.baseline)
    todo = [name for name in models if name not in twins
            and (name not in fresh or all(n in models for n in fresh[:fresh.index(name)]))]
    ran = 0

    def log(line: str) -> None:
        if progress is not None and not worker:
            waiting = [n for n in study.pretrained if n not in ready]
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
                if step == steps:  # the final checkpoint: compare's grid, or its own once the run is finished
                    if key not in tasks and name in ready:
                        curve_grid(study, out, runs, steps, name, task, step, spaces, storage, log)
                        ran += 1
                    continue
                digest = snapshot_digest(runs[name] / "snapshots" / f"step-{step}")
                if digest is not None and (digest, key) in first:
                    continue  # a copy of one fine-tuned here: the compare stage takes that point
                if digest is None or not (name in ready or kept_past(runs[name], step)):
                    missing = True  # not written, or a resume could write it again: not yet
                    continue
                first.add((digest, key))
                if not missing:
                    curve_grid(study, out, runs, steps, name, task, step, spaces, storage, log)
                    ran += 1
    return ran


def curve_of(study: Study, runs: dict[str, Path], keys: list[str], steps: int, grid, skip=lambda: None) -> dict:
    """{variant: {task: [{step, mean, se, scores}]}} over the study's checkpoints, each point from
    `grid(variant, task, step)`. A snapshot that is byte for byte one fine-tuned already (a biphasic run started
    from the left-to-right run's checkpoint has copies of its snapshots up to that step) takes that point,
    marked `"from": variant`, and `skip()` is called instead of a grid: the same weights, the same grid."""
    curve: dict = {}
    first: dict[tuple, tuple[str, dict]] = {}  # (snapshot digest, task) -> the variant and point fine-tuned
    for name in study.curve_variants:
        for key in keys:
            points = []
            for step in study.pretraining.checkpoints:
                digest = snapshot_digest(runs[name] / "snapshots" / f"step-{step}") if step < steps else None
                if digest and (digest, key) in first:
                    donor, point = first[digest, key]
                    points.append({**point, "from": donor})
                    skip()
                    continue
                entry = grid(name, key, step)
                points.append({"step": step, "mean": entry["mean"], "se": entry["se"], "scores": entry["scores"]})
                if digest:
                    first[digest, key] = (name, points[-1])
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
    rates = entry.learning_rates or [1e-3]
    epochs = entry.epochs or [4]
    batch = (entry.batch_sizes or [32])[0]
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
