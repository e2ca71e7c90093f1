"""`bert-suite compare`: two tiny models (one pre-trained here on a test corpus, one its random twin) on two tasks
(a GLUE-like pair task and SQuAD-small) with two seeds: the files' shapes, the paired statistics against numbers
computed by hand and from the grids' own results, a kill mid-grid resumed to the same compare.json, and one
clear error per bad input with nothing written."""

import csv
import json
import math
import os
import random
import re
import subprocess
import sys

import pytest
import torch

from bert_suite import faults
from bert_suite.cards import load_card
from bert_suite.cli import main as cli_main
from bert_suite.compare import CompareError, Model, Task, build_result, markdown
from bert_suite.pretraining.instances import build_pretraining_dataset
from bert_suite.runner import ModelSpec, RunError, load_model
from helpers import (
    REPO,
    SQUAD_VOCAB,
    WORDS,
    count_kept_steps,
    fresh_state,
    load_recipe,
    recipe_args,
    write_rte_like,
    write_squad_like,
)

SEEDS = ["1", "2"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """data/RTE (pair task), data/squad_small (span task), a vocabulary with both tasks' words, and a tiny model
    pre-trained for a few steps on a corpus of those words."""
    tmp = tmp_path_factory.mktemp("compare")
    write_rte_like(tmp / "data" / "RTE", n_train=64, n_dev=32)
    write_squad_like(tmp / "data" / "squad_small", version_2=False, n_train=64, n_dev=24)
    words = list(dict.fromkeys([*SQUAD_VOCAB[5:], *WORDS, "."]))
    (tmp / "vocab.txt").write_text("\n".join([*SQUAD_VOCAB[:5], *words]) + "\n")
    rng = random.Random(0)
    docs = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) for _ in range(5)) for _ in range(40)]
    (tmp / "corpus.txt").write_text("\n\n".join(docs) + "\n")
    for length in (32, 64):
        build_pretraining_dataset([str(tmp / "corpus.txt")], str(tmp / "vocab.txt"), str(tmp / f"data{length}"),
                                  max_seq_length=length, dupe_factor=2, fmt="lines")
    fresh_state()
    load_recipe().main(recipe_args(tmp, tmp / "pretrain", "max_steps=12", "save_steps=1000"))
    return tmp


def compare_args(setup, out, *extra):
    model = str(setup / "pretrain" / "final")
    return ["compare", "--model", f"pre={model}", "--model", f"random=random:{model}", "--baseline", "random",
            "--task", "rte", "squad_small@48", "--data_dir", str(setup / "data"), "--seeds", *SEEDS,
            "--learning_rates", "1e-3", "--batch_sizes", "16", "--epochs", "1", "--max_seq_length", "72",
            "--output_dir", str(out), "--disable_tqdm", "true", *extra]


def rte_args(setup, out, *models):
    """compare_args on the pair task alone, with these --model values (all of compare_args' by default)."""
    args = compare_args(setup, out)
    args[args.index("--task") + 1: args.index("--task") + 3] = ["rte"]
    if models:
        args[1:5] = [flag for model in models for flag in ("--model", model)]
    return args


@pytest.fixture(scope="module")
def compared(setup):
    out = setup / "out"
    assert cli_main(compare_args(setup, out)) == 0
    return out


def test_compare_json_has_the_issues_shape_and_the_table_and_plot_are_written(setup, compared):
    result = json.loads((compared / "compare.json").read_text())
    assert list(result) == ["baseline", "seeds", "models", "tasks"]
    assert result["baseline"] == "random" and result["seeds"] == [1, 2]
    model = str(setup / "pretrain" / "final")
    assert result["models"] == {"pre": {"path": model, "random_init": False, "bilstm": False},
                                "random": {"path": model, "random_init": True, "bilstm": False}}
    assert list(result["tasks"]) == ["rte", "squad_small@48"]
    assert (result["tasks"]["rte"]["metric"], result["tasks"]["rte"]["labels"]) == ("accuracy", None)
    assert (result["tasks"]["squad_small@48"]["metric"], result["tasks"]["squad_small@48"]["labels"]) == ("f1", 48)
    for entry in result["tasks"].values():
        assert list(entry) == ["metric", "labels", "models", "vs_baseline"]
        for scores in entry["models"].values():  # one checkpoint a model: today's shape, its seeds keyed "1"
            assert list(scores) == ["setting", "scores", "mean", "se", "pretraining_scores"]
            assert scores["pretraining_scores"] == {"1": scores["scores"]}
            assert scores["setting"] == {"learning_rate": 1e-3, "batch_size": 16, "epochs": 1.0}
            assert len(scores["scores"]) == 2 and all(0 <= s <= 100 for s in scores["scores"])
        assert list(entry["vs_baseline"]) == ["pre"]
        versus = entry["vs_baseline"]["pre"]
        assert {"difference", "se", "ci95", "df", "scope", "verdict"} <= set(versus)
        assert (versus["df"], versus["scope"]) == (1, "checkpoints") and versus["verdict"] in ("ahead", "behind", "level")
    table = (compared / "compare.md").read_text().splitlines()
    assert table[2] == "| model | rte (accuracy) | squad_small@48 (f1) |"
    assert table[4].startswith("| pre | ") and "(baseline)" in table[5]
    assert (compared / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the label subset: the squad grids trained on the first 48 questions
    manifest = json.loads((compared / "squad_small@48" / "pre" / "run_manifest.json").read_text())
    assert manifest["max_samples"]["train"] == 48


def test_the_statistics_are_those_of_the_grids_own_results(compared):
    """Per-seed scores at the chosen setting (x100), their mean and SE, and the paired difference recomputed
    from each grid's grid_results.csv."""
    result = json.loads((compared / "compare.json").read_text())
    for task, column in (("rte", "eval_accuracy"), ("squad_small@48", "eval_f1")):
        per_model = {}
        for name in ("pre", "random"):
            with open(compared / task / name / "grid_results.csv", newline="") as f:
                rows = {int(r["seed"]): 100 * float(r[column]) for r in csv.DictReader(f)}
            per_model[name] = [rows[1], rows[2]]
            entry = result["tasks"][task]["models"][name]
            assert entry["scores"] == pytest.approx(per_model[name])
            assert entry["mean"] == pytest.approx(sum(per_model[name]) / 2)
            assert entry["se"] == pytest.approx(abs(per_model[name][0] - per_model[name][1]) / 2)  # sd/sqrt(2)
        diffs = [a - b for a, b in zip(per_model["pre"], per_model["random"], strict=True)]
        versus = result["tasks"][task]["vs_baseline"]["pre"]
        half = 12.706204736174698 * abs(diffs[0] - diffs[1]) / 2  # t(0.975, 1 degree of freedom) x SE
        assert versus["difference"] == pytest.approx(sum(diffs) / 2)
        assert versus["ci95"] == pytest.approx([sum(diffs) / 2 - half, sum(diffs) / 2 + half])


def test_a_kill_mid_grid_resumes_to_the_same_compare_json(setup, compared, tmp_path):
    """On the pair task alone (its two grids; SQuAD-small's would double the time): killed in the second grid and
    rerun, the comparison is the uninterrupted run's, number for number."""
    out = tmp_path / "killed"
    args = rte_args(setup, out)
    env = {**os.environ, faults.ENV: "grid.trial_told:3", "HF_HUB_OFFLINE": "1"}
    killed = subprocess.run([sys.executable, "-m", "bert_suite.cli", *args], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (out / "compare.json").exists() and (out / "rte" / "random").is_dir()  # died in the second grid
    assert cli_main(args) == 0
    resumed, whole = (json.loads((folder / "compare.json").read_text()) for folder in (out, compared))
    assert list(resumed["tasks"]) == ["rte"] and resumed["tasks"]["rte"] == whole["tasks"]["rte"]
    assert {k: v for k, v in resumed.items() if k != "tasks"} == {k: v for k, v in whole.items() if k != "tasks"}


def test_a_random_twin_with_the_same_config_and_vocabulary_is_one_model_and_gets_one_grid(setup, tmp_path):
    """Two random-init models whose config and tokenizer files are the same bytes (two corpora's random twins
    with one vocabulary) are one model: the second gets the first's grid instead of its own, and the record says
    so. The premise checked: the twin's own grid gives the same scores. A twin whose vocabulary differs is its
    own model."""
    import shutil

    from bert_suite.compare import data_dirs_of, grid_scores, grid_space, resolve_task, same_models

    model = setup / "pretrain" / "final"
    copy = tmp_path / "copy"
    shutil.copytree(model, copy)
    out = tmp_path / "out"
    args = rte_args(setup, out, f"random=random:{model}", f"twin=random:{copy}")
    assert cli_main(args) == 0
    result = json.loads((out / "compare.json").read_text())
    assert result["models"]["twin"]["same_as"] == "random" and "same_as" not in result["models"]["random"]
    assert result["tasks"]["rte"]["models"]["twin"] == result["tasks"]["rte"]["models"]["random"]
    assert not (out / "rte" / "twin").exists() and (out / "rte" / "random" / "grid_results.csv").is_file()
    assert "twin is the same model as random" in (out / "compare.md").read_text()

    twin = Model("twin", f"random:{copy}", str(copy), True, False)
    task = resolve_task("rte", data_dirs_of([str(setup / "data")]))
    space = grid_space(task, [int(s) for s in SEEDS], learning_rates=[1e-3], batch_sizes=[16], epochs=[1])
    own = grid_scores(task, twin, space, tmp_path / "own", max_seq_length=72, overrides={"disable_tqdm": True})
    scores = [100 * own[next(iter(own))][int(s)] for s in SEEDS]
    assert scores == pytest.approx(result["tasks"]["rte"]["models"]["random"]["scores"])

    tokenizer = json.loads((copy / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"]["extra"] = len(tokenizer["model"]["vocab"])  # one more word: another vocabulary
    (copy / "tokenizer.json").write_text(json.dumps(tokenizer))
    models = {"random": Model("random", f"random:{model}", str(model), True, False), "twin": twin}
    assert same_models(models, "random") == {} and same_models({**models, "bilstm": Model(
        "bilstm", f"random:{model}", str(model), True, True)}, "twin") == {}
    assert same_models({"a": models["random"], "b": Model("b", f"random:{model}", str(model), True, False)}, "b") \
        == {"a": "b"}  # the baseline is the one kept


def test_the_setting_chosen_by_its_mean_and_a_row_of_several_pre_trainings_paired_by_position():
    card = type("Card", (), {"name": "t"})()
    tasks = {"t": Task("t", card, None, "accuracy", None)}
    models = {n: Model(n, f"/m/{n}", f"/m/{n}", False, False) for n in ("a", "b")}
    # a: (1e-4) has the best single trial (0.9) but mean 0.6; (3e-4) mean 0.7 wins; b: one setting
    found = {"t": {"a": {(1e-4, 32, 3.0): {1: 0.9, 2: 0.3}, (3e-4, 32, 3.0): {1: 0.7, 2: 0.7}},
                   "b": {(1e-4, 32, 3.0): {1: 0.5, 2: 0.6}}}}
    result = build_result("b", [1, 2], models, tasks, found)
    entry = result["tasks"]["t"]["models"]["a"]
    assert entry["setting"] == {"learning_rate": 3e-4, "batch_size": 32, "epochs": 3.0}
    assert entry["scores"] == pytest.approx([70.0, 70.0]) and entry["se"] == 0.0
    assert result["tasks"]["t"]["vs_baseline"]["a"]["difference"] == pytest.approx(15.0)
    text = markdown(result, vocabularies={"a": (100, "x" * 64), "b": (200, "y" * 64)})
    assert "do not share one vocabulary" in text and "a: 100 tokens" in text
    assert "these checkpoints: SE over 2 fine-tuning seeds" in text

    # two pre-trainings a row (a.2, b.2): the setting by the mean over both and every seed; the SE over the two
    models = {n: Model(n, f"/m/{n}", f"/m/{n}", False, False, n.split(".")[0], "2" if "." in n else "1")
              for n in ("a", "a.2", "b", "b.2")}
    found = {"t": {"a": {(1e-4, 32, 3.0): {1: 0.9, 2: 0.3}, (3e-4, 32, 3.0): {1: 0.7, 2: 0.7}},
                   "a.2": {(1e-4, 32, 3.0): {1: 0.8, 2: 0.8}, (3e-4, 32, 3.0): {1: 0.5, 2: 0.5}},
                   "b": {(1e-4, 32, 3.0): {1: 0.5, 2: 0.6}}, "b.2": {(1e-4, 32, 3.0): {1: 0.4, 2: 0.5}}}}
    result = build_result("b", [1, 2], models, tasks, found)
    entry = result["tasks"]["t"]["models"]["a"]  # (1e-4): mean 0.7 over 4 runs beats (3e-4)'s 0.6
    assert entry["setting"]["learning_rate"] == 1e-4
    assert {k: pytest.approx(v) for k, v in entry["pretraining_scores"].items()} == {"1": [90.0, 30.0], "2": [80.0, 80.0]}
    assert entry["scores"] == pytest.approx([60.0, 80.0]) and entry["mean"] == pytest.approx(70.0)
    assert entry["se"] == pytest.approx(10.0) and entry["sd_pretraining"] == pytest.approx(math.sqrt(200))
    assert result["models"]["a"]["checkpoints"] == ["/m/a", "/m/a.2"]
    versus = result["tasks"]["t"]["vs_baseline"]["a"]  # d_s: 60 - 55 = 5, 80 - 45 = 35
    assert (versus["difference"], versus["df"], versus["scope"]) == (pytest.approx(20.0), 1, "recipes")
    text = markdown(result)
    assert "SE over 2 pre-trainings x 2 fine-tuning seeds" in text and "ahead in 2 of 2" in text


def test_random_and_bilstm_prefixes_load_what_they_name(setup):
    model = str(setup / "pretrain" / "final")
    card = load_card("rte")
    torch.manual_seed(0)
    trained, twin = load_model(card, model, 32), load_model(card, f"random:{model}", 32)
    assert trained.config.vocab_size == twin.config.vocab_size and not twin.config.bilstm
    embeddings = "bert.embeddings.word_embeddings.weight"
    assert not torch.equal(trained.state_dict()[embeddings], twin.state_dict()[embeddings])
    both = load_model(card, f"bilstm:random:{model}", 32)
    assert both.config.bilstm and both.bert.bilstm is not None
    assert ModelSpec.parse(f"random:bilstm:{model}") == ModelSpec(model, random=True, bilstm=True)
    with pytest.raises(RunError, match="a preset is random weights already"):
        ModelSpec.parse("random:preset:tiny")


def test_each_draw_of_a_row_of_random_twins_keeps_the_prefixes_it_was_given():
    """A row of several random twins gets a draw per checkpoint (random@K) and keeps a BiLSTM in every draw,
    whichever prefix comes first (the first checkpoint's spelling unchanged, so its grid resumes)."""
    from bert_suite.compare import parse_models

    for given in ("bilstm:random:{}", "random:bilstm:{}", "random@1:bilstm:{}", "bilstm:random@1:{}"):
        models = parse_models(["pre=a,b,c", "twin=" + ",".join(given.format(p) for p in "abc")])
        specs = [ModelSpec.parse(models[label].model) for label in ("twin", "twin.2", "twin.3")]
        assert specs == [ModelSpec(p, random=True, bilstm=True, draw=k) for k, p in enumerate("abc", start=1)]
        assert models["twin"].model == given.format("a")
    for first in ("random", "random@1"):  # the strings of before, so the grids of a row of twins resume
        models = parse_models(["pre=a,b", f"r={first}:a,{first}:b"])
        assert [models[k].model for k in ("r", "r.2")] == [f"{first}:a", "random@2:b"]
    # a draw number given where another checkpoint of the row draws it: one draw twice, two grids of one model
    for given, message in (("random@2:a,random:a", "random:a, checkpoint 2 of a row of random twins, is drawn as "
                                                   "random@2:a, the draw random@2:a names already; expected each draw "
                                                   "once"),
                           ("bilstm:random@2:a,random:bilstm:a", "random:bilstm:a, checkpoint 2 of a row of random "
                                                                 "twins, is drawn as random@2:bilstm:a, the draw "
                                                                 "bilstm:random@2:a names already"),
                           ("random@2:a,random@1:a", "random@1:a, checkpoint 2 of a row of random twins, is drawn as "
                                                     "random@2:a"),
                           ("random:a,random:a", "random:a is given twice; expected each pre-training's checkpoint "
                                                 "once")):
        with pytest.raises(CompareError) as err:
            parse_models(["pre=a,b", f"r={given}"])
        assert str(err.value).startswith(f"--model r={given}: {message}"), err.value


def test_several_pre_trainings_a_model_pair_by_position_and_a_random_twin_draws_once_per_checkpoint(setup, tmp_path):
    """Two recipes of two checkpoints each (the pre-trained model from two seeds, and its random twin): a grid per
    checkpoint, the scores per pre-training, the verdict about the recipes (SE over the two pre-trainings), and a
    random twin of two checkpoints of one config that is two draws, not one model twice."""
    second = tmp_path / "pretrain-seed7"
    fresh_state()
    load_recipe().main(recipe_args(setup, second, "max_steps=12", "save_steps=1000", "seed=7"))
    first = setup / "pretrain" / "final"
    out = tmp_path / "out"
    args = rte_args(setup, out, f"pre={first},{second / 'final'}", f"random=random:{first},random:{second / 'final'}")
    assert cli_main(args) == 0
    result = json.loads((out / "compare.json").read_text())
    assert result["models"]["pre"]["checkpoints"] == [str(first), str(second / "final")]
    assert sorted(p.name for p in (out / "rte").iterdir()) == ["pre", "pre.2", "random", "random.2"]
    for name in ("pre", "random"):
        entry = result["tasks"]["rte"]["models"][name]
        assert list(entry["pretraining_scores"]) == ["1", "2"] and all(len(v) == 2 for v in entry["pretraining_scores"].values())
        assert entry["scores"] == pytest.approx([sum(v) / 2 for v in entry["pretraining_scores"].values()])
    versus = result["tasks"]["rte"]["vs_baseline"]["pre"]
    assert (versus["scope"], versus["df"], versus["pretrainings"], versus["finetunings"]) == ("recipes", 1, 2, 2)
    assert "same_as" not in result["models"]["random"]  # its second checkpoint is a draw of its own
    text = (out / "compare.md").read_text()
    assert "SE over 2 pre-trainings x 2 fine-tuning seeds" in text and "over 2 pre-trainings of each recipe" in text
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the premise: without its own draw, the twin of the second checkpoint (the same config) would be the first's
    card = load_card("rte")
    weights = {}
    for spec in (f"random:{first}", f"random:{second / 'final'}", f"random@2:{second / 'final'}"):
        torch.manual_seed(1)
        weights[spec] = load_model(card, spec, 32).state_dict()["bert.embeddings.word_embeddings.weight"]
    one, same, other = weights.values()
    assert torch.equal(one, same) and not torch.equal(one, other)


def test_one_architectures_models_share_a_tasks_captured_step_and_score_as_without_it(setup, compared, tmp_path,
                                                                                      monkeypatch):
    """With the captured step (its body on the CPU), the pre-trained model and its random twin (one architecture)
    share one step on a task, each grid trial adopting it with its own weights: the scores of the run without it."""
    made, adopted = count_kept_steps(monkeypatch)
    out = tmp_path / "out"
    assert cli_main(rte_args(setup, out)) == 0
    assert (len(made), len(adopted)) == (1, 3)  # 2 models x 2 seeds: one step, adopted three times
    ours = json.loads((out / "compare.json").read_text())["tasks"]["rte"]["models"]
    theirs = json.loads((compared / "compare.json").read_text())["tasks"]["rte"]["models"]
    for name in ("pre", "random"):
        assert ours[name]["scores"] == pytest.approx(theirs[name]["scores"], abs=1e-9), name


@pytest.mark.parametrize("case, message", [
    ("unpaired", r"--model random=.*: 1 checkpoint, pre has 2: rows pair by position"),
    ("path-twice", r"--model pre=.*: .* is given twice; expected each pre-training's checkpoint once"),
    ("path-twice-spelt", r"--model pre=.*: .*/ is given twice; expected each pre-training's checkpoint once"),
    ("one-model", r"--model: 1 model given; a comparison needs at least two"),
    ("duplicate", r"--model pre=.*: the name pre is given twice"),
    ("not-a-checkpoint", r"--model other=.*: .* is not a checkpoint \(no config.json\)"),
    ("labels-above-train", r"--task rte@500: 500 labels is above rte's train size \(64 examples\)"),
    ("one-seed", r"--seeds 1: a standard error needs at least two seeds"),
    ("baseline", r"--baseline nobody: not one of the models; expected one of pre, random"),
    ("too-short-for-squad", r"--task squad_small@48: max_seq_length 32 leaves no room for the context"),
])
def test_bad_input_is_one_clear_error_and_nothing_is_written(setup, tmp_path, capsys, case, message):
    out = tmp_path / "out"
    args = compare_args(setup, out)
    model = str(setup / "pretrain" / "final")
    if case == "unpaired":
        args[args.index(f"pre={model}")] = f"pre={model},{setup / 'pretrain'}"
    elif case == "path-twice":
        args[args.index(f"pre={model}")] = f"pre={model},{model}"
    elif case == "path-twice-spelt":  # one checkpoint, two spellings: two grids of it would count as two pre-trainings
        args[args.index(f"pre={model}")] = f"pre={model},{model}/"
    elif case == "one-model":
        args = [a for a in args if a not in ("--model", f"random=random:{model}")]
        args[1:1] = ["--model"]
    elif case == "duplicate":
        args += ["--model", f"pre={model}"]
    elif case == "not-a-checkpoint":
        (tmp_path / "empty").mkdir()
        args += ["--model", f"other={tmp_path / 'empty'}"]
    elif case == "labels-above-train":
        args[args.index("rte")] = "rte@500"
    elif case == "one-seed":
        args[args.index("--seeds") + 1: args.index("--seeds") + 3] = ["1"]
    elif case == "baseline":
        args[args.index("--baseline") + 1] = "nobody"
    elif case == "too-short-for-squad":  # found before the rte grids run, not after
        args[args.index("--max_seq_length") + 1] = "32"
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert "bert-suite compare: error: " in err and len(err.strip().splitlines()) == 1, err
    assert re.search(message, err), err
    assert not out.exists()
