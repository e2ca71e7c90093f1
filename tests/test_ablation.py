"""`bert-suite ablation`: the shipped studies end to end at smoke size, a run killed in pre-training and again
in fine-tuning that resumes to the same record, and the file's bad input, each refused before anything is
written."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from bert_suite.ablation import AblationError, load_study
from bert_suite_cli import main
from helpers import REPO, smoke_study, write_ablation_data

SHIPPED = REPO / "recipes" / "ablations"
RECORD_KEYS = {"baseline", "seeds", "models", "tasks", "pretraining", "contrasts", "curve", "curve_contrasts",
               "ablation", "command"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_ablation_data(tmp_path_factory.mktemp("ablation-data"))


@pytest.fixture
def shared(data, monkeypatch):
    monkeypatch.setenv("BERT_SUITE_DATA", str(data))
    return data


def run(*args: str) -> int:
    return main(["ablation", *map(str, args)])


def check_record(record: dict, study: Path) -> None:
    """The issue's shape: compare.json's keys plus pretraining, contrasts, curve, ablation and command."""
    raw = yaml.safe_load(study.read_text())
    assert RECORD_KEYS <= set(record)
    assert list(record["models"]) == list(raw["variants"])
    assert record["ablation"] == raw
    pre = [name for name, spec in raw["variants"].items() if "from" not in (spec or {})]
    assert list(record["pretraining"]) == pre
    for facts in record["pretraining"].values():
        assert {"steps", "minutes", "tokens", "held_out_accuracy", "accuracy_kind", "not_next_share"} <= set(facts)
        assert facts["steps"] == raw["pretraining"]["steps"] and facts["tokens"] > 0
    for label in (c["label"] for c in raw.get("contrasts", [])):
        assert set(record["contrasts"][label]) == set(record["tasks"])
        for d in record["contrasts"][label].values():
            assert {"difference", "se", "ci95", "df", "scope", "verdict"} <= set(d)
            assert d["scope"] == ("recipes" if len(raw["pretraining"].get("seeds", [])) > 1 else "checkpoints")
    for name in raw.get("curve", {}).get("variants", []):
        for points in record["curve"][name].values():
            assert [p["step"] for p in points] == raw["pretraining"]["checkpoints"]
            assert all(len(v) == len(raw["compare"]["seeds"]) for p in points for v in p["pretraining_scores"].values())


@pytest.mark.slow  # five variants, three pre-trainings, 14 grids: the other end-to-end tests cover its stages
def test_table5_end_to_end_at_smoke_size(shared, tmp_path, report):
    study = smoke_study(SHIPPED / "table5.yaml", tmp_path)
    out, results = tmp_path / "out", tmp_path / "results"
    assert run(study, "--output_dir", out, "--results_dir", results) == 0
    record = json.loads((out / "ablation.json").read_text())
    check_record(record, study)
    assert_status_done(study, out)
    assert record["pretraining"]["ltr"]["accuracy_kind"] == "next_token"
    assert record["pretraining"]["mlm_nsp"]["accuracy_kind"] == "mlm"
    assert record["models"]["random"]["random_init"] and record["models"]["ltr_bilstm"]["bilstm"]
    # the curve's last point is the compare stage's own grid when the task is compared, else the final checkpoint's
    assert set(record["curve"]) == {"mlm_nsp", "ltr", "ltr_then_mlm_nsp"}
    # the biphasic run starts from ltr's checkpoint at its switch: its curve points up to there are ltr's grids
    switch = yaml.safe_load(study.read_text())["pretraining"]["steps"] // 2
    early = [p for points in record["curve"]["ltr_then_mlm_nsp"].values() for p in points if p["step"] <= switch]
    assert early and all(p["from"] == "ltr" for p in early)
    assert (out / "pretraining" / "mlm_nsp" / "snapshots" / "step-4" / "config.json").is_file()
    assert not (out / "pretraining" / "mlm" / "snapshots").exists()  # not a curve variant: no snapshots
    decontaminated = json.loads((out / "corpus" / "clean" / "decontamination.json").read_text())
    assert decontaminated["sentences_removed"] >= 1  # the planted dev sentence
    for suffix in ("json", "md", "png"):
        assert (results / f"table5.{suffix}").is_file() and (out / f"ablation.{suffix}").is_file()
    assert json.loads((results / "table5.json").read_text()) == record
    md = (out / "ablation.md").read_text()
    assert "what NSP adds" in md and "Fine-tuning score against pre-training steps" in md
    # a second run is all skips: the same record
    assert run(study, "--output_dir", out) == 0
    assert json.loads((out / "ablation.json").read_text())["tasks"] == record["tasks"]


def assert_status_done(study: Path, out: Path) -> None:
    """`--status` of a finished study: every run done, every grid it counts done and found (none missed), the
    record written."""
    from bert_suite.ablation.status import expected_starts, grid_folders, study_status

    status = study_status(study, out)
    assert {r["state"] for r in status["runs"]} == {"done"} and status["record"]
    for kind, grids in status["grids"].items():
        assert grids["done"] == grids["grids"] and not grids["under_way"], (kind, grids)
    made = {p.parent for p in out.glob("c*/*/*/best_trial.json")} | {p for p in out.glob("features/*/*") if p.is_dir()}
    loaded = load_study(study)
    paths = {r.name: out / "pretraining" / r.name for r in loaded.runs()}
    counted = [f for folders in grid_folders(loaded, out, status["steps"], expected_starts(
        loaded, out, status["steps"], paths)).values() for f in folders]
    assert made and sorted(counted) == sorted(made)  # the very folders, each once


def small_study(folder: Path, data: Path, **changes) -> Path:
    """A study of one pre-training and its random twin on the RTE-like task, with a curve: the least that runs
    every stage. `changes`: top-level sections replaced or updated (a None value drops the key)."""
    study = {
        "corpus": {"files": [str(data / "corpus" / "gutenberg" / "*.txt"), str(data / "corpus" / "nltk" / "brown.txt")],
                   "task_texts": ["rte"], "decontaminate": True},
        "vocabulary": {"vocab_size": 60, "lowercase": True},
        "instances": {"max_seq_length": 32, "dupe_factor": 2},
        "pretraining": {"steps": 6, "checkpoints": [3, 6], "model_size": "tiny", "per_device_train_batch_size": 8,
                        "max_predictions_per_seq": 6, "eval_batches": 1, "learning_rate": 3e-3},
        "variants": {"pre": {}, "random": {"from": "pre", "random_init": True}},
        "compare": {"baseline": "pre", "seeds": [1, 2], "tasks": ["rte"], "learning_rates": [3e-3], "epochs": [3],
                    "batch_sizes": [16], "data_dir": [str(data / "glue")]},
        "curve": {"variants": ["pre"], "tasks": ["rte"]},
        "contrasts": [{"first": "pre", "second": "random", "label": "what pre-training adds"}],
    }
    for key, value in changes.items():
        if value is None:
            study.pop(key)
        elif isinstance(value, dict) and isinstance(study.get(key), dict):
            study[key] = {k: v for k, v in {**study[key], **value}.items() if v is not None}
        else:
            study[key] = value
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def cli(*args, failpoint: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("BERT_SUITE_FAILPOINT", None)
    if failpoint:
        env["BERT_SUITE_FAILPOINT"] = failpoint
    return subprocess.run([str(Path(sys.executable).parent / "bert-suite"), "ablation", *map(str, args)], env=env,
                          capture_output=True, text=True)


def without_timing(record: dict, out: Path) -> dict:
    """The record with its wall times and command left out and its output folder named OUT (two runs in two
    folders, with other flags)."""
    record = json.loads(json.dumps(record).replace(str(out), "OUT"))
    for facts in record["pretraining"].values():
        facts.pop("minutes")
    assert record.pop("command").startswith("bert-suite ablation ")
    return record


def descendants(pid: int) -> list[int]:
    """Every process below `pid` now (from /proc: each process's parent)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        children = [child for child, parent in parents.items() if parent == current]
        found += children
        todo += children
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def wait_for(path: Path, text: str, process: subprocess.Popen, seconds: float = 180) -> None:

    deadline = time.monotonic() + seconds
    while not (path.is_file() and text in path.read_text(errors="replace")):
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no {text!r} in {path} after {seconds} s"
        time.sleep(0.2)


def test_a_study_stopped_in_pretraining_and_killed_in_fine_tuning_resumes_to_the_same_record(data, tmp_path, report):
    import signal

    study = small_study(tmp_path, data)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    # the uninterrupted run by an interpreter with no scripts beside it (`python -m bert_suite`): it launches the
    # recipe and its helper as modules; two processes share the grids: the same scores
    python, env = scriptless_python(tmp_path / "python")
    done = subprocess.run([python, "-m", "bert_suite", "ablation", str(study), "--output_dir", str(whole), "--workers",
                           "2"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (whole / "logs" / "compare-w1.log").is_file()
    assert_status_done(study, whole)
    assert " -m accelerate.commands.launch " in (whole / "logs" / "pretraining-pre.log").read_text()
    # SIGTERM while the recipe runs (it hangs after step 3's checkpoint): the study stops everything it started
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BERT_SUITE_FAILPOINT": "pretrain.step:4:hang"}
    study_process = subprocess.Popen([str(Path(sys.executable).parent / "bert-suite"), "ablation", str(study),
                                      "--output_dir", str(killed)], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
    wait_for(killed / "logs" / "pretraining-pre.log", "hanging until killed", study_process)
    tree = descendants(study_process.pid)
    assert len(tree) >= 2  # accelerate launch and the recipe
    study_process.send_signal(signal.SIGTERM)
    _, err = study_process.communicate(timeout=120)
    assert study_process.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "stopped by SIGTERM; rerun `bert-suite ablation" in err
    # the recipe's group is waited for; multiprocessing's helpers of the data stages' pools (forkserver,
    # resource tracker) end on their own once their parent is gone: a moment, more on a loaded machine
    deadline = time.monotonic() + 30
    while [pid for pid in tree if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {pid: command_of(pid) for pid in tree if alive(pid)}
    assert left == {}, left
    timing = json.loads((killed / "pretraining" / "pre" / "timing.json").read_text())
    assert len(timing) == 1 and timing[0]["stopped"] and timing[0]["seconds"] > 0 and "finished" in timing[0]
    assert not (killed / "pretraining" / "pre" / "final").exists()
    second = cli(study, "--output_dir", killed, failpoint="grid.trial_trained:2")  # this process dies in a grid
    assert second.returncode == -9, second.stderr[-3000:]
    log = (killed / "logs" / "pretraining-pre.log").read_text()
    assert "resumed from" in log
    assert len([line for line in log.splitlines() if line.startswith("$ ")]) == 2  # each launch on a line of its own
    assert not (killed / "ablation.json").exists()
    third = cli(study, "--output_dir", killed)
    assert third.returncode == 0, third.stderr[-3000:]
    record = json.loads((whole / "ablation.json").read_text())
    assert without_timing(json.loads((killed / "ablation.json").read_text()), killed) == without_timing(record, whole)
    # the stopped launch's time counts beside the resumed one's
    timing = json.loads((killed / "pretraining" / "pre" / "timing.json").read_text())
    assert len(timing) == 2 and all(entry["seconds"] > 0 and "finished" in entry for entry in timing)
    minutes = json.loads((killed / "ablation.json").read_text())["pretraining"]["pre"]["minutes"]
    assert minutes == pytest.approx(sum(entry["seconds"] for entry in timing) / 60, abs=0.006)  # rounded to 0.01
    # the task is learnable: the pre-trained tiny model beats chance (50%) on the dev set
    scores = record["tasks"]["rte"]["models"]["pre"]["scores"]
    report("ablation: RTE-like dev accuracy of the 6-step model (seeds 1, 2)", scores)
    assert min(scores) > 60
    assert [p["step"] for p in record["curve"]["pre"]["rte"]] == [3, 6]
    assert record["curve"]["pre"]["rte"][-1]["scores"] == scores  # the last point is the compare stage's grid


BAD = [  # (changes to small_study, what the one line must say)
    ({"varaints": {}}, "varaints: unknown key; did you mean variants?"),
    ({"variants": {"pre": {"lerning_rate": 1e-3}}}, "variants.pre.lerning_rate: unknown recipe key; did you mean "
                                                    "learning_rate?"),
    ({"variants": {"pre": {"use_nsp": "maybe"}}}, "variants.pre.use_nsp: use_nsp must be bool"),
    ({"variants": {"pre": {"output_dir": "x"}}}, "variants.pre.output_dir: set by the study"),
    ({"variants": {"random": {"from": "nothing", "random_init": True}}}, "variants.random.from: nothing is not a variant"),
    ({"variants": {"lstm": {"from": "random", "bilstm": True}}}, "variants.lstm.from: random is a fine-tuning-only "
                                                                 "variant; expected a pre-trained one (pre)"),
    ({"variants": {"random": {"from": "pre"}}}, "variants.random: expected one of random_init: true or bilstm: true"),
    ({"compare": {"baseline": "bert"}}, "compare.baseline: bert is not a variant; expected one of pre, random"),
    ({"contrasts": [{"first": "pre", "second": "ltr", "label": "x"}]}, "contrasts[0].second: ltr is not a variant"),
    ({"curve": {"variants": ["ltr"], "tasks": ["rte"]}}, "curve.variants: ltr is not a variant"),
    ({"curve": {"variants": ["random"], "tasks": ["rte"]}}, "curve.variants: random is fine-tuning only"),
    ({"pretraining": {"checkpoints": [3, 60]}}, "pretraining.checkpoints: step 60 is beyond the 6 steps"),
    ({"pretraining": {"checkpoints": None}}, "curve: pretraining.checkpoints is empty"),
    ({"pretraining": {"minutes": 5}}, "pretraining: expected exactly one of steps (equal steps) or minutes"),
    ({"pretraining": {"steps": None}}, "pretraining: expected exactly one of steps"),
    ({"corpus": {"files": ["no/such/*.txt"]}}, "corpus.files: no/such/*.txt matches no file"),
    ({"vocabulary": {"vocab_file": "vocab.txt"}}, "vocabulary: expected vocab_size (with lowercase) or vocab_file"),
    ({"compare": {"tasks": ["nosuchtask"]}}, "compare: task nosuchtask"),
    ({"compare": {"seeds": [1]}}, "compare.seeds: expected two or more distinct seeds"),
    ({"compare": {"tasks": [{"task": "rte", "learning_rate": [1e-3]}]}}, "compare.tasks[].learning_rate: unknown key; "
                                                                         "did you mean learning_rates?"),
    ({"corpus": {"files": ["${NO_SUCH_VARIABLE}/x.txt"]}}, "corpus.files: ${NO_SUCH_VARIABLE} is not set"),
    # a variant's own data: the variant and the key named
    ({"variants": {"pre": {"corpus": {"files": ["no/such/*.txt"]}}}}, "variants.pre.corpus.files: no/such/*.txt "
                                                                       "matches no file"),
    ({"variants": {"pre": {"corpus": {"task_documents": "page"}}}}, "variants.pre.corpus.task_documents: expected "
                                                                     "example (one document per task example) or file"),
    ({"variants": {"pre": {"vocabulary": {"vocab_sise": 3}}}}, "variants.pre.vocabulary.vocab_sise: unknown key; did "
                                                               "you mean vocab_size?"),
    ({"variants": {"pre": {"instances": {"dupe_factor": 0}}}}, "variants.pre.instances.dupe_factor: expected a "
                                                               "positive whole number"),
    ({"variants": {"pre": {"corpus": {"task_texts": ["stbs"]}}}}, "variants.pre.corpus.task_texts: task stbs"),
    ({"variants": {"random": {"from": "pre", "random_init": True, "corpus": {}}}}, "variants.random.corpus: unknown "
                                                                                   "key"),
    # pre-training seeds
    ({"pretraining": {"seed": 1, "seeds": [1, 2]}}, "pretraining.seeds: given with pretraining.seed; expected seed: S "
                                                    "(one pre-training) or seeds: [S, ...]"),
    ({"pretraining": {"seeds": [1, 1]}}, "pretraining.seeds: expected distinct seeds"),
    ({"pretraining": {"seeds": [1, 2]}, "variants": {"pre": {"seed": 3}}}, "variants.pre.seed: given with "
                                                                           "pretraining.seeds"),
    ({"variants": {"pre": {}, "other": {"seeds": [7, 8]}, "random": {"from": "pre", "random_init": True}}},
     "compare.baseline: other is pre-trained with seeds [7, 8], pre with [42]: no seed in common"),
]


@pytest.mark.parametrize("changes, message", [case for case in BAD if case[1]],
                         ids=[case[1].split(":")[0] for case in BAD if case[1]])
def test_bad_input_is_one_line_naming_the_file_and_key_before_anything_is_written(data, tmp_path, capsys, changes,
                                                                                    message):
    study = small_study(tmp_path, data, **changes)
    out = tmp_path / "out"
    assert run(study, "--output_dir", out) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"bert-suite ablation: error: {study}: ") and message in err, err
    assert len(err.splitlines()) == 1 and not out.exists()


def scriptless_python(folder: Path) -> tuple[str, dict]:
    """An interpreter with no scripts beside it (no `accelerate`, no `bert-suite`: a `pip install --user`, a Python
    whose packages are on its path), and the environment that gives it this project's packages."""
    import sysconfig

    (folder / "bin").mkdir(parents=True)
    python = folder / "bin" / "python3"
    python.symlink_to(os.path.realpath(sys.executable))
    path = os.pathsep.join([str(REPO / "src"), sysconfig.get_paths()["purelib"]])
    return str(python), {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}


def test_added_seeds_resume_the_one_seed_runs_and_the_rows_count_pre_trainings(data, tmp_path, monkeypatch):
    """At unit level (the recipe and the grids faked; end to end in make test-all): a one-seed study's run stays
    its seed's when `seeds` is added (its stage record accepted, also one that predates the seed key or holds how
    often the run checkpoints, which changes no weight), only the
    new seed is pre-trained, each variant's checkpoints are one a seed (a random twin a draw of its own), and
    the rows pair by pre-training seed: the contrast's SE counts pre-trainings."""
    from bert_suite import BertSuiteConfig
    from bert_suite.ablation import contrasts_of, launch, stages
    from bert_suite.ablation.finetune import models_of
    from bert_suite.compare import build_result, resolve_task

    launched, checkpointing = [], []

    def launch_recipe(overrides, log, timing, **_):
        run = Path(overrides["output_dir"])
        launched.append((run.name, overrides["seed"]))
        checkpointing.append((run.name, overrides["seed"], overrides["save_steps"]))
        BertSuiteConfig.from_preset("tiny").save_pretrained(run / "final")
        (run / "pretrain_results.json").write_text(json.dumps({"step": 6}))
        return 1.0

    monkeypatch.setattr(launch, "launch_recipe", launch_recipe)
    out = tmp_path / "out"
    data_of = {"pre": stages.Data([], {}, tmp_path / "vocab", {32: tmp_path / "instances"}, {})}
    study = load_study(small_study(tmp_path, data, pretraining={"seed": 42}))
    stages.pretrain(study, out, data_of, 6, None, stages.Progress())
    assert launched == [("pre", 42)]
    record = out / "stages" / "pretraining-pre.json"  # as a record made before runs named their seed, and when
    before = json.loads(record.read_text())  # records held how often a run checkpoints (every 10% then)
    assert "save_steps" not in before["settings"]["recipe"]
    del before["settings"]["recipe"]["seed"]
    before["settings"]["recipe"]["save_steps"] = 2000
    record.write_text(json.dumps(before))
    study = load_study(small_study(tmp_path, data, pretraining={"seeds": [42, 43]}))
    assert [(r.variant, r.seed, r.name) for r in study.runs()] == [("pre", 42, "pre"), ("pre", 43, "pre.seed43")]
    stages.pretrain(study, out, data_of, 6, None, stages.Progress())
    assert launched == [("pre", 42), ("pre.seed43", 43)]  # seed 42's run stays
    assert [save for _, _, save in checkpointing] == [1, 1]  # a run of 6 steps checkpoints at every step
    assert launch.recipe_overrides(study, "pre", data_of["pre"], out, 20000)["save_steps"] == 500  # 2.5% of the run

    runs = {r.name: out / "pretraining" / r.name for r in study.runs()}
    models = models_of(study, runs)
    assert {n: (m.row, m.key, m.path, m.model.removesuffix(m.path)) for n, m in models.items()} == {
        "pre": ("pre", "42", str(runs["pre"] / "final"), ""),
        "pre.seed43": ("pre", "43", str(runs["pre.seed43"] / "final"), ""),
        "random": ("random", "42", str(runs["pre"] / "final"), "random:"),
        "random.seed43": ("random", "43", str(runs["pre.seed43"] / "final"), "random@2:")}
    task = resolve_task("rte", study.compare.data_dirs, flag="task")
    scores = {"pre": 0.8, "pre.seed43": 0.6, "random": 0.5, "random.seed43": 0.55}  # per run, +0.1 on seed 2
    found = {"rte": {n: {(3e-3, 16, 3.0): {1: v, 2: v + 0.1}} for n, v in scores.items()}}
    result = build_result("pre", [1, 2], models, {"rte": task}, found)
    assert result["tasks"]["rte"]["models"]["pre"]["pretraining_scores"] == {"42": [80.0, 90.0], "43": [60.0, 70.0]}
    versus = contrasts_of(study, result, {})[0]["what pre-training adds"]["rte"]
    assert (versus["scope"], versus["df"], versus["pretrainings"], versus["first_ahead_in"]) == ("recipes", 1, 2, 2)
    assert versus["difference"] == pytest.approx(17.5)  # (30 + 5) / 2


@pytest.mark.slow  # two pre-trainings, six grids, three processes a run (about two minutes): make test-all; make
# test keeps the resume and the record at unit level (test_added_seeds_resume_...) and `python -m` in the kill test
def test_a_one_seed_study_resumes_with_added_pretraining_seeds_as_verdicts_about_recipes_from_any_python(
        data, tmp_path, report):
    """Run by an interpreter with no scripts beside it (`python -m bert_suite`, two --workers): the one-seed study
    pre-trains and compares; `seeds: [42, 43]` in the file then resumes it: seed 42's run and grids stay (not
    trained again), seed 43 is pre-trained (its random twin a draw of its own) and fine-tuned, and the record
    counts pre-trainings: scores per seed, contrasts over the two pre-trainings, a row per (variant, seed)."""
    python, env = scriptless_python(tmp_path / "python")
    assert not list((tmp_path / "python" / "bin").glob("accelerate*"))
    study = small_study(tmp_path, data, pretraining={"seed": 42})
    out = tmp_path / "out"
    command = [python, "-m", "bert_suite", "ablation", str(study), "--output_dir", str(out), "--workers", "2"]
    first = subprocess.run(command, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    one = json.loads((out / "ablation.json").read_text())
    assert one["contrasts"]["what pre-training adds"]["rte"]["scope"] == "checkpoints"
    assert one["pretraining"]["pre"]["seeds"] == [42] and "these checkpoints" in (out / "ablation.md").read_text()
    kept = {"pre": complete_trials(out / "compare" / "rte" / "pre"), "pre@3": complete_trials(out / "curve" / "rte" / "pre@3")}

    small_study(tmp_path, data, pretraining={"seeds": [42, 43]})
    second = subprocess.run(command, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (out / "logs" / "pretraining-pre.log").read_text().count("$ ") == 1  # seed 42: not trained again
    assert {"pre": complete_trials(out / "compare" / "rte" / "pre"),
            "pre@3": complete_trials(out / "curve" / "rte" / "pre@3")} == kept
    assert json.loads((out / "pretraining" / "pre.seed43" / "pretrain_results.json").read_text())["config"]["seed"] == 43
    assert sorted(p.name for p in (out / "compare" / "rte").iterdir()) == ["pre", "pre.seed43", "random", "random.seed43"]
    record = json.loads((out / "ablation.json").read_text())
    entry = record["tasks"]["rte"]["models"]
    assert list(entry["pre"]["pretraining_scores"]) == ["42", "43"] and list(entry["random"]["pretraining_scores"]) == ["42", "43"]
    assert entry["pre"]["pretraining_scores"]["42"] == one["tasks"]["rte"]["models"]["pre"]["scores"]
    versus = record["contrasts"]["what pre-training adds"]["rte"]
    assert (versus["scope"], versus["df"], versus["pretrainings"]) == ("recipes", 1, 2)
    assert record["pretraining"]["pre"]["seeds"] == [42, 43] and list(record["pretraining"]["pre"]["by_seed"]) == ["42", "43"]
    assert [list(p["pretraining_scores"]) for p in record["curve"]["pre"]["rte"]] == [["42", "43"]] * 2
    md = (out / "ablation.md").read_text()
    assert "SE over 2 pre-trainings x 2 fine-tuning seeds" in md and "## Two sources of noise" in md
    assert "| pre | 42 |" in md and "| pre | 43 |" in md  # the pre-training table: a row per (variant, seed)
    # both pre-trainings learn the task the test builds: above chance (50%) on its dev set
    report("ablation: RTE-like dev accuracy per pre-training seed (fine-tuning seeds 1, 2)", entry["pre"]["pretraining_scores"])
    assert min(min(v) for v in entry["pre"]["pretraining_scores"].values()) > 60
    # a seed the file does not list is refused
    bad = subprocess.run([*command[:-2], "--variant", "pre", "--pretraining_seeds", "44"], env=env, capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "--pretraining_seeds 44: not a pre-training seed of pre" in bad.stderr


def test_a_corpus_empty_after_decontamination_stops_before_any_training(data, tmp_path, capsys):
    dev = [line.split("\t")[3] for line in (data / "glue" / "MRPC" / "dev.tsv").read_text().splitlines()[1:]]
    long = [s for s in dev if len(s.split()) >= 8]
    (tmp_path / "dev_copy.txt").write_text("\n".join(long) + "\n")
    study = small_study(tmp_path, data, corpus={"files": [str(tmp_path / "dev_copy.txt")], "task_texts": []},
                        compare={"tasks": ["mrpc"]})
    assert run(study, "--output_dir", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert f"{study}: corpus: " in err and "nothing is left" in err
    assert not (tmp_path / "out" / "pretraining").exists()


def test_two_runs_of_a_variant_at_once_train_it_once_and_a_changed_setting_or_input_is_refused(data, tmp_path,
                                                                                               capsys):
    import shutil

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for source in (data / "corpus" / "gutenberg" / "book.txt", data / "corpus" / "nltk" / "brown.txt"):
        shutil.copy(source, corpus / source.name)
    changes = {"corpus": {"files": [str(corpus / "*.txt")]}}
    study, out = small_study(tmp_path, data, **changes), tmp_path / "out"
    both = [subprocess.Popen([str(Path(sys.executable).parent / "bert-suite"), "ablation", str(study), "--output_dir",
                              str(out), "--variant", "pre"], env={**os.environ, "HF_HUB_OFFLINE": "1"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs, errors = zip(*(p.communicate(timeout=600) for p in both), strict=True)
    assert [p.returncode for p in both] == [0, 0], errors
    assert any("[ablation] waiting for the " in e and ": held by process " in e for e in errors), errors
    # the corpus line says how its files were read (the RTE texts as lines: one document an example)
    read = re.search(r"corpus: done \(3 files \(([^()]*)\);", "".join(outputs))
    assert read and "read as lines" in read.group(1), outputs
    assert sum(int(n) for n in re.findall(r"(\d+) read as (?:lines|paragraphs|raw|wikitext)", read.group(1))) == 3, read.group(1)
    assert len(json.loads((out / "pretraining" / "pre" / "timing.json").read_text())) == 1  # one launch
    assert (out / "logs" / "pretraining-pre.log").read_text().count("$ ") == 1
    assert (out / "pretraining" / "pre" / "final" / "config.json").is_file() and not (out / "compare").exists()
    assert run(small_study(tmp_path, data, **changes, vocabulary={"vocab_size": 70}), "--output_dir", out) == 2
    assert "the vocabulary stage was made with other settings: vocab_size was 60, now 70" in capsys.readouterr().err
    changed = small_study(tmp_path, data, **changes, variants={"pre": {"learning_rate": 1e-3}})
    assert run(changed, "--output_dir", out) == 2
    assert ("the pretraining/pre stage was made with other settings: recipe.learning_rate was 0.003, now 0.001"
            in capsys.readouterr().err)
    with open(corpus / "brown.txt", "a") as handle:
        handle.write("one more sentence .\n")
    assert run(small_study(tmp_path, data, **changes), "--output_dir", out) == 2
    err = capsys.readouterr().err
    assert f"the corpus stage read {corpus / 'brown.txt'} as " in err and "restore it" in err, err


def test_the_file_is_read_as_written_with_paths_relative_to_it(data, tmp_path, monkeypatch):
    monkeypatch.setenv("BERT_SUITE_DATA", str(data))
    monkeypatch.setattr("bert_suite.ablation.study.train_size", lambda task: 10**6)  # sst2@1000 in a small stand-in
    study = load_study(SHIPPED / "table5.yaml")  # its corpus from its base, _miniature.yaml, beside it
    assert study.corpus.files[0].parent == data / "corpus" / "gutenberg"
    assert [str(d) for d in study.compare.data_dirs] == [str(data / "glue"),
                                                         f"squad_small={data / 'squad' / 'dev-v1.1.json'}"]
    assert study.pretrained == ["mlm_nsp", "mlm", "ltr", "ltr_then_mlm_nsp"]
    assert study.variants["random"].source == "mlm_nsp"
    biphasic = study.recipe_of("ltr_then_mlm_nsp")  # the mlm_nsp recipe with its first half left-to-right
    assert biphasic == {**study.recipe_of("mlm_nsp"), "causal_fraction": 0.5}
    assert study.curve_variants == ["mlm_nsp", "ltr", "ltr_then_mlm_nsp"]
    monkeypatch.delenv("BERT_SUITE_DATA")
    (tmp_path / "corpus.txt").write_text("one two three .\n")
    rel = small_study(tmp_path, data, corpus={"files": ["corpus.txt"], "task_texts": []})
    assert load_study(rel).corpus.files == [tmp_path / "corpus.txt"]
    with pytest.raises(AblationError, match="the recipe reads|use_nsp must be false"):
        load_study(small_study(tmp_path, data, variants={"pre": {"causal_attention": True}}))


# payoff plans its steps from calibration runs; table6 and table8 (3 and 6 pre-trainings, 55 and 80 s) are slow
@pytest.mark.parametrize("name", ["table5", "table6", "table8", "payoff", "corpus"])
def test_each_shipped_study_file_reads_at_smoke_size_with_its_variants_seeds_and_questions(shared, tmp_path, name):
    """make test's check of the shipped files (each runs end to end in make test-all): read at smoke size, every
    key checked, the variants pre-trained or fine-tuned as the file says, each question naming two of them."""
    raw = yaml.safe_load((SHIPPED / f"{name}.yaml").read_text())
    study = load_study(smoke_study(SHIPPED / f"{name}.yaml", tmp_path, tasks=(0,)))
    assert list(study.variants) == list(raw["variants"])
    assert study.pretrained == [n for n, v in raw["variants"].items() if "from" not in (v or {})]
    assert [(c.first, c.second) for c in study.contrasts] == [(c["first"], c["second"]) for c in raw.get("contrasts", [])]
    shipped = raw["pretraining"].get("seeds") or [raw["pretraining"].get("seed", 42)]
    assert study.seeds_of(study.pretrained[0]) == shipped[:2]  # smoke size keeps two of the seeds
    assert len(study.runs()) == len(study.pretrained) * len(shipped[:2])


@pytest.mark.parametrize("name, tasks", [pytest.param("payoff", (0, 4), marks=pytest.mark.slow),
                                         pytest.param("table6", (0, 1), marks=pytest.mark.slow),
                                         pytest.param("table8", (0, 5), marks=pytest.mark.slow),
                                         pytest.param("corpus", (2,), marks=pytest.mark.slow)])
def test_each_shipped_study_runs_end_to_end_at_smoke_size(shared, tmp_path, report, name, tasks):
    study = smoke_study(SHIPPED / f"{name}.yaml", tmp_path, tasks=tasks)
    out = tmp_path / "out"
    assert run(study, "--output_dir", out) == 0
    assert_status_done(study, out)
    record = json.loads((out / "ablation.json").read_text())
    raw = yaml.safe_load(study.read_text())
    if "minutes" in raw["pretraining"]:  # steps planned from the calibration runs, the same for every variant
        raw["pretraining"]["steps"] = next(iter(record["pretraining"].values()))["steps"]
        assert (out / "calibration" / "pretrained" / "calibration.json").is_file()
        study.write_text(yaml.safe_dump(raw, sort_keys=False))
        record["ablation"] = raw
    check_record(record, study)
    assert record["left_out"] == []
    if name == "table8":  # the NER column's feature-based route: one tagger per variant and seed
        key = "conll2003 (feature-based)"
        assert list(record["tasks"]) == ["mrpc", key] and record["tasks"][key]["metric"] == "f1"
        assert len(list((out / "features" / "conll2003" / "mask0_same0_rnd100").glob("tagger-*-seed*"))) == 2
    if name == "corpus":  # three corpora, three vocabularies, one random twin each
        assert [f["data"]["corpus"] for f in record["pretraining"].values()] == ["corpus@general", "corpus@per_file",
                                                                                 "corpus"]
    if name == "table6":
        sizes = {n: json.loads((out / "pretraining" / n / "final" / "config.json").read_text())["hidden_size"]
                 for n in ("tiny", "mini", "small")}
        assert sizes == {"tiny": 128, "mini": 256, "small": 512}


def test_tokens_are_steps_times_batch_times_mean_length_per_phase_and_accuracy_is_the_last_evaluation(data, tmp_path):
    from bert_suite.ablation import pretraining_record

    study = load_study(small_study(tmp_path, data))
    folders = {}
    for length, mean, share in ((32, 30.0, 0.5), (64, 60.0, 0.52)):
        folders[length] = tmp_path / f"data{length}"
        folders[length].mkdir()
        (folders[length] / "pretrain_data_stats.json").write_text(json.dumps({"mean_instance_length": mean,
                                                                              "not_next_share": share}))
    run = tmp_path / "pre"
    run.mkdir()
    config = {"phase1_fraction": 0.9, "train_data": str(folders[32]), "train_data_phase2": str(folders[64]),
              "per_device_train_batch_size": 8, "per_device_train_batch_size_phase2": None, "causal_attention": False}
    (run / "pretrain_results.json").write_text(json.dumps({"config": config, "precision": "fp32"}))
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(e) for e in (
        {"step": 50, "eval_mlm_accuracy": 0.2, "eval_mlm_perplexity": 90.0}, {"step": 99, "mlm_loss": 3.0},
        {"step": 100, "eval_mlm_accuracy": 0.25, "eval_mlm_perplexity": 60.0})) + "\n")
    (run / "timing.json").write_text(json.dumps([{"seconds": 600}, {"seconds": 300}]))
    facts = pretraining_record(study, {"pre": run}, folders, 100)["pre"]
    # 90 steps of 8 at 30 tokens, then 10 of 8 (phase 2's batch defaults to phase 1's) at 60
    assert facts == {"steps": 100, "minutes": 15.0, "tokens": 90 * 8 * 30 + 10 * 8 * 60, "held_out_accuracy": 0.25,
                     "held_out_perplexity": 60.0, "accuracy_kind": "mlm",
                     "not_next_share": pytest.approx((90 * 0.5 + 10 * 0.52) / 100), "precision": "fp32",
                     "seeds": [42]}


def test_a_checkpoint_pretrained_without_dropout_fine_tunes_with_the_presets_dropout(tmp_path):
    from bert_suite import BertSuiteConfig
    from bert_suite.ablation import fine_tuning_checkpoint

    final = tmp_path / "final"
    final.mkdir()
    BertSuiteConfig.from_preset("tiny", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).save_pretrained(final)
    (final / "model.safetensors").write_bytes(b"weights")
    twin = fine_tuning_checkpoint(final, "tiny")
    assert twin == tmp_path / "final-finetune" and (twin / "model.safetensors").read_bytes() == b"weights"
    assert json.loads((twin / "config.json").read_text())["hidden_dropout_prob"] == 0.1
    assert fine_tuning_checkpoint(twin, "tiny") == twin  # the preset's dropout already: used as is


def test_along_the_curve_the_first_variant_is_ahead_from_the_step_it_stays_ahead(data, tmp_path):
    from bert_suite.ablation import contrasts_of

    study = load_study(small_study(tmp_path, data))
    points = lambda scores: [{"step": s, "scores": v} for s, v in zip((3, 6, 9), scores, strict=True)]  # noqa: E731
    curve = {"pre": {"rte": points([[60, 62, 61], [70, 75, 72], [80, 84, 82]])},
             "random": {"rte": points([[61, 63, 60], [60, 61, 62], [62, 60, 61]])}}
    record = {"tasks": {"rte": {"models": {"pre": {"scores": [80, 84, 82]}, "random": {"scores": [62, 60, 61]}}}}}
    per_task, along = contrasts_of(study, record, curve)
    label = "what pre-training adds"
    assert per_task[label]["rte"]["verdict"] == "ahead"
    assert along[label]["rte"]["ahead_from"] == 6
    assert [p["verdict"] for p in along[label]["rte"]["points"]] == ["level", "ahead", "ahead"]
    # the tasks in the curve's order, whatever the hash seed: the record is the same bytes on every rerun
    keys = [f"task{i}" for i in range(12)][::-1]
    curve = {name: {key: by_task["rte"] for key in keys} for name, by_task in curve.items()}
    assert list(contrasts_of(study, record, curve)[1][label]) == keys


def test_along_the_curve_over_pre_training_seeds_the_verdicts_are_about_recipes_and_the_tables_say_so(data,
                                                                                                      tmp_path):
    """Three pre-trainings a variant: each curve point pairs by pre-training seed (df 2, scope recipes), ahead_from
    is read off those verdicts, and the markdown's curve table and differences name the unit; with one
    pre-training they say these checkpoints."""
    from bert_suite.ablation import contrasts_of
    from bert_suite.ablation.record import curve_unit, markdown

    study = load_study(small_study(tmp_path, data, pretraining={"seeds": [42, 43, 44]}))

    def points(by_step):  # {step: {seed: [score per fine-tuning seed 1, 2]}}
        return [{"step": step, "pretraining_scores": table, "mean": 0.0, "se": 0.0,
                 "scores": [sum(v) / len(v) for v in table.values()]} for step, table in by_step.items()]

    pre = points({3: {"42": [60, 61], "43": [55, 56], "44": [58, 57]}, 6: {"42": [70, 71], "43": [72, 73],
                                                                          "44": [69, 70]}})
    twin = points({3: {"42": [58, 59], "43": [57, 58], "44": [58, 58]}, 6: {"42": [60, 61], "43": [60, 60],
                                                                           "44": [61, 60]}})
    record = {"seeds": [1, 2], "tasks": {"rte": {"models": {"pre": pre[-1], "random": twin[-1]}}}}
    _, along = contrasts_of(study, record, {"pre": {"rte": pre}, "random": {"rte": twin}})
    found = along["what pre-training adds"]["rte"]
    assert [(p["scope"], p["df"], p["pretrainings"], p["verdict"]) for p in found["points"]] == [
        ("recipes", 2, 3, "level"), ("recipes", 2, 3, "ahead")]
    assert found["ahead_from"] == 6
    assert "over the variant's 3 pre-trainings" in curve_unit({**record, "curve": {"pre": {"rte": pre}}})
    one = [{**p, "pretraining_scores": {"42": p["pretraining_scores"]["42"]}} for p in pre]
    assert "these checkpoints" in curve_unit({**record, "curve": {"pre": {"rte": one}}})
    whole = {**record, "baseline": "pre", "models": {}, "tasks": {}, "contrasts": {}, "pretraining": {}, "command": "x",
             "curve": {"pre": {"rte": pre}, "random": {"rte": twin}}, "curve_contrasts": along}
    md = markdown(whole, study, None)
    assert "Each cell: the mean ± SE over the variant's 3 pre-trainings" in md
    assert "Paired differences along the curve, first minus second ± SE (SE over 3 pre-trainings x 2 fine-tuning " \
           "seeds):" in md and "- what pre-training adds, rte: ahead (95% interval above zero) from step 6 on" in md


def test_a_variant_with_seeds_of_its_own_pairs_with_the_baseline_on_the_seeds_both_have(data, tmp_path):
    """`seeds` of a variant's own beside the study's: its row holds every pre-training, and the compare stage's
    verdict and the contrast pair it with the baseline on the seeds both have, naming them (paired_on)."""
    from bert_suite.ablation import contrasts_of
    from bert_suite.ablation.finetune import models_of
    from bert_suite.ablation.record import curve_unit, markdown
    from bert_suite.compare import build_result, resolve_task

    study = load_study(small_study(tmp_path, data, variants={"other": {"seeds": [42, 43]}},
                                   contrasts=[{"first": "other", "second": "pre", "label": "x"}]), run_checks=False)
    runs = {r.name: tmp_path / "out" / "pretraining" / r.name for r in study.runs()}
    for run in runs.values():
        (run / "final").mkdir(parents=True)
        (run / "final" / "config.json").write_text(json.dumps({"hidden_dropout_prob": 0.1}))
    models = models_of(study, runs)
    scores = {"pre": 0.6, "random": 0.5, "other": 0.7, "other.seed43": 0.9}
    found = {"rte": {n: {(3e-3, 16, 3.0): {1: v, 2: v + 0.02}} for n, v in scores.items()}}
    result = build_result("pre", [1, 2], models, {"rte": resolve_task("rte", study.compare.data_dirs, flag="task")},
                          found)
    assert list(result["tasks"]["rte"]["models"]["other"]["pretraining_scores"]) == ["42", "43"]
    versus = result["tasks"]["rte"]["vs_baseline"]["other"]
    assert versus["paired_on"] == ["42"] and versus["difference"] == pytest.approx(10.0)  # seed 43's 90 left out
    per_task = contrasts_of(study, result, {})[0]
    contrast = per_task["x"]["rte"]
    assert contrast["paired_on"] == ["42"] and contrast["scope"] == "checkpoints"
    record = {**result, "contrasts": per_task, "curve": {}, "curve_contrasts": {}, "pretraining": {}, "command": "x"}
    md = markdown(record, study, None)
    assert "not on every pre-training of either: x (seeds 42)." in md
    assert "paired_on" not in result["tasks"]["rte"]["vs_baseline"]["random"]
    # each unit said of the rows and pairs it is true of: other's SE counts its two pre-trainings, pre's and the
    # twin's their fine-tuning seeds, and the one question pairs on one pre-training
    assert "over each recipe's pre-trainings (other: 2), each pre-training's score the mean over fine-tuning " \
           "seeds 1, 2: the SE counts pre-trainings, so it speaks about the recipe; over" in md
    assert "over fine-tuning seeds 1, 2 for a model of one pre-training (pre, random): its SE speaks about that " \
           "checkpoint" in md
    assert "(these checkpoints: SE over 2 fine-tuning seeds) [95% interval, Student's t with 1 degree of freedom]" in md
    assert "Paired on one pre-training (x): that verdict is about those checkpoints, not" in md
    assert "needs pretraining.seeds: two in common at the least" in md
    single = json.loads(json.dumps(record))  # every variant of one pre-training: the sentence for the whole table
    for model in single["tasks"]["rte"]["models"].values():
        model["pretraining_scores"] = {"42": model["pretraining_scores"]["42"]}
    assert "One pre-training a variant: these verdicts are about these checkpoints, not about the recipes that made " \
           "them" in (md := markdown(single, study, None)) and "needs pretraining.seeds: two at the least" in md
    curve = {"pre": {"rte": [{"pretraining_scores": {"42": [60, 62]}}]},
             "other": {"rte": [{"pretraining_scores": {"42": [70, 72], "43": [90, 92]}}]}}
    assert curve_unit({"seeds": [1, 2], "curve": curve}).startswith(
        "Each cell: the mean ± SE over the variant's pre-trainings (other: 2), each "
        "pre-training's score the mean over fine-tuning seeds 1, 2 at that step: the SE counts pre-trainings (the "
        "recipes); over fine-tuning seeds 1, 2 for a variant of one pre-training (pre): that checkpoint.")
    curve["pre"]["rte"][0]["pretraining_scores"]["43"] = [61, 63]
    curve["other"]["rte"][0]["pretraining_scores"]["44"] = [80, 82]
    assert curve_unit({"seeds": [1, 2], "curve": curve}).endswith("(pre: 2, other: 3), each pre-training's score the "
                                                                   "mean over fine-tuning seeds 1, 2 at that step: the "
                                                                   "SE counts pre-trainings (the recipes).")
    # two and three pre-trainings a recipe (a variant with seeds of its own, both several): no row of one
    from bert_suite.compare import unit_text
    three = json.loads(json.dumps(result))
    for name, seeds in (("pre", ["42", "43"]), ("random", ["42", "43"]), ("other", ["42", "43", "44"])):
        three["tasks"]["rte"]["models"][name]["pretraining_scores"] = {s: [50.0, 52.0] for s in seeds}
    assert unit_text(three).startswith("Mean ± standard error over each recipe's pre-trainings (pre: 2, random: 2, "
                                       "other: 3), each pre-training's score the mean over fine-tuning seeds 1, 2: the "
                                       "SE counts pre-trainings, so it speaks about the recipe (scores 0-100); in ")


def test_a_launch_counts_its_time_while_it_runs_so_a_killed_session_keeps_it(tmp_path, monkeypatch):
    import threading
    import time

    from bert_suite.ablation import launch, minutes_of

    real = subprocess.Popen
    monkeypatch.setattr(launch, "TIMING_EVERY", 0.05)
    monkeypatch.setattr(launch, "_cuda", lambda: False)
    monkeypatch.setattr(launch.subprocess, "Popen",  # the recipe: 0.8 s of work
                        lambda cmd, **kw: real([sys.executable, "-c", "import time; time.sleep(0.8)"], **kw))
    timing = tmp_path / "timing.json"
    timing.write_text(json.dumps([{"seconds": 60.0, "started": "earlier", "finished": "earlier"}]))
    thread = threading.Thread(target=launch.launch_recipe, args=({}, tmp_path / "log.txt", timing))
    thread.start()
    time.sleep(0.5)
    running = json.loads(timing.read_text())  # what a kill of this process now would leave
    thread.join()
    assert len(running) == 2 and running[0]["seconds"] == 60.0
    assert 0.2 < running[1]["seconds"] < 0.8 and "finished" not in running[1]
    done = json.loads(timing.read_text())
    assert len(done) == 2 and done[1]["seconds"] >= 0.8 and "finished" in done[1]
    assert minutes_of(tmp_path) == pytest.approx((60 + done[1]["seconds"]) / 60)


def test_a_launch_stopped_with_sigstop_or_a_sleeping_machine_does_not_count_that_time(tmp_path, monkeypatch):
    """A gap of 1,000 s between two of the launcher's updates (SIGSTOP, a suspended machine: the clock jumps while
    nothing runs) is left out of the launch's seconds, beyond one update's interval, and named in the entry."""
    import time
    from types import SimpleNamespace

    from bert_suite.ablation import launch

    real = subprocess.Popen
    jump = {"at": time.time() + 0.3, "by": 1000.0}
    monkeypatch.setattr(launch, "time", SimpleNamespace(
        time=lambda: time.time() + (jump["by"] if time.time() > jump["at"] else 0.0), strftime=time.strftime))
    monkeypatch.setattr(launch, "TIMING_EVERY", 0.05)
    monkeypatch.setattr(launch, "PAUSED_AFTER", 5)
    monkeypatch.setattr(launch, "_cuda", lambda: False)
    monkeypatch.setattr(launch.subprocess, "Popen",  # the recipe: 0.8 s of work
                        lambda cmd, **kw: real([sys.executable, "-c", "import time; time.sleep(0.8)"], **kw))
    timing = tmp_path / "timing.json"
    seconds = launch.launch_recipe({}, tmp_path / "log.txt", timing)
    (entry,) = json.loads(timing.read_text())
    assert 0.8 <= entry["seconds"] < 5 and seconds == pytest.approx(entry["seconds"], abs=0.5)
    assert entry["paused_seconds"] == pytest.approx(1000 - 0.05, abs=0.5)
    jump["by"] = 0.0  # no pause: no paused_seconds, the wall time
    launch.launch_recipe({}, tmp_path / "log.txt", timing)
    assert "paused_seconds" not in json.loads(timing.read_text())[1]


def test_the_recipes_snapshot_steps_read_as_a_list_from_yaml_or_the_command_line():
    from bert_suite.pretraining.config import PretrainConfigError, load_pretrain_config

    base = ["train_data=x", "tokenizer=y", "max_steps=10", "warmup_steps=0", "phase1_fraction=1"]
    assert load_pretrain_config(None, [*base, "snapshot_steps=3,6"]).snapshot_steps == [3, 6]
    assert load_pretrain_config(None, [*base, "snapshot_steps=[3, 6]"]).snapshot_steps == [3, 6]
    assert load_pretrain_config(None, [*base, "snapshot_steps=[]"]).snapshot_steps == []
    with pytest.raises(PretrainConfigError, match="snapshot_steps must be steps between 1 and max_steps"):
        load_pretrain_config(None, [*base, "snapshot_steps=3,20"])
    with pytest.raises(PretrainConfigError, match="snapshot_steps must be a list of int"):
        load_pretrain_config(None, [*base, "snapshot_steps=three"])
    # the recipe's sizes, kept apart from configuration_bert_suite (which imports torch), are its presets
    from bert_suite.configuration_bert_suite import PRESETS
    from bert_suite.pretraining.config import MODEL_SIZES

    assert MODEL_SIZES == tuple(PRESETS)
    with pytest.raises(PretrainConfigError, match="model_size must be one of tiny, mini, small, medium, base, large"):
        load_pretrain_config(None, [*base, "model_size=huge"])


def test_a_base_file_shares_sections_its_paths_relative_to_it_and_the_study_replaces_key_by_key(data, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "corpus.txt").write_text("one two three .\n")
    full = yaml.safe_load(small_study(tmp_path, data).read_text())
    base = {"corpus": {"files": ["corpus.txt"], "task_texts": [], "decontaminate": False},
            "vocabulary": full["vocabulary"], "pretraining": full["pretraining"]}
    (shared / "base.yaml").write_text(yaml.safe_dump(base, sort_keys=False))
    own = {"title": "mine", "base": "shared/base.yaml", "pretraining": {"learning_rate": 1e-3},
           **{k: full[k] for k in ("variants", "compare", "curve", "contrasts")}}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(own, sort_keys=False))
    study = load_study(tmp_path / "mine.yaml")
    assert study.corpus.files == [shared / "corpus.txt"]  # relative to the base, not to the study
    assert study.pretraining.steps == 6 and study.pretraining.recipe["learning_rate"] == 1e-3
    assert study.pretraining.recipe["per_device_train_batch_size"] == 8  # the base's other keys are kept
    assert list(study.raw) == ["title", "corpus", "vocabulary", "pretraining", "variants", "compare", "curve",
                               "contrasts"]  # the base's sections where `base` stands, as the record holds them
    (shared / "base.yaml").write_text(yaml.safe_dump({**base, "base": "../mine.yaml"}))
    with pytest.raises(AblationError, match="base: ../mine.yaml includes itself"):
        load_study(tmp_path / "mine.yaml")
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({**own, "base": "nothing.yaml"}))
    with pytest.raises(AblationError, match=r"mine.yaml: base: .*nothing.yaml is not a file"):
        load_study(tmp_path / "mine.yaml")


def test_an_optional_task_is_left_out_only_when_its_data_is_missing_and_a_misspelt_one_is_an_error(data, tmp_path):
    tasks = ["rte", {"task": "conll2003", "optional": True}]
    missing = small_study(tmp_path, data, compare={"tasks": tasks, "data_dir": [str(data / "glue"),
                                                                                f"conll2003={tmp_path / 'none'}"]})
    assert load_study(missing).left_out == {"conll2003": f"no train.txt in {tmp_path / 'none'}"}
    present = small_study(tmp_path, data, compare={"tasks": tasks, "data_dir": [str(data / "glue"),
                                                                                f"conll2003={data / 'conll2003'}"]})
    assert load_study(present).left_out == {}
    misspelt = small_study(tmp_path, data, compare={"tasks": ["rte", {"task": "conl2003", "optional": True}]})
    with pytest.raises(AblationError, match="compare: task conl2003: "):
        load_study(misspelt)
    with pytest.raises(AblationError, match=r"corpus.task_texts: task stbs: "):
        load_study(small_study(tmp_path, data, corpus={"task_texts": ["stbs"]}))
    with pytest.raises(AblationError, match=r"compare.tasks: rte@5000: 5,000 labels is above rte's train size"):
        load_study(small_study(tmp_path, data, compare={"tasks": ["rte@5000"]}))


def test_a_study_keeps_the_donors_checkpoint_at_the_switch_and_starts_the_biphasic_run_there(data, tmp_path,
                                                                                            monkeypatch):
    """At unit level (the recipe faked; the real recipe's side in tests/test_objective_schedule.py, the whole study
    in make test-all): ltr is told to keep its checkpoint at bi's switch (which is no setting of its run), and
    bi starts from that checkpoint with ltr's snapshots of those steps copied as its own."""
    from bert_suite.ablation import launch, stages
    from bert_suite.ablation.stages import UNRECORDED

    study, out = biphasic_study(tmp_path, data), tmp_path / "out"
    launched = []
    monkeypatch.setattr(launch, "recipe_overrides", lambda study, name, data, run, steps, **_: {
        "output_dir": str(run), "max_steps": steps, "snapshot_steps": "3", "train_data": "-", "tokenizer": "-",
        "warmup_steps": 0, "phase1_fraction": 1})

    def launch_recipe(overrides, log, timing, **_):
        run = Path(overrides["output_dir"])
        launched.append((run.name, overrides.get("keep_checkpoints"), overrides.get("start_from_checkpoint")))
        for folder, name in ((run / "checkpoints" / "step-3", "progress.json"), (run / "snapshots" / "step-3",
                                                                                 "config.json"), (run / "final", "config.json")):
            folder.mkdir(parents=True, exist_ok=True)
            if not (folder / name).exists():  # (bi's snapshot at step 3 is the copy of ltr's)
                (folder / name).write_text(json.dumps({"run": run.name}))
        (run / "pretrain_results.json").write_text(json.dumps({"step": 6}))
        return 1.0

    monkeypatch.setattr(launch, "launch_recipe", launch_recipe)
    stages.pretrain(study, out, {"ltr": None, "bi": None}, 6, None, stages.Progress())
    ltr, bi = out / "pretraining" / "ltr", out / "pretraining" / "bi"
    assert launched == [("ltr", "3", None), ("bi", None, ltr / "checkpoints" / "step-3")]
    assert json.loads((bi / "snapshots" / "step-3" / "config.json").read_text()) == {"run": "ltr"}  # ltr's, copied
    recorded = json.loads((out / "stages" / "pretraining-ltr.json").read_text())["settings"]["recipe"]
    assert not set(UNRECORDED) & set(recorded)  # keeping a checkpoint changes no weight: not a setting


def test_a_donor_off_the_curve_writes_the_snapshots_that_its_biphasic_run_on_the_curve_copies(data, tmp_path,
                                                                                             monkeypatch):
    """bi is on the curve and ltr is not: ltr still writes its snapshot at the curve's step before the switch (its
    own setting otherwise has none), so bi starts from ltr's checkpoint instead of training those steps again."""
    from bert_suite.ablation import launch, stages

    study = load_study(small_study(tmp_path, data, variants={
        "ltr": {"use_nsp": False, "causal_attention": True}, "bi": {"causal_fraction": 0.5}, "pre": None,
        "random": None}, compare={"baseline": "bi"}, curve={"variants": ["bi"], "tasks": ["rte"]},
        contrasts=[{"first": "bi", "second": "ltr", "label": "biphasic against ltr"}]))
    out, launched = tmp_path / "out", []
    monkeypatch.setattr(launch, "recipe_overrides", lambda study, name, data, run, steps, **kw: {  # snapshots as
        "output_dir": str(run), "max_steps": steps, "train_data": "-", "tokenizer": "-", "warmup_steps": 0,  # the
        "phase1_fraction": 1, **({"snapshot_steps": "3"} if name in study.curve_variants else {}), **kw})  # curve's

    def launch_recipe(overrides, log, timing, **_):
        run = Path(overrides["output_dir"])
        launched.append((run.name, overrides.get("snapshot_steps"), overrides.get("start_from_checkpoint")))
        snapshots = [f"snapshots/step-{s}" for s in launch.config_value(overrides, "snapshot_steps")]
        for folder in ["checkpoints/step-3", *snapshots, "final"]:
            (run / folder).mkdir(parents=True, exist_ok=True)
            for name in ("progress.json", "config.json"):
                if not (run / folder / name).exists():  # (bi's snapshot at step 3 is the copy of ltr's)
                    (run / folder / name).write_text(json.dumps({"run": run.name}))
        (run / "pretrain_results.json").write_text(json.dumps({"step": 6}))
        return 1.0

    monkeypatch.setattr(launch, "launch_recipe", launch_recipe)
    stages.pretrain(study, out, {"ltr": None, "bi": None}, 6, None, stages.Progress())
    ltr, bi = out / "pretraining" / "ltr", out / "pretraining" / "bi"
    assert launched == [("ltr", "3", None), ("bi", "3", ltr / "checkpoints" / "step-3")]
    assert json.loads((bi / "snapshots" / "step-3" / "config.json").read_text()) == {"run": "ltr"}  # ltr's, copied
    # a run installed from another machine (tools/study_transfer.py install) gets the stage's keys, the extra
    # snapshot included: its stage record is the one the study then accepts (the bare recipe keys are refused)
    data = {"ltr": None, "bi": None}
    donor = next(r for r in study.runs(["ltr"]))
    mine = stages.run_overrides(study, donor, data, ltr, 6, stages.data_starts(study, 6, data))
    assert (mine["snapshot_steps"], mine["keep_checkpoints"]) == ("3", "3")
    stages.check_pretraining(out, "ltr", mine, True)
    with pytest.raises(AblationError, match="snapshot_steps"):
        stages.check_pretraining(out, "ltr", launch.recipe_overrides(study, "ltr", None, ltr, 6, seed=donor.seed),
                                 True)


@pytest.mark.slow  # two pre-trainings and the data stages (40 s on 2 busy cores): make test-all; make test keeps the
# study's side at unit level (the test above) and the recipe's in tests/test_objective_schedule.py
def test_a_biphasic_variant_starts_from_the_left_to_right_variants_checkpoint_at_its_switch(data, tmp_path):
    """Issue 51: the biphasic variant's first half is the ltr variant's (the recipe test shows the weights are
    the same), so the study starts it from ltr's checkpoint at the switch, which ltr keeps past the rotation,
    copies ltr's snapshots of those steps as its own, and the record says so."""
    from bert_suite.ablation import pretraining_record
    from bert_suite.ablation.stages import UNRECORDED

    study = small_study(tmp_path, data, variants={"ltr": {"use_nsp": False, "causal_attention": True},
                                                  "bi": {"causal_fraction": 0.5}},
                        curve={"variants": ["ltr", "bi"], "tasks": ["rte"]}, compare={"baseline": "bi"},
                        contrasts=[{"first": "bi", "second": "ltr", "label": "biphasic against ltr"}])
    out = tmp_path / "out"
    assert run(study, "--output_dir", out, "--until", "pretraining") == 0
    ltr, bi = out / "pretraining" / "ltr", out / "pretraining" / "bi"
    assert (ltr / "checkpoints" / "step-3" / "progress.json").is_file()  # kept for bi (save_total_limit is 2)
    assert json.loads((bi / "started_from.json").read_text()) == {"checkpoint": str(ltr / "checkpoints" / "step-3"),
                                                                  "step": 3}
    assert "started from" in (out / "logs" / "pretraining-bi.log").read_text()
    snapshot = load_file(str(bi / "snapshots" / "step-3" / "model.safetensors"))
    assert all(torch.equal(v, load_file(str(ltr / "snapshots" / "step-3" / "model.safetensors"))[k])
               for k, v in snapshot.items())
    assert [json.loads(line)["objective"] for line in (bi / "metrics.jsonl").read_text().splitlines()][:3] == \
        ["causal"] * 3
    recorded = json.loads((out / "stages" / "pretraining-ltr.json").read_text())["settings"]["recipe"]
    assert not set(UNRECORDED) & set(recorded)  # keeping a checkpoint changes no weight: not a setting
    facts = pretraining_record(load_study(study), {"ltr": ltr, "bi": bi}, None, 6)
    assert facts["bi"]["started_from"] == {"variant": "ltr", "step": 3} and "started_from" not in facts["ltr"]
    assert [o["objective"] for o in facts["bi"]["objectives"]] == ["causal", "mlm_nsp"]


def test_a_snapshot_already_fine_tuned_on_the_curve_takes_that_point(data, tmp_path):
    """A biphasic run started from the ltr run's checkpoint has copies of ltr's snapshots up to that step: the
    curve takes ltr's points there (marked as ltr's) instead of fine-tuning the same weights again, whichever
    variant the file lists first, and the record says so. A snapshot whose bytes differ, and the final step (the
    compare stage's grid), are each variant's own."""
    from bert_suite.ablation.finetune import curve_of
    from bert_suite.ablation.record import markdown

    def study_listing(*order):
        return load_study(small_study(tmp_path, data, variants={"ltr": {"use_nsp": False, "causal_attention": True},
                                                                "bi": {"causal_fraction": 0.5}},
                                      curve={"variants": list(order), "tasks": ["rte"]}, compare={"baseline": "bi"},
                                      contrasts=[{"first": "bi", "second": "ltr", "label": "biphasic against ltr"}]))
    runs = {name: tmp_path / "pretraining" / name for name in ("ltr", "bi")}
    for name, run_folder in runs.items():
        for step in (3, 6):  # 6 is the last step: its model is final/, the compare stage's
            snapshot = run_folder / "snapshots" / f"step-{step}"
            snapshot.mkdir(parents=True)
            (snapshot / "config.json").write_text("{}")
            (snapshot / "model.safetensors").write_bytes(b"weights at 3" if step == 3 else name.encode())
    asked, skipped = [], []

    def grid(run, key, step):  # a run's grid: one setting, fine-tuning seeds 1 and 2
        asked.append((run.name, key, step))
        return {(1e-3, 16, 3.0): {1: (step + len(run.name)) / 100, 2: (step + len(run.name) + 1) / 100}}

    curve = curve_of(study_listing("ltr", "bi"), tmp_path, ["rte"], 6, grid, skip=lambda: skipped.append(True))
    assert asked == [("ltr", "rte", 3), ("ltr", "rte", 6), ("bi", "rte", 6)] and skipped == [True]
    assert curve["bi"]["rte"][0] == {**curve["ltr"]["rte"][0], "from": "ltr"}
    assert "from" not in curve["bi"]["rte"][1] and curve["bi"]["rte"][1]["scores"] != curve["ltr"]["rte"][1]["scores"]
    record = {"baseline": "bi", "seeds": [1, 2], "models": {}, "tasks": {}, "contrasts": {}, "curve": curve,
              "curve_contrasts": {}, "pretraining": {}, "command": "bert-suite ablation study.yaml"}
    assert "bi's points at 3 steps are ltr's" in markdown(record, study_listing("ltr", "bi"), None)

    asked.clear()  # the biphasic variant listed first: ltr takes its point
    curve = curve_of(study_listing("bi", "ltr"), tmp_path, ["rte"], 6, grid)
    assert asked == [("bi", "rte", 3), ("bi", "rte", 6), ("ltr", "rte", 6)] and curve["ltr"]["rte"][0]["from"] == "bi"

    (runs["bi"] / "snapshots" / "step-3" / "model.safetensors").write_bytes(b"trained its first steps itself")
    asked.clear()
    assert "from" not in curve_of(study_listing("ltr", "bi"), tmp_path, ["rte"], 6, grid)["bi"]["rte"][0]
    assert ("bi", "rte", 3) in asked


def complete_trials(folder: Path) -> int:
    import sqlite3

    with sqlite3.connect(folder / "grid.db") as db:
        return db.execute("select count(*) from trials where state = 'COMPLETE'").fetchone()[0]


# make test keeps the choice of the early grids at unit level (test_early_grids_are_the_ones_...) and the waiting
# for a held run (test_a_variant_run_trains_its_free_runs_first_...); the processes themselves: make test-all
@pytest.mark.parametrize("then", [pytest.param("stop", marks=pytest.mark.slow), pytest.param("finish", marks=pytest.mark.slow)])
def test_a_study_fine_tunes_what_is_ready_while_another_process_pre_trains_a_variant(data, tmp_path, then):
    """A plain run beside another process that pre-trains a variant (its lock held here) trains the variant
    nobody trains and fine-tunes it meanwhile (compare's grid and its curve snapshot), then waits. Stopped
    there, it stops; or, the lock let go with the variant unfinished, it trains that one itself, and the
    compare stage finds the early grids done (slow: two more pre-trainings' worth of work)."""
    import signal

    from bert_suite.ablation.locks import variant_lock

    study = small_study(tmp_path, data, variants={"other": {"learning_rate": 1e-3}, "random": None},
                        contrasts=[{"first": "pre", "second": "other", "label": "lr"}])
    out, log = tmp_path / "out", tmp_path / "study.out"
    with variant_lock(out, "other"), open(log, "w") as handle:
        process = subprocess.Popen([str(Path(sys.executable).parent / "bert-suite"), "ablation", str(study),
                                    "--output_dir", str(out)], env={**os.environ, "HF_HUB_OFFLINE": "1"},
                                   stdout=handle, stderr=subprocess.PIPE, text=True)
        wait_for(log, "waiting for other: pre-trained by another process", process, 300)
        assert "(the 2 grids ready so far are done)" in log.read_text()
        assert "compare: early, while other pre-trains: rte with pre" in log.read_text()
        assert [p.name for p in (out / "compare" / "rte").iterdir()] == ["pre"]
        assert [p.name for p in (out / "curve" / "rte").iterdir()] == ["pre@3"]
        assert not (out / "pretraining" / "other").exists()
        early = {"pre": complete_trials(out / "compare" / "rte" / "pre"),
                 "pre@3": complete_trials(out / "curve" / "rte" / "pre@3")}
        assert early == {"pre": 2, "pre@3": 2}  # the grid: one setting, seeds 1 and 2
        if then == "stop":
            process.send_signal(signal.SIGTERM)
            _, err = process.communicate(timeout=120)
            assert process.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in err, err[-3000:]
            return
    _, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    record = json.loads((out / "ablation.json").read_text())
    assert set(record["models"]) == {"pre", "other"} and record["pretraining"]["other"]["steps"] == 6
    assert {"pre": complete_trials(out / "compare" / "rte" / "pre"),
            "pre@3": complete_trials(out / "curve" / "rte" / "pre@3")} == early  # not run again
    assert (out / "logs" / "pretraining-other.log").read_text().count("$ ") == 1


def biphasic_study(tmp_path: Path, data: Path, **variants):
    """ltr and bi (left-to-right for its first 3 of 6 steps, then MLM + NSP: ltr's first steps), each on the
    curve; `variants`: more."""
    return load_study(small_study(tmp_path, data, variants={
        "ltr": {"use_nsp": False, "causal_attention": True}, "bi": {"causal_fraction": 0.5}, **variants,
        "pre": None, "random": None}, compare={"baseline": "bi"}, curve={"variants": ["ltr", "bi"], "tasks": ["rte"]},
        contrasts=[{"first": "bi", "second": "ltr", "label": "biphasic against ltr"}]))


def test_early_grids_are_the_ones_the_compare_stage_would_run_with_what_is_done_already(data, tmp_path, monkeypatch):
    """While another process pre-trains a variant, the study fine-tunes what is done: compare's grid of each
    variant whose run (or source's run) is finished, and the curve's snapshots that no resume can write again,
    each with the arguments the compare stage gives it (so it finds them done). A snapshot that is a copy of an
    earlier curve variant's, one after a missing snapshot, one past an unfinished run's last checkpoint, and a
    random twin behind one not ready are left to the compare stage (they may yet be another's grid)."""
    import inspect

    from bert_suite import compare
    from bert_suite.ablation import finetune

    study = biphasic_study(tmp_path, data, ltr_random={"from": "ltr", "random_init": True},
                           bi_random={"from": "bi", "random_init": True})
    runs = {name: tmp_path / "pretraining" / name for name in ("ltr", "bi")}
    for folder in runs.values():
        snapshot = folder / "snapshots" / "step-3"
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text("{}")
        (snapshot / "model.safetensors").write_bytes(b"ltr's first steps")  # bi started from ltr's checkpoint
    for name in ("ltr", "bi"):
        (runs[name] / "final").mkdir()
        (runs[name] / "final" / "config.json").write_text("{}")
        (runs[name] / "final" / "model.safetensors").write_bytes(name.encode())
    (runs["bi"] / "pretrain_results.json").write_text(json.dumps({"step": 6}))
    asked, signature = [], inspect.signature(compare.grid_scores)

    def grid_scores(*args, **kwargs):  # every argument, as the grid's study name and folder derive from them
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        given = dict(call.arguments)
        asked.append((given.pop("model").model, str(given.pop("folder").relative_to(tmp_path)), given.pop("task").key,
                      json.dumps(given, sort_keys=True, default=str)))
        return {(3e-3, 16, 3): {1: 0.6, 2: 0.7}}

    monkeypatch.setattr(finetune, "grid_scores", grid_scores)
    monkeypatch.setattr(compare, "grid_scores", grid_scores)
    for module, function in ((finetune, "check_tasks"), (compare, "vocabulary_of"), (compare, "write_outputs")):
        monkeypatch.setattr(module, function, lambda *args: None)  # the fake checkpoints have no tokenizer

    def early(grids: int) -> list[str]:
        asked.clear()
        assert finetune.early_grids(study, tmp_path, runs, 6, study.compare.data_dirs, None, None) == grids
        return [folder for _, folder, _, _ in asked]

    assert finetune.ready_runs(study, runs, 6) == ["bi"]
    # bi through compare's grid; bi_random waits (ltr_random, listed first, may have its files and take the
    # grid); ltr's snapshot is past its last checkpoint (none yet), bi's is ltr's copy; bi's last step is compare's
    assert early(1) == ["compare/rte/bi"]
    (runs["ltr"] / "checkpoints" / "step-4").mkdir(parents=True)
    (runs["ltr"] / "checkpoints" / "step-4" / "progress.json").write_text("{}")  # a resume starts past step 3
    assert early(2) == ["compare/rte/bi", "curve/rte/ltr@3"]
    (runs["ltr"] / "snapshots" / "step-3" / "model.safetensors").unlink()  # not written: bi's may be its copy
    assert early(1) == ["compare/rte/bi"]
    (runs["ltr"] / "pretrain_results.json").write_text(json.dumps({"step": 6}))  # ltr finished: all of it is ready
    (runs["ltr"] / "snapshots" / "step-3" / "model.safetensors").write_bytes(b"ltr's first steps")
    assert early(4) == ["compare/rte/ltr", "compare/rte/bi", "compare/rte/ltr_random", "curve/rte/ltr@3"]
    early_calls = set(asked)  # the twins' files are alike: one grid; bi's snapshot is ltr's
    asked.clear()
    finetune.fine_tune(study, tmp_path, runs, 6, study.compare.data_dirs, None, None)
    assert set(asked) == early_calls  # the compare stage's grids, argument for argument


def test_a_run_that_does_not_wait_passes_over_a_variant_held_elsewhere_and_one_starting_from_its_checkpoint(
        data, tmp_path, monkeypatch):
    """With ltr pre-trained by another process, bi (whose first steps are ltr's) is passed over too until ltr's
    checkpoint at the switch is written: taken at once, it would train those steps again. Then it starts there."""
    from bert_suite.ablation import launch, stages
    from bert_suite.ablation.locks import variant_lock

    study, out = biphasic_study(tmp_path, data), tmp_path / "out"
    launched = []
    monkeypatch.setattr(launch, "recipe_overrides", lambda study, name, data, run, steps, **_: {
        "output_dir": str(run), "max_steps": steps, "snapshot_steps": "3", "train_data": "-", "tokenizer": "-",
        "warmup_steps": 0, "phase1_fraction": 1})
    monkeypatch.setattr(launch, "launch_recipe", lambda overrides, log, timing, **_: launched.append(
        (Path(overrides["output_dir"]).name, overrides.get("start_from_checkpoint"))) or 1.0)

    class Quiet(stages.Progress):
        def stage(self, name, text):
            pass

    data_of = {"ltr": None, "bi": None}
    with variant_lock(out, "ltr"):
        assert stages.pretrain(study, out, data_of, 6, None, Quiet(), pass_held=True) == ["ltr", "bi"]
        assert launched == []
        checkpoint = out / "pretraining" / "ltr" / "checkpoints" / "step-3"
        checkpoint.mkdir(parents=True)
        (checkpoint / "progress.json").write_text("{}")
        snapshot = out / "pretraining" / "ltr" / "snapshots" / "step-3"
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text("{}")
        assert stages.pretrain(study, out, data_of, 6, None, Quiet(), pass_held=True) == ["ltr"]
        assert launched == [("bi", checkpoint)]


def test_the_time_left_counts_each_variants_pace_and_the_steps_a_resumed_run_has_done(data, tmp_path, monkeypatch):
    """The pre-training line's estimate: every run's steps still to train (a resumed run's from its last
    checkpoint) at its variant's seconds a step, from the finished runs' timing.json until this process has timed
    one of its own (it said "estimated after the first one", and counted a resumed run's done steps again)."""
    from bert_suite.ablation import launch, stages

    study, out = load_study(small_study(tmp_path, data, pretraining={"seeds": [42, 43, 44]})), tmp_path / "out"
    monkeypatch.setattr(launch, "recipe_overrides", lambda study, name, data, run, steps, **_: {
        "output_dir": str(run), "max_steps": steps, "train_data": "-", "tokenizer": "-"})

    def launch_recipe(overrides, log, timing, **_):
        run = Path(overrides["output_dir"])
        if run.name == "pre":  # 6 steps in 6,000 s
            (run / "final").mkdir(parents=True)
            (run / "final" / "config.json").write_text("{}")
            (run / "pretrain_results.json").write_text(json.dumps({"step": 6}))
            seconds = 6000.0
        elif not (run / "checkpoints").exists():  # seed 43, stopped after its checkpoint at step 3
            (run / "checkpoints" / "step-3").mkdir(parents=True)
            (run / "checkpoints" / "step-3" / "progress.json").write_text("{}")
            seconds = 3000.0
        else:  # resumed: 3 steps in 1,500 s
            seconds = 1500.0
        timing.write_text(json.dumps([{"seconds": seconds}]))
        return seconds

    monkeypatch.setattr(launch, "launch_recipe", launch_recipe)
    lines = []

    class Lines(stages.Progress):
        def stage(self, name, text):
            lines.append(text)

    stages.pretrain(study, out, {"pre": None}, 6, None, Lines(), seeds=[42, 43])
    lines.clear()
    stages.pretrain(study, out, {"pre": None}, 6, None, Lines())  # a new process: seed 42's pace from its timing
    starts = [line for line in lines if " to go; " in line]
    # seed 43 from step 3 and seed 44: (3 + 6) steps at 1,000 s; then seed 44's 6 at 7,500 s over the 9 timed
    assert starts == ["pre.seed43 (2 of 3: pre.seed43, pre.seed44 to go; 6 steps each, this one from step 3); "
                      "about 2h30m left", "pre.seed44 (3 of 3: pre.seed44 to go; 6 steps each); about 1h23m left"]
    assert stages.seconds_left([("ltr", 10), ("mlm", 10)], {"ltr": [20.0, 10]}) == 40  # mlm untimed: the mean
    assert stages.seconds_left([("ltr", 10), ("mlm", 10)], {"ltr": [30.0, 10], "mlm": [10.0, 10]}) == 40
    assert stages.seconds_left([("ltr", 10)], {}) is None
    # a run that started from another's checkpoint timed over its own steps; one trained elsewhere (its launches
    # name a device) and one whose record does not read are left out
    runs = {name: type("Run", (), {"variant": variant})() for name, variant in
            (("bi", "bi"), ("gpu", "gpu"), ("broken", "broken"))}
    paths = {name: tmp_path / "pace" / name for name in runs}
    for name, (results, timing) in {"bi": ({"step": 6, "started_from": {"step": 3}}, [{"seconds": 30.0}]),
                                    "gpu": ({"step": 6}, [{"seconds": 1.0, "device": "NVIDIA H200"}]),
                                    "broken": ({"step": 6}, [{"secs": 1.0}])}.items():
        (paths[name] / "final").mkdir(parents=True)
        (paths[name] / "final" / "config.json").write_text("{}")
        (paths[name] / "pretrain_results.json").write_text(json.dumps(results))
        (paths[name] / "timing.json").write_text(json.dumps(timing))
    assert stages.measured_pace(runs, paths) == {"bi": [30.0, 3]}
    # an unfinished run goes on from its own last checkpoint, even one before its donor's step
    (paths["bi"] / "checkpoints" / "step-2").mkdir(parents=True)
    (paths["bi"] / "checkpoints" / "step-2" / "progress.json").write_text("{}")
    assert stages.resume_step(paths["bi"], 3) == 2 and stages.resume_step(paths["gpu"], 3) == 3


def test_status_reads_where_a_study_stands_from_its_folder_alone(data, tmp_path, capsys):
    """`--status`: each run's state (done; training under another process's lock, at the pace of its launch under
    way; stopped at its checkpoint; not started, its first steps a donor's), the pre-training time left, and the
    grids done and under way, a biphasic run's copied snapshot not counted as a grid of its own; nothing written."""
    from bert_suite.ablation.locks import variant_lock

    path = small_study(tmp_path, data, variants={
        "ltr": {"use_nsp": False, "causal_attention": True}, "bi": {"causal_fraction": 0.5}, "pre": None,
        "random": None}, pretraining={"seeds": [42, 43]}, compare={"baseline": "bi"},
        curve={"variants": ["ltr", "bi"], "tasks": ["rte"]},
        contrasts=[{"first": "bi", "second": "ltr", "label": "biphasic against ltr"}])
    out = tmp_path / "out"
    assert run(path, "--output_dir", out, "--status") == 2
    assert "no study there yet" in capsys.readouterr().err
    (out / "stages").mkdir(parents=True)
    runs = out / "pretraining"
    for name, results, seconds in (("ltr", {"step": 6}, 600.0), ("bi", {"step": 6, "started_from": {"step": 3}}, 90.0)):
        (runs / name / "final").mkdir(parents=True)
        (runs / name / "final" / "config.json").write_text("{}")
        (runs / name / "pretrain_results.json").write_text(json.dumps(results))
        (runs / name / "timing.json").write_text(json.dumps([{"seconds": seconds, "finished": "then"}]))
    (runs / "bi" / "started_from.json").write_text("{}")  # the recipe's record: bi's first 3 steps are ltr's
    under_way = runs / "ltr.seed43"  # resumed from its step-3 checkpoint: one step in 120 s (the finished ltr: 100 s)
    (under_way / "checkpoints" / "step-3").mkdir(parents=True)
    (under_way / "checkpoints" / "step-3" / "progress.json").write_text("{}")
    (under_way / "snapshots" / "step-3").mkdir(parents=True)  # the curve's snapshot, which bi.seed43 will copy
    (under_way / "snapshots" / "step-3" / "config.json").write_text("{}")
    (under_way / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (2, 4)))
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - 120))
    (under_way / "timing.json").write_text(json.dumps([{"seconds": 900.0, "finished": "then"},
                                                      {"seconds": 120.0, "started": started}]))
    (out / "logs").mkdir()
    (out / "logs" / "pretraining-ltr.seed43.log").write_text(
        "$ launch\nstep 1 of 6\n$ launch\nresumed from checkpoints/step-3 at step 3\nstep 4 of 6\n")
    for folder, files in {"compare/rte/ltr": ["best_trial.json"],
                          "compare/rte/bi": ["trials/trial-000/all_results.json", "trials/trial-001/all_results.json"],
                          "curve/rte/ltr@3": ["grid.db"]}.items():
        for file in files:
            (out / folder / file).parent.mkdir(parents=True, exist_ok=True)
            (out / folder / file).write_text("{}")
    with variant_lock(out, "ltr.seed43"):
        before = sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*"))
        assert run(path, "--output_dir", out, "--status") == 0
        assert sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*")) == before
    from bert_suite.ablation.status import study_status

    status = study_status(path, out)
    state = {r["run"]: (r["state"], r["step"]) for r in status["runs"]}
    assert state == {"ltr": ("done", 6), "bi": ("done", 6), "ltr.seed43": ("stopped", 4),
                     "bi.seed43": ("not started", 0)}
    assert status["runs"][3]["starts_from"] == {"run": "ltr.seed43", "step": 3}
    # ltr.seed43's 3 steps at 120 s (its launch under way) and bi.seed43's 3 after the switch at 30 s
    assert status["pace"]["bi"] == {"seconds_per_step": 30.0, "from": "the finished runs"}
    assert status["pretraining_seconds_left"] == 3 * 100 + 3 * 30  # no process holds it now: the finished ltr's
    assert status["grids"] == {"compare": {"grids": 4, "done": 1, "under_way": 1, "trials": 2},
                               "curve": {"grids": 2, "done": 0, "under_way": 1, "trials": 0}}
    printed = capsys.readouterr().out.splitlines()
    assert run(path, "--output_dir", out, "--status", "json") == 0  # the same, as one JSON object for scripts
    assert json.loads(capsys.readouterr().out) == status
    # a fresh interpreter reads it without torch or transformers (17 s of imports on a slow CPU, for a glance)
    fresh = subprocess.run([sys.executable, "-c", (
        "import json, sys\nfrom bert_suite_cli import main\n"
        f"code = main(['ablation', {str(path)!r}, '--output_dir', {str(out)!r}, '--status', 'json'])\n"
        "print(json.dumps([m for m in ('torch', 'transformers', 'datasets', 'optuna') if m in sys.modules]))\n"
        "sys.exit(code)")], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    *printed_json, heavy = fresh.stdout.strip().splitlines()
    assert json.loads("\n".join(printed_json)) == status and json.loads(heavy) == []
    assert run(path, "--output_dir", out, "--status") == 0
    unheld = capsys.readouterr().out
    assert main(["ablation", "--status", str(path), "--output_dir", str(out)]) == 0  # --status before the file
    assert capsys.readouterr().out == unheld
    assert main(["ablation", "--status", "json", str(path), "--output_dir", str(out)]) == 0
    assert json.loads(capsys.readouterr().out) == status
    assert main(["ablation", "--status", "html", str(path), "--output_dir", str(out)]) == 2  # a format it lacks
    assert "invalid choice: 'html'" in capsys.readouterr().err
    assert printed[1] == ("pre-training, 6 steps a run: 2 of 4 runs done; about 7 min of pre-training left in all "
                          "(runs side by side share it; at the pace of each variant's run under way, else of its "
                          "finished runs)")
    assert re.fullmatch(r"  ltr\.seed43 +training +4  checkpoint 3; 0\.5 steps a minute; process \d+ on .+", printed[4])
    assert printed[5] == "  bi.seed43   not started         0  its first 3 steps are ltr.seed43's"
    assert printed[6] == "fine-tuning grids: compare: 1 of 4 done, 1 under way; curve: 0 of 2 done, 1 under way (2 " \
                         "trials finished)"
    # a launch in its first two minutes has no pace of its own yet (the finished ltr's); past them, the step it
    # began at is its timing entry's from_step where the launcher wrote one, else its log's line, else step 0
    timing = json.loads((under_way / "timing.json").read_text())
    with variant_lock(out, "ltr.seed43"):
        (under_way / "timing.json").write_text(json.dumps(timing[:1] + [{"seconds": 60.0}]))
        assert study_status(path, out)["pace"]["ltr"] == {"seconds_per_step": 100.0, "from": "the finished runs"}
        (under_way / "timing.json").write_text(json.dumps(timing[:1] + [{"seconds": 120.0, "from_step": 2}]))
        assert study_status(path, out)["runs"][2]["steps_per_minute"] == 1.0  # steps 2 to 4 in two minutes
        (out / "logs" / "pretraining-ltr.seed43.log").write_text("$ launch\nresumed from x at step 3\n$ launch\n")
        (under_way / "timing.json").write_text(json.dumps(timing[:1] + [{"seconds": 240.0}]))
        assert study_status(path, out)["runs"][2]["steps_per_minute"] == 1.0  # from step 0: 4 steps in four minutes
    # a holder on another machine trains the run while its timing.json is kept fresh (never probed from here)
    lock = out / "pretraining" / ".ltr.seed43.lock"
    lock.write_text(json.dumps({"pid": 1, "host": "another-machine", "since": "then"}))
    assert study_status(path, out)["runs"][2]["state"] == "training"
    os.utime(under_way / "timing.json", (time.time() - 600, time.time() - 600))
    assert study_status(path, out)["runs"][2]["state"] == "stopped"
    # a holder line left by a process that died (killed before it let go): no process on the run
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    os.utime(under_way / "timing.json")
    lock.write_text(json.dumps({"pid": int(dead.stdout), "host": os.uname().nodename, "since": "then"}))
    assert study_status(path, out)["runs"][2]["state"] == "stopped"
    # bi trained its first steps itself (no started_from.json, nor in its record): its snapshot is a grid of its own;
    # a run installed from another machine has only its record's; with bi first in the curve's order, the copies'
    # grids are bi's
    (runs / "bi" / "started_from.json").unlink()
    (runs / "bi" / "pretrain_results.json").write_text(json.dumps({"step": 6}))
    assert study_status(path, out)["grids"]["curve"]["grids"] == 3
    (runs / "bi" / "pretrain_results.json").write_text(json.dumps({"step": 6, "started_from": {"step": 3}}))
    assert study_status(path, out)["grids"]["curve"]["grids"] == 2
    (out / "curve" / "rte" / "bi@3").mkdir()
    (out / "curve" / "rte" / "bi@3" / "best_trial.json").write_text("{}")
    first = tmp_path / "bi-first"
    first.mkdir()
    raw = yaml.safe_load(path.read_text())
    raw["curve"]["variants"] = ["bi", "ltr"]
    (first / "study.yaml").write_text(yaml.safe_dump(raw))
    assert study_status(first / "study.yaml", out)["grids"]["curve"] == {"grids": 2, "done": 1, "under_way": 0,
                                                                         "trials": 0}
    # random twins of the same config and vocabulary files share one grid (compare's same_models): the two finished
    # seed-42 runs' files are alike, so one of their twins takes the other's grids; the seed-43 twins are their own
    twins = tmp_path / "twins"
    twins.mkdir()
    raw["variants"].update(ltr_random={"from": "ltr", "random_init": True}, bi_random={"from": "bi", "random_init": True})
    (twins / "study.yaml").write_text(yaml.safe_dump(raw))
    assert study_status(twins / "study.yaml", out)["grids"]["compare"]["grids"] == 8 - 1


def test_status_counts_a_biphasic_run_whole_when_its_donors_checkpoint_is_gone_and_refuses_another_studys_folder(
        data, tmp_path, capsys):
    """A biphasic run not started whose donor finished without its checkpoint at the switch trains every step
    itself (the study's reused_start): --status names no start and counts all its steps. A run started from
    another's checkpoint ("started from ... at step N") is paced from that step. A folder whose records name other
    steps, another run or a finished run of other steps is another study's: one line says so."""
    from bert_suite.ablation.status import current_launch, study_status

    path = small_study(tmp_path, data, variants={
        "ltr": {"use_nsp": False, "causal_attention": True}, "bi": {"causal_fraction": 0.5}, "pre": None,
        "random": None}, compare={"baseline": "bi"}, curve=None,
        contrasts=[{"first": "bi", "second": "ltr", "label": "biphasic against ltr"}])
    out, runs = tmp_path / "out", tmp_path / "out" / "pretraining"
    (out / "stages").mkdir(parents=True)
    (runs / "ltr" / "final").mkdir(parents=True)
    (runs / "ltr" / "final" / "config.json").write_text("{}")
    (runs / "ltr" / "pretrain_results.json").write_text(json.dumps({"step": 6}))
    (runs / "ltr" / "timing.json").write_text(json.dumps([{"seconds": 60.0, "finished": "then"}]))
    status = study_status(path, out)
    assert "starts_from" not in status["runs"][1] and status["pretraining_seconds_left"] == 6 * 10.0
    (runs / "ltr" / "checkpoints" / "step-3").mkdir(parents=True)  # kept for bi (no curve: no snapshots needed)
    (runs / "ltr" / "checkpoints" / "step-3" / "progress.json").write_text("{}")
    status = study_status(path, out)
    assert status["runs"][1]["starts_from"] == {"run": "ltr", "step": 3} and status["pretraining_seconds_left"] == 30.0

    (runs / "bi" / "metrics.jsonl").parent.mkdir(parents=True)
    (runs / "bi" / "metrics.jsonl").write_text(json.dumps({"step": 5}) + "\n")
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - 600))
    (runs / "bi" / "timing.json").write_text(json.dumps([{"seconds": 590.0, "started": started}]))
    log = tmp_path / "bi.log"
    log.write_text("$ launch\nstarted from ltr/checkpoints/step-3 at step 3 (another run's checkpoint)\n")
    seconds, steps = current_launch(runs / "bi", log)
    assert steps == 2 and 590 <= seconds < 650

    assert main(["ablation", str(path), "--output_dir", str(out), "--status", "--variant", "bi"]) == 2
    assert "--status reads the folder only" in capsys.readouterr().err
    for records, why in (({"ltr": {"max_steps": 8, "seed": 42}}, "pretraining-ltr.json: max_steps 8 (the study: 6)"),
                         ({"mlm": {"max_steps": 6}}, "its runs (mlm) are none of this study's (ltr, bi)")):
        for name, recipe in records.items():
            (out / "stages" / f"pretraining-{name}.json").write_text(json.dumps({"settings": {"recipe": recipe}}))
        assert run(path, "--output_dir", out, "--status") == 2
        assert f"{why}; expected the folder this study file made" in capsys.readouterr().err
        for name in records:
            (out / "stages" / f"pretraining-{name}.json").unlink()
    # beside a record of one of its runs, a run since left out of the file is named, not refused (the study resumes)
    for name in ("ltr", "mlm"):
        (out / "stages" / f"pretraining-{name}.json").write_text(json.dumps({"settings": {"recipe": {"max_steps": 6}}}))
    assert study_status(path, out)["other_runs"] == ["mlm"]
    (runs / "ltr" / "pretrain_results.json").write_text(json.dumps({"step": 8}))
    assert run(path, "--output_dir", out, "--status") == 2
    assert "pretraining/ltr is a finished run of 8 steps, not the study's 6" in capsys.readouterr().err
    # the donor not finished, short of the switch: bi will start from its checkpoint when the study trains ltr
    # first (listed first, or held by a process), not when it comes to bi before ltr
    shutil.rmtree(runs / "ltr")
    assert study_status(path, out)["runs"][1]["starts_from"] == {"run": "ltr", "step": 3}
    raw = yaml.safe_load(path.read_text())
    raw["variants"] = {"bi": raw["variants"]["bi"], "ltr": raw["variants"]["ltr"]}
    (tmp_path / "bi-first").mkdir()
    (tmp_path / "bi-first" / "study.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    assert "starts_from" not in study_status(tmp_path / "bi-first" / "study.yaml", out)["runs"][0]


def test_a_variant_run_trains_its_free_runs_first_and_a_biphasic_run_waits_for_its_donors_checkpoint(
        data, tmp_path, monkeypatch):
    """`--variant bi other` while another process trains ltr (bi's donor): other first, then bi waits for ltr's
    checkpoint at the switch and starts there, rather than train ltr's steps again."""
    import threading

    from bert_suite.ablation import launch, stages
    from bert_suite.ablation.locks import variant_lock

    study, out = biphasic_study(tmp_path, data, other={"learning_rate": 1e-3}), tmp_path / "out"
    launched = []
    monkeypatch.setattr(stages, "DONOR_POLL", 0.05)
    monkeypatch.setattr(launch, "recipe_overrides", lambda study, name, data, run, steps, **_: {
        "output_dir": str(run), "max_steps": steps, "snapshot_steps": "3", "train_data": "-", "tokenizer": "-",
        "warmup_steps": 0, "phase1_fraction": 1})
    monkeypatch.setattr(launch, "launch_recipe", lambda overrides, log, timing, **_: launched.append(
        (Path(overrides["output_dir"]).name, overrides.get("start_from_checkpoint"))) or 1.0)
    checkpoint = out / "pretraining" / "ltr" / "checkpoints" / "step-3"

    def ltr_reaches_its_switch():
        time.sleep(0.5)
        (out / "pretraining" / "ltr" / "snapshots" / "step-3").mkdir(parents=True)
        (out / "pretraining" / "ltr" / "snapshots" / "step-3" / "config.json").write_text("{}")
        checkpoint.mkdir(parents=True)
        (checkpoint / "progress.json").write_text("{}")

    with variant_lock(out, "ltr"):
        writer = threading.Thread(target=ltr_reaches_its_switch)
        writer.start()
        stages.pretrain(study, out, {"ltr": None, "bi": None, "other": None}, 6, ["bi", "other"], stages.Progress())
        writer.join()
    assert launched == [("other", None), ("bi", checkpoint)]


@pytest.mark.slow  # two pre-trainings and the GPU route's three commands (about a minute): make test-all
def test_a_study_pretrained_on_another_machine_comes_back_checked_and_is_found_pretrained(data, tmp_path):
    """tools/gpu_study_pretraining.sh's files at toy size on the CPU: `collect` packs the records and the model
    in bf16 of each of the variant's runs (one a pre-training seed), `install` puts them into another folder of the
    same study (weights back in fp32, each run at its seed), where the study finds them pre-trained and launches
    nothing; a folder whose vocabulary differs refuses them."""
    transfer = [sys.executable, str(REPO / "tools" / "study_transfer.py")]
    study = small_study(tmp_path, data, curve=None, pretraining={"checkpoints": None, "seeds": [42, 43]})
    work, back, here = tmp_path / "work", tmp_path / "back", tmp_path / "here"
    work.mkdir()
    assert subprocess.run([*transfer, "folders", str(study), str(work / "folders.json"), "pre"],
                          capture_output=True, text=True, check=True).stdout.split() == ["pre"]
    assert run(study, "--output_dir", work / "pre", "--until", "pretraining", "--variant", "pre") == 0
    subprocess.run([*transfer, "collect", str(study), str(work), str(back), "--variants", "pre"], check=True,
                   capture_output=True)
    assert sorted(p.name for p in back.iterdir()) == ["models-1.tar.gz", "records.tar.gz"]
    theirs = {name: load_file(str(work / "pre" / "pretraining" / name / "final" / "model.safetensors"))
              for name in ("pre", "pre.seed43")}
    assert not all(torch.equal(theirs["pre"][k], theirs["pre.seed43"][k]) for k in theirs["pre"])  # two seeds
    shutil.rmtree(work)  # the other machine's paths are gone here
    for wrong, says in (("nosuch", "not a pre-trained variant or run"), ("random", "not a pre-trained variant")):
        refused = subprocess.run([*transfer, "install", str(study), str(here), str(back), "--variants", wrong],
                                 capture_output=True, text=True)
        assert refused.returncode != 0 and f"--variants {wrong}: {says}" in refused.stderr, refused.stderr
    installed = subprocess.run([*transfer, "install", str(study), str(here), str(back)], capture_output=True,
                               text=True)
    assert installed.returncode == 0, installed.stderr
    for name, weights in theirs.items():
        mine = load_file(str(here / "pretraining" / name / "final" / "model.safetensors"))
        assert all(mine[k].dtype == torch.float32 and torch.equal(mine[k], v.bfloat16().float())
                   for k, v in weights.items()), name
        assert json.loads((here / "stages" / f"pretraining-{name}.json").read_text())["settings"]["recipe"]["seed"] == \
            {"pre": 42, "pre.seed43": 43}[name]
    assert run(study, "--output_dir", here, "--until", "pretraining") == 0
    for name in theirs:
        assert len(json.loads((here / "pretraining" / name / "timing.json").read_text())) == 1, name  # no launch here
    from bert_suite.ablation import pretraining_record

    facts = pretraining_record(load_study(study), {n: here / "pretraining" / n for n in theirs}, None, 6)
    assert [facts["pre"]["by_seed"][s]["pretrained_on"] for s in ("42", "43")] == ["cpu", "cpu"]  # where collect ran
    record = here / "stages" / "pretraining-pre.json"  # installed again over a record that holds save_steps,
    written = json.loads(record.read_text())  # as installs wrote before it left the record: accepted
    assert "save_steps" not in written["settings"]["recipe"]
    written["settings"]["recipe"]["save_steps"] = 1
    record.write_text(json.dumps(written))
    again = subprocess.run([*transfer, "install", str(study), str(here), str(back)], capture_output=True, text=True)
    assert again.returncode == 0 and "moved to" in again.stdout, again.stderr
    (tmp_path / "other").mkdir()
    other = small_study(tmp_path / "other", data, curve=None, pretraining={"checkpoints": None, "seeds": [42, 43]},
                        vocabulary={"vocab_size": 50})
    refused = subprocess.run([*transfer, "install", str(other), str(tmp_path / "there"), str(back)],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "was trained with another vocabulary" in refused.stderr


@pytest.mark.slow  # a pre-training, collect and install (about a minute): make test-all
def test_a_donor_pretrained_elsewhere_comes_back_with_the_snapshot_its_biphasic_run_on_the_curve_copies(data,
                                                                                                     tmp_path):
    """ltr is off the curve and bi, which starts from ltr's checkpoint, is on it: ltr pre-trained by its own
    process (as on a GPU) writes the snapshot bi copies, and `install` records it as the study's stage does, so
    the study finds ltr pre-trained here instead of refusing the record."""
    transfer = [sys.executable, str(REPO / "tools" / "study_transfer.py")]
    study = small_study(tmp_path, data, variants={
        "ltr": {"use_nsp": False, "causal_attention": True}, "bi": {"causal_fraction": 0.5}, "pre": None,
        "random": None}, compare={"baseline": "bi"}, curve={"variants": ["bi"], "tasks": ["rte"]},
        contrasts=[{"first": "bi", "second": "ltr", "label": "biphasic against ltr"}])
    work, back, here = tmp_path / "work", tmp_path / "back", tmp_path / "here"
    work.mkdir()
    assert run(study, "--output_dir", work / "ltr", "--until", "pretraining", "--variant", "ltr") == 0
    assert (work / "ltr" / "pretraining" / "ltr" / "snapshots" / "step-3").is_dir()  # for bi, not for ltr's own
    subprocess.run([*transfer, "collect", str(study), str(work), str(back), "--variants", "ltr"], check=True,
                   capture_output=True)
    installed = subprocess.run([*transfer, "install", str(study), str(here), str(back)], capture_output=True,
                               text=True)
    assert installed.returncode == 0, installed.stderr
    recorded = json.loads((here / "stages" / "pretraining-ltr.json").read_text())["settings"]["recipe"]
    assert recorded["snapshot_steps"] == "3"
    assert (here / "pretraining" / "ltr" / "snapshots" / "step-3" / "model.safetensors").is_file()
    assert run(study, "--output_dir", here, "--until", "pretraining", "--variant", "ltr") == 0
    assert len(json.loads((here / "pretraining" / "ltr" / "timing.json").read_text())) == 1  # nothing launched here


def data_study(tmp_path, data, **changes):
    return small_study(tmp_path, data, variants={
        "general": {"corpus": {"task_texts": []}}, "per_file": {"corpus": {"task_documents": "file"}},
        "per_example": {}, "random": {"from": "per_example", "random_init": True}, "pre": None},
        pretraining={"steps": 4, "checkpoints": None}, curve=None, compare={"baseline": "per_example", "seeds": [1, 2]},
        contrasts=[{"first": "per_example", "second": "general", "label": "what the task texts add"}], **changes)


def test_the_data_stages_of_variants_that_differ_in_data_are_built_once_per_setting(data, tmp_path):
    """The data stages alone (no pre-training): a folder per distinct corpus, vocabulary and instances, named
    after the first variant that carries them; the study's own keeps its folders; task texts as one document
    per file or per example."""
    from bert_suite.ablation.stages import Progress, build_data, task_data

    study, out = load_study(data_study(tmp_path, data)), tmp_path / "out"
    built = build_data(study, out, task_data(study, out, Progress()), Progress())
    assert {name: d.labels["corpus"] for name, d in built.items()} == {"general": "@general", "per_file": "@per_file",
                                                                       "per_example": ""}
    assert built["per_example"].instances == {32: out / "instances" / "32"}
    assert built["general"].vocab == out / "vocabulary@general" and built["per_file"].vocab == out / "vocabulary@per_file"
    per_file = (out / "corpus@per_file" / "tasks" / "rte-train.txt").read_text()
    assert "\n\n" not in per_file.strip() and "\n\n" in (out / "corpus" / "tasks" / "rte-train.txt").read_text()
    assert (out / "stages" / "corpus@general.json").is_file() and not (out / "corpus@per_example").exists()
    # a --variant run builds its variants' data alone, named as the whole run names it
    alone = tmp_path / "alone"
    built = build_data(study, alone, task_data(study, alone, Progress()), Progress(), only=["per_file"])
    assert list(built) == ["per_file"] and built["per_file"].vocab == alone / "vocabulary@per_file"
    assert sorted(p.name for p in alone.iterdir() if p.name != "stages") == ["corpus@per_file", "instances@per_file",
                                                                              "vocabulary@per_file"]


@pytest.mark.slow  # three pre-trainings and eight grids: make test-all; the data stages alone are tested above
def test_variants_that_differ_in_data_build_their_own_stages_share_the_rest_and_the_record_says_which(data, tmp_path):
    """The domain question as a study: the general text alone, with the task texts one document per task file,
    and one per example (the study's own corpus, shared by its random twin)."""
    study, out = data_study(tmp_path, data), tmp_path / "out"
    assert run(study, "--output_dir", out) == 0
    for folder in ("corpus", "corpus@general", "corpus@per_file", "vocabulary", "vocabulary@general",
                   "vocabulary@per_file", "instances/32", "instances@general/32", "instances@per_file/32"):
        assert (out / folder).is_dir(), folder
    assert not (out / "corpus@per_example").exists() and not (out / "corpus@random").exists()
    per_file = (out / "corpus@per_file" / "tasks" / "rte-train.txt").read_text()
    assert "\n\n" not in per_file.strip() and "\n\n" in (out / "corpus" / "tasks" / "rte-train.txt").read_text()
    record = json.loads((out / "ablation.json").read_text())
    facts = {name: f["data"] for name, f in record["pretraining"].items()}
    assert [facts[n]["corpus"] for n in ("general", "per_file", "per_example")] == ["corpus@general",
                                                                                   "corpus@per_file", "corpus"]
    # the task file as one document: 80 RTE documents fewer than one per example (as a document of two lines)
    assert facts["per_example"]["documents"] - facts["per_file"]["documents"] == 80 - 1
    assert facts["general"]["documents"] < facts["per_file"]["documents"]
    assert facts["general"]["corpus_tokens"] < facts["per_example"]["corpus_tokens"]
    assert all(0 < f["not_next_share"] < 1 and f["vocab_size"] > 5 for f in facts.values())
    run_config = json.loads((out / "pretraining" / "general" / "pretrain_results.json").read_text())["config"]
    assert run_config["train_data"] == str(out / "instances@general" / "32")
    assert "## Data" in (out / "ablation.md").read_text()
    assert set(record["contrasts"]["what the task texts add"]) == {"rte"}


def test_the_figure_draws_each_variant_in_its_bars_colour_and_curves_with_equal_points_both_in_view(tmp_path,
                                                                                                    monkeypatch):
    """A biphasic variant's first curve points are its donor's: drawn the same way, one line hid the other,
    and the curve panels took colours in their own order, not the bars'."""
    from matplotlib.colors import to_hex

    from bert_suite.ablation import record as record_module

    def entry(mean):
        return {"mean": mean, "se": 0.5, "scores": [mean] * 3, "setting": {}}

    models = ["a", "b", "c"]
    record = {"models": {m: {} for m in models}, "seeds": [1, 2, 3],
              "tasks": {"rte": {"metric": "accuracy", "models": {m: entry(50.0 + k) for k, m in enumerate(models)}}},
              "curve": {"c": {"rte": [{"step": 5, "mean": 50.0, "se": 0.5}, {"step": 10, "mean": 52.0, "se": 0.5}]},
                        "b": {"rte": [{"step": 5, "mean": 50.0, "se": 0.5}, {"step": 10, "mean": 51.0, "se": 0.5}]}}}
    figures = []
    monkeypatch.setattr(record_module, "save_figure", lambda fig, path: figures.append(fig) or path)
    record_module.plot(record, tmp_path / "ablation.png")
    bar_axes, curve_axes = figures[0].axes
    bar_colour = {container.get_label(): to_hex(container.patches[0].get_facecolor())
                  for container in bar_axes.containers if container.get_label() in models}
    lines = {c.get_label(): c.lines[0] for c in curve_axes.containers if c.get_label() in models}  # errorbar's
    assert set(lines) == {"b", "c"}
    assert {name: to_hex(line.get_color()) for name, line in lines.items()} == {n: bar_colour[n] for n in lines}
    assert lines["c"].get_linestyle() != lines["b"].get_linestyle()
    assert lines["c"].get_markersize() != lines["b"].get_markersize()


def test_the_two_sources_of_noise_count_the_pre_trained_variants_not_a_random_twins_draws():
    """The table of standard deviations is about pre-training: a random twin's spread across its draws (here
    large) stays out of the root mean square over the variants."""
    from bert_suite.ablation.record import spread_rows

    models = {"pre": {"sd_pretraining": 3.0, "sd_finetuning": 1.0},
              "mlm": {"sd_pretraining": 4.0, "sd_finetuning": 2.0},
              "random": {"sd_pretraining": 30.0, "sd_finetuning": 20.0}, "one": {"scores": [1.0, 2.0]}}
    record = {"models": {"pre": {}, "mlm": {}, "random": {"random_init": True}, "one": {}},
              "tasks": {"rte": {"models": models}}}
    assert spread_rows(record) == [["rte", f"{12.5 ** 0.5:.2f}", f"{2.5 ** 0.5:.2f}", "2"]]  # rms of (3, 4), (1, 2)
