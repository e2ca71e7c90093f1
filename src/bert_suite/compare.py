"""`bert-suite compare`: several checkpoints fine-tuned on the same tasks with the same grid, seeds and label
subsets, and each compared with a baseline seed by seed: the protocol of the paper's ablations (Table 5), where
two pre-trainings differ in one thing and everything after them is the same.

For every task and model the grid (grid.py: learning rate x batch size x epochs x seed, resumable, shared by
workers) runs in OUT/TASK/NAME. The seeds are the same for every model, so each seed gives every model the
same data order and the same label subset (`sst2@1000`: the first 1,000 training examples). Per model, the
setting with the best mean dev score over the seeds is chosen (not its luckiest trial); its per-seed scores,
mean and standard error are reported, and against the baseline the mean per-seed difference, its standard
error, a 95% interval (Student's t, n - 1 degrees of freedom) and a verdict at 2 SE (report.py). Scores are on
the metric's 0-100 scale. Writes OUT/compare.json, compare.md (one table: models x tasks, the shape of the
paper's Table 5) and compare.png (grouped bars with SE error bars).

A model is `NAME=PATH` (a checkpoint folder or Hub id), `NAME=random:PATH` (PATH's config and vocabulary with
fresh weights: its random twin) or `NAME=bilstm:PATH` (a randomly initialised BiLSTM between the encoder and the
head: Table 5's "+ BiLSTM"). Everything is checked before anything is written or trained.
"""

from __future__ import annotations

import hashlib
import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import datasets

from .cards import CardError, TaskCard, load_card
from .grid import grid_key, run_grid, search_space
from .io import atomic_write_text, save_figure
from .report import choose_setting, md_table, mean_se, paired_comparison, seed_scores
from .runner import ModelSpec, RunError, adapter_for

SETTING_NAMES = ("learning_rate", "batch_size", "epochs")
_NAME = re.compile(r"[A-Za-z0-9][\w.-]*")
_TASK = re.compile(r"\w[\w/-]*")


class CompareError(RunError):
    """A comparison that cannot start; the message names the flag, the value and what was expected."""


@dataclass(frozen=True)
class Model:
    name: str
    model: str  # what the grid is given (prefixes included)
    path: str  # the checkpoint it reads its config and vocabulary from
    random_init: bool
    bilstm: bool


@dataclass(frozen=True)
class Task:
    key: str  # as given: "sst2@1000"
    card: TaskCard
    labels: int | None  # the first N training examples (None: all)
    metric: str  # compared and chosen on: the card's selection metric or --metric TASK=NAME
    data_dir: str | None


def parse_models(values: list[str]) -> dict[str, Model]:
    """NAME=PATH values as Models, in order; at least two, names unique, each PATH a checkpoint."""
    models: dict[str, Model] = {}
    for value in values:
        name, sep, model = value.partition("=")
        if not sep or not model:
            raise CompareError(f"--model {value}: expected NAME=PATH (e.g. mlm=runs/mlm/final, random=random:runs/mlm/final)")
        if not _NAME.fullmatch(name):
            raise CompareError(f"--model {value}: the name {name!r} is not a plain name; expected letters, digits, "
                               "'_', '-' or '.' (it names a folder and a table row)")
        if name in models:
            raise CompareError(f"--model {value}: the name {name} is given twice; expected one --model per name")
        spec = ModelSpec.parse(model)
        if spec.source.startswith("preset:"):
            raise CompareError(f"--model {value}: a preset has no vocabulary of its own; expected a checkpoint, or "
                               "random:PATH for a checkpoint's random twin")
        models[name] = Model(name, model, spec.source, spec.random, spec.bilstm)
    if len(models) < 2:
        raise CompareError(f"--model: {len(models)} model given; a comparison needs at least two (--model A=PATH "
                           "B=PATH ...)")
    return models


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
    return search_space(task.card, preset, learning_rate=learning_rates, per_device_train_batch_size=batch_sizes,
                        num_train_epochs=epochs, seed=seeds)


def grid_folder(output_dir: Path, task: Task, model: Model) -> Path:
    return output_dir / task.key / model.name


def study_for(task: Task, model: Model, space: dict) -> str:
    """One study per (task, model, grid): the models share the grid, so the study name (which the grid derives
    from the grid alone) must also name the model, or the second model would find the first's trials done."""
    key = {"model": model.model, "grid": grid_key(task.card, space, {"train": task.labels})}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"compare-{task.card.name}-{model.name}-{digest}"


def run_compare(models: dict[str, Model], tasks: dict[str, Task], baseline: str, seeds: list[int],
                spaces: dict[str, dict], output_dir: str | Path, storage: str | None = None, max_seq_length: int | None = None,
                max_eval_samples: int | None = None, overrides: dict | None = None, precision=None,
                heartbeat_interval: int = 30, grace_period: int = 120, log=print) -> dict:
    """Run (or resume) every task x model grid (`spaces`: each task's grid, the same for every model; its seed
    axis is `seeds`), then write compare.json, compare.md and compare.png. Returns compare.json's content."""
    out = Path(output_dir)
    total, done = len(tasks) * len(models), 0
    found: dict[str, dict[str, dict]] = {}
    same = same_models(models, baseline)
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
    for name, twin in same.items():
        result["models"][name]["same_as"] = twin
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
    for name in sorted(models, key=lambda n: n != baseline):
        model = models[name]
        path = Path(model.path)
        if not model.random_init or not path.is_dir():
            continue
        digest = hashlib.sha256(f"bilstm={model.bilstm}".encode())
        for file in sorted(f for f in path.iterdir() if f.name in RANDOM_TWIN_FILES or f.suffix == ".model"):
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
        same[name] = seen.setdefault(digest.hexdigest(), name)
    return {name: twin for name, twin in same.items() if twin != name}


RANDOM_TWIN_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt",
                     "special_tokens_map.json", "added_tokens.json")  # and a sentencepiece *.model


def grid_scores(task: Task, model: Model, space: dict, folder: Path, storage: str | None = None,
                max_seq_length: int | None = None, max_eval_samples: int | None = None, overrides: dict | None = None,
                precision=None, heartbeat_interval: int = 30, grace_period: int = 120) -> dict[tuple, dict[int, float]]:
    """Run (or resume) one model's grid on one task in `folder`; its scores on the task's metric as
    {setting: {seed: fraction}}."""
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
    chosen = choose_setting(scores, seeds)
    if chosen is None:
        raise CompareError(f"{what}: no grid setting has a score for every seed {' '.join(map(str, seeds))} "
                           "(failed trials? see its grid_results.md)")
    per_seed = [100 * scores[chosen][s] for s in seeds]
    mean, se = mean_se(per_seed)
    return {"setting": _setting(chosen), "scores": per_seed, "mean": mean, "se": se}


def build_result(baseline: str, seeds: list[int], models: dict[str, Model], tasks: dict[str, Task],
                 found: dict[str, dict[str, dict]]) -> dict:
    """compare.json from each task's and model's grid scores ({task: {model: {setting: {seed: fraction}}}})."""
    result = {"baseline": baseline, "seeds": list(seeds),
              "models": {m.name: {"path": m.path, "random_init": m.random_init, "bilstm": m.bilstm}
                         for m in models.values()},
              "tasks": {}}
    for task in tasks.values():
        entry = {"metric": task.metric, "labels": task.labels, "models": {}, "vs_baseline": {}}
        for name in models:
            entry["models"][name] = chosen_scores(found[task.key][name], seeds, f"{task.key}, {name}")
        for name in models:
            if name != baseline:
                entry["vs_baseline"][name] = paired_comparison(entry["models"][name]["scores"],
                                                               entry["models"][baseline]["scores"])
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


def same_model_lines(result: dict) -> list[str]:
    """A paragraph naming the models that are another's (`same_models`), or nothing."""
    same = {name: m["same_as"] for name, m in result["models"].items() if "same_as" in m}
    return [" ".join(f"{name} is the same model as {twin} (fresh weights from the same config and vocabulary, the "
                     "same seeds): its scores are that grid's." for name, twin in same.items()), ""] if same else []


def markdown(result: dict, grid: str = "", vocabularies: dict | None = None) -> str:
    seeds = result["seeds"]
    lines = ["# Comparison", "", *markdown_table(result), "",
             f"Mean ± standard error over seeds {', '.join(map(str, seeds))} (scores 0-100); in brackets the mean "
             f"per-seed difference from {result['baseline']} ± its standard error, and the verdict: ahead or "
             "behind beyond 2 standard errors, else level. Every model ran the same grid with the same seeds (so "
             "the same data order and label subset per seed); each model's setting is the one with the best mean "
             "dev score over the seeds.", ""]
    if grid:
        lines += [f"Grid: {grid}.", ""]
    if vocabularies and len({v for v in vocabularies.values()}) > 1:
        lines += ["**The models do not share one vocabulary**, so their inputs differ as well as their weights: " +
                  "; ".join(f"{name}: {size:,} tokens ({digest[:8]})" for name, (size, digest) in vocabularies.items())
                  + ".", ""]
    lines += [*same_model_lines(result), "## Per task", ""]
    for key, entry in result["tasks"].items():
        labels = f", first {entry['labels']:,} training examples" if entry["labels"] else ""
        rows = []
        for name, model in entry["models"].items():
            setting = model["setting"]
            versus = entry["vs_baseline"].get(name)
            rows.append([name, f"lr {setting['learning_rate']:g}, batch {setting['batch_size']}, "
                         f"epochs {setting['epochs']:g}", ", ".join(f"{v:.2f}" for v in model["scores"]),
                         f"{model['mean']:.2f} ± {model['se']:.2f}",
                         "" if versus is None else f"{versus['difference']:+.2f} ± {versus['se']:.2f} "
                         f"[{versus['ci95'][0]:+.2f}, {versus['ci95'][1]:+.2f}] {versus['verdict']}"])
        lines += [f"### {key} ({entry['metric']}{labels})", "",
                  *md_table(["model", "setting", "per-seed scores", "mean ± SE",
                             f"vs {result['baseline']} ± SE [95% interval]"], rows), ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> Path:
    """Grouped bars: a group per task, a bar per model, mean ± SE."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1.6 + 1.3 * len(result["tasks"]) * max(1, len(result["models"])) / 3, 4),
                 layout="constrained")
    bars(fig.add_subplot(), result)
    return save_figure(fig, path)


def bars(ax, result: dict) -> None:
    """compare.png's grouped bars drawn on `ax` (also a panel of an ablation's figure)."""
    tasks, models = list(result["tasks"]), list(result["models"])
    width = 0.8 / len(models)
    for i, name in enumerate(models):
        means = [result["tasks"][t]["models"][name]["mean"] for t in tasks]
        errors = [result["tasks"][t]["models"][name]["se"] or 0 for t in tasks]
        ax.bar([k + (i - (len(models) - 1) / 2) * width for k in range(len(tasks))], means, width, yerr=errors,
               capsize=2, label=name, color=f"C{i}")  # model i's colour: an ablation's curve panels take it too
    ax.set_xticks(range(len(tasks)), labels=[textwrap.fill(f"{t} ({result['tasks'][t]['metric']})", 14)
                                             for t in tasks])
    ax.set(ylabel="dev score (0-100)", title=f"mean ± SE over {len(result['seeds'])} seeds")
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
