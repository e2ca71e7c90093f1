# Command (on a GPU machine): python benchmarks/gpu_correctness.py [--out FILE]   (--device cpu --quick: a test's run)
"""Every head against stock transformers BERT on a CUDA device: fp32 parity, bf16-autocast
parity (each side under the same autocast), torch.compile(fullgraph) and torch.export with a mask,
and which SDPA kernels ran under bf16 for padded, all-ones-mask and unmasked batches.

Same weights on both sides (stock saved, ours loaded from it); dropout off; batches of 8 x 128
with lengths in [24, 128] (padded) or all 128 (full). On a GPU the model takes the padded path by
default (deciding to unpad reads the mask, a host sync); per-token outputs are compared at real
tokens only (the CPU's unpadded path leaves zeros at padding positions). Result:
runs/bench/gpu_correctness.json (or --out) and a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

# ours -> (stock class, config extra, fields compared)
HEADS = {
    "BertSuiteModel": ("BertModel", {}, ["last_hidden_state", "pooler_output"]),
    "BertSuiteForPreTraining": ("BertForPreTraining", {}, ["prediction_logits", "seq_relationship_logits"]),
    "BertSuiteForMaskedLM": ("BertForMaskedLM", {}, ["logits"]),
    "BertSuiteForNextSentencePrediction": ("BertForNextSentencePrediction", {}, ["logits"]),
    "BertSuiteForSequenceClassification": ("BertForSequenceClassification", {"num_labels": 3}, ["logits"]),
    "BertSuiteForQuestionAnswering": ("BertForQuestionAnswering", {}, ["start_logits", "end_logits"]),
    "BertSuiteForMultipleChoice": ("BertForMultipleChoice", {}, ["logits"]),
    "BertSuiteForTokenClassification": ("BertForTokenClassification", {"num_labels": 5}, ["logits"]),
}
LIMIT = 1e-5  # fp32 parity with stock, and compiled / exported against eager; bf16 is reported only
LIMITED = ("fp32 padded", "fp32 full", "compile", "export")
SIZE = dict(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def batch(device, padded: bool, choices: int | None = None):
    import torch

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(24, 129, (8,), generator=g) if padded else torch.full((8,), 128)
    mask = (torch.arange(128)[None] < lengths[:, None]).long()
    ids = torch.randint(999, 30522, (8, 128), generator=g) * mask
    types = ((torch.arange(128)[None] >= lengths[:, None] // 2) & mask.bool()).long()
    out = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if choices:
        out = {k: v.view(4, 2, 128) for k, v in out.items()}
    return {k: v.to(device) for k, v in out.items()}


def max_diff(a, b, fields, mask):
    worst = 0.0
    for f in fields:
        x, y = getattr(a, f).float(), getattr(b, f).float()
        if x.shape[: mask.dim()] == mask.shape:
            x, y = x[mask.bool()], y[mask.bool()]
        worst = max(worst, (x - y).abs().max().item())
    return worst


def bf16_is_fast(device: str) -> bool:
    """bf16 on a GPU, or on a CPU that does it natively; elsewhere it is emulated at a small fraction of fp32's
    speed (benchmarks/RESULTS.md, "bf16 on every CPU"), and the bf16 rows are left out."""
    from bert_suite.precision import native_bf16_flag

    return device != "cpu" or native_bf16_flag() is not None


def sdpa_kernels(model, inputs) -> str:
    """The attention kernels of a forward pass, under bf16 autocast where bf16 is fast (flash attention takes
    half precision only)."""
    import torch

    device = next(model.parameters()).device.type
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=bf16_is_fast(device)), \
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                                             torch.profiler.ProfilerActivity.CPU]) as prof:
        model(**inputs)
    names = {e.key for e in prof.key_averages()}
    hits = sorted(n for n in names if any(w in n.lower() for w in ("flash", "efficient_attention", "fmha",
                                                                   "cudnn", "scaled_dot_product")))
    return "; ".join(hits[:3]) or "none"


def check(name, device, tmp, quick: bool = False) -> dict:
    import torch
    import transformers

    import bert_suite

    stock_name, extra, fields = HEADS[name]
    torch.manual_seed(0)
    stock = getattr(transformers, stock_name)(transformers.BertConfig(**SIZE, **extra, attn_implementation="sdpa"))
    stock.save_pretrained(tmp / name)
    ours = getattr(bert_suite, name).from_pretrained(tmp / name).to(device).eval()
    stock = stock.to(device).eval()
    choices = 2 if "MultipleChoice" in name else None
    row = {"head": name.removeprefix("BertSuite")}
    for padded in (True, False):
        inputs = batch(device, padded, choices)
        mask = inputs["attention_mask"]
        tag = "padded" if padded else "full"
        with torch.no_grad():
            row[f"fp32 {tag}"] = max_diff(ours(**inputs), stock(**inputs), fields, mask)
            if bf16_is_fast(device):
                with torch.autocast(device, dtype=torch.bfloat16):
                    row[f"bf16 {tag}"] = max_diff(ours(**inputs), stock(**inputs), fields, mask)
        row[f"kernels {tag}"] = sdpa_kernels(ours, inputs)
    # what the pre-training pipeline sends a batch without padding: no mask at all (flash / cuDNN may run)
    row["kernels no mask"] = sdpa_kernels(ours, {k: v for k, v in batch(device, False, choices).items()
                                                  if k != "attention_mask"})
    if quick:
        return row
    inputs = batch(device, True, choices)
    with torch.no_grad():
        eager = ours(**inputs, **({"unpad": False} if name == "BertSuiteModel" else {}))
        torch._dynamo.reset()
        compiled = torch.compile(ours, fullgraph=True)(**inputs)
        row["compile"] = max_diff(compiled, eager, fields, inputs["attention_mask"])
        program = torch.export.export(ours, (), inputs)
        row["export"] = max_diff(program.module()(**inputs), eager, fields, inputs["attention_mask"])
    return row


def main(argv=None) -> dict:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="two heads, no compile/export (a test's run on the CPU)")
    p.add_argument("--out", type=Path, help="result JSON (default runs/bench/gpu_correctness.json)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        common.skip("no CUDA device (this check is for a GPU machine)")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 parity means fp32 matmuls
    torch.backends.cudnn.allow_tf32 = False
    heads = list(HEADS)[:2] if args.quick else list(HEADS)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [check(name, args.device, Path(tmp), args.quick) for name in heads]
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else None
    payload = {"machine": common.machine(), "gpu": gpu, "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    else:
        common.write_result("gpu_correctness", payload)
    print(json.dumps(payload["machine"]), payload["gpu"])
    print(common.table(rows, [("head", "head"), ("fp32 padded", "fp32 padded"), ("fp32 full", "fp32 full"),
                              ("bf16 padded", "bf16 padded"), ("bf16 full", "bf16 full"), ("compile", "compile"),
                              ("export", "export")]))
    for r in rows:
        print(f"{r['head']}: padded -> {r['kernels padded']} | full -> {r['kernels full']} | "
              f"no mask -> {r['kernels no mask']}")
    failed = [f"{r['head']} {k} {r[k]:.2e}" for r in rows for k in LIMITED if k in r and r[k] > LIMIT]
    if failed:
        raise SystemExit("over the 1e-5 limit: " + "; ".join(failed))
    return payload


if __name__ == "__main__":
    main()
