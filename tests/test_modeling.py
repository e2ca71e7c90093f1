"""The BertSuite family against stock transformers BERT: parity per head, loading, saving, Auto
dispatch, the ablation switches and the size presets."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers
from transformers import AutoConfig, AutoModel, BertConfig

import bert_suite
from bert_suite import (
    AUTO_CLASSES,
    BertSuiteConfig,
    BertSuiteConfigError,
    BertSuiteForMaskedLM,
    BertSuiteForPreTraining,
    BertSuiteForQuestionAnswering,
    BertSuiteForSequenceClassification,
    BertSuiteModel,
)
from bert_suite.cli import main as cli_main
from helpers import HEADS, STOCK_CONFIG, TOL, VOCAB, batch, inputs_for, labels_for, save_stock


def max_diff(a, b, fields, real=None):
    """Largest |a - b| over the fields; with `real` (the attention mask), per-token fields are
    compared at real tokens only (the unpadded path leaves padding positions at zero)."""
    def values(out, f):
        t = getattr(out, f)
        return t[real.bool()] if real is not None and t.shape[: real.dim()] == real.shape else t
    return max((values(a, f) - values(b, f)).abs().max().item() for f in fields)


@pytest.mark.parametrize("unpad", [True, False], ids=["unpadded", "padded"])
@pytest.mark.parametrize("bin_weights", [False, True], ids=["safetensors", "bin"])
@pytest.mark.parametrize("name", list(HEADS))
def test_stock_checkpoint_loads_with_identical_outputs(name, bin_weights, unpad, tmp_path, report):
    """Every head gives stock outputs and losses: at every position with unpad_inputs=False, and at
    every real token with the default unpadded path (padding rows are zeros there, not stock's)."""
    ours_cls, _, _, fields = HEADS[name]
    stock = save_stock(name, tmp_path, bin_weights)
    ours, info = ours_cls.from_pretrained(tmp_path, output_loading_info=True, unpad_inputs=unpad)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ours.eval()
    inputs = inputs_for(name)
    inputs.update(labels_for(name, inputs))
    with torch.no_grad():
        a, b = stock(**inputs), ours(**inputs)
    real = inputs["attention_mask"] if unpad and name != "ForQuestionAnswering" else None
    diff = max_diff(a, b, fields, real)
    assert diff <= TOL
    per_token = [f for f in fields if real is not None and getattr(b, f).shape[: real.dim()] == real.shape]
    for field in per_token:  # the unpadded path really ran: padding rows differ from stock's
        padded = getattr(b, field)[~real.bool()]
        assert padded.numel() and not torch.allclose(getattr(a, field)[~real.bool()], padded, atol=1e-3)
    if not bin_weights:
        report(f"parity max|ours-stock| {name} ({'unpadded' if unpad else 'padded'})", f"{diff:.2e}")


@pytest.mark.parametrize("size", ["tiny", "mini"])
def test_unpadded_training_step_matches_the_padded_one(size):
    """Loss and every gradient of a pre-training step agree between the unpadded and the padded
    computation (dropout off), and the unpadded path never embeds the padding tokens."""
    inputs = batch((3, 11))
    labels = torch.full_like(inputs["input_ids"], -100)
    labels[:, 2] = inputs["input_ids"][:, 2]
    results = {}
    for unpad in (True, False):
        torch.manual_seed(0)
        config = BertSuiteConfig.from_preset(size, vocab_size=VOCAB, hidden_dropout_prob=0.0,
                                             attention_probs_dropout_prob=0.0, unpad_inputs=unpad)
        model = BertSuiteForPreTraining(config).train()
        ids = inputs["input_ids"].clone()
        if unpad:  # padding ids that would fail if they were ever looked up
            ids[inputs["attention_mask"] == 0] = 10_000
        out = model(input_ids=ids, attention_mask=inputs["attention_mask"], token_type_ids=inputs["token_type_ids"],
                    labels=labels, next_sentence_label=torch.tensor([0, 1, 0]), masked_positions_only=True)
        out.loss.backward()
        results[unpad] = out.loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}
    (loss_a, grads_a), (loss_b, grads_b) = results[True], results[False]
    assert abs(loss_a - loss_b) < 1e-5
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], atol=1e-5, rtol=1e-4), name


def test_pretraining_checkpoint_into_task_head_only_initialises_the_head(tmp_path):
    save_stock("ForPreTraining", tmp_path)
    _, info = BertSuiteForSequenceClassification.from_pretrained(tmp_path, num_labels=2, output_loading_info=True)
    assert info["missing_keys"] == {"classifier.weight", "classifier.bias"}
    _, info = BertSuiteForQuestionAnswering.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == {"qa_outputs.weight", "qa_outputs.bias"}


def test_mlm_decoder_is_tied_to_word_embeddings():
    model = BertSuiteForPreTraining(BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB))
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias


def test_pretraining_loss_is_mean_mlm_plus_mean_nsp():
    torch.manual_seed(0)
    model = BertSuiteForPreTraining(BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB)).eval()
    inputs = batch()
    labels = labels_for("ForPreTraining", inputs)
    out = model(**inputs, **labels)
    mask = labels["labels"] != -100
    mlm = torch.nn.functional.cross_entropy(out.prediction_logits[mask], labels["labels"][mask])
    nsp = torch.nn.functional.cross_entropy(out.seq_relationship_logits, labels["next_sentence_label"])
    assert torch.allclose(out.loss, mlm + nsp, atol=1e-6)


@pytest.mark.parametrize("name", ["ForPreTraining", "ForSequenceClassification", "ForMultipleChoice"])
def test_save_and_reload_round_trip(name, tmp_path):
    ours_cls, _, extra, fields = HEADS[name]
    torch.manual_seed(0)
    model = ours_cls(BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB, **extra)).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and not list(tmp_path.glob("*.bin"))
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "bert_suite"
    assert saved["auto_map"]["AutoModelForSequenceClassification"].endswith("BertSuiteForSequenceClassification")
    reloaded = AUTO_CLASSES[next(a for a, c in AUTO_CLASSES.items() if c is ours_cls)].from_pretrained(tmp_path)
    assert type(reloaded) is ours_cls
    inputs = inputs_for(name)
    inputs.update(labels_for(name, inputs))
    with torch.no_grad():
        # the same weights; float sums may be ordered differently between calls under load (seen: 1e-8)
        assert max_diff(model(**inputs), reloaded.eval()(**inputs), fields) <= 1e-6


def test_auto_classes_dispatch_to_the_family():
    config = AutoConfig.for_model("bert_suite", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=37)
    assert isinstance(config, BertSuiteConfig)
    for auto, cls in AUTO_CLASSES.items():
        assert type(auto.from_config(config)) is cls
    assert type(AutoModel.from_config(config)) is BertSuiteModel


@pytest.mark.parametrize("name", list(HEADS))
def test_export_to_stock_bert_gives_identical_outputs(name, tmp_path):
    ours_cls, stock_name, extra, fields = HEADS[name]
    torch.manual_seed(0)
    model = ours_cls(BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB, **extra)).eval()
    model.save_pretrained(tmp_path / "ours")
    (tmp_path / "ours" / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    assert cli_main(["export", "--to", "bert", str(tmp_path / "ours"), str(tmp_path / "stock")]) == 0
    assert json.loads((tmp_path / "stock" / "config.json").read_text())["model_type"] == "bert"
    assert (tmp_path / "stock" / "vocab.txt").read_text() == "[PAD]\n[UNK]\n"
    stock, info = getattr(transformers, stock_name).from_pretrained(tmp_path / "stock", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    inputs = inputs_for(name)
    inputs.update(labels_for(name, inputs))
    real = None if name == "ForQuestionAnswering" else inputs["attention_mask"]
    with torch.no_grad():
        assert max_diff(stock.eval()(**inputs), model(**inputs), fields, real) <= TOL


def test_export_refuses_a_checkpoint_without_nsp(tmp_path, capsys):
    BertSuiteForPreTraining(BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB, use_nsp=False)).save_pretrained(tmp_path)
    assert cli_main(["export", "--to", "bert", str(tmp_path), str(tmp_path / "out")]) == 2
    assert "use_nsp=False" in capsys.readouterr().err


def test_trust_remote_code_loads_without_bert_suite(tmp_path):
    torch.manual_seed(0)
    model = BertSuiteForSequenceClassification(BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB, num_labels=3)).eval()
    model.save_pretrained(tmp_path / "ckpt")
    inputs = batch()
    torch.save(inputs, tmp_path / "inputs.pt")
    with torch.no_grad():
        torch.save(model(**inputs).logits, tmp_path / "expected.pt")
    script = textwrap.dedent(f"""
        import sys
        sys.modules["bert_suite"] = None  # any import of bert_suite now fails
        import torch
        from transformers import AutoModelForSequenceClassification
        model = AutoModelForSequenceClassification.from_pretrained({str(tmp_path / 'ckpt')!r}, trust_remote_code=True)
        assert "bert_suite" not in type(model).__module__.split(".")[0], type(model).__module__
        inputs = torch.load({str(tmp_path / 'inputs.pt')!r})
        with torch.no_grad():
            got = model.eval()(**inputs).logits
        diff = (got - torch.load({str(tmp_path / 'expected.pt')!r})).abs().max().item()
        print(type(model).__module__, diff)
        assert diff == 0.0, diff
    """)
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "transformers_modules" in done.stdout


def test_causal_switch_hides_later_tokens():
    torch.manual_seed(0)
    config = BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB, causal_attention=True)
    model = BertSuiteModel(config).eval()
    ids = torch.randint(1, VOCAB, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 5) % VOCAB
    with torch.no_grad():
        a, b = model(ids).last_hidden_state, model(changed).last_hidden_state
    assert torch.allclose(a[:, :6], b[:, :6], atol=1e-6)
    assert not torch.allclose(a[:, 6:], b[:, 6:], atol=1e-3)
    # the bidirectional model does see the change at earlier positions
    bidirectional = BertSuiteModel(BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB)).eval()
    bidirectional.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.allclose(bidirectional(ids).last_hidden_state[:, :6],
                                  bidirectional(changed).last_hidden_state[:, :6], atol=1e-3)


def test_causal_switch_matches_stock_is_decoder(tmp_path):
    torch.manual_seed(0)
    stock = transformers.BertModel(BertConfig(**STOCK_CONFIG, is_decoder=True)).eval()
    stock.save_pretrained(tmp_path)
    ours = BertSuiteModel.from_pretrained(tmp_path).eval()
    assert ours.config.causal_attention
    inputs = batch()
    with torch.no_grad():
        assert max_diff(stock(**inputs, use_cache=False), ours(**inputs), ["last_hidden_state"],
                        inputs["attention_mask"]) <= TOL


def test_nsp_switch_removes_the_head_and_its_loss():
    torch.manual_seed(0)
    config = BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB, use_nsp=False)
    model = BertSuiteForPreTraining(config).eval()
    assert not any("seq_relationship" in name for name, _ in model.named_parameters())
    inputs = batch()
    labels = labels_for("ForPreTraining", inputs)
    out = model(**inputs, labels=labels["labels"])
    assert out.seq_relationship_logits is None
    mask = labels["labels"] != -100
    mlm = torch.nn.functional.cross_entropy(out.prediction_logits[mask], labels["labels"][mask])
    assert torch.allclose(out.loss, mlm, atol=1e-6)
    with pytest.raises(ValueError, match="next_sentence_label"):
        BertSuiteForPreTraining(BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB))(**inputs, labels=labels["labels"])


@pytest.mark.parametrize(
    "preset, expected_millions",
    [("tiny", 4.4), ("mini", 11.2), ("small", 28.8), ("medium", 41.4), ("base", 109.5), ("large", 335.1)],
)
def test_presets_parameter_counts(preset, expected_millions):
    config = BertSuiteConfig.from_preset(preset)
    assert config.intermediate_size == 4 * config.hidden_size
    assert config.hidden_size // config.num_attention_heads == 64
    with torch.device("meta"):
        model = BertSuiteModel(config)
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    assert millions == pytest.approx(expected_millions, abs=0.1)


def test_unknown_preset_is_an_error():
    with pytest.raises(BertSuiteConfigError, match="unknown preset 'huge'"):
        BertSuiteConfig.from_preset("huge")


def write_config(folder, **overrides):
    folder.mkdir(exist_ok=True)
    data = {**STOCK_CONFIG, "model_type": "bert", **overrides}
    (folder / "config.json").write_text(json.dumps(data))
    return folder


def test_config_with_a_near_miss_key_names_file_key_and_the_known_one(tmp_path):
    folder = write_config(tmp_path / "ckpt", hiden_size=3)
    with pytest.raises(BertSuiteConfigError,
                       match=r"ckpt/config.json: unknown config key 'hiden_size'; did you mean 'hidden_size'\?"):
        BertSuiteConfig.from_pretrained(folder)
    with pytest.raises(BertSuiteConfigError, match="'num_atention_heads'; did you mean 'num_attention_heads'"):
        AutoConfig.from_pretrained(write_config(tmp_path / "ours", model_type="bert_suite", num_atention_heads=3))
    with pytest.raises(BertSuiteConfigError, match="did you mean 'intermediate_size'"):
        BertSuiteConfig(intermediate_sise=64)
    # another architecture's spelling that tools set on any config (GPT-2's) is a key, not a typo
    assert BertSuiteConfig(layer_norm_epsilon=1.0).layer_norm_epsilon == 1.0


def test_unknown_config_keys_round_trip_as_in_any_pretrained_config(tmp_path):
    """Tools add their own keys (quantization_config, task_specific_params, a user's note): a model
    saves them and reloads its own save, as every transformers config does."""
    config = BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB, quantization_config={"quant_method": "none"},
                                         task_specific_params={"ner": {"x": 1}})
    config.my_note = "kept"
    model = BertSuiteModel(config)
    model.save_pretrained(tmp_path / "m")
    for loaded in (BertSuiteConfig.from_pretrained(tmp_path / "m"), AutoConfig.from_pretrained(tmp_path / "m"),
                   BertSuiteModel.from_pretrained(tmp_path / "m").config):
        assert loaded.my_note == "kept" and loaded.quantization_config == {"quant_method": "none"}
        assert loaded.task_specific_params == {"ner": {"x": 1}}
    assert BertSuiteConfig.from_pretrained(tmp_path / "m").to_dict() == model.config.to_dict()


def test_config_with_indivisible_heads_names_file_when_the_model_is_built(tmp_path):
    """As stock BERT: a config may hold any sizes while it is edited; building a model checks them."""
    folder = write_config(tmp_path / "ckpt", hidden_size=30, num_attention_heads=4)
    assert BertSuiteConfig.from_pretrained(folder).hidden_size == 30
    BertSuiteModel(BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB)).save_pretrained(folder)
    write_config(folder, hidden_size=30, num_attention_heads=4)
    with pytest.raises(BertSuiteConfigError, match=r"ckpt/config.json: hidden_size \(30\) is not divisible"):
        BertSuiteModel.from_pretrained(folder)
    with pytest.raises(BertSuiteConfigError, match=r"^hidden_size \(30\) is not divisible"):
        BertSuiteModel(BertSuiteConfig(hidden_size=30, num_attention_heads=4))


def test_stock_config_keys_are_accepted_and_unsupported_ones_refused(tmp_path):
    folder = write_config(tmp_path / "a", position_embedding_type="absolute", use_cache=True,
                          gradient_checkpointing=False, architectures=["BertForMaskedLM"])
    assert BertSuiteConfig.from_pretrained(folder).hidden_size == 32
    folder = write_config(tmp_path / "b", position_embedding_type="relative_key")
    with pytest.raises(BertSuiteConfigError, match="position_embedding_type"):
        BertSuiteConfig.from_pretrained(folder)
    folder = write_config(tmp_path / "c", model_type="gpt2")
    with pytest.raises(BertSuiteConfigError, match="not a BERT checkpoint"):
        BertSuiteConfig.from_pretrained(folder)


def test_weights_that_do_not_fit_the_config_name_file_and_tensor(tmp_path):
    save_stock("ForMaskedLM", tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data.update(hidden_size=64)
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(RuntimeError, match=r"model.safetensors: bert\.\S+ has shape \(.*32.*\), the model expects \(.*64"):
        BertSuiteForMaskedLM.from_pretrained(tmp_path)


def test_a_num_labels_that_does_not_fit_names_the_tensors_and_the_way_out(tmp_path):
    """As stock: a RuntimeError naming each tensor and both shapes, suggesting ignore_mismatched_sizes."""
    save_stock("ForSequenceClassification", tmp_path)  # 3 labels
    with pytest.raises(RuntimeError) as err:
        BertSuiteForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
    message = str(err.value)
    assert "classifier.weight has shape (3, 32), the model expects (5, 32)" in message
    assert "classifier.bias has shape (3,), the model expects (5,)" in message
    assert "ignore_mismatched_sizes=True" in message and isinstance(err.value, ValueError)
    model = BertSuiteForSequenceClassification.from_pretrained(tmp_path, num_labels=5, ignore_mismatched_sizes=True)
    assert model.classifier.weight.shape == (5, 32)


def test_bin_weights_are_never_unpickled_unsafely(tmp_path):
    save_stock("Model", tmp_path, bin_weights=True)
    with pytest.raises(ValueError, match="weights_only"):
        BertSuiteModel.from_pretrained(tmp_path, weights_only=False)


def test_sequence_longer_than_positions_is_a_clear_error():
    model = BertSuiteModel(BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB, max_position_embeddings=8))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.ones(1, 9, dtype=torch.long))


def test_output_hidden_states_and_attentions():
    model = BertSuiteModel(BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB)).eval()
    inputs = batch()
    out = model(**inputs, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == 3 and len(out.attentions) == 2
    probs = out.attentions[0]
    assert probs.shape == (3, 2, 11, 11)
    assert torch.allclose(probs.sum(-1), torch.ones(3, 2, 11), atol=1e-5)
    assert probs[2, :, :, 4:].abs().max() < 1e-6  # padding keys get no attention
    with torch.no_grad():  # attentions asked for: the padded path; otherwise unpadded
        plain = model(**inputs).last_hidden_state
        hidden = model(**inputs, output_hidden_states=True).hidden_states
    real = inputs["attention_mask"].bool()
    assert torch.allclose(out.last_hidden_state[real], plain[real], atol=1e-5)
    assert len(hidden) == 3 and all(torch.allclose(a[real], b[real], atol=1e-5) for a, b in zip(hidden, out.hidden_states, strict=True))
    assert all(h[~real].abs().max() == 0 for h in hidden)


def test_version_is_exposed():
    assert bert_suite.__version__


def test_masked_positions_only_gives_the_same_loss_for_less_work():
    from bert_suite import BertSuiteForMaskedLM

    torch.manual_seed(0)
    config = BertSuiteConfig.from_preset("tiny", vocab_size=50)
    ids = torch.randint(5, 50, (3, 12))
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 5], labels[1, 7], labels[2, 11] = 7, 8, 9, 10
    nsp = torch.tensor([0, 1, 0])
    for cls, extra in ((BertSuiteForPreTraining, {"next_sentence_label": nsp}), (BertSuiteForMaskedLM, {})):
        model = cls(config).eval()
        dense = model(input_ids=ids, labels=labels, **extra)
        sparse = model(input_ids=ids, labels=labels, masked_positions_only=True, **extra)
        assert torch.allclose(dense.loss, sparse.loss, atol=1e-6)
        logits = sparse.prediction_logits if cls is BertSuiteForPreTraining else sparse.logits
        dense_logits = dense.prediction_logits if cls is BertSuiteForPreTraining else dense.logits
        assert logits.shape == (4, 50) and torch.allclose(logits, dense_logits[labels != -100], atol=1e-6)


def test_the_cpu_training_paths_cross_entropy_gives_the_losses_gradients_and_statistics_of_the_reference():
    """The CPU training path's MLM loss (SummedCrossEntropy: the gradient made in the forward pass) against
    F.cross_entropy: the loss, the weights' gradients, in fp32 and bf16 autocast, summed and mean; and the logged
    statistics against log-softmax and argmax."""
    import torch.nn.functional as F

    from bert_suite.modeling_bert_suite import SummedCrossEntropy
    from bert_suite.pretraining.step import batch_stats

    torch.manual_seed(0)
    model = BertSuiteForPreTraining(BertSuiteConfig.from_preset("tiny", vocab_size=300, use_nsp=False)).eval()
    ids = torch.randint(5, 300, (4, 16))
    labels = torch.where(torch.rand(4, 16) < 0.5, torch.roll(ids, -1, 1), -100)
    for autocast in (False, True):
        grads, losses = [], []
        for positions_only in (False, True):  # the dense path is F.cross_entropy's; the other SummedCrossEntropy's
            model.zero_grad()
            with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                out = model(input_ids=ids, labels=labels, masked_positions_only=positions_only,
                            num_items_in_batch=torch.tensor(50.0))
            out.loss.backward()
            losses.append(out.loss.detach())
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        tolerance = 2e-2 if autocast else 1e-5  # bf16 logits: the two paths round their own sums
        assert abs(float(losses[0] - losses[1])) < tolerance * float(losses[0].abs())
        assert float((grads[0] - grads[1]).abs().max()) <= tolerance * float(grads[0].abs().max())
    # the function alone, where the arithmetic is all its own: summed and mean losses, gradient, bf16 in and out
    logits = torch.randn(30, 300, requires_grad=True)
    targets = torch.randint(0, 300, (30,))
    reference = F.cross_entropy(logits, targets, reduction="sum")
    (expected,) = torch.autograd.grad(reference * 3, logits)
    loss = SummedCrossEntropy.apply(logits, targets)
    (grad,) = torch.autograd.grad(loss * 3, logits)
    assert torch.allclose(loss, reference, rtol=1e-6) and torch.allclose(grad, expected, atol=1e-6)
    half = logits.detach().bfloat16().requires_grad_()
    loss = SummedCrossEntropy.apply(half, targets)
    (grad,) = torch.autograd.grad(loss, half)
    assert grad.dtype == torch.bfloat16 and torch.allclose(loss, F.cross_entropy(half.float(), targets,
                                                                                 reduction="sum"), rtol=1e-5)
    # the statistics: the loss of the labelled positions, and argmax's correct count (no exact ties here)
    logits = torch.randn(2, 7, 300)
    labels = torch.randint(0, 300, (2, 7))
    labels[0, :3] = -100
    labels[1, 4] = logits[1, 4].argmax()  # one right answer at least
    stats = batch_stats(type("Out", (), {"prediction_logits": logits, "seq_relationship_logits": None})(),
                        {"labels": labels})
    flat, target = logits.reshape(-1, 300), labels.reshape(-1)
    assert torch.allclose(stats["mlm_loss"], F.cross_entropy(flat, target, ignore_index=-100, reduction="sum"))
    assert int(stats["mlm_correct"]) == int(((flat.argmax(-1) == target) & (target != -100)).sum()) >= 1
    assert int(stats["mlm_count"]) == 11


def test_unpadding_is_skipped_when_padding_is_rare():
    """Below UNPAD_MIN_PADDING the padded computation runs (padding rows equal stock's, not zeros)."""
    from bert_suite.modeling_bert_suite import UNPAD_MIN_PADDING, Unpadded

    mask = torch.ones(4, 50, dtype=torch.long)
    mask[0, -int(UNPAD_MIN_PADDING * 200) + 1:] = 0  # just under the threshold
    assert Unpadded.from_mask(mask) is None
    mask[1, -2:] = 0
    layout = Unpadded.from_mask(mask)
    assert layout is not None and layout.index.numel() == int(mask.sum())
    rows = torch.randn(layout.index.numel(), 3, requires_grad=True)
    padded = layout.pad(rows)
    assert padded.shape == (4, 50, 3) and padded[mask == 0].abs().max() == 0
    assert torch.equal(layout.unpad(padded), rows)
    (layout.unpad(padded) * 2).sum().backward()
    assert torch.equal(rows.grad, torch.full_like(rows, 2.0))
