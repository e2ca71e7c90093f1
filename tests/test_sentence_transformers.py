"""sentence-transformers on bert_suite checkpoints: the documented example (docs/deploying.md) as written (pooling, saving), its
embeddings against those of the stock checkpoint of the same weights, and the saved folder loaded where
bert_suite is not installed (trust_remote_code)."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import BertTokenizerFast

from bert_suite import BertSuiteConfig, BertSuiteModel
from bert_suite.export import export_to_bert
from helpers import REPO

pytest.importorskip("sentence_transformers")
SENTENCES = ["a man plays guitar .", "a person makes music .", "nobody is here"]


@pytest.fixture
def workdir(tmp_path):
    """runs/my-model: a tiny bert_suite encoder with a word-level tokenizer, as the documented example names it."""
    words = "a man plays guitar person makes music nobody is here the room full".split()
    folder = tmp_path / "runs" / "my-model"
    folder.mkdir(parents=True)
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, "."]) + "\n")
    BertTokenizerFast(str(folder / "vocab.txt")).save_pretrained(folder)
    torch.manual_seed(0)
    BertSuiteModel(BertSuiteConfig.from_preset("tiny", vocab_size=len(words) + 6)).save_pretrained(folder)
    return tmp_path


def python(code: str, cwd, *, block_bert_suite: bool = False) -> list[str]:
    """Run `code` in a fresh interpreter (optionally one where `import bert_suite` fails, as if it were not
    installed); returns its lines of output, the last of which the code makes the embeddings' repr."""
    prefix = "import sys\nsys.modules['bert_suite'] = None\n" if block_bert_suite else ""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", prefix + code], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()


def test_documented_example_in_this_process_matches_stock(workdir, monkeypatch):
    """The documented example as written, run in this process, against the same library on the stock checkpoint
    of the same weights. In fresh interpreters, with the saved folder loaded where bert_suite is not installed: the
    test below (three interpreters importing sentence-transformers, 20 s on 2 cores: make test-all)."""
    from sentence_transformers import SentenceTransformer, models

    text = (REPO / "docs" / "deploying.md").read_text().split("## Sentence embeddings", 1)[1]
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert "models.Pooling" in code and "model.save(" in code
    monkeypatch.chdir(workdir)
    namespace = {}
    exec(code, namespace)
    ours = np.asarray(namespace["model"].encode(SENTENCES))
    assert ours.shape == (3, 128) and np.isfinite(ours).all()
    assert np.abs(np.asarray(namespace["embeddings"]) - ours[:2]).max() < 1e-5  # the example's own two sentences
    assert (workdir / "runs" / "my-model-st" / "modules.json").is_file()
    export_to_bert(workdir / "runs" / "my-model", workdir / "stock")
    stock = SentenceTransformer(modules=[models.Transformer(str(workdir / "stock")),
                                         models.Pooling(128, pooling_mode="mean")])
    assert type(stock[0].auto_model).__module__.startswith("transformers.models.bert")
    assert np.abs(ours - np.asarray(stock.encode(SENTENCES))).max() < 1e-5
    reloaded = SentenceTransformer(str(workdir / "runs" / "my-model-st"))  # the saved folder, bert_suite here
    assert np.abs(ours - np.asarray(reloaded.encode(SENTENCES))).max() < 1e-5


@pytest.mark.slow
def test_documented_example_matches_stock_and_loads_without_bert_suite(workdir):
    text = (REPO / "docs" / "deploying.md").read_text().split("## Sentence embeddings", 1)[1]
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert "models.Pooling" in code and "model.save(" in code
    show = f"\nimport numpy as np\nprint(np.asarray(model.encode({SENTENCES!r})).round(6).tolist())\n"
    ours = np.array(eval(python(code + show, workdir)[-1]))
    assert ours.shape == (3, 128) and np.isfinite(ours).all()
    assert (workdir / "runs" / "my-model-st" / "modules.json").is_file()

    # the same library on the stock checkpoint of the same weights
    export_to_bert(workdir / "runs" / "my-model", workdir / "stock")
    stock_code = ("from sentence_transformers import SentenceTransformer, models\n"
                  "encoder = models.Transformer('stock')\n"
                  "model = SentenceTransformer(modules=[encoder, models.Pooling(128, pooling_mode='mean')])" + show)
    stock = np.array(eval(python(stock_code, workdir, block_bert_suite=True)[-1]))
    assert np.abs(ours - stock).max() < 1e-5

    # the saved folder, where bert_suite is not installed: its own modeling code, with trust_remote_code
    reload = ("from sentence_transformers import SentenceTransformer\n"
              "model = SentenceTransformer('runs/my-model-st', trust_remote_code=True)\n"
              "print(type(model[0].auto_model).__module__)" + show)
    module, shown = python(reload, workdir, block_bert_suite=True)[-2:]
    assert module.startswith("transformers_modules.")  # the folder's own modeling code ran
    again = np.array(eval(shown))
    assert np.abs(again - ours).max() < 1e-5
