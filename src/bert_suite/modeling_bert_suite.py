"""The BertSuite model family: BERT (Devlin et al., 2018) read top to bottom.

embeddings -> encoder layers (self-attention through torch SDPA, feed-forward) -> pooler -> heads
-> models. Parameter names are those of stock `transformers` BERT, so stock checkpoints load
unchanged and export back. Every loss is computed in `forward` and returned in the library's
output dataclasses.

This file imports only torch, transformers and the config beside it: saved checkpoints carry a
copy of both files so that `AutoModel*.from_pretrained(dir, trust_remote_code=True)` works where
bert_suite is not installed.
"""

from __future__ import annotations

import os
import shutil
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPoolingAndCrossAttentions,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    NextSentencePredictorOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.models.bert.modeling_bert import BertForPreTrainingOutput

from .configuration_bert_suite import BertSuiteConfig, BertSuiteConfigError

# ---------------------------------------------------------------------------------------------
# Embeddings
# ---------------------------------------------------------------------------------------------


def _in_autocast_dtype(hidden: torch.Tensor, wanted: bool) -> torch.Tensor:
    """A LayerNorm's output (computed in fp32 under autocast) in the autocast dtype when `wanted` and autocast is on;
    as it is otherwise (fp32 runs are unchanged)."""
    device = hidden.device.type
    if wanted and torch.is_autocast_enabled(device):
        return hidden.to(torch.get_autocast_dtype(device))
    return hidden


def residual_in_autocast_dtype(model: nn.Module, on: bool = True) -> int:
    """Under autocast, keep the residual stream in the autocast dtype (bf16): every LayerNorm that closes a
    sub-layer (and the embeddings') computes in fp32 inside, as autocast runs it, and hands on bf16 instead of
    fp32, so the elementwise work between the matmuls reads and writes half the bytes and the next matmul needs
    no cast (what Megatron-LM and NVIDIA's BERT do by default). A setting of the run, not of the checkpoint
    (nothing is saved); fp32 runs are unchanged. Returns the number of LayerNorms it applies to."""
    found = [m for m in model.modules() if isinstance(m, (BertSuiteEmbeddings, BertSuiteResidualOutput))]
    for module in found:
        module.low_precision_residual = on
    return len(found)


class BertSuiteEmbeddings(nn.Module):
    """Token + segment + learned absolute position embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertSuiteConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.low_precision_residual = False  # `residual_in_autocast_dtype`

    def forward(self, input_ids, token_type_ids=None, position_ids=None, inputs_embeds=None):
        """(batch, seq) inputs, or flat (tokens,) ones with their position_ids (the unpadded path)."""
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        if position_ids is None:
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device)[None]
        embeddings = inputs_embeds + self.position_embeddings(position_ids)
        if token_type_ids is None:
            embeddings = embeddings + self.token_type_embeddings.weight[0]
        else:
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        return self.dropout(_in_autocast_dtype(self.LayerNorm(embeddings), self.low_precision_residual))


# ---------------------------------------------------------------------------------------------
# Encoder
# ---------------------------------------------------------------------------------------------


class _Rows(torch.autograd.Function):
    """rows = padded[index] (flat rows). The indices are unique, so the backward is a plain
    index_copy into zeros rather than autograd's generic index_add (several times slower on CPU)."""

    @staticmethod
    def forward(ctx, padded, index):
        ctx.save_for_backward(index)
        ctx.total = padded.shape[0]
        return padded.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        return grad.new_zeros((ctx.total, *grad.shape[1:])).index_copy_(0, index, grad), None


class _Padded(torch.autograd.Function):
    """padded = zeros with `rows` copied to `index`; the backward gathers the rows' gradients."""

    @staticmethod
    def forward(ctx, rows, index, total):
        ctx.save_for_backward(index)
        return rows.new_zeros((total, *rows.shape[1:])).index_copy_(0, index, rows)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        return grad.index_select(0, index), None, None


# Unpadding costs a gather and four scatters per layer; it pays when at least this share of the
# batch is padding (measured on CPU: benchmarks/RESULTS.md, "Performance").
UNPAD_MIN_PADDING = 0.1


# "sdpa": torch's scaled_dot_product_attention (the default); "eager": the explicit softmax(QK^T)V.
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


def _tracing() -> bool:
    """Under torch.compile or torch.export: no decision may read tensor values (a host sync and a
    graph break), so the mask is always applied as a bias and the padded path is taken."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


class Unpadded(NamedTuple):
    """Where the real tokens of a padded (batch, seq_len) batch are: their flat row indices. The
    dense layers run on the (tokens, width) rows; attention scatters them back into the padded
    layout, so each real token sees exactly the keys it sees in the padded computation."""

    index: torch.Tensor  # (tokens,) rows of the flattened batch * seq_len
    batch: int
    seq_len: int

    @classmethod
    def from_mask(cls, attention_mask, min_padding: float = UNPAD_MIN_PADDING):
        """None when less than `min_padding` of the batch is padding (the padded path is then as
        fast, without the gathers)."""
        keep = attention_mask.reshape(-1).to(torch.bool)
        index = keep.nonzero().squeeze(1)
        if index.numel() > (1 - min_padding) * keep.numel():
            return None
        return cls(index, *attention_mask.shape)

    def pad(self, rows):
        """(tokens, ...) -> (batch, seq_len, ...), zeros at padding positions."""
        padded = _Padded.apply(rows, self.index, self.batch * self.seq_len)
        return padded.view(self.batch, self.seq_len, *rows.shape[1:])

    def unpad(self, padded):
        """(batch, seq_len, ...) -> (tokens, ...)."""
        return _Rows.apply(padded.reshape(self.batch * self.seq_len, *padded.shape[2:]), self.index)


def attention_bias(attention_mask, seq_len, causal, dtype, device):
    """Additive attention bias (batch, 1, query, key) from a (batch, key) 0/1 mask, or None when
    nothing is masked so that SDPA can pick its fastest kernel. A large negative number rather
    than -inf keeps a fully padded row finite, as stock BERT does. `causal` adds the future
    positions' term; the model asks for it only with a padding mask (without one, the attention
    passes SDPA's `is_causal` instead of a bias)."""
    bias = None
    if attention_mask is not None:
        if attention_mask.dim() == 2:
            keep = attention_mask[:, None, None, :].to(torch.bool)
        elif attention_mask.dim() == 3:  # (batch, query, key)
            keep = attention_mask[:, None, :, :].to(torch.bool)
        else:
            keep = attention_mask.to(torch.bool)
        bias = torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(~keep, torch.finfo(dtype).min)
    if causal:
        future = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).triu(1)
        causal_bias = torch.zeros(seq_len, seq_len, dtype=dtype, device=device).masked_fill(future, torch.finfo(dtype).min)
        bias = causal_bias[None, None] if bias is None else (bias + causal_bias).clamp(min=torch.finfo(dtype).min)
    return bias


class BertSuiteSelfAttention(nn.Module):
    """Multi-head self-attention; the weighted sum runs in `F.scaled_dot_product_attention`."""

    def __init__(self, config: BertSuiteConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob
        self.config = config  # read at call time: `model.set_attn_implementation` may change it

    def forward(self, hidden_states, bias, output_attentions=False, layout: Unpadded | None = None):
        if layout is None:
            batch, seq_len, width = hidden_states.shape
        else:  # (tokens, width) rows: back to the padded layout for the attention only
            batch, seq_len, width = layout.batch, layout.seq_len, hidden_states.shape[-1]
        q, k, v = (
            (proj(hidden_states) if layout is None else layout.pad(proj(hidden_states)))
            .view(batch, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
            for proj in (self.query, self.key, self.value)
        )
        dropout_p = self.dropout_p if self.training else 0.0
        # A causal model without a padding mask gets no bias: SDPA's is_causal (flash / cuDNN kernels)
        causal = bias is None and self.config.causal_attention
        probs = None
        # "eager", or probabilities asked for (SDPA does not expose them): softmax(QK^T/sqrt(d) + bias) V
        if output_attentions or self.config._attn_implementation == "eager":
            if causal:
                bias = attention_bias(None, seq_len, True, q.dtype, q.device)
            scores = q @ k.transpose(-1, -2) / self.head_dim**0.5
            probs = (scores if bias is None else scores + bias).softmax(-1)
            context = F.dropout(probs, dropout_p, self.training) @ v
        else:  # the dropout runs inside the attention kernel
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, is_causal=causal)
        context = context.transpose(1, 2).reshape(batch, seq_len, width)
        return (context if layout is None else layout.unpad(context)), probs


class BertSuiteResidualOutput(nn.Module):
    """dense -> dropout -> LayerNorm(x + residual): closes both sub-layers of a BERT layer."""

    def __init__(self, config: BertSuiteConfig, in_features: int):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.low_precision_residual = False  # `residual_in_autocast_dtype`

    def forward(self, hidden_states, residual):
        return _in_autocast_dtype(self.LayerNorm(self.dropout(self.dense(hidden_states)) + residual),
                                  self.low_precision_residual)


class BertSuiteAttention(nn.Module):
    def __init__(self, config: BertSuiteConfig):
        super().__init__()
        self.self = BertSuiteSelfAttention(config)
        self.output = BertSuiteResidualOutput(config, config.hidden_size)

    def forward(self, hidden_states, bias, output_attentions=False, layout=None):
        context, probs = self.self(hidden_states, bias, output_attentions, layout)
        return self.output(context, hidden_states), probs


class BertSuiteIntermediate(nn.Module):
    def __init__(self, config: BertSuiteConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states):
        return self.intermediate_act_fn(self.dense(hidden_states))


class BertSuiteLayer(GradientCheckpointingLayer):
    def __init__(self, config: BertSuiteConfig):
        super().__init__()
        self.attention = BertSuiteAttention(config)
        self.intermediate = BertSuiteIntermediate(config)
        self.output = BertSuiteResidualOutput(config, config.intermediate_size)

    def forward(self, hidden_states, bias=None, output_attentions=False, layout=None):
        attended, probs = self.attention(hidden_states, bias, output_attentions, layout)
        return self.output(self.intermediate(attended), attended), probs


class BertSuiteEncoder(nn.Module):
    def __init__(self, config: BertSuiteConfig):
        super().__init__()
        self.layer = nn.ModuleList([BertSuiteLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(self, hidden_states, bias, output_hidden_states=False, output_attentions=False, layout=None):
        all_hidden = (hidden_states,) if output_hidden_states else None
        all_probs = () if output_attentions else None
        for layer in self.layer:
            hidden_states, probs = layer(hidden_states, bias, output_attentions, layout)
            if output_hidden_states:
                all_hidden += (hidden_states,)
            if output_attentions:
                all_probs += (probs,)
        return hidden_states, all_hidden, all_probs


class BertSuiteBiLSTM(nn.Module):
    """A one-layer bidirectional LSTM over the final hidden states (hidden_size / 2 units each way, so
    the output has the encoder's width): the paper's "+ BiLSTM" row of Table 5, added at fine-tuning
    on top of a left-to-right model so that every token also sees what follows it. It starts from
    random weights (it is not pre-trained) and reads each row's real tokens only, in order, whatever
    the padding (left or right): outputs at padding positions are zeros."""

    def __init__(self, config: BertSuiteConfig):
        super().__init__()
        if config.hidden_size % 2:
            raise BertSuiteConfigError(f"bilstm needs an even hidden_size (half each way), got {config.hidden_size}")
        self.lstm = nn.LSTM(config.hidden_size, config.hidden_size // 2, batch_first=True, bidirectional=True)

    def forward(self, hidden_states, attention_mask=None):
        if attention_mask is None or attention_mask.dim() != 2:
            return self.lstm(hidden_states)[0]
        keep = attention_mask.to(torch.bool)
        # each row's real tokens moved to its front, in order (a stable sort puts the 1s first), then packed
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)  # (batch, seq)
        front = hidden_states.gather(1, order[..., None].expand_as(hidden_states))
        lengths = keep.sum(1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(front, lengths, batch_first=True, enforce_sorted=False)
        rows, _ = nn.utils.rnn.pad_packed_sequence(self.lstm(packed)[0], batch_first=True,
                                                   total_length=hidden_states.shape[1])
        back = torch.empty_like(rows).scatter_(1, order[..., None].expand_as(rows), rows)
        return back * keep[..., None].to(back.dtype)


def last_real_positions(attention_mask, batch: int, seq_len: int, device):
    """(batch,) index of each row's last real token: the last position whose 2-D attention mask is 1
    (right or left padding alike); the last position when there is no mask (or a 3-D/4-D one)."""
    if attention_mask is None or attention_mask.dim() != 2:
        return torch.full((batch,), seq_len - 1, dtype=torch.long, device=device)
    positions = torch.arange(seq_len, device=device).expand(batch, seq_len)
    return torch.where(attention_mask.to(torch.bool), positions, -1).amax(-1).clamp(min=0)


class BertSuitePooler(nn.Module):
    """dense + tanh on one final hidden state per row, the input of every sequence-level head
    (classification, regression, multiple choice, NSP). A bidirectional model reads `[CLS]`
    (position 0: C in the paper). A causal (left-to-right) model reads its last real token, as
    left-to-right LMs do: there position 0 attends only to itself, so `[CLS]` would be the same
    vector for every input, while the last real token is the one position that has seen them all."""

    def __init__(self, config: BertSuiteConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()
        self.config = config  # causal_attention read at call time, as the attention reads its settings

    def forward(self, hidden_states, attention_mask=None):
        if self.config.causal_attention:
            batch, seq_len = hidden_states.shape[:2]
            rows = torch.arange(batch, device=hidden_states.device)
            pooled = hidden_states[rows, last_real_positions(attention_mask, batch, seq_len, hidden_states.device)]
        else:
            pooled = hidden_states[:, 0]
        return self.activation(self.dense(pooled))


# ---------------------------------------------------------------------------------------------
# Heads
# ---------------------------------------------------------------------------------------------


class BertSuitePredictionHeadTransform(nn.Module):
    def __init__(self, config: BertSuiteConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states):
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden_states)))


class BertSuiteLMPredictionHead(nn.Module):
    """Masked-LM head: transform, then the decoder tied to the word embeddings plus a bias."""

    def __init__(self, config: BertSuiteConfig):
        super().__init__()
        self.transform = BertSuitePredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states):
        return self.decoder(self.transform(hidden_states))


class BertSuiteMLMHead(nn.Module):
    """The masked-LM head with its loss in one module, so that a compiled step fuses the vocabulary
    projection with its cross-entropy (`bert_suite.pretraining.step.compile_regions`)."""

    def __init__(self, config: BertSuiteConfig):
        super().__init__()
        self.predictions = BertSuiteLMPredictionHead(config)

    def forward(self, sequence_output, labels=None, masked_positions_only=False, num_items_in_batch=None,
                masked_positions=None):
        """(logits, loss or None): see `masked_lm_logits_and_loss`."""
        return masked_lm_logits_and_loss(self.predictions, sequence_output, labels, masked_positions_only,
                                         num_items_in_batch, masked_positions)


class BertSuiteNSPHead(nn.Module):
    def __init__(self, config: BertSuiteConfig):
        super().__init__()
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class BertSuitePreTrainingHeads(BertSuiteMLMHead):
    """MLM + NSP heads and the summed loss (NSP absent when `config.use_nsp` is False: no such layer when the
    model is built so, and no NSP scores or loss while it is False at call time, as in the left-to-right phase
    of an objective schedule)."""

    def __init__(self, config: BertSuiteConfig):
        super().__init__(config)
        self.config = config  # use_nsp read at call time, as the attention reads causal_attention
        if config.use_nsp:
            self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(self, sequence_output, pooled_output, labels=None, next_sentence_label=None,
                masked_positions_only=False, num_items_in_batch=None, masked_positions=None):
        """(MLM logits, NSP logits or None, loss or None)."""
        logits, loss = super().forward(sequence_output, labels, masked_positions_only, num_items_in_batch,
                                       masked_positions)
        nsp_logits = scores_in_fp32(self.seq_relationship, pooled_output) if hasattr(self, "seq_relationship") \
            and self.config.use_nsp else None
        if loss is not None and nsp_logits is not None:
            if next_sentence_label is None:
                raise ValueError("labels were given without next_sentence_label; NSP needs both (or use_nsp=False)")
            loss = loss + F.cross_entropy(nsp_logits.view(-1, 2), next_sentence_label.view(-1))
        return logits, nsp_logits, loss


def scores_in_fp32(layer: nn.Linear, hidden_states):
    """`layer(hidden_states)` computed in fp32 under autocast (bf16 or fp16), as is otherwise.
    The output layers of the task heads are tiny (hidden x a few labels) but their scores decide
    labels, answer spans, word tags and SQuAD v2's null threshold, which bf16's 8-bit mantissa
    would round (two logits 0.3% apart can swap); the vocabulary decoder stays in autocast."""
    device = hidden_states.device.type
    if not torch.is_autocast_enabled(device):
        return layer(hidden_states)
    dtype = getattr(layer, "weight", hidden_states).dtype  # bf16 parameters (FSDP's bf16 mixed precision,
    with torch.autocast(device, enabled=False):             # a model cast to bf16): computed in their dtype
        if dtype != torch.float32:
            return layer(hidden_states.to(dtype)).float()
        return layer(hidden_states.float())


class SummedCrossEntropy(torch.autograd.Function):
    """The summed cross-entropy of `logits` (n, vocab) at `targets` (n,), its gradient made in the forward pass
    (softmax minus one-hot, kept in place of the log-probabilities): the CPU training path's MLM loss.
    `F.cross_entropy` writes the log-probabilities, then in backward fills a zero gradient, scatters into it and
    runs log-softmax's backward: six passes over (n, vocab) floats where this makes four. On the CPU these passes
    are a large share of a step when every position is predicted (the left-to-right objective: 6,000 positions
    x 8,192 pieces a tiny model's step, where the vocabulary projection is most of the arithmetic). The same
    loss and gradient up to rounding (tests/test_modeling.py); once differentiable (the gradient is scaled in
    place)."""

    @staticmethod
    def forward(ctx, logits, targets):
        x = logits.float()
        top = x.amax(-1, keepdim=True)
        grad = torch.sub(x, top).exp_()
        total = grad.sum(-1, keepdim=True)
        picked = x.gather(1, targets[:, None])
        grad.div_(total).scatter_add_(1, targets[:, None], torch.full_like(picked, -1.0))
        ctx.save_for_backward(grad)
        ctx.dtype = logits.dtype
        return (top + total.log() - picked).sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return grad.mul_(grad_output).to(ctx.dtype), None


def masked_lm_logits_and_loss(head, sequence_output, labels, masked_positions_only=False, num_items_in_batch=None,
                              masked_positions=None):
    """MLM logits at every position (the stock contract) and the mean cross-entropy over the
    positions whose label is not -100. With `masked_positions_only` (and labels), the logits are
    computed for the labelled positions only, shape (n_labelled, vocab): the same loss for a
    fraction of the cost, since the vocabulary projection dominates small models' pre-training.
    With `masked_positions` (batch, P), the original BERT's fixed number of predictions per sequence
    (`max_predictions_per_seq`), the logits are those of the positions it names, shape (batch, P,
    vocab), and `labels` are (batch, P) beside it, -100 in the unused entries: the same loss as
    `masked_positions_only`, with shapes that do not depend on the mask (no host sync; one compiled
    graph for every batch). With `num_items_in_batch` (transformers' name), the summed cross-entropy
    is divided by it instead of by this batch's count: a loss normalised over a whole accumulated,
    distributed batch."""
    reduction = "mean" if num_items_in_batch is None else "sum"
    if masked_positions is not None:
        if labels is not None and labels.shape != masked_positions.shape:
            raise ValueError(f"labels {tuple(labels.shape)} and masked_positions {tuple(masked_positions.shape)}: "
                             "with masked_positions, labels are the targets at those positions (the same shape)")
        width = sequence_output.shape[-1]
        chosen = sequence_output.gather(1, masked_positions[..., None].expand(-1, -1, width))  # (batch, P, width)
        logits = head(chosen)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                                   reduction=reduction)
    elif masked_positions_only and labels is not None:
        chosen = labels != -100
        logits = head(sequence_output[chosen])
        targets = labels[chosen]
        if logits.device.type == "cpu" and logits.requires_grad and not torch.compiler.is_compiling():
            loss = SummedCrossEntropy.apply(logits, targets)
            loss = loss if reduction == "sum" else loss / len(targets)
        else:
            loss = F.cross_entropy(logits, targets, reduction=reduction)
    else:
        logits = head(sequence_output)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                                   reduction=reduction)
    if loss is not None and num_items_in_batch is not None:
        loss = loss / num_items_in_batch
    return logits, loss


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------

_AUTO_MAP = {
    "AutoConfig": "configuration_bert_suite.BertSuiteConfig",
    "AutoModel": "modeling_bert_suite.BertSuiteModel",
    "AutoModelForPreTraining": "modeling_bert_suite.BertSuiteForPreTraining",
    "AutoModelForMaskedLM": "modeling_bert_suite.BertSuiteForMaskedLM",
    "AutoModelForNextSentencePrediction": "modeling_bert_suite.BertSuiteForNextSentencePrediction",
    "AutoModelForSequenceClassification": "modeling_bert_suite.BertSuiteForSequenceClassification",
    "AutoModelForQuestionAnswering": "modeling_bert_suite.BertSuiteForQuestionAnswering",
    "AutoModelForMultipleChoice": "modeling_bert_suite.BertSuiteForMultipleChoice",
    "AutoModelForTokenClassification": "modeling_bert_suite.BertSuiteForTokenClassification",
}


class CheckpointMismatchError(BertSuiteConfigError, RuntimeError):
    """Checkpoint tensors whose shapes do not fit the model. A RuntimeError as stock transformers
    raises, and a ValueError like every bad-input error of bert_suite."""


def _describe_mismatch(cls, folder: str, kwargs: dict) -> str:
    """Name the weight file, each tensor and both shapes, as stock does in its load report, in one
    message (transformers' exception itself only points at a logged table)."""
    from safetensors import safe_open

    config, _ = cls.config_class.from_pretrained(folder, return_unused_kwargs=True, **kwargs)
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in cls(config).state_dict().items()}
    problems = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.endswith(".safetensors"):
            with safe_open(path, "pt") as handle:
                found = {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}
        elif name.endswith(".bin"):
            found = {k: tuple(v.shape) for k, v in torch.load(path, map_location="cpu", weights_only=True).items()}
        else:
            continue
        for key, shape in found.items():
            for candidate in (key, f"bert.{key}", key.removeprefix("bert.")):
                if candidate in expected and expected[candidate] != shape:
                    problems.append(f"{name}: {key} has shape {shape}, the model expects {expected[candidate]}")
                    break
    detail = "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")
    return (f"{folder}: checkpoint tensors do not fit the model that config.json and the load arguments describe "
            f"(hidden_size={config.hidden_size}, vocab_size={config.vocab_size}, num_labels={config.num_labels}): {detail}. "
            "Pass ignore_mismatched_sizes=True to initialise them anew (e.g. a new head for another "
            "num_labels), or fix config.json")


def _check_attn_implementation(requested, where: str) -> None:
    if requested is not None and requested not in ATTN_IMPLEMENTATIONS:
        raise BertSuiteConfigError(f"{where}attn_implementation={requested!r} is not supported by bert_suite; "
                                   f"expected one of: {', '.join(ATTN_IMPLEMENTATIONS)}")


class BertSuitePreTrainedModel(PreTrainedModel):
    config_class = BertSuiteConfig
    base_model_prefix = "bert"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    # The attention reads config._attn_implementation at every call, so set_attn_implementation()
    # takes effect at once. transformers (5.23) decides that by looking for its attention-function
    # registry in the source and caches the answer in this private attribute; we give the answer.
    _can_set_attn_implementation_cached_value = True
    _no_split_modules = ["BertSuiteEmbeddings", "BertSuiteLayer"]

    def __init__(self, config: BertSuiteConfig, *inputs, **kwargs):
        where = f"{config.name_or_path}/config.json: " if config.name_or_path else ""
        try:
            config.check_sizes()
        except BertSuiteConfigError as err:
            raise BertSuiteConfigError(f"{where}{err}") from None
        _check_attn_implementation(config._attn_implementation, where)
        super().__init__(config, *inputs, **kwargs)

    def set_attn_implementation(self, attn_implementation, *args, **kwargs):
        """As transformers' (it applies at the next call here). transformers refuses names it does not
        know; what it knows and bert_suite lacks ("paged|eager", ...) is refused here, the old value kept."""
        previous = self.config._attn_implementation
        result = super().set_attn_implementation(attn_implementation, *args, **kwargs)
        try:
            _check_attn_implementation(self.config._attn_implementation, "")
        except BertSuiteConfigError:
            self.config._attn_implementation = previous
            raise
        return result

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)  # normal(0, initializer_range) linears/embeddings, unit LayerNorms
        if isinstance(module, BertSuiteLMPredictionHead):
            module.bias.zero_()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """Load a bert_suite or a stock BERT checkpoint (safetensors, or `.bin` read with
        `weights_only=True`: pickled code in a checkpoint is never run)."""
        if kwargs.get("weights_only") is False:
            raise ValueError("bert_suite reads .bin weights with weights_only=True only")
        kwargs["weights_only"] = True
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except RuntimeError as err:
            if "mismatched" not in str(err) or not os.path.isdir(pretrained_model_name_or_path):
                raise
            raise CheckpointMismatchError(_describe_mismatch(cls, str(pretrained_model_name_or_path), kwargs)) from None

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Write safetensors weights plus this file and the config's, with an `auto_map`, so the
        checkpoint loads with `trust_remote_code=True` where bert_suite is not installed."""
        self.config.auto_map = dict(_AUTO_MAP)
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            here = os.path.dirname(os.path.abspath(__file__))
            for name in ("configuration_bert_suite.py", "modeling_bert_suite.py"):
                shutil.copyfile(os.path.join(here, name), os.path.join(save_directory, name))
        return result

    def _encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                output_attentions, output_hidden_states, unpad=None):
        return self.bert(
            unpad=unpad,
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )

    def _finish(self, out, return_dict):
        """The output dataclass, or its non-None fields as a tuple in stock order when
        `return_dict` (default `config.return_dict`) is False."""
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return out if return_dict else out.to_tuple()


class BertSuiteModel(BertSuitePreTrainedModel):
    """The bare encoder: last hidden states and the pooled `[CLS]` vector."""

    def __init__(self, config: BertSuiteConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertSuiteEmbeddings(config)
        self.encoder = BertSuiteEncoder(config)
        self.bilstm = BertSuiteBiLSTM(config) if config.bilstm else None
        self.pooler = BertSuitePooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        unpad=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        past_key_values=None,
        use_cache=None,
    ):
        """`unpad` (default: `config.unpad_inputs` on the CPU, False on an accelerator): see
        `BertSuiteConfig`; it applies to padded batches with a (batch, seq) attention mask, not when
        attentions are returned and not under torch.compile / torch.export. By default the model also
        drops an all-ones mask on the CPU (reading the mask there costs nothing). With `unpad=False` the
        forward reads no tensor value on any device: no host sync, the same shapes for every batch of one
        size (what a compiled or graph-captured step needs); with `unpad=True` it reads them on any device."""
        _refuse_decoder_inputs(encoder_hidden_states, encoder_attention_mask, past_key_values, use_cache)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = (
            self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        batch, seq_len = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        if seq_len > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {seq_len} exceeds max_position_embeddings "
                f"({self.config.max_position_embeddings}); truncate the input"
            )
        # Reading the mask's values picks a faster path, and costs nothing on the CPU; on an accelerator it
        # is a host sync (the CPU waits for the device) and under compile a graph break. So the model reads
        # them only where `unpad` allows it, by default on the CPU alone; elsewhere the data pipeline
        # decides (no attention_mask for a batch without padding).
        device = (input_ids if input_ids is not None else inputs_embeds).device
        cpu = device.type == "cpu"
        reads_values = cpu if unpad is None else unpad
        unpad = self.config.unpad_inputs and cpu if unpad is None else unpad
        reads_values = reads_values and not _tracing() and attention_mask is not None and attention_mask.dim() == 2
        if reads_values and bool(attention_mask.all()):
            attention_mask = None  # nothing to mask: no bias, so SDPA adds no (batch, heads, q, k) term
        layout = None
        if reads_values and unpad and attention_mask is not None and not output_attentions:
            layout = Unpadded.from_mask(attention_mask)
        if layout is None:
            hidden = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        else:  # embed the real tokens only
            if position_ids is None:
                position_ids = torch.arange(seq_len, device=device)[None]
            rows = {name: None if t is None else layout.unpad(t.expand(batch, seq_len, *t.shape[2:]))
                    for name, t in (("input_ids", input_ids), ("token_type_ids", token_type_ids),
                                    ("position_ids", position_ids), ("inputs_embeds", inputs_embeds))}
            hidden = self.embeddings(**rows)
        causal = self.config.causal_attention and attention_mask is not None  # else SDPA's is_causal
        bias = attention_bias(attention_mask, seq_len, causal, hidden.dtype, hidden.device)
        sequence_output, all_hidden, all_probs = self.encoder(
            hidden, bias, output_hidden_states, output_attentions, layout)
        if layout is not None:
            sequence_output = layout.pad(sequence_output)
            all_hidden = None if all_hidden is None else tuple(layout.pad(h) for h in all_hidden)
        if self.bilstm is not None:  # every head (tokens, spans, the pooler) reads the BiLSTM's outputs
            sequence_output = self.bilstm(sequence_output, attention_mask)
        out = BaseModelOutputWithPoolingAndCrossAttentions(
            last_hidden_state=sequence_output,
            pooler_output=self.pooler(sequence_output, attention_mask) if self.pooler is not None else None,
            hidden_states=all_hidden,
            attentions=all_probs,
        )
        return self._finish(out, return_dict)


def _refuse_decoder_inputs(encoder_hidden_states, encoder_attention_mask, past_key_values, use_cache):
    """Stock BERT's decoder inputs: a clear error rather than a TypeError or a silently ignored value."""
    given = [name for name, value in (("encoder_hidden_states", encoder_hidden_states),
                                      ("encoder_attention_mask", encoder_attention_mask),
                                      ("past_key_values", past_key_values)) if value is not None]
    if use_cache:
        given.append("use_cache=True")
    if given:
        raise ValueError(f"{', '.join(given)}: bert_suite models are encoders only (the paper's BERT): no "
                         "cross-attention and no key/value cache; use transformers.BertLMHeadModel for a decoder")


class _BertSuiteWithLMHead(BertSuitePreTrainedModel):
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings
        self.cls.predictions.bias = new_embeddings.bias


class BertSuiteForPreTraining(_BertSuiteWithLMHead):
    """MLM + NSP. Loss = mean MLM cross-entropy over labelled positions + mean NSP cross-entropy
    (NSP left out when `config.use_nsp` is False: the paper's "No NSP" ablation). The MLM logits
    are computed at every position, at the labelled ones (`masked_positions_only`), or at the
    (batch, P) `masked_positions` with (batch, P) `labels` (static shapes: the compiled step's
    form); see `masked_lm_logits_and_loss`."""

    def __init__(self, config: BertSuiteConfig):
        super().__init__(config)
        self.bert = BertSuiteModel(config)
        self.cls = BertSuitePreTrainingHeads(config)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        next_sentence_label=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        masked_positions_only=False,
        num_items_in_batch=None,
        masked_positions=None,
        unpad=None,
    ):
        enc = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_attentions, output_hidden_states, unpad)
        logits, nsp_logits, loss = self.cls(enc.last_hidden_state, enc.pooler_output, labels, next_sentence_label,
                                            masked_positions_only, num_items_in_batch, masked_positions)
        out = BertForPreTrainingOutput(
            loss=loss,
            prediction_logits=logits,
            seq_relationship_logits=nsp_logits,
            hidden_states=enc.hidden_states,
            attentions=enc.attentions,
        )
        return self._finish(out, return_dict)


class BertSuiteForMaskedLM(_BertSuiteWithLMHead):
    def __init__(self, config: BertSuiteConfig):
        super().__init__(config)
        self.bert = BertSuiteModel(config, add_pooling_layer=False)
        self.cls = BertSuiteMLMHead(config)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        masked_positions_only=False,
        num_items_in_batch=None,
        masked_positions=None,
        unpad=None,
    ):
        enc = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_attentions, output_hidden_states, unpad)
        logits, loss = self.cls(enc.last_hidden_state, labels, masked_positions_only, num_items_in_batch,
                                masked_positions)
        out = MaskedLMOutput(loss=loss, logits=logits, hidden_states=enc.hidden_states, attentions=enc.attentions)
        return self._finish(out, return_dict)


class BertSuiteForNextSentencePrediction(BertSuitePreTrainedModel):
    """The NSP head alone: is segment B the continuation of segment A? Logits (IsNext, NotNext);
    `labels` 0 = IsNext, 1 = NotNext (Section 3.1, "Task #2")."""

    def __init__(self, config: BertSuiteConfig):
        super().__init__(config)
        self.bert = BertSuiteModel(config)
        self.cls = BertSuiteNSPHead(config)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
    ):
        enc = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_attentions, output_hidden_states)
        logits = scores_in_fp32(self.cls.seq_relationship, enc.pooler_output)
        loss = F.cross_entropy(logits.view(-1, 2), labels.view(-1)) if labels is not None else None
        out = NextSentencePredictorOutput(loss=loss, logits=logits, hidden_states=enc.hidden_states,
                                          attentions=enc.attentions)
        return self._finish(out, return_dict)


class _BertSuiteWithClassifier(BertSuitePreTrainedModel):
    """Encoder + dropout + a linear classifier with `num_outputs` outputs."""

    def __init__(self, config: BertSuiteConfig, num_outputs: int, add_pooling_layer: bool):
        super().__init__(config)
        self.bert = BertSuiteModel(config, add_pooling_layer=add_pooling_layer)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, num_outputs)
        self.post_init()


class BertSuiteForSequenceClassification(_BertSuiteWithClassifier):
    """Linear layer on the pooled `[CLS]` vector: softmax cross-entropy for classification, MSE
    when `num_labels == 1` (regression, e.g. STS-B), BCE for multi-label problems."""

    def __init__(self, config: BertSuiteConfig):
        super().__init__(config, config.num_labels, add_pooling_layer=True)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
    ):
        enc = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_attentions, output_hidden_states)
        logits = scores_in_fp32(self.classifier, self.dropout(enc.pooler_output))
        loss = None
        if labels is not None:
            problem = self.config.problem_type
            if problem is None:
                if self.config.num_labels == 1:
                    problem = "regression"
                elif labels.dtype in (torch.long, torch.int):
                    problem = "single_label_classification"
                else:
                    problem = "multi_label_classification"
            if problem == "regression":
                loss = F.mse_loss(logits.view(-1).float(), labels.view(-1).float()) if self.config.num_labels == 1 \
                    else F.mse_loss(logits, labels)
            elif problem == "single_label_classification":
                loss = F.cross_entropy(logits.view(-1, self.config.num_labels), labels.view(-1))
            else:
                loss = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
        out = SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=enc.hidden_states,
                                       attentions=enc.attentions)
        return self._finish(out, return_dict)


class BertSuiteForMultipleChoice(_BertSuiteWithClassifier):
    """Inputs (batch, choices, length); one score per choice from the pooled vector; softmax over
    the choices."""

    def __init__(self, config: BertSuiteConfig):
        super().__init__(config, 1, add_pooling_layer=True)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
    ):
        num_choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]

        def flat(t):
            return None if t is None else t.reshape(-1, *t.shape[2:])

        enc = self._encode(flat(input_ids), flat(attention_mask), flat(token_type_ids), flat(position_ids),
                           flat(inputs_embeds), output_attentions, output_hidden_states)
        logits = scores_in_fp32(self.classifier, self.dropout(enc.pooler_output)).view(-1, num_choices)
        loss = F.cross_entropy(logits, labels.view(-1)) if labels is not None else None
        out = MultipleChoiceModelOutput(loss=loss, logits=logits, hidden_states=enc.hidden_states,
                                        attentions=enc.attentions)
        return self._finish(out, return_dict)


class BertSuiteForTokenClassification(_BertSuiteWithClassifier):
    """A label per token (first sub-token of each word carries the label, others -100)."""

    def __init__(self, config: BertSuiteConfig):
        super().__init__(config, config.num_labels, add_pooling_layer=False)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
    ):
        enc = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_attentions, output_hidden_states)
        logits = scores_in_fp32(self.classifier, self.dropout(enc.last_hidden_state))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, self.config.num_labels), labels.view(-1), ignore_index=-100)
        out = TokenClassifierOutput(loss=loss, logits=logits, hidden_states=enc.hidden_states,
                                    attentions=enc.attentions)
        return self._finish(out, return_dict)


class BertSuiteForQuestionAnswering(BertSuitePreTrainedModel):
    """Start vector S and end vector E (one linear layer with two outputs) over every token;
    loss = mean of the start and end cross-entropies. Positions outside the sequence are ignored."""

    def __init__(self, config: BertSuiteConfig):
        super().__init__(config)
        self.bert = BertSuiteModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        start_positions=None,
        end_positions=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
    ):
        # The stock loss includes the logits at padding positions, computed from the padding
        # tokens: keep the padded computation so that training is the stock one. An all-ones mask
        # changes nothing and is dropped, on the CPU, where reading it costs nothing (as the encoder does).
        if (attention_mask is not None and attention_mask.dim() == 2 and attention_mask.device.type == "cpu"
                and not _tracing() and bool(attention_mask.all())):
            attention_mask = None
        enc = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_attentions, output_hidden_states, unpad=False)
        start_logits, end_logits = scores_in_fp32(self.qa_outputs, enc.last_hidden_state).unbind(-1)
        start_logits, end_logits = start_logits.contiguous(), end_logits.contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            ignored = start_logits.shape[1]  # out-of-window targets are clamped here and ignored
            start = start_positions.view(-1).clamp(0, ignored)
            end = end_positions.view(-1).clamp(0, ignored)
            loss = (F.cross_entropy(start_logits, start, ignore_index=ignored)
                    + F.cross_entropy(end_logits, end, ignore_index=ignored)) / 2
        out = QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits,
                                           hidden_states=enc.hidden_states, attentions=enc.attentions)
        return self._finish(out, return_dict)


__all__ = [
    "BertSuiteForMaskedLM",
    "BertSuiteForMultipleChoice",
    "BertSuiteForNextSentencePrediction",
    "BertSuiteForPreTraining",
    "BertSuiteForQuestionAnswering",
    "BertSuiteForSequenceClassification",
    "BertSuiteForTokenClassification",
    "BertSuiteModel",
    "BertSuitePreTrainedModel",
    "CheckpointMismatchError",
]
