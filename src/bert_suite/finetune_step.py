"""The fine-tuning step on a GPU: captured as one CUDA graph per batch shape (and compiled for long runs).

On a GPU the Trainer's step is bound by the host: BERT-base on RTE spends about 64 ms of Python and kernel
launches a step for about 7 ms of GPU work. The pre-training step fixed the same thing by making its step static
and replaying it as one CUDA graph (`bert_suite.pretraining.step`); fine-tuning takes the same machinery:

- a few shapes: batches are padded to a multiple of 32 tokens (`runner.length_bucket`), so a run sees at most
  max_seq_length / 32 lengths (and a short last batch);
- one graph a shape: forward, backward, clipping and the fused AdamW step (a device learning rate the scheduler
  fills in place) captured on the first batch of each shape, sharing one memory pool, and replayed; nothing on a
  step reads a value on the host (the Trainer reads the loss and the gradient norm at logging steps only);
- for long runs (`compile_wanted`: 15,000 steps or more), compiled regions: the embeddings and the encoder layers
  (one graph serves every layer of a shape); a shorter run would spend more compiling than it saves;
- kept across a grid worker's trials (`trials()`): the next trial of the same model, optimizer settings and
  clipping copies its fresh weights and zeroed optimizer state into the step's tensors and replays the graphs
  already captured (`step_for`, `adopt`), so that a trial's fixed cost is neither a compilation nor a capture.

`SuiteTrainer` uses it where it can run (one CUDA process, AdamW, no fp16 loss scaling, no gradient
accumulation: `captured_step_problem` says why not, in one line, otherwise) unless BERT_SUITE_CAPTURED_STEP=0.
On the CPU the same body runs eagerly on the same buffers (BERT_SUITE_CAPTURED_STEP=1, the tests): it gives the
Trainer's eager losses and weights.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os

import torch

from .pretraining.step import PretrainingStep, _Captured, end_failed_capture

log = logging.getLogger(__name__)
SWITCH = "BERT_SUITE_CAPTURED_STEP"  # auto (default): on with CUDA; 1: also on the CPU (the body, no graph); 0: off


def loss_stats(out, batch) -> dict[str, torch.Tensor]:
    """What the step keeps of a micro-batch's output: its loss (the Trainer logs it)."""
    return {"loss": out.loss.detach().float()}


class FinetuneStep(PretrainingStep):
    """One optimizer step of a fine-tuning model on a batch (the Trainer's forward, backward, clipping and
    optimizer step), on static buffers, per batch shape: a CUDA graph with `graph`, the same body eagerly
    without. `__call__(batch)` returns the step's loss (a device tensor); `grad_norm` is its norm before
    clipping. The model's parameters keep their gradient tensors between steps (the graph writes them)."""

    def __init__(self, accelerator, model, optimizer, max_grad_norm: float, graph: bool):
        # max_grad_norm 0: no clipping (the Trainer's meaning), where clipping to 0 would zero the gradients
        super().__init__(accelerator, model, optimizer, max_grad_norm if max_grad_norm > 0 else float("inf"),
                         static=True, graph=graph, stats_fn=loss_stats)
        self._one = None

    def forward(self, batch, num_items):
        return self.model(**batch, return_dict=True)

    def forward_kwargs(self) -> dict:
        return {}

    def step(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if not self.model.training:  # a kept step's model was last evaluated by its own trial's Trainer
            self.model.train()
        device = next(iter(batch.values())).device
        if self._one is None or self._one.device != device:
            self._one = torch.ones((), device=device)
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(batch.items()))
        if key not in self.captured:
            self.captured[key] = _Captured(self, [batch], self._one)
        self.captured[key].replay([batch], self._one)
        return self.take_totals()["loss"]


def captured_step_problem(args, model, optimizer, trainer=None, training: bool = True) -> str | None:
    """Why the captured step cannot run for these TrainingArguments and this Trainer (one line), or None when it
    can. The step computes the model's own loss: a Trainer that computes another one keeps its own step.
    training=False: the same for the captured evaluation forward (`CapturedForward`: no optimizer, no backward)."""
    if trainer is not None:
        from transformers import Trainer

        if getattr(trainer, "label_smoother", None) is not None:
            return "label_smoothing_factor (the Trainer smooths the loss outside the model)"
        if getattr(trainer, "compute_loss_func", None) is not None or type(trainer).compute_loss is not Trainer.compute_loss:
            return "a custom loss (compute_loss)"
    if training and args.gradient_accumulation_steps != 1:
        return "gradient_accumulation_steps > 1 (the graph holds one batch a step)"
    if training and args.fp16:
        return "fp16 (its loss scaling skips steps from the host); bf16 keeps the captured step"
    if args.world_size != 1:
        return f"{args.world_size} processes (a graph holds one process's step)"
    if getattr(args, "n_gpu", 1) > 1:
        return f"DataParallel over {args.n_gpu} GPUs (launch one process per GPU, or --workers_per_gpu for a grid)"
    if args.torch_compile and (args.torch_compile_mode or "") in ("reduce-overhead", "max-autotune"):
        return f"torch_compile_mode {args.torch_compile_mode} (its own CUDA graphs)"
    if getattr(getattr(model, "config", None), "bilstm", False):
        return "the BiLSTM head (it reads the lengths on the host)"
    if getattr(args, "deepspeed", None) or getattr(args, "fsdp", None):
        return "DeepSpeed or FSDP"
    if not training:
        return None
    if args.gradient_checkpointing:
        return "gradient_checkpointing (its recomputation saves the random state, which a capture cannot)"
    inner = getattr(optimizer, "optimizer", optimizer)
    if type(inner) is not torch.optim.AdamW:
        return f"the optimizer is {type(inner).__name__} (the captured step takes torch's AdamW)"
    if any(p.requires_grad and p.is_sparse for p in model.parameters()):
        return "sparse parameters"
    return None


class CapturedForward:
    """The model's forward without gradients (evaluation and prediction), one CUDA graph a batch structure (its keys,
    shapes and dtypes: a bucket and a batch size), captured on the first batch of each and replayed: no kernel
    launched from Python, no host sync. `__call__(inputs)` returns the output's tensors by name, in the output's
    order, as the graph's own tensors: valid until the next call (the caller copies them). On the CPU (graph=False,
    the tests) the same forward runs eagerly on the same static buffers. A capture that fails is logged and that
    structure runs eagerly. The model must be in evaluation mode (no dropout to draw)."""

    def __init__(self, model, graph: bool):
        self.model, self.graph = model, graph
        self.weights = weights_key(model)  # what the graphs read: the caller checks it still holds (weights_key)
        self.captured: dict[tuple, tuple] = {}  # structure -> (input buffers, graph or None, output tensors)
        self.pool = None

    def _forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            out = self.model(**batch, return_dict=True)
        return {k: v for k, v in out.items() if torch.is_tensor(v)}

    def __call__(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(inputs.items()))
        if key not in self.captured:
            self.captured[key] = self._capture({k: v.clone() for k, v in inputs.items()})
        buffers, graph, outputs = self.captured[key]
        for name, value in inputs.items():
            buffers[name].copy_(value, non_blocking=True)
        if graph is None:
            return self._forward(buffers)
        graph.replay()
        return outputs

    def _capture(self, buffers: dict[str, torch.Tensor]) -> tuple:
        if not self.graph:
            return buffers, None, None
        device = next(iter(buffers.values())).device
        stream = torch.cuda.current_stream(device)
        rng = torch.cuda.get_rng_state(device)  # as the step's capture: the generator as it was
        try:
            side = torch.cuda.Stream(device)  # warm-up (and compilation) on a side stream, as for the step
            side.wait_stream(stream)
            with torch.cuda.stream(side):
                self._forward(buffers)
            stream.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: a loader's pin-memory thread calling CUDA meanwhile is not an error in the capture
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                outputs = self._forward(buffers)
        except RuntimeError as err:
            log.warning("CUDA graph capture of the evaluation forward failed (%s); it runs without a graph",
                        str(err).splitlines()[0])
            torch.cuda.set_stream(stream)
            end_failed_capture(device)
            return buffers, None, None
        finally:
            torch.cuda.set_rng_state(rng, device)
        if self.pool is None:
            self.pool = graph.pool()
        return buffers, graph, outputs


def weights_key(model) -> tuple:
    """Where and in what dtype the model's parameters and buffers live: a graph captured on them reads that memory,
    so another key (a kept step adopted, `model.to(bf16)` for --bf16_full_eval) means new graphs."""
    return tuple((t.data_ptr(), t.dtype) for t in (*model.parameters(), *model.buffers()))


COMPILE_SWITCH = "BERT_SUITE_COMPILE_FINETUNE"  # auto (default): runs of COMPILE_FROM_STEPS steps or more; 1; 0
# Where compiling the encoder starts to pay on a GPU, estimated from issue 49's H200 figures: a captured BERT-base step
# does about 7 ms of GPU work, a fifth to a quarter of it element-wise work that compilation fuses (1.5-2 ms saved a
# step), while compiling its regions costs 30 s or more a run (a graph per bucket and batch size, forward and
# backward). Below this, a run (RTE's 234 steps, SQuAD's 5,500) starts at once and replays eager kernels.
COMPILE_FROM_STEPS = 15_000


def compile_wanted(max_steps: int) -> bool:
    """Whether the captured step's model is compiled (`compile_encoder`) for a run of `max_steps` optimizer steps
    (BERT_SUITE_COMPILE_FINETUNE: auto, 1 or 0)."""
    value = os.environ.get(COMPILE_SWITCH, "auto").strip().lower()
    if value not in ("auto", "0", "1", "true", "false"):
        raise ValueError(f"{COMPILE_SWITCH} must be auto, 1 or 0, got {value!r}")
    return max_steps >= COMPILE_FROM_STEPS if value == "auto" else value in ("1", "true")


def wanted(device_type: str) -> bool:
    """Whether the captured step is asked for on this device (BERT_SUITE_CAPTURED_STEP, default auto)."""
    value = os.environ.get(SWITCH, "auto").strip().lower()
    if value not in ("auto", "0", "1", "true", "false"):
        raise ValueError(f"{SWITCH} must be auto, 1 or 0, got {value!r}")
    return device_type == "cuda" if value == "auto" else value in ("1", "true")


def make_capturable(optimizer) -> None:
    """AdamW with its step counters and learning rate on the device (a graph replays them); set before the
    optimizer has any state, as `capturable=True` at construction would."""
    inner = getattr(optimizer, "optimizer", optimizer)
    for group in inner.param_groups:
        group["capturable"] = True
        for p in group["params"]:  # state loaded from a checkpoint the Trainer's step wrote keeps its step on the CPU
            state = inner.state.get(p, {})
            if torch.is_tensor(state.get("step")) and state["step"].device != p.device:
                state["step"] = state["step"].to(device=p.device, dtype=torch.float32)


def uncached_autocast(model, device_type: str, dtype) -> bool:
    """Autocast without its weight cache around the model's forward (accelerate's wrapper keeps the cache, which a
    CUDA graph cannot capture); the heads return fp32 scores themselves. True when the forward was rewrapped."""
    original = getattr(model, "_original_forward", None)
    if original is None:
        return False

    def forward(*args, **kwargs):
        with torch.autocast(device_type, dtype=dtype, cache_enabled=False):
            return original(*args, **kwargs)

    model.forward = forward
    return True


def compile_encoder(model, backend: str = "inductor") -> int:
    """Compile the embeddings and each encoder layer of a bert_suite model in place (static shapes: one graph a
    bucket, shared by the layers); the head stays eager. Returns the number of regions compiled
    (0 for a model without them, e.g. a stock BERT)."""
    bert = getattr(model, "bert", None)
    if bert is None or not hasattr(bert, "encoder"):
        return 0
    regions = [bert.embeddings, *bert.encoder.layer]
    # a graph per (bucket, batch size, training or evaluation), kept for a grid worker's life: more than dynamo's
    # default 8 a region; past the limit a new shape runs uncompiled (not fullgraph: that would be an error)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    for region in regions:
        region.compile(backend=backend, dynamic=False)
    return len(regions)


# ---- A step kept across a worker's trials
_KEPT: dict = {}  # "step": the FinetuneStep kept, "signature": what a trial must match to adopt it
_KEEPING = [0]  # how many trials() blocks are open

# what changes nothing in the step a model's graphs run: its names (labels, path, versions)
_NAMES = {"_name_or_path", "id2label", "label2id", "transformers_version", "_commit_hash", "architectures", "auto_map",
          "finetuning_task", "dtype", "torch_dtype"}  # dtypes: the parameters' own, below


@contextlib.contextmanager
def trials():
    """Within this block, the captured step outlives the trial that made it (`train_and_evaluate` leaves it to
    `step_for`), and a later trial of the same signature adopts it; the block releases it at its end."""
    _KEEPING[0] += 1
    try:
        yield
    finally:
        _KEEPING[0] -= 1
        if not _KEEPING[0]:
            release()


def signature(model, optimizer, max_grad_norm: float, extra=()) -> tuple:
    """What the kept step's graphs hold fixed: the model's class, configuration (but its names), parameters and
    buffers (names, shapes, dtypes, which train), the optimizer's groups (their parameters and every setting but
    the learning rate, which is a device tensor the scheduler fills) and the clipping norm; `extra`: the caller's
    (the device, the autocast)."""
    config = getattr(model, "config", None)
    settings = {k: v for k, v in config.to_dict().items() if k not in _NAMES} if config is not None else {}
    index = {id(p): i for i, p in enumerate(model.parameters())}
    inner = getattr(optimizer, "optimizer", optimizer)
    groups = tuple((tuple(index.get(id(p), -1) for p in group["params"]),
                    repr(sorted((k, v) for k, v in group.items() if k not in ("params", "param_names", "lr", "initial_lr"))))
                   for group in inner.param_groups)
    return (type(model).__qualname__, json.dumps(settings, sort_keys=True, default=str),
            tuple((n, tuple(t.shape), t.dtype, t.requires_grad) for n, t in model.named_parameters()),
            tuple((n, tuple(t.shape), t.dtype) for n, t in model.named_buffers()), groups, float(max_grad_norm),
            tuple(extra))


def adopt(kept: FinetuneStep, model, optimizer) -> None:
    """Make a new trial's `model` and `optimizer` the kept step's: the trial's fresh weights (and buffers) are
    copied into the kept model's tensors, which the new model's parameters then share, gradients included; the
    optimizer state is zeroed in place, as a new run's, or takes the values the Trainer loaded into the new
    optimizer (a resumed trial); the new optimizer's groups take the kept learning-rate tensors, filled with their
    values. The graphs captured for the kept tensors then train the new model."""
    new_inner, old_inner = (getattr(o, "optimizer", o) for o in (optimizer, kept.optimizer))
    with torch.no_grad():
        for new, old in zip(model.parameters(), kept.model.parameters(), strict=True):
            old.copy_(new)
            state = old_inner.state.get(old)
            if state is not None:  # else a parameter the loss does not reach: its loaded state (if any) stays
                loaded = new_inner.state.pop(new, None) or {}
                for key, value in state.items():
                    if torch.is_tensor(value):
                        value.copy_(loaded[key]) if key in loaded else value.zero_()
                    elif key in loaded:
                        state[key] = loaded[key]
                new_inner.state[new] = state
            new.data = old.data
            new.grad = old.grad
        for (_, new), (_, old) in zip(model.named_buffers(), kept.model.named_buffers(), strict=True):
            old.copy_(new)
            new.data = old.data
        for new_group, old_group in zip(new_inner.param_groups, old_inner.param_groups, strict=True):
            lr = old_group["lr"]  # a tensor the graphs read (_graph_buffers): the new scheduler fills it
            if not torch.is_tensor(lr):
                raise RuntimeError("the kept step's learning rate is not a tensor: it cannot follow a new schedule")
            lr.fill_(float(new_group["lr"]))
            new_group["lr"] = lr
    for value in kept.totals.values():  # the graphs add into these tensors: zeroed, never replaced
        value.zero_()


def step_for(accelerator, model, optimizer, max_grad_norm: float, graph: bool, extra=(),
             previous: FinetuneStep | None = None) -> FinetuneStep:
    """The step for a trial: the kept one adopted (`adopt`) where a `trials()` block holds one of the same
    `signature`; else a new one, kept when inside such a block (the one it replaces is released first).
    `previous`: the step a Trainer chose for its last train() (a new optimizer since): adopted the same way when it
    matches, else finished (`finished`) before a new one is made."""
    found = signature(model, optimizer, max_grad_norm, (graph, *extra))
    if previous is not None and previous.model is not None and \
            signature(previous.model, previous.optimizer, max_grad_norm, (graph, *extra)) == found:
        adopt(previous, model, optimizer)
        return previous
    if previous is not None:
        finished(previous)
    kept = _KEPT.get("step")
    # the kept model as it is now (a trial that changed it, e.g. by merging LoRA, cannot hand it on)
    if kept is not None and _KEPT["signature"] == found == signature(kept.model, kept.optimizer, max_grad_norm,
                                                                     (graph, *extra)):
        adopt(kept, model, optimizer)
        return kept
    release()
    step = FinetuneStep(accelerator, model, optimizer, max_grad_norm, graph=graph)
    # a LoRA trial's saved model is merged in place (merge_and_unload): never kept
    if _KEEPING[0] and not hasattr(model, "peft_config"):
        _KEPT.update(step=step, signature=found)
    return step


def finished(step: FinetuneStep) -> None:
    """A trial is done with `step`: outside a `trials()` block its graphs and their memory go now, not at a later
    garbage collection; inside one it is kept for the next trial."""
    if _KEPT.get("step") is not step:
        _free(step)


def release() -> None:
    """Drop the kept step (its graphs, memory pool, model and optimizer state)."""
    step = _KEPT.pop("step", None)
    _KEPT.pop("signature", None)
    if step is not None:
        _free(step)


def _free(step: FinetuneStep) -> None:
    step.captured.clear()
    step.pool = None
    step.model = step.optimizer = None  # the caller's Trainer may outlive this; the step's own hold goes now
    step.params = []
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
