"""LoRA through peft: parity with peft on the stock checkpoint of the same weights (every head), and
`finetune`/`grid` with --lora_r / --lora_ranks: a tiny model learns with the encoder frozen, the adapter
reloads onto a fresh base exactly, and the merged checkpoint is one that predict takes like any other."""

import json
import random
from pathlib import Path

import pytest
import torch
import transformers

from bert_suite import BertSuiteForPreTraining, BertSuiteForSequenceClassification
from bert_suite.cli import main as cli_main
from bert_suite.lora import LoraError, LoraSettings, apply_lora, head_modules, lora_settings
from helpers import HEADS, TOL, WORDS, inputs_for, save_stock, write_records_csv

peft = pytest.importorskip("peft")

TASK_HEADS = ["ForSequenceClassification", "ForQuestionAnswering", "ForTokenClassification", "ForMultipleChoice"]


def randomise_lora(model, seed: int) -> None:
    """LoRA's B starts at zero (the update is 0 until trained): give every LoRA matrix values, so that
    parity checks the update's path, not a zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("name", TASK_HEADS)
def test_lora_matches_peft_on_the_stock_checkpoint_of_the_same_weights(name, tmp_path):
    ours_cls, _, _, fields = HEADS[name]
    stock = save_stock(name, tmp_path)
    ours = ours_cls.from_pretrained(tmp_path).eval()
    settings = LoraSettings(r=4, alpha=8, dropout=0.0, target_modules=("query", "value"))
    ours = apply_lora(ours, settings)
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["query", "value"],
                             modules_to_save=head_modules(stock))
    stock = peft.get_peft_model(stock, config)
    # the same trainable parameters: the LoRA matrices and the head, nothing else
    count = lambda m: sum(p.numel() for p in m.parameters() if p.requires_grad)  # noqa: E731
    assert count(ours) == count(stock) > 0
    trainable = {n for n, p in ours.named_parameters() if p.requires_grad}
    assert all("lora_" in n or "modules_to_save" in n for n in trainable)
    randomise_lora(ours, 0)
    peft.set_peft_model_state_dict(stock, peft.get_peft_model_state_dict(ours))
    inputs = inputs_for(name)
    ours.eval(), stock.eval()
    with torch.no_grad():
        a, b = ours(**inputs), stock(**inputs)
    # per-token outputs are compared at real tokens (our unpadded path leaves padding rows at zero)
    real = inputs["attention_mask"].bool() if name == "ForTokenClassification" else slice(None)
    for field in fields:
        if field != "loss":
            assert torch.allclose(a[field][real], b[field][real], atol=TOL), field
    # merged: the same outputs without peft in the way
    with torch.no_grad():
        merged = ours.merge_and_unload()(**inputs)
    for field in fields:
        if field != "loss":
            assert torch.allclose(merged[field], a[field], atol=TOL), field


# ------------------------------------------------------------------------------------------- the commands


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """A card-less pair task (label: which half of the vocabulary sentence2's last word is from) and a
    pre-trained-looking start checkpoint (random tiny weights saved once, so a fresh base can be loaded)."""
    folder = tmp_path_factory.mktemp("lora-task")
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    rng = random.Random(3)

    def rows(n):
        out = []
        for _ in range(n):
            positive = rng.random() < 0.5
            out.append({"sentence1": " ".join(rng.sample(WORDS, 3)),
                        "sentence2": " ".join(rng.sample(WORDS, 2) + [rng.choice(WORDS[:4] if positive else WORDS[4:])]),
                        "label": "pos" if positive else "neg"})
        return out

    for split, n in (("train", 600), ("dev", 200), ("test", 100)):
        write_records_csv(folder / f"{split}.csv", rows(n))
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("bert_suite", vocab_size=13, hidden_size=64, num_hidden_layers=2,
                                               num_attention_heads=2, intermediate_size=128,
                                               max_position_embeddings=64)
    BertSuiteForPreTraining(config).save_pretrained(folder / "start")
    return folder


def files(task: Path, out: Path, *extra: str) -> list[str]:
    return ["--train_file", str(task / "train.csv"), "--validation_file", str(task / "dev.csv"),
            "--model", str(task / "start"), "--tokenizer", str(task / "vocab.txt"), "--output_dir", str(out),
            "--disable_tqdm", "true", "--max_seq_length", "32", *extra]


def test_finetune_with_lora_learns_with_the_encoder_frozen_and_saves_adapter_and_merged_model(task, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_main(["finetune", *files(task, out, "--learning_rate", "5e-3", "--num_train_epochs", "4",
                                        "--per_device_train_batch_size", "16",
                                        "--test_file", str(task / "test.csv"), "--lora_r", "4",
                                        "--lora_target_modules", "query,value")]) == 0
    said = capsys.readouterr().err
    assert "LoRA r=4 alpha=8 dropout=0.1 on query, value:" in said
    results = json.loads((out / "all_results.json").read_text())
    assert results["eval_accuracy"] > 0.9 and results["test_accuracy"] > 0.9  # chance is 0.5
    assert results["lora_r"] == 4 and results["lora_alpha"] == 8
    assert results["trainable_parameters"] < 0.2 * results["parameters"]
    manifest = json.loads((out / "run_manifest.json").read_text())
    assert manifest["lora_target_modules"] == ["query", "value"]

    # the merged checkpoint: frozen weights are the start's, the adapted ones moved
    start = BertSuiteForSequenceClassification.from_pretrained(task / "start", num_labels=2)
    merged = BertSuiteForSequenceClassification.from_pretrained(out)
    before, after = start.state_dict(), merged.state_dict()
    layer = "bert.encoder.layer.0.attention.self"
    assert torch.equal(before[f"{layer}.key.weight"], after[f"{layer}.key.weight"])
    assert torch.equal(before["bert.embeddings.word_embeddings.weight"], after["bert.embeddings.word_embeddings.weight"])
    assert not torch.allclose(before[f"{layer}.query.weight"], after[f"{layer}.query.weight"])

    # the adapter alone, on a fresh copy of the base, gives the merged model's outputs
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (out / "adapter").iterdir()}
    reloaded = peft.PeftModel.from_pretrained(start, out / "adapter").eval()
    batch = {"input_ids": torch.tensor([[2, 5, 6, 7, 3, 8, 12, 3], [2, 9, 3, 10, 11, 3, 0, 0]]),
             "attention_mask": torch.tensor([[1] * 8, [1] * 6 + [0, 0]]),
             "token_type_ids": torch.tensor([[0] * 5 + [1] * 3, [0] * 3 + [1] * 3 + [0, 0]])}
    with torch.no_grad():
        assert torch.allclose(reloaded(**batch).logits, merged.eval()(**batch).logits, atol=1e-5)

    # predict takes the run folder like any other checkpoint, and scores the labelled test file the same
    assert cli_main(["predict", "--model", str(out), "--test_file", str(task / "test.csv"),
                     "--output_dir", str(tmp_path / "p")]) == 0
    scored = json.loads((tmp_path / "p" / "predictions" / "test_results.json").read_text())
    assert scored["accuracy"] == pytest.approx(results["test_accuracy"])
    # and export takes it too: the merged model is an ordinary checkpoint
    pytest.importorskip("onnxruntime")
    assert cli_main(["export", "--to", "onnx", str(out), str(tmp_path / "onnx")]) == 0
    assert (tmp_path / "onnx" / "model.onnx").is_file()


def test_grid_over_lora_ranks(task, tmp_path):
    out = tmp_path / "grid"
    assert cli_main(["grid", *files(task, out, "--learning_rates", "5e-3", "--batch_sizes", "16", "--epochs", "2",
                                    "--lora_ranks", "2", "8")]) == 0
    best = json.loads((out / "best_trial.json").read_text())
    assert best["lora_r"] in (2, 8) and best["metrics"]["eval_accuracy"] > 0.8
    report = (out / "grid_results.md").read_text()
    assert "| num_train_epochs | lora_r | seed | state |" in report
    assert "| learning_rate | batch size | epochs | LoRA rank | seeds |" in report
    assert {line.split(" | ")[3] for line in report.splitlines() if line.startswith("| 0.005 | 16 | 2 |")} == {"2", "8"}
    assert {"heatmap_epochs2_r2.png", "heatmap_epochs2_r8.png"} <= {p.name for p in out.iterdir()}
    assert (out / "best" / "adapter" / "adapter_config.json").is_file()
    config = json.loads((out / "best" / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == best["lora_r"] and config["lora_alpha"] == 2 * best["lora_r"]  # alpha: 2 x r
    manifest = json.loads((out / "run_manifest.json").read_text())
    assert manifest["grid"]["lora_r"] == [2, 8] and manifest["lora"]["lora_target_modules"] == ["query", "value"]


def test_settings_from_flags():
    assert lora_settings(None) is None
    made = lora_settings(8, None, None, ["query,key", "value"])
    assert made.target_modules == ("query", "key", "value") and made.scale_alpha == 16 and made.dropout == 0.1
    assert lora_settings(4, 32.0, 0.0, None).record() == {"lora_r": 4, "lora_alpha": 32.0, "lora_dropout": 0.0,
                                                          "lora_target_modules": ["query", "value"]}
    with pytest.raises(LoraError, match="--lora_alpha.*without --lora_r"):
        lora_settings(None, 16.0)
    with pytest.raises(LoraError, match="--lora_dropout 1.0: must be in"):
        lora_settings(4, None, 1.0)


def test_the_model_card_of_a_lora_run_says_so():
    from bert_suite.cards import load_card
    from bert_suite.cli import card_info
    from bert_suite.hub import model_card

    class Args:
        hub_model_id, model = "user/rte-lora", "preset:tiny"

    metrics = {"eval_accuracy": 0.9, "eval_loss": 0.3, "train_loss": 0.4, "train_samples": 600, "eval_samples": 200,
               "trainable_parameters": 8450, "parameters": 1511812, **LoraSettings(r=8).record()}  # as finetune has them
    info = card_info(load_card("rte"), Args, metrics, None,
                     {"best": {"learning_rate": 1e-3, "per_device_train_batch_size": 16, "num_train_epochs": 1,
                               "seed": 42, "lora_r": 8}, "records": [{"seed": 42}], "files": {}},
                     lora=LoraSettings(r=8), test_scores={"test_accuracy": 0.8})
    text = model_card(info)
    assert "| lora_r | 8 |" in text and "| lora_alpha | 16.0 |" in text and "| lora_target_modules | query, value |" in text
    assert "## Test results (labelled test set)" in text and "| accuracy | 80.00 |" in text
    dev = text.split("## Dev results", 1)[1].split("##", 1)[0]  # scores only: no counts, no LoRA settings
    assert "| accuracy | 90.00 |" in dev and "parameters" not in dev and "samples" not in dev and "lora" not in dev


def test_a_grid_over_ranks_is_one_study_whatever_the_order_of_the_ranks():
    from bert_suite.cards import load_card
    from bert_suite.grid import grid_key, search_space, study_name

    card = load_card("rte")
    names = set()
    for ranks in ([4, 8], [8, 4]):
        space = search_space(card, learning_rate=[1e-3], lora_r=ranks)
        names.add(study_name(card, space, None, LoraSettings(r=ranks[0])))
    assert len(names) == 1
    key = grid_key(card, search_space(card, lora_r=[4, 8]), None, LoraSettings(r=4))
    assert key["lora"] == {"lora_alpha": "2 x lora_r", "lora_dropout": 0.1, "lora_target_modules": ["query", "value"]}
    assert grid_key(card, search_space(card), None, LoraSettings(r=4, alpha=32))["lora"]["lora_alpha"] == 32
