"""BERT pre-training (MLM + NSP) with accelerate: two phases, exact resume.

    accelerate launch recipes/pretrain.py --config recipes/configs/pretrain/tiny.yaml [key=value ...]
    accelerate launch --config_file recipes/configs/accelerate/gpu.yaml recipes/pretrain.py --config ...

Data come from `bert-suite pretrain-data` (phase 1 at length 128, phase 2 at 512). The schedule
(warmup, linear decay) runs over both phases. Batches are a pure function of the step: the
order of epoch e is a permutation seeded by (seed, phase, e), and an example's masks are a hash of
(seed, step, its place in the step's global batch), so a run killed at step k and resumed from
its last checkpoint (accelerate `save_state`, which also restores the dropout RNG) gives the same
losses as an uninterrupted one.

On N processes each takes 1/N of every global batch (`StepBatches`), draws the same masks as one
process would, and divides its summed MLM loss by the global batch's number of masked tokens
(all processes, all micro-batches), so the gradient is that of one process with the whole batch:
with dropout off, the same losses on any number of processes, up to float rounding.

The batches come from bert_suite/pretraining/loader.py, the step from bert_suite/pretraining/step.py: on a CUDA
device static (no host sync), compiled and captured as one CUDA graph by default (`static_shapes`,
`torch_compile`, `cuda_graph`), on the CPU the eager path that drops padding itself.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import datasets
import torch
from accelerate import Accelerator
from accelerate.utils import AutocastKwargs, ProjectConfiguration, set_seed
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from bert_suite import BertSuiteConfig, BertSuiteForPreTraining
from bert_suite.allocator import tune as tune_allocator
from bert_suite.distributed import launched_processes, needs_cpu_group
from bert_suite.faults import failpoint
from bert_suite.io import atomic_write_text
from bert_suite.modeling_bert_suite import residual_in_autocast_dtype
from bert_suite.precision import on_cpu, recipe_precision
from bert_suite.pretraining.checkpoints import (
    complete_checkpoints,
    load_checkpoint,
    load_initial_model,
    save_checkpoint,
    start_from_checkpoint,
    trim_log,
)
from bert_suite.pretraining.config import load_pretrain_config
from bert_suite.pretraining.instances import find_parts, load_parts
from bert_suite.pretraining.loader import (  # noqa: F401  (StepBatches: the tests reach it through the recipe)
    COLUMNS,
    IdsTable,
    StepBatches,
    as_features,
    batches,
    most_labels,
    static_length,
    step_masks,
)
from bert_suite.pretraining.masking import MaskingCollator, StepMasker
from bert_suite.pretraining.step import (
    PretrainingStep,
    add_stats,
    batch_stats,
    compile_regions,
    compiled_stats,
    keep_autocast_outputs,
    resolve_switch,
    step_form,
    to_device,
)
from bert_suite.tokenization import load_pretraining_tokenizer


def load_instances(path: str, max_positions: int, what: str) -> datasets.Dataset:
    """A `bert-suite pretrain-data` output: a dataset folder, or a folder of parts (`--num_shards`),
    which must hold all its parts, finished and built alike; they are concatenated in part order."""
    try:
        parts = find_parts(path)
        data = load_parts(path) if parts else None
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"{what} {path}: {err}") from None
    if data is None:
        try:
            data = datasets.load_from_disk(path)
        except (FileNotFoundError, ValueError) as err:
            raise SystemExit(f"{what} {path}: not a dataset written by `bert-suite pretrain-data` ({err})") from None
    missing = [c for c in COLUMNS if c not in data.column_names]
    if missing:
        raise SystemExit(f"{what} {path}: missing columns {missing}; rebuild it with `bert-suite pretrain-data`")
    if parts:
        length = parts[0][1].get("max_seq_length")  # the same in every part (checked)
    else:
        stats = Path(path) / "pretrain_data_stats.json"
        length = json.loads(stats.read_text()).get("max_seq_length") if stats.is_file() else None
    if length and length > max_positions:
        raise SystemExit(f"{what} {path}: max_seq_length {length} exceeds the model's {max_positions} positions")
    return data


def summarise(totals: dict) -> dict:
    totals = {k: float(v) for k, v in totals.items()}  # the one read of the device per logging step
    result = {}
    if totals.get("mlm_count"):
        result["mlm_loss"] = totals["mlm_loss"] / totals["mlm_count"]
        result["mlm_accuracy"] = totals["mlm_correct"] / totals["mlm_count"]
        result["mlm_perplexity"] = math.exp(min(result["mlm_loss"], 50))
    if totals.get("nsp_count"):
        result["nsp_loss"] = totals["nsp_loss"] / totals["nsp_count"]
        result["nsp_accuracy"] = totals["nsp_correct"] / totals["nsp_count"]
    return result


def all_processes(totals: dict, accelerator) -> dict:
    """The sums of every process (each holds its share of the global batches) in one all-reduce."""
    if accelerator.num_processes == 1 or not totals:
        return totals
    keys = sorted(totals)
    values = torch.stack([torch.as_tensor(totals[k], device=accelerator.device).double() for k in keys])
    return dict(zip(keys, accelerator.reduce(values, reduction="sum"), strict=True))


@torch.no_grad()
def evaluate(model, eval_data, collator, cfg, accelerator, stepper, static_form, causal):
    """Held-out MLM perplexity and accuracy and NSP accuracy, with the same masks at every
    evaluation; beside them the frequent-token accuracy: that of always predicting the token most
    frequent at those masked positions, where a model on the unigram plateau sits. `static_form`:
    (length, predictions) for the static step's batches, else None; `causal`: next-token labels (the
    eval_mlm_* figures are then next-token accuracy and perplexity)."""
    model.eval()
    totals, counts = {}, None
    vocab_size = accelerator.unwrap_model(model).config.vocab_size
    size = cfg.per_device_eval_batch_size
    table = eval_data.select_columns([c for c in (*COLUMNS, "labels") if c in eval_data.column_names])
    for number in range(min(cfg.eval_batches, math.ceil(len(eval_data) / size))):
        rows = table[number * size: (number + 1) * size]
        batch = collator.pad(as_features(rows))
        batch = step_masks(collator, batch, cfg.seed, -1, number * size, causal)
        if static_form:
            batch = collator.static(batch, *static_form)
        batch = to_device(batch, accelerator.device)
        add_stats(totals, batch_stats(model(**batch, return_dict=True, **stepper.forward_kwargs()), batch))
        found = torch.bincount(batch["labels"][batch["labels"] != -100], minlength=vocab_size)
        counts = found if counts is None else counts + found
    model.train()
    result = summarise(totals)
    if counts is not None and counts.sum():
        result["frequent_token_accuracy"] = float(counts.max() / counts.sum())
    return {f"eval_{k}": v for k, v in result.items()}


def save_model(accelerator, model, tokenizer, target: Path) -> Path:
    """The model and tokenizer as a from_pretrained folder, written beside `target` and renamed when complete
    (as checkpoints are), so `target` is either absent or whole."""
    accelerator.wait_for_everyone()
    weights = accelerator.get_state_dict(model)  # every rank takes part (FSDP gathers its shards); rank 0 gets them
    if accelerator.is_main_process:
        staging = target.with_name(target.name + ".incomplete")
        shutil.rmtree(staging, ignore_errors=True)
        accelerator.unwrap_model(model).save_pretrained(staging, state_dict=weights)
        tokenizer.save_pretrained(staging)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target


def add_nsp_head(model, seed: int) -> None:
    """The NSP head of a model built without one, drawn from a generator of its own (seed + 1): the model's
    other weights and the random state after them are a left-to-right run's, so that run's checkpoint at the
    switch is this run's state there (`start_from_checkpoint`)."""
    config = model.config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        head = torch.nn.Linear(config.hidden_size, 2)
        head.weight.data.normal_(mean=0.0, std=config.initializer_range)
        head.bias.data.zero_()
    model.cls.seq_relationship = head
    config.use_nsp = True


def set_objective(model, cfg, causal: bool) -> None:
    """The model's attention and heads for the objective: left-to-right without NSP, or bidirectional with NSP
    as the config says (read at call time by the attention, the pooler and the heads)."""
    config = model.config
    config.causal_attention, config.use_nsp = causal, cfg.use_nsp and not causal


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="recipes/configs/pretrain/<name>.yaml")
    parser.add_argument("overrides", nargs="*", help="key=value, e.g. max_steps=200 output_dir=runs/x")
    args = parser.parse_args(argv)
    try:
        cfg = load_pretrain_config(args.config, args.overrides)
    except ValueError as err:
        raise SystemExit(f"pretrain: error: {err}") from None
    out = Path(cfg.output_dir)
    report_to = None if cfg.report_to == "none" else cfg.report_to
    # torchrun or `accelerate launch --multi_gpu` on a machine without an accelerator: accelerate
    # would run N unconnected copies unless told to use the CPU (then it joins them with gloo).
    launched = launched_processes()
    try:  # auto: bf16 autocast where the CPU does bf16 natively; explicit values and the launch config win
        mixed_precision, precision = recipe_precision(cfg.mixed_precision, on_cpu(needs_cpu_group()))
    except ValueError as err:
        raise SystemExit(f"pretrain: error: {err}") from None
    accelerator = Accelerator(cpu=needs_cpu_group(),
                              mixed_precision=mixed_precision, log_with=report_to,
                              gradient_accumulation_steps=cfg.gradient_accumulation_steps,
                              # BERT uses each weight once a forward: the cache saves nothing, and a CUDA graph forbids it
                              kwargs_handlers=[AutocastKwargs(cache_enabled=False)],
                              project_config=ProjectConfiguration(project_dir=str(out), logging_dir=str(out / "logs")))
    if accelerator.num_processes != launched:  # N copies each writing the same files
        raise SystemExit(f"pretrain: error: launched as {launched} processes but accelerate runs "
                         f"{accelerator.num_processes} ({accelerator.distributed_type.value}); "
                         "expected one process group (check the launcher and the accelerate config)")
    if accelerator.gradient_accumulation_steps != cfg.gradient_accumulation_steps:  # e.g. a DeepSpeed config's own
        raise SystemExit(f"pretrain: error: gradient_accumulation_steps is {cfg.gradient_accumulation_steps} but the "
                         f"accelerate config sets {accelerator.gradient_accumulation_steps}; expected the same value "
                         "in both (the recipe cuts each step into that many micro-batches)")
    # on a CPU, keep the memory each step frees for the next step (bert_suite/allocator.py; BERT_SUITE_ALLOCATOR=default: off)
    memory = tune_allocator() if accelerator.device.type == "cpu" else {}
    set_seed(cfg.seed)
    tokenizer = load_pretraining_tokenizer(cfg.tokenizer)
    # dropout null: the preset's or the checkpoint's; 0 turns it off (cramming, MosaicBERT)
    dropout = {k: getattr(cfg, k) for k in ("hidden_dropout_prob", "attention_probs_dropout_prob")
               if getattr(cfg, k) is not None}
    if cfg.init_from:  # its weights, with this run's objective (a causal checkpoint continued with MLM + NSP)
        model = load_initial_model(cfg.init_from, causal_attention=cfg.causal_attention, use_nsp=cfg.use_nsp, **dropout)
    else:  # a biphasic run is drawn as a left-to-right run is, its NSP head apart (its first steps are that run's)
        biphasic = cfg.causal_until > 0 and cfg.use_nsp
        model = BertSuiteForPreTraining(BertSuiteConfig.from_preset(
            cfg.model_size, vocab_size=len(tokenizer), use_nsp=cfg.use_nsp and not biphasic,
            causal_attention=cfg.causal_attention, **dropout))
        if biphasic:
            add_nsp_head(model, cfg.seed)
    positions = model.config.max_position_embeddings
    # the residual stream in bf16 under autocast (auto: on with CUDA); nothing changes in an fp32 run
    low_precision_residual = resolve_switch(cfg.bf16_residual, accelerator.device.type) and \
        accelerator.mixed_precision == "bf16"
    residual_in_autocast_dtype(model, low_precision_residual)
    phase_data = [load_instances(cfg.train_data, positions, "train_data")]
    if cfg.train_data_phase2:
        phase_data.append(load_instances(cfg.train_data_phase2, positions, "train_data_phase2"))
    if cfg.eval_data:
        eval_data = load_instances(cfg.eval_data, positions, "eval_data")
    elif cfg.eval_fraction > 0:
        split = phase_data[0].train_test_split(test_size=cfg.eval_fraction, seed=cfg.seed)
        phase_data[0], eval_data = split["train"], split["test"]
    else:
        eval_data = None
    collators = [MaskingCollator(tokenizer, cfg.mlm_probability, cfg.mask_ratio, cfg.random_ratio, cap,
                                 cfg.whole_word_mask) for cap in (cfg.max_predictions_per_seq,
                                                                  cfg.max_predictions_per_seq_phase2)]
    # The step's form (bert_suite/pretraining/step.py): static, compiled and graph-captured on CUDA by default
    device = accelerator.device.type
    try:
        static, compiled, graph = step_form(cfg.static_shapes, cfg.torch_compile, cfg.cuda_graph, device,
                                            accelerator.num_processes, accelerator.mixed_precision)
    except ValueError as err:
        raise SystemExit(f"pretrain: error: {err}") from None
    # auto: batches made beside a GPU's step by worker processes; on the CPU they would take its cores from the step
    workers = cfg.dataloader_num_workers if cfg.dataloader_num_workers != "auto" else \
        0 if device == "cpu" else min(4, (os.cpu_count() or 2) // 2)
    # (length, predictions per sequence) of each phase's static batches; a left-to-right model predicts every position
    def static_form(data, collator, causal):
        return (static_length(data), None if causal else collator.max_predictions_per_seq) if static else None

    # masks made inside the step from token ids (auto: with CUDA), except where the loader must make them
    in_step = resolve_switch(cfg.mask_in_step, device)
    if in_step and cfg.whole_word_mask:
        accelerator.print("mask_in_step: whole-word masks rank words in a Python loop; they are made in the loader")
        in_step = False
    offline = [i + 1 for i, data in enumerate(phase_data) if "labels" in data.column_names]
    if in_step and offline and cfg.mask_in_step is True:
        accelerator.print(f"mask_in_step: phase {offline[0]}'s data carry their masks (pretrain-data --static_masking); "
                          "its batches are read as they are")
    tables: dict[int, IdsTable] = {}

    def ids_of(phase):
        """The phase's IdsTable when the step masks its batches, else None."""
        if not in_step or phase + 1 in offline:
            return None
        if phase not in tables:
            data = phase_data[phase]
            # a table over a GiB (2 bytes a token slot) is written once beside the run and memory-mapped
            large = data.data.num_rows * static_length(data) * 2 > 2**30  # the table under any selection of it
            cache = out / "ids" / f"phase{phase + 1}-{data._fingerprint}.npy" if large else None
            try:  # on each machine its first process builds a cached table, and the others read it
                with accelerator.local_main_process_first():
                    tables[phase] = IdsTable(data, tokenizer.pad_token_id, len(tokenizer), cache)
            except ValueError as err:
                raise SystemExit(f"pretrain: error: {('train_data', 'train_data_phase2')[phase]}: {err}") from None
        return tables[phase]

    forms = [static_form(data, c, False) for data, c in zip(phase_data, collators, strict=False)]
    if static and not cfg.causal_attention:  # masks made offline (a labels column) must fit the static form
        for (path, key), data, (_, cap) in zip((("train_data", "max_predictions_per_seq"),
                                                ("train_data_phase2", "max_predictions_per_seq_phase2")),
                                               phase_data, forms, strict=False):
            most = most_labels(data)
            if most > cap:
                raise SystemExit(f"pretrain: error: {path} {getattr(cfg, path)}: an instance has {most} masked "
                                 f"positions, more than {key} ({cap}); raise {key} to at least {most}")

    no_decay = ("bias", "LayerNorm.weight", "LayerNorm.bias")  # the paper: no weight decay on these
    groups = [{"params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)],
               "weight_decay": cfg.weight_decay},
              {"params": [p for n, p in model.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0}]
    # One fused kernel per step instead of a loop over parameters (CPU and CUDA): the same update.
    optimizer = torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                  eps=cfg.adam_epsilon, fused=device in ("cpu", "cuda"), capturable=graph)
    # One schedule over both phases; not passed to prepare(), which would step it once per process.
    scheduler = get_linear_schedule_with_warmup(optimizer, cfg.warmup_steps, cfg.max_steps)
    if compiled:  # in place, so parameter names (checkpoints) stay those of the eager model
        compile_regions(model, backend=cfg.torch_compile_backend)
    model, optimizer = accelerator.prepare(model, optimizer)
    keep_autocast_outputs(model)  # no fp32 copy of the logits after each forward
    stepper = PretrainingStep(accelerator, model, optimizer, cfg.max_grad_norm, static=static, graph=graph,
                              stats_fn=compiled_stats(cfg.torch_compile_backend) if compiled else batch_stats)

    step = 0
    checkpoints = out / "checkpoints"
    if cfg.resume_from_checkpoint:  # only complete checkpoints: one killed mid-write is never loaded
        found = [Path(cfg.resume_from_checkpoint)] if cfg.resume_from_checkpoint != "auto" else \
            complete_checkpoints(checkpoints)
        if found:
            step = load_checkpoint(accelerator, found[-1], scheduler)
            accelerator.print(f"resumed from {found[-1]} at step {step}")
    started_from = None  # another run's checkpoint whose steps were this run's own
    if step == 0 and cfg.start_from_checkpoint:
        try:
            step = start_from_checkpoint(accelerator, cfg.start_from_checkpoint, model, optimizer, scheduler)
        except ValueError as err:
            raise SystemExit(f"pretrain: error: {err}") from None
        started_from = Path(cfg.start_from_checkpoint)
        accelerator.print(f"started from {started_from} at step {step} (another run's checkpoint)")
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        # a fresh start has no curve left over from an earlier run; a resumed one drops the steps
        # logged after its checkpoint by the run that died
        if step == 0:
            (out / "metrics.jsonl").unlink(missing_ok=True)
            (out / "started_from.json").unlink(missing_ok=True)
        elif started_from is not None:  # the other run's log of those steps is this run's
            theirs = started_from.parent.parent / "metrics.jsonl"
            if theirs.is_file():
                shutil.copyfile(theirs, out / "metrics.jsonl")
            trim_log(out / "metrics.jsonl", step)
            atomic_write_text(out / "started_from.json", json.dumps({"checkpoint": str(started_from), "step": step}))
        else:
            trim_log(out / "metrics.jsonl", step)
    if report_to:
        accelerator.init_trackers("pretrain", config={k: str(v) if isinstance(v, list) else v  # hparams: no lists
                                                      for k, v in vars(cfg).items() if k != "extra"})

    accelerator.print(precision.describe())
    form = ", ".join(n for n, on in (("static", static), ("compiled", compiled), ("CUDA graph", graph),
                                     ("masks made in the step", in_step),
                                     ("bf16 residual stream", low_precision_residual)) if on)
    accelerator.print(f"world size {accelerator.num_processes} ({accelerator.distributed_type.value}, "
                      f"{accelerator.device.type}): global batch {accelerator.num_processes} x "
                      f"{cfg.gradient_accumulation_steps} x {cfg.per_device_train_batch_size}; step: {form or 'eager'}")
    bar = tqdm(total=cfg.max_steps, initial=step, desc="pre-training", disable=not accelerator.is_local_main_process)
    history, tokens, padded, started = [], 0, 0, time.time()
    phase, causal, stream = None, None, None
    model.train()
    while step < cfg.max_steps:
        # a new stream at each length phase and at the objective's switch (the same order of examples goes on)
        if (0 if step < cfg.phase1_steps else 1, cfg.causal_at(step)) != (phase, causal):
            phase, causal = 0 if step < cfg.phase1_steps else 1, cfg.causal_at(step)
            set_objective(accelerator.unwrap_model(model), cfg, causal)
            size = cfg.per_device_train_batch_size if phase == 0 else \
                (cfg.per_device_train_batch_size_phase2 or cfg.per_device_train_batch_size)
            start = step if phase == 0 else step - cfg.phase1_steps
            form = static_form(phase_data[phase], collators[phase], causal)
            ids = ids_of(phase)
            stream = batches(phase_data[phase], collators[phase], cfg, phase, start, accelerator, size, form,
                             workers, causal, ids)
            stepper.new_shapes(None if ids is None else StepMasker(collators[phase], cfg.seed, form is not None,
                                                                   form[1] if form else None, causal))
        micro_batches, masked = [], 0
        for _ in range(cfg.gradient_accumulation_steps):
            batch, (n_masked, n_real, n_padded) = next(stream)  # counted on the CPU: a device read would wait
            micro_batches.append(batch)
            masked, tokens, padded = masked + n_masked, tokens + n_real, padded + n_padded
        # MLM loss = summed cross-entropy / the masked tokens of the whole global batch. accelerate divides
        # each micro-batch's loss by the accumulation steps and DDP averages over processes, so the model is
        # given the global count divided by both (transformers' num_items_in_batch is the count itself,
        # with the loss multiplied back by the processes in the Trainer).
        masked = torch.full((), float(masked), device=accelerator.device, dtype=torch.float64)
        parts = accelerator.num_processes * cfg.gradient_accumulation_steps
        per_part = accelerator.reduce(masked, reduction="sum") / parts if accelerator.num_processes > 1 else masked / parts
        stepper([to_device(b, accelerator.device) for b in micro_batches], per_part.clamp(min=1e-9).float())
        scheduler.step()
        step += 1
        bar.update(1)
        failpoint("pretrain.step")
        # a log line at every logging step and at every evaluation (eval_steps need not be a multiple of logging_steps)
        evaluate_now = eval_data is not None and (step % cfg.eval_steps == 0 or step == cfg.max_steps)
        if step % cfg.logging_steps == 0 or step == cfg.max_steps or evaluate_now:
            totals = all_processes({**stepper.take_totals(), "tokens": torch.tensor(float(tokens)),
                                    "padded": torch.tensor(float(padded))}, accelerator)
            tokens, padded = totals.pop("tokens"), totals.pop("padded")
            summary, grad_norm = summarise(totals), float(stepper.grad_norm)
            elapsed = time.time() - started  # after those reads, which wait for the device (it may lag the host)
            logs = {**summary, "grad_norm": grad_norm, "learning_rate": float(scheduler.get_last_lr()[0]),
                    "phase": phase + 1, "objective": cfg.objective_at(step - 1),
                    # real tokens (padding left out) and the padded slots the step computes
                    "tokens_per_second": float(tokens) / max(elapsed, 1e-9),
                    "padded_tokens_per_second": float(padded) / max(elapsed, 1e-9), "step": step}
            tokens, padded, started = 0, 0, time.time()
            if evaluate_now:
                logs.update(evaluate(model, eval_data, collators[0], cfg, accelerator, stepper,
                                     static_form(eval_data, collators[0], causal), causal))
            bar.set_postfix({k: f"{logs[k]:.3g}" for k in ("mlm_loss", "nsp_accuracy") if k in logs})
            history.append(logs)
            accelerator.log(logs, step=step)
            if accelerator.is_main_process:
                with open(out / "metrics.jsonl", "a") as f:
                    f.write(json.dumps(logs) + "\n")
        if step in cfg.snapshot_steps and step < cfg.max_steps:  # before the checkpoint: a run resumed from
            save_model(accelerator, model, tokenizer, out / "snapshots" / f"step-{step}")  # it has its snapshots
        if (step % cfg.save_steps == 0 or step in cfg.keep_checkpoints) and step < cfg.max_steps:
            save_checkpoint(accelerator, checkpoints, step, scheduler, cfg.save_total_limit, tuple(cfg.keep_checkpoints))
    bar.close()

    final = save_model(accelerator, model, tokenizer, out / "final")
    if accelerator.is_main_process:
        results = {"step": step, "config": vars(cfg), **precision.record(), **memory,
                   "step_form": {"static_shapes": static, "torch_compile": compiled, "cuda_graph": graph},
                   "mask_in_step_phases": [phase + 1 for phase in sorted(tables)],
                   "bf16_residual": low_precision_residual,
                   "objectives": cfg.objectives(),
                   **({"started_from": json.loads((out / "started_from.json").read_text())}
                      if (out / "started_from.json").is_file() else {}),
                   **(history[-1] if history else {})}
        atomic_write_text(out / "pretrain_results.json", json.dumps(results, indent=2, default=str))
        accelerator.print(f"saved {final}: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                                        for k, v in (history or [{}])[-1].items()))
        if cfg.push_to_hub:
            from bert_suite.hub import pretraining_card, push_to_hub

            atomic_write_text(final / "README.md", pretraining_card(cfg.hub_model_id, results))
            accelerator.print(f"pushed to {push_to_hub(final, cfg.hub_model_id)}")
    accelerator.end_training()
    return history


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError) as err:  # bad data, vocabulary or paths: one line (BERT_SUITE_DEBUG=1: traceback)
        if os.environ.get("BERT_SUITE_DEBUG"):
            raise
        sys.exit(f"pretrain: error: {err}")
