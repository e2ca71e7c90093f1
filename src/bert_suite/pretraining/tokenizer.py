"""Train a WordPiece vocabulary for pre-training on a corpus with `tokenizers` (step 1 of the
pre-training recipe). Loading and checking any tokenizer, this one included, is in `tokenization`."""

from __future__ import annotations

from pathlib import Path

from ..io import atomic_write_text
from ..tokenization import SPECIAL_TOKENS
from .text_files import check_input_files, file_encoding


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
