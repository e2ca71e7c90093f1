# Command: python benchmarks/compile_speed.py [--presets tiny base] [--device cpu|cuda] [--quick]
"""Eager against torch.compile: training steps per second of ours (unpadded and padded paths) and
of stock transformers BERT, for a fine-tuning step and a pre-training step, in the same run.

Variants, every model starting from the same weights:
  ours unpad          eager, the default: dense layers on the real tokens only
  ours pad            eager, unpad_inputs=False: the stock computation at every position
  ours + compile      torch.compile; under compile the padded path is always taken (no decision
                      may read the mask's values), so this is the compiled "pad" path
  stock               transformers.BertFor* with SDPA attention, eager
  stock + compile     the same under torch.compile
Fine-tuning step: sequence classification, batches padded to 128 with GLUE-like lengths (uniform
in [24, 128], about 40% padding), AdamW. Pre-training step: MLM + NSP on the same batches, 15% of
the real tokens masked (ours: masked_positions_only, as the recipe; its encoder compiled in place,
as the recipe's torch_compile does). CPU: fp32; CUDA: bf16 autocast. Compilation happens in an
untimed warm-up step, whose time is reported. The attention kernels each variant ran are read from
the profiler. Results: runs/bench/compile_speed.json and a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

HEADS = {"finetune": ("BertSuiteForSequenceClassification", "BertForSequenceClassification"),
         "pretrain": ("BertSuiteForPreTraining", "BertForPreTraining")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=["tiny", "base"])
    p.add_argument("--jobs", nargs="+", choices=list(HEADS), default=list(HEADS))
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default: 32 tiny, 8 base on CPU; 64 on CUDA)")
    p.add_argument("--steps", type=int, default=None, help="steps per timed repetition (default 5 tiny, 2 base; 20 on CUDA)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="tiny only, 2 repetitions (a smoke run)")
    p.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager: trace only, for tests)")
    p.add_argument("--vocab_size", type=int, default=30522)
    p.add_argument("--out", default="compile_speed")
    return p.parse_args(argv)


def make_batches(job: str, vocab: int, batch: int, count: int, device, seed: int = 0) -> list[dict]:
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        lengths = torch.randint(24, 129, (batch,), generator=g)
        mask = (torch.arange(128)[None] < lengths[:, None]).long()
        ids = torch.randint(999, vocab, (batch, 128), generator=g) * mask
        types = ((torch.arange(128)[None] >= lengths[:, None] // 2) & mask.bool()).long()
        item = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        if job == "finetune":
            item["labels"] = torch.randint(0, 2, (batch,), generator=g)
        else:
            chosen = (torch.rand(batch, 128, generator=g) < 0.15) & mask.bool()
            chosen[:, 1] = True  # at least one masked position per sequence
            item["labels"] = torch.where(chosen, ids, torch.full_like(ids, -100))
            item["input_ids"] = torch.where(chosen, torch.full_like(ids, 103), ids)
            item["next_sentence_label"] = torch.randint(0, 2, (batch,), generator=g)
        out.append({k: v.to(device) for k, v in item.items()})
    return out


def build(job: str, preset: str, device, backend: str = "inductor", vocab_size: int = 30522):
    """name -> (model, forward kwargs)."""
    import torch
    import transformers

    import bert_suite
    from bert_suite import BertSuiteConfig

    ours_name, stock_name = HEADS[job]
    config = BertSuiteConfig.from_preset(preset, vocab_size=vocab_size, num_labels=2)
    torch.manual_seed(0)
    reference = getattr(bert_suite, ours_name)(config)
    extra = {"masked_positions_only": True} if job == "pretrain" else {}

    def ours(unpad: bool, compiled: bool):
        model = getattr(bert_suite, ours_name)(BertSuiteConfig(**{**config.to_dict(), "unpad_inputs": unpad}))
        model.load_state_dict(reference.state_dict())
        if compiled:  # as the recipe (pre-training: the encoder in place) and Trainer (the whole model)
            if job == "pretrain":
                model.bert.compile(backend=backend)
            else:
                model = torch.compile(model, backend=backend)
        return model.to(device).train(), extra

    def stock(compiled: bool):
        model = getattr(transformers, stock_name)(transformers.BertConfig(**config.to_bert_dict(), attn_implementation="sdpa"))
        model.load_state_dict(reference.state_dict(), strict=False)
        model = model.to(device).train()
        return (torch.compile(model, backend=backend) if compiled else model), {}

    return {"ours unpad": ours(True, False), "ours pad": ours(False, False), "ours + compile": ours(False, True),
            "stock": stock(False), "stock + compile": stock(True)}


def stepper(model, batches, extra, autocast):
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def run():
        for batch in batches:
            with autocast:
                loss = model(**batch, **extra).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return run


def attention_kernels(model, batch, extra, autocast) -> str:
    """The scaled-dot-product-attention operators and kernels one forward pass ran."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.no_grad(), autocast, torch.profiler.profile(activities=activities) as prof:
        model(**batch, **extra)
    names = {e.key for e in prof.key_averages()}
    wanted = ("scaled_dot_product", "flash", "efficient_attention", "fmha", "cudnn_attention")
    found = sorted(n for n in names if any(w in n.lower() for w in wanted) and "backward" not in n.lower())
    # the explicit path (attn_implementation="eager" or a traced graph without SDPA) shows as softmax
    return ", ".join(found[:3]) or "no SDPA operator (explicit softmax)"


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    presets = ["tiny"] if args.quick else args.presets
    repeats = 2 if args.quick else args.repeats
    rows = []
    for preset in presets:
        batch = args.batch or (64 if cuda else 32 if preset == "tiny" else 8)
        steps = args.steps or (20 if cuda else 5 if preset == "tiny" else 2)
        for job in args.jobs:
            batches = make_batches(job, args.vocab_size, batch, steps, device)
            autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
            torch._dynamo.reset()  # once per job: a reset between variants would drop a compiled one's graphs
            models = build(job, preset, device, args.backend, args.vocab_size)
            runs, warmup, kernels = {}, {}, {}
            for name, (model, extra) in models.items():
                runs[name] = stepper(model, batches, extra, autocast)
                start = time.perf_counter()
                stepper(model, batches[:1], extra, autocast)()  # compilation happens here
                common.sync(device)
                warmup[name] = time.perf_counter() - start
                kernels[name] = attention_kernels(model, batches[0], extra, autocast)
                runs[name]()  # a steady warm-up
                print(f"{preset} {job} {name}: warm-up {warmup[name]:.1f} s; attention: {kernels[name]}", flush=True)
            seconds = common.alternate(runs, repeats, device)
            base = common.median(seconds["stock"])
            for name in runs:
                t = common.median(seconds[name])
                rows.append({"preset": preset, "job": job, "variant": name, "steps_per_s": steps / t,
                             "vs_stock_eager": base / t, "warmup_s": warmup[name], "attention": kernels[name],
                             "seconds": seconds[name], "batch": batch})
            del models, runs
    payload = {"machine": common.machine(), "device": device,
               "gpu": torch.cuda.get_device_name() if cuda else None, "settings": vars(args), "rows": rows}
    common.write_result(args.out, payload)
    print(json.dumps(payload["machine"]))
    print(common.table(rows, [("preset", "size"), ("job", "step"), ("batch", "batch"), ("variant", "variant"),
                              ("steps_per_s", "steps/s"), ("vs_stock_eager", "vs stock eager"),
                              ("warmup_s", "first step s"), ("attention", "attention kernels")]))
    return payload


if __name__ == "__main__":
    main()
