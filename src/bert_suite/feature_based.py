"""The feature-based route of the paper's Table 7: no fine-tuning; per-word features from frozen
BERT layers feed a two-layer BiLSTM and a linear classifier, scored like the fine-tuned route.

extract_features: CoNLL sentences -> the NER adapter's windows (document context by default) ->
hidden states of the chosen layers at each word's first sub-token, taken from the window where
the word has the most context -> a `datasets` folder (one row per sentence, `features` holds a
[words, dim] matrix; with pool="weighted" a [words, layers, hidden] stack, mixed by learned
weights in the tagger). train_tagger: features -> BiLSTM tagger -> dev entity F1 per epoch, the
best epoch's predictions in the conlleval layout.
"""

from __future__ import annotations

import json
import math
import pickle
import tempfile
import time
from pathlib import Path

import datasets
import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from .io import atomic_write_text

POOLS = ("concat", "sum", "weighted")
# The rows of Table 7: name -> (layers, pool). Layer 0 is the embedding output, -1 the last layer.
TABLE7_ROWS = {
    "embeddings": ("0", "sum"),
    "second_to_last_hidden": ("-2", "sum"),
    "last_hidden": ("-1", "sum"),
    "weighted_sum_last_four": ("-1,-2,-3,-4", "weighted"),
    "concat_last_four": ("-1,-2,-3,-4", "concat"),
    "weighted_sum_all": ("all", "weighted"),
}
TABLE7_PAPER_DEV_F1 = {"embeddings": 91.0, "second_to_last_hidden": 95.6, "last_hidden": 94.9,
                       "weighted_sum_last_four": 95.9, "concat_last_four": 96.1, "weighted_sum_all": 95.5}


class FeatureError(ValueError):
    """Unusable layer or pooling choices; the message says what is allowed."""


def parse_layers(spec: str, num_hidden_layers: int) -> list[int]:
    """'-1,-2' / '0' / 'all' -> indices into the model's hidden states (0 = embeddings,
    num_hidden_layers = last layer); 'all' is every transformer layer (1..L), as the paper's
    weighted sum of all 12 layers of BERT-base."""
    total = num_hidden_layers + 1
    if spec.strip() == "all":
        return list(range(1, total))
    layers = []
    for part in spec.split(","):
        try:
            index = int(part)
        except ValueError:
            raise FeatureError(f"--layers: {part!r} is not an integer (use e.g. -1,-2,-3,-4, 0 or all)") from None
        if not -total <= index < total:
            raise FeatureError(f"--layers: {index} is outside the model's {total} hidden states "
                               f"(0 = embeddings .. {num_hidden_layers} = last, or -1 .. -{total})")
        layers.append(index % total)
    if len(set(layers)) != len(layers):
        raise FeatureError(f"--layers {spec}: a layer is named twice")
    return layers


def pool_layers(stack: np.ndarray, pool: str) -> np.ndarray:
    """[words, layers, hidden] -> the stored features: concat -> [words, layers*hidden], sum ->
    [words, hidden], weighted -> the stack itself (the tagger learns the weights)."""
    if pool == "concat":
        return stack.reshape(stack.shape[0], -1)
    if pool == "sum":
        return stack.sum(axis=1)
    if pool == "weighted":
        return stack
    raise FeatureError(f"--pool must be one of {', '.join(POOLS)}, got {pool!r}")


def extract_features(model: str, input_path: str | Path, output_dir: str | Path, card=None, layers: str = "-1",
                     pool: str = "sum", tokenizer: str | None = None, context: str | None = None,
                     max_seq_length: int | None = None, batch_size: int = 32, disable_tqdm: bool = False
                     ) -> datasets.Dataset:
    """Per-word features of a CoNLL file (tags optional) from a frozen model: the hidden states
    named by `layers` at each word's first sub-token, read from the window where the word has the
    most context (the NER adapter's windows; `context` document or sentence, default the card's),
    pooled by `pool`. Saved to output_dir as a `datasets` folder with the sentences' columns (id,
    doc_id, doc_start, tokens, ner_tags when tagged) and `features`; the settings are in the
    dataset's description. Sentences are written as soon as all their words are read, so memory
    holds a few windows, not the corpus."""
    from .adapters import ner
    from .cards import load_card
    from .modeling_bert_suite import BertSuiteModel
    from .runner import RunError, check_checkpoint_folder, model_load_error
    from .tokenization import load_tokenizer

    if pool not in POOLS:
        raise FeatureError(f"--pool must be one of {', '.join(POOLS)}, got {pool!r}")
    card = card or load_card("conll2003")
    if context:
        card.options = {**card.options, "context": context}
    tok = load_tokenizer(model, tokenizer)
    check_checkpoint_folder(model)
    try:
        net = BertSuiteModel.from_pretrained(model, add_pooling_layer=False).eval()
    except (OSError, pickle.UnpicklingError) as err:
        raise model_load_error(model, err) from None
    chosen = parse_layers(layers, net.config.num_hidden_layers)
    max_len = int(max_seq_length or card.defaults.get("max_seq_length", 128))
    if max_len > net.config.max_position_embeddings:
        raise RunError(f"max_seq_length {max_len} exceeds the model's max_position_embeddings "
                       f"({net.config.max_position_embeddings})")
    sentences, _ = ner.read_conll(input_path, card.labels)
    windows = ner.preprocess(sentences, card, tok, max_len, train=False)
    feature_of, position_of, word_of = ner.word_slots(sentences, windows)
    lengths = np.array([len(t) for t in sentences["tokens"]], dtype=np.int64)
    first_word = np.concatenate([[0], np.cumsum(lengths)])
    order = np.argsort(feature_of, kind="stable")
    feature_of, position_of, word_of = feature_of[order], position_of[order], word_of[order]
    bounds = np.searchsorted(feature_of, np.arange(len(windows) + 1))
    collate = ner.collator(tok)
    inputs = windows.select_columns(["input_ids", "token_type_ids", "attention_mask"])
    meta = {"model": str(model), "layers": chosen, "pool": pool, "context": card.options.get("context", "document"),
            "max_seq_length": max_len, "input": str(input_path)}

    def rows():
        pending: dict[int, np.ndarray] = {}  # flat word index -> its [layers, hidden] stack
        next_sentence = 0
        with torch.inference_mode():
            for start in tqdm(range(0, len(inputs), batch_size), desc="extracting features", unit="batch",
                              disable=disable_tqdm):
                stop = min(start + batch_size, len(inputs))
                hidden = net(**collate([inputs[i] for i in range(start, stop)]), output_hidden_states=True, return_dict=True).hidden_states
                stack = torch.stack([hidden[i] for i in chosen], dim=2).numpy()  # [batch, tokens, layers, hidden]
                for f in range(start, stop):
                    for k in range(bounds[f], bounds[f + 1]):
                        pending[int(word_of[k])] = stack[f - start, position_of[k]]
                while next_sentence < len(lengths) and all(
                        w in pending for w in range(first_word[next_sentence], first_word[next_sentence + 1])):
                    words = range(first_word[next_sentence], first_word[next_sentence + 1])
                    row = {c: sentences[next_sentence][c] for c in sentences.column_names if c != "line"}
                    yield {**row, "features": pool_layers(np.stack([pending.pop(w) for w in words]), pool)}
                    next_sentence += 1

    with tempfile.TemporaryDirectory(prefix="bert_suite_features_") as build:
        dataset = datasets.Dataset.from_generator(rows, cache_dir=build)
        dataset.info.description = json.dumps(meta)
        dataset.save_to_disk(str(output_dir))
    return datasets.load_from_disk(str(output_dir))


class ScalarMix(nn.Module):
    """softmax-normalised layer weights times a scale: the 'weighted sum' rows of Table 7."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, stack):  # [batch, words, layers, hidden]
        return self.gamma * torch.einsum("bwlh,l->bwh", stack, self.weights.softmax(0))


class BiLSTMTagger(nn.Module):
    """Frozen word features -> (scalar mix) -> 2-layer BiLSTM -> linear layer over the tags."""

    def __init__(self, input_dim: int, num_labels: int, hidden: int = 768, num_mixed_layers: int | None = None,
                 dropout: float = 0.1):
        super().__init__()
        self.mix = ScalarMix(num_mixed_layers) if num_mixed_layers else None
        self.lstm = nn.LSTM(input_dim, hidden, num_layers=2, bidirectional=True, batch_first=True, dropout=dropout)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(2 * hidden, num_labels)

    def forward(self, features, lengths):
        if self.mix is not None:
            features = self.mix(features)
        packed = nn.utils.rnn.pack_padded_sequence(self.dropout(features), lengths.cpu(), batch_first=True,
                                                   enforce_sorted=False)
        output, _ = self.lstm(packed)
        output, _ = nn.utils.rnn.pad_packed_sequence(output, batch_first=True, total_length=features.shape[1])
        return self.classifier(self.dropout(output))


def _batches(data: datasets.Dataset, batch_size: int, shuffle: bool, generator: torch.Generator | None = None):
    order = torch.randperm(len(data), generator=generator).tolist() if shuffle else list(range(len(data)))
    data = data.select_columns(["features", "ner_tags"]).with_format("numpy")  # read rows from Arrow per batch
    for i in range(0, len(order), batch_size):
        rows = data[order[i:i + batch_size]]
        feats = [torch.tensor(np.asarray(f, dtype=np.float32)) for f in rows["features"]]  # copies: Arrow is read-only
        lengths = torch.tensor([len(f) for f in feats])
        padded = nn.utils.rnn.pad_sequence(feats, batch_first=True)
        labels = nn.utils.rnn.pad_sequence([torch.tensor(t, dtype=torch.long) for t in rows["ner_tags"]],
                                           batch_first=True, padding_value=-100)
        yield padded, lengths, labels


def _predict(model: BiLSTMTagger, data: datasets.Dataset, batch_size: int) -> list[list[int]]:
    model.eval()
    predictions = []
    with torch.inference_mode():
        for feats, lengths, _ in _batches(data, batch_size, shuffle=False):
            best = model(feats, lengths).argmax(-1)
            predictions += [row[:n].tolist() for row, n in zip(best, lengths.tolist(), strict=True)]
    return predictions


def train_tagger(train: datasets.Dataset, dev: datasets.Dataset, labels: list[str], output_dir: str | Path,
                 epochs: int = 4, learning_rate: float = 1e-3, batch_size: int = 32, hidden: int = 768,
                 seed: int = 42, disable_tqdm: bool = False) -> dict:
    """Train the BiLSTM tagger on feature datasets made by `extract_features` (same layers and
    pool for both); keep the epoch with the best dev entity F1; write all_results.json and the
    dev predictions (conlleval layout) into output_dir. Returns the best epoch's metrics."""
    from .adapters import ner

    meta = json.loads(train.info.description or "{}")
    dev_meta = json.loads(dev.info.description or "{}")
    different = {k: (meta.get(k), dev_meta.get(k)) for k in ("model", "layers", "pool", "context")
                 if meta.get(k) != dev_meta.get(k)}
    if different:
        raise FeatureError(f"train and dev features were extracted differently: {different}; extract both alike")
    for name, data in (("train", train), ("dev", dev)):
        if not {"features", "ner_tags"} <= set(data.column_names):
            raise FeatureError(f"{name} features need the columns features and ner_tags (extract them from a tagged "
                               f"CoNLL file), found {', '.join(data.column_names)}")
    if batch_size < 1 or epochs < 1 or learning_rate <= 0:
        raise FeatureError(f"batch_size and epochs must be at least 1 and learning_rate positive, got {batch_size}, "
                           f"{epochs}, {learning_rate}")
    stacked = meta.get("pool") == "weighted"
    sample = np.asarray(train[0]["features"], dtype=np.float32)
    torch.manual_seed(seed)  # before the tagger is built: its initial weights are part of the run
    model = BiLSTMTagger(sample.shape[-1], len(labels), hidden, sample.shape[1] if stacked else None)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    loss_fn = nn.CrossEntropyLoss(ignore_index=-100)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    gold = [[labels[t] for t in tags] for tags in dev["ner_tags"]]
    best, history, start = None, [], time.time()
    for epoch in range(1, epochs + 1):
        model.train()
        steps = math.ceil(len(train) / batch_size)
        for feats, lengths, targets in tqdm(_batches(train, batch_size, True, generator), total=steps,
                                            desc=f"BiLSTM epoch {epoch}/{epochs}", disable=disable_tqdm):
            logits = model(feats, lengths)
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
        predicted = [[labels[t] for t in row] for row in _predict(model, dev, batch_size)]
        scores = ner.ner_scores(gold, predicted)
        history.append({"epoch": epoch, **{f"eval_{k}": v for k, v in scores.items()}})
        if best is None or scores["f1"] > best[0]["f1"]:
            best = (scores, predicted, epoch)
    scores, predicted, epoch = best
    ner.write_conll(out / "predictions" / "dev.conll", dev, predicted, labels)
    results = {**{f"eval_{k}": v for k, v in scores.items()}, "best_epoch": epoch, "history": history,
               "train_runtime": time.time() - start, "features": meta}
    atomic_write_text(out / "all_results.json", json.dumps(results, indent=2, default=float))
    return results
