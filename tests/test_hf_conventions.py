"""The family behaves as a transformers model beyond output parity: torch.compile (fullgraph) and
torch.export with an attention mask on every head, return_dict=False tuples in stock order,
attn_implementation honoured, decoder inputs refused clearly."""

import pytest
import torch
import transformers
from torch.export import Dim
from transformers import AutoModelForNextSentencePrediction, BertConfig

from bert_suite import (
    BertSuiteConfig,
    BertSuiteConfigError,
    BertSuiteForNextSentencePrediction,
    BertSuiteForSequenceClassification,
    BertSuiteModel,
)
from helpers import HEADS, STOCK_CONFIG, TOL, VOCAB, inputs_for, labels_for, run_args, save_stock, write_rte_like


def tiny(name, **extra):
    ours_cls, _, head_extra, _ = HEADS[name]
    torch.manual_seed(0)
    config = BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB, hidden_size=32, num_attention_heads=4,
                                         intermediate_size=37, **head_extra, **extra)
    return ours_cls(config).eval()


def outputs(out, fields):
    return [getattr(out, f) for f in fields]


@pytest.mark.parametrize("name", list(HEADS))
def test_compile_fullgraph_with_a_mask_equals_eager(name):
    """fullgraph=True fails on any graph break, e.g. a host sync on the mask's values. The aot_eager
    backend traces exactly what inductor would compile, without the minutes of code generation
    (the slow test below runs inductor itself)."""
    model = tiny(name)
    inputs = inputs_for(name)  # padded rows: the mask masks something
    inputs.update(labels_for(name, inputs))
    fields = HEADS[name][3]
    with torch.no_grad():
        eager = outputs(model(**inputs), fields)
        torch._dynamo.reset()
        compiled = outputs(torch.compile(model, fullgraph=True, backend="aot_eager")(**inputs), fields)
    mask = inputs["attention_mask"].bool()
    for a, b in zip(eager, compiled, strict=True):
        if a.shape[: mask.dim()] == mask.shape:  # per token: eager unpads (zeros at padding), compile does not
            a, b = a[mask], b[mask]
        assert (a - b).abs().max() <= TOL


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HEADS))
def test_compile_inductor_equals_eager(name):
    model = tiny(name)
    inputs = inputs_for(name)
    fields = HEADS[name][3][:1]
    with torch.no_grad():
        eager = outputs(model(**inputs, unpad=False) if name == "Model" else model(**inputs), fields)
        torch._dynamo.reset()
        compiled = outputs(torch.compile(model, fullgraph=True)(**inputs), fields)
    mask = inputs["attention_mask"].bool()
    for a, b in zip(eager, compiled, strict=True):
        if a.shape[: mask.dim()] == mask.shape:
            a, b = a[mask], b[mask]
        assert (a - b).abs().max() <= TOL


@pytest.mark.parametrize("name", list(HEADS))
def test_export_with_a_mask_and_dynamic_batch_and_length(name):
    model = tiny(name)
    inputs = inputs_for(name)
    dims = {0: Dim("batch", min=1, max=64), inputs["input_ids"].dim() - 1: Dim("seq", min=2, max=64)}
    program = torch.export.export(model, (), inputs, dynamic_shapes={k: dims for k in inputs})
    fields = HEADS[name][3][:-1] if "loss" in HEADS[name][3] else HEADS[name][3]
    # another batch size and length than the traced one
    g = torch.Generator().manual_seed(5)
    shape = (5, *inputs["input_ids"].shape[1:-1], 17)  # (batch, [choices,] length)
    other = {"input_ids": torch.randint(1, VOCAB, shape, generator=g),
             "attention_mask": torch.ones(shape, dtype=torch.long), "token_type_ids": torch.zeros(shape, dtype=torch.long)}
    other["attention_mask"][..., 0, 9:] = 0
    for batch in (inputs, other):
        with torch.no_grad():
            got, want = program.module()(**batch), model(**batch, **({"unpad": False} if name == "Model" else {}))
        for f in fields:
            a, b = getattr(got, f), getattr(want, f)
            mask = batch["attention_mask"].bool()
            if a.shape[: mask.dim()] == mask.shape:
                a, b = a[mask], b[mask]
            assert (a - b).abs().max() <= TOL, f


@pytest.mark.parametrize("name", list(HEADS))
def test_return_dict_false_gives_stock_tuples(name, tmp_path):
    """config.return_dict=False (or return_dict=False in the call) returns the stock tuple: the same
    fields in the same order as stock BERT's, loss first when labels are given."""
    stock = save_stock(name, tmp_path)
    ours = HEADS[name][0].from_pretrained(tmp_path, unpad_inputs=False).eval()
    inputs = inputs_for(name)
    inputs.update(labels_for(name, inputs))
    stock.config.return_dict = False
    ours.config.return_dict = False
    with torch.no_grad():
        want, got = stock(**inputs), ours(**inputs)
        called = ours(**inputs, return_dict=True)
    assert isinstance(got, tuple) and len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and (a - b).abs().max() <= TOL
    assert not isinstance(called, tuple)


def test_attn_implementation_eager_and_sdpa_are_both_honoured(monkeypatch):
    torch.manual_seed(0)
    config = BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB)
    sdpa = BertSuiteModel(config).eval()
    assert sdpa.config._attn_implementation == "sdpa"
    eager = BertSuiteModel(BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB, attn_implementation="eager")).eval()
    eager.load_state_dict(sdpa.state_dict())
    inputs = inputs_for("Model")
    with torch.no_grad():
        want = sdpa(**inputs).last_hidden_state

        def refuse(*args, **kwargs):
            raise AssertionError("SDPA called under attn_implementation='eager'")

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", refuse)
        got = eager(**inputs)
        assert (got.last_hidden_state - want).abs().max() <= TOL
        probs = eager(**inputs, output_attentions=True).attentions
        assert len(probs) == 2 and torch.allclose(probs[0].sum(-1), torch.ones(()), atol=1e-5)
        sdpa.set_attn_implementation("eager")  # switched at run time, as transformers models allow
        assert (sdpa(**inputs).last_hidden_state - want).abs().max() <= TOL
        with pytest.raises(ValueError, match="'paged|eager' is not supported by bert_suite"):
            sdpa.set_attn_implementation("paged|eager")  # transformers knows it, we do not: refused, kept
        assert sdpa.config._attn_implementation == "eager"


@pytest.mark.parametrize("value", ["flash_attention_2", "flex_attention", "no_such_kernel"])
def test_unsupported_attn_implementation_is_a_clear_error(value):
    with pytest.raises(ValueError, match=f"attn_implementation='{value}' is not supported by bert_suite; expected one of: sdpa, eager"):
        BertSuiteModel(BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB, attn_implementation=value))


def test_decoder_inputs_and_flags_are_clear_errors():
    model = BertSuiteModel(BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB)).eval()
    ids = torch.ones(2, 5, dtype=torch.long)
    for kwargs in ({"encoder_hidden_states": torch.zeros(2, 5, 128)}, {"past_key_values": ()}, {"use_cache": True}):
        with pytest.raises(ValueError, match="encoders only"):
            model(ids, **kwargs)
    assert model(ids, use_cache=False).last_hidden_state.shape == (2, 5, 128)
    with pytest.raises(BertSuiteConfigError, match="add_cross_attention=True is not supported: bert_suite is encoder-only"):
        BertSuiteConfig(add_cross_attention=True)
    # stock's is_decoder without cross-attention is causal self-attention: the LTR switch
    config = BertSuiteConfig(is_decoder=True)
    assert config.causal_attention and config.is_decoder


def test_next_sentence_prediction_head_through_the_auto_class(tmp_path):
    torch.manual_seed(0)
    stock = transformers.BertForNextSentencePrediction(BertConfig(**STOCK_CONFIG)).eval()
    stock.save_pretrained(tmp_path)
    import bert_suite  # noqa: F401  (registers the family)

    ours = BertSuiteForNextSentencePrediction.from_pretrained(tmp_path).eval()
    assert type(AutoModelForNextSentencePrediction.from_config(ours.config)) is BertSuiteForNextSentencePrediction
    inputs = inputs_for("ForNextSentencePrediction")
    with torch.no_grad():
        assert (ours(**inputs).logits - stock(**inputs).logits).abs().max() <= TOL
    # it learns: continuations (B from A's document, here its half of the vocabulary) against
    # random-document segments; held-out accuracy well above chance
    torch.manual_seed(0)
    model = BertSuiteForNextSentencePrediction(BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB)).train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)

    def pairs(n):
        a = 5 + torch.randint(0, 48, (n, 4), generator=g)
        not_next = torch.randint(0, 2, (n, 1), generator=g)
        b = 5 + not_next * 48 + torch.randint(0, 48, (n, 4), generator=g)
        types = torch.cat([torch.zeros_like(a), torch.ones_like(b)], 1)
        return torch.cat([a, b], 1), types, not_next.view(-1)  # 0 = IsNext

    for _ in range(150):
        ids, types, labels = pairs(32)
        model(input_ids=ids, token_type_ids=types, labels=labels).loss.backward()
        optim.step()
        optim.zero_grad()
    ids, types, labels = pairs(256)
    with torch.no_grad():
        accuracy = (model.eval()(input_ids=ids, token_type_ids=types).logits.argmax(-1) == labels).float().mean()
    assert accuracy > 0.8


def test_near_miss_in_a_checkpoint_is_one_cli_error(tmp_path, capsys):
    from bert_suite.cli import main

    model = BertSuiteForSequenceClassification(BertSuiteConfig.from_preset("tiny", vocab_size=VOCAB))
    model.save_pretrained(tmp_path / "ckpt")
    text = (tmp_path / "ckpt" / "config.json").read_text().replace('"hidden_size"', '"hiden_size"')
    (tmp_path / "ckpt" / "config.json").write_text(text)
    capsys.readouterr()
    assert main(["export", "--to", "bert", str(tmp_path / "ckpt"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ckpt/config.json: unknown config key 'hiden_size'; did you mean 'hidden_size'?" in err[0]


def test_finetune_with_torch_compile_learns(tmp_path):
    """`bert-suite finetune --torch_compile` (TrainingArguments' flag) compiles the model and still
    learns the pair task; aot_eager keeps the test fast, inductor is the default for users."""
    import json

    from bert_suite.cli import main

    data = write_rte_like(tmp_path / "data", n_train=300, n_dev=100)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    assert main(["finetune", "rte", *run_args(data, tmp_path / "run", "--learning_rate", "1e-3", "--num_train_epochs",
                                               "3", "--per_device_train_batch_size", "16", "--torch_compile",
                                               "--torch_compile_backend", "aot_eager")]) == 0
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    assert json.loads((tmp_path / "run" / "all_results.json").read_text())["eval_accuracy"] > 0.85


def test_config_holds_what_transformers_config_tests_check(tmp_path):
    """The checks of transformers' ConfigTester, written here: any field value at construction (the
    model checks sizes), round trips through dict, JSON file and save_pretrained, num_labels and
    id2label kept in step, common PretrainedConfig arguments kept."""
    from bert_suite.configuration_bert_suite import BertSuiteConfig as C

    assert C().hidden_size == 768 and C(hidden_size=0).hidden_size == 0  # no model built yet
    config = C(vocab_size=99, hidden_size=37, num_attention_heads=4, num_labels=5, return_dict=False,
               output_hidden_states=True, chunk_size_feed_forward=5, problem_type="regression",
               architectures=["BertSuiteModel"], dtype="float16", tie_encoder_decoder=False)
    assert len(config.id2label) == 5 and config.return_dict is False and config.chunk_size_feed_forward == 5
    assert config.dtype == torch.float16 and config.tie_encoder_decoder is False
    assert C.from_dict(config.to_dict()).to_dict() == config.to_dict()
    config.to_json_file(tmp_path / "c.json")
    assert C.from_json_file(tmp_path / "c.json").to_dict() == config.to_dict()
    config.save_pretrained(tmp_path / "saved")
    again = C.from_pretrained(tmp_path / "saved")
    assert again.to_dict() == config.to_dict() and again.name_or_path == config.name_or_path
    config.save_pretrained(tmp_path / "sub" / "folder")
    assert C.from_pretrained(tmp_path / "sub", subfolder="folder").to_dict() == config.to_dict()
    config.num_labels = 3
    assert len(config.id2label) == 3 and len(config.label2id) == 3
    assert C.from_pretrained(tmp_path / "saved", num_labels=2).num_labels == 2
    with pytest.raises(BertSuiteConfigError, match="hidden_size must be positive"):
        BertSuiteModel(C(hidden_size=0))
