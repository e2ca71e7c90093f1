"""Loading tokenizers, for fine-tuning and pre-training alike, and the checks a BERT vocabulary must pass.

- `load_tokenizer(model, tokenizer)`: what `finetune`, `grid`, `predict` and `features` use: the
  `--tokenizer` given, else the model's own; a bare `vocab.txt` or released BERT folder goes
  through `load_pretraining_tokenizer`.
- `load_pretraining_tokenizer(path)`: a tokenizer folder, a folder holding only `vocab.txt`, or a
  bare `vocab.txt`, checked to hold BERT's special tokens (pre-training needs them all).
- `wordpiece_tokenizer(vocab_file)`: a BERT tokenizer over a bare vocabulary, casing detected.
- `load_wordpiece(path)`: the same sources as `load_pretraining_tokenizer`, on the `tokenizers` library alone
  (`WordPiece`): what the data commands use, so that they start without transformers and torch.

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
    return BertTokenizer(vocab=str(vocab_file), do_lower_case=not _cased(tokens))


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


def _cased(tokens: list[str]) -> bool:
    """A vocabulary with capitals is cased (the released uncased ones have none)."""
    return sum(t[:1].isascii() and t[:1].isupper() for t in tokens) > 10


def bert_backend(tokens: list[str], lowercase: bool, strip_accents: bool | None = None):
    """BERT's WordPiece pipeline over `tokens` (in id order) on the `tokenizers` library: the normaliser
    (`strip_accents` None: as `lowercase`), pre-tokeniser, `[CLS] A [SEP] B [SEP]` template and decoder that
    transformers' BertTokenizer builds, with the special tokens marked as such."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece as WordPieceModel

    backend = Tokenizer(WordPieceModel(vocab={t: i for i, t in enumerate(tokens)}, unk_token="[UNK]",
                                       continuing_subword_prefix="##"))
    backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                    strip_accents=strip_accents, lowercase=lowercase)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(t, tokens.index(t)) for t in ("[CLS]", "[SEP]") if t in tokens])
    backend.decoder = decoders.WordPiece(prefix="##")
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS if t in tokens])
    return backend


class WordPiece:
    """A BERT WordPiece tokenizer on the `tokenizers` library alone: what building pre-training instances and a
    vocabulary need (the ids of many sentences at once, the vocabulary), without transformers, which imports
    torch. It gives the ids transformers' BertTokenizer gives for the same files (tests/test_data_commands.py)."""

    is_fast = True

    def __init__(self, backend, name_or_path: str = ""):
        self.backend_tokenizer, self.name_or_path = backend, name_or_path

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    # the special tokens' ids, as a transformers tokenizer names them (the masking collator reads these)
    pad_token_id = property(lambda self: self.backend_tokenizer.token_to_id("[PAD]"))
    unk_token_id = property(lambda self: self.backend_tokenizer.token_to_id("[UNK]"))
    cls_token_id = property(lambda self: self.backend_tokenizer.token_to_id("[CLS]"))
    sep_token_id = property(lambda self: self.backend_tokenizer.token_to_id("[SEP]"))
    mask_token_id = property(lambda self: self.backend_tokenizer.token_to_id("[MASK]"))

    @property
    def all_special_ids(self) -> list[int]:
        return [i for t in SPECIAL_TOKENS if (i := self.backend_tokenizer.token_to_id(t)) is not None]

    def __call__(self, texts: list[str], add_special_tokens: bool = True, **_) -> dict[str, list[list[int]]]:
        """{"input_ids": [ids per text]} (as a transformers tokenizer returns for a batch)."""
        if isinstance(texts, str):
            raise TypeError("WordPiece takes a list of texts")
        encodings = self.backend_tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return {"input_ids": [e.ids for e in encodings]}


def load_wordpiece(path: str) -> WordPiece:
    """`load_pretraining_tokenizer`'s sources (a tokenizer folder, a folder holding only vocab.txt, a bare
    vocab.txt), checked alike, as a `WordPiece` (no transformers). The folder's tokenizer.json is used as is;
    a bare vocabulary gets BERT's pipeline, lower-cased when it has no capitals."""
    import json

    from tokenizers import Tokenizer

    where = Path(path)
    vocab = where / "vocab.txt" if where.is_dir() else where
    if where.is_dir() and (where / "tokenizer.json").is_file():
        source, tokenizer = where / "tokenizer.json", WordPiece(Tokenizer.from_file(str(where / "tokenizer.json")),
                                                                  str(where))
    elif where.is_dir() and (where / "tokenizer_config.json").is_file() and vocab.is_file():
        config = json.loads((where / "tokenizer_config.json").read_text(encoding="utf-8"))
        tokens = vocab.read_text(encoding="utf-8").splitlines()
        source, tokenizer = vocab, WordPiece(bert_backend(tokens, config.get("do_lower_case", True),
                                                          config.get("strip_accents")), str(where))
    elif vocab.is_file():
        if vocab.stat().st_size == 0:
            raise TokenizerError(f"{vocab}: the vocabulary file is empty; expected one token per line, with "
                                 + " ".join(SPECIAL_TOKENS))
        tokens = vocab.read_text(encoding="utf-8").splitlines()
        source, tokenizer = vocab, WordPiece(bert_backend(tokens, not _cased(tokens)))
    elif where.is_dir():
        raise TokenizerError(f"{where}: expected a tokenizer folder (tokenizer.json) or a vocab.txt in it")
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
