# Command (on a GPU machine): python benchmarks/gpu_pretrain_step.py --preset base --seq_len 128 [--check] [--profile]
"""One pre-training step on one GPU in bf16: the recipe's step (bert_suite.pretraining.step) in each of its
forms against stock transformers, in one process. Tokens per second, MFU against the GPU's dense bf16 peak
(989 TFLOP/s for H100/H200 SXM; --peak_tflops), peak GPU memory.

One step = forward + backward + clipping (1.0) + fused AdamW under bf16 autocast on full-length batches (as
most pre-training instances are) of --tokens tokens (default 16,384: 128 x 128 or 32 x 512), each sequence
with the recipe's number of masked positions (15%, at most 20 at 128 and 80 at 512). Variants:
  stock           transformers.BertForPreTraining (SDPA), the MLM decoder at every position, a plain loop
  before          our model of --before (a copy of an earlier bert_suite, e.g. 4889d2e) in that loop with
                  masked_positions_only, as the earlier benchmark measured it
  eager           the recipe's static step (accelerate, no host sync, masked positions as a tensor)
  compiled        + the regions compiled (bert_suite.pretraining.step.compile_regions)
  graph           + the whole step captured in a CUDA graph (model eager)
  compiled+graph  both: the recipe's default for the small presets on CUDA
Each variant has its own model (same initial weights) and optimizer; variants alternate per repetition;
medians reported. FLOPs: common.encoder_flops (x3), the same for every variant.
--check: the recipe's step under torch.cuda.set_sync_debug_mode("error") (batches copied from the CPU
included); --check_graph: the graph-captured steps against their uncaptured twins over 3 steps with
dropout on (the same random stream: the same losses). --profile: the top kernels of the best uncaptured variant.
Token ids are random: the work does not depend on them, and a GPU machine has no corpus.
Result: --out (default runs/bench/gpu_pretrain_step-PRESET-LEN.json).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from pretrain_step import stepper  # noqa: E402  (stock / before: the loop of the CPU benchmark)

CAPS = {128: 20, 512: 80}  # the recipe's max_predictions_per_seq at each length
VARIANTS = ("stock", "before", "eager", "compiled", "graph", "compiled+graph")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="base")
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--tokens", type=int, default=16384, help="tokens per step (batch = tokens / length)")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, help="default: all (before only with --before)")
    p.add_argument("--before", type=Path, help="a folder holding bert_suite_before/ (an earlier modeling file)")
    p.add_argument("--steps", type=int, default=10, help="steps per timed repetition")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peak_tflops", type=float, default=989.0, help="dense bf16 peak of the GPU")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--check", action="store_true", help="the recipe's step under CUDA's sync debug mode")
    p.add_argument("--check_graph", action="store_true", help="captured against uncaptured losses, dropout on")
    p.add_argument("--profile", action="store_true", help="top kernels of the best uncaptured variant")
    p.add_argument("--out", type=Path, help="result JSON (default runs/bench/gpu_pretrain_step-PRESET-LEN.json)")
    args = p.parse_args(argv)
    if args.variants is None:
        args.variants = [v for v in VARIANTS if v != "before" or args.before]
    return args


def make_batches(config, seq_len: int, batch: int, count: int, device) -> list[dict]:
    """Full-length batches with the recipe's number of masked positions per sequence (never the first or
    last token), labels at every position (-100 elsewhere): the form the collator makes."""
    import torch

    g = torch.Generator().manual_seed(seq_len)
    masked = min(CAPS.get(seq_len, round(0.15 * seq_len)), round(0.15 * seq_len))
    out = []
    for _ in range(count):
        ids = torch.randint(999, config.vocab_size, (batch, seq_len), generator=g)
        labels = torch.full_like(ids, -100)
        positions = torch.rand(batch, seq_len - 2, generator=g).argsort(1)[:, :masked] + 1
        labels.scatter_(1, positions, ids.gather(1, positions))
        ids.scatter_(1, positions, 103)
        types = torch.zeros_like(ids)
        types[:, seq_len // 2:] = 1
        out.append({k: v.to(device) for k, v in {"input_ids": ids, "token_type_ids": types, "labels": labels,
                                                 "next_sentence_label": torch.randint(0, 2, (batch,), generator=g)}.items()})
    return out


class Ours:
    """One form of the recipe's step on its own copy of the model."""

    def __init__(self, variant: str, model, accelerator, device):
        import torch

        from bert_suite.pretraining.step import (
            PretrainingStep,
            batch_stats,
            compile_regions,
            compiled_stats,
            keep_autocast_outputs,
        )

        graph = variant.endswith("graph")
        compiled = variant.startswith("compiled")
        self.model = copy.deepcopy(model)
        if compiled:
            compile_regions(self.model)
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0.01, fused=True,
                                      capturable=graph and str(device).startswith("cuda"))
        self.model, optimizer = accelerator.prepare(self.model, optimizer)
        keep_autocast_outputs(self.model)
        self.step = PretrainingStep(accelerator, self.model, optimizer, 1.0, static=True, graph=graph,
                                    stats_fn=compiled_stats() if compiled else batch_stats)

    def runner(self, batches, num_items):
        def run():
            for batch in batches:
                self.step([batch], num_items)
        return run


def static_batches(config, args, count: int, device):
    """`count` batches of make_batches on the CPU, the same in the recipe's static form on `device`, and the
    MLM loss's divisor of one step (its masked positions)."""
    import torch

    from bert_suite.pretraining.masking import static_batch

    cpu = make_batches(config, args.seq_len, max(1, args.tokens // args.seq_len), count, "cpu")
    predictions = CAPS.get(args.seq_len, round(0.15 * args.seq_len))
    static = [{k: v.to(device) for k, v in static_batch(b, args.seq_len, predictions).items()} for b in cpu]
    masked = sum(int((b["labels"] != -100).sum()) for b in cpu)
    return cpu, static, torch.full((), masked / count, device=device)


def build(args, config, device):
    """name -> run() over the timed batches, errors by name, the recipe's step forms, the batches, masked count."""
    import torch
    import transformers
    from accelerate import Accelerator
    from accelerate.utils import AutocastKwargs

    from bert_suite import BertSuiteForPreTraining

    cpu, static, num_items = static_batches(config, args, args.steps, device)
    dynamic = [{k: v.to(device) for k, v in b.items()} for b in cpu]
    masked = sum(int((b["labels"] != -100).sum()) for b in cpu)
    bf16 = args.dtype == "bf16"
    autocast = torch.autocast(device_type=str(device).split(":")[0], dtype=torch.bfloat16, enabled=bf16)
    accelerator = Accelerator(cpu=str(device) == "cpu", mixed_precision="bf16" if bf16 else "no",
                              kwargs_handlers=[AutocastKwargs(cache_enabled=False)])
    torch.manual_seed(0)
    ours = BertSuiteForPreTraining(config).to(device).train()
    runs, errors, steps = {}, {}, {}
    for variant in args.variants:
        try:
            if variant == "stock":
                stock = transformers.BertForPreTraining(transformers.BertConfig(**config.to_bert_dict(),
                                                                                attn_implementation="sdpa"))
                stock.load_state_dict(ours.state_dict(), strict=False)
                runs[variant] = stepper(stock.to(device).train(), dynamic, False, autocast)
            elif variant == "before":
                sys.path.insert(0, str(args.before))
                from bert_suite_before import modeling_bert_suite as earlier

                old = earlier.BertSuiteForPreTraining(earlier.BertSuiteConfig.from_preset(args.preset, vocab_size=30522))
                old.load_state_dict(ours.state_dict())
                runs[variant] = stepper(old.to(device).train(), dynamic, True, autocast)
            else:
                steps[variant] = Ours(variant, ours, accelerator, device)
                runs[variant] = steps[variant].runner(static, num_items)
        except Exception as err:  # one variant failing must not sink the rest: recorded in the result
            errors[variant] = f"{type(err).__name__}: {err}"
            traceback.print_exc()
    return runs, errors, steps, dynamic, masked


def sync_check(step_form, config, args, device) -> str:
    """One step of the recipe's static step with its batch copied from the CPU, under CUDA's sync debug mode."""
    import torch

    from bert_suite.pretraining.masking import static_batch
    from bert_suite.pretraining.step import to_device

    (cpu,), _, num_items = static_batches(config, args, 1, device)
    cpu = static_batch(cpu, args.seq_len, CAPS.get(args.seq_len, round(0.15 * args.seq_len)))  # still on the CPU
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step_form.step([to_device(cpu, device)], num_items)
        return "no sync"
    except RuntimeError as err:
        return f"SYNC: {str(err).splitlines()[0][:200]}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


def graph_equals_eager(config, args, device, compiled: bool) -> dict:
    """3 steps, dropout 0.1, from the same weights and random state: captured against uncaptured."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import AutocastKwargs

    from bert_suite import BertSuiteForPreTraining

    _, batches, num_items = static_batches(config, args, 3, device)
    accelerator = Accelerator(mixed_precision="bf16" if args.dtype == "bf16" else "no",
                              kwargs_handlers=[AutocastKwargs(cache_enabled=False)])
    torch.manual_seed(0)
    model = BertSuiteForPreTraining(config).to(device).train()
    losses, weights = {}, {}
    for variant in (("compiled", "compiled+graph") if compiled else ("eager", "graph")):
        form = Ours(variant, model, accelerator, device)
        torch.manual_seed(1)
        torch.cuda.manual_seed(1)
        losses[variant] = []
        for batch in batches:
            form.step([batch], num_items)
            totals = form.step.take_totals()
            losses[variant].append(float(totals["mlm_loss"] / totals["mlm_count"]))
        weights[variant] = form.model.bert.embeddings.word_embeddings.weight.detach().float().clone()
    first, second = weights.values()
    return {"losses": losses, "max_loss_diff": max(abs(x - y) for x, y in zip(*losses.values(), strict=True)),
            "max_weight_diff": float((first - second).abs().max())}


# GPU kernels by kind, first match on the lower-cased kernel name
KERNEL_KINDS = [
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_")),
    ("attention", ("flash", "fmha", "attention", "cudnn")),
    ("optimizer / clipping", ("multi_tensor", "fused_adam", "foreach", "adam")),
    ("embedding / sort", ("embedding", "indexselect", "index_", "radix", "sort", "scatter", "gather")),
    ("softmax / loss", ("softmax", "nll", "cross_entropy", "logsumexp")),
    ("layer norm", ("layer_norm", "layernorm")),
    ("compiled (triton)", ("triton",)),
    ("dropout / RNG", ("dropout", "bernoulli", "philox", "rand")),
    ("copies", ("copy", "cast", "fill")),
    ("reductions", ("reduce",)),
]


def kernel_profile(run, device, steps: int, count: int = 12) -> dict:
    """The GPU kernels of one call of `run` (`steps` steps): time and launches per step, by kind, the top ones.
    Kernels launched inside a CUDA graph are traced too (CUPTI), so a captured step can be profiled."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        common.sync(device)
    kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0]
    total = sum(e.self_device_time_total for e in kernels) or 1
    kinds: dict[str, float] = {}
    for e in kernels:
        name = e.key.lower()
        kind = next((k for k, keys in KERNEL_KINDS if any(w in name for w in keys)), "other")
        kinds[kind] = kinds.get(kind, 0.0) + e.self_device_time_total
    top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:count]
    return {"kernel_ms_per_step": total / 1e3 / steps, "launches_per_step": sum(e.count for e in kernels) / steps,
            "by_kind": {k: round(100 * v / total, 1) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            "top_kernels": [f"{100 * e.self_device_time_total / total:5.1f}% x{e.count // steps:<4d} {e.key[:100]}"
                            for e in top]}


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    from bert_suite import BertSuiteConfig

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        common.skip("no CUDA device (this benchmark is for a GPU machine; pass --device cpu to try it)")
    torch.backends.cuda.matmul.allow_tf32 = True
    config = BertSuiteConfig.from_preset(args.preset, vocab_size=30522)
    peak = args.peak_tflops * 1e12
    cuda = args.device.startswith("cuda")
    started = time.time()
    runs, errors, steps, dynamic, masked = build(args, config, args.device)
    memory, warm = {}, {}
    for name in list(runs):  # warm-up: compilation and capture, then the peak memory of a steady step
        try:
            t0 = time.time()
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            runs[name]()
            common.sync(args.device)
            warm[name] = time.time() - t0
            if cuda:
                memory[name] = torch.cuda.max_memory_allocated() / 2**20
        except Exception as err:
            errors[name] = f"{type(err).__name__}: {err}"
            traceback.print_exc()
            del runs[name]
    seconds = common.alternate(runs, args.repeats, args.device)
    batch = len(dynamic[0]["input_ids"])
    flops = 3 * common.encoder_flops(config, [args.seq_len] * batch * len(dynamic), masked)
    rows = []
    for name in runs:
        t = common.median(seconds[name])
        rows.append({"preset": args.preset, "seq_len": args.seq_len, "batch": batch, "variant": name,
                     "tokens_per_s": batch * args.seq_len * len(dynamic) / t, "mfu": flops / t / peak,
                     "step_ms": 1e3 * t / len(dynamic), "peak_mib": memory.get(name, float("nan")),
                     "warm_up_s": warm.get(name), "seconds": seconds[name]})
    base = {r["variant"]: r["tokens_per_s"] for r in rows}
    for r in rows:
        r["vs_stock"] = r["tokens_per_s"] / base["stock"] if "stock" in base else float("nan")
        r["vs_before"] = r["tokens_per_s"] / base["before"] if "before" in base else float("nan")
    payload = {"machine": common.machine(), "settings": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
               "errors": errors}
    if args.profile and rows:  # the best form's kernels; the GPU is busy kernel_ms_per_step of its ms/step
        best = max(rows, key=lambda r: r["tokens_per_s"])
        uncaptured = max((r for r in rows if not r["variant"].endswith("graph")), key=lambda r: r["tokens_per_s"],
                         default=best)
        for key, row in (("profile", best), ("profile_uncaptured", uncaptured)):
            if key == "profile_uncaptured" and row is best:
                continue
            try:
                payload[key] = {"variant": row["variant"], "step_ms": row["step_ms"],
                                **kernel_profile(runs[row["variant"]], args.device, len(dynamic))}
            except Exception as err:
                payload[key] = {"variant": row["variant"], "error": f"{type(err).__name__}: {err}"}
    if args.check and cuda:
        payload["sync_check"] = {name: sync_check(form, config, args, args.device) for name, form in steps.items()}
    if args.check_graph and cuda:
        for compiled in (False, True):
            try:
                payload[f"graph_vs_eager{' compiled' if compiled else ''}"] = graph_equals_eager(
                    config, args, args.device, compiled)
            except Exception as err:
                payload[f"graph_vs_eager{' compiled' if compiled else ''}"] = f"{type(err).__name__}: {err}"
    payload["wall_s"] = time.time() - started
    out = args.out or common.RESULTS_DIR / f"gpu_pretrain_step-{args.preset}-{args.seq_len}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(json.dumps(payload["machine"]))
    print(common.table(rows, [("preset", "preset"), ("seq_len", "length"), ("batch", "batch"), ("variant", "variant"),
                              ("tokens_per_s", "tokens/s"), ("vs_stock", "vs stock"), ("vs_before", "vs before"),
                              ("mfu", "MFU"), ("step_ms", "ms/step"), ("peak_mib", "peak MiB"),
                              ("warm_up_s", "warm-up s")]))
    for key in ("errors", "sync_check", "graph_vs_eager", "graph_vs_eager compiled"):
        if payload.get(key):
            print(f"{key}: {payload[key]}")
    for key in ("profile", "profile_uncaptured"):
        if key in payload:
            profile = payload[key]
            print(f"{key} of {profile['variant']}: "
                  + json.dumps({k: v for k, v in profile.items() if k != "top_kernels"}))
            print("\n".join(profile.get("top_kernels", [])))
    return payload


if __name__ == "__main__":
    main()
