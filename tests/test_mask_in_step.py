"""Masks made inside the step (`mask_in_step`, issue 63): the ids-only loader (`IdsTable`, `IdsBatches`) and the
step's masker (`StepMasker`) give the loader's masked batches bit for bit, in every form (static and dynamic,
Table 8's mixes, caps, a left-to-right phase, a batch without padding, split data), read no tensor value on
the host, and a recipe run with them logs the same losses as one without."""

import json

import datasets
import numpy as np
import pytest
import torch

from bert_suite.pretraining.loader import IdsTable
from bert_suite.pretraining.masking import MaskingCollator, StepMasker
from bert_suite.pretraining.step import no_host_sync
from helpers import CLS, PAD, SEP, IdsTokenizer, fresh_state, ids_instances, load_recipe, mask_loaders, recipe_args


def same(made: dict, expected: dict) -> None:
    assert sorted(made) == sorted(expected)
    for key in expected:
        assert made[key].dtype == expected[key].dtype, key
        assert torch.equal(made[key], expected[key]), key


MIXES = [dict(), dict(mask_ratio=0.5, random_ratio=0.5), dict(mask_ratio=1.0, random_ratio=0.0),
         dict(mask_ratio=0.0, random_ratio=0.0), dict(mlm_probability=0.4)]


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("mix", range(len(MIXES)))
def test_the_steps_masks_are_the_loaders_bit_for_bit(static, mix):
    data = ids_instances(60, 40)
    collator = MaskingCollator(IdsTokenizer(), max_predictions_per_seq=6, **MIXES[mix])
    masked, shipped, masker = mask_loaders(data, collator, static)
    for micro, rows in ((0, [0, 5, 17, 33]), (3, [59, 1, 2, 40]), (11, [20, 21, 22, 58])):
        expected, counts = masked[micro, rows]
        ids, shipped_counts = shipped[micro, rows]
        assert "labels" not in ids and "token_type_ids" not in ids  # ids, lengths, segments, labels, the step
        same(masker(ids), expected)
        assert shipped_counts == counts  # masked positions, real and padded tokens: counted without the masks
        assert (expected["labels"] != -100).sum() > 0


def test_a_left_to_right_phase_split_data_and_full_rows_follow():
    collator = MaskingCollator(IdsTokenizer(), max_predictions_per_seq=6)
    split = ids_instances(60, 30).train_test_split(test_size=0.2, seed=1)["train"]  # read through its indices mapping
    assert split._indices is not None
    for data, causal, static in ((split, True, True), (split, True, False), (split, False, True),
                                 (ids_instances(30, 24, full=True), False, True), (ids_instances(30, 24, full=True), True, True)):
        masked, shipped, masker = mask_loaders(data, collator, static, causal=causal, first_step=500)
        for micro, rows in ((0, [0, 1, 2]), (7, [10, 3, 8])):
            expected, counts = masked[micro, rows]
            ids, shipped_counts = shipped[micro, rows]
            same(masker(ids), expected)
            assert shipped_counts == counts
    full, _ = shipped[0, [0, 1, 2]]
    assert "lengths" not in full and "attention_mask" not in masker(full)  # no padding: no mask (flash attention)


def test_the_masker_reads_nothing_on_the_host_and_whole_words_stay_in_the_loader():
    collator = MaskingCollator(IdsTokenizer(), max_predictions_per_seq=6)
    _, shipped, masker = mask_loaders(ids_instances(30, 32), collator, True)
    ids, _ = shipped[4, [3, 4, 5, 6]]
    masker(ids)  # the special ids and the pool are copied to the device once, before a capture
    with no_host_sync():
        masker(ids)
    with pytest.raises(ValueError, match="whole-word masking cannot be made inside the step"):
        StepMasker(MaskingCollator(IdsTokenizer(), whole_word_mask=True), 0, True, 6)


def test_segments_the_step_cannot_rebuild_are_refused_by_instance():
    data = datasets.Dataset.from_dict({"input_ids": [[CLS, 9, SEP, 8, SEP], [CLS, 9, 9, SEP, 8, SEP]],
                                       "token_type_ids": [[0, 0, 0, 1, 1], [0, 1, 0, 0, 1, 1]],
                                       "next_sentence_label": [0, 1]})
    with pytest.raises(ValueError, match="instance 1: token_type_ids are not 0 for the first segment"):
        IdsTable(data, PAD)


def test_a_batch_is_one_indexed_read_of_a_large_table(report):
    """The loader's cost per 128 x 128 batch: the ids-only read against the loader that pads and masks."""
    import time

    data = ids_instances(3000, 128, seed=3)
    collator = MaskingCollator(IdsTokenizer(), max_predictions_per_seq=20)
    masked, shipped, _ = mask_loaders(data, collator, True, accumulation=1, world=1, rank=0)
    rng = np.random.default_rng(0)
    keys = [(k, rng.choice(len(data), 128, replace=False).tolist()) for k in range(20)]
    took = {}
    for name, made in (("masked", masked), ("ids", shipped)):
        made[keys[0]]
        start = time.perf_counter()
        for key in keys:
            made[key]
        took[name] = (time.perf_counter() - start) / len(keys) * 1000
    report("loader per 128 x 128 batch (ms, one core)", f"ids only {took['ids']:.2f}, padded and masked "
                                                          f"{took['masked']:.2f}")
    assert took["ids"] < took["masked"]


def test_the_recipe_with_masks_made_in_the_step_logs_the_loaders_losses(pretrain_setup, tmp_path):
    """mask_in_step=true on the CPU (fp32, static shapes, no dropout, two micro-batches, both length phases,
    split data): the losses of mask_in_step=false, step for step, and the padded beside the real tokens/s."""
    recipe = load_recipe()
    runs = {}
    for in_step in ("false", "true"):
        fresh_state()
        runs[in_step] = recipe.main(recipe_args(
            pretrain_setup, tmp_path / in_step, "max_steps=6", "phase1_fraction=0.5", "save_steps=1000",
            "mixed_precision=no", "hidden_dropout_prob=0", "attention_probs_dropout_prob=0", "eval_steps=6",
            "static_shapes=true", "torch_compile=false", "gradient_accumulation_steps=2", f"mask_in_step={in_step}"))
    for a, b in zip(runs["false"], runs["true"], strict=True):
        assert (a["mlm_loss"], a["nsp_loss"], a["mlm_accuracy"]) == (b["mlm_loss"], b["nsp_loss"], b["mlm_accuracy"])
        assert b["padded_tokens_per_second"] >= b["tokens_per_second"] > 0
    assert runs["true"][-1]["eval_mlm_accuracy"] == runs["false"][-1]["eval_mlm_accuracy"]
    results = json.loads((tmp_path / "true" / "pretrain_results.json").read_text())
    assert results["mask_in_step_phases"] == [1, 2]
    assert json.loads((tmp_path / "false" / "pretrain_results.json").read_text())["mask_in_step_phases"] == []
    # the same run with two DataLoader workers shipping the ids, and resumed from its step-3 checkpoint: the masks
    # follow the step (a device counter the checkpoint restores), not the process that read the batch
    common = ["max_steps=6", "phase1_fraction=0.5", "save_steps=3", "mixed_precision=no", "hidden_dropout_prob=0",
              "attention_probs_dropout_prob=0", "eval_steps=6", "static_shapes=true", "torch_compile=false",
              "gradient_accumulation_steps=2", "mask_in_step=true", "dataloader_num_workers=2"]
    fresh_state()
    workers = recipe.main(recipe_args(pretrain_setup, tmp_path / "workers", *common))
    assert json.loads((tmp_path / "workers" / "pretrain_results.json").read_text())["mask_in_step_phases"] == [1, 2]
    fresh_state()
    resumed = recipe.main(recipe_args(pretrain_setup, tmp_path / "workers", *common,
                                      f"resume_from_checkpoint={tmp_path / 'workers' / 'checkpoints' / 'step-3'}"))
    assert [h["step"] for h in resumed] == [4, 5, 6]
    assert json.loads((tmp_path / "workers" / "pretrain_results.json").read_text())["mask_in_step_phases"] == [2]
    for a, b in zip(runs["false"], workers, strict=True):
        assert (a["mlm_loss"], a["nsp_loss"], a["mlm_accuracy"]) == (b["mlm_loss"], b["nsp_loss"], b["mlm_accuracy"])
    for a, b in zip(runs["false"][3:], resumed, strict=True):
        assert a["mlm_loss"] == pytest.approx(b["mlm_loss"], rel=1e-6, abs=1e-7) and a["mlm_accuracy"] == b["mlm_accuracy"]


def test_whole_word_masks_asked_in_the_step_stay_in_the_loader_with_one_line(pretrain_setup, tmp_path, capsys):
    """whole_word_mask=true with mask_in_step=true: one line says the loader makes them, and the run is the one with
    mask_in_step=false, loss for loss."""
    recipe = load_recipe()
    runs = {}
    for in_step in ("false", "true"):
        fresh_state()
        capsys.readouterr()
        runs[in_step] = recipe.main(recipe_args(
            pretrain_setup, tmp_path / in_step, "max_steps=3", "save_steps=1000", "mixed_precision=no",
            "static_shapes=true", "torch_compile=false", "whole_word_mask=true", f"mask_in_step={in_step}"))
        said = capsys.readouterr()
        line = "mask_in_step: whole-word masks rank words in a Python loop; they are made in the loader"
        assert (line in said.out + said.err) == (in_step == "true")
        assert json.loads((tmp_path / in_step / "pretrain_results.json").read_text())["mask_in_step_phases"] == []
    assert [(h["mlm_loss"], h["nsp_loss"]) for h in runs["true"]] == [(h["mlm_loss"], h["nsp_loss"]) for h in runs["false"]]


def test_a_large_table_is_written_once_and_memory_mapped_back(tmp_path):
    """IdsTable with a cache file: two bytes a token slot (a vocabulary under 65,536), the same batches as in
    memory, read back by a later run without a rebuild, and rebuilt for other data of the same shape."""
    data = ids_instances(60, 40)
    cache = tmp_path / "ids" / "phase1.npy"
    memory = IdsTable(data, PAD, vocab_size=200)
    written = IdsTable(data, PAD, vocab_size=200, cache=cache)
    assert written.ids.dtype == np.uint16 and isinstance(written.ids, np.memmap)
    stamp = cache.with_suffix(".json").read_text()
    again = IdsTable(data, PAD, vocab_size=200, cache=cache)
    assert cache.with_suffix(".json").read_text() == stamp and isinstance(again.ids, np.memmap)  # no rebuild
    rows = [3, 59, 0, 17]
    for table in (written, again):
        for key, value in memory.take(rows).items():
            assert np.array_equal(table.take(rows)[key], value), key
    other = ids_instances(60, 40, seed=9)
    rebuilt = IdsTable(other, PAD, vocab_size=200, cache=cache)
    assert np.array_equal(rebuilt.take(rows)["input_ids"], IdsTable(other, PAD).take(rows)["input_ids"])


def test_a_cache_missing_a_part_is_rebuilt_and_builders_leave_no_partial_file(tmp_path):
    import multiprocessing

    data = ids_instances(60, 40)
    cache = tmp_path / "ids" / "phase1.npy"
    context = multiprocessing.get_context("fork")
    builders = [context.Process(target=IdsTable, args=(data, PAD, 200, cache)) for _ in range(3)]
    for process in builders:  # several ranks at once: each writes its own file and moves it into place whole
        process.start()
    for process in builders:
        process.join()
        assert process.exitcode == 0
    assert not list(cache.parent.glob("*partial*"))
    rows = [1, 2, 50]
    expected = IdsTable(data, PAD).take(rows)
    cache.with_name("phase1.first.npy").unlink()  # a part gone: built again, not an error
    for key, value in IdsTable(data, PAD, vocab_size=200, cache=cache).take(rows).items():
        assert np.array_equal(value, expected[key]), key


def test_many_special_tokens_are_found_by_the_steps_lookup_as_by_the_loader():
    """A vocabulary with 60 special ids (where torch.isin would sort and read a count on the host): the step's
    table lookup leaves them unmasked exactly as the loader does."""

    class ManySpecials(IdsTokenizer):
        all_special_ids = list(range(60))

    collator = MaskingCollator(ManySpecials(), max_predictions_per_seq=6)
    assert len(collator.special_ids) == 60
    masked, shipped, masker = mask_loaders(ids_instances(30, 40, seed=5), collator, True)
    for key in ((0, [0, 1, 2, 3]), (9, [4, 11, 25, 7])):
        ids, _ = shipped[key]
        same(masker(ids), masked[key][0])
