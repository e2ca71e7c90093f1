"""What several test modules share: builders of data and arguments, stock-parity constants, the recipe
loader and the Hub fake. Test modules import these from here and never from one another (test_layout.py
checks that); shared fixtures are in conftest.py."""

import csv
import importlib.util
import json
import os
import random
import sys
import uuid
from pathlib import Path

import torch
import transformers
from transformers import BertConfig

from bert_suite import (
    BertSuiteForMaskedLM,
    BertSuiteForMultipleChoice,
    BertSuiteForNextSentencePrediction,
    BertSuiteForPreTraining,
    BertSuiteForQuestionAnswering,
    BertSuiteForSequenceClassification,
    BertSuiteForTokenClassification,
    BertSuiteModel,
)

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------- GLUE-like pair task

WORDS = "apple berry cherry grape lemon mango olive peach".split()


def write_records_csv(path: Path, rows: list[dict]) -> Path:
    """Rows (dicts with the same keys) as a CSV file with a header."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_rte_like(folder: Path, n_train=600, n_dev=200, seed=0) -> Path:
    """A learnable pair task in RTE's layout: the label is decided by which half of the
    vocabulary sentence2's word comes from; sentence1 is noise."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    rng = random.Random(seed)

    def rows(n, labelled=True):
        out = []
        for i in range(n):
            positive = rng.random() < 0.5
            s1 = " ".join(rng.sample(WORDS, 3))
            s2 = rng.choice(WORDS[:4] if positive else WORDS[4:])
            label = "entailment" if positive else "not_entailment"
            out.append(f"{i}\t{s1}\t{s2}" + (f"\t{label}" if labelled else ""))
        return out

    (folder / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n" + "\n".join(rows(n_train)) + "\n")
    (folder / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n" + "\n".join(rows(n_dev)) + "\n")
    (folder / "test.tsv").write_text("index\tsentence1\tsentence2\n" + "\n".join(rows(50, False)) + "\n")
    return folder


def run_args(data: Path, out: Path, *extra: str) -> list[str]:
    return ["--model", "preset:tiny", "--tokenizer", str(data / "vocab.txt"), "--data_dir", str(data),
            "--output_dir", str(out), "--disable_tqdm", "true", *extra]


# ---------------------------------------------------------------------------------- CoNLL-like NER data

LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]


def conll_text(documents, docstart=True) -> str:
    """documents: [[[(word, tag), ...] per sentence] per document] in the distributed 4-column layout."""
    lines = []
    for document in documents:
        if docstart:
            lines += ["-DOCSTART- -X- -X- O", ""]
        for sentence in document:
            lines += [f"{w} NNP I-NP {t}" for w, t in sentence] + [""]
    return "\n".join(lines) + "\n"


FILLER = "the a met visited in at and said today from works for with near of on was team city report . ,".split()
PER, SURNAMES = "Alice Bruno Carla Dmitri Elena Farid Greta Hiro Karina Marco".split(), "Smith Novak Okafor".split()
LOC, ORG, MISC = "Paris Berlin Lagos Quito Oslo Lima".split(), "Acme Globex Initech Umbrella".split(), "Nobel Euro".split()
# Karina and Marco are split into sub-tokens (Kar ##ina, Mar ##co)
E2E_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *FILLER, *PER[:8], "Kar", "Mar", "##ina", "##co",
             *SURNAMES, *LOC, *ORG, "Corp", *MISC]


def synthetic_sentence(rng):
    """Filler words with one or two entities (a person with an optional surname, a place, a company with an
    optional 'Corp', a misc word) inserted between them; tags in IOB2."""
    chunks = [[(w, "O")] for w in rng.choices(FILLER, k=rng.randint(3, 8))]
    for _ in range(rng.randint(1, 2)):
        kind = rng.choice(["PER", "PER", "LOC", "ORG", "MISC"])
        words = {"PER": [rng.choice(PER)] + ([rng.choice(SURNAMES)] if rng.random() < 0.5 else []),
                 "LOC": [rng.choice(LOC)], "ORG": [rng.choice(ORG)] + (["Corp"] if rng.random() < 0.5 else []),
                 "MISC": [rng.choice(MISC)]}[kind]
        chunks.insert(rng.randrange(len(chunks) + 1), [(w, f"{'I' if i else 'B'}-{kind}") for i, w in enumerate(words)])
    return [x for chunk in chunks for x in chunk]


def to_iob1(sentence):
    out, previous = [], None
    for word, tag in sentence:
        kind = None if tag == "O" else tag[2:]
        out.append((word, f"I-{kind}" if tag.startswith("B-") and kind != previous else tag))
        previous = kind
    return out


def write_synthetic(folder: Path, seed=0) -> Path:
    """train.txt in IOB1 (as the original distribution), valid.txt and test.txt in IOB2; documents of 3-6
    sentences, longer than the test's windows."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(E2E_VOCAB) + "\n")
    rng = random.Random(seed)
    for name, docs, iob1 in (("train.txt", 40, True), ("valid.txt", 20, False), ("test.txt", 10, False)):
        documents = [[synthetic_sentence(rng) for _ in range(rng.randint(3, 6))] for _ in range(docs)]
        if iob1:
            documents = [[to_iob1(s) for s in d] for d in documents]
        (folder / name).write_text(conll_text(documents))
    return folder


# ---------------------------------------------------------------------------- stock transformers parity

VOCAB = 101
TOL = 1e-5

STOCK_CONFIG = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=37, max_position_embeddings=64)


def batch(shape=(3, 11)):
    """Token ids with padding (rows of length 11, 7, 4), a mask, and both segment ids."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, shape, generator=g)
    mask = torch.ones(shape, dtype=torch.long)
    lengths = [shape[-1], 7, 4]
    types = torch.zeros(shape, dtype=torch.long)
    for row, n in enumerate(lengths[: shape[-2]]):
        mask[..., row, n:] = 0
        ids[..., row, n:] = 0
        types[..., row, n // 2 : n] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def labels_for(name, inputs):
    ids = inputs["input_ids"]
    g = torch.Generator().manual_seed(2)
    if name in ("ForPreTraining", "ForMaskedLM"):
        labels = torch.full_like(ids, -100)
        labels[:, 1] = ids[:, 1]
        labels[0, 5] = 7
        out = {"labels": labels}
        if name == "ForPreTraining":
            out["next_sentence_label"] = torch.tensor([0, 1, 1])
        return out
    if name == "ForNextSentencePrediction":
        return {"labels": torch.tensor([0, 1, 1])}
    if name == "ForSequenceClassification":
        return {"labels": torch.tensor([0, 2, 1])}
    if name == "ForSequenceRegression":
        return {"labels": torch.tensor([0.5, 2.0, -1.0])}
    if name == "ForTokenClassification":
        labels = torch.randint(0, 3, ids.shape, generator=g)
        labels[inputs["attention_mask"] == 0] = -100
        return {"labels": labels}
    if name == "ForQuestionAnswering":
        return {"start_positions": torch.tensor([1, 2, 40]), "end_positions": torch.tensor([3, 2, 41])}
    if name == "ForMultipleChoice":
        return {"labels": torch.tensor([1, 0, 1])}
    return {}


# name -> (our class, stock class name, extra config, output fields to compare)
HEADS = {
    "Model": (BertSuiteModel, "BertModel", {}, ["last_hidden_state", "pooler_output"]),
    "ForPreTraining": (BertSuiteForPreTraining, "BertForPreTraining", {}, ["prediction_logits", "seq_relationship_logits", "loss"]),
    "ForMaskedLM": (BertSuiteForMaskedLM, "BertForMaskedLM", {}, ["logits", "loss"]),
    "ForNextSentencePrediction": (BertSuiteForNextSentencePrediction, "BertForNextSentencePrediction", {}, ["logits", "loss"]),
    "ForSequenceClassification": (BertSuiteForSequenceClassification, "BertForSequenceClassification", {"num_labels": 3}, ["logits", "loss"]),
    "ForSequenceRegression": (BertSuiteForSequenceClassification, "BertForSequenceClassification", {"num_labels": 1}, ["logits", "loss"]),
    "ForQuestionAnswering": (BertSuiteForQuestionAnswering, "BertForQuestionAnswering", {}, ["start_logits", "end_logits", "loss"]),
    "ForMultipleChoice": (BertSuiteForMultipleChoice, "BertForMultipleChoice", {}, ["logits", "loss"]),
    "ForTokenClassification": (BertSuiteForTokenClassification, "BertForTokenClassification", {"num_labels": 3}, ["logits", "loss"]),
}


def save_stock(name, folder, bin_weights=False):
    ours, stock_name, extra, _ = HEADS[name]
    torch.manual_seed(0)
    stock = getattr(transformers, stock_name)(BertConfig(**STOCK_CONFIG, **extra)).eval()
    stock.save_pretrained(folder)
    if bin_weights:  # the older format: pickled state dict, read back with weights_only=True
        os.remove(os.path.join(folder, "model.safetensors"))
        torch.save(stock.state_dict(), os.path.join(folder, "pytorch_model.bin"))
    return stock


def inputs_for(name):
    if name == "ForMultipleChoice":
        one = batch()
        return {k: torch.stack([v, v.roll(1, dims=0)], dim=1) for k, v in one.items()}  # (3, 2, 11)
    return batch()


# ---------------------------------------------------------------------------------- pre-training recipe


def write_pretrain_setup(folder: Path) -> Path:
    """In `folder`: a corpus of 60 documents, each drawing its sentences from its own 3 topic words
    (corpus.txt), its 14-token vocabulary (vocab.txt) and NSP instances of length 32 and 64 (data32,
    data64). The recipe's tests train on it (and benchmarks/bf16_seed_spread.py did, at commit a320955)."""
    from bert_suite.pretraining.instances import build_pretraining_dataset

    rng = random.Random(0)
    topics = [WORDS[i: i + 3] for i in range(0, 6)]
    docs = []
    for d in range(60):
        topic = topics[d % len(topics)]
        docs.append("\n".join(" ".join(rng.choice(topic) for _ in range(rng.randint(3, 8))) + " ." for _ in range(6)))
    (folder / "corpus.txt").write_text("\n\n".join(docs) + "\n")
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *WORDS]) + "\n")
    for length in (32, 64):
        build_pretraining_dataset([str(folder / "corpus.txt")], str(folder / "vocab.txt"), str(folder / f"data{length}"),
                                  max_seq_length=length, dupe_factor=3, fmt="lines")
    return folder


def load_recipe():
    spec = importlib.util.spec_from_file_location("pretrain_recipe", REPO / "recipes" / "pretrain.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recipe_args(setup: Path, out: Path, *extra: str) -> list[str]:
    return ["train_data=" + str(setup / "data32"), "train_data_phase2=" + str(setup / "data64"),
            "tokenizer=" + str(setup / "vocab.txt"), "output_dir=" + str(out), "model_size=tiny",
            "learning_rate=0.003", "warmup_steps=2", "per_device_train_batch_size=16",
            "per_device_train_batch_size_phase2=8", "report_to=none", "logging_steps=1", "eval_steps=1000",
            "eval_batches=2", "eval_fraction=0.1", "max_predictions_per_seq=5", "max_predictions_per_seq_phase2=10", *extra]


def killed_and_resumed(recipe, args: list[str], whole: Path, killed: Path, monkeypatch, die_at: int = 9):
    """Run the recipe `args` (output in `whole`) uninterrupted, then again in `killed`, killed while masking
    step `die_at` + 1 (after a checkpoint) and resumed with the same command: (uninterrupted, resumed) histories."""
    from bert_suite.pretraining import loader  # where the batches are masked (in the DataLoader)

    fresh_state()
    history = recipe.main(args)
    again = [a.replace(str(whole), str(killed)) for a in args]
    real = loader.step_masks

    def dies(collator, batch, seed, step, first, causal=False):
        if step == die_at:
            raise KeyboardInterrupt
        return real(collator, batch, seed, step, first, causal)

    monkeypatch.setattr(loader, "step_masks", dies)
    fresh_state()
    try:
        recipe.main(again)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError(f"the run was not killed at step {die_at + 1}")
    monkeypatch.setattr(loader, "step_masks", real)
    fresh_state()
    return history, recipe.main(again)


def fresh_state():
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


# --------------------------------------------------------------------------------------------- Hub fake


class FakeApi:
    """Stands in for huggingface_hub.HfApi and records what push_to_hub asks of it."""

    calls: list = []
    fail_with: Exception | None = None

    def __init__(self, token=None, **kwargs):
        FakeApi.calls.append(("init", token))

    def create_repo(self, repo_id, **kwargs):
        FakeApi.calls.append(("create_repo", repo_id, kwargs))
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, **kwargs):
        FakeApi.calls.append(("upload_folder", kwargs))
        if FakeApi.fail_with:
            raise FakeApi.fail_with


# ---------------------------------------------------------------------------------- PostgreSQL


def fresh_database(postgres_url: str) -> str:
    """A new, empty database on the fixture's server; its storage URL (same driver as postgres_url)."""
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    from common import create_database

    server, _ = postgres_url.rsplit("/", 1)
    return create_database(server, f"db_{uuid.uuid4().hex[:12]}")


# SQuAD-like data (test_squad_e2e, test_compare)
SQUAD_FILLER = ("river stone cloud window paper garden letter market winter summer bridge music silver "
                "forest engine castle island doctor pencil rocket").split()
SQUAD_COLORS, SQUAD_ANIMALS = "red green blue yellow".split(), "horse tiger rabbit eagle".split()
SQUAD_SHADES = ["dark", "light"]
SQUAD_CONTEXT_WORDS = (8, 16)
SQUAD_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "which", "color", "?", *SQUAD_FILLER, *SQUAD_COLORS,
               *SQUAD_ANIMALS, *SQUAD_SHADES]


def write_squad_like(folder: Path, version_2: bool, n_train=400, n_dev=150, seed=0) -> Path:
    """Contexts of filler words with an animal (a distractor) and a colour inserted; the answer to
    "which color ?" is the colour, half the time with its shade ("light blue": a two-token span).
    In v2 a third of the contexts hold no colour: unanswerable. Contexts are longer than the
    windows the test uses, so answers sit in different windows and the max-context rule matters."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(SQUAD_VOCAB) + "\n")
    rng = random.Random(seed)

    def article(n, prefix):
        paragraphs = []
        for i in range(n):
            words = [rng.choice(SQUAD_FILLER) for _ in range(rng.randint(*SQUAD_CONTEXT_WORDS))]
            words.insert(rng.randrange(len(words) + 1), rng.choice(SQUAD_ANIMALS))
            answerable = not version_2 or rng.random() < 2 / 3
            qa = {"id": f"{prefix}{i}", "question": "which color ?", "answers": []}
            if answerable:
                shade = rng.random() >= 0.5
                answer = f"{rng.choice(SQUAD_SHADES)} {rng.choice(SQUAD_COLORS)}" if shade else rng.choice(SQUAD_COLORS)
                at = rng.randrange(len(words) + 1)
                start = len(" ".join(words[:at])) + (1 if at else 0)
                words.insert(at, answer)
                qa["answers"] = [{"text": answer, "answer_start": start}]
            if version_2:
                qa["is_impossible"] = not answerable
            paragraphs.append({"context": " ".join(words), "qas": [qa]})
        return {"version": "v2.0" if version_2 else "1.1", "data": [{"title": "synthetic", "paragraphs": paragraphs}]}

    (folder / "train.json").write_text(json.dumps(article(n_train, "t")))
    (folder / "dev.json").write_text(json.dumps(article(n_dev, "d")))
    return folder


# ---------------------------------------------------------------------------------- ablation studies

ABLATION_WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()


def write_ablation_data(root: Path, seed: int = 0) -> Path:
    """A stand-in for the shared data folder the shipped studies read (BERT_SUITE_DATA): the corpus files at
    their paths (documents whose sentences draw on one topic's words), learnable GLUE tasks in their
    distribution layouts (the label says which half of the words the last sentence comes from), a SQuAD v1.1
    dev set of eight articles (the answer to "which colour ?" is the colour in the context) and CoNLL-2003
    files. One corpus sentence repeats a dev sentence of 8+ words, so decontamination has something to remove."""
    rng = random.Random(seed)
    low, high = ABLATION_WORDS[:6], ABLATION_WORDS[6:]

    def sentence(words, n=None):
        return " ".join(rng.choice(words) for _ in range(n or rng.randint(4, 7)))

    planted = sentence(low, 9)
    docs = ["\n".join(sentence(rng.choice([low, high])) + " ." for _ in range(rng.randint(3, 6))) for _ in range(80)]
    corpus = root / "corpus"
    for relative in ("gutenberg/book.txt", "wikitext-2-raw/wiki.test.raw", "nltk/movie_reviews.txt", "nltk/brown.txt",
                     "nltk/state_union/2000.txt"):
        (corpus / relative).parent.mkdir(parents=True, exist_ok=True)
        part = docs[:20] + ([planted] if relative.startswith("gutenberg") else [])
        docs = docs[20:] + docs[:20]
        (corpus / relative).write_text("\n\n".join(part) + "\n")

    def pair(n, regression=False):
        rows = []
        for _ in range(n):
            positive = rng.random() < 0.5
            s2 = sentence(low if positive else high, 3)
            rows.append((sentence(ABLATION_WORDS), s2, ("5.000" if positive else "0.000") if regression else
                         str(int(positive))))
        return rows

    glue = root / "glue"
    for name in ("MRPC", "STS-B", "RTE", "SST-2", "CoLA"):
        (glue / name).mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 80), ("dev", 30), ("test", 10)):
        rows = pair(n)
        if split == "dev":
            rows[0] = (planted, rows[0][1], rows[0][2])
        labelled = split != "test"
        (glue / "MRPC" / f"{split}.tsv").write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + "".join(
            f"{lab if labelled else 0}\t{i}\t{i + 1}\t{a}\t{b}\n" for i, (a, b, lab) in enumerate(rows)))
        (glue / "RTE" / f"{split}.tsv").write_text("index\tsentence1\tsentence2" + ("\tlabel" if labelled else "") + "\n"
            + "".join(f"{i}\t{a}\t{b}" + (f"\t{'entailment' if lab == '1' else 'not_entailment'}" if labelled else "")
                      + "\n" for i, (a, b, lab) in enumerate(rows)))
        scored = pair(n, regression=True)
        (glue / "STS-B" / f"{split}.tsv").write_text(
            "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2" + ("\tscore" if labelled
                                                                                            else "") + "\n"
            + "".join(f"{i}\tmain\tx\t2012\t{i}\tnone\tnone\t{a}\t{b}" + (f"\t{s}" if labelled else "") + "\n"
                      for i, (a, b, s) in enumerate(scored)))
        single = [(b, lab) for _, b, lab in pair(n + (40 if split == "train" else 0))]
        (glue / "SST-2" / f"{split}.tsv").write_text(("sentence\tlabel\n" if labelled else "index\tsentence\n") + "".join(
            (f"{s}\t{lab}\n" if labelled else f"{i}\t{s}\n") for i, (s, lab) in enumerate(single)))
        if labelled:
            (glue / "CoLA" / f"{split}.tsv").write_text("".join(f"src\t{lab}\t\t{s}\n" for s, lab in single[:n]))
        else:
            (glue / "CoLA" / "test.tsv").write_text("index\tsentence\n" + "".join(f"{i}\t{s}\n" for i, (s, _) in
                                                                                 enumerate(single)))
    colours = ["red", "blue", "green"]
    articles = []
    for a in range(8):
        paragraphs = []
        for p in range(10):
            words = [rng.choice(ABLATION_WORDS) for _ in range(rng.randint(8, 14))]
            at = rng.randrange(len(words) + 1)
            colour = rng.choice(colours)
            start = len(" ".join(words[:at])) + (1 if at else 0)
            words.insert(at, colour)
            paragraphs.append({"context": " ".join(words), "qas": [{"id": f"q{a}-{p}", "question": "which colour ?",
                                                                   "answers": [{"text": colour, "answer_start": start}]}]})
        articles.append({"title": f"article {a}", "paragraphs": paragraphs})
    (root / "squad").mkdir(parents=True, exist_ok=True)
    (root / "squad" / "dev-v1.1.json").write_text(json.dumps({"version": "1.1", "data": articles}))
    write_synthetic(root / "conll2003", seed)
    return root


def smoke_study(shipped: Path, folder: Path, steps: int = 8, tasks: tuple = (0, 1)) -> Path:
    """A shipped study file at smoke size, written to `folder`: the same variants, contrasts and curve, the
    corpus and tasks of BERT_SUITE_DATA (write_ablation_data), a small vocabulary, a few steps of tiny batches
    (or 3 seconds for a study planned in minutes), two seeds, one setting and one epoch, and the tasks at the
    indices `tasks` with label counts cut to fit."""
    import yaml

    from bert_suite.ablation.study import read_with_base

    study = read_with_base(shipped)[0]  # its base merged in, as the record's `ablation` holds it
    study["vocabulary"] = {"vocab_size": 80, "lowercase": True} if "vocab_size" in study["vocabulary"] else {
        "vocab_file": str(folder / "vocab.txt")}
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "?", "which",
                                                 "colour", "red", "blue", "green", *ABLATION_WORDS]) + "\n")
    study["instances"] = {**study.get("instances", {}), "max_seq_length": 32, "dupe_factor": 1}
    if study["instances"].get("phase2_length"):
        study["instances"]["phase2_length"] = 64
    pre = study["pretraining"]
    if "minutes" in pre:
        pre["minutes"] = 0.05
    else:
        scale = steps / pre["steps"]
        pre["steps"] = steps
    pre.update(per_device_train_batch_size=8, eval_batches=1, max_predictions_per_seq=6)
    if len(pre.get("seeds", [])) > 2:  # two pre-training seeds: the seeded path, at two thirds of the time
        pre["seeds"] = pre["seeds"][:2]
    if "per_device_train_batch_size_phase2" in pre:
        pre.update(per_device_train_batch_size_phase2=4, max_predictions_per_seq_phase2=12)
    if pre.get("checkpoints"):  # the last two, scaled
        pre["checkpoints"] = sorted({max(1, round(s * scale)) for s in pre["checkpoints"]})[-2:]
    cut = lambda key: key.split("@")[0] + ("@40" if "@" in key else "")  # noqa: E731
    study["compare"]["tasks"] = [cut(t) if isinstance(t, str) else {**t, "task": cut(t["task"]),
                                                                       **({"epochs": [1]} if "epochs" in t else {})}
                                 for i, t in enumerate(study["compare"]["tasks"]) if i in tasks]
    study["compare"].update(seeds=[1, 2], learning_rates=[1e-3], epochs=[1], batch_sizes=[16])
    if "curve" in study:
        study["curve"]["tasks"] = [cut(t) for t in study["curve"]["tasks"]][:1]
    path = folder / shipped.name
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


# ------------------------------------------------------- masks made in the step (pre-training)

IDS_VOCAB = 200
PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4


class IdsTokenizer:
    """The few things MaskingCollator reads from a tokenizer (tests of masks made in the step)."""

    pad_token_id, unk_token_id, cls_token_id, sep_token_id, mask_token_id = PAD, UNK, CLS, SEP, MASK
    all_special_ids = [PAD, UNK, CLS, SEP, MASK]

    def get_vocab(self):
        return {f"t{i}": i for i in range(IDS_VOCAB)}


def ids_instances(count: int, longest: int, seed: int = 0, full: bool = False):
    """NSP-shaped rows ([CLS] A [SEP] B [SEP]) of random lengths up to `longest` (all `longest` with `full`), some
    with [UNK] inside (a special token that is never masked), written as several Arrow chunks."""
    import datasets
    import numpy as np
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(3):
        rows = {"input_ids": [], "token_type_ids": [], "next_sentence_label": []}
        for _ in range(count // 3):
            n = longest if full else int(rng.integers(6, longest + 1))
            a = int(rng.integers(1, n - 3))
            body = rng.integers(5, IDS_VOCAB, n - 3)
            body[rng.random(n - 3) < 0.05] = UNK
            rows["input_ids"].append([CLS, *body[:a].tolist(), SEP, *body[a:].tolist(), SEP])
            rows["token_type_ids"].append([0] * (a + 2) + [1] * (n - a - 2))
            rows["next_sentence_label"].append(int(rng.integers(0, 2)))
        parts.append(datasets.Dataset.from_dict(rows))
    return datasets.concatenate_datasets(parts)


def mask_loaders(data, collator, static, causal=False, accumulation=2, world=2, rank=1, first_step=0, seed=7):
    """(the loader that pads and masks, the ids-only loader, the step's masker) for the same batches."""
    from types import SimpleNamespace

    from bert_suite.pretraining.loader import Batches, IdsBatches, IdsTable
    from bert_suite.pretraining.masking import StepMasker

    cfg = SimpleNamespace(gradient_accumulation_steps=accumulation, seed=seed)
    form = (max(len(r) for r in data["input_ids"]), None if causal else collator.max_predictions_per_seq) \
        if static else None
    masked = Batches(data, collator, cfg, first_step, rank, world, form, causal)
    shipped = IdsBatches(IdsTable(data, PAD), collator, cfg, first_step, rank, world, static, causal)
    return masked, shipped, StepMasker(collator, seed, static, form[1] if form else None, causal)


def count_kept_steps(monkeypatch) -> tuple[list, list]:
    """The captured fine-tuning step on (its body on the CPU), and two lists that grow by one for each step made
    (`FinetuneStep.__init__`) and each adopted by a later trial (`finetune_step.adopt`)."""
    from bert_suite import finetune_step

    monkeypatch.setenv("BERT_SUITE_CAPTURED_STEP", "1")
    made, adopted = [], []
    real_init, real_adopt = finetune_step.FinetuneStep.__init__, finetune_step.adopt
    monkeypatch.setattr(finetune_step.FinetuneStep, "__init__",
                        lambda self, *a, **k: made.append(1) or real_init(self, *a, **k))
    monkeypatch.setattr(finetune_step, "adopt", lambda *a: adopted.append(1) or real_adopt(*a))
    return made, adopted
