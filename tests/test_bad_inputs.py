"""The bad-input catalogue (docs/RELIABILITY.md, "Bad input"): one parametrised test over every reader and
command. Each case writes a bad file (or gives a bad flag) under tmp_path and runs `bert-suite` in-process; the
command must exit non-zero with one message naming the file (or flag), the record and what was expected, and
no traceback. Cases with a skip option (`--skip_bad_rows`) call the reader directly and check that the skipped
records are counted and reported. No case trains a model (one fine-tunes for a single step, to have the run
folder `predict` reads its card from): every error happens while reading data, tokenising, loading the model or
checking flags."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from bert_suite.cli import main as cli_main

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = "apple berry cherry grape lemon mango olive peach the a man woman walks looks".split()
VOCAB = SPECIALS + WORDS


# ---------------------------------------------------------------------------------------------------- fixtures


@dataclass
class Env:
    """What several cases share, built once: a vocab.txt and tiny checkpoints (hidden size 32, 2 layers,
    64 positions) whose vocabulary is that vocab.txt."""

    root: Path
    vocab: Path
    classifier: Path  # BertSuiteForSequenceClassification (rte's two labels)
    encoder: Path  # BertSuiteModel (feature extraction)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Env:
    from bert_suite.configuration_bert_suite import BertSuiteConfig
    from bert_suite.modeling_bert_suite import BertSuiteForSequenceClassification, BertSuiteModel

    root = tmp_path_factory.mktemp("bad_inputs_env")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    sizes = dict(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=64)
    classifier, encoder = root / "classifier", root / "encoder"
    BertSuiteForSequenceClassification(BertSuiteConfig(num_labels=2, **sizes)).save_pretrained(classifier)
    BertSuiteModel(BertSuiteConfig(**sizes)).save_pretrained(encoder)
    return Env(root, vocab, classifier, encoder)


# ---------------------------------------------------------------------------------------------------- writers


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


RTE_HEADER = "index\tsentence1\tsentence2\tlabel\n"
RTE_ROWS = "".join(f"{i}\tthe man walks\t{w}\t{lab}\n" for i, (w, lab) in
                   enumerate([("apple", "entailment"), ("lemon", "not_entailment"), ("berry", "entailment")]))


def rte_data(tmp: Path, train: str | bytes | None = None, dev: str | bytes | None = None) -> Path:
    """An RTE folder: good train.tsv / dev.tsv unless replaced."""
    folder = tmp / "RTE"
    write(folder / "train.tsv", RTE_HEADER + RTE_ROWS if train is None else train)
    write(folder / "dev.tsv", RTE_HEADER + RTE_ROWS if dev is None else dev)
    return folder


def compare(tmp: Path, env: Env, *extra: str, models: tuple = ("a", "b"), seeds: tuple = ("1", "2"),
            task: str = "rte", baseline: str | None = None) -> list[str]:
    """`compare` of the tiny classifier (with its vocab.txt) under the names `models`, on a good RTE folder."""
    model = tmp / "model"
    if not model.exists():
        shutil.copytree(env.classifier, model)
        shutil.copyfile(env.vocab, model / "vocab.txt")
    return ["compare", "--model", *(f"{name}={model}" for name in models), "--baseline", baseline or models[0], "--task", task,
            "--data_dir", str(rte_data(tmp).parent), "--seeds", *seeds, "--max_seq_length", "32", "--output_dir",
            str(tmp / "out"), *extra]


def causal_classifier(tmp: Path, env: Env) -> Path:
    from bert_suite.configuration_bert_suite import BertSuiteConfig
    from bert_suite.modeling_bert_suite import BertSuiteForSequenceClassification

    config = BertSuiteConfig.from_pretrained(env.classifier)
    config.causal_attention = True
    BertSuiteForSequenceClassification(config).save_pretrained(tmp / "causal")
    return tmp / "causal"


def finetune(task: str, data: Path, tmp: Path, env: Env, *extra: str, model: str = "preset:tiny") -> list[str]:
    return ["finetune", task, "--model", model, "--tokenizer", str(env.vocab), "--data_dir", str(data),
            "--output_dir", str(tmp / "run"), "--max_seq_length", "32", "--max_steps", "1",
            "--disable_tqdm", "true", *extra]


def tsv_case(train: str | bytes) -> Callable:
    return lambda tmp, env: finetune("rte", rte_data(tmp, train=train), tmp, env)


CARD = {
    "name": "mytask", "family": "classification", "text_columns": ["sentence1", "sentence2"],
    "label_column": "label", "labels": ["entailment", "not_entailment"], "metric": "rte", "select": "accuracy",
    "test_splits": [],
    "splits": {s: {"file": f"{f}.tsv", "columns": {"sentence1": "sentence1", "sentence2": "sentence2",
                                                   "label": "label"}}
               for s, f in (("train", "train"), ("validation", "dev"))},
}


def card_case(change: Callable[[dict], object] | str) -> Callable:
    """finetune on good data with a card file written from CARD after `change` (or the raw text given)."""

    def make(tmp, env):
        import yaml

        if isinstance(change, str):
            text = change
        else:
            card = json.loads(json.dumps(CARD))
            change(card)
            text = yaml.safe_dump(card)
        path = write(tmp / "mytask.yaml", text)
        return finetune(str(path), rte_data(tmp), tmp, env)

    return make


def without(key: str) -> Callable[[dict], None]:
    return lambda card: card.pop(key)


def squad_doc(*qas: dict, context: str = "The man walks to the lemon tree.", title: str = "Trees",
              extra_paragraph: list[dict] | None = None) -> dict:
    paragraphs = [{"context": context, "qas": list(qas)}]
    if extra_paragraph is not None:
        paragraphs.append({"context": context, "qas": extra_paragraph})
    return {"version": "1.1", "data": [{"title": title, "paragraphs": paragraphs}]}


def qa(qid: str = "q1", text: str = "lemon tree", start: int = 21, **fields) -> dict:
    return {"id": qid, "question": "Where does the man walk?", "answers": [{"text": text, "answer_start": start}],
            **fields}


def squad_data(tmp: Path, train: dict | str) -> Path:
    folder = tmp / "SQuAD"
    write(folder / "train-v1.1.json", train if isinstance(train, str) else json.dumps(train))
    write(folder / "dev-v1.1.json", json.dumps(squad_doc(qa())))
    return folder


def squad_case(train: dict | str) -> Callable:
    return lambda tmp, env: finetune("squad", squad_data(tmp, train), tmp, env, "--max_seq_length", "96")


SWAG_HEADER = ",sent1,sent2,ending0,ending1,ending2,ending3,label\n"
SWAG_ROWS = "0,The man walks,He,looks,walks,holds,looks,1\n1,The woman looks,She,walks,looks,holds,walks,0\n"


def swag_case(train: str | bytes) -> Callable:
    def make(tmp, env):
        folder = tmp / "SWAG"
        write(folder / "train.csv", train)
        write(folder / "val.csv", SWAG_HEADER + SWAG_ROWS)
        return finetune("swag", folder, tmp, env)

    return make


CONLL_GOOD = ("-DOCSTART- -X- -X- O\n\nthe DT B-NP O\nman NN I-NP B-PER\n\nlemon NN B-NP B-ORG\nwalks VB B-VP O\n\n"
              "-DOCSTART- -X- -X- O\n\napple NN B-NP B-LOC\n\n")


def conll_case(train: str) -> Callable:
    def make(tmp, env):
        folder = tmp / "CoNLL"
        write(folder / "train.txt", train)
        write(folder / "valid.txt", CONLL_GOOD)
        return finetune("conll2003", folder, tmp, env)

    return make


DOCS = "The man walks to the tree.\nThe woman looks at the apple.\n\nA man holds a lemon.\nThe woman walks.\n"


def pretrain_data(corpus: str | bytes | None = None, vocab: list[str] | str | None = None, *extra: str) -> Callable:
    def make(tmp, env):
        path = write(tmp / "corpus.txt", DOCS if corpus is None else corpus)
        vocab_path = env.vocab if vocab is None else write(tmp / "vocab.txt", vocab if isinstance(vocab, str)
                                                           else "\n".join(vocab) + "\n")
        return ["pretrain-data", "--input", str(path), "--tokenizer", str(vocab_path), "--output_dir",
                str(tmp / "instances"), "--max_seq_length", "32", *extra]

    return make


def model_copy(tmp: Path, env: Env, name: str, keep: tuple[str, ...] = ("config.json", "model.safetensors"),
               config: Callable[[dict], None] | None = None, config_text: str | None = None) -> Path:
    """A copy of the tiny classifier with only `keep`, its config.json changed by `config` or replaced."""
    folder = tmp / name
    folder.mkdir()
    for file in keep:
        shutil.copy(env.classifier / file, folder / file)
    if config is not None:
        values = json.loads((folder / "config.json").read_text())
        config(values)
        (folder / "config.json").write_text(json.dumps(values))
    if config_text is not None:
        (folder / "config.json").write_text(config_text)
    return folder


def three_outputs(tmp: Path, env: Env) -> Path:
    """A copy of the tiny classifier with a 3-output head and no label names (LABEL_0..2)."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = model_copy(tmp, env, "three", config=lambda c: c.update(
        id2label={str(i): f"LABEL_{i}" for i in range(3)}, label2id={f"LABEL_{i}": i for i in range(3)}))
    weights = load_file(folder / "model.safetensors")
    weights["classifier.weight"] = torch.zeros(3, weights["classifier.weight"].shape[1])
    weights["classifier.bias"] = torch.zeros(3)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def predict_rte(model: Callable[[Path, Env], Path], *extra: str, tokenizer: Callable | None = None) -> Callable:
    def make(tmp, env):
        tok = tokenizer(tmp, env) if tokenizer else env.vocab
        return ["predict", "rte", "--model", str(model(tmp, env)), "--tokenizer", str(tok), "--split", "dev",
                "--data_dir", str(rte_data(tmp)), "--output_dir", str(tmp / "out"), *extra]

    return make


def score_squad(data: dict | str, predictions: dict | list | str, *extra: str) -> Callable:
    def make(tmp, env):
        d = write(tmp / "dev-v1.1.json", data if isinstance(data, str) else json.dumps(data))
        p = write(tmp / "predictions.json", predictions if isinstance(predictions, str) else json.dumps(predictions))
        return ["score", "squad", "--data", str(d), "--predictions", str(p), *extra]

    return make


# Reader calls for the cases with a skip option: they return the printed report's source.

def skip_tsv(tmp, env):
    from bert_suite.adapters import classification
    from bert_suite.cards import load_card

    data = rte_data(tmp, train=RTE_HEADER + RTE_ROWS + "3\tthe man\tapple\tmaybe\n4\tonly two\n")
    dataset = classification.load_split(load_card("rte"), "train", str(data), skip_bad_rows=True)
    assert len(dataset) == 3


def skip_squad(tmp, env):
    from bert_suite.adapters import squad
    from bert_suite.cards import load_card

    data = squad_data(tmp, squad_doc(qa("q1"), qa("q2", question=""), qa("q1")))
    dataset = squad.load_split(load_card("squad"), "train", str(data), skip_bad_rows=True)
    assert dataset["id"] == ["q1"]


def counted_squad_answers(tmp, env):
    from bert_suite.adapters import squad
    from bert_suite.cards import load_card

    data = squad_data(tmp, squad_doc(qa("q1"), qa("q2", text="apple tree"), qa("q3", start=999)))
    dataset = squad.load_split(load_card("squad"), "train", str(data))
    assert len(dataset) == 3  # kept (evaluation uses the texts); training skips them, counted again


def skip_swag(tmp, env):
    from bert_suite.adapters import multiple_choice
    from bert_suite.cards import load_card

    path = write(tmp / "SWAG" / "train.csv", SWAG_HEADER + SWAG_ROWS + "2,The man,He,a,b,c,d,9\n3,short,row\n")
    dataset = multiple_choice.load_split(load_card("swag"), "train", str(path), skip_bad_rows=True)
    assert len(dataset) == 2


def skip_conll(tmp, env):
    from bert_suite.adapters import ner
    from bert_suite.cards import load_card

    bad = CONLL_GOOD + "-DOCSTART- -X- -X- O\n\n-DOCSTART- -X- -X- O\n\nthe DT B-NP O\n\nman NN I-NP B-PERSON\n\n"
    path = write(tmp / "CoNLL" / "train.txt", bad)
    dataset = ner.load_split(load_card("conll2003"), "train", str(path), skip_bad_rows=True)
    assert len(dataset) == 4


def pretrain_config(text: str) -> Callable:
    """The pre-training recipe's config loader, with the recipe's handling of its error (`pretrain: error: ...`,
    exit status 2 here; the recipe runs under accelerate, so it is not started as a script)."""

    def run(tmp, env):
        from bert_suite.pretraining.config import PretrainConfigError, load_pretrain_config

        try:
            load_pretrain_config(str(write(tmp / "recipe.yaml", text)))
        except PretrainConfigError as err:
            print(f"pretrain: error: {err}", file=sys.stderr)
            return 1  # the recipe's SystemExit(message)
        return 0

    return run


def recipe_run(*overrides: str) -> Callable:
    """recipes/pretrain.py's main with key=value overrides; its refusal (SystemExit with the message) is
    printed as the script prints it, exit status 1."""

    def run(tmp, env):
        from helpers import load_recipe

        try:
            load_recipe().main(["train_data=" + str(tmp / "data"), "tokenizer=" + str(env.vocab), "report_to=none",
                                "output_dir=" + str(tmp / "out"), *overrides])
        except SystemExit as done:
            print(done.code, file=sys.stderr)
            return 1
        return 0

    return run


def with_tokenizer(argv: list[str], path: Path) -> list[str]:
    at = argv.index("--tokenizer") + 1
    return [*argv[:at], str(path), *argv[at + 1:]]


OWN_CSV = "sentence1,sentence2,label\nthe man walks,apple,pos\nthe woman looks,lemon,neg\n"
RTE_CSV = "sentence1,sentence2,label\nthe man walks,apple,entailment\nthe woman looks,lemon,not_entailment\n"


def files_run(tmp: Path, env: Env, *args: str) -> list[str]:
    """`finetune ARGS` with its data given by the data-file flags only (no --data_dir)."""
    return ["finetune", *args, "--model", "preset:tiny", "--tokenizer", str(env.vocab), "--output_dir",
            str(tmp / "run"), "--max_seq_length", "32", "--max_steps", "1", "--disable_tqdm", "true"]


def files_case(train: tuple[str, str | bytes], *extra: str, task: str | None = None,
               validation: tuple[str, str] | None = ("dev.csv", OWN_CSV)) -> Callable:
    """finetune (card-less unless `task`) with --train_file NAME holding the text given, and --validation_file."""

    def make(tmp, env):
        files = ["--train_file", str(write(tmp / train[0], train[1]))]
        if validation is not None:
            files += ["--validation_file", str(write(tmp / validation[0], validation[1]))]
        return files_run(tmp, env, *([task] if task else []), *files, *extra)

    return make


_LISTENING: list = []  # sockets held open for the rest of the run (a port in use)


def listening_port() -> int:
    import socket

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    _LISTENING.append(held)
    return held.getsockname()[1]


def grid_study(tmp: Path) -> Path:
    """A folder with a grid.db holding one (empty) study, as a grid that has started leaves it."""
    import optuna

    folder = tmp / "grid"
    folder.mkdir()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # its "new study" line would go to a closed stream
    optuna.create_study(study_name="rte-grid-0", storage=f"sqlite:///{folder / 'grid.db'}")
    return folder


# ---------------------------------------------------------------------------------------------------- the cases


@dataclass
class Case:
    id: str
    group: str
    what: str  # the bad input, as the catalogue names it
    make: Callable  # (tmp_path, env) -> argv for `bert-suite`, or runs a reader itself (returns None)
    names: str  # (a) the file or flag the message must name (a regex)
    record: str | None  # (b) the record: line, row, question id, key... (a regex), None where there is none
    expect: str  # (c) what was expected (a regex)
    code: int = 2  # 0: skipped and counted (the reader goes on); the recipe exits with 1


CASES = [
    # ---------------------------------------------------------------- GLUE TSV (finetune rte --data_dir)
    Case("tsv-missing-column", "GLUE TSV", "header without the sentence2 column",
         tsv_case("index\tsentence1\tlabel\n0\tthe man\tentailment\n"),
         r"train\.tsv", r"train\.tsv:1:", r"header has no column 'sentence2'; expected the columns"),
    Case("tsv-extra-tab", "GLUE TSV", "a row with an extra tab (5 fields under a 4-column header)",
         tsv_case(RTE_HEADER + "0\tthe man\twalks\tapple\tentailment\n"),
         r"train\.tsv", r"train\.tsv:2:", r"expected 4 tab-separated fields, found 5"),
    Case("tsv-missing-field", "GLUE TSV", "a row with a field missing",
         tsv_case(RTE_HEADER + RTE_ROWS + "3\tthe man\tentailment\n"),
         r"train\.tsv", r"train\.tsv:5:", r"expected 4 tab-separated fields, found 3"),
    Case("tsv-unknown-label", "GLUE TSV", "a label outside the card's labels",
         tsv_case(RTE_HEADER + "0\tthe man\tapple\tmaybe\n"),
         r"train\.tsv", r"train\.tsv:2:", r"label 'maybe' is not one of the card's labels \['entailment', 'not_entailment'\]"),
    Case("tsv-empty-text", "GLUE TSV", "an empty sentence",
         tsv_case(RTE_HEADER + RTE_ROWS + "3\t \tapple\tentailment\n"),
         r"train\.tsv", r"train\.tsv:5:", r"empty text in column 'sentence1'; expected"),
    Case("tsv-non-utf8", "GLUE TSV", "bytes that are not UTF-8 (Latin-1 text)",
         tsv_case((RTE_HEADER + RTE_ROWS).encode() + "3\tcaf\xe9\tapple\tentailment\n".encode("latin-1")),
         r"train\.tsv", r"train\.tsv:5:", r"not valid UTF-8 .*expected .*UTF-8"),
    Case("tsv-empty-file", "GLUE TSV", "an empty file",
         tsv_case(""), r"train\.tsv", r"empty file", r"expected a header and rows"),
    Case("tsv-header-only", "GLUE TSV", "a header and no rows",
         tsv_case(RTE_HEADER), r"train\.tsv", r"no data rows", r"expected at least one row"),
    Case("tsv-regression-label", "GLUE TSV", "an STS-B score that is not a number",
         lambda tmp, env: finetune("stsb", write(tmp / "STS-B" / "train.tsv",
                                                 "index\tsentence1\tsentence2\tscore\n0\tthe man\ta man\thigh\n").parent,
                                   tmp, env),
         r"train\.tsv", r"train\.tsv:2:", r"label 'high' is not a number; expected a score"),
    Case("tsv-no-header-short-row", "GLUE TSV", "a CoLA row (no header) with too few fields",
         lambda tmp, env: finetune("cola", write(tmp / "CoLA" / "train.tsv", "gj04\t1\t\tthe man walks\ngj04\t1\n").parent,
                                   tmp, env),
         r"train\.tsv", r"train\.tsv:2:", r"expected 4 tab-separated fields, found 2"),
    Case("tsv-missing-dev-file", "GLUE TSV", "the data folder lacks dev.tsv",
         lambda tmp, env: finetune("rte", (rte_data(tmp), (tmp / "RTE" / "dev.tsv").unlink())[0], tmp, env),
         r"dev\.tsv", r"split 'validation'", r"file not found; expected the TSV file"),
    Case("tsv-bad-index", "GLUE TSV", "`predict --split test` on a test file whose index is not a number",
         lambda tmp, env: ["predict", "rte", "--model", str(env.classifier), "--tokenizer", str(env.vocab),
                           "--data_dir", str(write(tmp / "RTE" / "test.tsv", "index\tsentence1\tsentence2\n0\tthe man\t"
                                                   "apple\nx1\tthe woman\tlemon\n").parent),
                           "--output_dir", str(tmp / "out"), "--max_seq_length", "32"],
         r"test\.tsv", r"test\.tsv:3:", r"index 'x1' is not a number; expected the row's index \(column 'index'\)"),
    Case("tsv-all-rows-skipped", "GLUE TSV", "--skip_bad_rows when every row is bad",
         lambda tmp, env: finetune("rte", rte_data(tmp, train=RTE_HEADER + "0\tonly two\n1\tthe man\tapple\tmaybe\n"),
                                   tmp, env, "--skip_bad_rows"),
         r"train\.tsv", r"all 2 data rows", r"skipped .*expected at least one good row"),
    Case("tsv-skip-bad-rows", "GLUE TSV", "--skip_bad_rows with an unknown label and a short row",
         skip_tsv, r"train\.tsv", r"skipped 2 malformed rows", r"--skip_bad_rows", code=0),
    # ---------------------------------------------------------------- task cards (a card given as a YAML path)
    Case("card-unknown-key", "task card", "a misspelt key (metrc)",
         card_case(lambda c: c.update(metrc="rte")),
         r"mytask\.yaml", r"unknown key 'metrc'", r"known keys: .*metric"),
    Case("card-wrong-type", "task card", "text_columns given as a string",
         card_case(lambda c: c.update(text_columns="sentence1")),
         r"mytask\.yaml", r"text_columns", r"must be a list of one or two column names, got str 'sentence1'"),
    Case("card-missing-metric", "task card", "no metric key",
         card_case(without("metric")), r"mytask\.yaml", r"'metric'", r"missing required key"),
    Case("card-unknown-metric", "task card", "a metric the family cannot compute (rte2)",
         card_case(lambda c: c.update(metric="rte2")),
         r"mytask\.yaml", r"metric 'rte2'", r"expected one of .*rte"),
    Case("card-select-not-a-metric-field", "task card", "select names a field the metric does not report",
         card_case(lambda c: c.update(select="f1")),
         r"mytask\.yaml", r"select 'f1'", r"expected one of the fields of metric 'rte': accuracy"),
    Case("card-bad-yaml", "task card", "text that is not YAML",
         card_case("name: mytask\nfamily: [classification\n"), r"mytask\.yaml", r"mytask\.yaml:3:1:",
         r"not valid YAML \(while parsing a flow sequence; expected ',' or '\]'"),
    Case("card-unknown-family", "task card", "an unknown family",
         card_case(lambda c: c.update(family="regression")),
         r"mytask\.yaml", r"family 'regression'", r"is not one of classification, squad, multiple_choice, ner"),
    Case("card-split-unknown-key", "task card", "a misspelt key inside a split",
         card_case(lambda c: c["splits"]["train"].update(fil="train.tsv")),
         r"mytask\.yaml", r"splits\.train: unknown key 'fil'", r"known keys: .*file"),
    Case("card-undescribed-split", "task card", "eval_splits names a split not under splits",
         card_case(lambda c: c.update(eval_splits=["dev"])),
         r"mytask\.yaml", r"split 'dev'", r"is used but not described under splits"),
    Case("card-one-label", "task card", "a single label",
         card_case(lambda c: c.update(labels=["yes"])),
         r"mytask\.yaml", r"labels", r"must be two or more distinct values, got \['yes'\]"),
    Case("card-empty-grid-axis", "task card", "an empty grid axis in the card",
         card_case(lambda c: c.update(grid={"learning_rate": []})),
         r"mytask\.yaml", r"grid\.learning_rate", r"must be a non-empty list, got \[\]"),
    Case("card-unknown-task", "task card", "a task name with no card",
         lambda tmp, env: finetune("rte2", rte_data(tmp), tmp, env),
         r"'rte2'", r"unknown task", r"known: .*rte"),
    Case("card-unknown-option", "task card", "a misspelt family option (doc_strid) in a SQuAD card",
         lambda tmp, env: finetune(str(write(tmp / "squad.yaml", Path("tasks/squad/v1.yaml").read_text().replace(
             "doc_stride:", "doc_strid:"))), squad_data(tmp, squad_doc(qa())), tmp, env),
         r"squad\.yaml", r"options\.doc_strid", r"is not a SQuAD option \(known: .*doc_stride"),
    # ---------------------------------------------------------------- SQuAD JSON (finetune squad --data_dir)
    Case("squad-duplicate-id", "SQuAD JSON", "two questions with one id",
         squad_case(squad_doc(qa("q1"), extra_paragraph=[qa("q1")])),
         r"train-v1\.1\.json", r"question 'q1' \(article 'Trees'\)", r"duplicate question id .*ids must be unique"),
    Case("squad-missing-question", "SQuAD JSON", "a question without its text",
         squad_case(squad_doc({"id": "q7", "answers": [{"text": "lemon tree", "answer_start": 21}]})),
         r"train-v1\.1\.json", r"question 'q7'", r"empty question; expected the question text"),
    Case("squad-missing-id", "SQuAD JSON", "a question without an id",
         squad_case(squad_doc({"question": "Where?", "answers": []})),
         r"train-v1\.1\.json", r"article 'Trees', paragraph 0", r'no "id" \(expected a non-empty string\)'),
    Case("squad-missing-context", "SQuAD JSON", "a paragraph without context",
         squad_case({"version": "1.1", "data": [{"title": "Trees", "paragraphs": [{"qas": [qa()]}]}]}),
         r"train-v1\.1\.json", r"article 'Trees', paragraph 0", r'"context" must be a string, got NoneType'),
    Case("squad-missing-answers", "SQuAD JSON", "a training question without answers",
         squad_case(squad_doc({"id": "q3", "question": "Where?"})),
         r"train-v1\.1\.json", r"question 'q3'", r"without answers; expected at least one answer"),
    Case("squad-answer-start-type", "SQuAD JSON", "answer_start given as a string",
         squad_case(squad_doc(qa("q4", start="20"))),
         r"train-v1\.1\.json", r"question 'q4'", r'needs a string "text" and an integer "answer_start"'),
    Case("squad-no-data-list", "SQuAD JSON", "a JSON object without the data list",
         squad_case('{"version": "1.1"}'), r"train-v1\.1\.json", r'"data"', r"expected a JSON object with a"),
    Case("squad-invalid-json", "SQuAD JSON", "text that is not JSON",
         squad_case('{"version": "1.1",\n "data": [\n'), r"train-v1\.1\.json", r"json:3:1:",
         r"not valid JSON .*expected the SQuAD layout"),
    Case("squad-v1-unanswerable", "SQuAD JSON", "an unanswerable question in v1 training data",
         squad_case(squad_doc(qa("q1"), {"id": "q9", "question": "Why?", "answers": [], "is_impossible": True})),
         r"train-v1\.1\.json", r"question 'q9'", r"card is SQuAD v1 .*use a v2\.0 card"),
    Case("squad-all-answers-bad", "SQuAD JSON", "training data whose only answer is out of range",
         squad_case(squad_doc(qa("q5", start=999))),
         r"train-v1\.1\.json", r"all 1 skipped", r"no usable questions left .*expected at least one question whose "
         r"answer text is found at its answer_start"),
    Case("squad-answers-counted", "SQuAD JSON", "an answer that does not match the context, one with answer_start "
         "out of range", counted_squad_answers, r"train-v1\.1\.json", r"first: q2",
         r"2 answers do not match the context at answer_start", code=0),
    Case("squad-skip-bad-rows", "SQuAD JSON", "--skip_bad_rows with an empty question and a duplicate id",
         skip_squad, r"train-v1\.1\.json", r"skipped 2 malformed questions", r"--skip_bad_rows", code=0),
    Case("score-squad-predictions-not-object", "SQuAD JSON", "`score squad` with predictions given as a list",
         score_squad(squad_doc(qa()), ["lemon tree"]),
         r"predictions\.json", r"predictions\.json:", r"expected a JSON object mapping question id to answer text"),
    Case("score-squad-unknown-id", "SQuAD JSON", "`score squad` with a prediction for a question not in the data",
         score_squad(squad_doc(qa()), {"q1": "lemon tree", "zz9": "apple"}),
         r"predictions\.json", r"'zz9'", r"are not questions of .*dev-v1\.1\.json"),
    Case("score-squad-data-not-json", "SQuAD JSON", "`score squad` with a data file that is not JSON",
         score_squad("{oops", {"q1": "lemon tree"}),
         r"dev-v1\.1\.json", r"line 1", r"expected a .*JSON file"),
    # ---------------------------------------------------------------- SWAG CSV (finetune swag --data_dir)
    Case("swag-missing-column", "SWAG CSV", "a header without ending3",
         swag_case(",sent1,sent2,ending0,ending1,ending2,label\n0,a,b,c,d,e,1\n"),
         r"train\.csv", r"train\.csv:1:", r"header has no column 'ending3'; expected the columns"),
    Case("swag-field-count", "SWAG CSV", "a row with a field missing",
         swag_case(SWAG_HEADER + SWAG_ROWS + "2,The man,He,a,b,c,1\n"),
         r"train\.csv", r"train\.csv:4:", r"expected 8 comma-separated fields \(as the header\), found 7"),
    Case("swag-label-out-of-range", "SWAG CSV", "label 7 with four endings",
         swag_case(SWAG_HEADER + "0,The man,He,a,b,c,d,7\n"),
         r"train\.csv", r"train\.csv:2:", r"label 7 is out of range; expected the right ending's index 0\.\.3"),
    Case("swag-empty-ending", "SWAG CSV", "an empty ending",
         swag_case(SWAG_HEADER + SWAG_ROWS + "2,The man,He,a,,c,d,0\n"),
         r"train\.csv", r"train\.csv:4:", r"empty 'ending1'; expected a non-empty ending"),
    Case("swag-unclosed-quote", "SWAG CSV", "a quote that is never closed",
         swag_case(SWAG_HEADER + '0,"The man,He,a,b,c,d,0\n'),
         r"train\.csv", r"train\.csv:2:", r"cannot parse the CSV record"),
    Case("swag-empty-file", "SWAG CSV", "an empty file",
         swag_case(""), r"train\.csv", r"empty file", r"expected a header row \(sent1, sent2, ending0"),
    Case("swag-skip-bad-rows", "SWAG CSV", "--skip_bad_rows with a bad label and a short row",
         skip_swag, r"train\.csv", r"skipped 2 malformed rows", r"--skip_bad_rows", code=0),
    # ---------------------------------------------------------------- CoNLL (finetune conll2003 --data_dir)
    Case("conll-column-count", "CoNLL", "a line with 3 columns in a 4-column file",
         conll_case("the DT B-NP O\nman NN B-PER\n\n"),
         r"train\.txt", r"train\.txt:2:", r"expected 4 whitespace-separated columns \(word POS chunk NER\) like the "
         r"file's first line, found 3"),
    Case("conll-first-line-columns", "CoNLL", "a first line with 2 columns",
         conll_case("the O\nman B-PER\n\n"),
         r"train\.txt", r"train\.txt:1:", r"expected 4 whitespace-separated columns .* or 1 .*found 2"),
    Case("conll-illegal-tag", "CoNLL", "a tag outside the card's types (B-PERSON)",
         conll_case("the DT B-NP O\nman NN I-NP B-PERSON\n\n"),
         r"train\.txt", r"train\.txt:2:", r"tag 'B-PERSON' is not O or B-/I- followed by one of the types PER, ORG"),
    Case("conll-empty-document", "CoNLL", "-DOCSTART- followed by another -DOCSTART-",
         conll_case("-DOCSTART- -X- -X- O\n\n-DOCSTART- -X- -X- O\n\nthe DT B-NP O\n\n"),
         r"train\.txt", r"train\.txt:1:", r"starts an empty document .*expected at least one sentence"),
    Case("conll-mixed-scheme", "CoNLL", "IOB1 and IOB2 tags in one file",
         conll_case("man NN I-NP I-PER\n\nthe DT B-NP O\nlemon NN I-NP B-ORG\n\n"),
         r"train\.txt", r"train\.txt:4:", r"expected one tagging scheme per file"),
    Case("conll-words-only-training", "CoNLL", "training data without tags",
         conll_case("the\nman\n\n"), r"train\.txt", r"train\.txt:1:", r"needs NER tags; expected 4 columns"),
    Case("conll-empty-file", "CoNLL", "an empty file",
         conll_case(""), r"train\.txt", r"no sentences", r"expected CoNLL-2003 data"),
    Case("conll-skip-bad-rows", "CoNLL", "--skip_bad_rows with an empty document and an illegal tag",
         skip_conll, r"train\.txt", r"skipped 1 malformed sentences and 1 empty documents", r"--skip_bad_rows",
         code=0),
    Case("extract-features-bad-conll", "CoNLL", "`extract-features` on a file with an illegal tag",
         lambda tmp, env: ["extract-features", "--model", str(env.encoder), "--tokenizer", str(env.vocab),
                           "--input", str(write(tmp / "sents.txt", "the DT B-NP O\nman NN I-NP X-PER\n\n")),
                           "--output_dir", str(tmp / "features"), "--max_seq_length", "32"],
         r"sents\.txt", r"sents\.txt:2:", r"tag 'X-PER' is not O or B-/I-"),
    # ---------------------------------------------------------------- pre-training corpora (pretrain-data, tokenizer)
    Case("corpus-empty", "pre-training corpus", "an empty corpus file",
         pretrain_data(""), r"corpus\.txt", r"the file is empty", r"expected text"),
    Case("corpus-one-document", "pre-training corpus", "a corpus of one document",
         pretrain_data("The man walks to the tree.\nThe woman looks at the apple.\n"),
         r"corpus\.txt", r"1 document\(s\) with text", r"next-sentence prediction needs at least two"),
    Case("corpus-blank-lines", "pre-training corpus", "a corpus of blank lines only",
         pretrain_data("\n \n\n"), r"corpus\.txt", r"0 document\(s\) with text", r"needs at least two"),
    Case("corpus-binary", "pre-training corpus", "a binary file (all 256 byte values)",
         pretrain_data(bytes(range(256)) * 4), r"corpus\.txt", r"byte \d+", r"expected a text file"),
    Case("corpus-binary-nul", "pre-training corpus", "a binary file of ASCII and NUL bytes (e.g. a tensor dump)",
         pretrain_data(b"PK\x03\x04" + b"\x00" * 64 + b"data.pkl" + b"\x00\x01\x02" * 40),
         r"corpus\.txt", r"byte 4", r"expected a text file"),
    Case("tokenizer-empty-file", "pre-training corpus", "`tokenizer` on an empty file",
         lambda tmp, env: ["tokenizer", "--input", str(write(tmp / "empty.txt", "")), "--vocab_size", "50",
                           "--output_dir", str(tmp / "tok")],
         r"empty\.txt", r"the file is empty", r"expected text"),
    Case("tokenizer-binary-file", "pre-training corpus", "`tokenizer` on a binary file",
         lambda tmp, env: ["tokenizer", "--input", str(write(tmp / "model.bin", b"\x00\x01" * 100)),
                           "--vocab_size", "50", "--output_dir", str(tmp / "tok")],
         r"model\.bin", r"byte 0", r"expected a text file"),
    Case("recipe-config-unknown-key", "pre-training config", "the recipe config with a misspelt key",
         pretrain_config("train_data: data\ntokenizer: vocab.txt\nlearning_rat: 1.0e-4\n"),
         r"recipe\.yaml", r"unknown key 'learning_rat'", r"did you mean .*learning_rate", code=1),
    Case("recipe-config-wrong-type", "pre-training config", "the recipe config with max_steps: many",
         pretrain_config("train_data: data\ntokenizer: vocab.txt\nmax_steps: many\n"),
         r"recipe\.yaml", r"max_steps", r"must be int, got str 'many'", code=1),
    # ---------------------------------------------------------------- precision (bf16 on the CPU)
    Case("precision-unknown", "precision", "`finetune --precision fp16` (not one of the choices)",
         lambda tmp, env: finetune("rte", rte_data(tmp), tmp, env, "--precision", "fp16"),
         r"argument --precision", None, r"invalid choice: 'fp16' \(choose from 'auto', 'bf16', 'fp32'\)"),
    Case("precision-fp16-on-cpu", "precision", "`finetune --fp16` on a CPU",
         lambda tmp, env: finetune("rte", rte_data(tmp), tmp, env, "--fp16"),
         r"--fp16", None, r"fp16 autocast on a CPU is not supported .*expected --precision bf16 \(or --bf16\) or fp32"),
    Case("precision-flags-disagree", "precision", "`finetune --precision fp32 --bf16`",
         lambda tmp, env: finetune("rte", rte_data(tmp), tmp, env, "--precision", "fp32", "--bf16"),
         r"--precision fp32 and --bf16 True", None, r"disagree; expected one of them"),
    Case("precision-recipe-fp16-on-cpu", "precision", "the recipe with `mixed_precision=fp16` on a CPU",
         recipe_run("mixed_precision=fp16", "phase1_fraction=1"), r"mixed_precision=fp16", None,
         r"on a CPU: fp16 autocast on a CPU is not supported .*expected mixed_precision=bf16, no or auto", code=1),
    # ---------------------------------------------------------------- LoRA and ONNX export
    Case("lora-rank-zero", "LoRA and export", "`finetune --lora_r 0`",
         lambda tmp, env: finetune("rte", rte_data(tmp), tmp, env, "--lora_r", "0"),
         r"--lora_r 0", None, r"the LoRA rank must be a whole number of at least 1 \(leave --lora_r out"),
    Case("lora-target-unknown", "LoRA and export", "`finetune --lora_r 4 --lora_target_modules qkv` (no such layer)",
         lambda tmp, env: finetune("rte", rte_data(tmp), tmp, env, "--lora_r", "4", "--lora_target_modules", "qkv"),
         r"--lora_target_modules", r"qkv matches no linear layer of BertSuiteForSequenceClassification",
         r"its linear layers are named .*query.*value"),
    Case("lora-ranks-with-rank", "LoRA and export", "`grid --lora_ranks 4 8 --lora_r 4`",
         lambda tmp, env: ["grid", *finetune("rte", rte_data(tmp), tmp, env)[1:], "--lora_ranks", "4", "8",
                           "--lora_r", "4"],
         r"--lora_r with --lora_ranks", None, r"give the ranks with --lora_ranks only"),
    Case("export-onnx-not-a-checkpoint", "LoRA and export", "`export --to onnx FOLDER OUT` on a folder without "
         "config.json",
         lambda tmp, env: ["export", "--to", "onnx", str(write(tmp / "notes" / "readme.txt", "hello").parent),
                           str(tmp / "out")],
         r"notes", r"not a checkpoint \(found: readme\.txt\)", r"expected a folder with config\.json"),
    Case("export-onnx-opset", "LoRA and export", "`export --to onnx RUN OUT --opset 30`",
         lambda tmp, env: ["export", "--to", "onnx", str(env.classifier), str(tmp / "out"), "--opset", "30"],
         r"--opset 30", None, r"not supported; expected 14\.\.22"),
    # ---------------------------------------------------------------- decontamination
    Case("decontaminate-against-unreadable", "decontamination", "`decontaminate --against model.bin` (not text)",
         lambda tmp, env: ["decontaminate", "--input", str(write(tmp / "c.txt", "A sentence here.\n")), "--against",
                           str(write(tmp / "model.bin", bytes(range(256)) * 4)), "--output_dir", str(tmp / "out")],
         r"model\.bin", r"cannot read it \(not UTF-8 text\) \(--against\)", r"expected a GLUE TSV, SQuAD JSON"),
    Case("decontaminate-ngram-too-small", "decontamination", "`decontaminate --ngram 2`",
         lambda tmp, env: ["decontaminate", "--input", str(write(tmp / "c.txt", "A sentence here.\n")), "--against",
                           str(write(tmp / "e.txt", "a sentence\n")), "--ngram", "2", "--output_dir", str(tmp / "out")],
         r"--ngram 2", None, r"below 3; shorter sequences match common phrases everywhere"),
    Case("decontaminate-emptied", "decontamination", "`decontaminate` whose --against holds the whole input",
         lambda tmp, env: ["decontaminate", "--input", str(write(tmp / "c.txt", "One whole sentence here.\n")),
                           "--against", str(tmp / "c.txt"), "--ngram", "3", "--output_dir", str(tmp / "out")],
         r"--input", r"every one of the 1 sentences", r"nothing is left; expected a corpus other than the evaluation"),
    # ---------------------------------------------------------------- compare, SQuAD-small, the left-to-right model
    Case("compare-one-model", "compare", "`compare` with one --model", lambda tmp, env: compare(tmp, env, models=("a",)),
         r"--model", None, r"1 model given; a comparison needs at least two"),
    Case("compare-duplicate-name", "compare", "`compare --model a=M a=M`",
         lambda tmp, env: compare(tmp, env, models=("a", "a")),
         r"--model a=", None, r"the name a is given twice; expected one --model per name"),
    Case("compare-not-a-checkpoint", "compare", "`compare --model x=FOLDER` on a folder without config.json",
         lambda tmp, env: compare(tmp, env) + ["--model", f"x={write(tmp / 'notes' / 'a.txt', 'hi').parent}"],
         r"--model x=", r"notes", r"is not a checkpoint \(no config.json\); expected a folder written by"),
    Case("compare-one-seed", "compare", "`compare --seeds 1`", lambda tmp, env: compare(tmp, env, seeds=("1",)),
         r"--seeds 1", None, r"a standard error needs at least two seeds"),
    Case("compare-unknown-baseline", "compare", "`compare --baseline` naming no model",
         lambda tmp, env: compare(tmp, env, baseline="nobody"),
         r"--baseline nobody", None, r"not one of the models; expected one of a, b"),
    Case("compare-labels-above-train", "compare", "`compare --task rte@10` on 3 training examples",
         lambda tmp, env: compare(tmp, env, task="rte@10"),
         r"--task rte@10", None, r"10 labels is above rte's train size \(3 examples\); expected at most 3"),
    Case("squad-small-v2", "compare", "`squad-small --input` a SQuAD v2.0 file",
         lambda tmp, env: ["squad-small", "--input", str(write(tmp / "dev-v2.0.json", json.dumps({"data": [
             {"title": "t", "paragraphs": [{"context": "c", "qas": [{"id": "1", "question": "q", "answers": [],
                                                                      "is_impossible": True}]}]}]}))),
                           "--output_dir", str(tmp / "small")],
         r"dev-v2\.0\.json", None, r"unanswerable questions \(SQuAD v2.0\); expected a v1.1 file"),
    Case("export-causal-classifier", "compare", "`export --to bert` of a left-to-right classifier",
         lambda tmp, env: ["export", "--to", "bert", str(causal_classifier(tmp, env)), str(tmp / "stock")],
         r"causal", None, r"pools its last real token, while stock BertForSequenceClassification pools position 0"),
    # ---------------------------------------------------------------- dashboard
    Case("dashboard-no-study", "dashboard", "`dashboard FOLDER` on a folder that holds no grid",
         lambda tmp, env: ["dashboard", str(write(tmp / "notes" / "notes.txt", "hello").parent)],
         r"notes", r"no grid study \(no grid\.db; found: notes\.txt\)", r"expected the --output_dir of a `bert-suite grid`"),
    Case("dashboard-storage-unreachable", "dashboard", "`dashboard --storage postgresql+psycopg://grid:secret@127.0.0.1:1/db` "
         "(nothing listens there)",
         lambda tmp, env: ["dashboard", "--storage", "postgresql+psycopg://grid:secret@127.0.0.1:1/db"],
         r"--storage postgresql\+psycopg://grid:\*\*\*@127\.0\.0\.1:1/db", None,
         r"cannot read the grid study there .*expected a reachable database"),
    Case("dashboard-port-in-use", "dashboard", "`dashboard RUN --port P` where another program listens on P",
         lambda tmp, env: ["dashboard", str(grid_study(tmp)), "--port", str(listening_port())],
         r"--port \d+", r"127\.0\.0\.1:\d+ is in use", r"expected a free port"),
    # ---------------------------------------------------------------- tokenizer / vocabulary
    Case("vocab-without-mask", "tokenizer", "`pretrain-data` with a vocab.txt lacking [MASK]",
         pretrain_data(None, [t for t in VOCAB if t != "[MASK]"]),
         r"vocab\.txt", r"no \[MASK\] token", r"a BERT vocabulary needs \[PAD\] \[UNK\] \[CLS\] \[SEP\] \[MASK\]"),
    Case("vocab-empty", "tokenizer", "`pretrain-data` with an empty vocab.txt",
         pretrain_data(None, ""), r"vocab\.txt", r"the vocabulary file is empty", r"expected"),
    Case("finetune-vocab-without-cls", "tokenizer", "`finetune` with a vocab.txt lacking [CLS] and [SEP]",
         lambda tmp, env: with_tokenizer(finetune("rte", rte_data(tmp), tmp, env), write(
             tmp / "vocab.txt", "\n".join(t for t in VOCAB if t not in ("[CLS]", "[SEP]")) + "\n")),
         r"vocab\.txt", r"no \[CLS\] token", r"a BERT vocabulary needs"),
    Case("tokenizer-larger-than-model", "tokenizer", "a vocabulary larger than the model's embeddings",
         lambda tmp, env: with_tokenizer(finetune("rte", rte_data(tmp), tmp, env, model=str(env.classifier)),
                                         write(tmp / "big_vocab.txt", "\n".join(VOCAB + [f"w{i}" for i in range(20)]))),
         r"classifier", r"39 tokens", r"vocab_size \(19\).*expected the tokenizer the model was trained with"),
    # ---------------------------------------------------------------- model folders
    Case("model-without-weights", "model folder", "`predict` with a folder holding config.json only",
         predict_rte(lambda tmp, env: model_copy(tmp, env, "no_weights", keep=("config.json",)),
                     "--max_seq_length", "32"),
         r"no_weights", r"no file named model\.safetensors", r"expected a checkpoint folder with config\.json and "
         r"model\.safetensors"),
    Case("model-not-a-checkpoint", "model folder", "`finetune --model` on a folder that is not a checkpoint",
         lambda tmp, env: finetune("rte", rte_data(tmp), tmp, env,
                                   model=str(write(tmp / "notes" / "README.md", "my notes").parent)),
         r"notes", r"no config\.json \(found: README\.md\)", r"expected a checkpoint folder"),
    Case("model-not-bert", "model folder", "a checkpoint whose config.json says model_type gpt2",
         predict_rte(lambda tmp, env: model_copy(tmp, env, "gpt", config=lambda c: c.update(model_type="gpt2")),
                     "--max_seq_length", "32"),
         r"gpt/config\.json", r"model_type 'gpt2'", r"not a BERT checkpoint; expected 'bert' or 'bert_suite'"),
    Case("model-config-mismatch", "model folder", "config.json whose hidden_size does not fit the weights",
         predict_rte(lambda tmp, env: model_copy(tmp, env, "mismatch", config=lambda c: c.update(
             hidden_size=64, intermediate_size=128)), "--max_seq_length", "32"),
         r"mismatch", r"bert\.embeddings\.\S+ has shape \(32,\)", r"the model expects \(64,\)"),
    Case("model-near-miss-key", "model folder", "config.json with a misspelt key (hiden_size)",
         predict_rte(lambda tmp, env: model_copy(tmp, env, "typo", config=lambda c: c.update(hiden_size=c.pop("hidden_size"))),
                     "--max_seq_length", "32"),
         r"typo/config\.json", r"'hiden_size'", r"did you mean 'hidden_size'\?"),
    Case("model-num-labels-mismatch", "model folder", "a 3-output classifier without label names for a 2-label task",
         predict_rte(lambda tmp, env: three_outputs(tmp, env), "--max_seq_length", "32"),
         r"three", r"classifier\.weight has shape \(3, 32\), the model expects \(2, 32\)",
         r"ignore_mismatched_sizes=True"),
    Case("model-attn-implementation", "model folder", "config.json asking for an attention implementation we lack",
         predict_rte(lambda tmp, env: model_copy(tmp, env, "flex", config=lambda c: c.update(
             attn_implementation="flex_attention")), "--max_seq_length", "32"),
         r"flex/config\.json", r"attn_implementation='flex_attention'", r"expected one of: sdpa, eager"),
    Case("model-decoder-flag", "model folder", "config.json with add_cross_attention true (a decoder)",
         predict_rte(lambda tmp, env: model_copy(tmp, env, "decoder", config=lambda c: c.update(
             add_cross_attention=True)), "--max_seq_length", "32"),
         r"decoder/config\.json", r"add_cross_attention=True", r"encoder-only"),
    Case("model-id2label-disagrees", "model folder", "a checkpoint whose id2label names other labels than the card",
         predict_rte(lambda tmp, env: model_copy(tmp, env, "labels", config=lambda c: c.update(
             id2label={"0": "yes", "1": "no"}, label2id={"yes": 0, "no": 1})), "--max_seq_length", "32"),
         r"labels/config\.json", r"id2label \['yes', 'no'\]", r"labels of task card .*\['entailment', 'not_entailment'\]"),
    Case("model-config-not-json", "model folder", "config.json that is not JSON",
         predict_rte(lambda tmp, env: model_copy(tmp, env, "bad_config", config_text="{hidden_size: 32"),
                     "--max_seq_length", "32"),
         r"bad_config", r"config\.json", r"not a valid JSON file"),
    Case("model-too-few-positions", "model folder", "`predict` with --max_seq_length above the model's positions",
         predict_rte(lambda tmp, env: env.classifier, "--max_seq_length", "128"),
         r"--max_seq_length", r"classifier", r"128 exceeds the model's max_position_embeddings \(64\)"),
    Case("extract-features-no-weights", "model folder", "`extract-features` with a folder without weights",
         lambda tmp, env: ["extract-features", "--model", str(model_copy(tmp, env, "no_weights", keep=("config.json",))),
                           "--tokenizer", str(env.vocab), "--input", str(write(tmp / "s.txt", CONLL_GOOD)),
                           "--output_dir", str(tmp / "features"), "--max_seq_length", "32"],
         r"no_weights", r"model\.safetensors", r"expected a checkpoint folder"),
    Case("glue-package-not-a-run", "model folder", "`glue-package` with a folder that is not a run",
         lambda tmp, env: ["glue-package", str(env.classifier), "--output_dir", str(tmp / "package")],
         r"classifier", r"run_manifest\.json", r"not a finetune or grid output folder"),
    Case("glue-package-bad-manifest", "model folder", "`glue-package` with a run_manifest.json that is not JSON",
         lambda tmp, env: ["glue-package", str(write(tmp / "run" / "run_manifest.json", "{task: rte").parent),
                           "--output_dir", str(tmp / "package")],
         r"run_manifest\.json", r"line 1", r"expected the JSON manifest"),
    # ---------------------------------------------------------------- CLI flags
    Case("flag-negative-learning-rate", "CLI flag", "`finetune --learning_rate -1e-5`",
         lambda tmp, env: finetune("rte", rte_data(tmp), tmp, env, "--learning_rate", "-1e-5"),
         r"learning_rate", r"-1e-05", r"must be positive"),
    Case("flag-learning-rate-not-a-number", "CLI flag", "`finetune --learning_rate fast`",
         lambda tmp, env: finetune("rte", rte_data(tmp), tmp, env, "--learning_rate", "fast"),
         r"--learning_rate", r"'fast'", r"invalid float value"),
    Case("flag-zero-epochs", "CLI flag", "`finetune --num_train_epochs 0`",
         lambda tmp, env: finetune("rte", rte_data(tmp), tmp, env, "--num_train_epochs", "0"),
         r"num_train_epochs", r"got 0", r"must be positive"),
    Case("flag-empty-grid-axis", "CLI flag", "`grid --learning_rates` with no value",
         lambda tmp, env: ["grid", "rte", "--model", "preset:tiny", "--learning_rates"],
         r"--learning_rates", r"argument --learning_rates", r"expected at least one argument"),
    Case("flag-negative-grid-axis", "CLI flag", "`grid --learning_rates -3e-5`",
         lambda tmp, env: ["grid", *finetune("rte", rte_data(tmp), tmp, env)[1:], "--learning_rates", "-3e-5"],
         r"learning_rate", r"-3e-05", r"must be positive"),
    Case("flag-max-seq-length-above-positions", "CLI flag", "`finetune --max_seq_length 1024` on a 512-position "
         "preset", lambda tmp, env: finetune("rte", rte_data(tmp), tmp, env, "--max_seq_length", "1024"),
         r"--max_seq_length", r"1024", r"exceeds the preset's max_position_embeddings \(512\)"),
    Case("flag-max-seq-length-zero", "CLI flag", "`finetune --max_seq_length 0`",
         lambda tmp, env: finetune("rte", rte_data(tmp), tmp, env, "--max_seq_length", "0"),
         r"--max_seq_length", r"got 0", r"must be at least 8"),
    Case("flag-misspelt-training-flag", "CLI flag", "`finetune --learning_rat 1e-5` (an abbreviated flag)",
         lambda tmp, env: finetune("rte", rte_data(tmp), tmp, env, "--learning_rat", "1e-5"),
         r"--learning_rat:", r"did you mean --learning_rate\?", r"not a TrainingArguments flag.*expected the full name"),
    Case("flag-unknown-training-flag", "CLI flag", "`finetune --no_such_flag 1`",
         lambda tmp, env: finetune("rte", rte_data(tmp), tmp, env, "--no_such_flag", "1"),
         r"--no_such_flag", r"--no_such_flag:", r"not a TrainingArguments flag; expected the full name"),
    Case("flag-grid-axis-owned", "CLI flag", "`grid rte --learning_rate 1e-5` (a flag the grid's axis sets)",
         lambda tmp, env: ["grid", "rte", "--model", str(env.classifier), "--tokenizer", str(env.vocab),
                           "--data_dir", str(rte_data(tmp)), "--output_dir", str(tmp / "g"), "--learning_rate", "1e-5"],
         r"--learning_rate", r"use --learning_rates", r"the grid sets this for every trial"),
    Case("flag-context-on-classification", "CLI flag", "`finetune rte --context document`",
         lambda tmp, env: finetune("rte", rte_data(tmp), tmp, env, "--context", "document"),
         r"--context", r"rte", r"applies to NER cards"),
    Case("flag-unknown-split", "CLI flag", "`predict --split nosuch`",
         predict_rte(lambda tmp, env: env.classifier, "--max_seq_length", "32", "--split", "nosuch"),
         r"split", r"'nosuch'", r"splits: train, validation, test"),
    Case("flag-layers-out-of-range", "CLI flag", "`extract-features --layers 7` on a 2-layer model",
         lambda tmp, env: ["extract-features", "--model", str(env.encoder), "--tokenizer", str(env.vocab),
                           "--input", str(write(tmp / "s.txt", CONLL_GOOD)), "--output_dir", str(tmp / "f"),
                           "--max_seq_length", "32", "--layers", "7"],
         r"--layers", r"\b7\b", r"outside the model's 3 hidden states"),
    Case("flag-batch-size-zero", "CLI flag", "`extract-features --batch_size 0`",
         lambda tmp, env: ["extract-features", "--model", str(env.encoder), "--input", "s.txt", "--output_dir",
                           str(tmp / "f"), "--batch_size", "0"],
         r"--batch_size", r"got 0", r"must be at least 1"),
    Case("flag-dupe-factor-zero", "CLI flag", "`pretrain-data --dupe_factor 0`",
         pretrain_data(None, None, "--dupe_factor", "0"), r"dupe_factor", r"got 0", r"must be at least 1"),
    # ---------------------------------------------------------------- data-file flags (--train_file ..., no card)
    Case("files-unknown-extension", "Data-file flags", "`--train_file train.xlsx` (card-less)",
         files_case(("train.xlsx", "sentence1,sentence2,label\n")),
         r"train\.xlsx", r"unknown extension '\.xlsx'", r"expected a CSV, TSV, JSON, JSON Lines or Parquet file"),
    Case("files-missing-text-column", "Data-file flags", "`finetune rte --train_file x.csv` whose header lacks sentence2",
         files_case(("x.csv", "sentence1,label\nthe man walks,entailment\n"), task="rte", validation=("dev.csv", RTE_CSV)),
         r"x\.csv", r"no column 'sentence2'", r"expected the task's text and label columns .*found: sentence1, label"),
    Case("files-no-label-column", "Data-file flags", "a card-less train file without a label column",
         files_case(("nolabel.csv", "text,target\nthe man walks,pos\nthe woman looks,neg\n")),
         r"nolabel\.csv", r"no label column 'label' \(found: text, target\)", r"--label_column"),
    Case("files-mixed-label-types", "Data-file flags", "labels 1 and pos in one train file",
         files_case(("mixed.csv", "text,label\nthe man walks,1\nthe woman looks,pos\n")),
         r"mixed\.csv", r"row 1: '1'\) and text \(row 2: 'pos'\)", r"expected labels of one type"),
    Case("files-validation-label-unseen", "Data-file flags", "a validation file with a label the train file lacks",
         files_case(("train.csv", OWN_CSV), validation=("dev.csv", OWN_CSV + "the man looks,berry,maybe\n")),
         r"dev\.csv", r"row 3: label 'maybe'", r"does not occur in the train file \S*train\.csv \(labels: neg, pos\)"),
    Case("files-test-label-unseen", "Data-file flags", "`finetune --test_file test.csv` whose labelled rows have a "
         "label the train file lacks (a labelled test file is scored)",
         lambda tmp, env: files_case(("train.csv", OWN_CSV), "--test_file", str(write(
             tmp / "test.csv", OWN_CSV + "the man looks,berry,maybe\n")))(tmp, env),
         r"test\.csv", r"row 3: label 'maybe'", r"does not occur in the train file \S*train\.csv \(labels: neg, pos\)"),
    Case("files-empty-file", "Data-file flags", "`--train_file` an empty file",
         files_case(("empty.csv", "")), r"empty\.csv", r"empty file", r"expected rows of text columns and a label column"),
    Case("files-header-only", "Data-file flags", "`--train_file` a CSV with a header and no rows",
         files_case(("header.csv", "sentence1,sentence2,label\n")),
         r"header\.csv", r"no data rows \(header only\?\)", r"expected rows"),
    Case("files-squad-csv", "Data-file flags", "`finetune squad --train_file train.csv`",
         files_case(("train.csv", OWN_CSV), task="squad", validation=("dev.json", json.dumps(squad_doc(qa())))),
         r"train\.csv", r"the squad family cannot read \.csv files", r"expected the official SQuAD JSON"),
    Case("files-ner-csv", "Data-file flags", "`finetune conll2003 --train_file train.csv`",
         files_case(("train.csv", OWN_CSV), task="conll2003", validation=("valid.txt", CONLL_GOOD)),
         r"train\.csv", r"the ner family cannot read \.csv files", r"expected a CoNLL file"),
    Case("files-no-validation-file", "Data-file flags", "card-less `--train_file` without `--validation_file`",
         files_case(("train.csv", OWN_CSV), validation=None),
         r"--validation_file", None, r"a task without a card needs a dev file"),
    Case("files-no-task-no-train-file", "Data-file flags", "`finetune` with no TASK and no `--train_file`",
         lambda tmp, env: files_run(tmp, env), r"--train_file", None, r"give a TASK"),
    Case("files-task-family-with-card", "Data-file flags", "`finetune rte --task_family ner`",
         lambda tmp, env: finetune("rte", rte_data(tmp), tmp, env, "--task_family", "ner"),
         r"--task_family ner", r"rte\.yaml is a classification task", r"--task_family is for tasks without a card"),
    Case("files-text-columns-with-card", "Data-file flags", "`finetune rte --text_columns a b`",
         lambda tmp, env: finetune("rte", rte_data(tmp), tmp, env, "--text_columns", "a", "b"),
         r"--text_columns", r"rte\.yaml names its columns", r"for tasks without a card"),
    Case("files-max-train-samples-zero", "Data-file flags", "`--max_train_samples 0`",
         files_case(("train.csv", OWN_CSV), "--max_train_samples", "0"),
         r"--max_train_samples", r"got 0", r"must be at least 1"),
    Case("files-predict-no-run-card", "Data-file flags", "`predict --model FOLDER` (no TASK) on a folder without "
         "task_card.yaml",
         lambda tmp, env: ["predict", "--model", str(model_copy(tmp, env, "checkpoint")), "--tokenizer", str(env.vocab),
                           "--test_file", str(write(tmp / "test.csv", "sentence1,sentence2\nthe man,apple\n")),
                           "--output_dir", str(tmp / "out"), "--max_seq_length", "32"],
         r"checkpoint", r"no task_card\.yaml beside the checkpoint", r"give the TASK"),
    Case("files-ner-tag-ids", "Data-file flags", "card-less `--task_family ner` on JSON Lines whose ner_tags are "
         "integers", files_case(("ner.jsonl", '{"tokens": ["the", "man"], "ner_tags": [0, 1]}\n'), "--task_family",
                                "ner", validation=("dev.jsonl", '{"tokens": ["the", "man"], "ner_tags": [0, 1]}\n')),
         r"ner\.jsonl", r"row 1: ner_tags holds class ids \(0\) without names", r"expected tag names"),
    Case("files-test-label-type", "Data-file flags", "`finetune --test_file test.csv` whose labels are class ids "
         "(numbers) where the train file has class names",
         lambda tmp, env: files_case(("train.csv", OWN_CSV), "--test_file", str(write(
             tmp / "test.csv", "sentence1,sentence2,label\nthe man,apple,0\nthe woman,berry,1\n")))(tmp, env),
         r"test\.csv", r"holds numbers \(row 1: 0\)", r"has class names \(neg, pos\); expected labels of the train "
         r"file's type"),
    Case("files-test-file-missing", "Data-file flags", "`finetune --test_file missing.csv` (no such file)",
         files_case(("train.csv", OWN_CSV), "--test_file", "missing.csv"),
         r"missing\.csv", r"--test_file", r"file not found"),
    # ---------------------------------------------------------------- grid storage (--storage, shared grids)
    Case("storage-driver-missing", "Grid storage", "`grid --storage mysql://...` without a MySQL driver",
         lambda tmp, env: ["grid", *finetune("rte", rte_data(tmp), tmp, env)[1:], "--storage",
                           "mysql://grid:secret@127.0.0.1:1/db"],
         r"--storage mysql://grid:\*\*\*@127\.0\.0\.1:1/db", r"driver 'MySQLdb' is not installed",
         r"pip install mysqlclient"),
    Case("storage-unreachable", "Grid storage", "`grid --storage postgresql+psycopg://...` on a port nobody listens on",
         lambda tmp, env: ["grid", *finetune("rte", rte_data(tmp), tmp, env)[1:], "--storage",
                           "postgresql+psycopg://grid:secret@127.0.0.1:1/db"],
         r"--storage postgresql\+psycopg://grid:\*\*\*@127\.0\.0\.1:1/db", r"Connection refused",
         r"cannot open the database .*expected a reachable database URL"),
    Case("storage-not-a-url", "Grid storage", "`grid --storage grid.db` (a path, not a URL)",
         lambda tmp, env: ["grid", *finetune("rte", rte_data(tmp), tmp, env)[1:], "--storage", "grid.db"],
         r"--storage grid\.db", r"not a database URL", r"expected e\.g\. sqlite:///grid\.db"),
    Case("storage-grace-below-heartbeat", "Grid storage", "`grid --heartbeat_interval 30 --grace_period 10`",
         lambda tmp, env: ["grid", *finetune("rte", rte_data(tmp), tmp, env)[1:], "--grace_period", "10"],
         r"--grace_period", r"\(10 s\)", r"must be longer than --heartbeat_interval \(30 s\)"),
    Case("storage-study-of-another-grid", "Grid storage",
         "`grid --study_name shared` on a study another grid made (other learning rates)",
         lambda tmp, env: _study_of_another_grid(tmp, env), r"study 'shared'",
         r"made by another grid \(learning_rate 0\.001 x .*\); this grid is learning_rate 2e-05 x",
         r"expected the same grid flags .* or another --study_name"),
    Case("grid-folder-of-another-grid", "Grid storage",
         "`grid --output_dir OUT` while workers of another grid are running in OUT",
         lambda tmp, env: _folder_of_another_grid(tmp, env), r"workers of another grid are running in this folder",
         r"\(study rte-grid-other: learning_rate 0\.001 x .*\); this grid is study rte-grid-\w+: learning_rate 2e-05 x",
         r"expected one grid per --output_dir"),
    Case("files-bad-json-lines", "Data-file flags", "a JSON Lines train file whose third line is cut short",
         files_case(("train.jsonl", '{"text": "the man", "label": "pos"}\n{"text": "a man", "label": "neg"}\n'
                                    '{"text": "the woman", "label": \n'), validation=("dev.jsonl", "{}\n")),
         r"train\.jsonl:3:", r"train\.jsonl:3: not valid JSON", r"expected one JSON object per line"),
]

assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"

_HELD = []  # claims of "other grids' workers", held while a case runs (each case has its own folder)


@pytest.fixture(autouse=True, scope="module")
def _release_claims():
    yield
    while _HELD:
        _HELD.pop().__exit__(None, None, None)


def _grid_args(tmp: Path, env: Env, storage: str | None = None) -> list[str]:
    args = ["grid", *finetune("rte", rte_data(tmp), tmp, env)[1:], "--learning_rates", "2e-5", "--batch_sizes", "8",
            "--epochs", "1"]
    return args + (["--storage", storage, "--study_name", "shared"] if storage else [])


def _study_of_another_grid(tmp: Path, env: Env) -> list[str]:
    from bert_suite.grid import check_study_grid, describe_grid, open_study

    storage = f"sqlite:///{tmp / 'shared.db'}"
    other = {"learning_rate": [1e-3], "per_device_train_batch_size": [8], "num_train_epochs": [1], "seed": [42]}
    check_study_grid(open_study(storage, "shared"), describe_grid(other), storage)
    return _grid_args(tmp, env, storage)


def _folder_of_another_grid(tmp: Path, env: Env) -> list[str]:
    from bert_suite.grid import describe_grid, folder_claim

    args = _grid_args(tmp, env)
    out = Path(args[args.index("--output_dir") + 1])
    other = {"learning_rate": [1e-3], "per_device_train_batch_size": [8], "num_train_epochs": [1], "seed": [42]}
    claim = folder_claim(out, "rte-grid-other", describe_grid(other))
    claim.__enter__()  # a live worker of that grid (flock: another open file, so it conflicts in-process too)
    _HELD.append(claim)
    return args


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, env: Env, tmp_path: Path, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # cards are read from tasks/ like the CLI does
    made = case.make(tmp_path, env)
    code = cli_main(made) if isinstance(made, list) else made or 0  # else a reader was called directly
    out, err = capsys.readouterr()
    assert code == case.code, f"exit {code}, expected {case.code}\nstdout: {out[-2000:]}\nstderr: {err[-2000:]}"
    assert "Traceback" not in out + err
    text = out
    if case.code != 0:
        message = [line for line in err.splitlines() if re.match(r"(bert-suite [\w-]+|pretrain): error: ", line)]
        assert len(message) == 1 and err.rstrip().splitlines()[-1] == message[0], \
            f"expected one error line, last, got:\n{err[-2000:]}"
        text = message[0]
    for part, pattern in (("file/flag", case.names), ("record", case.record), ("expectation", case.expect)):
        if pattern is not None:
            assert re.search(pattern, text), f"{part} {pattern!r} not in:\n{text}"
