"""The data stages, each in a folder of the study's output: squad_small/, corpus/, vocabulary/, instances/LENGTH/
and, with `pretraining.minutes`, calibration/NAME/ (the steps every variant gets).

A stage runs only from the settings it was made with: before it runs, stages/NAME.json records the exact
arguments its function receives (defaults included) and a fingerprint of every input file it reads from
outside the folder (size and SHA-256); a rerun with any of them different is refused with one line naming the
stage, the setting and both values, because a stage's outputs feed every later one."""

from __future__ import annotations

import hashlib
import inspect
import json
import shutil
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from ..io import atomic_write_text
from .study import AblationError, Corpus, Instances, Study, Vocabulary

NGRAM = 8  # decontamination: a sentence sharing this many consecutive words with evaluation text goes
CALIBRATION_STEPS = 40  # pretraining.minutes: steps of each variant's calibration run
BUDGET_SHARE = 0.85  # pretraining.minutes: the share of the budget planned for steps (the rest: evaluations, saving)
DONOR_POLL = 10  # seconds between looks at a donor run's checkpoint that a run waits for
HASHED = 256 << 20  # inputs up to this size are fingerprinted by content; larger ones by size and time


class Progress:
    """A line per stage: what is done, what remains, and an estimate of the time left."""

    STAGES = ("squad-small", "corpus", "vocabulary", "instances", "pretraining", "compare", "record")

    def stage(self, name: str, text: str) -> None:
        print(f"[ablation] {self.STAGES.index(name) + 1}/{len(self.STAGES)} {name}: {text}", flush=True)

    @staticmethod
    def left(seconds: float | None) -> str:
        if seconds is None:
            return "time left: estimated after the first one"
        hours, rest = divmod(int(seconds), 3600)
        return "about " + (f"{hours}h{rest // 60:02d}m" if hours else f"{max(1, rest // 60)} min") + " left"


# ------------------------------------------------------------------------------------------- the records


def arguments(function, skip: tuple = (), **given) -> dict:
    """The arguments `function` receives from `given`, its defaults filled in (less `skip`): a stage's settings."""
    bound = inspect.signature(function).bind_partial(**given)
    bound.apply_defaults()
    return {k: v for k, v in bound.arguments.items() if k not in skip}


def fingerprint(path: str | Path) -> dict:
    path = Path(path)
    stat = path.stat()
    if stat.st_size > HASHED:
        return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    return {"size": stat.st_size, "sha256": file_digest(path).hexdigest()}


def file_digest(path: Path, digest=None):
    """`digest` (a new SHA-256 by default) updated with the file's bytes, read a MiB at a time."""
    digest = digest or hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest


def _plain(value):
    return json.loads(json.dumps(value, default=str))


def _differences(recorded, wanted, prefix: str = "") -> list[tuple[str, object, object]]:
    """(key, recorded, wanted) for each setting that differs, nested keys joined with '.'."""
    if isinstance(recorded, dict) and isinstance(wanted, dict):
        return [d for key in dict.fromkeys([*recorded, *wanted])
                for d in _differences(recorded.get(key), wanted.get(key), f"{prefix}.{key}".lstrip("."))]
    return [] if recorded == wanted else [(prefix, recorded, wanted)]


def _without(record: dict, keys: tuple[str, ...]) -> dict:
    """`record` (a stage record with its `settings`) without the dotted `keys` in its settings."""
    record = json.loads(json.dumps(record))
    for dotted in keys:
        *path, last = dotted.split(".")
        inner = record.get("settings")
        for part in path:
            inner = inner.get(part) if isinstance(inner, dict) else None
        if isinstance(inner, dict):
            inner.pop(last, None)
    return record


def _shown(value) -> str:
    text = "absent" if value is None else json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 120 else text[:117] + "..."


def check_stage(out: Path, name: str, settings: dict, inputs: list, started: bool, legacy: dict | None = None,
                predated: dict | None = None, unrecorded: tuple[str, ...] = ()) -> None:
    """Record `settings` and the fingerprints of `inputs` in OUT/stages/NAME.json before the stage runs, or
    refuse when a record (or, with none, outputs: `started`) says the stage was made otherwise. `legacy`: the
    settings as records before fingerprints held them; such a record that agrees is brought up to date.
    `predated`: {dotted key: value} settings a record may lack because it predates them, made at that value.
    `unrecorded`: dotted keys an earlier record may hold that records leave out now (they change no output)."""
    marker = out / "stages" / f"{name.replace('/', '-')}.json"
    wanted = {"settings": _plain(settings), "inputs": {str(p): fingerprint(p) for p in dict.fromkeys(map(str, inputs))}}
    recorded = json.loads(marker.read_text()) if marker.is_file() else None
    if recorded is not None:
        recorded = _without(recorded, unrecorded)
    if recorded is not None and "settings" not in recorded:  # the earlier form: the settings alone
        if legacy is None or recorded != _plain(legacy):
            differing = sorted(k for k in {**recorded, **(legacy or {})} if recorded.get(k) != _plain(legacy or {}).get(k))
            raise AblationError(f"{out}: the {name} stage was made with other settings ({', '.join(differing)}; see "
                                f"{marker}); give another --output_dir, or the same settings")
    elif recorded is not None:
        found = [(key, before, now) for key, before, now in _differences(recorded["settings"], wanted["settings"])
                 if not (before is None and key in (predated or {}) and predated[key] == now)]
        if found:
            key, before, now = found[0]
            raise AblationError(f"{out}: the {name} stage was made with other settings: {key} was {_shown(before)}, "
                                f"now {_shown(now)} (see {marker}); give another --output_dir, or the same settings")
        for path, before in recorded["inputs"].items():
            now = wanted["inputs"].get(path)
            if now != before:
                raise AblationError(f"{out}: the {name} stage read {path} as {_shown(before)}, now "
                                    + (f"{_shown(now)}" if now else "it is not among the inputs")
                                    + f" (see {marker}); restore it, or give another --output_dir")
        extra = [p for p in wanted["inputs"] if p not in recorded["inputs"]]
        if extra:
            raise AblationError(f"{out}: the {name} stage was made without {extra[0]} (see {marker}); give another "
                                "--output_dir, or the same inputs")
        return
    elif started:
        raise AblationError(f"{out}: the {name} stage has outputs but no record of its settings ({marker}); give "
                            "another --output_dir")
    marker.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(marker, json.dumps(wanted, indent=2))


# ------------------------------------------------------------------------------------------- the stages


@dataclass
class Data:
    """What one pre-trained variant trains on, from the data stages: the clean corpus files, the vocabulary (a
    folder, or a released vocab.txt), the instances per phase length, and the stages' labels ("" for the study's
    own sections, "@NAME" for data first carried by variant NAME)."""
    corpus: list[Path]
    decontamination: dict
    vocab: Path
    instances: dict[int, Path]
    labels: dict[str, str]

    @property
    def lengths(self) -> list[int]:
        return list(self.instances)


def build_data(study: Study, out: Path, data_dirs: list, progress: Progress,
               only: list[str] | None = None) -> dict[str, Data]:
    """The corpus, vocabulary and instances stages of every pre-trained variant: the study's sections in
    corpus/, vocabulary/ and instances/LENGTH/, a variant's own (when it carries any) in corpus@NAME/,
    vocabulary@NAME/ and instances@NAME/LENGTH/, NAME the first variant with those settings; variants with the
    same settings share the stages. Returns each pre-trained variant's Data; `only` (a --variant run of a study
    whose steps are given): the data of these variants alone (and of the variants that share it), under the
    labels a whole run gives them."""
    labels: dict[tuple, str] = {}

    def label(kind: str, key: tuple, default: tuple, name: str) -> str:
        return "" if key == default else labels.setdefault((kind, *key), f"@{name}")

    def keyed(*sections) -> tuple:
        return tuple(json.dumps(asdict(x), sort_keys=True, default=str) for x in sections)

    defaults = keyed(study.corpus, study.vocabulary, study.instances)
    built: dict[tuple, object] = {}
    found = {}
    tagged = {}  # every variant's labels first, so a --variant run names its stages as the whole run does
    for name in study.pretrained:
        key = keyed(*study.data_of(name))
        tagged[name] = {"corpus": label("corpus", key[:1], defaults[:1], name),
                        "vocabulary": label("vocabulary", key[:2], defaults[:2], name),
                        "instances": label("instances", key, defaults, name)}
    order = [*only, *(n for n in study.pretrained if n not in only)] if only else study.pretrained
    for name in order:
        corpus, vocabulary, instances = study.data_of(name)
        tags = tagged[name]
        if only and name not in only and any((kind, tags[kind]) not in built for kind in tags):
            continue  # a variant with other data than those run: not built here
        if ("corpus", tags["corpus"]) not in built:
            built["corpus", tags["corpus"]] = build_corpus(study, out, corpus, tags["corpus"], data_dirs, progress)
        files, decontamination = built["corpus", tags["corpus"]]
        if ("vocabulary", tags["vocabulary"]) not in built:
            built["vocabulary", tags["vocabulary"]] = build_vocabulary(out, vocabulary, tags["vocabulary"], files,
                                                                       progress)
        vocab = built["vocabulary", tags["vocabulary"]]
        if ("instances", tags["instances"]) not in built:
            built["instances", tags["instances"]] = build_instances(out, instances, vocabulary, tags["instances"],
                                                                    files, vocab, progress)
        found[name] = Data(files, decontamination, vocab, built["instances", tags["instances"]], tags)
    return found


def task_data(study: Study, out: Path, progress: Progress) -> list:
    """compare.data_dir with a squad_small entry that is the official dev-v1.1.json replaced by its split in
    OUT/squad_small (built once)."""
    from ..cards import load_card
    from ..compare import DataDir
    from ..squad_small import build_squad_small

    dirs = []
    for entry in study.compare.data_dirs:
        if entry.task and Path(entry.folder).is_file() and load_card(entry.task).name == "squad_small":
            small = out / "squad_small"
            settings = arguments(build_squad_small, source=entry.folder, output_dir=small)
            check_stage(out, "squad_small", settings, [entry.folder], (small / "split.json").is_file(),
                        legacy={"input": entry.folder})
            if not (small / "split.json").is_file():
                build_squad_small(**settings)
            progress.stage("squad-small", f"done ({small} from {entry.folder})")
            entry = DataDir(str(small), entry.task)
        dirs.append(entry)
    return dirs


def build_corpus(study: Study, out: Path, section: Corpus, tag: str, data_dirs: list,
                 progress: Progress) -> tuple[list[Path], dict]:
    """OUT/corpus{tag}/clean*: the files and the task texts in the lines format (each task example its own
    document, or each task file one with task_documents: file), without the compared tasks' dev and test
    sentences (when decontaminate). Returns the files and the decontamination counts."""
    from ..cards import load_card
    from ..compare import data_dir_for
    from ..pretraining.decontaminate import decontaminate
    from ..task_corpus import write_task_corpus

    corpus = out / f"corpus{tag}"
    against = evaluation_files(study, data_dirs) if section.decontaminate else []
    texts = [arguments(write_task_corpus, card=load_card(t), output_dir=corpus / "tasks",
                       data_dir=data_dir_for(load_card(t), data_dirs)) for t in section.task_texts]
    parts = [arguments(decontaminate, ("log",), inputs=files, against=against, output_dir=folder, ngram=NGRAM, fmt=fmt)
             for folder, files, fmt in ((corpus / "clean", [str(f) for f in section.files], "auto"),
                                        (corpus / "clean_tasks", [str(corpus / "tasks" / f"{t['card'].name}-train.txt")
                                                                  for t in texts], "lines")) if files]
    task_files = [train_file(t["card"], t["data_dir"]) for t in texts]
    settings = {"task_texts": [{**t, "card": t["card"].name} for t in texts], "decontaminate": parts}
    if section.task_documents != "example":  # absent: one document per example, as records made before the key
        settings["task_documents"] = section.task_documents
    check_stage(out, f"corpus{tag}", settings, [*section.files, *task_files, *against],
                any((Path(p["output_dir"]) / "decontamination.json").is_file() for p in parts),
                legacy={"input": [f for p in parts for f in p["inputs"]], "against": against, "ngram": NGRAM})
    for text in texts:
        written = corpus / "tasks" / f"{text['card'].name}-train.txt"
        if not written.is_file():
            write_task_corpus(**text)
            if section.task_documents == "file":  # the examples' lines as one document
                lines = [line for line in written.read_text(encoding="utf-8").splitlines() if line.strip()]
                atomic_write_text(written, "\n".join(lines) + "\n")
    totals = dict.fromkeys(("sentences", "sentences_removed"), 0)
    read_as: Counter = Counter()  # files per format they were read in (a record made before `formats`: none)
    for settings in parts:
        folder = Path(settings["output_dir"])
        if not (folder / "decontamination.json").is_file():
            try:
                decontaminate(**settings, log=lambda _: None)
            except ValueError as err:
                raise AblationError(f"{study.path}: corpus: {err}") from None
        report = json.loads((folder / "decontamination.json").read_text())
        for key in totals:
            totals[key] += report[key]
        read_as.update(report.get("formats", {}).values())
    if totals["sentences"] == totals["sentences_removed"]:
        raise AblationError(f"{study.path}: corpus: empty after decontamination (all {totals['sentences']:,} sentences "
                            "share an 8-word sequence with the compared tasks' dev or test files); expected other text")
    clean = [Path(p["output_dir"]) / Path(f).name for p in parts for f in p["inputs"]]
    formats = f" ({', '.join(f'{n} read as {fmt}' for fmt, n in sorted(read_as.items()))})" if read_as else ""
    progress.stage("corpus", f"{tag[1:] + ': ' if tag else ''}done ({len(clean)} files{formats}; {totals['sentences_removed']:,} of {totals['sentences']:,} "
                   f"sentences removed by {NGRAM}-gram decontamination against {len(against)} evaluation files)")
    return clean, {"ngram": NGRAM, **totals}


def train_file(card, data_dir: str | None) -> Path:
    return Path(data_dir or ".") / card.splits[card.train_split].file


def evaluation_files(study: Study, data_dirs: list) -> list[str]:
    """The dev and test files (every split but train) of each compared and curve task, from its data folder."""
    from ..compare import resolve_task

    found = []
    for key in dict.fromkeys([t.key for t in study.tasks] + study.curve_tasks):
        task = resolve_task(key, data_dirs or None, flag="task")
        for split, spec in task.card.splits.items():
            path = Path(task.data_dir) / (spec.file or "")
            if split != task.card.train_split and spec.file and path.is_file() and str(path) not in found:
                found.append(str(path))
    return found


def build_vocabulary(out: Path, section: Vocabulary, tag: str, corpus: list[Path], progress: Progress) -> Path:
    """OUT/vocabulary{tag}: a WordPiece vocabulary learned on the corpus, or the released vocab_file as is."""
    from ..pretraining.tokenizer import train_tokenizer

    if section.vocab_file is not None:
        progress.stage("vocabulary", f"{tag[1:] + ': ' if tag else ''}{section.vocab_file} as is")
        return section.vocab_file
    folder = out / f"vocabulary{tag}"
    settings = arguments(train_tokenizer, ("num_proc",), files=[str(f) for f in corpus],
                         vocab_size=section.vocab_size, lowercase=section.lowercase, output_dir=str(folder))
    check_stage(out, f"vocabulary{tag}", settings, [], (folder / "vocab.txt").is_file(),
                legacy={"input": corpus, "vocab_size": section.vocab_size, "lowercase": section.lowercase})
    if not (folder / "vocab.txt").is_file():
        train_tokenizer(**settings)  # the pools' cores: the same vocabulary as one process's
    progress.stage("vocabulary", f"{tag[1:] + ': ' if tag else ''}done ({vocab_size(folder):,} pieces)")
    return folder


def vocab_size(vocab: Path) -> int:
    """The number of pieces in a vocabulary folder's (or a released) vocab.txt."""
    path = vocab / "vocab.txt" if vocab.is_dir() else vocab
    with open(path, encoding="utf-8") as handle:
        return sum(1 for _ in handle)


def build_instances(out: Path, section: Instances, vocabulary: Vocabulary, tag: str, corpus: list[Path], vocab: Path,
                    progress: Progress) -> dict[int, Path]:
    """OUT/instances{tag}/LENGTH at max_seq_length (dupe_factor passes) and phase2_length (one pass):
    {length: folder}."""
    from ..pretraining.instances import build_pretraining_dataset
    from ..tokenization import load_pretraining_tokenizer

    lengths = section.lengths
    data = {}
    for length in lengths:
        folder = out / f"instances{tag}" / str(length)
        dupe = section.dupe_factor if length == lengths[0] else 1
        settings = arguments(build_pretraining_dataset, ("num_proc",), files=[str(f) for f in corpus],
                             tokenizer=str(vocab), output_dir=str(folder), max_seq_length=length, dupe_factor=dupe,
                             fmt="lines", balance_nsp=section.balance_nsp)
        inputs = [vocab] if vocab == vocabulary.vocab_file else []
        check_stage(out, f"instances{tag}-{length}", settings, inputs, (folder / "pretrain_data_stats.json").is_file(),
                    legacy={"input": corpus, "tokenizer": vocab, "max_seq_length": length, "dupe_factor": dupe,
                            "balance_nsp": section.balance_nsp})
        if not (folder / "pretrain_data_stats.json").is_file():
            build_pretraining_dataset(**{**settings, "tokenizer": load_pretraining_tokenizer(str(vocab))})
        data[length] = folder
        stats = data_stats(folder)
        progress.stage("instances", f"{tag[1:] + ': ' if tag else ''}{length} tokens done ({stats['instances']:,} instances, NotNext share "
                       f"{stats['not_next_share']:.3f})")
    return data


def data_stats(folder: Path) -> dict:
    return json.loads((folder / "pretrain_data_stats.json").read_text())


def plan_steps(study: Study, out: Path, data: dict[str, Data], progress: Progress) -> int:
    """pretraining.steps, or with pretraining.minutes the steps the slowest variant fits in them: each variant
    runs CALIBRATION_STEPS steps (half in each phase) and its last logged window gives seconds per step."""
    from .launch import config_value, launch_recipe, recipe_overrides

    if study.pretraining.steps is not None:
        return study.pretraining.steps
    per_step = {}
    for name in study.pretrained:
        instances = study.data_of(name)[2]
        phase2 = bool(instances.phase2_length)
        folder = out / "calibration" / name
        result = folder / "calibration.json"
        overrides = recipe_overrides(study, name, data[name], folder / "run", CALIBRATION_STEPS,
                                     logging_steps=CALIBRATION_STEPS // (4 if phase2 else 2),
                                     eval_steps=CALIBRATION_STEPS, save_steps=CALIBRATION_STEPS, eval_batches=1,
                                     resume_from_checkpoint="null", snapshot_steps="[]",
                                     **({"phase1_fraction": 0.5} if phase2 else {}))
        check_stage(out, f"calibration/{name}", {"recipe": overrides}, [], result.is_file(),
                    legacy={"overrides": [f"{k}={v}" for k, v in overrides.items()]})
        if not result.is_file():
            seconds = launch_recipe(overrides, folder / "calibration.log")
            logs = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
            measured = {}
            for phase, length in enumerate(data[name].instances, start=1):
                windows = [log for log in logs if log["phase"] == phase]
                batch = config_value(overrides, "per_device_train_batch_size" if phase == 1 else
                                     "per_device_train_batch_size_phase2") or config_value(overrides,
                                                                                           "per_device_train_batch_size")
                if windows:
                    measured[phase] = batch * data_stats(data[name].instances[length])["mean_instance_length"] / windows[-1][
                        "tokens_per_second"]
            atomic_write_text(result, json.dumps({"seconds_per_step": measured, "wall_seconds": seconds}, indent=2))
        measured = {int(k): v for k, v in json.loads(result.read_text())["seconds_per_step"].items()}
        share2 = instances.phase2_fraction if 2 in measured else 0.0
        per_step[name] = (1 - share2) * measured[1] + share2 * measured.get(2, measured[1])
    slowest = max(per_step, key=per_step.get)
    steps = max(1, int(study.pretraining.minutes * 60 * BUDGET_SHARE / per_step[slowest]))
    late = [s for s in study.pretraining.checkpoints if s > steps]
    if late:
        raise AblationError(f"{study.path}: pretraining.checkpoints: step {late[0]} is beyond the {steps:,} steps "
                            f"that {study.pretraining.minutes:g} minutes give; expected steps up to {steps:,}")
    progress.stage("pretraining", f"{steps:,} steps for every variant in {study.pretraining.minutes:g} minutes "
                   f"({slowest} is the slowest: {per_step[slowest]:.3f} s a step)")
    return steps


# ------------------------------------------------------------------------------------------- pre-training


def donor_checkpoint(donor: Path, step: int) -> Path | None:
    """The donor run's (`donor`: its folder) complete checkpoint at `step`, which a biphasic run starts from; None
    when it is not written (yet, or the donor passed that step without keeping it)."""
    checkpoint = donor / "checkpoints" / f"step-{step}"
    return checkpoint if (checkpoint / "progress.json").is_file() else None


def missing_snapshots(donor: Path, steps: list[int]) -> list[int]:
    """The steps of `steps` at which the donor run (`donor`: its folder) has no snapshot for a run starting from
    its checkpoint to copy."""
    return [s for s in steps if not (donor / "snapshots" / f"step-{s}" / "config.json").is_file()]


def reused_start(name: str, donor: str, step: int, runs: dict[str, Path], overrides: dict,
                 progress: Progress) -> Path | None:
    """The donor's checkpoint at `step` for variant `name` to start from, with the donor's snapshots of the
    steps up to it copied as `name`'s (the same weights); None (the variant trains them itself) when the donor
    has no such checkpoint yet or lacks one of those snapshots."""
    from ..pretraining.config import load_pretrain_config

    checkpoint = donor_checkpoint(runs[donor], step)
    wanted = [s for s in load_pretrain_config(None, [f"{k}={v}" for k, v in overrides.items()]).snapshot_steps
              if s <= step]
    missing = missing_snapshots(runs[donor], wanted)
    if checkpoint is None or missing:
        why = f"no complete checkpoint at step {step:,}" if not missing else f"no snapshot at step {missing[0]:,}"
        progress.stage("pretraining", f"{name}: its first {step:,} steps are {donor}'s, but {donor} has {why} (not "
                       f"there yet, or {donor} passed that step before the study had {name}): trained here")
        return None
    for s in wanted:
        target = runs[name] / "snapshots" / f"step-{s}"
        if not target.is_dir():
            shutil.copytree(runs[donor] / "snapshots" / f"step-{s}", target.with_name(target.name + ".copying"),
                            dirs_exist_ok=True)
            target.with_name(target.name + ".copying").rename(target)
    progress.stage("pretraining", f"{name}: its first {step:,} steps are {donor}'s (the same computation): starting "
                   f"from {donor}'s checkpoint at step {step:,}")
    return checkpoint


def measured_pace(runs: dict, paths: dict[str, Path]) -> dict[str, list[float]]:
    """{variant: [seconds, steps]} of the finished runs (`runs`: {name: Study run}) trained here: every launch's wall
    time in timing.json over the steps the run trained itself (less another run's steps it started from). A run
    pre-trained on another machine (its launches name a `device`) is left out; so is any record that does not read."""
    seen: dict[str, list[float]] = {}
    for name, run in runs.items():
        try:
            results = json.loads((paths[name] / "pretrain_results.json").read_text())
            launches = json.loads((paths[name] / "timing.json").read_text())
            trained = results["step"] - results.get("started_from", {}).get("step", 0)
            seconds = sum(float(launch["seconds"]) for launch in launches)
            if any("device" in launch for launch in launches) or trained <= 0 or \
                    not (paths[name] / "final" / "config.json").is_file():
                continue
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        total = seen.setdefault(run.variant, [0.0, 0])
        total[0], total[1] = total[0] + seconds, total[1] + trained
    return seen


def resume_step(run: Path, start: int) -> int:
    """The step an unfinished run goes on from: its last complete checkpoint's, else `start` (its donor's step,
    where it starts from another run's checkpoint; 0 otherwise)."""
    from ..pretraining.checkpoints import complete_checkpoints

    found = complete_checkpoints(run / "checkpoints")
    return int(found[-1].name.split("-")[1]) if found else start


def seconds_left(runs: list[tuple[str, int]], pace: dict[str, list[float]]) -> float | None:
    """The seconds `runs` ([(variant, steps left)]) still need, each at its variant's pace (`pace`: {variant:
    [seconds, steps]} timed so far), a variant not timed yet at the mean pace of those that are; None before any
    is."""
    rates = {variant: seconds / steps for variant, (seconds, steps) in pace.items() if steps > 0}
    if not rates:
        return None
    mean = statistics.fmean(rates.values())
    return sum(left * rates.get(variant, mean) for variant, left in runs)


def finished_steps(run: Path) -> int | None:
    results = run / "pretrain_results.json"
    if results.is_file() and (run / "final" / "config.json").is_file():
        return json.loads(results.read_text())["step"]
    return None


def minutes_of(run: Path) -> float:
    timing = run / "timing.json"
    return sum(t["seconds"] for t in json.loads(timing.read_text())) / 60 if timing.is_file() else 0.0


# recipe keys that change no weight (which checkpoints are written and kept, where a run starts from another's own
# steps; a resumed run is the same run): left out of a pre-training stage's record, so a study that gains or loses a
# reuse, or checkpoints more often, resumes its runs
UNRECORDED = ("keep_checkpoints", "start_from_checkpoint", "save_steps")
# the keys in which a run with a left-to-right first phase may differ from the left-to-right run it starts from
OBJECTIVE_KEYS = ("output_dir", "snapshot_steps", "causal_attention", "use_nsp", "causal_fraction", "causal_steps",
                  *UNRECORDED)


def check_pretraining(out: Path, name: str, overrides: dict, started: bool) -> None:
    """check_stage for run `name`'s pre-training (the study's, or a run installed from another machine): its
    recipe keys without the UNRECORDED ones, accepting a record that holds them or names no seed."""
    from ..pretraining.config import PretrainConfig

    recorded = {k: v for k, v in overrides.items() if k not in UNRECORDED}
    check_stage(out, f"pretraining/{name}", {"recipe": recorded}, [], started,
                legacy={"overrides": [f"{k}={v}" for k, v in recorded.items()]},
                predated={"recipe.seed": PretrainConfig.seed},  # a one-seed study's run that named no seed
                unrecorded=tuple(f"recipe.{k}" for k in UNRECORDED))


def reused_starts(study: Study, steps: int) -> dict[str, tuple[str, int]]:
    """{variant: (donor, step)} for each pre-trained variant whose first `step` steps are the same computation as
    a left-to-right variant's: an objective schedule, causal first, switching at `step`, with the donor's data
    and every other recipe key the donor's. It starts from the donor's checkpoint at that step (issue 51: Table
    5's biphasic row from ltr's step 10,000), which the donor keeps (`keep_checkpoints`)."""
    from ..pretraining.config import load_pretrain_config

    def config(name):  # the recipe's reading of the variant's keys (defaults, the switch step)
        keys = {"warmup_steps": 0, "phase1_fraction": 1, **study.recipe_of(name), "train_data": "-", "tokenizer": "-",
                "max_steps": steps}
        return load_pretrain_config(None, [f"{k}={v}" for k, v in keys.items()])

    def rest(name):
        return ({k: v for k, v in study.recipe_of(name).items() if k not in OBJECTIVE_KEYS}, study.data_of(name))

    configs = {name: config(name) for name in study.pretrained}
    found = {}
    for name, cfg in configs.items():
        if not cfg.causal_until or cfg.init_from:
            continue
        for donor, other in configs.items():
            if donor != name and other.causal_attention and not other.causal_until and rest(donor) == rest(name):
                found[name] = (donor, cfg.causal_until)
                break
    return found


def run_starts(study: Study, steps: int) -> dict[str, tuple[str, int]]:
    """`reused_starts` per run: {run name: (the donor's run at the same seed, step)}; a seed the donor does not
    pre-train has no start (the run trains those steps itself)."""
    found = {}
    for run in study.runs():
        if run.variant in (starts := reused_starts(study, steps)):
            donor, step = starts[run.variant]
            donor_run = next((r for r in study.runs([donor]) if r.seed == run.seed), None)
            if donor_run is not None:
                found[run.name] = (donor_run.name, step)
    return found


def data_starts(study: Study, steps: int, data: dict[str, Data]) -> dict[str, tuple[str, int]]:
    """`run_starts` of the runs whose variant and donor have their data among `data` (a --variant run builds
    its variants' data and that of the variants sharing it)."""
    every = {run.name: run for run in study.runs()}
    return {name: start for name, start in run_starts(study, steps).items()
            if all(every[r].variant in data for r in (name, start[0]))}


def run_overrides(study: Study, run, data: dict[str, Data], path: Path, steps: int,
                  starts: dict[str, tuple[str, int]]) -> dict:
    """The recipe's keys for one run (`Study.runs`' run, at `path`), with what it keeps for the runs that start
    from its checkpoint (`starts`: `data_starts`): that checkpoint (`keep_checkpoints`) and, where such a run is
    on the curve, its snapshots of the steps before it, which that run copies (`snapshot_steps`; else it would
    train those steps again). The pre-training stage and a run installed from another machine (its stage
    record) both take them from here."""
    from .launch import config_value, recipe_overrides

    overrides = recipe_overrides(study, run.variant, data[run.variant], path, steps, seed=run.seed)
    every = {r.name: r for r in study.runs()}
    kept = sorted(step for donor, step in starts.values() if donor == run.name)
    if kept:
        overrides["keep_checkpoints"] = ",".join(map(str, kept))
    copied = {s for name, (donor, step) in starts.items() if donor == run.name
              and every[name].variant in study.curve_variants
              for s in study.pretraining.checkpoints if s <= step and s < steps}
    if copied and copied - set(own := config_value(overrides, "snapshot_steps")):
        overrides["snapshot_steps"] = ",".join(map(str, sorted(set(own) | copied)))
    return overrides


def passed_over(out: Path, name: str, starts: dict[str, tuple[str, int]]) -> bool:
    """Whether a run that does not wait (`pretrain`'s `pass_held`) leaves the unfinished run `name` for now:
    another process pre-trains it, or it starts from the checkpoint of a run another process pre-trains
    (`starts`: `run_starts`) that is not written yet (taken now, it would train those steps again)."""
    from ..pretraining.checkpoints import complete_checkpoints
    from .locks import held_elsewhere, variant_lock_path

    run = out / "pretraining" / name
    if finished_steps(run) is not None:
        return False
    if held_elsewhere(variant_lock_path(out, name)):
        return True
    if name not in starts or complete_checkpoints(run / "checkpoints"):  # none, or it has begun its own steps
        return False
    donor, step = starts[name]
    return (held_elsewhere(variant_lock_path(out, donor))
            and donor_checkpoint(out / "pretraining" / donor, step) is None)


def pretrain(study: Study, out: Path, data: dict[str, Data], steps: int, only: list[str] | None,
             progress: Progress, pass_held: bool = False, seeds: list[int] | None = None) -> list[str]:
    """Run (or resume) the recipe for each pre-training (`Study.runs`: every pre-trained variant at each of its
    seeds; `only`, `seeds`: these), one after another, each under its lock: a run another process is training
    is waited for, then found done; with `pass_held`, it is passed over instead (`passed_over`). Returns the runs
    passed over."""
    from .launch import launch_recipe
    from .locks import held_elsewhere, variant_lock, variant_lock_path

    chosen = {run.name: run for run in study.runs(only, seeds)}
    every = {run.name: run for run in study.runs()}
    paths = {name: out / "pretraining" / name for name in every}
    starts = data_starts(study, steps, data)
    held = [name for name in chosen if pass_held and passed_over(out, name, starts)]
    todo = [name for name in chosen if name not in held]
    pace = measured_pace(every, paths)  # {variant: [seconds, steps]}: the finished runs', then this process's too
    for number in range(len(todo)):
        # the next run in order that waits for nobody: a run whose donor another process trains, its checkpoint at
        # the switch not written yet, would train those steps again, and one another process trains is held
        left = todo[number:]
        name = next((n for n in left if not passed_over(out, n, starts)), left[0])
        todo.remove(name)
        todo.insert(number, name)
        if name in starts and passed_over(out, name, starts) and not held_elsewhere(variant_lock_path(out, name)):
            donor, step = starts[name]
            progress.stage("pretraining", f"{name}: waiting for {donor}'s checkpoint at step {step:,} (another "
                           "process trains it): its first steps are that run's")
            while passed_over(out, name, starts):
                time.sleep(DONOR_POLL)
        run = paths[name]
        overrides = run_overrides(study, chosen[name], data, run, steps, starts)
        with variant_lock(out, name):
            check_pretraining(out, name, overrides, run.is_dir() and any(run.iterdir()))
            done = finished_steps(run)
            if done is not None and done != steps:
                raise AblationError(f"{run} holds a finished run of {done:,} steps, not {steps:,}; give another "
                                    "--output_dir")
            if done is None:
                first = resume_step(run, 0)  # where the recipe resumes (0: no checkpoint of its own)
                if name in starts and not first:  # (again, if it was stopped before its own first checkpoint)
                    start = reused_start(name, *starts[name], paths, overrides, progress)
                    if start is not None:
                        overrides["start_from_checkpoint"], first = start, starts[name][1]
                try:  # an estimate: a record that does not read leaves it out, never stops the study
                    left = [(chosen[name].variant, steps - first)] + [
                        (chosen[n].variant, 0 if finished_steps(paths[n]) is not None else
                         steps - resume_step(paths[n], starts.get(n, ("", 0))[1])) for n in todo[number + 1:]]
                    estimate = seconds_left(left, pace)
                except (OSError, ValueError, KeyError, TypeError):
                    estimate = None
                progress.stage("pretraining", f"{name} ({number + 1} of {len(todo)}: {', '.join(todo[number:])} to go; "
                               f"{steps:,} steps each{f', this one from step {first:,}' if first else ''}); "
                               + progress.left(estimate))
                seconds = launch_recipe(overrides, out / "logs" / f"pretraining-{name}.log", run / "timing.json",
                                        first_step=first)
                total = pace.setdefault(chosen[name].variant, [0.0, 0])
                total[0], total[1] = total[0] + seconds, total[1] + max(steps - first, 1)
        progress.stage("pretraining", f"{name} done ({steps:,} steps, {minutes_of(run):.1f} minutes)")
    return held
