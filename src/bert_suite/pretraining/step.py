"""The pre-training step: one optimizer step over a global batch, on static shapes and without host syncs.

One step is, for each micro-batch, the forward pass (MLM + NSP loss, Section 3.1) and the backward pass,
then gradient clipping and the optimizer. On a GPU its speed turns on three things beside the arithmetic:

- Static shapes. Every batch is padded to its phase's length and carries its masked positions as a
  (batch, max_predictions_per_seq) tensor (`MaskingCollator.static`, on the CPU), so one compiled graph
  serves every batch and no shape depends on the masks.
- No host sync. The model makes no choice from a tensor's value (`unpad=False`); a batch without padding
  comes with no attention_mask, so SDPA may run flash attention with the dropout inside the kernel; the
  count the loss is divided by comes from the data pipeline; the statistics logged stay on the device
  until a logging step reads them. A step that waits for the device leaves the GPU idle while Python
  queues the next kernels: small models then run at the speed of the CPU.
- Few launches. The regions of the model are compiled (`compile_regions`: bias+GELU and
  bias+dropout+residual+LayerNorm fused, the vocabulary projection with its cross-entropy), and on one GPU
  the whole step, clipping and the optimizer included, is one CUDA graph replayed every step
  (`PretrainingStep(graph=True)`): measured on an H200, even BERT-base at 16,384 tokens a step spends
  more time queueing kernels from Python than running them (benchmarks/RESULTS.md).

The eager CPU path (`static=False`) is the one measured fastest there: the model drops padding itself and
computes the MLM head at the labelled positions found by boolean indexing.
"""

from __future__ import annotations

import contextlib
import logging
from types import MethodType

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

log = logging.getLogger(__name__)

def resolve_switch(value, device_type: str) -> bool:
    """A recipe switch (`auto`, true or false): auto is on for CUDA devices only."""
    return device_type == "cuda" if value == "auto" else bool(value)


def step_form(static_shapes, torch_compile, cuda_graph, device_type: str, processes: int,
              mixed_precision: str) -> tuple[bool, bool, bool]:
    """The recipe's three switches (each auto, True or False) resolved for a run: (static, compiled, graph).
    auto is on for a CUDA device; static_shapes=False turns off the auto forms that need static shapes; the
    graph also needs one process and no fp16 (whose loss scaling skips steps from the host). ValueError when
    cuda_graph=True cannot run (the config already refuses either switch true beside static_shapes false)."""
    fp16 = mixed_precision == "fp16"
    compiled = resolve_switch(torch_compile, device_type) and not (static_shapes is False and torch_compile == "auto")
    graph = resolve_switch(cuda_graph, device_type) and (
        cuda_graph is True or (processes == 1 and not fp16 and static_shapes is not False))
    if graph and (device_type != "cuda" or processes != 1 or fp16):
        raise ValueError(f"cuda_graph=true needs one process on a CUDA device without fp16 (this run: {processes} "
                         f"on {device_type}, mixed precision {mixed_precision}); set cuda_graph=auto or false")
    return resolve_switch(static_shapes, device_type) or compiled or graph, compiled, graph


def compile_regions(model, backend: str = "inductor", **options) -> list[torch.nn.Module]:
    """Compile a pre-training model in place, region by region: the embeddings, each encoder layer and the
    heads with their loss (`model.cls`). The layers run the same code, so the first one's graph serves them
    all: a base model compiles in about the time of a two-layer one. Each region must be one graph
    (fullgraph: a break is an error, not a silent slowdown). Parameter names stay the eager model's, so
    checkpoints are unchanged; the pooler (two small kernels) stays eager. Returns the compiled regions."""
    bert = model.bert
    regions = [bert.embeddings, *bert.encoder.layer, model.cls]
    for region in regions:
        region.compile(backend=backend, fullgraph=True, **options)
    return regions


def compiled_stats(backend: str = "inductor"):
    """`batch_stats` compiled for the static forms: the cross-entropy, argmax and counts read the logits
    once, where eager code copies them to fp32 and reads them three times (for a small model, a sixth
    of the step)."""
    return torch.compile(batch_stats, backend=backend, fullgraph=True)


def keep_autocast_outputs(model) -> bool:
    """accelerate's native mixed precision wraps the model's forward as convert_outputs_to_fp32(autocast(
    forward)): every bf16/fp16 output is copied to fp32 after the step. The loss is computed inside forward in
    fp32 already, so the copy is of the MLM logits alone, the step's largest tensor (batch x predictions x
    vocabulary): a pass over memory that small models feel. Keep the autocast, drop the copy. True when the
    wrapper was found (accelerate as pinned in constraints.txt), False when there was none."""
    inner = getattr(model, "module", model)  # DDP keeps the wrapped forward on the inner model
    converter = getattr(getattr(inner.forward, "__func__", None), "__wrapped__", None)
    autocast_forward = getattr(converter, "model_forward", None)
    if autocast_forward is None or not hasattr(inner, "_original_forward"):
        return False
    inner.forward = MethodType(autocast_forward, inner)
    return True


def to_device(batch: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    """The batch on `device`. To CUDA through pinned memory with non_blocking: a copy from pageable memory
    waits for every queued kernel first (a host sync per tensor per step)."""
    if torch.device(device).type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}


def batch_stats(out, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Summed MLM loss, correct predictions and count over the labelled positions, and NSP's, for logging.
    Device tensors: reading them every step would wait for the device every step. The static forms
    ((batch, P) or (batch, seq_len) logits beside same-shaped labels) need no boolean indexing; the eager
    CPU path's (labelled positions, vocab) logits select their labels with one."""
    labels = batch["labels"]
    logits = out.prediction_logits.detach()
    if logits.dim() == 3:
        logits, targets = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    else:  # masked_positions_only: the logits of the labelled positions, in order
        targets = labels[labels != -100]
    logits = logits.float()
    valid = targets != -100
    # the loss from the largest logit and the target's (no log-probabilities written, no argmax: on the CPU these
    # two passes over (positions, vocab) were a seventh of a left-to-right step); a position is correct when its
    # target's logit is the largest (argmax's answer but for exact ties)
    top = logits.amax(-1, keepdim=True)
    picked = logits.gather(1, torch.where(valid, targets, 0)[:, None])
    loss = top + torch.sub(logits, top).exp_().sum(-1, keepdim=True).log() - picked
    stats = {"mlm_loss": torch.where(valid, loss.squeeze(1), 0).sum(),
             "mlm_correct": ((picked >= top).squeeze(1) & valid).sum(), "mlm_count": valid.sum()}
    if out.seq_relationship_logits is not None:
        nsp = out.seq_relationship_logits.detach().float()
        target = batch["next_sentence_label"].view(-1)
        stats.update(nsp_loss=F.cross_entropy(nsp, target, reduction="sum"),
                     nsp_correct=(nsp.argmax(-1) == target).sum(),
                     nsp_count=torch.full((), len(target), device=nsp.device))
    return stats


def add_stats(totals: dict[str, torch.Tensor], stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`totals` plus `stats`, key by key, on the device (nothing read); returns `totals`."""
    for key, value in stats.items():
        totals[key] = totals[key] + value if key in totals else value
    return totals


class PretrainingStep:
    """Runs optimizer steps: `step(micro_batches, num_items)` with the global batch's micro-batches (on the
    device) and the MLM loss's divisor (a 0-d device tensor: the global batch's masked tokens divided by
    processes x micro-batches, see the recipe). Statistics add up on the device; `take_totals()` returns
    and resets them; `grad_norm` is the last step's norm before clipping (a device tensor).

    static: batches in `MaskingCollator.static` form, the model told to read no tensor value.
    graph: capture the whole step (every micro-batch's forward and backward, clipping, the optimizer) in a
        CUDA graph on its first call for each batch structure (its keys and shapes: a batch without padding
        has no attention mask, so a phase has two), and replay it: one launch a step. The graphs share the
        learning rate (a device tensor the scheduler fills), the gradient and norm buffers and one memory pool.
        It needs one process, a static batch, no fp16 loss scaling, an optimizer made with `capturable=True`
        and, under autocast, no autocast cache (accelerate's AutocastKwargs(cache_enabled=False)). On the CPU
        (tests) the same body runs on the same static buffers without a graph. A capture that fails is
        logged and the step runs without a graph.
    """

    def __init__(self, accelerator, model, optimizer, max_grad_norm: float, static: bool, graph: bool = False,
                 stats_fn=batch_stats):
        if graph and (not static or accelerator.num_processes != 1):
            raise ValueError("a graph-captured step needs static batches and one process")
        if graph and getattr(accelerator, "scaler", None) is not None:
            raise ValueError("a graph-captured step cannot scale fp16 losses (accelerate's GradScaler skips steps "
                             "on the host); use bf16 or cuda_graph=false")
        self.accelerator, self.model, self.optimizer = accelerator, model, optimizer
        self.max_grad_norm, self.static, self.graph = max_grad_norm, static, graph
        self.stats_fn = stats_fn
        # the batch the model takes, made from what the loader shipped (a `StepMasker`: masks made in the step),
        # inside the compiled and captured step; None: the loader ships it whole
        self.make_batch = None
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.totals: dict[str, torch.Tensor] = {}
        self.grad_norm = torch.tensor(float("nan"))
        self.captured: dict[tuple, _Captured] = {}
        self.pool = None  # the first capture's memory pool, shared by the others (they never run at once)

    def _graph_buffers(self, device) -> None:
        """Once for every capture: the learning rate as a device tensor (the scheduler fills it in place) and
        the norm's buffer. A second capture that made its own would leave the first reading freed memory."""
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)
        for group in optimizer.param_groups:
            if not (torch.is_tensor(group["lr"]) and group["lr"].device == device):
                group["lr"] = torch.tensor(float(group["lr"]), device=device)
        if not (torch.is_tensor(self.grad_norm) and self.grad_norm.device == device):
            self.grad_norm = torch.zeros((), device=device)

    def forward(self, batch: dict[str, torch.Tensor], num_items: torch.Tensor):
        """The model's output on one micro-batch (its `loss` is what the step minimises)."""
        return self.model(**batch, return_dict=True, num_items_in_batch=num_items, **self.forward_kwargs())

    def forward_kwargs(self) -> dict:
        # static: positions given (or, left-to-right, every position), no value read; the CPU path finds them itself
        return {"unpad": False, "masked_positions_only": False} if self.static else {"masked_positions_only": True}

    def __call__(self, micro_batches: list[dict[str, torch.Tensor]], num_items: torch.Tensor) -> None:
        if self.graph:
            key = tuple(tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(b.items())) for b in micro_batches)
            if key not in self.captured:
                self.captured[key] = _Captured(self, micro_batches, num_items)
            self.captured[key].replay(micro_batches, num_items)
            return
        accelerator = self.accelerator
        for batch in micro_batches:
            batch = self.make_batch(batch) if self.make_batch is not None else batch
            with accelerator.accumulate(self.model):
                out = self.forward(batch, num_items)
                accelerator.backward(out.loss)
                if accelerator.sync_gradients:  # the norm before clipping, logged as the Trainer does
                    self.grad_norm = accelerator.clip_grad_norm_(self.params, self.max_grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad()
            add_stats(self.totals, self.stats_fn(out, batch))

    def take_totals(self) -> dict[str, torch.Tensor]:
        """The statistics summed since the last call (device tensors), and a fresh start."""
        taken = {k: v.clone() for k, v in self.totals.items()}
        for value in self.totals.values():
            value.zero_()
        return taken

    def new_shapes(self, make_batch=None) -> None:
        """Forget the captured graphs (a new phase: other lengths); their memory goes back to the allocator.
        `make_batch`: the new phase's batch maker (see `make_batch`)."""
        self.make_batch = make_batch
        self.captured.clear()
        self.pool = None


def end_failed_capture(device) -> None:
    """Leave the CUDA generator as an eager step needs it after a capture that failed. Up to torch 2.11 at
    least (the H200's), a capture marks the generator as capturing when it begins and unmarks it when it ends; a
    capture that fails at its end (an operation the graph cannot hold) leaves the mark, and every later random
    draw outside a graph (an eager step's dropout) then stops with "Offset increment outside graph capture
    encountered unexpectedly" (seen on an H200). A small capture that ends cleanly takes the mark away; the
    caller puts the generator's state back after it. Later versions (2.13) keep a state per capture and leave
    no mark: this changes nothing there."""
    with contextlib.suppress(RuntimeError):
        torch.cuda.synchronize(device)
        side = torch.cuda.Stream(device)
        with torch.cuda.stream(side):
            probe = torch.zeros(1, device=device)
            graph = torch.cuda.CUDAGraph()
            # thread_local: another thread's CUDA call (a pinned-memory loader) is not an error in the capture
            with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                probe.add_(1)
        torch.cuda.synchronize(device)
        del graph


class _Captured:
    """One batch structure's step as a CUDA graph: static input buffers, the graph, and the body it replays."""

    def __init__(self, owner: PretrainingStep, micro_batches, num_items):
        self.owner = owner
        self.inputs = [{k: v.clone() for k, v in b.items()} for b in micro_batches]
        self.num_items = num_items.clone()
        self.optimizer = getattr(owner.optimizer, "optimizer", owner.optimizer)  # accelerate's wrapper -> torch's
        self.graph = None
        device = num_items.device
        # The warm-up (and the capture) draw random numbers (dropout): the generator is put back where it was,
        # so that the replays draw what eager steps would, and a resumed run what the uninterrupted one drew.
        cuda = device.type == "cuda"
        rng = torch.cuda.get_rng_state(device) if cuda else torch.get_rng_state()
        stream = torch.cuda.current_stream(device) if cuda else None
        try:
            if cuda:
                self._capture(device)
            else:  # the CPU: the same body on the same buffers, run eagerly (tests)
                self._prepare(device)
        except RuntimeError as err:  # an operation that cannot be captured: slower, not wrong
            if not cuda:
                raise
            log.warning("CUDA graph capture failed (%s); the step runs without a graph", str(err).splitlines()[0])
            self.graph = None
            torch.cuda.set_stream(stream)  # a capture that fails at its end leaves its own stream current
            end_failed_capture(device)
        finally:
            torch.cuda.set_rng_state(rng, device) if cuda else torch.set_rng_state(rng)
        # The graph writes these tensors in place: held here so their memory stays theirs, checked at each replay
        self.grads = [p.grad for p in owner.params]

    def _prepare(self, device) -> None:
        """What must exist before a capture, outside the graph's memory: gradient buffers; the optimizer's state
        (made by a step with a zero learning rate and zero gradients, which leaves the weights as they are);
        on CUDA the learning rate as a device tensor (the scheduler fills it in place); the norm's and the
        statistics' buffers. Then one forward and backward, which compiles what is compiled."""
        owner, optimizer = self.owner, self.optimizer
        # The parameters this batch structure's loss does not reach (a left-to-right step's NSP head, the pooler
        # of a model without NSP): an eager step leaves them without a gradient, so the optimizer leaves them as
        # they are (no weight decay, no state); the graph keeps a zero gradient buffer for them and leaves them
        # out of its optimizer step alike
        first = owner.make_batch(self.inputs[0]) if owner.make_batch is not None else self.inputs[0]
        probe = owner.forward(first, self.num_items)
        reached = torch.autograd.grad(probe.loss, owner.params, allow_unused=True)
        del probe
        self.idle = [p for p, g in zip(owner.params, reached, strict=True) if g is None]
        for p in owner.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        owner._graph_buffers(device)
        # every parameter without optimizer state gets it here (a state made inside the capture would fail it):
        # all of them in a new run; those another run's checkpoint lacked in one started from it (the NSP head
        # of a biphasic run started from a left-to-right run's checkpoint, `start_from_checkpoint`)
        idle = set(self.idle)
        fresh = [p for p in owner.params if p not in optimizer.state and p not in idle]
        if fresh:
            held = {p: p.grad for p in owner.params if p in optimizer.state or p in idle}
            for p in held:  # the optimizer skips a parameter without a gradient: its state stays as loaded
                p.grad = None
            saved = [group["lr"] for group in optimizer.param_groups]
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * 0
            for p in fresh:
                p.grad.zero_()
            optimizer.step()
            for group, lr in zip(optimizer.param_groups, saved, strict=True):
                group["lr"] = lr
            for p in fresh:
                state = optimizer.state[p]
                step = state.get("step")
                if torch.is_tensor(step):
                    step.zero_()
                elif step is not None:
                    state["step"] = 0
            for p, grad in held.items():
                p.grad = grad
        for key, value in self._body(warm_up=True).items():
            owner.totals.setdefault(key, torch.zeros_like(value))

    def _capture(self, device) -> None:
        side = torch.cuda.Stream(device)  # warm-up on a side stream, as torch.cuda.graph's documentation asks
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self._prepare(device)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.owner.pool):
            self._body()
        self.graph = graph
        if self.owner.pool is None:
            self.owner.pool = graph.pool()

    def _body(self, warm_up: bool = False) -> dict[str, torch.Tensor]:
        """One step on the static buffers. warm_up: forward, backward and statistics only (no update)."""
        owner = self.owner
        torch._foreach_zero_([p.grad for p in owner.params])
        parts = len(self.inputs)
        stats_sum: dict[str, torch.Tensor] = {}
        for shipped in self.inputs:
            batch = owner.make_batch(shipped) if owner.make_batch is not None else shipped
            out = owner.forward(batch, self.num_items)
            (out.loss / parts).backward()  # as accelerate's backward divides by the micro-batches
            add_stats(stats_sum, owner.stats_fn(out, batch))
        if warm_up:
            return stats_sum
        owner.grad_norm.copy_(torch.nn.utils.clip_grad_norm_(owner.params, owner.max_grad_norm, foreach=True))
        idle = [(p, p.grad) for p in self.idle]
        for p, _ in idle:  # left out of the step, as an eager step leaves a parameter without a gradient
            p.grad = None
        self.optimizer.step()
        for p, grad in idle:
            p.grad = grad
        for key, value in stats_sum.items():
            owner.totals[key].add_(value)
        return stats_sum

    def replay(self, micro_batches, num_items) -> None:
        if any(p.grad is not g for p, g in zip(self.owner.params, self.grads, strict=True)):
            raise RuntimeError("a parameter's .grad was replaced after the step was captured in a CUDA graph "
                               "(zero_grad(set_to_none=True)?): the graph writes the captured tensors; leave them")
        for buffers, batch in zip(self.inputs, micro_batches, strict=True):
            for key, value in batch.items():
                buffers[key].copy_(value, non_blocking=True)
        self.num_items.copy_(num_items, non_blocking=True)
        if self.graph is not None:
            self.graph.replay()
        else:
            self._body()


# The operations that make the host wait for the device: a tensor's value read on the host (`.item()`,
# `bool(t)`, `int(t)`), or an output whose shape depends on values (boolean indexing, nonzero, unique...).
_SYNCS = ("_local_scalar_dense", "nonzero", "masked_select", "unique_dim", "_unique", "_unique2",
          "unique_consecutive", "bincount", "is_nonzero", "equal", "item")


class HostSyncError(RuntimeError):
    """An operation that reads tensor values on the host, where the step must not."""


class NoHostSync(TorchDispatchMode):
    """Refuses, while active, the operations that read a tensor's values on the host or give a shape that
    depends on them: around a step on the CPU (where such reads cost nothing) it shows the step makes none of
    the reads that would be host syncs on an accelerator. It does not see copies to the host (`.cpu()`),
    which on the CPU are no copies; on CUDA, `torch.cuda.set_sync_debug_mode("error")` checks everything."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in _SYNCS or (name in ("index", "index_put", "index_put_", "_index_put_impl_") and _bool_index(args)) \
                or (name == "repeat_interleave" and not (kwargs or {}).get("output_size")):
            raise HostSyncError(f"{func}: reads tensor values on the host (a host sync on an accelerator)")
        return func(*args, **(kwargs or {}))


def _bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(torch.is_tensor(i) and i.dtype in (torch.bool, torch.uint8) for i in (indices or ()))


@contextlib.contextmanager
def no_host_sync():
    """`with no_host_sync(): step(...)`: a HostSyncError at the first operation that would sync."""
    with NoHostSync():
        yield
