"""glue-package: server files from finetune/grid runs, row checks, AX through the MNLI model,
WNLI's majority class, the zip and the dev summary."""

import json
import random
import zipfile
from pathlib import Path

import pytest

from bert_suite.cards import load_card
from bert_suite.cli import main as cli_main
from bert_suite.glue_package import GLUE_TASKS, Run, dev_summary_markdown, package
from helpers import WORDS, run_args, write_rte_like


def write_mnli_like(root: Path, n=48, seed=1) -> Path:
    """MNLI's layout (matched/mismatched dev and test) and the diagnostic set beside it."""
    rng = random.Random(seed)
    labels = ["entailment", "neutral", "contradiction"]
    mnli = root / "MNLI"
    mnli.mkdir(parents=True)
    (mnli / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")

    def rows(count, labelled):
        out = []
        for i in range(count):
            label = rng.choice(labels)
            out.append(f"{i}\t{rng.choice(WORDS)} said\t{rng.choice(WORDS)}" + (f"\t{label}" if labelled else ""))
        return out

    for name, count, labelled in (("train", n, True), ("dev_matched", 12, True), ("dev_mismatched", 10, True),
                                  ("test_matched", 7, False), ("test_mismatched", 6, False)):
        header = "index\tsentence1\tsentence2" + ("\tgold_label" if labelled else "")
        (mnli / f"{name}.tsv").write_text(header + "\n" + "\n".join(rows(count, labelled)) + "\n")
    (root / "diagnostic").mkdir()
    (root / "diagnostic" / "diagnostic.tsv").write_text(
        "index\tsentence1\tsentence2\n" + "\n".join(rows(5, False)) + "\n")
    (root / "WNLI").mkdir()
    (root / "WNLI" / "test.tsv").write_text("index\tsentence1\tsentence2\n0\ta b\tb\n1\tc d\td\n2\te\tf\n")
    return mnli


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A GLUE root with RTE, MNLI, diagnostic and WNLI; an RTE finetune with its test predictions
    already written, and an MNLI grid whose test files glue-package must predict itself."""
    tmp = tmp_path_factory.mktemp("glue")
    root = tmp / "glue_data"
    rte = write_rte_like(root / "RTE", n_train=32, n_dev=16)
    mnli = write_mnli_like(root)
    assert cli_main(["finetune", "rte", *run_args(rte, tmp / "rte", "--max_steps", "2")]) == 0
    assert cli_main(["predict", "rte", "--model", str(tmp / "rte"), "--data_dir", str(rte)]) == 0
    assert cli_main(["grid", "mnli", *run_args(mnli, tmp / "mnli", "--max_steps", "2"), "--learning_rates", "1e-3",
                     "--batch_sizes", "8", "--epochs", "1"]) == 0
    return {"root": root, "rte": tmp / "rte", "mnli": tmp / "mnli", "tmp": tmp}


def test_package_writes_checked_server_files_zip_and_dev_summary(runs, tmp_path, capsys):
    out = tmp_path / "submit"
    assert cli_main(["glue-package", str(runs["rte"]), str(runs["mnli"]), "--output_dir", str(out),
                     "--data_dir", str(runs["root"])]) == 0
    summary = json.loads((out / "package.json").read_text())
    assert set(summary["files"]) == {"RTE.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv", "WNLI.tsv"}
    rows = {name: (out / name).read_text().splitlines() for name in summary["files"]}
    assert all(r[0] == "index\tprediction" for r in rows.values())
    assert [len(rows[n]) - 1 for n in ("RTE.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv", "WNLI.tsv")] == [50, 7, 6, 5, 3]
    assert {line.split("\t")[1] for line in rows["AX.tsv"][1:]} <= {"entailment", "neutral", "contradiction"}
    assert rows["WNLI.tsv"][1:] == ["0\t0", "1\t0", "2\t0"]  # majority class, indices from the test file
    assert "predicted with" in summary["files"]["AX.tsv"]["source"] and "mnli" in summary["files"]["AX.tsv"]["source"]
    assert summary["files"]["RTE.tsv"]["source"].endswith("predictions/test.tsv")  # reused, not re-predicted
    assert summary["files"]["RTE.tsv"]["checked_against"].endswith("RTE/test.tsv")
    assert set(summary["missing"]) == {"CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "QQP.tsv", "QNLI.tsv"}
    with zipfile.ZipFile(out / "glue_submission.zip") as archive:
        assert sorted(archive.namelist()) == sorted(summary["files"])
        assert archive.read("RTE.tsv").decode().splitlines() == rows["RTE.tsv"]
    md = (out / "dev_summary.md").read_text()
    assert "| rte |" in md and "| mnli-m |" in md and "| mnli-mm |" in md
    assert "66.4" in md and "84.6" in md and "83.4" in md  # the paper's Table 1 numbers, from the cards
    assert "glue_submission.zip" in capsys.readouterr().out


def test_package_without_test_files_checks_the_cards_row_counts(runs, tmp_path, capsys):
    fake = tmp_path / "run"  # trained from the Hub: no test file to compare with
    (fake / "predictions").mkdir(parents=True)
    manifest = json.loads((runs["rte"] / "run_manifest.json").read_text())
    (fake / "run_manifest.json").write_text(json.dumps({**manifest, "data_dir": None}))
    (fake / "predictions" / "test.tsv").write_bytes((runs["rte"] / "predictions" / "test.tsv").read_bytes())
    # 50 rows here; the real RTE test set has 3000 (the card's count)
    assert cli_main(["glue-package", str(fake), "--output_dir", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "50 predictions, but rte test has 3000 rows" in err
    (fake / "predictions" / "test.tsv").write_text("index\tprediction\n" + "".join(f"{i}\tentailment\n" for i in range(3000)))
    assert cli_main(["glue-package", str(fake), "--output_dir", str(tmp_path / "p")]) == 0
    summary = json.loads((tmp_path / "p" / "package.json").read_text())
    assert summary["files"]["RTE.tsv"]["checked_against"] == "card rows (3000)"
    assert len((tmp_path / "p" / "WNLI.tsv").read_text().splitlines()) == 147  # the card's 146 test rows


def test_short_or_bad_prediction_files_are_refused(runs, tmp_path, capsys):
    fake = tmp_path / "run"
    fake.mkdir()
    manifest = json.loads((runs["rte"] / "run_manifest.json").read_text())
    (fake / "run_manifest.json").write_text(json.dumps(manifest))
    (fake / "predictions").mkdir()
    good = (runs["rte"] / "predictions" / "test.tsv").read_text().splitlines()
    (fake / "predictions" / "test.tsv").write_text("\n".join(good[:-1]) + "\n")
    assert cli_main(["glue-package", str(fake), "--output_dir", str(tmp_path / "p1"), "--data_dir", str(runs["root"])]) == 2
    assert "49 predictions but the test file" in capsys.readouterr().err
    (fake / "predictions" / "test.tsv").write_text("\n".join(good[:3] + ["3\tmaybe"] + good[5:]) + "\n")
    assert cli_main(["glue-package", str(fake), "--output_dir", str(tmp_path / "p2"), "--data_dir", str(runs["root"])]) == 2
    assert "test.tsv: line 4: prediction 'maybe' is not one of" in capsys.readouterr().err
    assert cli_main(["glue-package", str(tmp_path), "--output_dir", str(tmp_path / "p3")]) == 2
    assert "no run_manifest.json" in capsys.readouterr().err


def test_cards_reproduce_the_papers_table1_average():
    """With a dev score equal to the paper's for every task, the summary's paper average is
    Table 1's 79.6 (nine numbers: MNLI m and mm count separately, WNLI is left out)."""
    runs = {}
    for name in GLUE_TASKS:
        card = load_card(name)
        if not card.train_split:
            continue
        if len(card.eval_splits) == 2:
            metrics = {f"eval_{card.eval_splits[0]}_{card.select}": card.paper["base"] / 100,
                       f"eval_{card.eval_splits[1]}_{card.select}": card.paper["base_mismatched"] / 100}
        else:
            metrics = {f"eval_{card.select}": card.paper["base"] / 100}
        runs[name] = Run(card, Path(name), Path(name), None, metrics)
    from bert_suite.glue_package import dev_scores

    summary = {"dev": {r[0]: {"dev": r[1], "paper_base_test": r[2]} for run in runs.values() for r in dev_scores(run)},
               "files": {}, "missing": []}
    md = dev_summary_markdown(summary)
    assert "| **average** (without WNLI, as the paper) | 79.6 | 79.6 |" in md


def test_package_needs_a_run(tmp_path):
    with pytest.raises(ValueError, match="at least one run"):
        package([], str(tmp_path))
