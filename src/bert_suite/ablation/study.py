"""The study file read into dataclasses: every section checked as it is read, every error one line naming the
file, the key and what was expected, before anything is written (docs/ablation.md, "The file")."""

from __future__ import annotations

import difflib
import functools
import glob
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..compare import CompareError, DataDir, Task, resolve_task

SECTIONS = {  # key -> its keys (None: free text; pretraining also takes the recipe's keys)
    "base": None, "title": None, "notes": None,
    "corpus": ("files", "task_texts", "task_documents", "decontaminate"),
    "vocabulary": ("vocab_size", "lowercase", "vocab_file"),
    "instances": ("max_seq_length", "dupe_factor", "balance_nsp", "phase2_length", "phase2_fraction"),
    "pretraining": ("steps", "minutes", "checkpoints", "warmup_fraction", "seeds"),
    "variants": (),
    "compare": ("baseline", "seeds", "tasks", "learning_rates", "batch_sizes", "epochs", "max_seq_length", "data_dir"),
    "curve": ("variants", "tasks"),
    "contrasts": (),
}
REQUIRED = ("corpus", "vocabulary", "pretraining", "variants", "compare")
TASK_KEYS = ("task", "metric", "learning_rates", "batch_sizes", "epochs", "feature_based", "optional")
AXES = ("learning_rates", "batch_sizes", "epochs")
DATA = ("corpus", "vocabulary", "instances")  # the sections a variant may carry itself
TASK_DOCUMENTS = ("example", "file")  # corpus.task_documents: one document per task example, or per task file
# recipe keys the study sets itself, from its stages and its `steps`
OWNED = ("train_data", "train_data_phase2", "tokenizer", "output_dir", "max_steps", "phase1_fraction",
         "snapshot_steps", "resume_from_checkpoint")
_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")
_NAME = re.compile(r"[A-Za-z0-9][\w.-]*")


class AblationError(ValueError):
    """A study file or stage that cannot be used; the message names the file, the key and what was expected."""


@dataclass(frozen=True, kw_only=True)
class Corpus:
    files: list[Path]
    task_texts: list[str]  # task names whose train texts join the corpus
    task_documents: str = "example"  # each example of a task text its own document, or each task file one
    decontaminate: bool = True


@dataclass(frozen=True, kw_only=True)
class Vocabulary:
    vocab_size: int | None = None  # a WordPiece vocabulary learned on the corpus...
    lowercase: bool = True
    vocab_file: Path | None = None  # ...or a released vocab.txt, used as is


@dataclass(frozen=True, kw_only=True)
class Instances:
    max_seq_length: int = 128
    dupe_factor: int = 5
    balance_nsp: bool = False
    phase2_length: int | None = None
    phase2_fraction: float = 0.1

    @property
    def lengths(self) -> list[int]:
        """Each phase's length, in order."""
        return [self.max_seq_length] + ([self.phase2_length] if self.phase2_length else [])


@dataclass(frozen=True, kw_only=True)
class Pretraining:
    recipe: dict  # the recipe keys every variant shares
    steps: int | None  # equal steps, or None with `minutes`
    minutes: float | None
    checkpoints: list[int]
    warmup_fraction: float | None
    seeds: list[int] | None = None  # `seeds`: one pre-training per seed (None: the recipe's one `seed`)


@dataclass(kw_only=True)
class Variant:
    name: str
    recipe: dict = field(default_factory=dict)  # the recipe keys in which a pre-trained variant differs
    source: str | None = None  # `from`: a fine-tuning-only variant of this pre-trained one
    seeds: list[int] | None = None  # its own pre-training seeds, where they differ from the study's
    random_init: bool = False
    bilstm: bool = False
    # a pre-trained variant's own data, where it differs from the study's (None: the study's)
    corpus: Corpus | None = None
    vocabulary: Vocabulary | None = None
    instances: Instances | None = None


@dataclass(kw_only=True)
class TaskEntry:
    key: str  # TASK[@LABELS]
    metric: str | None = None  # None: the card's
    learning_rates: list | None = None  # None: compare's axes
    batch_sizes: list | None = None
    epochs: list | None = None
    feature_based: bool = False
    optional: bool = False

    @property
    def record_key(self) -> str:
        return self.key + " (feature-based)" if self.feature_based else self.key


@dataclass(frozen=True, kw_only=True)
class Compare:
    baseline: str
    seeds: list[int]
    learning_rates: list | None
    batch_sizes: list | None
    epochs: list | None
    max_seq_length: int | None
    data_dirs: list[DataDir]


@dataclass(frozen=True, kw_only=True)
class Contrast:
    first: str
    second: str
    label: str


@dataclass(kw_only=True)
class Study:
    path: Path
    raw: dict  # the file as read (its `base` merged in): the record's `ablation`
    title: str
    notes: str
    corpus: Corpus
    vocabulary: Vocabulary
    instances: Instances
    pretraining: Pretraining
    variants: dict[str, Variant]
    compare: Compare
    tasks: list[TaskEntry]  # the tasks that run
    curve_variants: list[str]
    curve_tasks: list[str]
    contrasts: list[Contrast]
    left_out: dict[str, str] = field(default_factory=dict)  # optional tasks without data -> why

    @property
    def pretrained(self) -> list[str]:
        return [name for name, v in self.variants.items() if v.source is None]

    def recipe_of(self, name: str) -> dict:
        """The recipe keys of a pre-trained variant: the shared ones, then its own."""
        return {**self.pretraining.recipe, **self.variants[name].recipe}

    def seeds_of(self, name: str) -> list[int]:
        """The pre-training seeds of a variant (a fine-tuning-only one: its source's): its own `seeds`, the
        study's, or the one `seed` of the recipe (42 where none is given)."""
        from ..pretraining.config import PretrainConfig

        source = self.variants[name].source or name
        return self.variants[source].seeds or self.pretraining.seeds or [
            int(self.recipe_of(source).get("seed", PretrainConfig.seed))]

    def runs(self, names: list[str] | None = None, seeds: list[int] | None = None) -> list[Run]:
        """The pre-trainings of the pre-trained variants (or of `names`; of `seeds` alone where given), seed by
        seed: every variant's first seed, then every variant's second, ... (a whole table at each seed as soon
        as it can be)."""
        chosen = {n: self.seeds_of(n) for n in self.pretrained if names is None or n in names}
        rows = max(map(len, chosen.values()), default=0)
        return [Run(name, own[k], run_name(name, own, own[k])) for k in range(rows) for name, own in chosen.items()
                if k < len(own) and (seeds is None or own[k] in seeds)]

    def data_of(self, name: str) -> tuple[Corpus, Vocabulary, Instances]:
        """The corpus, vocabulary and instances a variant pre-trains on (a fine-tuning-only one: its source's)."""
        variant = self.variants[self.variants[name].source or name]
        return (variant.corpus or self.corpus, variant.vocabulary or self.vocabulary,
                variant.instances or self.instances)

    @property
    def data_variants(self) -> bool:
        """Whether any variant carries data of its own."""
        return any(v.corpus or v.vocabulary or v.instances for v in self.variants.values())

    def size(self, name: str) -> str:
        """The model size preset a pre-trained variant uses."""
        return self.recipe_of(name).get("model_size", "tiny")

    @property
    def stem(self) -> str:
        return self.path.stem


@dataclass(frozen=True)
class Run:
    """One pre-training: a variant at one seed, in OUT/pretraining/NAME (`run_name`)."""
    variant: str
    seed: int
    name: str


def run_name(variant: str, seeds: list[int], seed: int) -> str:
    """The folder (and stage, lock and compare model) name of a variant's run at `seed`: the variant's name for its
    first seed, so a one-seed study's runs stay that seed's when seeds are added, and NAME.seedS for the others."""
    return variant if seed == seeds[0] else f"{variant}.seed{seed}"


def load_study(path: str | Path, run_checks: bool = True) -> Study:
    """Read and check a study file; every path in it is relative to the file that writes it (the study or its
    `base`), after `${VAR}` and `${VAR:-default}` are replaced from the environment. `run_checks=False` leaves
    out the checks that only a run needs and that import torch (the recipe's own validation of each variant, a
    task's train size against its @LABELS): what `--status` reads in a moment."""
    path = Path(path)
    raw, folders = read_with_base(path)
    read = Reader(path, folders, run_checks)
    read.known("", raw, SECTIONS)
    for key in REQUIRED:
        if key not in raw:
            read.bad(key, "missing; a study needs " + ", ".join(REQUIRED))
    corpus = read.corpus(raw["corpus"])
    vocabulary = read.vocabulary(raw["vocabulary"])
    instances = read.instances(raw.get("instances") or {})
    pretraining = read.pretraining(raw["pretraining"])
    variants = read.variants(raw["variants"], pretraining, {k: raw.get(k) or {} for k in DATA})
    compare, tasks, left_out = read.compare(raw["compare"], variants)
    curve_variants, curve_tasks = read.curve(raw.get("curve") or {}, variants, pretraining.checkpoints, compare)
    used = [corpus] * any(v.source is None and v.corpus is None for v in variants.values()) + [
        v.corpus for v in variants.values() if v.corpus is not None]
    for where, used_corpus in [("corpus", corpus)] + [(f"variants.{n}.corpus", v.corpus) for n, v in variants.items()
                                                      if v.corpus is not None]:
        read.task_texts(used_corpus, compare, where)
    if any(c.decontaminate for c in used):
        read.local_data([t.key for t in tasks] + curve_tasks, compare)
    contrasts = [Contrast(first=read.variant(f"contrasts[{i}].first", c["first"], variants),
                          second=read.variant(f"contrasts[{i}].second", c["second"], variants), label=str(c["label"]))
                 for i, c in enumerate(read.listed("contrasts", raw.get("contrasts") or [], dict,
                                                   "{first, second, label}"))
                 if read.known(f"contrasts[{i}]", c, ("first", "second", "label"), required=True)]
    study = Study(path=path, raw=raw, title=str(raw.get("title") or path.stem), notes=str(raw.get("notes") or ""),
                  corpus=corpus, vocabulary=vocabulary, instances=instances,
                  pretraining=pretraining, variants=variants, compare=compare, tasks=tasks,
                  curve_variants=curve_variants, curve_tasks=curve_tasks, contrasts=contrasts, left_out=left_out)
    pairs = [(f"contrasts[{i}]", c.first, c.second) for i, c in enumerate(contrasts)] + [
        ("compare.baseline", name, compare.baseline) for name in variants if name != compare.baseline]
    for where, a, b in pairs:  # the arms pair by pre-training seed
        if not set(study.seeds_of(a)) & set(study.seeds_of(b)):
            read.bad(where, f"{a} is pre-trained with seeds {study.seeds_of(a)}, {b} with {study.seeds_of(b)}: no seed "
                     "in common to pair them by; expected shared pre-training seeds")
    return study


def read_yaml(path: Path, what: str = "the study file") -> dict:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise AblationError(f"{path}: cannot read {what} ({err.strerror})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise AblationError(f"{path}: {where}not YAML ({getattr(err, 'problem', None) or err})") from None
    if not isinstance(raw, dict):
        raise AblationError(f"{path}: expected a mapping of sections (title, corpus, vocabulary, ...), got "
                            f"{type(raw).__name__}")
    return raw


def read_with_base(path: Path, seen: tuple = ()) -> tuple[dict, dict]:
    """The file with its `base: FILE` (relative to it; a base may have its own) merged in: a section the file
    gives replaces the base's, key by key for mappings. The sections keep the place of the `base` key, so a file
    that moved its shared sections to a base reads as it did. Returns (the merged sections, {(section, key):
    the folder of the file that wrote it}), for the paths."""
    raw = read_yaml(path, "the study file" if not seen else "its base")
    folder = path.resolve().parent
    if "base" not in raw:
        return raw, {(section, key): folder for section, value in raw.items()
                     for key in (value if isinstance(value, dict) else [None])}
    base_value = raw["base"]
    if not isinstance(base_value, str):
        raise AblationError(f"{path}: base: expected the path of a study file whose sections this one shares, "
                            f"got {base_value!r}")
    base_path = Path(os.path.normpath(folder / Path(_expand(base_value, path, "base")).expanduser()))
    if base_path.resolve() in seen or base_path.resolve() == path.resolve():
        raise AblationError(f"{path}: base: {base_value} includes itself (a cycle of bases)")
    if not base_path.is_file():
        raise AblationError(f"{path}: base: {base_path} is not a file; expected a study file to share sections with")
    inherited, folders = read_with_base(base_path, (*seen, path.resolve()))
    merged: dict = {}
    for key, value in raw.items():
        if key == "base":  # the base's sections here, each merged with the file's own
            for section, shared in inherited.items():
                own = raw.get(section)
                merged[section] = {**shared, **own} if isinstance(shared, dict) and isinstance(own, dict) else \
                    (own if section in raw else shared)
        elif key not in inherited:
            merged[key] = value
    for section, value in raw.items():
        for key in (value if isinstance(value, dict) else [None]):
            if section != "base":
                folders[(section, key)] = folder
    return merged, folders


def _expand(text: str, path: Path, key: str) -> str:
    def var(match):
        found = os.environ.get(match[1]) or match[2]
        if found is None:
            raise AblationError(f"{path}: {key}: ${{{match[1]}}} is not set; set it, or write ${{{match[1]}:-DEFAULT}}")
        return found
    return _VAR.sub(var, text)


class Reader:
    """A study file's sections, each checked as it is read; every error names the file and the key."""

    def __init__(self, path: Path, folders: dict | None = None, run_checks: bool = True):
        self.path, self.folders, self.run_checks = path, folders or {}, run_checks

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

    def local(self, key: str, value: str, folder: Path | None = None) -> Path:
        """A path of the file: environment variables replaced, relative to the folder of the file that wrote it
        (`folder`, else the one that wrote the section's key)."""
        section, _, name = key.partition(".")
        folder = folder or self.folders.get((section, name or None), self.path.resolve().parent)
        text = _expand(self.kind(key, value, str, "a path"), self.path, key)
        return Path(os.path.normpath(folder / Path(text).expanduser()))

    def variant(self, key: str, name, variants: dict) -> str:
        if name not in variants:
            self.bad(key, f"{name} is not a variant; expected one of {', '.join(variants)}")
        return name

    def corpus(self, section, where: str = "corpus", folders: dict | None = None) -> Corpus:
        """The corpus section (`where`: its key in the file; `folders`: the folder each of its keys is relative
        to, where not the section's own)."""
        section = self.known(where, section, SECTIONS["corpus"])
        files = []
        for pattern in self.listed(f"{where}.files", section.get("files", []), str, "paths or globs"):
            found = sorted(glob.glob(str(self.local(f"{where}.files", pattern, (folders or {}).get("files")))))
            if not found:
                self.bad(f"{where}.files", f"{pattern} matches no file")
            files += [Path(f) for f in found if Path(f).is_file()]
        task_texts = self.listed(f"{where}.task_texts", section.get("task_texts", []), str, "task names")
        if not files and not task_texts:
            self.bad(where, "no text: expected files, task_texts or both")
        grouping = section.get("task_documents", "example")
        if grouping not in TASK_DOCUMENTS:
            self.bad(f"{where}.task_documents", f"expected example (one document per task example) or file (one per "
                     f"task file), got {grouping!r}")
        decontaminate = self.kind(f"{where}.decontaminate", section.get("decontaminate", True), bool, "true or false")
        return Corpus(files=files, task_texts=task_texts, task_documents=grouping, decontaminate=decontaminate)

    def vocabulary(self, section, where: str = "vocabulary", folders: dict | None = None) -> Vocabulary:
        section = self.known(where, section, SECTIONS["vocabulary"])
        vocab_file = section.get("vocab_file")
        if (vocab_file is None) == ("vocab_size" not in section):
            self.bad(where, "expected vocab_size (with lowercase) or vocab_file (a released vocab.txt), one of them")
        if vocab_file is not None:
            vocab_file = self.local(f"{where}.vocab_file", vocab_file, (folders or {}).get("vocab_file"))
            if not vocab_file.is_file():
                self.bad(f"{where}.vocab_file", f"{vocab_file} is not a file; expected a vocab.txt")
        elif self.kind(f"{where}.vocab_size", section["vocab_size"], int, "a whole number") < 6:
            self.bad(f"{where}.vocab_size", f"expected room for the 5 special tokens and some text, got "
                     f"{section['vocab_size']}")
        lowercase = self.kind(f"{where}.lowercase", section.get("lowercase", True), bool, "true or false")
        return Vocabulary(vocab_size=section.get("vocab_size"), lowercase=lowercase, vocab_file=vocab_file)

    def instances(self, section, where: str = "instances", folders: dict | None = None) -> Instances:
        values = {**self.known(where, section, SECTIONS["instances"])}
        for key in ("max_seq_length", "dupe_factor"):
            if key in values and self.kind(f"{where}.{key}", values[key], int, "a positive whole number") < 1:
                self.bad(f"{where}.{key}", f"expected a positive whole number, got {values[key]}")
        if values.get("phase2_length") is not None:
            self.kind(f"{where}.phase2_length", values["phase2_length"], int, "a whole number")
        if "balance_nsp" in values:
            self.kind(f"{where}.balance_nsp", values["balance_nsp"], bool, "true or false")
        share = values.get("phase2_fraction", 0.1)
        if not 0 < self.kind(f"{where}.phase2_fraction", share, (int, float), "a share") < 1:
            self.bad(f"{where}.phase2_fraction", f"expected a share between 0 and 1, got {share}")
        return Instances(**values)

    def data(self, name: str, spec: dict, shared: dict) -> dict:
        """A pre-trained variant's own corpus, vocabulary and instances sections, each read as the study's
        with the variant's keys over the study's (a vocabulary with vocab_size or vocab_file replaces the
        study's whole); a variant's paths are relative to the file that writes the variant."""
        own_folder = self.folders.get(("variants", name), self.path.resolve().parent)
        found = {}
        for section in DATA:
            if section not in spec:
                continue
            where = f"variants.{name}.{section}"
            own = self.kind(where, spec.pop(section), dict, f"a mapping of {section} keys (overrides of the study's)")
            replace = section == "vocabulary" and {"vocab_size", "vocab_file"} & set(own)
            merged = dict(own) if replace else {**shared[section], **own}
            folders = {key: own_folder if key in own else self.folders.get((section, key)) for key in merged}
            found[section] = getattr(self, section)(merged, where, folders)
        return found

    def pretraining(self, section) -> Pretraining:
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
        seeds = self.seeds("pretraining", own, section)
        return Pretraining(recipe=recipe_keys(section, "pretraining", self.bad), steps=steps, minutes=minutes,
                           checkpoints=checkpoints, warmup_fraction=warmup, seeds=seeds)

    def seeds(self, where: str, own: dict, recipe: dict) -> list[int] | None:
        """`seeds` (two or more distinct whole numbers, or one) read from `own`; refused beside the recipe's `seed`."""
        if "seeds" not in own:
            return None
        if "seed" in recipe:
            self.bad(f"{where}.seeds", f"given with {where}.seed; expected seed: S (one pre-training) or seeds: "
                     "[S, ...] (one pre-training per seed), not both")
        seeds = self.listed(f"{where}.seeds", own["seeds"], int, "whole numbers")
        if not seeds or len(set(seeds)) != len(seeds):
            self.bad(f"{where}.seeds", f"expected distinct seeds, one pre-training each, got {own['seeds']}")
        return seeds

    def variants(self, section, pretraining: Pretraining, shared: dict) -> dict[str, Variant]:
        variants: dict[str, Variant] = {}
        for name, spec in self.known("variants", section, section if isinstance(section, dict) else ()).items():
            where = f"variants.{name}"
            if not _NAME.fullmatch(str(name)):
                self.bad(where, "expected a plain name (letters, digits, '_', '-', '.'): it names folders and rows")
            spec = self.kind(where, spec or {}, dict, "a mapping of recipe keys ({} for none), or {from: NAME, "
                             "random_init: true} / {from: NAME, bilstm: true}")
            if "from" in spec:
                self.known(where, spec, ("from", "random_init", "bilstm"))  # its data is its source's
                random_init, bilstm = bool(spec.get("random_init")), bool(spec.get("bilstm"))
                if random_init == bilstm:
                    self.bad(where, "expected one of random_init: true or bilstm: true beside from")
                variants[name] = Variant(name=name, source=str(spec["from"]), random_init=random_init, bilstm=bilstm)
            else:
                spec = dict(spec)
                data = self.data(name, spec, shared)
                seeds = self.seeds(where, spec, spec)
                spec.pop("seeds", None)
                if pretraining.seeds and "seed" in spec:
                    self.bad(f"{where}.seed", "given with pretraining.seeds; expected seeds: [S, ...] for the "
                             "variant's own seeds, not seed")
                variants[name] = Variant(name=name, recipe=recipe_keys(spec, where, self.bad), seeds=seeds, **data)
                if self.run_checks:
                    check_recipe({**pretraining.recipe, **variants[name].recipe}, pretraining.steps, where, self.bad)
        pretrained = [n for n, v in variants.items() if v.source is None]
        if not pretrained:
            self.bad("variants", "none is pre-trained; expected at least one with recipe keys (NAME: {} for the "
                     "shared recipe)")
        for variant in variants.values():
            target = variants.get(variant.source) if variant.source is not None else variant
            if target is None or target.source is not None:
                self.bad(f"variants.{variant.name}.from", f"{variant.source} is "
                         + ("a fine-tuning-only variant" if target else "not a variant")
                         + f"; expected a pre-trained one ({', '.join(pretrained)})")
        if len(variants) < 2:
            self.bad("variants", f"only {', '.join(variants)}; expected at least two to compare")
        return variants

    def compare(self, section, variants: dict) -> tuple[Compare, list[TaskEntry], dict[str, str]]:
        """(the compare section, the tasks that run, the optional tasks left out and why)."""
        section = self.known("compare", section, SECTIONS["compare"])
        if "baseline" not in section:
            self.bad("compare.baseline", "missing; expected the variant every other is compared with")
        self.variant("compare.baseline", section["baseline"], variants)
        seeds = self.listed("compare.seeds", section.get("seeds", [1, 2, 3, 4, 5]), int, "whole numbers")
        if len(seeds) < 2 or len(set(seeds)) != len(seeds):
            self.bad("compare.seeds", f"expected two or more distinct seeds (a standard error needs them), got {seeds}")
        axes = {key: self.listed(f"compare.{key}", section[key], (int, float), "numbers")
                if section.get(key) is not None else None for key in AXES}
        length = section.get("max_seq_length")
        if length is not None and self.kind("compare.max_seq_length", length, int, "a whole number") < 8:
            self.bad("compare.max_seq_length", f"expected at least 8 tokens, got {length}")
        data_dirs = []
        for value in self.listed("compare.data_dir", section.get("data_dir", []), str, "folders (or TASK=FOLDER)"):
            entry = DataDir.parse(value)
            data_dirs.append(DataDir(str(self.local("compare.data_dir", entry.folder)), entry.task))
        compare = Compare(baseline=section["baseline"], seeds=seeds, max_seq_length=length, data_dirs=data_dirs,
                          **axes)
        tasks = []
        for entry in self.listed("compare.tasks", section.get("tasks", []), (str, dict),
                                 "TASK[@LABELS] or {task: ..., ...}"):
            entry = {"task": entry} if isinstance(entry, str) else dict(self.known("compare.tasks[]", entry, TASK_KEYS))
            if "task" not in entry:
                self.bad("compare.tasks[]", f"{entry}: no task; expected task: TASK[@LABELS]")
            key = self.kind("compare.tasks[].task", entry.pop("task"), str, "TASK[@LABELS]")
            for axis in AXES:
                if axis in entry:
                    entry[axis] = self.listed(f"compare.tasks[{key}].{axis}", entry[axis], (int, float), "numbers")
            for flag in ("feature_based", "optional"):
                self.kind(f"compare.tasks[{key}].{flag}", entry.get(flag, False), bool, "true or false")
            tasks.append(TaskEntry(key=key, **entry))
        if not tasks:
            self.bad("compare.tasks", "none; expected TASK[@LABELS] strings or {task, metric, learning_rates, ...} "
                     "mappings")
        left_out = {}
        for task in tasks:
            resolved = self.task(task.key, compare, task.metric, optional=task.optional)
            if resolved is None:
                left_out[task.record_key] = self.missing(task.key, compare)
        tasks = [t for t in tasks if t.record_key not in left_out]
        if not tasks:
            self.bad("compare.tasks", f"every task is optional and has no data ({', '.join(left_out)})")
        tuned = [n for n, v in variants.items() if v.source is not None]
        for task in (t for t in tasks if t.feature_based):
            where = f"compare.tasks[{task.key}].feature_based"
            if self.task(task.key, compare).card.family != "ner":
                self.bad(where, "the feature-based route (Table 7) is for NER tasks")
            if tuned:
                self.bad(where, f"{', '.join(tuned)} fine-tune only; the feature-based route reads frozen "
                         "pre-trained variants")
        return compare, tasks, left_out

    def task(self, key: str, compare: Compare, metric: str | None = None, optional: bool = False) -> Task | None:
        """The task, its data folder found (None for an optional task whose data is not there); its train split
        is read and a label count must fit it."""
        try:
            task = resolve_task(key, compare.data_dirs or None, metric, flag="task")
        except CompareError as err:
            if optional and "no folder for task" in str(err):
                return None
            self.bad("compare", str(err))
        if task.data_dir is not None and not Path(task.data_dir).is_file():  # a file: squad_small's source, split later
            spec = task.card.splits.get(task.card.train_split)
            if spec is not None and spec.file and not (Path(task.data_dir) / spec.file).is_file():
                if optional:
                    return None
                self.bad("compare.data_dir", f"task {key}: {Path(task.data_dir) / spec.file} is not a file; expected "
                         f"{task.card.name}'s train file there")
            if task.labels is not None and self.run_checks:
                size = train_size(task)
                if task.labels > size:
                    self.bad("compare.tasks", f"{key}: {task.labels:,} labels is above {task.card.name}'s train size "
                             f"({size:,} examples); expected at most {size:,}")
        return task

    def missing(self, key: str, compare: Compare) -> str:
        """Why an optional task is left out."""
        try:
            task = resolve_task(key, compare.data_dirs or None, None, flag="task")
        except CompareError:
            return "no folder for it in compare.data_dir"
        return f"no {task.card.splits[task.card.train_split].file} in {task.data_dir}"

    def curve(self, section, variants: dict, checkpoints: list[int], compare: Compare) -> tuple[list, list]:
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
        for key in tasks:
            self.task(key, compare)
        return names, tasks

    def task_texts(self, corpus: Corpus, compare: Compare, where: str = "corpus") -> None:
        """Each task_texts name is a task with its data in compare.data_dir."""
        for name in corpus.task_texts:
            try:
                task = resolve_task(name, compare.data_dirs or None, None, flag="task")
            except CompareError as err:
                self.bad(f"{where}.task_texts", str(err))
            if task.data_dir is None:
                self.bad(f"{where}.task_texts", f"{name}: no compare.data_dir to read its train texts from; expected "
                         "the folder of its files in compare.data_dir")

    def local_data(self, keys: list[str], compare: Compare) -> None:
        """Decontamination reads each compared task's dev and test files: they must be local."""
        for key in dict.fromkeys(keys):
            if self.task(key, compare).data_dir is None:
                self.bad("corpus.decontaminate", f"task {key} has no local data_dir to decontaminate against; "
                         "expected compare.data_dir with its files (or decontaminate: false)")


def train_size(task: Task) -> int:
    """The number of examples in the task's local train split (read as the grid reads it)."""
    return _train_size(task.card.path, task.data_dir)


@functools.cache
def _train_size(card_path: str, data_dir: str) -> int:
    from ..cards import load_card
    from ..runner import adapter_for

    card = load_card(card_path)
    return len(adapter_for(card).load_split(card, card.train_split, data_dir))


def recipe_keys(values: dict, where: str, bad) -> dict:
    """Recipe keys (those of recipes/configs/pretrain/*.yaml) as the recipe's types; unknown ones and the keys
    the study sets itself are errors."""
    from ..pretraining.config import _FIELDS, PretrainConfigError, _coerce

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


def check_recipe(values: dict, steps: int | None, where: str, bad) -> None:
    """The recipe's own checks on a variant's whole config (placeholders for what the stages fill in)."""
    from ..pretraining.config import PretrainConfig, PretrainConfigError, validate

    filled = {"train_data": "-", "tokenizer": "-", "phase1_fraction": 1.0, "max_steps": steps or 10**9,
              "warmup_steps": 0, **values}
    try:
        validate(PretrainConfig(**filled), where)
    except PretrainConfigError as err:
        bad(where, str(err).split(": ", 1)[-1])
