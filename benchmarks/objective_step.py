"""The CPU pre-training step of each objective, as the recipe runs it there: forward at the labelled positions
(`masked_positions_only`), backward, AdamW, and the logged statistics (`batch_stats`). Random tokens, a tiny
model and an 8,192-piece vocabulary as in the Table 5 miniature (batch 64 x 128, lengths 60-128); the
left-to-right objective predicts every real token, the masked one about 15.6% of them (with NSP).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/objective_step.py
    # an earlier revision, in turn with this one:
    git worktree add /tmp/before REV && OMP_NUM_THREADS=1 PYTHONPATH=/tmp/before/src .venv/bin/python benchmarks/objective_step.py

Prints seconds a step (the mean of --steps after one warm-up step) and the losses, which two revisions that
compute the same thing print alike. It does not compare with stock transformers (benchmarks/pretrain_step.py
does): it measures what a change to our own step costs or saves."""

from __future__ import annotations

import argparse
import json
import time

import torch


def step_time(objective: str, steps: int, vocab_size: int, batch: int, length: int) -> dict:
    from bert_suite import BertSuiteConfig, BertSuiteForPreTraining
    from bert_suite.pretraining.step import batch_stats

    causal = objective == "causal"
    config = BertSuiteConfig.from_preset("tiny", vocab_size=vocab_size, use_nsp=not causal, causal_attention=causal,
                                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = BertSuiteForPreTraining(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab_size, (batch, length), generator=g)
    real = torch.arange(length)[None] < torch.randint(length // 2, length + 1, (batch, 1), generator=g)
    extra = {}
    if causal:  # the next token at every real position
        labels = torch.where(real, torch.roll(ids, -1, 1), -100)
        labels[:, -1] = -100
    else:
        labels = torch.where(real & (torch.rand(batch, length, generator=g) < 0.156), ids, -100)
        extra["next_sentence_label"] = torch.randint(0, 2, (batch,), generator=g)
    inputs = dict(input_ids=ids, attention_mask=real.long(), token_type_ids=torch.zeros_like(ids), labels=labels,
                  **extra)
    count = (labels != -100).sum()

    def one_step() -> float:
        out = model(**inputs, return_dict=True, num_items_in_batch=count, masked_positions_only=True)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        batch_stats(out, inputs)
        return float(out.loss.detach())

    one_step()
    started = time.perf_counter()
    losses = [one_step() for _ in range(steps)]
    return {"objective": objective, "seconds_a_step": (time.perf_counter() - started) / steps,
            "positions": int(count), "losses": [round(x, 5) for x in losses]}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objectives", nargs="+", default=["causal", "mlm_nsp"], choices=["causal", "mlm_nsp"])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--vocab_size", type=int, default=8192)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--seq_len", type=int, default=128)
    args = p.parse_args(argv)
    import bert_suite

    rows = [step_time(o, args.steps, args.vocab_size, args.batch_size, args.seq_len) for o in args.objectives]
    print(json.dumps({"bert_suite": bert_suite.__file__, "threads": torch.get_num_threads(), "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
