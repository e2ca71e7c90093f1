"""One fine-tuning run: task card + model + hyper-parameters -> Trainer -> dev metrics, prediction
files, a manifest. `finetune`, `grid` and `predict` all go through here, for every task family.

What differs between task families (reading, encoding, scoring, prediction files) is in the family's
adapter, looked up in `adapters.ADAPTERS`; the contract it meets is `adapters.TaskAdapter`.

Speed (benchmarks/RESULTS.md, "Performance"): `SuiteTrainer` evaluates and predicts in batches of
examples sorted by length and returns every output in the dataset's order, and trains on batches
of similar length visited in random order (`--train_sampling_strategy random` turns that off);
with the model's unpadded dense layers, little work is spent on padding."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np
import torch
import transformers
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from . import __version__, adapters, finetune_step
from .adapters import TaskAdapter, split_file_stem
from .allocator import tune as tune_allocator
from .cards import CARD_FILE, TaskCard, save_card
from .configuration_bert_suite import BertSuiteConfig
from .distributed import is_main_process, launched_processes, needs_cpu_group
from .faults import failpoint
from .io import atomic_write_text
from .lora import LoraSettings, apply_lora, save_lora, trainable_parameters
from .lora import describe as describe_lora
from .model_spec import ModelSpec, RunError, checkpoint_of  # noqa: F401  (runner's API too)
from .precision import Precision, PrecisionError, explicit, on_cpu, resolve
from .tokenization import check_max_seq_length, load_tokenizer

TASK_SETTINGS_FILE = "bert_suite_task.json"  # settings chosen on dev, kept with the checkpoint


def example_lengths(dataset) -> list[int]:
    """Tokens per example (the longest choice for multiple choice)."""
    return [max(map(len, ids)) if ids and isinstance(ids[0], list) else len(ids) for ids in dataset["input_ids"]]


class LengthBucketSampler(torch.utils.data.Sampler):
    """Training order with little padding: shuffle, cut into pools of 50 batches, sort each pool
    by length, cut it into batches and visit all batches in a random order (the short last batch
    stays last, so that batch boundaries hold). Each epoch is a new random order, and batches are
    not ordered by length (transformers' LengthGroupedSampler goes longest first in each pool)."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int, pool_batches: int = 50):
        self.lengths, self.batch_size, self.pool = lengths, batch_size, pool_batches * batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self):
        return len(self.lengths)

    def __iter__(self):
        order = torch.randperm(len(self.lengths), generator=self.generator).tolist()
        batches = []
        for start in range(0, len(order), self.pool):
            pool = sorted(order[start:start + self.pool], key=self.lengths.__getitem__)
            batches += [pool[i:i + self.batch_size] for i in range(0, len(pool), self.batch_size)]
        last = [batches.pop()] if batches and len(batches[-1]) < self.batch_size else []
        for b in torch.randperm(len(batches), generator=self.generator).tolist():
            yield from batches[b]
        for batch in last:
            yield from batch


class _FixedOrder(torch.utils.data.Sampler):
    def __init__(self, order: list[int]):
        self.order = order

    def __len__(self):
        return len(self.order)

    def __iter__(self):
        return iter(self.order)


def _reorder(values, inverse):
    """Put rows produced in sorted order back into dataset order (arrays, possibly nested)."""
    if values is None:
        return None
    if isinstance(values, (tuple, list)):
        return type(values)(_reorder(v, inverse) for v in values)
    if isinstance(values, dict):
        return {k: _reorder(v, inverse) for k, v in values.items()}
    return values[inverse] if getattr(values, "ndim", 0) and len(values) == len(inverse) else values


def _no_op(*args, **kwargs):
    return None


class SuiteTrainer(Trainer):
    """Trainer whose evaluation and prediction run over examples sorted by length (outputs, and
    what compute_metrics sees, come back in the dataset's order), whose `group_by_length`
    training order is `LengthBucketSampler`, which keeps each dataset's last evaluation (so that a dev set
    evaluated at the last step is not predicted again, `last_evaluation`), and which counts a step's
    floating-point operations without walking the model's parameters at every step."""

    _eval_inverse = None
    _eval_orders: dict | None = None  # dataset fingerprint -> length order (per-epoch evaluation reuses it)
    _evaluated: dict | None = None  # metric prefix -> (global step, EvalLoopOutput, inverse order)
    _flops_per_token: int | None = None
    _step = None  # the captured step (bert_suite.finetune_step) once chosen; False: the Trainer's own
    _step_optimizer = None  # the optimizer the step was chosen for
    _grad_norm = None
    _forward = None  # the captured evaluation forward once chosen; False: the Trainer's prediction_step
    _forward_checked = False  # whether this evaluation checked that its graphs still read the model's tensors

    def _captured_step(self, model):
        """The captured step for this run, made at its first step, or None where the Trainer's own step runs (one
        line says why when the captured one was asked for and cannot run)."""
        previous = None
        if self._step is not None and self.optimizer is not self._step_optimizer:
            # train() called again on this Trainer (a benchmark's repeats): it made a new optimizer, which the step
            # chosen for the old one does not step (it would step the old one, beside the new one's own step); the
            # choice is made again, the old step adopted by the new optimizer where it can be (its graphs kept)
            previous, self._step = self._step or None, None
            model.__dict__.pop("zero_grad", None)  # the model's own again, until a step is chosen below
        if self._step is None:
            self._step_optimizer = self.optimizer
            self._step = False
            device = self.args.device.type
            if finetune_step.wanted(device):
                problem = finetune_step.captured_step_problem(self.args, model, self.optimizer, self)
                if problem:
                    print(f"captured step: off, {problem}; the Trainer's step runs", file=sys.stderr, flush=True)
                else:
                    # --torch_compile: the Trainer compiled the whole model; a short run replays eager kernels
                    compiled = device == "cuda" and not self.args.torch_compile and \
                        finetune_step.compile_wanted(self.state.max_steps)
                    if device == "cuda":
                        finetune_step.make_capturable(self.optimizer)
                        self._uncached_autocast(model)
                        if compiled:
                            finetune_step.compile_encoder(self.accelerator.unwrap_model(model))
                    # a grid worker's later trial adopts the step (and graphs) of the one before when they match
                    self._forward = None  # evaluation graphs made before (eval_on_start) read the weights adopt replaces
                    self._step = finetune_step.step_for(self.accelerator, model, self.optimizer,
                                                        self.args.max_grad_norm, graph=device == "cuda",
                                                        extra=(device, self.args.bf16, self.args.torch_compile, compiled),
                                                        previous=previous)
                    previous = None  # adopted or finished by step_for
                    # the step zeroes the gradients itself, and a graph writes into the same tensors: the Trainer's
                    # zero_grad (set_to_none) and optimizer.step (already taken) must leave them be
                    model.zero_grad = _no_op
                    self.optimizer.step = _no_op
            if previous is not None:  # the Trainer's own step this time: the old step goes, and its last gradients
                finetune_step.finished(previous)
                model.zero_grad(set_to_none=True)
        return self._step or None

    def training_step(self, model, inputs, num_items_in_batch=None):
        step = self._captured_step(model)
        if step is None:
            return super().training_step(model, inputs, num_items_in_batch)
        model.train()
        loss = step.step(self._prepare_inputs(inputs))
        self._grad_norm = step.grad_norm
        return loss

    def _captured_forward(self, model):
        """The captured evaluation forward (finetune_step.CapturedForward) where the captured step is asked for and
        the Trainer computes the model's own loss, else None: evaluation and prediction as a graph a bucket."""
        if self._forward and not self._forward_checked:  # once an evaluation: the graphs read these tensors, which
            # a kept step's adoption or --bf16_full_eval's model.to(bf16) replaces
            if self._forward.model is not model or self._forward.weights != finetune_step.weights_key(model):
                self._forward = None
        if self._forward is None:
            self._forward, device = False, self.args.device.type
            if finetune_step.wanted(device) and not finetune_step.captured_step_problem(self.args, model, None, self,
                                                                                        training=False):
                if device == "cuda":
                    self._uncached_autocast(model)
                self._forward = finetune_step.CapturedForward(model, graph=device == "cuda")
        self._forward_checked = True
        return self._forward or None

    def _uncached_autocast(self, model) -> None:
        """Mixed precision without accelerate's autocast weight cache, which a CUDA graph cannot hold."""
        if self.args.bf16 or self.args.fp16:
            finetune_step.uncached_autocast(self.accelerator.unwrap_model(model), "cuda",
                                            torch.bfloat16 if self.args.bf16 else torch.float16)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Trainer.prediction_step's loss, logits and labels, through the captured forward where it runs (the mean
        loss over the batch's labels: the model's own, as the Trainer's with no loss of its own)."""
        forward = self._captured_forward(model)
        if forward is None or not all(torch.is_tensor(v) for v in inputs.values()):
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        has_labels = bool(self.label_names) and all(inputs.get(k) is not None for k in self.label_names)
        inputs = self._prepare_inputs(inputs)
        if ignore_keys is None:
            ignore_keys = getattr(getattr(self.model, "config", None), "keys_to_ignore_at_inference", ["past_key_values"])
        labels = None
        if has_labels:
            labels = tuple(inputs[name].detach() for name in self.label_names)
            labels = labels[0] if len(labels) == 1 else labels
        with self.compute_loss_context_manager():
            outputs = forward(inputs)  # the graph's tensors: copied before the next batch overwrites them
        loss = outputs["loss"].detach().mean().clone() if has_labels and "loss" in outputs else None
        if prediction_loss_only:
            return loss, None, None
        logits = tuple(v.detach().clone() for k, v in outputs.items() if k not in [*ignore_keys, "loss"])
        return loss, logits[0] if len(logits) == 1 else logits, labels

    def _clip_grad_norm(self, model):
        return self._grad_norm if self._step else super()._clip_grad_norm(model)

    def _get_grad_norm(self, model, grad_norm=None):
        return self._grad_norm if self._step else super()._get_grad_norm(model, grad_norm)

    def _get_learning_rate(self):
        """The learning rate computed on the host where the captured step keeps it on the device (reading the device
        tensor back would wait for the GPU at every step)."""
        schedule = self.lr_scheduler
        if self._step and isinstance(schedule, torch.optim.lr_scheduler.LambdaLR):
            return float(schedule.base_lrs[0]) * schedule.lr_lambdas[0](schedule.last_epoch)
        return super()._get_learning_rate()

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval"):
        self._forward_checked = False
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        if description == "Evaluation" and output.predictions is not None:
            if self._evaluated is None:
                self._evaluated = {}
            # evaluate() then adds its speed figures to output.metrics (the same dict)
            self._evaluated[metric_key_prefix] = (self.state.global_step, output, self._eval_inverse)
        return output

    def last_evaluation(self, evaluated: str, prefix: str):
        """`predict(dataset, metric_key_prefix=prefix)`'s output taken from the evaluation logged as `evaluated`
        (its metric prefix: "eval", or "eval_NAME" for one of several dev sets) when it ran at this very step (the
        per-epoch evaluation after the last epoch); None where there was none or the model changed since (a best
        checkpoint loaded at the end)."""
        found = (self._evaluated or {}).get(evaluated)
        if not found or found[0] != self.state.global_step or self.args.load_best_model_at_end \
                or not self.args.skip_memory_metrics:  # memory figures: predict's are named differently
            return None
        _, output, inverse = found
        used = evaluated
        metrics = {prefix + key[len(used):] if key.startswith(used + "_") else key: value
                   for key, value in output.metrics.items()
                   if key not in ("epoch", "num_input_tokens_seen")}  # what log() adds
        predictions = output.predictions if inverse is None else _reorder(output.predictions, inverse)
        labels = output.label_ids if inverse is None else _reorder(output.label_ids, inverse)
        return transformers.trainer_utils.PredictionOutput(predictions=predictions, label_ids=labels, metrics=metrics)

    def floating_point_ops(self, inputs) -> int:
        """Trainer's estimate (6 x tokens x non-embedding parameters) with the parameters counted once, not at
        every step (a walk over every parameter a step: host time a GPU's step waits for)."""
        main = getattr(self.model, "main_input_name", "input_ids")
        if main not in inputs or not hasattr(self.model, "num_parameters"):
            return 0
        if self._flops_per_token is None:
            self._flops_per_token = 6 * self.model.num_parameters(exclude_embeddings=True)
        return inputs[main].numel() * self._flops_per_token

    @property
    def compute_metrics(self):
        metric, inverse = self._metric, self._eval_inverse
        if metric is None or inverse is None:
            return metric

        def in_dataset_order(p: transformers.EvalPrediction):
            return metric(transformers.EvalPrediction(
                predictions=_reorder(p.predictions, inverse), label_ids=_reorder(p.label_ids, inverse),
                inputs=_reorder(p.inputs, inverse), losses=_reorder(p.losses, inverse)))
        return in_dataset_order

    @compute_metrics.setter
    def compute_metrics(self, fn):
        self._metric = fn

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if (self.args.train_sampling_strategy == "group_by_length" and self.args.world_size <= 1
                and isinstance(dataset, datasets.Dataset) and "input_ids" in dataset.column_names):
            seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
            return LengthBucketSampler(example_lengths(dataset), self.args.train_batch_size, seed)
        return super()._get_train_sampler(train_dataset)

    def _get_eval_sampler(self, eval_dataset):
        self._eval_inverse = None
        if (self.args.world_size > 1 or not isinstance(eval_dataset, datasets.Dataset)
                or "input_ids" not in eval_dataset.column_names):
            return super()._get_eval_sampler(eval_dataset)
        if self._eval_orders is None:
            self._eval_orders = {}
        key = eval_dataset._fingerprint
        if key not in self._eval_orders:
            self._eval_orders[key] = np.argsort(example_lengths(eval_dataset), kind="stable")
        order = self._eval_orders[key]
        self._eval_inverse = np.empty_like(order)
        self._eval_inverse[order] = np.arange(len(order))
        return _FixedOrder(order.tolist())

    def predict(self, *args, **kwargs):
        out = super().predict(*args, **kwargs)
        if self._eval_inverse is None:
            return out
        return out._replace(predictions=_reorder(out.predictions, self._eval_inverse),
                            label_ids=_reorder(out.label_ids, self._eval_inverse))


class _StepFailpoint(TrainerCallback):
    """`finetune.step` after each optimizer step, for the kill-and-resume tests (bert_suite.faults)."""

    def on_step_end(self, args, state, control, **kwargs):
        failpoint("finetune.step")


def resume_checkpoint(args: TrainingArguments) -> str | None:
    """--resume_from_checkpoint PATH, or `auto`: the newest checkpoint-N in the output folder, if any
    (a fresh start otherwise), as the example scripts find their last checkpoint."""
    wanted = args.resume_from_checkpoint
    if wanted in (None, "", "no", "none", "false"):
        return None
    if wanted in ("auto", "last", "true"):
        return get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    if not os.path.isdir(wanted):
        raise RunError(f"--resume_from_checkpoint {wanted}: no such checkpoint folder; expected a checkpoint-N "
                       "folder written with --save_strategy steps|epoch, or `auto` for the newest in --output_dir")
    return wanted


def adapter_for(card: TaskCard) -> TaskAdapter:
    """The adapter of the card's family."""
    try:
        return adapters.adapter_for(card.family)
    except ValueError as err:
        raise RunError(f"{card.path}: {err}") from None


LABEL_COLUMNS = ("label", "labels", "start_positions", "end_positions")  # removed before predicting new data


def load_task_settings(model: str) -> dict:
    """Settings a fine-tuned checkpoint carries for its task (empty for other models)."""
    path = Path(model) / TASK_SETTINGS_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


@dataclass
class Prepared:
    """Everything a trial needs that does not depend on its hyper-parameters: tokenised once."""

    card: TaskCard
    tokenizer: object
    raw: dict[str, datasets.Dataset]
    encoded: dict[str, datasets.Dataset]
    max_seq_length: int
    fingerprints: dict[str, str] = field(default_factory=dict)


def prepare(card: TaskCard, model: str, data_dir: str | None = None, tokenizer: str | None = None,
            max_seq_length: int | None = None, splits: list[str] | None = None,
            skip_bad_rows: bool = False, predicting: bool = False,
            max_samples: dict[str, int | None] | None = None) -> Prepared:
    """Load the card's splits (default: train + dev) and tokenise them once, with the card's labels
    in the order of the checkpoint's id2label (see `labels_of_checkpoint`). `max_samples` keeps the
    first N examples of the train, dev ("eval") or predicted ("predict") splits, as the example
    scripts' --max_train_samples, --max_eval_samples and --max_predict_samples."""
    card = labels_of_checkpoint(card, checkpoint_of(model), strict=predicting)
    tok = load_tokenizer(checkpoint_of(model), tokenizer)
    max_len = check_max_seq_length(int(max_seq_length or card.defaults.get("max_seq_length", 128)))
    checked_only = []  # test files given to a training run: read now (a bad one fails before training), not
    if splits is None:  # tokenised (predict does that after training, with the model's settings)
        splits = [s for s in [card.train_split, *card.eval_splits] if s]
        checked_only = [s for s in card.test_splits if card.splits[s].data_file and s not in splits]
        splits += checked_only
    adapter = adapter_for(card)
    raw = {s: adapter.load_split(card, s, data_dir, skip_bad_rows) for s in splits}
    for split, dataset in raw.items():
        role = "train" if split == card.train_split else "predict" if predicting else "eval"
        limit = (max_samples or {}).get(role)
        if limit is not None and limit < len(dataset):
            raw[split] = dataset.select(range(limit))
    encoded = {s: adapter.preprocess(d, card, tok, max_len, train=s == card.train_split) for s, d in raw.items()
               if s not in checked_only}
    return Prepared(card, tok, raw, encoded, max_len, {s: d._fingerprint for s, d in raw.items()})


def load_model(card: TaskCard, model: str, max_seq_length: int, vocab_size: int | None = None):
    """A bert_suite or stock BERT checkpoint (folder or Hub id), or `preset:NAME` for random
    weights of a paper size (vocabulary sized to the tokenizer), with the card's head; the
    prefixes of `ModelSpec` (`random:`, `bilstm:`) before either."""
    adapter = adapter_for(card)
    spec = ModelSpec.parse(model)
    labels = adapter.model_kwargs(card)
    if spec.bilstm:
        labels["bilstm"] = True
    model = spec.source
    if model.startswith("preset:") or spec.random:
        if spec.random:
            check_checkpoint_folder(model)
            try:
                config = BertSuiteConfig.from_pretrained(model, **labels)
            except OSError as err:
                raise model_load_error(model, err) from None
        else:
            sizes = {"vocab_size": vocab_size} if vocab_size else {}
            config = BertSuiteConfig.from_preset(model.split(":", 1)[1], **sizes, **labels)
        if config.max_position_embeddings < max_seq_length:
            raise RunError(f"max_seq_length {max_seq_length} exceeds the {'preset' if not spec.random else 'model'}'s "
                           f"max_position_embeddings ({config.max_position_embeddings}) of {model}; pass --max_seq_length "
                           f"{config.max_position_embeddings} or less")
        if spec.draw == 1:
            return adapter.MODEL_CLASS(config)
        with torch.random.fork_rng(devices=[]):  # draw K: other weights from the same seed; the stream after it as draw 1's
            torch.manual_seed((torch.initial_seed() + 1_000_003 * (spec.draw - 1)) % 2**63)
            return adapter.MODEL_CLASS(config)
    check_checkpoint_folder(model)
    try:
        loaded = adapter.MODEL_CLASS.from_pretrained(model, **labels)
    except (OSError, pickle.UnpicklingError) as err:
        raise model_load_error(model, err) from None
    if loaded.config.max_position_embeddings < max_seq_length:
        raise RunError(f"max_seq_length {max_seq_length} exceeds the model's max_position_embeddings "
                       f"({loaded.config.max_position_embeddings}) in {model}; pass --max_seq_length "
                       f"{loaded.config.max_position_embeddings} or less")
    if vocab_size and vocab_size > loaded.config.vocab_size:
        raise RunError(f"the tokenizer has {vocab_size} tokens but {model} embeds only vocab_size "
                       f"({loaded.config.vocab_size}) of them; expected the tokenizer the model was trained with "
                       "(--tokenizer)")
    return loaded


def check_checkpoint_folder(model: str) -> None:
    """A local folder given as a model must be a checkpoint (config.json beside the weights)."""
    path = Path(model)
    if path.is_dir() and not (path / "config.json").is_file():
        found = ", ".join(sorted(p.name for p in path.iterdir())[:5]) or "nothing"
        raise RunError(f"{model}: no config.json (found: {found}); expected a checkpoint folder with config.json "
                       "and model.safetensors (a finetune output, or a downloaded BERT)")


def model_load_error(model: str, err: Exception) -> RunError:
    """The message for a checkpoint transformers cannot load: a local folder, or a Hub id (offline?)."""
    reason = str(err).splitlines()[0][:200]
    if isinstance(err, pickle.UnpicklingError):
        return RunError(f"{model}: its pytorch_model.bin holds pickled objects other than tensors, which bert_suite "
                        "never loads (.bin weights are read with weights_only=True, so no code in a checkpoint "
                        "runs); expected plain tensors, or model.safetensors")
    if Path(model).is_dir():
        return RunError(f"{model}: cannot load the checkpoint ({reason}); expected a checkpoint folder with "
                        "config.json and model.safetensors (a finetune output, or a downloaded BERT)")
    return RunError(f"cannot load model {model!r} ({reason}); offline, pass a local checkpoint folder with --model "
                    "(or preset:NAME with --tokenizer)")


LENGTH_BUCKET = 32  # on a GPU, batches are padded to a multiple of this: a few shapes a run, not one per length


def length_bucket(args: TrainingArguments) -> int | None:
    """The multiple a run's batches are padded to: LENGTH_BUCKET on a CUDA device, where every new (batch, length)
    shape costs a new attention plan (and a compiled or captured step a new graph); None on the CPU, whose eager
    model drops the padding itself (BERT_SUITE_LENGTH_BUCKET overrides it: a number, 0 for none)."""
    chosen = os.environ.get("BERT_SUITE_LENGTH_BUCKET")
    if chosen is not None:
        if not chosen.isdigit():
            raise RunError(f"BERT_SUITE_LENGTH_BUCKET must be a number of tokens (0: no buckets), got {chosen!r}")
        return int(chosen) or None
    return LENGTH_BUCKET if args.device.type == "cuda" else None


class CappedPadding:
    """A collator whose rounding up to a bucket's multiple stops at `max_length`: with max_seq_length 72 and buckets
    of 32, a batch whose longest example has 65-72 tokens is 72 wide, not 96. The columns cut are padding only
    (every example is truncated to max_length); they are cut from every tensor as wide as the batch's ids."""

    def __init__(self, collate, max_length: int):
        self.collate, self.max_length = collate, max_length

    def __call__(self, features):
        batch = self.collate(features)
        width = batch["input_ids"].shape[-1]
        if width > self.max_length:
            for key, value in batch.items():
                if torch.is_tensor(value) and value.dim() >= 2 and value.shape[-1] == width:
                    batch[key] = value[..., :self.max_length]
        return batch


def batch_collator(adapter, tokenizer, args: TrainingArguments, max_length: int):
    """The family's collator, padding each batch to its longest example rounded up to the device's length bucket
    (`length_bucket`), but never past max_length."""
    bucket = length_bucket(args)
    collate = adapter.collator(tokenizer, bucket)
    return CappedPadding(collate, max_length) if bucket and max_length % bucket else collate


def selection_key(card: TaskCard) -> str:
    """The key of the card's selection metric in Trainer's metrics."""
    if len(card.eval_splits) == 1:
        return f"eval_{card.select}"
    return f"eval_{card.eval_splits[0]}_{card.select}"


def train_and_evaluate(prepared: Prepared, model_name: str, args: TrainingArguments,
                       save_to: Path | None = None, lora: LoraSettings | None = None,
                       callbacks: list[TrainerCallback] | None = None, keep=None) -> dict:
    """Fine-tune with per-epoch dev evaluation; write `all_results.json` and dev predictions into
    args.output_dir and the model into `save_to` (default: args.output_dir). With `lora`, only the LoRA
    matrices and the head train; the adapter goes to <save_to>/adapter and the merged model to save_to.
    `keep`: called with the final metrics; False: no model is written (a grid trial that cannot beat the best so
    far; `saved` is then False). Returns metrics, per-epoch history, runtime and `saved`."""
    card = prepared.card
    adapter = adapter_for(card)
    if not torch.cuda.is_available() or args.use_cpu:
        tune_allocator()  # keep the memory each step frees for the next (allocator.py; BERT_SUITE_ALLOCATOR=default: off)
    transformers.set_seed(args.seed)  # the seed also sets the head's initialisation (a random restart)
    model = load_model(card, model_name, prepared.max_seq_length, len(prepared.tokenizer))
    if lora is not None:
        model = apply_lora(model, lora)
        if is_main_process():
            print(describe_lora(model, lora), file=sys.stderr, flush=True)
    evals = {s: prepared.encoded[s] for s in card.eval_splits}
    first = card.eval_splits[0]
    # compute_metrics cannot tell which split it scores; families whose metrics read the split's own
    # examples (SQuAD, NER) evaluate the first split per epoch and every split at the end.
    per_epoch = evals if len(evals) == 1 or not adapter.METRICS_USE_EXAMPLES else {first: evals[first]}
    trainer = SuiteTrainer(
        model=model,
        args=args,
        train_dataset=prepared.encoded[card.train_split],
        eval_dataset=next(iter(per_epoch.values())) if len(per_epoch) == 1 else per_epoch,
        data_collator=batch_collator(adapter, prepared.tokenizer, args, prepared.max_seq_length),
        processing_class=prepared.tokenizer,
        compute_metrics=adapter.metric_fn(card, prepared.raw[first], prepared.encoded[first]),
        callbacks=[_StepFailpoint(), *(callbacks or [])],
    )
    start = time.time()
    checkpoint = resume_checkpoint(args)
    if checkpoint and is_main_process():
        print(f"resuming from {checkpoint}")
    train_output = trainer.train(resume_from_checkpoint=checkpoint)
    out = Path(args.output_dir)
    metrics = {"train_loss": train_output.training_loss, "train_runtime": time.time() - start,
               "train_samples": len(prepared.encoded[card.train_split])}
    metrics["trainable_parameters"], metrics["parameters"] = trainable_parameters(trainer.model)
    if lora is not None:
        metrics.update(lora.record())
    # What predict must reuse to read new data as this model was trained and evaluated.
    settings = {"max_seq_length": prepared.max_seq_length, "options": card.options}
    for split, dataset in evals.items():
        prefix = "eval" if len(evals) == 1 else f"eval_{split}"
        trainer.compute_metrics = adapter.metric_fn(card, prepared.raw[split], dataset)
        # a dev set evaluated after the last epoch is not predicted a second time
        evaluated = None if split not in per_epoch else "eval" if len(per_epoch) == 1 else f"eval_{split}"
        result = (trainer.last_evaluation(evaluated, prefix) if evaluated else None) or \
            trainer.predict(dataset, metric_key_prefix=prefix)
        metrics.update(result.metrics)
        metrics[f"{prefix}_samples"] = len(prepared.raw[split])
        chosen = adapter.write_outputs(out / "predictions", card, split, prepared.raw[split], dataset,
                                       result.predictions, settings if split != first else {}) \
            if is_main_process() else {}  # the other processes of a launched group write nothing
        if split == first:  # thresholds are chosen on the first dev split only, then applied to the others
            settings.update(chosen)
            metrics.update({f"chosen_{k}": v for k, v in chosen.items()})
    history = [entry for entry in trainer.state.log_history if any(k.startswith("eval_") for k in entry)]
    saved = keep is None or bool(keep(metrics))
    if saved and lora is None:
        trainer.save_model(str(save_to or out))  # the main process only (Trainer)
    elif saved and is_main_process():  # the adapter, then the merged model: a checkpoint like any other
        save_lora(trainer.model, save_to or out, prepared.tokenizer)
    if is_main_process():
        if saved:
            save_card(card, Path(save_to or out) / CARD_FILE)  # predict finds the task beside the checkpoint
            atomic_write_text(Path(save_to or out) / TASK_SETTINGS_FILE,
                              json.dumps(settings, indent=2, sort_keys=True))
        atomic_write_text(out / "all_results.json", json.dumps(metrics, indent=2, sort_keys=True))
    trainer.accelerator.wait_for_everyone()  # no process reads the folder (--test_file) before rank 0 wrote it
    if trainer._forward:  # the evaluation graphs (a trial's own: they read its model)
        trainer._forward.captured.clear()
        trainer._forward = None
    if trainer._step:  # its graphs go now, or are kept for a grid worker's next trial (finetune_step.trials)
        step, trainer._step = trainer._step, None
        finetune_step.finished(step)
    return {"metrics": metrics, "history": history, "train_runtime": metrics["train_runtime"], "saved": saved}


def predict(card: TaskCard, model: str, split: str, data_dir: str | None, output_dir: str,
            tokenizer: str | None = None, batch_size: int = 64, settings: dict | None = None,
            max_seq_length: int | None = None, options: dict | None = None,
            max_samples: int | None = None, precision: Precision | None = None, announce: bool = False
            ) -> Predicted:
    """Predict one split with a fine-tuned checkpoint, applying the settings it carries (card
    options, max_seq_length, the SQuAD v2 null threshold chosen on dev); `settings`, `options`
    and `max_seq_length` override them. Writes the task's prediction files under
    output_dir/predictions; a split with gold labels (a labelled test file) is scored too, its
    scores written beside them as <split>_results.json. Returns the main file and the scores."""
    adapter = adapter_for(card)
    saved = load_task_settings(model)
    # The card options and length the model was trained with, unless given now (e.g. --context).
    card = dataclasses.replace(card, options={**card.options, **saved.get("options", {}), **(options or {})})
    max_seq_length = max_seq_length or saved.get("max_seq_length")
    prepared = prepare(card, model, data_dir, tokenizer or model, max_seq_length, splits=[split], predicting=True,
                       max_samples={"predict": max_samples})
    card = prepared.card  # its labels in the checkpoint's order
    net = load_model(card, model, prepared.max_seq_length)
    values = {"use_cpu": True} if needs_cpu_group() else {}
    # bf16 autocast where the CPU has it (or as the run was trained); the heads' scores are fp32
    # either way (modeling_bert_suite.scores_in_fp32), so spans, tags and thresholds are decided on fp32
    precision = training_precision(values) if precision is None else apply_precision(values, precision)
    args = TrainingArguments(output_dir=output_dir, per_device_eval_batch_size=batch_size, report_to="none",
                             **values)  # under a launcher without a GPU: the same gloo group
    if announce and is_main_process():
        print(precision.describe(), file=sys.stderr, flush=True)
    trainer = SuiteTrainer(model=net, args=args, data_collator=batch_collator(adapter, prepared.tokenizer, args,
                                                                           prepared.max_seq_length))
    data = prepared.encoded[split]
    labels = [c for c in LABEL_COLUMNS if c in data.column_names]
    result = trainer.predict(data.remove_columns(labels))
    chosen = {**saved, **(settings or {})}
    folder = Path(output_dir) / "predictions"
    scores = adapter.score_predictions(card, prepared.raw[split], data, result.predictions, chosen)
    if is_main_process():
        adapter.write_outputs(folder, card, split, prepared.raw[split], data, result.predictions, chosen)
        if scores:
            atomic_write_text(folder / f"{split_file_stem(split)}_results.json",
                              json.dumps(scores, indent=2, sort_keys=True))
    return Predicted(adapter.output_path(folder, card, split), scores)


@dataclass
class Predicted:
    """What `predict` wrote (the split's main prediction file) and its scores ({} for unlabelled data)."""

    path: Path
    scores: dict


def test_metrics_prefix(card: TaskCard, split: str) -> str:
    """Where a test split's scores go among a run's metrics: `test` (test_accuracy) for a card's only test
    split; with several, the split's name (test_matched_accuracy), prefixed with test_ if it lacks it."""
    if len(card.test_splits) <= 1:
        return "test"
    return split if split.startswith("test") else f"test_{split}"


def labels_of_checkpoint(card: TaskCard, model: str, strict: bool) -> TaskCard:
    """The card with its labels in the order of the checkpoint's `id2label`, which is what the
    model's outputs index: the same names in another order are mapped by name. Other names are an
    error naming both lists when `strict` (predicting), and left to the card when fine-tuning (a
    checkpoint of another task starts a new one). A checkpoint without names (LABEL_0, ...) or a
    preset keeps the card's order."""
    if not card.labels or model.startswith("preset:"):
        return card
    try:  # a local folder, or a Hub id's cached config; a model that cannot load fails later, clearly
        config, _ = transformers.PretrainedConfig.get_config_dict(model)
        id2label = config.get("id2label") or {}
        names = [str(id2label[k]) for k in sorted(id2label, key=int)]
    except (OSError, ValueError, AttributeError, TypeError):
        return card
    if not names or all(n == f"LABEL_{i}" for i, n in enumerate(names)) or names == card.labels:
        return card
    if sorted(names) == sorted(card.labels):
        return dataclasses.replace(card, labels=names)
    if not strict:
        return card
    raise RunError(f"{model}/config.json: id2label {names} does not match the labels of task card {card.path} "
                   f"{card.labels}; expected the same label names (was the checkpoint fine-tuned on another task?)")


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
        "data_files": {split: spec.data_file for split, spec in prepared.card.splits.items() if spec.data_file},
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
    if is_main_process():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=True, default=str))


def training_precision(overrides: dict, requested: str | None = "auto") -> Precision:
    """The run's precision from `--precision` (auto, bf16, fp32) and TrainingArguments' own flags in
    `overrides` (`--bf16`, `--no_bf16`, `--fp16`, which keep their meaning and win over auto); sets
    `overrides["bf16"]` to it on the CPU. On a GPU, auto leaves `--bf16` as given (default fp32)."""
    cpu = on_cpu(bool(overrides.get("use_cpu")))
    requested = (requested or "auto").lower()
    given = {k: bool(overrides[k]) for k in ("bf16", "fp16") if k in overrides}
    if not given:
        return apply_precision(overrides, resolve(requested, "cpu" if cpu else "accelerator"))
    name = "bf16" if given.get("bf16") else "fp16" if given.get("fp16") else "fp32"
    if requested != "auto" and requested != name:
        said = " ".join(f"--{k} {v}" for k, v in given.items())
        raise PrecisionError(f"--precision {requested} and {said} disagree; expected one of them (--precision is "
                             "bert_suite's switch, --bf16/--fp16 are TrainingArguments')")
    reason = f"--{name}" if name != "fp32" else "--bf16 false"
    return apply_precision(overrides, explicit(name, reason, cpu, "--precision bf16 (or --bf16) or fp32"))


def apply_precision(values: dict, precision: Precision) -> Precision:
    """Set TrainingArguments' `bf16` in `values` to a resolved precision (unless given), with `use_cpu`,
    without which TrainingArguments refuses bf16 on a machine without a GPU. Off the CPU an fp32
    choice (auto there) leaves `bf16` as given."""
    cpu = on_cpu(bool(values.get("use_cpu")))
    if "bf16" not in values and (precision.bf16 or cpu):
        values["bf16"] = precision.bf16
    if cpu and values.get("bf16"):
        values["use_cpu"] = True
    return precision


def device_defaults(values: dict, cuda: bool) -> dict:
    """TrainingArguments values with a GPU run's defaults added (flags the user gave win): no host sync a step (the
    NaN/Inf filter reads every step's loss; a diverged run still logs a non-finite loss, which fails a grid trial),
    and batches copied from pinned memory without waiting. The CPU keeps the Trainer's defaults."""
    if not cuda or values.get("use_cpu"):
        return values
    return {"logging_nan_inf_filter": False, "accelerator_config": {"non_blocking": True}, **values}


def training_arguments(card: TaskCard, output_dir: str, overrides: dict | None = None) -> TrainingArguments:
    """TrainingArguments from the card's defaults, then `overrides` (explicit flags win)."""
    values = {k: v for k, v in card.defaults.items() if k != "max_seq_length"}
    values.update(overrides or {})
    values.setdefault("eval_strategy", "epoch")
    values.setdefault("save_strategy", "no")
    values.setdefault("logging_strategy", "epoch")
    values.setdefault("report_to", "none")
    values.setdefault("per_device_eval_batch_size", 64)
    values.setdefault("train_sampling_strategy", "group_by_length")  # SuiteTrainer: LengthBucketSampler
    for key in ("learning_rate", "num_train_epochs", "per_device_train_batch_size"):
        if key in values and float(values[key]) <= 0:
            raise RunError(f"{key} must be positive, got {values[key]}")
    values = device_defaults(values, torch.cuda.is_available())
    launched = launched_processes()
    if needs_cpu_group():
        values.setdefault("use_cpu", True)  # else accelerate runs N unconnected copies; on the CPU it joins them with gloo
    os.makedirs(output_dir, exist_ok=True)
    args = TrainingArguments(output_dir=output_dir, **values)
    if args.world_size != launched:
        raise RunError(f"launched as {launched} processes but the Trainer runs {args.world_size}; expected one "
                       "process group (check the launcher and the accelerate config)")
    return args
