"""`bert-suite compare`: several checkpoints fine-tuned on the same tasks with the same grid, seeds and label
subsets, and each compared with a baseline seed by seed: the protocol of the paper's ablations (Table 5), where
two pre-trainings differ in one thing and everything after them is the same.

For every task and model the grid (grid.py: learning rate x batch size x epochs x seed, resumable, shared by
workers) runs in OUT/TASK/NAME. The seeds are the same for every model, so each seed gives every model the
same data order and the same label subset (`sst2@1000`: the first 1,000 training examples). Per model, the
setting with the best mean dev score over the seeds is chosen (not its luckiest trial); its per-seed scores,
mean and standard error are reported, and against the baseline the paired difference, its standard error, a
95% interval (Student's t) and the verdict of that interval (report.seeded_comparison). Scores are on the
metric's 0-100 scale. Writes OUT/compare.json, compare.md (one table: models x tasks, the shape of the paper's
Table 5) and compare.png (grouped bars with SE error bars).

A model is `NAME=PATH` (a checkpoint folder or Hub id), `NAME=random:PATH` (PATH's config and vocabulary with
fresh weights: its random twin) or `NAME=bilstm:PATH` (a randomly initialised BiLSTM between the encoder and the
head: Table 5's "+ BiLSTM"); `NAME=PATH1,PATH2,...` is one recipe's checkpoints from several pre-training seeds,
each with its own grid (OUT/TASK/NAME, NAME.2, ...), paired with the baseline's by position, so that the verdict
counts pre-trainings (a statement about the recipes) rather than fine-tuning seeds around one checkpoint each.
Everything is checked before anything is written or trained.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import statistics
import textwrap
from dataclasses import dataclass
from pathlib import Path

from .cards import CardError, TaskCard, load_card
from .io import atomic_write_text, save_figure
from .model_spec import ModelSpec, RunError
from .report import choose_setting, common_comparison, md_table, mean_se, scopes_text, seed_scores, seed_table

SETTING_NAMES = ("learning_rate", "batch_size", "epochs")
_NAME = re.compile(r"[A-Za-z0-9][\w.-]*")
_TASK = re.compile(r"\w[\w/-]*")


class CompareError(RunError):
    """A comparison that cannot start; the message names the flag, the value and what was expected."""


@dataclass(frozen=True)
class Model:
    """One checkpoint through the grids. A row of the table (a recipe) may have several, one per pre-training
    seed: each its own grid in OUT/TASK/NAME (the first) or NAME.K (compare) / NAME.seedS (an ablation)."""
    name: str  # the grid's folder and study: the row's name for its first checkpoint
    model: str  # what the grid is given (prefixes included)
    path: str  # the checkpoint it reads its config and vocabulary from
    random_init: bool
    bilstm: bool
    recipe: str | None = None  # the row it is one pre-training of (None: its own name)
    key: str = "1"  # its pre-training in the row's pretraining_scores: the position (compare) or the seed (ablation)

    @property
    def row(self) -> str:
        return self.recipe or self.name


@dataclass(frozen=True)
class Task:
    key: str  # as given: "sst2@1000"
    card: TaskCard
    labels: int | None  # the first N training examples (None: all)
    metric: str  # compared and chosen on: the card's selection metric or --metric TASK=NAME
    data_dir: str | None


def parse_models(values: list[str]) -> dict[str, Model]:
    """NAME=PATH[,PATH...] values as Models, one per checkpoint, in order: a row's first checkpoint named NAME,
    its K-th NAME.K (its pre-training K, for pretraining_scores); at least two rows, names unique, each PATH a
    checkpoint (a random twin of several checkpoints: one fresh draw each, `random@K:`). Rows pair with each
    other by position, so every row has as many checkpoints as the first."""
    models: dict[str, Model] = {}
    rows: dict[str, list[str]] = {}
    for value in values:
        name, sep, given = value.partition("=")
        if not sep or not given or not all(given.split(",")):
            raise CompareError(f"--model {value}: expected NAME=PATH or NAME=PATH1,PATH2,... (the checkpoints of one "
                               "recipe from different pre-training seeds; e.g. mlm=runs/mlm/final, "
                               "random=random:runs/mlm/final)")
        if not _NAME.fullmatch(name):
            raise CompareError(f"--model {value}: the name {name!r} is not a plain name; expected letters, digits, "
                               "'_', '-' or '.' (it names a folder and a table row)")
        if name in rows:
            raise CompareError(f"--model {value}: the name {name} is given twice; expected one --model per name (its "
                               "checkpoints as PATH1,PATH2,...)")
        elements = given.split(",")
        specs = [ModelSpec.parse(element) for element in elements]
        # a random twin of several checkpoints: each its own fresh draw (random@K for the K-th; the first's
        # spelling unchanged, so its grid resumes)
        drawn = [_own_draw(element, spec, position, len(elements))
                 for position, (element, spec) in enumerate(zip(elements, specs, strict=True), start=1)]
        # one checkpoint however it is spelt (`a`, `./a`, `a/`, a link to it), as given or as drawn (`random@2:a,
        # random:a` is draw 2 twice): two grids of it would count as two pre-trainings
        for forms in (elements, drawn):
            same = [(s.random, s.bilstm, s.draw, os.path.realpath(s.source) if os.path.exists(s.source) else s.source)
                    for s in map(ModelSpec.parse, forms)]
            twice = next((i for i in range(len(same)) if same[i] in same[:i]), None)
            if twice is not None and forms is elements:
                raise CompareError(f"--model {value}: {elements[twice]} is given twice; expected each pre-training's "
                                   "checkpoint once")
            if twice is not None:
                first = elements[same.index(same[twice])]
                raise CompareError(f"--model {value}: {elements[twice]}, checkpoint {twice + 1} of a row of random "
                                   f"twins, is drawn as {drawn[twice]}, the draw {first} names already; expected each "
                                   "draw once (the K-th checkpoint's draw is K: random@K)")
        rows[name] = []
        for position, (element, spec) in enumerate(zip(drawn, specs, strict=True), start=1):
            if spec.source.startswith("preset:"):
                raise CompareError(f"--model {value}: a preset has no vocabulary of its own; expected a checkpoint, "
                                   "or random:PATH for a checkpoint's random twin")
            label = name if position == 1 else f"{name}.{position}"
            models[label] = Model(label, element, spec.source, spec.random, spec.bilstm,
                                  name if len(elements) > 1 else None, str(position))
            rows[name].append(label)
    if len(rows) < 2:
        raise CompareError(f"--model: {len(rows)} model given; a comparison needs at least two (--model A=PATH "
                           "B=PATH ...)")
    clash = next((label for labels in rows.values() for label in labels[1:] if label in rows), None)
    if clash is not None:
        raise CompareError(f"--model {clash}=...: {clash} also names another row's checkpoint; rename that row")
    first = next(iter(rows))
    for name, labels in rows.items():
        if len(labels) != len(rows[first]):
            raise CompareError(f"--model {name}=...: {len(labels)} checkpoint{'s' * (len(labels) != 1)}, {first} has "
                               f"{len(rows[first])}: rows pair by position (pre-training K with pre-training K), so "
                               "each needs the same number")
    return models


def _own_draw(element: str, spec: ModelSpec, position: int, count: int) -> str:
    """The element of a row's checkpoint `position` of `count`: a random twin given without a draw number
    (`random:PATH`, `bilstm:random:PATH`) past the first becomes its own draw, random@POSITION, its other prefixes
    kept."""
    if not (spec.random and count > 1 and spec.draw == 1 and position > 1):
        return element
    head, rest = element.split(":", 1)  # random[@1]:[bilstm:]PATH or bilstm:random[@1]:PATH
    return f"random@{position}:{rest}" if head.startswith("random") else f"{head}:random@{position}:{spec.source}"


def rows_of(models: dict[str, Model]) -> dict[str, list[Model]]:
    """The table's rows (recipes) and each row's checkpoints, in order."""
    rows: dict[str, list[Model]] = {}
    for model in models.values():
        rows.setdefault(model.row, []).append(model)
    return rows


def vocabulary_of(model: Model) -> tuple[int, str]:
    """(size, sha256 of the tokens in order) of the model's tokenizer; a PATH that is not a checkpoint (no
    config.json, or no weights unless random:) is an error naming it."""
    from .tokenization import load_tokenizer

    path = Path(model.path)
    if path.exists():
        if not (path / "config.json").is_file():
            raise CompareError(f"--model {model.name}={model.model}: {path} is not a checkpoint (no config.json); "
                               "expected a folder written by the recipe, finetune or save_pretrained")
        weights = list(path.glob("*.safetensors")) + list(path.glob("pytorch_model*.bin"))
        if not weights and not model.random_init:
            raise CompareError(f"--model {model.name}={model.model}: {path} has no weights (model.safetensors); "
                               "expected a checkpoint, or random:PATH for fresh weights")
    try:
        tokenizer = load_tokenizer(model.path)
    except (OSError, ValueError) as err:
        raise CompareError(f"--model {model.name}={model.model}: {err}") from None
    tokens = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return len(tokens), hashlib.sha256("\n".join(t for t, _ in tokens).encode()).hexdigest()


@dataclass(frozen=True)
class DataDir:
    """A --data_dir value: a folder searched for every task, or TASK=DIR, the folder (or file) of one task."""
    folder: str
    task: str | None = None

    @classmethod
    def parse(cls, value: str) -> DataDir:
        """DIR or TASK=DIR (a DIR whose path holds a '=' stays a DIR when what precedes it is not a task name)."""
        task, sep, folder = value.partition("=")
        return cls(folder, task) if sep and _TASK.fullmatch(task) else cls(value)

    def __str__(self) -> str:
        return f"{self.task}={self.folder}" if self.task else self.folder


def data_dirs_of(values: list[str] | None) -> list[DataDir] | None:
    return None if values is None else [DataDir.parse(v) for v in values]


def parse_tasks(values: list[str], data_dirs: list[str] | None, metrics: list[str] | None) -> dict[str, Task]:
    """--task TASK[@LABELS] values as Tasks, each with its data folder and metric (--metric TASK=NAME)."""
    chosen: dict[str, str] = {}
    for value in metrics or []:
        task, sep, name = value.partition("=")
        if not sep or not name:
            raise CompareError(f"--metric {value}: expected TASK=METRIC (e.g. mrpc=accuracy)")
        chosen[task] = name
    tasks: dict[str, Task] = {}
    for value in values:
        if value in tasks:
            raise CompareError(f"--task {value}: given twice")
        tasks[value] = resolve_task(value, data_dirs_of(data_dirs), chosen.get(value, chosen.get(value.split("@")[0])))
    unknown = sorted(set(chosen) - set(tasks) - {t.card.name for t in tasks.values()})
    if unknown:
        raise CompareError(f"--metric {unknown[0]}=...: not one of the --task values ({', '.join(tasks)})")
    return tasks


def resolve_task(key: str, data_dirs: list[DataDir] | None, metric: str | None = None, flag: str = "--task") -> Task:
    """TASK[@LABELS] as a Task: its card, label count, metric (None: the card's) and data folder (`data_dir_for`);
    the one resolver of `bert-suite compare` and the ablation's study. Errors begin with `flag` and the key."""
    name, sep, count = key.partition("@")
    labels = None
    if sep:
        if not count.isdigit() or int(count) < 1:
            raise CompareError(f"{flag} {key}: expected TASK@N with N a positive number of training examples")
        labels = int(count)
    try:
        card = load_card(name)
    except CardError as err:
        raise CompareError(f"{flag} {key}: {err}") from None
    where = "data_dir" if flag == "task" else "--data_dir"
    return Task(key, card, labels, metric or card.select, data_dir_for(card, data_dirs, where))


def data_dir_for(card: TaskCard, data_dirs: list[DataDir] | None, flag: str = "--data_dir") -> str | None:
    """The task's folder among the data folders: TASK=DIR for this task, else the first DIR that holds the
    card's data folder (DIR/RTE in a GLUE root) or the card's train file itself. None (the Hub) when none is
    given."""
    if not data_dirs:
        return None
    for entry in data_dirs:
        if entry.task in (card.name, Path(card.path).stem):
            return entry.folder
    train_file = card.splits[card.train_split].file if card.train_split else None
    for folder in (Path(e.folder) for e in data_dirs if not e.task):
        if card.data_folder and (folder / card.data_folder).is_dir():
            return str(folder / card.data_folder)
        if train_file and (folder / train_file).is_file():
            return str(folder)
    raise CompareError(f"{flag} {' '.join(map(str, data_dirs))}: no folder for task {card.name}; expected DIR/"
                       f"{card.data_folder or '<task folder>'} or DIR/{train_file} among them, or {card.name}=DIR")


def check_tasks(tasks: dict[str, Task], model: Model | None, max_seq_length: int | None = None,
                tokenizer=None) -> None:
    """Before any grid runs: every task's train split reads (as the grid reads it), every @LABELS fits it, and its
    first examples encode at the run's length with `model`'s tokenizer (a length a task cannot use, such as a
    SQuAD window shorter than its questions, would otherwise stop the comparison after hours of other grids)."""
    import datasets

    from .runner import adapter_for
    from .tokenization import check_max_seq_length, load_tokenizer

    tokenizer = tokenizer or load_tokenizer(model.path)
    for task in tasks.values():
        adapter = adapter_for(task.card)
        train = adapter.load_split(task.card, task.card.train_split, task.data_dir)
        if task.labels is not None and task.labels > len(train):
            raise CompareError(f"--task {task.key}: {task.labels:,} labels is above {task.card.name}'s train size "
                               f"({len(train):,} examples); expected at most {len(train):,}")
        length = check_max_seq_length(int(max_seq_length or task.card.defaults.get("max_seq_length", 128)))
        shown = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()  # two examples: no bar
        try:
            adapter.preprocess(train.select(range(min(2, len(train)))), task.card, tokenizer, length, train=True)
        except ValueError as err:
            raise CompareError(f"--task {task.key}: {err}") from None
        finally:
            if shown:
                datasets.enable_progress_bars()


def check_seeds(seeds: list[int]) -> None:
    if len(seeds) < 2:
        raise CompareError(f"--seeds {' '.join(map(str, seeds))}: a standard error needs at least two seeds; "
                           "expected e.g. --seeds 1 2 3 4 5")
    if len(set(seeds)) != len(seeds):
        raise CompareError(f"--seeds {' '.join(map(str, seeds))}: a seed is repeated")


# ------------------------------------------------------------------------------------------------ the run


def grid_space(task: Task, seeds: list[int], learning_rates=None, batch_sizes=None, epochs=None,
               preset: str | None = None) -> dict:
    """The grid every model runs on `task`: the card's (or `preset`'s) axes, those given replacing them, and
    `seeds` as the seed axis."""
    from .grid import search_space

    return search_space(task.card, preset, learning_rate=learning_rates, per_device_train_batch_size=batch_sizes,
                        num_train_epochs=epochs, seed=seeds)


def grid_folder(output_dir: Path, task: Task, model: Model) -> Path:
    return output_dir / task.key / model.name


def study_for(task: Task, model: Model, space: dict) -> str:
    """One study per (task, model, grid): the models share the grid, so the study name (which the grid derives
    from the grid alone) must also name the model, or the second model would find the first's trials done."""
    from .grid import grid_key

    key = {"model": model.model, "grid": grid_key(task.card, space, {"train": task.labels})}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"compare-{task.card.name}-{model.name}-{digest}"


def run_compare(models: dict[str, Model], tasks: dict[str, Task], baseline: str, seeds: list[int],
                spaces: dict[str, dict], output_dir: str | Path, storage: str | None = None, max_seq_length: int | None = None,
                max_eval_samples: int | None = None, overrides: dict | None = None, precision=None,
                heartbeat_interval: int = 30, grace_period: int = 120, log=print) -> dict:
    """Run (or resume) every task x model grid (`spaces`: each task's grid, the same for every model; its seed
    axis is `seeds`), then write compare.json, compare.md and compare.png. Returns compare.json's content."""
    from . import finetune_step

    out = Path(output_dir)
    total, done = len(tasks) * len(models), 0
    found: dict[str, dict[str, dict]] = {}
    same = same_models(models, baseline)
    with finetune_step.trials():  # one architecture's checkpoints share a task's captured step (on a GPU)
        for task in tasks.values():
            found[task.key] = {}
            for model in models.values():
                done += 1
                if model.name in same:
                    log(f"[compare] {done}/{total}: {task.key} with {model.name}: the same model as {same[model.name]} "
                        "(fresh weights from the same config and vocabulary, the same seeds): its grid")
                    continue
                log(f"[compare] {done}/{total}: {task.key} with {model.name} ({model.model})")
                found[task.key][model.name] = grid_scores(task, model, spaces[task.key], grid_folder(out, task, model),
                                                          storage, max_seq_length, max_eval_samples, overrides, precision,
                                                          heartbeat_interval, grace_period)
            for name, twin in same.items():
                found[task.key][name] = found[task.key][twin]
    result = build_result(baseline, seeds, models, tasks, found)
    for row, twin in same_rows(models, same).items():
        result["models"][row]["same_as"] = twin
    vocabularies = {name: vocabulary_of(m) for name, m in models.items()}
    grids = {describe_grid(space) for space in spaces.values()}
    write_outputs(out, result, "; ".join(f"{key}: {describe_grid(spaces[key])}" for key in tasks)
                  if len(grids) > 1 else grids.pop(), vocabularies)
    return result


def same_models(models: dict[str, Model], baseline: str) -> dict[str, str]:
    """{name: earlier name} for each random-init model whose config and tokenizer files are byte for byte those of
    an earlier one (the baseline first): its weights are drawn from the same config with the same seeds, so it is
    the same model and gets the same grid. Two corpora's random twins are, when their vocabularies coincide."""
    seen: dict[str, str] = {}
    same = {}
    for name in sorted(models, key=lambda n: models[n].row != baseline):
        model = models[name]
        path = Path(model.path)
        if not model.random_init or not path.is_dir():
            continue
        digest = hashlib.sha256(f"bilstm={model.bilstm} draw={ModelSpec.parse(model.model).draw}".encode())
        for file in sorted(f for f in path.iterdir() if f.name in RANDOM_TWIN_FILES or f.suffix == ".model"):
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
        same[name] = seen.setdefault(digest.hexdigest(), name)
    return {name: twin for name, twin in same.items() if twin != name}


def same_rows(models: dict[str, Model], same: dict[str, str]) -> dict[str, str | dict]:
    """{row: the row whose grids it took}, from `same_models`' checkpoints: the other row's name when all of the
    row's checkpoints are that row's, else {checkpoint: the checkpoint it is}."""
    found: dict[str, str | dict] = {}
    for row, members in rows_of(models).items():
        twins = {m.name: same[m.name] for m in members if m.name in same}
        if twins:
            others = {models[t].row for t in twins.values()}
            found[row] = others.pop() if len(twins) == len(members) and len(others) == 1 else twins
    return found


RANDOM_TWIN_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt",
                     "special_tokens_map.json", "added_tokens.json")  # and a sentencepiece *.model


def grid_scores(task: Task, model: Model, space: dict, folder: Path, storage: str | None = None,
                max_seq_length: int | None = None, max_eval_samples: int | None = None, overrides: dict | None = None,
                precision=None, heartbeat_interval: int = 30, grace_period: int = 120) -> dict[tuple, dict[int, float]]:
    """Run (or resume) one model's grid on one task in `folder`; its scores on the task's metric as
    {setting: {seed: fraction}}."""
    from .grid import run_grid

    result = run_grid(task.card, model.model, str(folder), task.data_dir, max_seq_length=max_seq_length, space=space,
                      storage=storage, overrides=dict(overrides or {}),
                      max_samples={"train": task.labels, "eval": max_eval_samples},
                      heartbeat_interval=heartbeat_interval, grace_period=grace_period,
                      name=study_for(task, model, space), precision=precision)
    column = f"eval_{task.metric}"
    complete = [r for r in result["records"] if r["state"] == "complete"]
    if complete and column not in complete[0]["metrics"]:
        known = sorted(k.removeprefix("eval_") for k in complete[0]["metrics"] if k.startswith("eval_"))
        raise CompareError(f"--metric {task.card.name}={task.metric}: the task reports no {task.metric}; "
                           f"expected one of {', '.join(known)}")
    return seed_scores(result["records"], column)


def _setting(setting: tuple) -> dict:
    return dict(zip(SETTING_NAMES, setting, strict=True))


def chosen_scores(scores: dict[tuple, dict[int, float]], seeds: list[int], what: str) -> dict:
    """A grid's answer: the setting with the best mean over `seeds` and its per-seed scores (0-100), mean and
    standard error ({"setting", "scores", "mean", "se"}); `what` names the grid in the error when no setting has
    a score for every seed."""
    return recipe_scores({"1": scores}, seeds, what)


def recipe_scores(grids: dict[str, dict[tuple, dict[int, float]]], seeds: list[int], what: str) -> dict:
    """A row's answer from the grids of its pre-trainings ({key: {setting: {seed: fraction}}}): the setting with
    the best mean over every pre-training and seed (as one checkpoint's over its seeds), and at it
    `pretraining_scores` ({key: per-seed scores, 0-100}), `mean` and `se` over the pre-trainings' means (one
    pre-training: over its seeds, and `scores` its per-seed scores; several: `scores` the pre-trainings' means,
    and their `sd_pretraining` beside the pooled `sd_finetuning`)."""
    pooled: dict[tuple, dict[tuple, float]] = {}
    for key, scores in grids.items():
        for setting, by_seed in scores.items():
            pooled.setdefault(setting, {}).update({(key, s): v for s, v in by_seed.items()})
    chosen = choose_setting(pooled, [(key, s) for key in grids for s in seeds])
    if chosen is None:
        raise CompareError(f"{what}: no grid setting has a score for every seed {' '.join(map(str, seeds))}"
                           + (" of every pre-training" if len(grids) > 1 else "") + " (failed trials? see its "
                           "grid_results.md)")
    table = {key: [100 * pooled[chosen][key, s] for s in seeds] for key in grids}
    found = {"setting": _setting(chosen)}
    if len(grids) == 1:
        per_seed = next(iter(table.values()))
        mean, se = mean_se(per_seed)
        return {**found, "scores": per_seed, "mean": mean, "se": se, "pretraining_scores": table}
    means = [statistics.fmean(v) for v in table.values()]
    mean, se = mean_se(means)
    within = [statistics.variance(v) for v in table.values() if len(v) > 1]
    return {**found, "scores": means, "mean": mean, "se": se, "pretraining_scores": table,
            "sd_pretraining": statistics.stdev(means),
            "sd_finetuning": math.sqrt(statistics.fmean(within)) if within else None}


def build_result(baseline: str, seeds: list[int], models: dict[str, Model], tasks: dict[str, Task],
                 found: dict[str, dict[str, dict]]) -> dict:
    """compare.json from each task's and checkpoint's grid scores ({task: {checkpoint: {setting: {seed:
    fraction}}}}): a row per recipe, its pre-trainings paired with the baseline's by key, on the keys both have
    (`common_comparison`)."""
    rows = rows_of(models)
    result = {"baseline": baseline, "seeds": list(seeds), "models": {}, "tasks": {}}
    for row, members in rows.items():
        first = members[0]
        result["models"][row] = {"path": first.path, "random_init": first.random_init, "bilstm": first.bilstm}
        if len(members) > 1:
            result["models"][row]["checkpoints"] = [m.path for m in members]
    for task in tasks.values():
        entry = {"metric": task.metric, "labels": task.labels, "models": {}, "vs_baseline": {}}
        for row, members in rows.items():
            entry["models"][row] = recipe_scores({m.key: found[task.key][m.name] for m in members}, seeds,
                                                 f"{task.key}, {row}")
        for row in rows:
            if row != baseline:
                entry["vs_baseline"][row] = common_comparison(seed_table(entry["models"][row], seeds),
                                                              seed_table(entry["models"][baseline], seeds))
        result["tasks"][task.key] = entry
    return result


# ------------------------------------------------------------------------------------------------ outputs


def describe_grid(space: dict) -> str:
    return ", ".join(f"{axis} {' '.join(format(v, 'g') for v in values)}" for axis, values in space.items())


def _cell(entry: dict, name: str, baseline: str) -> str:
    model = entry["models"][name]
    text = f"{model['mean']:.1f} ± {model['se']:.1f}"
    if name != baseline:
        d = entry["vs_baseline"][name]
        text += f" ({d['difference']:+.1f} ± {d['se']:.1f}, {d['verdict']})"
    return text


def markdown_table(result: dict) -> list[str]:
    """Models as rows and tasks as columns: mean ± SE and, beside it, the paired difference from the baseline
    ± its SE with the verdict: the shape of the paper's Table 5."""
    baseline = result["baseline"]
    header = ["model", *(f"{key} ({entry['metric']})" for key, entry in result["tasks"].items())]
    rows = [[name + (" (baseline)" if name == baseline else ""),
             *(_cell(entry, name, baseline) for entry in result["tasks"].values())] for name in result["models"]]
    return md_table(header, rows)


def unit_text(result: dict) -> str:
    """What the table's ± and verdicts count, in one sentence (a row's pre-trainings where it has several; an
    ablation's variants may have different numbers of them)."""
    seeds = ", ".join(map(str, result["seeds"]))
    found = [d for entry in result["tasks"].values() for d in entry["vs_baseline"].values()]
    counts = {name: len(m["pretraining_scores"]) for entry in result["tasks"].values()
              for name, m in entry["models"].items()}
    several = {name: n for name, n in counts.items() if n > 1}
    if several and len(set(counts.values())) == 1:
        unit = (f"Mean ± standard error over {max(counts.values())} pre-trainings of each recipe, each pre-training's "
                f"score the mean over fine-tuning seeds {seeds} (scores 0-100): the SE counts pre-trainings, so a "
                "verdict speaks about the recipes")
    elif several:
        single = [name for name in counts if name not in several]
        unit = (f"Mean ± standard error over each recipe's pre-trainings "
                f"({', '.join(f'{name}: {n}' for name, n in several.items())}), each pre-training's score the mean "
                f"over fine-tuning seeds {seeds}: the SE counts pre-trainings, so it speaks about the recipe"
                + (f"; over fine-tuning seeds {seeds} for a model of one pre-training ({', '.join(single)}): its SE "
                   "speaks about that checkpoint" if single else "") + " (scores 0-100)")
    else:
        unit = (f"Mean ± standard error over fine-tuning seeds {seeds} (scores 0-100), one pre-training a model: a "
                "verdict speaks about these checkpoints, not the recipes that made them")
    if not found:
        return unit + "."
    return (unit + f"; in brackets the paired difference from {result['baseline']} ± its SE ({scopes_text(found)}) "
            "and the verdict: ahead or behind when its 95% interval (Student's t) lies wholly above or below zero, "
            "else level.")


def markdown(result: dict, grid: str = "", vocabularies: dict | None = None) -> str:
    lines = ["# Comparison", "", *markdown_table(result), "", unit_text(result) + " Every model ran the same grid "
             "with the same seeds (so the same data order and label subset per seed); each model's setting is the one "
             "with the best mean dev score over its seeds (and pre-trainings).", ""]
    if grid:
        lines += [f"Grid: {grid}.", ""]
    if vocabularies and len({v for v in vocabularies.values()}) > 1:
        lines += ["**The models do not share one vocabulary**, so their inputs differ as well as their weights: " +
                  "; ".join(f"{name}: {size:,} tokens ({digest[:8]})" for name, (size, digest) in vocabularies.items())
                  + ".", ""]
    lines += [*same_model_lines(result), "## Per task", ""]
    for key, entry in result["tasks"].items():
        labels = f", first {entry['labels']:,} training examples" if entry["labels"] else ""
        several = any(len(m["pretraining_scores"]) > 1 for m in entry["models"].values())
        rows = []
        for name, model in entry["models"].items():
            setting = model["setting"]
            versus = entry["vs_baseline"].get(name)
            shown = ("; ".join(f"{k}: {statistics.fmean(v):.2f}" for k, v in model["pretraining_scores"].items())
                     if several else ", ".join(f"{v:.2f}" for v in model["scores"]))
            spread = ([f"{model['sd_pretraining']:.2f}", f"{model['sd_finetuning']:.2f}"] if several and
                      model.get("sd_finetuning") is not None else ["", ""] if several else [])
            rows.append([name, f"lr {setting['learning_rate']:g}, batch {setting['batch_size']}, "
                         f"epochs {setting['epochs']:g}", shown, f"{model['mean']:.2f} ± {model['se']:.2f}", *spread,
                         "" if versus is None else f"{versus['difference']:+.2f} ± {versus['se']:.2f} "
                         f"[{versus['ci95'][0]:+.2f}, {versus['ci95'][1]:+.2f}] {versus['verdict']}"
                         + (f", ahead in {versus['first_ahead_in']} of {versus['pretrainings']}" if several else "")])
        header = ["model", "setting", "per pre-training (mean over seeds)" if several else "per-seed scores",
                  "mean ± SE", *(["SD pre-training", "SD fine-tuning"] if several else []),
                  f"vs {result['baseline']} ± SE [95% interval]"]
        lines += [f"### {key} ({entry['metric']}{labels})", "", *md_table(header, rows), ""]
    return "\n".join(lines)


def same_model_lines(result: dict) -> list[str]:
    """A paragraph naming the models that are another's (`same_models`), or nothing."""
    same = {name: m["same_as"] for name, m in result["models"].items() if "same_as" in m}
    return [" ".join(f"{name} is the same model as {twin} (fresh weights from the same config and vocabulary, the "
                     "same seeds): its scores are that grid's." for name, twin in same.items()), ""] if same else []


def plot(result: dict, path: Path) -> Path:
    """Grouped bars: a group per task, a bar per model, mean ± SE."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1.6 + 1.3 * len(result["tasks"]) * max(1, len(result["models"])) / 3, 4),
                 layout="constrained")
    bars(fig.add_subplot(), result)
    return save_figure(fig, path)


def bars(ax, result: dict) -> None:
    """compare.png's grouped bars drawn on `ax` (also a panel of an ablation's figure): mean ± SE, and with several
    pre-trainings a model, a dot per pre-training (its mean over the fine-tuning seeds) on each bar."""
    tasks, models = list(result["tasks"]), list(result["models"])
    width = 0.8 / len(models)
    several = set()
    for i, name in enumerate(models):
        entries = [result["tasks"][t]["models"][name] for t in tasks]
        where = [k + (i - (len(models) - 1) / 2) * width for k in range(len(tasks))]
        ax.bar(where, [e["mean"] for e in entries], width, yerr=[e["se"] or 0 for e in entries], capsize=2,
               label=name, color=f"C{i}")  # model i's colour: an ablation's curve panels take it too
        for x, entry in zip(where, entries, strict=True):
            means = [statistics.fmean(v) for v in entry.get("pretraining_scores", {}).values()]
            several.update([len(means)] if means else [])
            if len(means) > 1:
                ax.scatter([x] * len(means), means, s=10, color="k", zorder=3)
    ax.set_xticks(range(len(tasks)), labels=[textwrap.fill(f"{t} ({result['tasks'][t]['metric']})", 14)
                                             for t in tasks])
    counts = "-".join(map(str, sorted({min(several), max(several)}))) if several else "1"
    ax.set(ylabel="dev score (0-100)", title=f"mean ± SE over {counts} pre-trainings (dots), {len(result['seeds'])} "
           "seeds each" if max(several, default=1) > 1 else f"mean ± SE over {len(result['seeds'])} seeds")
    long = max(map(len, models)) > 12  # long names: one column beside the bars, not a row under them
    ax.legend(fontsize=8, ncols=1 if long else min(len(models), 5), loc="center left" if long else "upper center",
              bbox_to_anchor=(1.01, 0.5) if long else (0.5, -0.15))


def write_outputs(out: Path, result: dict, grid: str = "", vocabularies: dict | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "compare.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(out / "compare.md", markdown(result, grid, vocabularies))
    try:
        plot(result, out / "compare.png")
    except ImportError:  # matplotlib is a dependency; a broken install still gets the table
        pass
