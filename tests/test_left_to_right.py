"""The left-to-right model of the paper's Table 5 ("LTR & No NSP") and its "+ BiLSTM" row: a causal model's
sequence-level outputs read the last real token (position 0 sees only itself), padding on either side changes
nothing, export refuses what stock BERT would compute otherwise, and the BiLSTM gives every token the right
context a left-to-right model lacks."""

import pytest
import torch
import transformers

from bert_suite import (
    BertSuiteConfig,
    BertSuiteForMultipleChoice,
    BertSuiteForPreTraining,
    BertSuiteForQuestionAnswering,
    BertSuiteForSequenceClassification,
    BertSuiteModel,
)
from bert_suite.export import ExportError, export_to_bert
from helpers import STOCK_CONFIG, TOL, VOCAB


def causal_model(cls=BertSuiteModel, **extra):
    torch.manual_seed(0)
    return cls(BertSuiteConfig(**STOCK_CONFIG, causal_attention=True, **extra)).eval()


def ids(rows=2, length=9, seed=3):
    return torch.randint(5, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_the_blind_classifier_of_the_issue_now_sees_its_input():
    """[CLS] 10 11 12 [SEP] and [CLS] 50 60 70 [SEP] gave the same logits when the causal model pooled position 0."""
    model = causal_model(BertSuiteForSequenceClassification, num_labels=2)
    a, b = model(torch.tensor([[2, 10, 11, 12, 3]])).logits, model(torch.tensor([[2, 50, 60, 70, 3]])).logits
    assert (a - b).abs().max() > 1e-4
    # what the old pooler read, position 0, is indeed the same for both inputs in a causal model
    first = [model.bert(torch.tensor([row])).last_hidden_state[0, 0] for row in ([2, 10, 11, 12, 3], [2, 50, 60, 70, 3])]
    assert torch.equal(first[0], first[1])


@torch.no_grad()
@pytest.mark.parametrize("unpad", [True, False], ids=["unpadded", "padded"])
def test_changing_token_j_changes_only_positions_from_j_and_always_the_pooled_vector(unpad):
    model = causal_model(unpad_inputs=unpad)
    base = ids(1, 9)
    mask = torch.ones_like(base)
    mask[0, 7:] = 0  # two padding positions, so the unpadded path runs too
    out = model(base, attention_mask=mask)
    for j in range(7):  # every real position, [CLS]'s included
        changed = base.clone()
        changed[0, j] = 4 if base[0, j] != 4 else 5
        other = model(changed, attention_mask=mask)
        assert torch.equal(other.last_hidden_state[0, :j], out.last_hidden_state[0, :j]), j  # exactly equal before j
        assert (other.last_hidden_state[0, j:7] - out.last_hidden_state[0, j:7]).abs().amax(-1).min() > 1e-6, j
        assert (other.pooler_output - out.pooler_output).abs().max() > 1e-6, j
    changed = base.clone()
    changed[0, 8] = 4 if base[0, 8] != 4 else 5  # a padding token: nothing changes
    assert torch.equal(model(changed, attention_mask=mask).pooler_output, out.pooler_output)


@torch.no_grad()
def test_right_padding_changes_nothing_and_a_batch_equals_its_rows_one_by_one():
    model = causal_model()
    rows = [ids(1, n, seed=n)[0] for n in (9, 6, 3)]
    batch = torch.zeros(3, 12, dtype=torch.long)
    mask = torch.zeros_like(batch)
    for r, row in enumerate(rows):
        batch[r, :len(row)], mask[r, :len(row)] = row, 1
    out = model(batch, attention_mask=mask)
    for r, row in enumerate(rows):
        alone = model(row[None])
        assert (out.pooler_output[r] - alone.pooler_output[0]).abs().max() <= TOL
        assert (out.last_hidden_state[r, :len(row)] - alone.last_hidden_state[0]).abs().max() <= TOL
        # the pooled vector is the last real token's, not the last position's
        expected = model.pooler.activation(model.pooler.dense(alone.last_hidden_state[0, -1]))
        assert (out.pooler_output[r] - expected).abs().max() <= TOL


@torch.no_grad()
def test_a_left_padded_batch_pools_its_last_real_token():
    model = causal_model()
    row = ids(1, 6)[0]
    left = torch.cat([torch.zeros(4, dtype=torch.long), row])[None]
    mask = torch.cat([torch.zeros(4, dtype=torch.long), torch.ones(6, dtype=torch.long)])[None]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # the real tokens at positions 0..5, as unpadded
    padded = model(left, attention_mask=mask, position_ids=positions)
    alone = model(row[None])
    assert (padded.pooler_output - alone.pooler_output).abs().max() <= TOL
    assert (padded.last_hidden_state[0, 4:] - alone.last_hidden_state[0]).abs().max() <= TOL


@torch.no_grad()
def test_the_bidirectional_model_still_pools_cls():
    torch.manual_seed(0)
    model = BertSuiteModel(BertSuiteConfig(**STOCK_CONFIG)).eval()
    out = model(ids())
    expected = model.pooler.activation(model.pooler.dense(out.last_hidden_state[:, 0]))
    assert torch.equal(out.pooler_output, expected)


@torch.no_grad()
def test_multiple_choice_and_nsp_read_each_rows_last_real_token():
    choice = causal_model(BertSuiteForMultipleChoice)
    rows = ids(4, 7).view(2, 2, 7)
    mask = torch.ones_like(rows)
    mask[:, 1, 5:] = 0
    logits = choice(rows, attention_mask=mask).logits
    changed = rows.clone()
    changed[:, 1, 4] = 4  # the last real token of the second choice
    assert ((choice(changed, attention_mask=mask).logits - logits)[:, 1].abs() > 1e-6).all()
    nsp = causal_model(BertSuiteForPreTraining)
    a, b = ids(1, 7, seed=5), ids(1, 7, seed=6)
    assert (nsp(a).seq_relationship_logits - nsp(b).seq_relationship_logits).abs().max() > 1e-5


def test_export_refuses_a_causal_classifier_and_keeps_causal_token_heads_identical(tmp_path):
    causal_model(BertSuiteForSequenceClassification, num_labels=2).save_pretrained(tmp_path / "cls")
    with pytest.raises(ExportError, match=r"pools its last real token.*stock BertForSequenceClassification pools "
                                          r"position 0"):
        export_to_bert(tmp_path / "cls", tmp_path / "cls-stock")
    assert not (tmp_path / "cls-stock").exists()
    ours = causal_model(BertSuiteForQuestionAnswering)
    ours.save_pretrained(tmp_path / "qa")
    export_to_bert(tmp_path / "qa", tmp_path / "qa-stock")
    stock = transformers.BertForQuestionAnswering.from_pretrained(tmp_path / "qa-stock").eval()
    assert stock.config.is_decoder
    inputs = {"input_ids": ids(2, 9), "attention_mask": torch.ones(2, 9, dtype=torch.long)}
    with torch.no_grad():
        a, b = ours(**inputs), stock(**inputs, use_cache=False)
    assert (a.start_logits - b.start_logits).abs().max() <= TOL


def test_export_refuses_a_bilstm_model(tmp_path):
    torch.manual_seed(0)
    BertSuiteForQuestionAnswering(BertSuiteConfig(**STOCK_CONFIG, bilstm=True)).save_pretrained(tmp_path / "m")
    with pytest.raises(ExportError, match="BiLSTM between the encoder and the head"):
        export_to_bert(tmp_path / "m", tmp_path / "out")


# ------------------------------------------------------------------------------------------------ + BiLSTM


@torch.no_grad()
def test_the_bilstm_reads_real_tokens_only_whatever_the_padding():
    torch.manual_seed(0)
    model = BertSuiteForQuestionAnswering(BertSuiteConfig(**STOCK_CONFIG, causal_attention=True, bilstm=True)).eval()
    row = ids(1, 6)[0]
    alone = model(row[None]).start_logits[0]
    right = model(torch.cat([row, torch.zeros(3, dtype=torch.long)])[None],
                  attention_mask=torch.tensor([[1] * 6 + [0] * 3])).start_logits[0, :6]
    mask = torch.tensor([[0] * 3 + [1] * 6])
    left = model(torch.cat([torch.zeros(3, dtype=torch.long), row])[None], attention_mask=mask,
                 position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).start_logits[0, 3:]
    assert (alone - right).abs().max() <= TOL and (alone - left).abs().max() <= TOL


def test_a_bilstm_starts_random_on_a_pretrained_checkpoint_and_depends_on_the_seed(tmp_path):
    torch.manual_seed(0)
    BertSuiteForPreTraining(BertSuiteConfig(**STOCK_CONFIG, causal_attention=True, use_nsp=False)).save_pretrained(tmp_path)
    weights = []
    for seed in (1, 1, 2):
        transformers.set_seed(seed)
        model = BertSuiteForQuestionAnswering.from_pretrained(tmp_path, bilstm=True)
        weights.append(model.bert.bilstm.lstm.weight_hh_l0.detach().clone())
        assert torch.isfinite(weights[-1]).all() and weights[-1].abs().sum() > 0
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], weights[2])
    plain = BertSuiteForQuestionAnswering.from_pretrained(tmp_path)
    assert plain.bert.bilstm is None  # off unless asked for: the checkpoint's config is unchanged


def toy_span_batch(generator, n=64, length=14):
    """Random tokens and, d = 1, 2 or 3 positions AFTER the answer token, a marker saying d (token 4 + d): a
    position must see the marker on its right to know it is the answer. A left-to-right model can only guess d
    (the last position before a marker, minus a guessed d: a third of the answers)."""
    tokens = torch.randint(10, VOCAB, (n, length), generator=generator)
    tokens[:, 0] = 2
    where = torch.randint(1, length - 3, (n,), generator=generator)
    distance = torch.randint(1, 4, (n,), generator=generator)
    tokens[torch.arange(n), where + distance] = 4 + distance
    return tokens, where


def span_accuracy(bilstm: bool, steps=80) -> float:  # the BiLSTM: all right from 80 steps (0.99 at 60)
    torch.manual_seed(0)
    config = BertSuiteConfig(**STOCK_CONFIG, causal_attention=True, bilstm=bilstm, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0)
    model = BertSuiteForQuestionAnswering(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        tokens, where = toy_span_batch(generator)
        loss = model(tokens, start_positions=where, end_positions=where).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    tokens, where = toy_span_batch(torch.Generator().manual_seed(99), n=256)
    with torch.no_grad():
        return (model(tokens).start_logits.argmax(-1) == where).float().mean().item()


def test_the_bilstm_learns_a_span_task_that_the_left_to_right_model_cannot():
    """The answer is marked by a token after it: a left-to-right encoder cannot see the marker from the answer's
    position (at best a third right); with the BiLSTM on top the backward direction does."""
    with_bilstm, without = span_accuracy(True), span_accuracy(False)
    assert with_bilstm > 0.9, with_bilstm
    assert without < 0.5, without
