"""`bert-suite ablation STUDY.yaml`: a pre-training ablation as data, the protocol of the paper's Tables 5, 6
and 8 (Section 5): N pre-trainings that differ in one thing, then the same fine-tuning grid, seeds and label
subsets for every one of them, and each question the study asks as a paired difference.

Stages, each in a folder of --output_dir whose settings are recorded in stages/NAME.json before it runs; a
finished stage is skipped, an interrupted one resumed (the recipe from its last checkpoint, a grid from its
study), and one made with other settings is refused rather than reused:

  squad_small/          a squad_small task whose `data_dir` is the official dev-v1.1.json, split by article
  corpus/               corpus.files + the train texts of corpus.task_texts, with every sentence sharing an
                        8-word sequence with a compared task's dev or test files removed (`decontaminate`)
  vocabulary/           a WordPiece vocabulary trained on the corpus (or vocabulary.vocab_file, as is)
  instances/LENGTH/     NSP instances at instances.max_seq_length (and phase2_length)
  calibration/NAME/     with pretraining.minutes: a short run per variant; the slowest plans everyone's steps
  pretraining/NAME/     recipes/pretrain.py per pre-trained variant (final/, snapshots/step-N for the curve)
  compare/              `bert-suite compare` of every variant (compare.json, compare/TASK/NAME grids)
  curve/TASK/NAME@STEP/ each curve variant's snapshots fine-tuned with the same grid and seeds
  ablation.json, ablation.md, ablation.png

The data stages run in one process at a time (a lock file), so several `--variant` runs may share a folder.
Everything in the file is checked before anything is written or trained; an error names the file, the key
and what was expected.
"""

from __future__ import annotations

import contextlib
import difflib
import glob
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .io import atomic_write_text, save_figure

STAGES = ("squad-small", "corpus", "vocabulary", "instances", "pretraining", "compare", "record")
NGRAM = 8  # decontamination: a sentence sharing this many consecutive words with evaluation text goes
TIMING_EVERY = 30  # seconds between updates of a running pre-training's entry in timing.json
CALIBRATION_STEPS = 40  # pretraining.minutes: steps of each variant's calibration run
BUDGET_SHARE = 0.85  # pretraining.minutes: the share of the budget planned for steps (the rest: evaluations, saving)
SECTIONS = {  # key -> its keys (None: free text; pretraining also takes the recipe's keys)
    "title": None, "notes": None,
    "corpus": ("files", "task_texts", "decontaminate"),
    "vocabulary": ("vocab_size", "lowercase", "vocab_file"),
    "instances": ("max_seq_length", "dupe_factor", "balance_nsp", "phase2_length", "phase2_fraction"),
    "pretraining": ("steps", "minutes", "checkpoints", "warmup_fraction"),
    "variants": (),
    "compare": ("baseline", "seeds", "tasks", "learning_rates", "batch_sizes", "epochs", "max_seq_length", "data_dir"),
    "curve": ("variants", "tasks"),
    "contrasts": (),
}
REQUIRED = ("corpus", "vocabulary", "pretraining", "variants", "compare")
TASK_KEYS = ("task", "metric", "learning_rates", "batch_sizes", "epochs", "feature_based", "optional")
FEATURE_LAYERS = 4  # Table 8's feature-based column: the last four layers (all, in a smaller model), concatenated
# recipe keys the study sets itself, from its stages and its `steps`
OWNED = ("train_data", "train_data_phase2", "tokenizer", "output_dir", "max_steps", "phase1_fraction",
         "snapshot_steps", "resume_from_checkpoint")
_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")
_NAME = re.compile(r"[A-Za-z0-9][\w.-]*")
_TASK = re.compile(r"\w[\w/-]*")


class AblationError(ValueError):
    """A study file or stage that cannot be used; the message names the file, the key and what was expected."""


@dataclass
class Variant:
    name: str
    recipe: dict = field(default_factory=dict)  # the recipe keys in which a pre-trained variant differs
    source: str | None = None  # `from`: a fine-tuning-only variant of this pre-trained one
    random_init: bool = False
    bilstm: bool = False


@dataclass
class Study:
    path: Path
    raw: dict  # the file as read
    title: str
    notes: str
    files: list[Path]
    task_texts: list[str]
    decontaminate: bool
    vocab_size: int | None
    lowercase: bool
    vocab_file: Path | None
    instances: dict
    recipe: dict  # the recipe keys every variant shares
    steps: int | None
    minutes: float | None
    checkpoints: list[int]
    warmup_fraction: float | None
    variants: dict[str, Variant]
    compare: dict
    tasks: list[dict]  # {"key", "metric", "learning_rates", "batch_sizes", "epochs"} (None: compare's)
    curve_variants: list[str]
    curve_tasks: list[str]
    contrasts: list[dict]
    left_out: list[str] = field(default_factory=list)  # optional tasks without data

    @property
    def pretrained(self) -> list[str]:
        return [name for name, v in self.variants.items() if v.source is None]

    def size(self, name: str) -> str:
        """The model size preset a pre-trained variant uses."""
        return {**self.recipe, **self.variants[name].recipe}.get("model_size", "tiny")

    @property
    def stem(self) -> str:
        return self.path.stem


# ------------------------------------------------------------------------------------------- the file


def load_study(path: str | Path) -> Study:
    """Read and check a study file; every path in it is relative to the file (after `${VAR}` and
    `${VAR:-default}` are replaced from the environment)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise AblationError(f"{path}: cannot read the study file ({err.strerror})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise AblationError(f"{path}: {where}not YAML ({getattr(err, 'problem', None) or err})") from None
    read = _Reader(path)
    read.known("", raw, SECTIONS)
    for key in REQUIRED:
        if key not in raw:
            read.bad(key, "missing; a study needs " + ", ".join(REQUIRED))
    files, task_texts, decontaminate = read.corpus(raw["corpus"])
    vocab_size, lowercase, vocab_file = read.vocabulary(raw["vocabulary"])
    recipe, steps, minutes, checkpoints, warmup = read.pretraining(raw["pretraining"])
    variants = read.variants(raw["variants"], recipe, steps)
    comp, tasks, left_out = read.compare(raw["compare"], variants)
    curve_variants, curve_tasks = read.curve(raw.get("curve") or {}, variants, checkpoints, comp["data_dir"])
    contrasts = [{"first": read.variant(f"contrasts[{i}].first", c["first"], variants),
                  "second": read.variant(f"contrasts[{i}].second", c["second"], variants), "label": str(c["label"])}
                 for i, c in enumerate(read.listed("contrasts", raw.get("contrasts") or [], dict,
                                                   "{first, second, label}"))
                 if read.known(f"contrasts[{i}]", c, ("first", "second", "label"), required=True)]
    return Study(path, raw, str(raw.get("title") or path.stem), str(raw.get("notes") or ""), files, task_texts,
                 decontaminate, vocab_size, lowercase, vocab_file, read.instances(raw.get("instances") or {}), recipe,
                 steps, minutes, checkpoints, warmup, variants, comp, tasks, curve_variants, curve_tasks, contrasts,
                 left_out)


class _Reader:
    """A study file's sections, each checked as it is read; every error names the file and the key."""

    def __init__(self, path: Path):
        self.path, self.base = path, path.resolve().parent

    def bad(self, key: str, why: str):
        raise AblationError(f"{self.path}: {key}: {why}")

    def known(self, where: str, mapping, allowed, required: bool = False) -> dict:
        """`mapping`, whose keys must be among `allowed` (all of them with `required`)."""
        if not isinstance(mapping, dict):
            self.bad(where or "the file", "expected a mapping of keys to values")
        for key in mapping:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), list(allowed), n=1, cutoff=0.6)
                self.bad(f"{where}.{key}".lstrip("."), "unknown key; " + (
                    f"did you mean {close[0]}?" if close else f"expected one of {', '.join(allowed)}"))
        if required and not all(k in mapping for k in allowed):
            self.bad(where, f"expected {', '.join(allowed)}")
        return mapping

    def kind(self, key: str, value, types, what: str):
        """`value`, which must be of `types` (a bool is not a number here)."""
        allowed = types if isinstance(types, tuple) else (types,)
        if not isinstance(value, types) or isinstance(value, bool) and bool not in allowed:
            self.bad(key, f"expected {what}, got {value!r}")
        return value

    def listed(self, key: str, value, item_types, what: str) -> list:
        """A list (or one value, as a list of one) of `item_types`."""
        value = [value] if isinstance(value, (str, int, float)) and not isinstance(value, bool) else value
        self.kind(key, value, list, f"a list of {what}")
        return [self.kind(key, v, item_types, what) for v in value]

    def local(self, key: str, value: str) -> Path:
        """A path of the file: environment variables replaced, relative to the file's folder."""
        def var(match):
            found = os.environ.get(match[1]) or match[2]
            if found is None:
                self.bad(key, f"${{{match[1]}}} is not set; set it, or write ${{{match[1]}:-DEFAULT}}")
            return found
        text = _VAR.sub(var, self.kind(key, value, str, "a path"))
        return Path(os.path.normpath(self.base / Path(text).expanduser()))

    def variant(self, key: str, name, variants: dict) -> str:
        if name not in variants:
            self.bad(key, f"{name} is not a variant; expected one of {', '.join(variants)}")
        return name

    def corpus(self, section) -> tuple[list[Path], list[str], bool]:
        section = self.known("corpus", section, SECTIONS["corpus"])
        files = []
        for pattern in self.listed("corpus.files", section.get("files", []), str, "paths or globs"):
            found = sorted(glob.glob(str(self.local("corpus.files", pattern))))
            if not found:
                self.bad("corpus.files", f"{pattern} matches no file")
            files += [Path(f) for f in found if Path(f).is_file()]
        task_texts = self.listed("corpus.task_texts", section.get("task_texts", []), str, "task names")
        if not files and not task_texts:
            self.bad("corpus", "no text: expected files, task_texts or both")
        return files, task_texts, bool(section.get("decontaminate", True))

    def vocabulary(self, section) -> tuple[int | None, bool, Path | None]:
        section = self.known("vocabulary", section, SECTIONS["vocabulary"])
        vocab_file = section.get("vocab_file")
        if (vocab_file is None) == ("vocab_size" not in section):
            self.bad("vocabulary", "expected vocab_size (with lowercase) or vocab_file (a released vocab.txt), one "
                     "of them")
        if vocab_file is not None:
            vocab_file = self.local("vocabulary.vocab_file", vocab_file)
            if not vocab_file.is_file():
                self.bad("vocabulary.vocab_file", f"{vocab_file} is not a file; expected a vocab.txt")
        else:
            self.kind("vocabulary.vocab_size", section["vocab_size"], int, "a whole number")
        return section.get("vocab_size"), bool(section.get("lowercase", True)), vocab_file

    def instances(self, section) -> dict:
        values = {"max_seq_length": 128, "dupe_factor": 5, "balance_nsp": False, "phase2_length": None,
                  "phase2_fraction": 0.1, **self.known("instances", section, SECTIONS["instances"])}
        for key in ("max_seq_length", "dupe_factor"):
            if self.kind(f"instances.{key}", values[key], int, "a positive whole number") < 1:
                self.bad(f"instances.{key}", f"expected a positive whole number, got {values[key]}")
        if values["phase2_length"] is not None:
            self.kind("instances.phase2_length", values["phase2_length"], int, "a whole number")
        if not 0 < self.kind("instances.phase2_fraction", values["phase2_fraction"], (int, float), "a share") < 1:
            self.bad("instances.phase2_fraction", f"expected a share between 0 and 1, got {values['phase2_fraction']}")
        return values

    def pretraining(self, section) -> tuple[dict, int | None, float | None, list[int], float | None]:
        """(the shared recipe keys, steps, minutes, checkpoints, warmup_fraction)."""
        section = dict(self.kind("pretraining", section, dict, "a mapping of keys to values"))
        own = {k: section.pop(k) for k in SECTIONS["pretraining"] if k in section}
        if ("steps" in own) == ("minutes" in own):
            self.bad("pretraining", "expected exactly one of steps (equal steps) or minutes (steps planned on the "
                     "slowest variant)" + (", not both" if "steps" in own else ""))
        steps, minutes = own.get("steps"), own.get("minutes")
        if steps is not None and self.kind("pretraining.steps", steps, int, "a whole number") < 1:
            self.bad("pretraining.steps", f"expected a positive number of steps, got {steps}")
        if minutes is not None and self.kind("pretraining.minutes", minutes, (int, float), "a number") <= 0:
            self.bad("pretraining.minutes", f"expected a positive number of minutes, got {minutes}")
        checkpoints = sorted(set(self.listed("pretraining.checkpoints", own.get("checkpoints", []), int, "steps")))
        for step in checkpoints:
            if step < 1:
                self.bad("pretraining.checkpoints", f"expected positive steps, got {step}")
            if steps is not None and step > steps:
                self.bad("pretraining.checkpoints", f"step {step} is beyond the {steps:,} steps of the pre-training")
        warmup = own.get("warmup_fraction")
        if warmup is not None and not 0 <= self.kind("pretraining.warmup_fraction", warmup, (int, float),
                                                     "a share") < 1:
            self.bad("pretraining.warmup_fraction", f"expected a share in [0, 1), got {warmup}")
        return _recipe_keys(section, "pretraining", self.bad), steps, minutes, checkpoints, warmup

    def variants(self, section, recipe: dict, steps: int | None) -> dict[str, Variant]:
        variants: dict[str, Variant] = {}
        for name, spec in self.known("variants", section, section or {}).items():
            where = f"variants.{name}"
            if not _NAME.fullmatch(str(name)):
                self.bad(where, "expected a plain name (letters, digits, '_', '-', '.'): it names folders and rows")
            spec = self.kind(where, spec or {}, dict, "a mapping of recipe keys ({} for none), or {from: NAME, "
                             "random_init: true} / {from: NAME, bilstm: true}")
            if "from" in spec:
                self.known(where, spec, ("from", "random_init", "bilstm"))
                random_init, bilstm = bool(spec.get("random_init")), bool(spec.get("bilstm"))
                if random_init == bilstm:
                    self.bad(where, "expected one of random_init: true or bilstm: true beside from")
                variants[name] = Variant(name, source=str(spec["from"]), random_init=random_init, bilstm=bilstm)
            else:
                variants[name] = Variant(name, _recipe_keys(spec, where, self.bad))
                _check_recipe({**recipe, **variants[name].recipe}, steps, where, self.bad)
        if not variants:
            self.bad("variants", "none; expected at least two (NAME: recipe keys in which it differs)")
        pretrained = [n for n, v in variants.items() if v.source is None]
        for variant in variants.values():
            target = variants.get(variant.source) if variant.source is not None else variant
            if target is None or target.source is not None:
                self.bad(f"variants.{variant.name}.from", f"{variant.source} is "
                         + ("a fine-tuning-only variant" if target else "not a variant")
                         + f"; expected a pre-trained one ({', '.join(pretrained)})")
        if not pretrained:
            self.bad("variants", "none is pre-trained; expected at least one with recipe keys (or {})")
        return variants

    def compare(self, section, variants: dict) -> tuple[dict, list[dict], list[str]]:
        """(the compare section with its defaults, the tasks that run, the optional tasks left out)."""
        comp = {"seeds": [1, 2, 3, 4, 5], "learning_rates": None, "batch_sizes": None, "epochs": None,
                "max_seq_length": None, "data_dir": [], **self.known("compare", section, SECTIONS["compare"])}
        if "baseline" not in comp:
            self.bad("compare.baseline", "missing; expected the variant every other is compared with")
        self.variant("compare.baseline", comp["baseline"], variants)
        comp["seeds"] = self.listed("compare.seeds", comp["seeds"], int, "whole numbers")
        if len(comp["seeds"]) < 2 or len(set(comp["seeds"])) != len(comp["seeds"]):
            self.bad("compare.seeds", f"expected two or more distinct seeds (a standard error needs them), got "
                     f"{comp['seeds']}")
        for key in ("learning_rates", "batch_sizes", "epochs"):
            if comp[key] is not None:
                comp[key] = self.listed(f"compare.{key}", comp[key], (int, float), "numbers")
        data_dirs = []
        for value in self.listed("compare.data_dir", comp["data_dir"], str, "folders (or TASK=FOLDER)"):
            task, sep, folder = value.partition("=")
            if not (sep and _TASK.fullmatch(task)):  # a folder whose path holds a '='
                task, sep, folder = "", "", value
            data_dirs.append(f"{task}{sep}{self.local('compare.data_dir', folder)}")
        comp["data_dir"] = data_dirs
        tasks = []
        for entry in self.listed("compare.tasks", comp.get("tasks", []), (str, dict),
                                 "TASK[@LABELS] or {task: ..., ...}"):
            entry = {"task": entry} if isinstance(entry, str) else dict(self.known("compare.tasks[]", entry, TASK_KEYS))
            if "task" not in entry:
                self.bad("compare.tasks[]", f"{entry}: no task; expected task: TASK[@LABELS]")
            for key in ("learning_rates", "batch_sizes", "epochs"):
                if key in entry:
                    entry[key] = self.listed(f"compare.tasks[{entry['task']}].{key}", entry[key], (int, float),
                                             "numbers")
            task = {"key": entry.pop("task"), "metric": None, "learning_rates": None, "batch_sizes": None,
                    "epochs": None, "feature_based": False, "optional": False, **entry}
            task["record_key"] = task["key"] + " (feature-based)" if task["feature_based"] else task["key"]
            tasks.append(task)
        if not tasks:
            self.bad("compare.tasks", "none; expected TASK[@LABELS] strings or {task, metric, learning_rates, ...} "
                     "mappings")
        left_out = [t["record_key"] for t in tasks if t["optional"] and not _has_data(t["key"], data_dirs)]
        tasks = [t for t in tasks if t["record_key"] not in left_out]
        if not tasks:
            self.bad("compare.tasks", f"every task is optional and has no data ({', '.join(left_out)})")
        _check_tasks([t for t in tasks if not t["feature_based"]], data_dirs, self.bad)
        tuned = [n for n, v in variants.items() if v.source is not None]
        for task in (t for t in tasks if t["feature_based"]):
            _check_tasks([task], data_dirs, self.bad)
            where = f"compare.tasks[{task['key']}].feature_based"
            if _card_family(task["key"]) != "ner":
                self.bad(where, "the feature-based route (Table 7) is for NER tasks")
            if tuned:
                self.bad(where, f"{', '.join(tuned)} fine-tune only; the feature-based route reads frozen "
                         "pre-trained variants")
        return comp, tasks, left_out

    def curve(self, section, variants: dict, checkpoints: list[int], data_dirs: list[str]) -> tuple[list, list]:
        section = self.known("curve", section, SECTIONS["curve"])
        names = [self.variant("curve.variants", n, variants)
                 for n in self.listed("curve.variants", section.get("variants", []), str, "variant names")]
        tasks = self.listed("curve.tasks", section.get("tasks", []), str, "TASK[@LABELS] strings")
        if section and (not names or not tasks):
            self.bad("curve", "expected variants and tasks, both")
        if names and not checkpoints:
            self.bad("curve", "pretraining.checkpoints is empty; expected the steps whose checkpoints the curve "
                     "fine-tunes")
        for name in names:
            if variants[name].source is not None:
                self.bad("curve.variants", f"{name} is fine-tuning only: it has no pre-training checkpoints of its own")
        if tasks:
            _check_tasks([{"key": key, "metric": None} for key in tasks], data_dirs, self.bad)
        return names, tasks


def _recipe_keys(values: dict, where: str, bad) -> dict:
    """Recipe keys (those of recipes/configs/pretrain/*.yaml) as the recipe's types; unknown ones and the keys
    the study sets itself are errors."""
    from .pretraining.config import _FIELDS, PretrainConfigError, _coerce

    checked = {}
    for key, value in values.items():
        if key in OWNED:
            bad(f"{where}.{key}", "set by the study from its stages and steps; leave it out")
        if key not in _FIELDS:
            close = difflib.get_close_matches(str(key), [*_FIELDS, *SECTIONS["pretraining"]], n=1, cutoff=0.6)
            bad(f"{where}.{key}", "unknown recipe key; " + (f"did you mean {close[0]}?" if close else
                                                           "expected a key of recipes/configs/pretrain/*.yaml"))
        try:
            checked[key] = _coerce(f"{where}.{key}", key, value)
        except PretrainConfigError as err:
            bad(f"{where}.{key}", str(err).split(": ", 2)[-1])
    return checked


def _check_recipe(values: dict, steps: int | None, where: str, bad) -> None:
    """The recipe's own checks on a variant's whole config (placeholders for what the stages fill in)."""
    from .pretraining.config import PretrainConfig, PretrainConfigError, validate

    filled = {"train_data": "-", "tokenizer": "-", "phase1_fraction": 1.0, "max_steps": steps or 10**9,
              "warmup_steps": 0, **values}
    try:
        validate(PretrainConfig(**filled), where)
    except PretrainConfigError as err:
        bad(where, str(err).split(": ", 1)[-1])


def _card_family(key: str) -> str:
    from .cards import load_card

    return load_card(key.split("@")[0]).family


def _has_data(key: str, data_dirs: list[str]) -> bool:
    """Whether the task's train file is in its data folder."""
    from .compare import CompareError, parse_tasks

    try:
        task = parse_tasks([key], data_dirs or None, None)[key]
    except CompareError:
        return False
    spec = task.card.splits.get(task.card.train_split)
    return task.data_dir is not None and spec is not None and (Path(task.data_dir) / (spec.file or "")).is_file()


def _check_tasks(tasks: list[dict], data_dirs: list[str], bad) -> None:
    from .compare import CompareError, parse_tasks

    try:
        parse_tasks([t["key"] for t in tasks], data_dirs or None,
                    [f"{t['key']}={t['metric']}" for t in tasks if t["metric"]])
    except CompareError as err:
        bad("compare", str(err).replace("--task ", "task ").replace("--data_dir", "data_dir"))


# ------------------------------------------------------------------------------------------- stages


def check_stage(out: Path, name: str, wanted: dict, started: bool) -> None:
    """A stage runs only from the settings it was made with: OUT/stages/NAME.json records them before it runs;
    a stage begun or finished with other settings, or with outputs and no record, is refused, naming what
    differs (its outputs feed every later stage)."""
    marker = out / "stages" / f"{name.replace('/', '-')}.json"
    wanted = json.loads(json.dumps(wanted, default=str))
    recorded = json.loads(marker.read_text()) if marker.is_file() else None
    if recorded is not None and recorded != wanted:
        differing = sorted(k for k in {**recorded, **wanted} if recorded.get(k) != wanted.get(k))
        raise AblationError(f"{out}: the {name} stage was made with other settings ({', '.join(differing)}; see "
                            f"{marker}); give another --output_dir, or the same settings")
    if recorded is None and started:
        raise AblationError(f"{out}: the {name} stage has outputs but no record of its settings ({marker}); give "
                            "another --output_dir")
    marker.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(marker, json.dumps(wanted, indent=2))


@contextlib.contextmanager
def data_lock(out: Path):
    """The data stages one process at a time: `--variant` runs on one machine share the folder."""
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".data.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Progress:
    """A line per stage: what is done, what remains, and an estimate of the time left."""

    def stage(self, name: str, text: str) -> None:
        print(f"[ablation] {STAGES.index(name) + 1}/{len(STAGES)} {name}: {text}", flush=True)

    @staticmethod
    def left(seconds: float | None) -> str:
        if seconds is None:
            return "time left: estimated after the first one"
        hours, rest = divmod(int(seconds), 3600)
        return "about " + (f"{hours}h{rest // 60:02d}m" if hours else f"{max(1, rest // 60)} min") + " left"


def task_data(study: Study, out: Path, progress: Progress) -> list[str]:
    """compare.data_dir with a squad_small entry that is the official dev-v1.1.json replaced by its split in
    OUT/squad_small (built once)."""
    from .cards import load_card
    from .squad_small import build_squad_small

    dirs = []
    for value in study.compare["data_dir"]:
        task, sep, folder = value.partition("=")
        if sep and Path(folder).is_file() and load_card(task).name == "squad_small":
            small = out / "squad_small"
            check_stage(out, "squad_small", {"input": folder}, (small / "split.json").is_file())
            if not (small / "split.json").is_file():
                build_squad_small(folder, small)
            progress.stage("squad-small", f"done ({small} from {folder})")
            value = f"{task}={small}"
        dirs.append(value)
    return dirs


def build_corpus(study: Study, out: Path, data_dirs: list[str], progress: Progress) -> tuple[list[Path], dict]:
    """OUT/corpus/clean*: the files and the task texts in the lines format, without the compared tasks' dev and
    test sentences (when corpus.decontaminate). Returns the files and the decontamination counts."""
    from .cards import load_card
    from .compare import data_dir_for
    from .pretraining.decontaminate import decontaminate
    from .task_corpus import write_task_corpus

    corpus = out / "corpus"
    against = evaluation_files(study, data_dirs) if study.decontaminate else []
    parts = [(corpus / "clean", [str(f) for f in study.files], "auto"),
             (corpus / "clean_tasks", [str(corpus / "tasks" / f"{load_card(t).name}-train.txt")
                                       for t in study.task_texts], "lines")]
    parts = [part for part in parts if part[1]]
    check_stage(out, "corpus", {"input": [f for _, files, _ in parts for f in files], "against": against,
                                "ngram": NGRAM}, any((folder / "decontamination.json").is_file() for folder, _, _ in parts))
    for task in study.task_texts:
        card = load_card(task)
        if not (corpus / "tasks" / f"{card.name}-train.txt").is_file():
            write_task_corpus(card, corpus / "tasks", data_dir_for(card, data_dirs))
    totals = dict.fromkeys(("sentences", "sentences_removed"), 0)
    for folder, files, fmt in parts:
        if not (folder / "decontamination.json").is_file():
            try:
                decontaminate(files, against, str(folder), NGRAM, fmt=fmt, log=lambda _: None)
            except ValueError as err:
                raise AblationError(f"{study.path}: corpus: {err}") from None
        report = json.loads((folder / "decontamination.json").read_text())
        for key in totals:
            totals[key] += report[key]
    if totals["sentences"] == totals["sentences_removed"]:
        raise AblationError(f"{study.path}: corpus: empty after decontamination (all {totals['sentences']:,} sentences "
                            "share an 8-word sequence with the compared tasks' dev or test files); expected other text")
    clean = [folder / Path(f).name for folder, files, _ in parts for f in files]
    progress.stage("corpus", f"done ({len(clean)} files; {totals['sentences_removed']:,} of {totals['sentences']:,} "
                   f"sentences removed by {NGRAM}-gram decontamination against {len(against)} evaluation files)")
    return clean, {"ngram": NGRAM, **totals}


def evaluation_files(study: Study, data_dirs: list[str]) -> list[str]:
    """The dev and test files (every split but train) of each compared and curve task, from its data folder."""
    from .compare import parse_tasks

    found = []
    keys = list(dict.fromkeys([t["key"] for t in study.tasks] + study.curve_tasks))
    for task in parse_tasks(keys, data_dirs or None, None).values():
        if task.data_dir is None:
            raise AblationError(f"{study.path}: corpus.decontaminate: task {task.key} has no local data_dir to "
                                "decontaminate against; expected compare.data_dir with its files (or decontaminate: false)")
        for split, spec in task.card.splits.items():
            path = Path(task.data_dir) / (spec.file or "")
            if split != task.card.train_split and spec.file and path.is_file() and str(path) not in found:
                found.append(str(path))
    return found


def build_vocabulary(study: Study, out: Path, corpus: list[Path], progress: Progress) -> Path:
    from .pretraining.tokenizer import train_tokenizer

    if study.vocab_file is not None:
        progress.stage("vocabulary", f"{study.vocab_file} as is")
        return study.vocab_file
    folder = out / "vocabulary"
    check_stage(out, "vocabulary", {"input": corpus, "vocab_size": study.vocab_size, "lowercase": study.lowercase},
                (folder / "vocab.txt").is_file())
    if not (folder / "vocab.txt").is_file():
        train_tokenizer([str(f) for f in corpus], study.vocab_size, study.lowercase, str(folder), num_proc=1)
    progress.stage("vocabulary", f"done ({sum(1 for _ in open(folder / 'vocab.txt', encoding='utf-8')):,} pieces)")
    return folder


def build_instances(study: Study, out: Path, corpus: list[Path], vocab: Path, progress: Progress) -> dict[int, Path]:
    """OUT/instances/LENGTH at max_seq_length (dupe_factor passes) and phase2_length (one pass): {length: folder}."""
    from .pretraining.instances import build_pretraining_dataset
    from .tokenization import load_pretraining_tokenizer

    lengths = [study.instances["max_seq_length"]] + [study.instances["phase2_length"]] * bool(
        study.instances["phase2_length"])
    data = {}
    for length in lengths:
        folder = out / "instances" / str(length)
        dupe = study.instances["dupe_factor"] if length == lengths[0] else 1
        settings = {"input": corpus, "tokenizer": vocab, "max_seq_length": length, "dupe_factor": dupe,
                    "balance_nsp": study.instances["balance_nsp"]}
        check_stage(out, f"instances-{length}", settings, (folder / "pretrain_data_stats.json").is_file())
        if not (folder / "pretrain_data_stats.json").is_file():
            build_pretraining_dataset([str(f) for f in corpus], load_pretraining_tokenizer(str(vocab)), str(folder),
                                      max_seq_length=length, dupe_factor=dupe, fmt="lines", num_proc=1,
                                      balance_nsp=study.instances["balance_nsp"])
        data[length] = folder
        stats = data_stats(folder)
        progress.stage("instances", f"{length} tokens done ({stats['instances']:,} instances, NotNext share "
                       f"{stats['not_next_share']:.3f})")
    return data


def data_stats(folder: Path) -> dict:
    return json.loads((folder / "pretrain_data_stats.json").read_text())


def recipe_overrides(study: Study, variant: Variant, data: dict[int, Path], vocab: Path, output_dir: Path,
                     steps: int, **replace) -> list[str]:
    """recipes/pretrain.py key=value overrides for one variant: the study's stages and steps, the shared recipe
    keys, the variant's own, then `replace`."""
    first, second = study.instances["max_seq_length"], study.instances["phase2_length"]
    values = {"train_data": data[first], "tokenizer": vocab, "output_dir": output_dir, "max_steps": steps,
              "report_to": "none", "resume_from_checkpoint": "auto", "phase1_fraction": 1.0,
              "logging_steps": max(1, min(50, steps // 20)), "eval_steps": max(1, steps // 10),
              "save_steps": max(1, steps // 10)}
    if second:
        values.update(train_data_phase2=data[second], phase1_fraction=1 - study.instances["phase2_fraction"])
    if study.warmup_fraction is not None:
        values["warmup_steps"] = round(study.warmup_fraction * steps)
    if study.checkpoints and variant.name in study.curve_variants:
        values["snapshot_steps"] = ",".join(str(s) for s in study.checkpoints if s < steps) or "[]"
    values.update({**study.recipe, **variant.recipe, **replace})
    values.setdefault("warmup_steps", min(steps, 10_000))  # the recipe's 10,000 would outlast a short run
    return [f"{k}={v}" for k, v in values.items()]


def launch(overrides: list[str], log: Path, timing: Path | None = None) -> float:
    """`accelerate launch recipes/pretrain.py` with its output in `log`; returns its wall seconds. A failure is
    an error naming the log, after its last lines. `timing` (a list of {seconds, started, finished}) gets this
    launch's entry at once and its seconds every TIMING_EVERY while it runs, so a run killed with its caller
    (the end of a session) still counts the time it spent."""
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "pretrain.py"
    if not recipe.is_file():
        raise AblationError(f"{recipe}: the pre-training recipe is not here; run from a clone of the repository "
                            "(pip install -e .)")
    config = os.environ.get("BERT_SUITE_ACCELERATE_CONFIG") or str(recipe.parent / "configs" / "accelerate" / (
        "gpu.yaml" if _cuda() else "cpu.yaml"))
    cmd = [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file", config, str(recipe), *overrides]
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), "TOKENIZERS_PARALLELISM": "false"}
    started = time.time()
    earlier = json.loads(timing.read_text()) if timing is not None and timing.is_file() else []
    entry = {"seconds": 0.0, "started": time.strftime("%Y-%m-%d %H:%M:%S")}

    def record(done: bool) -> None:
        if timing is not None:
            entry["seconds"] = time.time() - started
            if done:
                entry["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
            timing.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(timing, json.dumps([*earlier, entry], indent=2))

    with open(log, "a") as handle:
        handle.write(f"$ {shlex.join(cmd)}\n")
        handle.flush()
        child = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env)
        try:
            while child.poll() is None:
                record(False)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=TIMING_EVERY)
            code = child.returncode
        finally:
            if child.poll() is None:  # this process is being stopped: so is its recipe
                child.terminate()
            record(True)
    if code:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        print("\n".join(tail), file=sys.stderr)
        raise AblationError(f"pre-training failed (exit {code}); see {log}")
    return time.time() - started


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def finished_steps(run: Path) -> int | None:
    results = run / "pretrain_results.json"
    if results.is_file() and (run / "final" / "config.json").is_file():
        return json.loads(results.read_text())["step"]
    return None


def plan_steps(study: Study, out: Path, data: dict[int, Path], vocab: Path, progress: Progress) -> int:
    """pretraining.steps, or with pretraining.minutes the steps the slowest variant fits in them: each variant
    runs CALIBRATION_STEPS steps (half in each phase) and its last logged window gives seconds per step."""
    if study.steps is not None:
        return study.steps
    per_step = {}
    for name in study.pretrained:
        folder = out / "calibration" / name
        result = folder / "calibration.json"
        phase2 = bool(study.instances["phase2_length"])
        overrides = recipe_overrides(study, study.variants[name], data, vocab, folder / "run", CALIBRATION_STEPS,
                                     logging_steps=CALIBRATION_STEPS // (4 if phase2 else 2),
                                     eval_steps=CALIBRATION_STEPS, save_steps=CALIBRATION_STEPS, eval_batches=1,
                                     resume_from_checkpoint="null", snapshot_steps="[]",
                                     **({"phase1_fraction": 0.5} if phase2 else {}))
        check_stage(out, f"calibration/{name}", {"overrides": overrides}, result.is_file())
        if not result.is_file():
            seconds = launch(overrides, folder / "calibration.log")
            logs = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
            measured = {}
            for phase, length in enumerate(data, start=1):
                windows = [log for log in logs if log["phase"] == phase]
                batch = config_value(overrides, "per_device_train_batch_size" if phase == 1 else
                                     "per_device_train_batch_size_phase2") or config_value(overrides,
                                                                                           "per_device_train_batch_size")
                if windows:
                    measured[phase] = batch * data_stats(data[length])["mean_instance_length"] / windows[-1][
                        "tokens_per_second"]
            atomic_write_text(result, json.dumps({"seconds_per_step": measured, "wall_seconds": seconds}, indent=2))
        measured = {int(k): v for k, v in json.loads(result.read_text())["seconds_per_step"].items()}
        share2 = study.instances["phase2_fraction"] if 2 in measured else 0.0
        per_step[name] = (1 - share2) * measured[1] + share2 * measured.get(2, measured[1])
    slowest = max(per_step, key=per_step.get)
    steps = max(1, int(study.minutes * 60 * BUDGET_SHARE / per_step[slowest]))
    late = [s for s in study.checkpoints if s > steps]
    if late:
        raise AblationError(f"{study.path}: pretraining.checkpoints: step {late[0]} is beyond the {steps:,} steps "
                            f"that {study.minutes:g} minutes give; expected steps up to {steps:,}")
    progress.stage("pretraining", f"{steps:,} steps for every variant in {study.minutes:g} minutes ({slowest} is the "
                   f"slowest: {per_step[slowest]:.3f} s a step)")
    return steps


def config_value(overrides: list[str], key: str):
    """A recipe key's value as the recipe reads it (the preset's default when the overrides leave it out)."""
    from .pretraining.config import load_pretrain_config

    return getattr(load_pretrain_config(None, overrides), key)


def pretrain(study: Study, out: Path, data: dict[int, Path], vocab: Path, steps: int, only: list[str] | None,
             progress: Progress) -> dict[str, Path]:
    """Run (or resume) the recipe for each pre-trained variant (`only`: these), one after another."""
    from .pretraining.checkpoints import complete_checkpoints

    runs = {name: out / "pretraining" / name for name in study.pretrained}
    todo = [n for n in (only or study.pretrained)]
    pace = []  # seconds per step of the runs finished in this process
    for number, name in enumerate(todo):
        run = runs[name]
        overrides = recipe_overrides(study, study.variants[name], data, vocab, run, steps)
        check_stage(out, f"pretraining/{name}", {"overrides": overrides}, run.is_dir() and any(run.iterdir()))
        done = finished_steps(run)
        if done is not None and done != steps:
            raise AblationError(f"{run} holds a finished run of {done:,} steps, not {steps:,}; give another --output_dir")
        if done is None:
            remaining = (len(todo) - number) * steps
            progress.stage("pretraining", f"{name} ({number + 1} of {len(todo)}: {', '.join(todo[number:])} to go; "
                           f"{steps:,} steps each); " + progress.left(pace[-1] * remaining if pace else None))
            found = complete_checkpoints(run / "checkpoints")
            first = int(found[-1].name.split("-")[1]) if found else 0  # where the recipe resumes
            seconds = launch(overrides, out / "logs" / f"pretraining-{name}.log", run / "timing.json")
            pace.append(seconds / max(steps - first, 1))
        progress.stage("pretraining", f"{name} done ({steps:,} steps, {minutes_of(run):.1f} minutes)")
    return runs


def minutes_of(run: Path) -> float:
    timing = run / "timing.json"
    return sum(t["seconds"] for t in json.loads(timing.read_text())) / 60 if timing.is_file() else 0.0


def evaluations(run: Path) -> list[dict]:
    """The held-out evaluations in a recipe run's metrics.jsonl, in step order."""
    return [e for e in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if any(k.startswith("eval_mlm_") for k in e)]


def pretraining_record(study: Study, runs: dict[str, Path], data: dict[int, Path], steps: int) -> dict:
    """Per pre-trained variant: steps, minutes, tokens (steps x batch x mean instance length, per phase),
    held-out accuracy of the last evaluation (MLM accuracy at masked positions, or next-token accuracy for a
    left-to-right model: not comparable), its kind, the NotNext share of its instances and its precision."""
    record = {}
    for name, run in runs.items():
        results = json.loads((run / "pretrain_results.json").read_text())
        config = results["config"]
        first = math.ceil(steps * config["phase1_fraction"]) if config.get("train_data_phase2") else steps
        phases = [(first, config["per_device_train_batch_size"], data_stats(Path(config["train_data"])))]
        if config.get("train_data_phase2"):
            phases.append((steps - first, config["per_device_train_batch_size_phase2"] or
                           config["per_device_train_batch_size"], data_stats(Path(config["train_data_phase2"]))))
        last = evaluations(run)[-1]
        record[name] = {"steps": steps, "minutes": round(minutes_of(run), 2),
                        "tokens": int(sum(s * b * st["mean_instance_length"] for s, b, st in phases)),
                        "held_out_accuracy": last["eval_mlm_accuracy"],
                        "held_out_perplexity": last["eval_mlm_perplexity"],  # Table 6's column (MLM models)
                        "accuracy_kind": "next_token" if config["causal_attention"] else "mlm",
                        "not_next_share": round(sum(s * st["not_next_share"] for s, _, st in phases) / steps, 4),
                        "precision": results.get("precision")}
    return record


def fine_tuning_checkpoint(folder: Path, size: str) -> Path:
    """The checkpoint a grid starts from: `folder`, or, when it was pre-trained with other dropout than its
    preset's (`size`), a twin folder (links to its files) whose config has the preset's dropout, so every
    variant and its random twin fine-tune with the same config."""
    from .configuration_bert_suite import BertSuiteConfig

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


# ------------------------------------------------------------------------------------------- fine-tuning


def compare_models(study: Study, runs: dict[str, Path]) -> list[str]:
    """`bert-suite compare --model` values for every variant, in the file's order."""
    values = []
    for name, variant in study.variants.items():
        start = fine_tuning_checkpoint(runs[variant.source or name] / "final", study.size(variant.source or name))
        prefix = "random:" if variant.random_init else "bilstm:" if variant.bilstm else ""
        values.append(f"{name}={prefix}{start}")
    return values


def spaces_for(study: Study, tasks: dict) -> dict[str, dict]:
    from .grid import search_space

    entries = {t["key"]: t for t in study.tasks if not t["feature_based"]}
    spaces = {}
    for key, task in tasks.items():
        axes = {name: entries.get(key, {}).get(name) or study.compare[name]
                for name in ("learning_rates", "batch_sizes", "epochs")}
        spaces[key] = search_space(task.card, None, learning_rate=axes["learning_rates"],
                                   per_device_train_batch_size=axes["batch_sizes"], num_train_epochs=axes["epochs"],
                                   seed=study.compare["seeds"])
    return spaces


def fine_tune(study: Study, out: Path, runs: dict[str, Path], steps: int, data_dirs: list[str], storage: str | None,
              progress: Progress | None) -> tuple[dict, dict]:
    """`bert-suite compare` of every variant (OUT/compare), then the curve's grids (OUT/curve): compare.json and
    {variant: {task: [{step, mean, se, scores}]}}. Several processes may run this at once on one folder: each
    grid's trials are shared through its study."""
    from .compare import CompareError, Model, check_tasks, grid_scores, parse_models, parse_tasks, run_compare
    from .report import choose_setting, mean_se

    models = parse_models(compare_models(study, runs))
    tuned = [t for t in study.tasks if not t["feature_based"]]
    tasks = parse_tasks([t["key"] for t in tuned], data_dirs or None,
                        [f"{t['key']}={t['metric']}" for t in tuned if t["metric"]])
    max_len = study.compare["max_seq_length"]
    try:
        check_tasks(tasks, next(iter(models.values())), max_len)
    except CompareError as err:
        raise AblationError(f"{study.path}: compare: {err}") from None
    spaces = spaces_for(study, tasks)
    overrides = {"disable_tqdm": True}
    total = len(tasks) * len(models) + len(study.curve_variants) * len(study.curve_tasks) * len(study.checkpoints) \
        + (len(study.tasks) - len(tuned)) * len(models)
    clock = {"done": 0, "started": time.time()}

    def log(line: str) -> None:
        if progress is not None:
            done, spent = clock["done"], time.time() - clock["started"]
            progress.stage("compare", f"grid {done + 1} of {total}, {line.split(': ', 1)[-1]}; "
                           + progress.left(spent / done * (total - done) if done else None))
        clock["done"] += 1

    result = run_compare(models, tasks, study.compare["baseline"], study.compare["seeds"], spaces, out / "compare",
                         storage, max_len, None, overrides, heartbeat_interval=30, grace_period=120, log=log) \
        if tasks else {"baseline": study.compare["baseline"], "seeds": study.compare["seeds"], "tasks": {},
                       "models": {m.name: {"path": m.path, "random_init": m.random_init, "bilstm": m.bilstm}
                                  for m in models.values()}}
    if progress is not None:  # not in a --workers helper: the feature route is not shared
        features = {t["record_key"]: feature_route(study, t, models, out, data_dirs, log) for t in study.tasks
                    if t["feature_based"]}
        result["tasks"] = {t["record_key"]: result["tasks"].get(t["record_key"]) or features[t["record_key"]]
                           for t in study.tasks}
    curve: dict = {}
    curve_tasks = parse_tasks(study.curve_tasks, data_dirs or None, None) if study.curve_tasks else {}
    curve_spaces = {key: spaces.get(key) or spaces_for(study, {key: task})[key] for key, task in curve_tasks.items()}
    for name in study.curve_variants:
        for key, task in curve_tasks.items():
            points = []
            for step in study.checkpoints:
                if step == steps and key in result["tasks"]:  # the compare stage's own grid
                    entry = result["tasks"][key]["models"][name]
                    points.append({"step": step, "mean": entry["mean"], "se": entry["se"], "scores": entry["scores"]})
                    clock["done"] += 1
                    continue
                folder = runs[name] / ("final" if step == steps else f"snapshots/step-{step}")
                start = str(fine_tuning_checkpoint(folder, study.size(name)))
                model = Model(f"{name}@{step}", start, start, False, False)
                log(f"curve: curve, {key} with {model.name} ({start})")
                scores = grid_scores(task, model, curve_spaces[key], out / "curve" / key / model.name, storage,
                                     max_len, None, overrides)
                chosen = choose_setting(scores, study.compare["seeds"])
                if chosen is None:
                    raise AblationError(f"curve: {key} with {model.name}: no setting has a score for every seed "
                                        f"(failed trials? see {out / 'curve' / key / model.name}/grid_results.md)")
                per_seed = [100 * scores[chosen][s] for s in study.compare["seeds"]]
                mean, se = mean_se(per_seed)
                points.append({"step": step, "mean": mean, "se": se, "scores": per_seed})
            curve.setdefault(name, {})[key] = points
    return result, curve


def feature_route(study: Study, entry: dict, models: dict, out: Path, data_dirs: list[str], log) -> dict:
    """The feature-based route of Table 8's last column (Table 7's method) for an NER task: each variant's frozen
    last four layers, concatenated, feed a two-layer BiLSTM tagger (as wide as the model) trained once per seed
    and setting; its dev entity F1 is the score. Features in OUT/features/TASK/NAME, taggers beside them."""
    import datasets

    from .compare import Task, build_result, parse_tasks
    from .feature_based import extract_features, train_tagger

    task = parse_tasks([entry["key"]], data_dirs or None, None)[entry["key"]]
    train_file, dev_file = (task.card.splits[s].file for s in (task.card.train_split, task.card.eval_splits[0]))
    rates = entry["learning_rates"] or [1e-3]
    epochs = entry["epochs"] or [4]
    batch = (entry["batch_sizes"] or [32])[0]
    found = {}
    for name, model in models.items():
        log(f"features: feature-based, {entry['key']} with {name}")
        folder = out / "features" / task.card.name / name
        config = json.loads((Path(model.path) / "config.json").read_text())
        layers = ",".join(str(-i) for i in range(1, min(FEATURE_LAYERS, config["num_hidden_layers"]) + 1))
        for split, file in (("train", train_file), ("dev", dev_file)):
            if not (folder / split / "dataset_info.json").is_file():
                extract_features(model.path, Path(task.data_dir) / file, folder / split, task.card, layers, "concat",
                                 disable_tqdm=True)
        train, dev = (datasets.load_from_disk(str(folder / split)) for split in ("train", "dev"))
        if task.labels:
            train = train.select(range(min(task.labels, len(train))))
        scores: dict = {}
        for rate in rates:
            for count in epochs:
                for seed in study.compare["seeds"]:
                    tagger = folder / f"tagger-lr{rate:g}-e{count:g}-seed{seed}"
                    done = tagger / "all_results.json"
                    result = json.loads(done.read_text()) if done.is_file() else train_tagger(
                        train, dev, task.card.labels, tagger, int(count), rate, batch, config["hidden_size"], seed,
                        disable_tqdm=True)
                    scores.setdefault((rate, batch, float(count)), {})[seed] = result["eval_f1"]
        found[name] = scores
    keyed = Task(entry["record_key"], task.card, task.labels, "f1", task.data_dir)
    return build_result(study.compare["baseline"], study.compare["seeds"], models, {keyed.key: keyed},
                        {keyed.key: found})["tasks"][keyed.key]


def contrasts_of(study: Study, result: dict, curve: dict) -> tuple[dict, dict]:
    """The study's questions as paired differences (first minus second, by seed): per compared task, and along
    the curve where both variants have one ({label: {task: {"ahead_from": step or None, "points": [...]}}})."""
    from .report import paired_comparison

    per_task, along = {}, {}
    for c in study.contrasts:
        per_task[c["label"]] = {key: paired_comparison(entry["models"][c["first"]]["scores"],
                                                       entry["models"][c["second"]]["scores"])
                                for key, entry in result["tasks"].items()}
        first, second = curve.get(c["first"], {}), curve.get(c["second"], {})
        for key in [k for k in first if k in second]:  # the curve's order, so a rerun writes the same bytes
            points = [{"step": a["step"], **paired_comparison(a["scores"], b["scores"])}
                      for a, b in zip(first[key], second[key], strict=True)]
            ahead = [p["step"] for i, p in enumerate(points) if all(q["verdict"] == "ahead" for q in points[i:])]
            along.setdefault(c["label"], {})[key] = {"ahead_from": ahead[0] if ahead else None, "points": points}
    return per_task, along


# ------------------------------------------------------------------------------------------- the record


def markdown(record: dict, study: Study, decontamination: dict | None) -> str:
    from .compare import markdown_table
    from .report import md_table

    seeds = record["seeds"]
    lines = [f"# {study.title}", "", f"`{record['command']}`", "", *markdown_table(record), "",
             f"Mean ± standard error over seeds {', '.join(map(str, seeds))} (0-100); in brackets the mean per-seed "
             f"difference from {record['baseline']} ± its SE and the verdict at 2 SE. Each model's setting is the one "
             "with the best mean dev score over the seeds (per-seed scores and settings: ablation.json).", ""]
    tasks = list(record["tasks"])
    if record["contrasts"]:
        rows = [[label, *(f"{d['difference']:+.1f} ± {d['se']:.1f} [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}] "
                          f"{d['verdict']}" for d in (by_task[t] for t in tasks))]
                for label, by_task in record["contrasts"].items()]
        lines += ["## The study's questions, paired by seed", "", *md_table(["question", *tasks], rows), "",
                  "Each cell: first minus second, the mean over the paired seeds ± its SE [95% interval, t with n - 1 "
                  "degrees of freedom], and the verdict at 2 SE.", ""]
    if record["curve"]:
        steps = sorted({p["step"] for by_task in record["curve"].values() for ps in by_task.values() for p in ps})
        rows = [[name, key, *(next((f"{p['mean']:.1f} ± {p['se']:.1f}" for p in points if p["step"] == s), "")
                              for s in steps)]
                for name, by_task in record["curve"].items() for key, points in by_task.items()]
        lines += ["## Fine-tuning score against pre-training steps", "",
                  *md_table(["variant", "task", *(f"{s:,}" for s in steps)], rows), ""]
        for label, by_task in record.get("curve_contrasts", {}).items():
            for key, found in sorted(by_task.items()):
                where = (f"ahead by more than 2 SE from step {found['ahead_from']:,} on" if found["ahead_from"]
                         else f"not ahead by more than 2 SE to the end ({found['points'][-1]['step']:,} steps)")
                diffs = ", ".join(f"{p['step']:,}: {p['difference']:+.1f} ± {p['se']:.1f}" for p in found["points"])
                lines.append(f"- {label}, {key}: {where} ({diffs})")
        lines.append("")
    rows = [[name, f"{f['steps']:,}", f"{f['minutes']:.1f}", f"{f['tokens']:,}", f"{100 * f['held_out_accuracy']:.1f}%",
             f["accuracy_kind"], f"{f['not_next_share']:.3f}", str(f.get("precision"))]
            for name, f in record["pretraining"].items()]
    lines += ["## Pre-training", "", *md_table(["variant", "steps", "minutes", "tokens", "held-out accuracy", "kind",
                                                "NotNext share", "precision"], rows), ""]
    if any(f["accuracy_kind"] == "next_token" for f in record["pretraining"].values()):
        lines += ["MLM accuracy (at masked positions) and next-token accuracy are not comparable: a masked model sees "
                  "both sides of the token it predicts, a left-to-right one only the left.", ""]
    if decontamination:
        lines += [f"Corpus: {decontamination['sentences_removed']:,} of {decontamination['sentences']:,} sentences "
                  f"removed by {decontamination['ngram']}-gram decontamination.", ""]
    if record.get("left_out"):
        lines += [f"Left out (optional tasks with no data in compare.data_dir): {', '.join(record['left_out'])}.", ""]
    if study.notes:
        lines += [study.notes.strip(), ""]
    return "\n".join(lines)


def plot(record: dict, path: Path) -> Path:
    """Bars per task (each variant's mean ± SE) and, with a curve, a panel per curve task: score against
    pre-training steps per variant."""
    from matplotlib.figure import Figure

    from .compare import bars

    curve_tasks = list(dict.fromkeys(key for by_task in record["curve"].values() for key in by_task))
    width = 1.6 + 1.3 * len(record["tasks"]) * max(1, len(record["models"])) / 3
    fig = Figure(figsize=(width + 4.2 * len(curve_tasks), 4.2), layout="constrained")
    grid = fig.add_gridspec(1, 1 + len(curve_tasks), width_ratios=[width] + [4.2] * len(curve_tasks))
    bars(fig.add_subplot(grid[0, 0]), record)
    for i, key in enumerate(curve_tasks, start=1):
        ax = fig.add_subplot(grid[0, i])
        for name, by_task in record["curve"].items():
            if key in by_task:
                points = by_task[key]
                ax.errorbar([p["step"] for p in points], [p["mean"] for p in points],
                            yerr=[p["se"] or 0 for p in points], marker="o", capsize=3, label=name)
        steps = sorted({p["step"] for by_task in record["curve"].values() for p in by_task.get(key, [])})
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(steps, labels=[f"{s:,}" for s in steps])
        ax.set(xlabel="pre-training steps", ylabel="dev score (0-100)", title=f"{key}: score against steps")
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def write_record(record: dict, study: Study, out: Path, decontamination: dict | None, results_dir: Path | None) -> None:
    text = markdown(record, study, decontamination)
    targets = [(out, "ablation")] + ([(results_dir, study.stem)] if results_dir else [])
    for folder, stem in targets:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / f"{stem}.json", json.dumps(record, indent=2) + "\n")
        atomic_write_text(folder / f"{stem}.md", text)
        plot(record, folder / f"{stem}.png")
    print(text)
    print(f"[ablation] wrote {', '.join(str(folder / stem) + '.{json,md,png}' for folder, stem in targets)}")


# ------------------------------------------------------------------------------------------- the command


def run_ablation(path: str | Path, output_dir: str | Path, until: str = "compare", only: list[str] | None = None,
                 workers: int = 1, storage: str | None = None, results_dir: str | Path | None = None,
                 worker: bool = False, command: str = "") -> dict | None:
    """Run (or resume) the study in `output_dir`; returns the record (None when it stops before it)."""
    study = load_study(path)
    for name in only or []:
        if name not in study.variants or study.variants[name].source is not None:
            raise AblationError(f"--variant {name}: not a pre-trained variant of {study.path}; expected one of "
                                f"{', '.join(study.pretrained)}")
    if workers < 1:
        raise AblationError(f"--workers {workers}: expected at least 1")
    out = Path(output_dir).resolve()
    progress = Progress()
    with data_lock(out):
        data_dirs = task_data(study, out, progress)
        corpus, decontamination = build_corpus(study, out, data_dirs, progress)
        vocab = build_vocabulary(study, out, corpus, progress)
        data = build_instances(study, out, corpus, vocab, progress)
        steps = plan_steps(study, out, data, vocab, progress)
    if study.left_out:
        progress.stage("compare", f"left out: {', '.join(study.left_out)} (optional, and no data in compare.data_dir)")
    if worker:  # a --workers helper: the grids only, once the pre-training is done
        runs = {name: out / "pretraining" / name for name in study.pretrained}
        fine_tune(study, out, runs, steps, data_dirs, storage, None)
        return None
    runs = pretrain(study, out, data, vocab, steps, only, progress)
    if only:
        left = [n for n in study.pretrained if finished_steps(runs[n]) is None]
        progress.stage("pretraining", f"{', '.join(only)} done" + (f"; not yet pre-trained: {', '.join(left)}" if left
                                                                    else "; every variant is pre-trained"))
        return None
    facts = pretraining_record(study, runs, data, steps)
    if until == "pretraining":
        return None
    helpers = start_helpers(path, out, workers, storage)
    try:
        result, curve = fine_tune(study, out, runs, steps, data_dirs, storage, progress)
    finally:
        codes = [h.wait() for h in helpers]
    if any(codes):
        raise AblationError(f"a --workers helper failed (exit codes {codes}); see {out / 'logs'}/compare-w*.log")
    contrasts, along = contrasts_of(study, result, curve)
    record = {**result, "pretraining": facts, "contrasts": contrasts, "curve": curve, "curve_contrasts": along,
              "left_out": study.left_out, "ablation": study.raw, "command": command}
    write_record(record, study, out, decontamination if study.decontaminate else None,
                 Path(results_dir) if results_dir else None)
    progress.stage("record", f"done ({out / 'ablation.json'})")
    return record


def start_helpers(path, out: Path, workers: int, storage: str | None) -> list[subprocess.Popen]:
    """workers - 1 helper processes on the same grids, each with its share of the cores (this process keeps
    one share): tiny models use one core better than two, so two workers of one thread finish sooner."""
    if workers == 1:
        return []
    import torch

    threads = max(1, (os.cpu_count() or 2) // workers)
    torch.set_num_threads(threads)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
           "TOKENIZERS_PARALLELISM": "false"}
    cmd = [str(Path(sys.executable).parent / "bert-suite"), "ablation", str(path), "--output_dir", str(out), "--worker",
           *(["--storage", storage] if storage else [])]
    (out / "logs").mkdir(parents=True, exist_ok=True)
    helpers = []
    for k in range(1, workers):
        with open(out / "logs" / f"compare-w{k}.log", "a") as log:
            helpers.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
    return helpers
