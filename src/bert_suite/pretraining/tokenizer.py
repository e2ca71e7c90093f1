"""WordPiece tokenizers for pre-training: train one on a corpus with `tokenizers`, or load an
existing one (a tokenizer folder or a bare BERT `vocab.txt`), and check it has BERT's special tokens."""

from __future__ import annotations

from pathlib import Path

from ..io import atomic_write_text

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def check_input_files(files: list[str]) -> list[Path]:
    """The files as paths; a missing, non-regular or empty file is a ValueError naming it."""
    if isinstance(files, (str, Path)):
        files = [files]
    if not files:
        raise ValueError("no input files given")
    paths = []
    for name in files:
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"{path}: no such file")
        if path.stat().st_size == 0:
            raise ValueError(f"{path}: the file is empty; expected text")
        paths.append(path)
    return paths


def train_tokenizer(files: list[str], vocab_size: int, lowercase: bool, output_dir: str, min_frequency: int = 2):
    """Train a BERT WordPiece tokenizer on text files and save it to `output_dir` (loadable with
    `AutoTokenizer.from_pretrained(output_dir)`, plus a `vocab.txt` for tools that want one).

    Special tokens `[PAD] [UNK] [CLS] [SEP] [MASK]` get ids 0..4. `lowercase` also strips accents,
    as in the released uncased BERT vocabularies. Returns the saved transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import WordPiece
    from transformers import BertTokenizer

    paths = check_input_files(files)
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size must be at least {len(SPECIAL_TOKENS) + 1} (the {len(SPECIAL_TOKENS)} special "
                         f"tokens and one more), got {vocab_size}")
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be at least 1, got {min_frequency}")

    backend = Tokenizer(WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    backend.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                    strip_accents=lowercase, lowercase=lowercase)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                        special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix="##",
                                        show_progress=True)
    from .instances import file_encoding  # here: instances imports this module

    encodings = [file_encoding(p) for p in paths]
    if all(encoding == "utf-8" for encoding in encodings):
        # Given paths, the Rust trainer reads the files line by line itself: the corpus is never
        # held as Python strings.
        backend.train([str(p) for p in paths], trainer)
    else:
        # The Rust reader accepts only UTF-8, so other files (old Gutenberg texts) are decoded
        # here and streamed in batches of lines.
        backend.train_from_iterator(_line_batches(paths, encodings), trainer)
    cls_id, sep_id = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    backend.decoder = decoders.WordPiece(prefix="##")

    # In transformers 5 BertTokenizer is the tokenizers-backed class; it rebuilds its pipeline from
    # the vocabulary and `do_lower_case`/`strip_accents` when loaded, so those must be saved too.
    tokenizer = BertTokenizer(tokenizer_object=backend, do_lower_case=lowercase, strip_accents=lowercase,
                              unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]",
                              mask_token="[MASK]")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))
    vocab = backend.get_vocab()
    atomic_write_text(out / "vocab.txt", "".join(f"{tok}\n" for tok, _ in sorted(vocab.items(), key=lambda kv: kv[1])))
    return tokenizer


def _line_batches(paths: list[Path], encodings: list[str], size: int = 1000):
    batch: list[str] = []
    for path, encoding in zip(paths, encodings, strict=True):
        with open(path, encoding="utf-8-sig" if encoding == "utf-8" else encoding, newline="\n") as f:
            for line in f:
                batch.append(line)
                if len(batch) == size:
                    yield batch
                    batch = []
    if batch:
        yield batch


def load_pretraining_tokenizer(path: str):
    """A fast BERT tokenizer from a tokenizer folder, a folder holding only `vocab.txt`, or a bare
    `vocab.txt` (used as is; casing detected from the vocabulary). The vocabulary must contain
    `[PAD] [UNK] [CLS] [SEP] [MASK]`."""
    from transformers import AutoTokenizer

    from ..runner import wordpiece_tokenizer

    where = Path(path)
    if where.is_dir():
        if (where / "tokenizer.json").is_file() or (where / "tokenizer_config.json").is_file():
            source = where / "tokenizer.json" if (where / "tokenizer.json").is_file() else where
            tokenizer = AutoTokenizer.from_pretrained(str(where))
        elif (where / "vocab.txt").is_file():
            source = where / "vocab.txt"
            tokenizer = wordpiece_tokenizer(source)
        else:
            raise ValueError(f"{where}: expected a tokenizer folder (tokenizer.json) or a vocab.txt in it")
    elif where.is_file():
        source = where
        if where.stat().st_size == 0:
            raise ValueError(f"{where}: the vocabulary file is empty; expected one token per line, with "
                             + " ".join(SPECIAL_TOKENS))
        tokenizer = wordpiece_tokenizer(where)
    else:
        raise ValueError(f"{where}: no such tokenizer folder or vocab.txt")
    check_bert_vocabulary(tokenizer, str(source))
    return tokenizer


def check_bert_vocabulary(tokenizer, source: str | None = None) -> dict[str, int]:
    """The ids of BERT's special tokens; a ValueError naming `source` when one is missing or the
    tokenizer is not a fast (tokenizers-backed) one, which batch tokenisation relies on."""
    source = source or getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{source}: a fast (tokenizers-backed) tokenizer is needed, got {type(tokenizer).__name__}")
    # The WordPiece vocabulary itself, not tokens transformers appended: it adds a missing special
    # token past the end of the vocabulary, which a model sized to the vocabulary cannot embed.
    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False)
    for token in SPECIAL_TOKENS:
        if token not in vocab:
            raise ValueError(f"{source}: the vocabulary has no {token} token; a BERT vocabulary needs "
                             + " ".join(SPECIAL_TOKENS))
    return {token: vocab[token] for token in SPECIAL_TOKENS}
