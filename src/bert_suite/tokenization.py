"""Loading tokenizers, for fine-tuning and pre-training alike, and the checks a BERT vocabulary must pass.

- `load_tokenizer(model, tokenizer)`: what `finetune`, `grid`, `predict` and `features` use: the
  `--tokenizer` given, else the model's own; a bare `vocab.txt` or released BERT folder goes
  through `load_pretraining_tokenizer`.
- `load_pretraining_tokenizer(path)`: a tokenizer folder, a folder holding only `vocab.txt`, or a
  bare `vocab.txt`, checked to hold BERT's special tokens (pre-training needs them all).
- `wordpiece_tokenizer(vocab_file)`: a BERT tokenizer over a bare vocabulary, casing detected.

Training a new vocabulary is pre-training's first step: `pretraining/tokenizer.py`."""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MIN_SEQ_LENGTH = 8  # the shortest max_seq_length any command accepts


def check_max_seq_length(value: int, name: str = "max_seq_length") -> int:
    """`value` when a sequence that long has room for [CLS] A [SEP] B [SEP] with text in A and B, else a
    ValueError naming `name` (the flag or config key); the one check for fine-tuning and pre-training."""
    if value < MIN_SEQ_LENGTH:
        raise ValueError(f"{name} must be at least {MIN_SEQ_LENGTH} (room for [CLS] A [SEP] B [SEP]), got {value}")
    return value


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded or used; the message names the source and what to pass instead."""


def load_tokenizer(model: str, tokenizer: str | None = None):
    """The tokenizer for fine-tuning or predicting with `model`: `tokenizer` when given, else the model's."""
    from transformers import AutoTokenizer

    source = tokenizer or model
    if source.startswith("preset:"):
        raise TokenizerError(f"--model {model} starts from random weights and needs --tokenizer (a folder or "
                             "vocab.txt)")
    path = Path(source)
    if path.is_dir() and (path / "vocab.txt").is_file() and not (path / "tokenizer_config.json").is_file():
        path = path / "vocab.txt"  # a released BERT folder: vocab.txt (+ bert_config.json) only
    if path.suffix == ".txt" and path.is_file():
        # checks the special tokens: a missing one would be appended past the model's embeddings
        return load_pretraining_tokenizer(str(path))
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise TokenizerError(f"cannot load a tokenizer from {source!r} ({str(err).splitlines()[0][:200]}); offline, "
                             "pass a local checkpoint folder with --model, or a vocab.txt / tokenizer folder with "
                             "--tokenizer") from None


def wordpiece_tokenizer(vocab_file: Path):
    """A BERT tokenizer over a bare vocab.txt; lower-cases when the vocabulary has no capitals
    (as the released uncased vocabularies)."""
    from transformers import BertTokenizer

    tokens = Path(vocab_file).read_text(encoding="utf-8").splitlines()
    cased = sum(t[:1].isascii() and t[:1].isupper() for t in tokens) > 10
    return BertTokenizer(vocab=str(vocab_file), do_lower_case=not cased)


def load_pretraining_tokenizer(path: str):
    """A fast BERT tokenizer from a tokenizer folder, a folder holding only `vocab.txt`, or a bare
    `vocab.txt` (used as is; casing detected from the vocabulary). The vocabulary must contain
    `[PAD] [UNK] [CLS] [SEP] [MASK]`."""
    from transformers import AutoTokenizer

    where = Path(path)
    if where.is_dir():
        if (where / "tokenizer.json").is_file() or (where / "tokenizer_config.json").is_file():
            source = where / "tokenizer.json" if (where / "tokenizer.json").is_file() else where
            tokenizer = AutoTokenizer.from_pretrained(str(where))
        elif (where / "vocab.txt").is_file():
            source = where / "vocab.txt"
            tokenizer = wordpiece_tokenizer(source)
        else:
            raise TokenizerError(f"{where}: expected a tokenizer folder (tokenizer.json) or a vocab.txt in it")
    elif where.is_file():
        source = where
        if where.stat().st_size == 0:
            raise TokenizerError(f"{where}: the vocabulary file is empty; expected one token per line, with "
                             + " ".join(SPECIAL_TOKENS))
        tokenizer = wordpiece_tokenizer(where)
    else:
        raise TokenizerError(f"{where}: no such tokenizer folder or vocab.txt")
    check_bert_vocabulary(tokenizer, str(source))
    return tokenizer


def check_bert_vocabulary(tokenizer, source: str | None = None) -> dict[str, int]:
    """The ids of BERT's special tokens; a ValueError naming `source` when one is missing or the
    tokenizer is not a fast (tokenizers-backed) one, which batch tokenisation relies on."""
    source = source or getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
    if not getattr(tokenizer, "is_fast", False):
        raise TokenizerError(f"{source}: a fast (tokenizers-backed) tokenizer is needed, got {type(tokenizer).__name__}")
    # The WordPiece vocabulary itself, not tokens transformers appended: it adds a missing special
    # token past the end of the vocabulary, which a model sized to the vocabulary cannot embed.
    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False)
    for token in SPECIAL_TOKENS:
        if token not in vocab:
            raise TokenizerError(f"{source}: the vocabulary has no {token} token; a BERT vocabulary needs "
                             + " ".join(SPECIAL_TOKENS))
    return {token: vocab[token] for token in SPECIAL_TOKENS}
