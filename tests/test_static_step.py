"""The static pre-training step (bert_suite/pretraining/step.py): the batch form the collator makes, one
compiled graph for every batch, no host sync, the same loss as the eager CPU path, the CUDA-graph body's
bookkeeping (run on the CPU without a graph), and the recipe's switches."""

import copy
import json

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from bert_suite import BertSuiteConfig, BertSuiteForPreTraining
from bert_suite.pretraining.config import PretrainConfigError, load_pretrain_config
from bert_suite.pretraining.masking import MaskingCollator
from bert_suite.pretraining.step import (
    HostSyncError,
    PretrainingStep,
    batch_stats,
    compile_regions,
    keep_autocast_outputs,
    no_host_sync,
)
from helpers import fresh_state, load_recipe, recipe_args

VOCAB = 300


class _Tokenizer:
    """The few things MaskingCollator reads from a tokenizer."""

    pad_token_id, cls_token_id, sep_token_id, mask_token_id = 0, 1, 2, 3
    all_special_ids = [0, 1, 2, 3]

    def get_vocab(self):
        return {f"t{i}": i for i in range(VOCAB)}


def masked_batches(count: int, seed: int = 0, batch: int = 8, length: int = 24, pad: bool = True):
    """`count` padded and masked batches of different lengths (the collator's dynamic form), each with the
    masks the recipe draws (keyed by step), the longest batch reaching `length` or not."""
    collator = MaskingCollator(_Tokenizer(), max_predictions_per_seq=4)
    g = torch.Generator().manual_seed(seed)
    out = []
    for number in range(count):
        lengths = torch.randint(8, length + 1, (batch,), generator=g) if pad else torch.full((batch,), length)
        if number % 2:
            lengths[0] = length - number  # the longest row shorter than the static length
        features = [{"input_ids": [1, *torch.randint(4, VOCAB, (int(n) - 2,), generator=g).tolist(), 2],
                     "token_type_ids": [0] * (int(n) // 2) + [1] * (int(n) - int(n) // 2),
                     "next_sentence_label": int(torch.randint(0, 2, (), generator=g))} for n in lengths]
        from bert_suite.pretraining.masking import example_keys

        padded = collator.pad(features)
        out.append(collator.mask(padded, keys=example_keys(seed, number, torch.arange(batch))))
    return collator, out


def tiny_model(dropout: float = 0.0) -> BertSuiteForPreTraining:
    torch.manual_seed(0)
    return BertSuiteForPreTraining(BertSuiteConfig.from_preset(
        "tiny", vocab_size=VOCAB, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)).train()


# ------------------------------------------------------------------------------- the batch form


def test_static_form_pads_lists_the_masked_positions_and_drops_a_mask_without_padding():
    collator, (batch,) = masked_batches(1)
    static = collator.static(batch, 32, 4)
    assert static["input_ids"].shape == (8, 32) and static["masked_positions"].shape == (8, 4)
    for row in range(8):
        chosen = (batch["labels"][row] != -100).nonzero().squeeze(1)
        n = len(chosen)
        assert 1 <= n <= 4
        assert static["masked_positions"][row, :n].tolist() == chosen.tolist()  # in order, then unused
        assert static["labels"][row, :n].tolist() == batch["labels"][row, chosen].tolist()
        assert static["labels"][row, n:].tolist() == [-100] * (4 - n)
        assert static["masked_positions"][row, n:].tolist() == [0] * (4 - n)
    assert static["attention_mask"][:, 24:].sum() == 0 and static["input_ids"][:, 24:].eq(0).all()
    _, (full,) = masked_batches(1, pad=False, length=16)
    assert "attention_mask" not in collator.static(full, 16, 4)  # no padding: no mask, flash attention may run
    assert "attention_mask" in collator.static(full, 20, 4)  # padded up to the static length: a mask
    with pytest.raises(ValueError, match=r"row \d+ of the batch has \d masked positions, more than "
                                         r"max_predictions_per_seq \(2\)"):
        collator.static(batch, 32, 2)
    causal = collator.static({**batch}, 32, None)  # left-to-right: labels at every position
    assert causal["labels"].shape == (8, 32) and "masked_positions" not in causal


def test_masked_positions_give_the_loss_and_logits_of_the_labelled_positions():
    model = tiny_model()
    collator, (batch,) = masked_batches(1)
    static = collator.static(batch, 24, 4)
    with torch.no_grad():
        dynamic = model(**batch, masked_positions_only=True)
        fixed = model(**static, unpad=False)
    used = static["labels"] != -100
    assert fixed.prediction_logits.shape == (8, 4, VOCAB)
    torch.testing.assert_close(fixed.prediction_logits[used], dynamic.prediction_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fixed.loss, dynamic.loss, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="the same shape"):
        model(**{**static, "labels": batch["labels"]}, unpad=False)


# --------------------------------------------------------------------------- compile and syncs


def test_the_step_compiles_once_as_one_graph_for_every_batch():
    """fullgraph: no graph break anywhere in forward (embeddings, encoder, heads, loss); five batches with
    different masks and lengths, all padded to one static length: one compilation, never another."""
    model = tiny_model(dropout=0.1)
    collator, batches = masked_batches(5)
    counter = CompileCounter()
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    for batch in batches:
        out = compiled(**collator.static(batch, 24, 4), unpad=False, num_items_in_batch=torch.tensor(20.0))
        out.loss.backward()
    assert counter.frame_count == 1

    # the recipe's regions: the embeddings, one graph for every encoder layer, the heads with the loss
    model = tiny_model(dropout=0.1)
    counter = CompileCounter()
    compile_regions(model, backend=counter)
    for number, batch in enumerate(batches):
        out = model(**collator.static(batch, 24, 4), unpad=False, num_items_in_batch=torch.tensor(20.0))
        out.loss.backward()
        if number == 0:
            first = counter.frame_count
    assert first == 3 and counter.frame_count == 3


def test_the_static_step_makes_no_host_sync_and_the_check_can_fail():
    from accelerate import Accelerator

    fresh_state()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = tiny_model(dropout=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    collator, batches = masked_batches(6)
    static = [collator.static(b, 24, 4) for b in batches]
    step = PretrainingStep(accelerator, model, optimizer, 1.0, static=True)
    with no_host_sync():  # forward, backward, clipping, AdamW and the statistics, three steps of two micro-batches
        for first in (0, 2, 4):
            step(static[first:first + 2], torch.tensor(10.0))
        totals = step.take_totals()
    assert int(totals["mlm_count"]) == sum(int((b["labels"] != -100).sum()) for b in batches)
    assert torch.isfinite(step.grad_norm)
    eager = PretrainingStep(accelerator, model, optimizer, 1.0, static=False)
    with pytest.raises(HostSyncError, match="_local_scalar_dense|nonzero"), no_host_sync():
        eager(batches[:2], torch.tensor(10.0))  # the CPU path reads the mask (to drop padding): the check sees it
    with pytest.raises(HostSyncError, match="index"), no_host_sync():
        x = torch.arange(4.0)
        x[x > 1]  # boolean indexing: an output shape that depends on values


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_the_compiled_static_loss_equals_the_eager_paths_in_fp32(backend):
    model = tiny_model()
    collator, batches = masked_batches(3)
    compiled = copy.deepcopy(model)
    compile_regions(compiled, backend=backend)
    for batch in batches:
        eager = model(**batch, masked_positions_only=True)  # the CPU path: unpadded, boolean indexing
        static = compiled(**collator.static(batch, 24, 4), unpad=False)
        assert abs(float(static.loss.detach()) - float(eager.loss.detach())) < 1e-5
        stats = batch_stats(static, collator.static(batch, 24, 4))
        assert abs(float(stats["mlm_loss"] / stats["mlm_count"]) - float(eager.loss) + float(
            torch.nn.functional.cross_entropy(eager.seq_relationship_logits, batch["next_sentence_label"]))) < 1e-5


def test_the_graph_body_trains_as_the_eager_step_with_accumulation():
    """The CUDA-graph step's body, run on the CPU over its static buffers, with dropout, a learning-rate
    schedule and two batch structures (a step whose micro-batches have no padding has no attention mask: a
    second capture): its bookkeeping (gradients zeroed in the body, the optimizer's state made by a zero-rate
    step, the divisions by the micro-batches, the random state put back after the warm-up, the learning rate
    and norm buffers shared by both captures, the statistics' totals) gives the eager step's weights and
    statistics after four steps."""
    from accelerate import Accelerator
    from transformers import get_linear_schedule_with_warmup

    collator, batches = masked_batches(6)
    _, full = masked_batches(2, seed=1, pad=False)
    static = [collator.static(b, 24, 4) for b in [*batches, *full]]
    assert "attention_mask" not in static[6] and "attention_mask" in static[0]
    results = []
    for graph in (False, True):
        fresh_state()
        torch.manual_seed(5)
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
        model = tiny_model(dropout=0.1)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)
        model, optimizer = accelerator.prepare(model, optimizer)
        scheduler = get_linear_schedule_with_warmup(optimizer.optimizer, 1, 10)  # torch's, as the recipe's
        step = PretrainingStep(accelerator, model, optimizer, 0.5, static=True, graph=graph)
        for first in (0, 6, 2, 4):  # the unpadded structure second
            step(static[first:first + 2], torch.tensor(10.0))
            scheduler.step()
            if graph and first == 0:
                lr, norm = optimizer.optimizer.param_groups[0]["lr"], step.grad_norm
        results.append((copy.deepcopy(model.state_dict()), step.take_totals(), float(step.grad_norm)))
    assert len(step.captured) == 2  # one per structure, sharing the learning rate and the norm's buffer
    assert optimizer.optimizer.param_groups[0]["lr"] is lr and step.grad_norm is norm
    assert float(lr) == pytest.approx(scheduler.get_last_lr()[0])  # filled in place by the scheduler
    (eager_weights, eager_totals, eager_norm), (graph_weights, graph_totals, graph_norm) = results
    for name, value in eager_weights.items():
        torch.testing.assert_close(graph_weights[name], value, atol=1e-6, rtol=1e-5, msg=name)
    assert set(graph_totals) == set(eager_totals)
    for key, value in eager_totals.items():
        torch.testing.assert_close(graph_totals[key].double(), value.double(), atol=1e-4, rtol=1e-5)
    assert graph_norm == pytest.approx(eager_norm, rel=1e-5)
    with pytest.raises(ValueError, match="static batches and one process"):
        PretrainingStep(accelerator, model, optimizer, 1.0, static=False, graph=True)


def test_the_graph_step_leaves_the_parameters_its_loss_does_not_reach_as_the_eager_step_does():
    """With NSP off at call time (a biphasic run's left-to-right steps) the loss reaches neither the NSP head nor
    the pooler: an eager step leaves them without a gradient, so weight decay does not touch them; the graph
    step (which must keep a gradient buffer for them) leaves them out of its optimizer step, so both give the
    same weights."""
    from accelerate import Accelerator

    collator, batches = masked_batches(3)
    static = [{k: v for k, v in collator.static(b, 24, 4).items() if k != "next_sentence_label"} for b in batches]
    weights = []
    for graph in (False, True):
        fresh_state()
        accelerator = Accelerator(cpu=True)
        model = accelerator.prepare(tiny_model())
        model.config.use_nsp = False
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, fused=True)
        step = PretrainingStep(accelerator, model, optimizer, 1.0, static=True, graph=graph)
        for batch in static:
            step([batch], torch.tensor(10.0))
        weights.append(copy.deepcopy(model.state_dict()))
    untouched = tiny_model().state_dict()
    for name in ("cls.seq_relationship.weight", "bert.pooler.dense.weight"):
        assert torch.equal(weights[1][name], untouched[name]), name  # no decay without a gradient
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, atol=1e-6, rtol=1e-5, msg=name)


def test_before_a_capture_the_parameters_a_loaded_optimizer_lacks_get_their_state_and_the_rest_keep_theirs():
    """A run started from another run's checkpoint (a biphasic run from a left-to-right one) has an optimizer
    state without the NSP head: the capture's preparation makes the head's state (on a GPU, a state made inside
    the capture fails it) and leaves every loaded state as it was."""
    from accelerate import Accelerator

    from bert_suite.pretraining.step import _Captured

    collator, batches = masked_batches(2)
    static = [collator.static(b, 24, 4) for b in batches]
    fresh_state()
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(tiny_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    PretrainingStep(accelerator, model, optimizer, 1.0, static=True)(static[:1], torch.tensor(10.0))  # eager
    head = [p for n, p in model.named_parameters() if n.startswith("cls.seq_relationship")]
    for p in head:  # as loaded from a checkpoint of a model without it
        optimizer.state.pop(p)
    loaded = {p: copy.deepcopy(s) for p, s in optimizer.state.items()}
    stepper = PretrainingStep(accelerator, model, optimizer, 1.0, static=True, graph=True)
    _Captured(stepper, static[1:], torch.tensor(10.0))  # on the CPU: the preparation alone
    assert all(float(optimizer.state[p]["step"]) == 0 and not optimizer.state[p]["exp_avg"].any() for p in head)
    for p, before in loaded.items():
        assert float(optimizer.state[p]["step"]) == float(before["step"]) == 1
        assert torch.equal(optimizer.state[p]["exp_avg"], before["exp_avg"])


def test_the_step_form_resolves_auto_per_device_and_refuses_what_cannot_run():
    from bert_suite.pretraining.step import step_form

    assert step_form("auto", "auto", "auto", "cpu", 1, "no") == (False, False, False)
    assert step_form("auto", "auto", "auto", "cuda", 1, "bf16") == (True, True, True)
    assert step_form("auto", "auto", "auto", "cuda", 8, "bf16") == (True, True, False)  # DDP: no graph
    assert step_form("auto", "auto", "auto", "cuda", 1, "fp16") == (True, True, False)  # loss scaling: no graph
    assert step_form(False, "auto", "auto", "cuda", 1, "bf16") == (False, False, False)  # static off: auto forms off
    assert step_form("auto", True, "auto", "cpu", 1, "no") == (True, True, False)  # compiling needs static shapes
    for args in ((True, "cpu", 1, "no"), (True, "cuda", 2, "bf16"), (True, "cuda", 1, "fp16")):
        with pytest.raises(ValueError, match="cuda_graph=true needs one process on a CUDA device without fp16"):
            step_form("auto", "auto", *args)


def test_bf16_outputs_keep_autocast_without_the_fp32_copy():
    from accelerate import Accelerator

    fresh_state()
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = accelerator.prepare(tiny_model())
    collator, (batch,) = masked_batches(1)
    static = collator.static(batch, 24, 4)
    assert model(**static, unpad=False).prediction_logits.dtype == torch.float32  # accelerate's copy
    assert keep_autocast_outputs(model)
    out = model(**static, unpad=False)
    assert out.prediction_logits.dtype == torch.bfloat16 and out.loss.dtype == torch.float32  # still autocast
    assert not keep_autocast_outputs(tiny_model())  # nothing to undo on a model accelerate did not wrap


# -------------------------------------------------------------------------------------- recipe


def test_recipe_switches_are_checked():
    base = ["train_data=d", "tokenizer=t", "phase1_fraction=1"]
    cfg = load_pretrain_config(None, base)
    assert (cfg.static_shapes, cfg.torch_compile, cfg.cuda_graph) == ("auto", "auto", "auto")
    assert load_pretrain_config(None, [*base, "torch_compile=false"]).torch_compile is False
    with pytest.raises(PretrainConfigError, match="torch_compile must be auto, true or false"):
        load_pretrain_config(None, [*base, "torch_compile=sometimes"])
    with pytest.raises(PretrainConfigError, match="static_shapes must be true or auto with cuda_graph=true"):
        load_pretrain_config(None, [*base, "cuda_graph=true", "static_shapes=false"])
    assert load_pretrain_config(None, base).dataloader_num_workers == "auto"
    assert load_pretrain_config(None, [*base, "dataloader_num_workers=3"]).dataloader_num_workers == 3
    with pytest.raises(PretrainConfigError, match="dataloader_num_workers must be auto or a number"):
        load_pretrain_config(None, [*base, "dataloader_num_workers=many"])
    assert (cfg.mask_in_step, cfg.bf16_residual) == ("auto", False)  # the bf16 residual costs loss: opt-in
    assert load_pretrain_config(None, [*base, "bf16_residual=auto"]).bf16_residual == "auto"
    for key in ("mask_in_step", "bf16_residual"):
        with pytest.raises(PretrainConfigError, match=f"{key} must be auto, true or false"):
            load_pretrain_config(None, [*base, f"{key}=sometimes"])


def test_recipe_static_step_on_the_cpu_trains_as_the_eager_one(pretrain_setup, tmp_path):
    """static_shapes=true on the CPU (fp32, no dropout), with its batches made in the main process or by two
    worker processes: the losses of the eager path, step for step; and cuda_graph=true without a GPU is
    refused with one line."""
    recipe = load_recipe()
    runs = {}
    for static, workers in (("false", 0), ("true", 0), ("true", 2)):
        fresh_state()
        runs[static, workers] = recipe.main(recipe_args(
            pretrain_setup, tmp_path / f"{static}-{workers}", "max_steps=8", "phase1_fraction=0.75",
            "save_steps=1000", "mixed_precision=no", "hidden_dropout_prob=0", "attention_probs_dropout_prob=0",
            "eval_steps=8", f"static_shapes={static}", "torch_compile=false", "gradient_accumulation_steps=2",
            f"dataloader_num_workers={workers}"))
    eager = runs["false", 0]
    for other in (runs["true", 0], runs["true", 2]):  # batches made in worker processes: the same masks
        for a, b in zip(eager, other, strict=True):
            assert a["mlm_loss"] == pytest.approx(b["mlm_loss"], rel=1e-4, abs=1e-5)
            assert a["nsp_loss"] == pytest.approx(b["nsp_loss"], rel=1e-4, abs=1e-5)
        assert other[-1]["eval_mlm_accuracy"] == pytest.approx(eager[-1]["eval_mlm_accuracy"], abs=1e-6)
    assert json.loads((tmp_path / "true-2" / "pretrain_results.json").read_text())["step_form"] == {
        "static_shapes": True, "torch_compile": False, "cuda_graph": False}
    fresh_state()
    with pytest.raises(SystemExit, match="cuda_graph=true needs one process on a CUDA device"):
        recipe.main(recipe_args(pretrain_setup, tmp_path / "graph", "max_steps=2", "cuda_graph=true"))


def test_offline_masks_beyond_the_static_cap_are_refused_before_training(pretrain_setup, tmp_path):
    """Instances masked by `pretrain-data --static_masking` carry their labels; the static form holds at most
    max_predictions_per_seq of them a row, so more is one line naming the data and the key, before a step."""
    from bert_suite.pretraining.instances import build_pretraining_dataset
    from bert_suite.pretraining.loader import most_labels

    build_pretraining_dataset([str(pretrain_setup / "corpus.txt")], str(pretrain_setup / "vocab.txt"),
                              str(tmp_path / "masked"), max_seq_length=32, static_masking=True,
                              max_predictions_per_seq=5, fmt="lines")
    import datasets

    data = datasets.load_from_disk(str(tmp_path / "masked"))
    counts = [sum(label != -100 for label in row) for row in data["labels"]]
    assert most_labels(data) == max(counts) and 1 <= max(counts) <= 5
    assert most_labels(data.select_columns(["input_ids"])) == 0  # dynamic masks: nothing to check
    recipe = load_recipe()
    fresh_state()
    with pytest.raises(SystemExit, match=rf"train_data {tmp_path / 'masked'}: an instance has {max(counts)} masked "
                                         rf"positions, more than max_predictions_per_seq \(1\)"):
        recipe.main(recipe_args(pretrain_setup, tmp_path / "run", "max_steps=2", "static_shapes=true",
                                f"train_data={tmp_path / 'masked'}", "train_data_phase2=null", "phase1_fraction=1",
                                "max_predictions_per_seq=1"))


def test_a_schedule_over_a_device_learning_rate_is_saved_as_numbers():
    """The CUDA-graph step keeps the learning rate as a tensor that the scheduler fills in place; the
    checkpoint's progress.json holds the schedule's state as numbers, and it loads back."""
    from transformers import get_linear_schedule_with_warmup

    from bert_suite.pretraining.checkpoints import _number

    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.AdamW([weight], lr=torch.tensor(1e-3), foreach=False)
    scheduler = get_linear_schedule_with_warmup(optimizer, 2, 10)
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    with pytest.raises(TypeError):
        json.dumps(scheduler.state_dict())
    state = json.loads(json.dumps(scheduler.state_dict(), default=_number))
    again = get_linear_schedule_with_warmup(torch.optim.AdamW([weight], lr=1e-3), 2, 10)
    again.load_state_dict(state)
    again.step()
    scheduler.step()
    assert again.get_last_lr()[0] == pytest.approx(float(scheduler.get_last_lr()[0]))
