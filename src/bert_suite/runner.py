"""One fine-tuning run: task card + model + hyper-parameters -> Trainer -> dev metrics, prediction
files, a manifest. `finetune`, `grid` and `predict` all go through here, for every task family.

A family's adapter module (adapters/<family>.py) provides what differs between families:
MODEL_CLASS, model_kwargs(card), load_split, preprocess(..., train), metric_fn(card, examples,
features), output_path, write_outputs(directory, card, split, examples, features, predictions,
settings), and optionally collator(tokenizer) (default: dynamic padding). write_outputs
returns settings to keep beside the checkpoint (e.g. SQuAD v2's null threshold, chosen on dev and
applied by `predict`)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import torch
import transformers
from transformers import AutoTokenizer, DataCollatorWithPadding, Trainer, TrainingArguments

from . import __version__
from .adapters import split_file_stem  # noqa: F401  (re-exported for glue_package)
from .cards import TaskCard
from .configuration_bert_suite import BertSuiteConfig
from .report import atomic_write_text

TASK_SETTINGS_FILE = "bert_suite_task.json"  # settings chosen on dev, kept with the checkpoint


def adapter_for(card: TaskCard):
    """The adapter module of the card's family."""
    return importlib.import_module(f".adapters.{card.family}", __package__)


LABEL_COLUMNS = ("label", "labels", "start_positions", "end_positions")  # removed before predicting new data


def collator_for(adapter, tokenizer):
    """The family's batch collator, or dynamic padding to the longest sequence of the batch."""
    make = getattr(adapter, "collator", None)
    return make(tokenizer) if make else DataCollatorWithPadding(tokenizer)


def load_task_settings(model: str) -> dict:
    """Settings a fine-tuned checkpoint carries for its task (empty for other models)."""
    path = Path(model) / TASK_SETTINGS_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


class RunError(ValueError):
    """A run that cannot start (bad model, tokenizer or flags); the message says what to change."""


@dataclass
class Prepared:
    """Everything a trial needs that does not depend on its hyper-parameters: tokenised once."""

    card: TaskCard
    tokenizer: object
    raw: dict[str, datasets.Dataset]
    encoded: dict[str, datasets.Dataset]
    max_seq_length: int
    fingerprints: dict[str, str] = field(default_factory=dict)


def load_tokenizer(model: str, tokenizer: str | None = None):
    source = tokenizer or model
    if source.startswith("preset:"):
        raise RunError(f"--model {model} starts from random weights and needs --tokenizer (a folder or vocab.txt)")
    path = Path(source)
    if path.is_dir() and (path / "vocab.txt").is_file() and not (path / "tokenizer_config.json").is_file():
        path = path / "vocab.txt"  # a released BERT folder: vocab.txt (+ bert_config.json) only
    try:
        if path.suffix == ".txt" and path.is_file():
            return wordpiece_tokenizer(path)
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise RunError(f"cannot load a tokenizer from {source!r} ({str(err).splitlines()[0][:200]}); offline, pass "
                       "a local checkpoint folder with --model, or a vocab.txt / tokenizer folder with --tokenizer") from None


def wordpiece_tokenizer(vocab_file: Path):
    """A BERT tokenizer over a bare vocab.txt; lower-cases when the vocabulary has no capitals
    (as the released uncased vocabularies)."""
    tokens = vocab_file.read_text(encoding="utf-8").splitlines()
    cased = sum(t[:1].isascii() and t[:1].isupper() for t in tokens) > 10
    return transformers.BertTokenizer(vocab=str(vocab_file), do_lower_case=not cased)


def prepare(card: TaskCard, model: str, data_dir: str | None = None, tokenizer: str | None = None,
            max_seq_length: int | None = None, splits: list[str] | None = None,
            skip_bad_rows: bool = False) -> Prepared:
    """Load the card's splits (default: train + dev) and tokenise them once."""
    tok = load_tokenizer(model, tokenizer)
    max_len = int(max_seq_length or card.defaults.get("max_seq_length", 128))
    if max_len < 8:
        raise RunError(f"max_seq_length must be at least 8, got {max_len}")
    if splits is None:
        splits = [s for s in [card.train_split, *card.eval_splits] if s]
    adapter = adapter_for(card)
    raw = {s: adapter.load_split(card, s, data_dir, skip_bad_rows) for s in splits}
    encoded = {s: adapter.preprocess(d, card, tok, max_len, train=s == card.train_split) for s, d in raw.items()}
    return Prepared(card, tok, raw, encoded, max_len, {s: d._fingerprint for s, d in raw.items()})


def load_model(card: TaskCard, model: str, max_seq_length: int, vocab_size: int | None = None):
    """A bert_suite or stock BERT checkpoint (folder or Hub id), or `preset:NAME` for random
    weights of a paper size (vocabulary sized to the tokenizer), with the card's head."""
    adapter = adapter_for(card)
    labels = adapter.model_kwargs(card)
    if model.startswith("preset:"):
        sizes = {"vocab_size": vocab_size} if vocab_size else {}
        config = BertSuiteConfig.from_preset(model.split(":", 1)[1], **sizes, **labels)
        if config.max_position_embeddings < max_seq_length:
            raise RunError(f"max_seq_length {max_seq_length} exceeds the preset's max_position_embeddings "
                           f"({config.max_position_embeddings})")
        return adapter.MODEL_CLASS(config)
    try:
        loaded = adapter.MODEL_CLASS.from_pretrained(model, **labels)
    except OSError as err:
        raise RunError(f"cannot load model {model!r} ({str(err).splitlines()[0][:200]}); offline, pass a local "
                       "checkpoint folder with --model (or preset:NAME with --tokenizer)") from None
    if loaded.config.max_position_embeddings < max_seq_length:
        raise RunError(f"max_seq_length {max_seq_length} exceeds the model's max_position_embeddings "
                       f"({loaded.config.max_position_embeddings})")
    return loaded


def selection_key(card: TaskCard) -> str:
    """The key of the card's selection metric in Trainer's metrics."""
    if len(card.eval_splits) == 1:
        return f"eval_{card.select}"
    return f"eval_{card.eval_splits[0]}_{card.select}"


def train_and_evaluate(prepared: Prepared, model_name: str, args: TrainingArguments,
                       save_to: Path | None = None) -> dict:
    """Fine-tune with per-epoch dev evaluation; write `all_results.json` and dev predictions into
    args.output_dir and the model into `save_to` (default: args.output_dir). Returns metrics,
    per-epoch history and runtime."""
    card = prepared.card
    adapter = adapter_for(card)
    transformers.set_seed(args.seed)  # the seed also sets the head's initialisation (a random restart)
    model = load_model(card, model_name, prepared.max_seq_length, len(prepared.tokenizer))
    evals = {s: prepared.encoded[s] for s in card.eval_splits}
    first = card.eval_splits[0]
    # compute_metrics cannot tell which split it scores; families whose metrics read the split's own
    # examples (SQuAD, NER) evaluate the first split per epoch and every split at the end.
    per_epoch = evals if len(evals) == 1 or not getattr(adapter, "METRICS_USE_EXAMPLES", False) else {first: evals[first]}
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=prepared.encoded[card.train_split],
        eval_dataset=next(iter(per_epoch.values())) if len(per_epoch) == 1 else per_epoch,
        data_collator=collator_for(adapter, prepared.tokenizer),
        processing_class=prepared.tokenizer,
        compute_metrics=adapter.metric_fn(card, prepared.raw[first], prepared.encoded[first]),
    )
    start = time.time()
    train_output = trainer.train()
    out = Path(args.output_dir)
    metrics = {"train_loss": train_output.training_loss, "train_runtime": time.time() - start,
               "train_samples": len(prepared.encoded[card.train_split])}
    # What predict must reuse to read new data as this model was trained and evaluated.
    settings = {"max_seq_length": prepared.max_seq_length, "options": card.options}
    for split, dataset in evals.items():
        prefix = "eval" if len(evals) == 1 else f"eval_{split}"
        trainer.compute_metrics = adapter.metric_fn(card, prepared.raw[split], dataset)
        result = trainer.predict(dataset, metric_key_prefix=prefix)
        metrics.update(result.metrics)
        metrics[f"{prefix}_samples"] = len(prepared.raw[split])
        chosen = adapter.write_outputs(out / "predictions", card, split, prepared.raw[split], dataset,
                                       result.predictions, settings if split != first else {})
        if split == first:  # thresholds are chosen on the first dev split only, then applied to the others
            settings.update(chosen)
            metrics.update({f"chosen_{k}": v for k, v in chosen.items()})
    history = [entry for entry in trainer.state.log_history if any(k.startswith("eval_") for k in entry)]
    trainer.save_model(str(save_to or out))
    atomic_write_text(Path(save_to or out) / TASK_SETTINGS_FILE, json.dumps(settings, indent=2, sort_keys=True))
    atomic_write_text(out / "all_results.json", json.dumps(metrics, indent=2, sort_keys=True))
    return {"metrics": metrics, "history": history, "train_runtime": metrics["train_runtime"]}


def predict(card: TaskCard, model: str, split: str, data_dir: str | None, output_dir: str,
            tokenizer: str | None = None, batch_size: int = 64, settings: dict | None = None,
            max_seq_length: int | None = None, options: dict | None = None) -> Path:
    """Predict one split with a fine-tuned checkpoint, applying the settings it carries (card
    options, max_seq_length, the SQuAD v2 null threshold chosen on dev); `settings`, `options`
    and `max_seq_length` override them. Writes the task's prediction files under
    output_dir/predictions and returns the main one."""
    adapter = adapter_for(card)
    saved = load_task_settings(model)
    # The card options and length the model was trained with, unless given now (e.g. --context).
    card = dataclasses.replace(card, options={**card.options, **saved.get("options", {}), **(options or {})})
    max_seq_length = max_seq_length or saved.get("max_seq_length")
    prepared = prepare(card, model, data_dir, tokenizer or model, max_seq_length, splits=[split])
    net = load_model(card, model, prepared.max_seq_length)
    args = TrainingArguments(output_dir=output_dir, per_device_eval_batch_size=batch_size, report_to="none")
    trainer = Trainer(model=net, args=args, data_collator=collator_for(adapter, prepared.tokenizer))
    data = prepared.encoded[split]
    labels = [c for c in LABEL_COLUMNS if c in data.column_names]
    result = trainer.predict(data.remove_columns(labels))
    chosen = {**saved, **(settings or {})}
    adapter.write_outputs(Path(output_dir) / "predictions", card, split, prepared.raw[split], data,
                          result.predictions, chosen)
    return adapter.output_path(Path(output_dir) / "predictions", card, split)


def git_revision() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_manifest(path: Path, prepared: Prepared, model: str, data_dir: str | None, args: TrainingArguments,
                   extra: dict | None = None) -> None:
    """run_manifest.json: what ran, on what, with which versions, so a result can be reproduced."""
    keep = ("learning_rate", "per_device_train_batch_size", "num_train_epochs", "seed", "warmup_steps",
            "weight_decay", "gradient_accumulation_steps", "max_grad_norm", "lr_scheduler_type", "bf16", "fp16")
    manifest = {
        "task": prepared.card.name,
        "card": prepared.card.path,
        "model": model,
        "data_dir": str(Path(data_dir).resolve()) if data_dir else None,
        "max_seq_length": prepared.max_seq_length,
        "card_options": prepared.card.options,
        "training_arguments": {k: getattr(args, k) for k in keep},
        "dataset_fingerprints": prepared.fingerprints,
        "dataset_sizes": {s: len(d) for s, d in prepared.raw.items()},
        "versions": {"bert_suite": __version__, "transformers": transformers.__version__,
                     "torch": torch.__version__, "datasets": datasets.__version__,
                     "python": platform.python_version()},
        "git_revision": git_revision(),
        "seed": args.seed,
        **(extra or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=True, default=str))


def training_arguments(card: TaskCard, output_dir: str, overrides: dict | None = None) -> TrainingArguments:
    """TrainingArguments from the card's defaults, then `overrides` (explicit flags win)."""
    values = {k: v for k, v in card.defaults.items() if k != "max_seq_length"}
    values.update(overrides or {})
    values.setdefault("eval_strategy", "epoch")
    values.setdefault("save_strategy", "no")
    values.setdefault("logging_strategy", "epoch")
    values.setdefault("report_to", "none")
    values.setdefault("per_device_eval_batch_size", 64)
    for key in ("learning_rate", "num_train_epochs", "per_device_train_batch_size"):
        if key in values and float(values[key]) <= 0:
            raise RunError(f"{key} must be positive, got {values[key]}")
    os.makedirs(output_dir, exist_ok=True)
    return TrainingArguments(output_dir=output_dir, **values)
