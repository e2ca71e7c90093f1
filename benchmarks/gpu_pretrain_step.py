# Command (on a GPU machine): python benchmarks/gpu_pretrain_step.py [--seq_lens 128 512] [--compile both]
"""BERT-base pre-training step on one GPU in bf16: ours vs stock transformers (eager and SDPA
attention), each with and without torch.compile. Tokens per second, peak GPU memory and model
FLOPs utilisation against the GPU's dense bf16 peak (989 TFLOP/s for H100/H200 SXM; --peak_tflops).

One step = forward + backward + clipping + fused AdamW under bf16 autocast, on full-length batches
(as most pre-training instances are) of 16,384 tokens: 128 x 128 or 32 x 512. Every sequence has
the same number of masked positions (15%, capped at 20 for 128 and 76 for 512, the recipe's caps),
so that compiled graphs keep static shapes. Token ids are random: the work does not depend on
them, and the GPU machine has no corpus. FLOPs: common.encoder_flops (x3), the same for every
variant. Variants alternate per repetition; medians reported. Results: runs/bench/gpu_pretrain_step.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from pretrain_step import stepper  # noqa: E402

CAPS = {128: 20, 512: 76}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="base")
    p.add_argument("--seq_lens", type=int, nargs="+", default=[128, 512])
    p.add_argument("--tokens", type=int, default=16384, help="tokens per step (batch = tokens / length)")
    p.add_argument("--compile", choices=["none", "with", "both"], default="both")
    p.add_argument("--steps", type=int, default=10, help="steps per timed repetition")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peak_tflops", type=float, default=989.0, help="dense bf16 peak of the GPU")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--profile", action="store_true",
                   help="profile one step of the fastest variant at the first length: categories and top kernels")
    p.add_argument("--out", default="gpu_pretrain_step")
    return p.parse_args(argv)


def make_batches(config, seq_len: int, batch: int, count: int, device) -> list[dict]:
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


def variants(config, compile_mode: str, device):
    """name -> (model, extra forward kwargs); every model starts from ours' weights."""
    import torch
    import transformers

    from bert_suite import BertSuiteForPreTraining

    torch.manual_seed(0)
    ours = BertSuiteForPreTraining(config)
    built = {"ours": (ours, {"masked_positions_only": True})}
    for attn in ("eager", "sdpa"):
        stock = transformers.BertForPreTraining(transformers.BertConfig(**config.to_bert_dict(), attn_implementation=attn))
        stock.load_state_dict(ours.state_dict(), strict=False)
        built[f"stock {attn}"] = (stock, {})
    result = {}
    for name, (model, extra) in built.items():
        model.to(device).train()
        if compile_mode in ("none", "both"):
            result[name] = (model, extra)
        if compile_mode in ("with", "both"):
            result[f"{name} + compile"] = (torch.compile(model), extra)
    return result


def top_kernels(run, device, count: int = 8) -> str:
    """The kernels with the most device self time in one call of `run`, one per line."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        common.sync(device)
    events = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:count]
    total = sum(e.self_device_time_total for e in prof.key_averages()) or 1
    return "\n".join(f"{100 * e.self_device_time_total / total:5.1f}%  {e.key[:110]}" for e in events)


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    from bert_suite import BertSuiteConfig

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        common.skip("no CUDA device (this benchmark is for a GPU machine; pass --device cpu to try it)")
    torch.backends.cuda.matmul.allow_tf32 = True
    config = BertSuiteConfig.from_preset(args.preset, vocab_size=30522)
    peak = args.peak_tflops * 1e12
    rows, profiles = [], {}
    for seq_len in args.seq_lens:
        batch = max(1, args.tokens // seq_len)
        batches = make_batches(config, seq_len, batch, args.steps, args.device)
        models = variants(config, args.compile, args.device)
        autocast = torch.autocast(device_type=args.device.split(":")[0], dtype=torch.bfloat16,
                                  enabled=args.dtype == "bf16")
        runs = {name: stepper(model, batches, bool(extra), autocast) for name, (model, extra) in models.items()}
        memory = {}
        for name, run in runs.items():  # warm-up (and compilation), peak memory of a steady step
            if args.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            run()
            if args.device.startswith("cuda"):
                memory[name] = torch.cuda.max_memory_allocated() / 2**20
        seconds = common.alternate(runs, args.repeats, args.device)
        masked = sum(int((b["labels"] != -100).sum()) for b in batches)
        flops = 3 * common.encoder_flops(config, [seq_len] * batch * len(batches), masked)
        for name in runs:
            t = common.median(seconds[name])
            rows.append({"seq_len": seq_len, "batch": batch, "variant": name, "tokens_per_s": batch * seq_len * len(batches) / t,
                         "mfu": flops / t / peak, "peak_mib": memory.get(name, float("nan")), "seconds": seconds[name]})
        if args.profile and seq_len == args.seq_lens[0]:
            best = max((r for r in rows if r["seq_len"] == seq_len), key=lambda r: r["tokens_per_s"])["variant"]
            profiles[best] = common.profile_breakdown(runs[best], args.device)
            print(common.breakdown_table({best: profiles[best]}))
            print(top_kernels(runs[best], args.device))
        del models, runs
    base = {(r["seq_len"]): r["tokens_per_s"] for r in rows if r["variant"] == "stock sdpa"}
    for r in rows:
        r["vs_stock_sdpa"] = r["tokens_per_s"] / base[r["seq_len"]] if r["seq_len"] in base else float("nan")
    payload = {"machine": common.machine(), "settings": vars(args), "rows": rows, "profiles": profiles}
    common.write_result(args.out, payload)
    print(json.dumps(payload["machine"]))
    print(common.table(rows, [("seq_len", "length"), ("batch", "batch"), ("variant", "variant"),
                              ("tokens_per_s", "tokens/s"), ("vs_stock_sdpa", "vs stock sdpa"), ("mfu", "MFU"),
                              ("peak_mib", "peak MiB")]))
    return payload


if __name__ == "__main__":
    main()
