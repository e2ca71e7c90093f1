"""`bert-suite export --to onnx`: every head exported and checked in onnxruntime, the graph of our checkpoint
against the graph of the stock checkpoint of the same weights, dynamic batch and length, and the
"Deploying" example (docs/deploying.md) run as written."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bert_suite import BertSuiteConfig, BertSuiteForSequenceClassification
from bert_suite.cli import main as cli_main
from bert_suite.onnx_export import OnnxExportError, export_to_onnx, sample_inputs
from helpers import HEADS, REPO, save_stock

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

EXPORTED = ["ForSequenceClassification", "ForQuestionAnswering", "ForTokenClassification", "ForMultipleChoice",
            "ForPreTraining"]


def run(path: Path, inputs: dict) -> dict:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {k: v.numpy() for k, v in inputs.items()}), strict=True))


# make test exports three heads (a span head, a head over choices, the pre-training heads) against the stock
# checkpoint's graph; the sequence classifier (also exported by the CLI test below, checked in onnxruntime against
# the eager model) and the token classifier (per-token outputs, as the span head's) in make test-all.
SLOW_EXPORTS = ("ForSequenceClassification", "ForTokenClassification")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_EXPORTS else n
                                  for n in EXPORTED])
def test_every_head_exports_and_matches_the_stock_checkpoints_graph(name, tmp_path):
    ours_cls = HEADS[name][0]
    save_stock(name, tmp_path / "stock")
    ours_cls.from_pretrained(tmp_path / "stock").save_pretrained(tmp_path / "ours")
    said = []
    done = export_to_onnx(tmp_path / "ours", tmp_path / "ours-onnx", log=said.append)
    assert done.max_difference <= 1e-4 and "max |difference|" in said[-1]
    stock = export_to_onnx(tmp_path / "stock", tmp_path / "stock-onnx", log=said.append)
    assert done.outputs == stock.outputs
    # the config beside the graph is a stock one: a server needs neither bert_suite nor its modeling code
    assert json.loads((tmp_path / "ours-onnx" / "config.json").read_text())["model_type"] == "bert"
    # another shape again (batch 4, length 9; 5 choices), padded: the two graphs agree at real tokens
    config = BertSuiteConfig.from_pretrained(tmp_path / "ours")
    inputs = sample_inputs(config, 4, 9, 5 if name == "ForMultipleChoice" else None, seed=7)
    a, b = run(done.path, inputs), run(stock.path, inputs)
    real = inputs["attention_mask"].bool().numpy()
    for key in done.outputs:
        x, y = a[key], b[key]
        if x.shape[:real.ndim] == real.shape:
            x, y = x[real], y[real]
        assert np.abs(x - y).max() < 1e-4, key


def tiny_classifier(folder: Path) -> Path:
    """A tiny sentence-pair classifier with a word-level vocabulary, as a finetune run folder holds one."""
    from transformers import BertTokenizerFast

    words = "a man plays guitar person makes music nobody is here the room full".split()
    folder.mkdir(parents=True)
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, "."]) + "\n")
    BertTokenizerFast(str(folder / "vocab.txt")).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertSuiteConfig.from_preset("tiny", vocab_size=len(words) + 6, num_labels=2,
                                         id2label={0: "entailment", 1: "not_entailment"},
                                         label2id={"entailment": 0, "not_entailment": 1})
    BertSuiteForSequenceClassification(config).save_pretrained(folder)
    return folder


def readme_block(heading: str) -> str:
    text = (REPO / "docs" / "deploying.md").read_text()
    section = text.split(heading, 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_cli_export_and_the_documented_serving_example(tmp_path, capsys):
    run_dir = tiny_classifier(tmp_path / "runs" / "rte")
    assert cli_main(["export", "--to", "onnx", str(run_dir), str(tmp_path / "runs" / "rte-onnx"), "--opset", "17"]) == 0
    printed = capsys.readouterr()
    assert "ONNX; outputs logits" in printed.out and "max |difference|" in printed.out
    assert "torch.onnx" not in printed.out  # the exporter's narration stays out of a successful run
    folder = tmp_path / "runs" / "rte-onnx"
    assert {"model.onnx", "config.json", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    code = readme_block("## ONNX Runtime")
    assert len(code.strip().splitlines()) <= 12 and "onnxruntime" in code
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    labels = eval(done.stdout.strip().splitlines()[-1])  # the example prints a list of label names
    assert len(labels) == 2 and set(labels) <= {"entailment", "not_entailment"}
    # the same predictions as the checkpoint in eager
    model = BertSuiteForSequenceClassification.from_pretrained(tmp_path / "runs" / "rte").eval()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "runs" / "rte")
    pairs = re.search(r"tokenizer\((\[.*?\]), (\[.*?\])", code, re.S)
    batch = tokenizer(eval(pairs.group(1)), eval(pairs.group(2)), padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = [model.config.id2label[int(i)] for i in model(**batch).logits.argmax(-1)]
    assert labels == expected


def test_bad_opset_and_missing_extra_are_one_clear_error(tmp_path, monkeypatch):
    run_dir = tiny_classifier(tmp_path / "run")
    with pytest.raises(OnnxExportError, match=r"--opset 23: not supported; expected 14\.\.22"):
        export_to_onnx(run_dir, tmp_path / "out", opset=23)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    with pytest.raises(OnnxExportError, match=r"onnxruntime is missing.*pip install \"bert_suite\[onnx\]\""):
        export_to_onnx(run_dir, tmp_path / "out")
