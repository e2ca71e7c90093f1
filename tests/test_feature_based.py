"""The feature-based route (Table 7): per-word features from a frozen model, one vector per input
word from its max-context window, and a BiLSTM tagger that learns the synthetic NER task."""

import json

import numpy as np
import pytest

from bert_suite.cli import main as cli_main
from bert_suite.configuration_bert_suite import BertSuiteConfig
from bert_suite.feature_based import FeatureError, parse_layers, pool_layers, train_tagger
from bert_suite.modeling_bert_suite import BertSuiteModel
from helpers import LABELS, write_synthetic


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    """A randomly initialised tiny checkpoint with the synthetic data's cased vocabulary."""
    root = tmp_path_factory.mktemp("features")
    data = write_synthetic(root / "data")
    vocab = (data / "vocab.txt").read_text().split()
    config = BertSuiteConfig.from_preset("tiny", vocab_size=len(vocab), max_position_embeddings=64)
    model_dir = root / "model"
    BertSuiteModel(config).save_pretrained(model_dir)
    return data, model_dir


def test_layer_specs_and_pools():
    assert parse_layers("-1,-2,-3,-4", 12) == [12, 11, 10, 9]
    assert parse_layers("0", 12) == [0] and parse_layers("all", 2) == [1, 2]
    with pytest.raises(FeatureError, match="outside the model's 3 hidden states"):
        parse_layers("5", 2)
    with pytest.raises(FeatureError, match="not an integer"):
        parse_layers("last", 2)
    stack = np.arange(24, dtype=np.float32).reshape(2, 3, 4)  # words, layers, hidden
    assert pool_layers(stack, "concat").shape == (2, 12)
    assert pool_layers(stack, "sum")[0].tolist() == [12, 15, 18, 21]
    assert pool_layers(stack, "weighted").shape == (2, 3, 4)


def test_features_have_one_vector_per_word_and_the_tagger_learns(frozen, tmp_path, capsys, report):
    data, model = frozen
    dims = {}
    for split, file in (("train", "train.txt"), ("dev", "valid.txt")):
        assert cli_main(["extract-features", "--model", str(model), "--tokenizer", str(data / "vocab.txt"),
                         "--input", str(data / file), "--layers", "0,-1", "--pool", "weighted",
                         "--max_seq_length", "32", "--output_dir", str(tmp_path / split)]) == 0
    import datasets

    train, dev = (datasets.load_from_disk(str(tmp_path / s)) for s in ("train", "dev"))
    for ds in (train, dev):
        for row in ds.select(range(10)):
            dims[np.asarray(row["features"]).shape[1:]] = True
            assert len(row["features"]) == len(row["tokens"]) == len(row["ner_tags"])
    hidden = BertSuiteConfig.from_preset("tiny").hidden_size
    assert list(dims) == [(2, hidden)]  # 2 layers x hidden, mixed by the tagger's learned weights
    assert sum(len(t) for t in dev["tokens"]) == sum(
        1 for line in (data / "valid.txt").read_text().splitlines() if line.strip() and "DOCSTART" not in line)
    results = train_tagger(train, dev, LABELS, tmp_path / "tagger", epochs=10, learning_rate=1e-2, hidden=32,
                           batch_size=16, disable_tqdm=True)
    report("CoNLL-like dev entity F1, feature-based (frozen random tiny, BiLSTM)", f"{100 * results['eval_f1']:.1f}")
    assert results["eval_f1"] > 0.8  # tagging every word O scores 0
    saved = json.loads((tmp_path / "tagger" / "all_results.json").read_text())
    assert saved["features"]["pool"] == "weighted" and saved["features"]["layers"] == [0, 2]
    lines = (tmp_path / "tagger" / "predictions" / "dev.conll").read_text().splitlines()
    assert lines.count("-DOCSTART- O O") == 20


def test_tagger_refuses_mismatched_or_untagged_features(tmp_path):
    import datasets

    def features(pool, tagged=True):
        data = {"tokens": [["a", "b"]], "features": [[[0.0, 1.0], [1.0, 0.0]]]}
        if tagged:
            data["ner_tags"] = [[0, 1]]
        ds = datasets.Dataset.from_dict(data)
        ds.info.description = json.dumps({"model": "m", "layers": [1], "pool": pool, "context": "document"})
        return ds

    with pytest.raises(FeatureError, match="extracted differently.*pool"):
        train_tagger(features("sum"), features("concat"), LABELS, tmp_path)
    with pytest.raises(FeatureError, match="dev features need the columns features and ner_tags"):
        train_tagger(features("sum"), features("sum", tagged=False), LABELS, tmp_path)
    with pytest.raises(FeatureError, match="batch_size and epochs"):
        train_tagger(features("sum"), features("sum"), LABELS, tmp_path, batch_size=0)
