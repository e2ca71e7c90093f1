"""An objective schedule in pre-training: left-to-right (next token, no NSP) first, then MLM + NSP in the same run
(the biphasic schedule of Gisserot-Boukhlef et al., 2025), switched at a step or a share of the steps, resumable
inside either phase and across the switch; and `init_from` a causal checkpoint continued with MLM."""

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from bert_suite.pretraining.config import PretrainConfigError, load_pretrain_config
from helpers import fresh_state, load_recipe, recipe_args


def schedule(setup, out, *extra):
    return recipe_args(setup, out, "max_steps=12", "phase1_fraction=1", "train_data_phase2=null", "save_steps=2",
                       "warmup_steps=2", "causal_steps=6", "eval_steps=3", "eval_fraction=0.1", *extra)


def test_the_objective_switches_at_the_named_step_and_the_record_says_so(pretrain_setup, tmp_path):
    recipe = load_recipe()
    fresh_state()
    out = tmp_path / "run"
    history = recipe.main(schedule(pretrain_setup, out))
    assert [h["objective"] for h in history] == ["causal"] * 6 + ["mlm_nsp"] * 6
    causal, masked = history[:6], history[6:]
    assert all("nsp_loss" not in h for h in causal) and all("nsp_loss" in h for h in masked)
    # next-token targets: every real position but the last is labelled; MLM: a few masked ones. The held-out
    # evaluation follows the objective: next-token accuracy without NSP at step 6, MLM and NSP at step 12
    evals = {h["step"]: h for h in history if "eval_mlm_accuracy" in h}
    assert set(evals) == {3, 6, 9, 12}
    assert "eval_nsp_accuracy" not in evals[6] and "eval_nsp_accuracy" in evals[12]
    assert evals[6]["eval_frequent_token_accuracy"] != evals[12]["eval_frequent_token_accuracy"]
    results = json.loads((out / "pretrain_results.json").read_text())
    assert results["objectives"] == [{"objective": "causal", "from_step": 1, "to_step": 6},
                                     {"objective": "mlm_nsp", "from_step": 7, "to_step": 12}]
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["causal_attention"] is False and config["use_nsp"] is True  # the objective after the switch
    from bert_suite.hub import pretraining_card

    card = pretraining_card("me/biphasic", results)
    assert "## Objective schedule" in card and "| causal | 1 to 6 |" in card and "| mlm_nsp | 7 to 12 |" in card
    fraction = load_pretrain_config(None, schedule(pretrain_setup, out, "causal_steps=null", "causal_fraction=0.25"))
    assert [fraction.objective_at(step) for step in range(12)] == ["causal"] * 3 + ["mlm_nsp"] * 9


def killed_at(recipe, args, whole, killed, monkeypatch, die_at):
    """The run of `args` in `killed`, killed while making step die_at + 1's batch, then resumed."""
    from bert_suite.pretraining import loader

    real = loader.step_masks

    def dies(collator, batch, seed, step, first, causal=False):
        if step == die_at:
            raise KeyboardInterrupt
        return real(collator, batch, seed, step, first, causal)

    again = [a.replace(str(whole), str(killed)) for a in args]
    monkeypatch.setattr(loader, "step_masks", dies)
    fresh_state()
    with pytest.raises(KeyboardInterrupt):
        recipe.main(again)
    monkeypatch.setattr(loader, "step_masks", real)
    fresh_state()
    return recipe.main(again)


@pytest.fixture(scope="module")
def uninterrupted(pretrain_setup, tmp_path_factory):
    """The schedule's run, whole: (its arguments, its history, its folder)."""
    whole = tmp_path_factory.mktemp("schedule") / "whole"
    args = schedule(pretrain_setup, whole, "eval_fraction=0")
    fresh_state()
    return args, load_recipe().main(args), whole


# killed in the causal phase (resumed from step 4, across the switch) and in the masked phase (from step 8): the
# same weights as the uninterrupted run
@pytest.mark.parametrize("die_at", [4, 9])
def test_a_run_killed_in_either_phase_or_at_the_switch_resumes_to_the_same_weights(uninterrupted, tmp_path,
                                                                                    monkeypatch, die_at):
    args, history, whole = uninterrupted
    resumed = killed_at(load_recipe(), args, whole, tmp_path / "killed", monkeypatch, die_at)
    assert [h["step"] for h in resumed] == list(range(die_at // 2 * 2 + 1, 13))
    for a, b in zip(history[-len(resumed):], resumed, strict=True):
        assert a["objective"] == b["objective"] and a["mlm_loss"] == pytest.approx(b["mlm_loss"], rel=1e-6, abs=1e-7)
    first, second = (load_file(str(run / "final" / "model.safetensors")) for run in (whole, tmp_path / "killed"))
    assert first.keys() == second.keys()
    assert all(torch.allclose(first[k], second[k], atol=1e-6) for k in first)


def test_a_causal_checkpoint_continues_with_mlm_and_nsp(pretrain_setup, tmp_path):
    recipe = load_recipe()
    fresh_state()
    recipe.main(recipe_args(pretrain_setup, tmp_path / "ltr", "max_steps=4", "phase1_fraction=1",
                            "train_data_phase2=null", "use_nsp=false", "causal_attention=true"))
    ltr = json.loads((tmp_path / "ltr" / "final" / "config.json").read_text())
    assert ltr["causal_attention"] is True and ltr["use_nsp"] is False
    fresh_state()
    history = recipe.main(recipe_args(pretrain_setup, tmp_path / "mlm", "max_steps=4", "phase1_fraction=1",
                                      "train_data_phase2=null", f"init_from={tmp_path / 'ltr' / 'final'}"))
    assert {h["objective"] for h in history} == {"mlm_nsp"} and "nsp_loss" in history[-1]
    config = json.loads((tmp_path / "mlm" / "final" / "config.json").read_text())
    assert config["causal_attention"] is False and config["use_nsp"] is True
    start = load_file(str(tmp_path / "ltr" / "final" / "model.safetensors"))
    assert "cls.seq_relationship.weight" not in start  # the NSP head is new; the encoder is the causal model's


def test_a_biphasic_run_started_from_the_left_to_right_runs_checkpoint_at_the_switch_ends_as_one_trained_whole(
        pretrain_setup, tmp_path):
    """Table 5's reuse: the biphasic run's first steps are the left-to-right run's (its weights are drawn alike,
    its NSP head from a generator of its own, and that head has no gradient before the switch), so starting from
    that run's checkpoint at the switch gives the same weights as training them again, dropout on; the
    checkpoint is kept past the rotation, and the record and the log say where the run started."""
    recipe = load_recipe()
    quiet = ("eval_fraction=0",)  # dropout on: its random state is restored with the checkpoint
    fresh_state()
    whole = recipe.main(schedule(pretrain_setup, tmp_path / "whole", *quiet))
    fresh_state()
    recipe.main(schedule(pretrain_setup, tmp_path / "ltr", *quiet, "causal_steps=null", "use_nsp=false",
                         "causal_attention=true", "keep_checkpoints=6"))
    kept = sorted(p.name for p in (tmp_path / "ltr" / "checkpoints").iterdir())
    assert kept == ["step-10", "step-6", "step-8"]  # the two newest, and step 6 kept for the other run
    fresh_state()
    start = tmp_path / "ltr" / "checkpoints" / "step-6"
    second = recipe.main(schedule(pretrain_setup, tmp_path / "bi", *quiet, f"start_from_checkpoint={start}"))
    assert [h["step"] for h in second] == list(range(7, 13)) and {h["objective"] for h in second} == {"mlm_nsp"}
    for a, b in zip(whole[6:], second, strict=True):
        assert a["mlm_loss"] == pytest.approx(b["mlm_loss"], rel=1e-6, abs=1e-7)
    first, reused = (load_file(str(tmp_path / run / "final" / "model.safetensors")) for run in ("whole", "bi"))
    assert first.keys() == reused.keys() and "cls.seq_relationship.weight" in reused
    assert all(torch.allclose(first[k], reused[k], atol=1e-6) for k in first)
    results = json.loads((tmp_path / "bi" / "pretrain_results.json").read_text())
    assert results["started_from"] == {"checkpoint": str(start), "step": 6}
    log = [json.loads(line) for line in (tmp_path / "bi" / "metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in log] == list(range(1, 13))  # the left-to-right run's steps 1-6 are this run's
    assert [h["objective"] for h in log[:6]] == ["causal"] * 6


def test_a_start_from_a_checkpoint_of_another_model_is_an_error_naming_the_parameter(pretrain_setup, tmp_path):
    recipe = load_recipe()
    fresh_state()
    recipe.main(recipe_args(pretrain_setup, tmp_path / "mini", "max_steps=2", "save_steps=1", "model_size=mini",
                            "phase1_fraction=1", "train_data_phase2=null"))
    fresh_state()
    with pytest.raises(SystemExit, match=r"start_from_checkpoint .*step-1: "):
        recipe.main(recipe_args(pretrain_setup, tmp_path / "tiny", "max_steps=2", "phase1_fraction=1",
                                "train_data_phase2=null", f"start_from_checkpoint={tmp_path / 'mini/checkpoints/step-1'}"))


@pytest.mark.parametrize("keys, message", [
    (["causal_steps=3", "causal_fraction=0.5"], "causal_steps and causal_fraction are both set"),
    (["causal_steps=10"], "causal_steps must be a step from 1 to 9"),
    (["causal_fraction=1.0"], "causal_fraction must be in [0, 1)"),
    (["causal_fraction=0.999"], "causal_fraction leaves no step for the masked phase"),
    (["causal_steps=3", "causal_attention=true", "use_nsp=false"], "causal_attention is true, so every step"),
    (["causal_attention=true"], "use_nsp must be false with causal_attention"),  # a causal phase with NSP
])
def test_a_schedule_that_makes_no_sense_stops_with_one_line_naming_the_key(keys, message):
    with pytest.raises(PretrainConfigError, match=re.escape(message)):
        load_pretrain_config(None, ["train_data=d", "tokenizer=t", "max_steps=10", "warmup_steps=0",
                                    "phase1_fraction=1", *keys])
