"""Pre-training data: tokenizers, corpus formats, NSP instances, determinism, static masking, errors.

The corpora are written here. In the NSP corpus every sentence is one word repeated, `d<doc>s<sent>`,
so each token says which document and sentence it came from."""

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys

import pytest
from datasets import load_from_disk
from transformers import AutoTokenizer

import bert_suite_cli
from bert_suite.pretraining.instances import (
    build_part,
    build_pretraining_dataset,
    find_parts,
    format_stats,
    load_parts,
    truncated_lengths,
)
from bert_suite.pretraining.text_files import FORMATS, detect_format, iter_documents, split_sentences
from bert_suite.pretraining.tokenizer import train_tokenizer
from bert_suite.tokenization import SPECIAL_TOKENS, load_pretraining_tokenizer
from helpers import load_recipe

IGNORE = -100


def write_nsp_corpus(folder, documents: int, sentences: int, seed: int = 0, length: tuple[int, int] = (2, 6)):
    """A `lines` corpus and a matching vocab.txt; returns (corpus path, vocab path, id -> token)."""
    rng = random.Random(seed)
    lines, words = [], []
    for d in range(documents):
        for s in range(sentences):
            word = f"d{d}s{s}"
            words.append(word)
            lines.append(" ".join([word] * rng.randint(*length)))
        lines.append("")
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    vocab = folder / "vocab.txt"
    tokens = [*SPECIAL_TOKENS, *words]
    vocab.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return corpus, vocab, dict(enumerate(tokens))


def where_from(ids, id_to_token):
    """(doc, sentence) of each token id."""
    out = []
    for i in ids:
        doc, sent = id_to_token[i][1:].split("s")
        out.append((int(doc), int(sent)))
    return out


def split_pair(example, special):
    """(A ids, B ids) after checking the layout [CLS] A [SEP] B [SEP] and the segment ids."""
    ids, types = example["input_ids"], example["token_type_ids"]
    assert ids[0] == special["[CLS]"] and ids[-1] == special["[SEP]"]
    first_sep = ids.index(special["[SEP]"])
    a, b = ids[1:first_sep], ids[first_sep + 1: -1]
    assert a and b and special["[SEP]"] not in b
    assert types == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    return a, b


@pytest.fixture(scope="module")
def nsp_build(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nsp")
    corpus, vocab, id_to_token = write_nsp_corpus(folder, documents=60, sentences=12)
    stats = build_pretraining_dataset([str(corpus)], str(vocab), str(folder / "out"), max_seq_length=32,
                                      dupe_factor=5, short_seq_prob=0.1, fmt="lines", seed=7)
    tokenizer = load_pretraining_tokenizer(str(vocab))
    special = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    return load_from_disk(str(folder / "out")), stats, id_to_token, special, folder / "out"


def test_nsp_instances_follow_the_reference_layout_and_labels(nsp_build):
    dataset, stats, id_to_token, special, _ = nsp_build
    assert len(dataset) > 800
    not_next = full = 0
    for example in dataset:
        assert len(example["input_ids"]) <= 32
        full += len(example["input_ids"]) == 32
        a, b = split_pair(example, special)
        where_a, where_b = where_from(a, id_to_token), where_from(b, id_to_token)
        doc_a, doc_b = {d for d, _ in where_a}, {d for d, _ in where_b}
        assert len(doc_a) == 1 and len(doc_b) == 1, "a segment comes from one document"
        sents_a, sents_b = [s for _, s in where_a], [s for _, s in where_b]
        assert sents_a == sorted(sents_a) and sents_b == sorted(sents_b), "sentences stay in order"
        if example["next_sentence_label"] == 1:
            not_next += 1
            assert doc_a != doc_b, "a NotNext segment B never comes from A's document"
        else:
            assert doc_a == doc_b
            if len(example["input_ids"]) < 32:  # not truncated: B starts right after A
                assert sents_b[0] == sents_a[-1] + 1
            else:
                assert sents_b[0] > sents_a[-1]
    assert 0.4 < not_next / len(dataset) < 0.6
    assert stats["not_next_share"] == pytest.approx(not_next / len(dataset))
    assert 0 < stats["truncated"] <= full


def test_stats_file_matches_the_dataset(nsp_build):
    dataset, stats, _, _, out = nsp_build
    saved = json.loads((out / "pretrain_data_stats.json").read_text())
    assert saved == json.loads(json.dumps(stats))
    assert saved["instances"] == len(dataset)
    assert saved["tokens"] == sum(len(ids) for ids in dataset["input_ids"])
    assert saved["documents"] == 60 and saved["sentences"] == 720 and saved["skipped_empty_documents"] == 0
    assert saved["dupe_factor"] == 5 and saved["max_seq_length"] == 32 and saved["tokenizer_vocab_size"] == 725
    assert dataset.features["input_ids"].feature.dtype == "int32"
    assert dataset.features["token_type_ids"].feature.dtype == "int8"
    assert "labels" not in dataset.column_names
    assert "NotNext share" in format_stats(stats)


def test_short_target_share_follows_short_seq_prob(nsp_build, tmp_path):
    _, stats, _, _, _ = nsp_build
    # 300 document passes at 0.1: the per-document draw lands well inside this band.
    assert 0.03 < stats["short_target_document_share"] < 0.2
    assert stats["short_seq_share"] > 0
    corpus, vocab, _ = write_nsp_corpus(tmp_path, documents=20, sentences=6)
    never = build_pretraining_dataset([str(corpus)], str(vocab), str(tmp_path / "never"), max_seq_length=64,
                                      short_seq_prob=0.0, fmt="lines")
    always = build_pretraining_dataset([str(corpus)], str(vocab), str(tmp_path / "always"), max_seq_length=64,
                                       short_seq_prob=1.0, fmt="lines")
    assert never["short_seq_share"] == 0 and always["short_seq_share"] == 1
    assert always["instances"] > never["instances"]  # shorter targets cut documents into more pairs


def test_truncation_lengths_match_the_reference_loop():
    rng = random.Random(0)
    for _ in range(2000):
        a, b, limit = rng.randint(1, 80), rng.randint(1, 80), rng.randint(2, 100)
        ref_a, ref_b = a, b
        while ref_a + ref_b > limit:  # the reference: one token at a time from the longer (B on ties)
            if ref_a > ref_b:
                ref_a -= 1
            else:
                ref_b -= 1
        assert truncated_lengths(a, b, limit) == (ref_a, ref_b)


def test_same_seed_same_data_for_any_num_proc_and_static_masks(tmp_path):
    corpus, vocab, id_to_token = write_nsp_corpus(tmp_path, documents=20, sentences=8)
    common = dict(max_seq_length=24, fmt="lines", docs_per_shard=5, static_masking=True)
    one = build_pretraining_dataset([str(corpus)], str(vocab), str(tmp_path / "one"), num_proc=1, seed=3, **common)
    two = build_pretraining_dataset([str(corpus)], str(vocab), str(tmp_path / "two"), num_proc=2, seed=3, **common)
    build_pretraining_dataset([str(corpus)], str(vocab), str(tmp_path / "other"), num_proc=1, seed=4, **common)
    assert one["shards"] == 4 and one["instances"] == two["instances"]
    rows = {name: load_from_disk(str(tmp_path / name)).to_dict() for name in ("one", "two", "other")}
    assert rows["one"] == rows["two"]
    assert rows["one"] != rows["other"]
    # NotNext segments are drawn inside a shard (5 documents each here), never across shards.
    for ids, labels, nsp in zip(rows["one"]["input_ids"], rows["one"]["labels"], rows["one"]["next_sentence_label"],
                                strict=True):
        original = [label if label != IGNORE else i for i, label in zip(ids, labels, strict=True)]
        docs = {d for d, _ in where_from([i for i in original if i >= len(SPECIAL_TOKENS)], id_to_token)}
        assert len({d // 5 for d in docs}) == 1
        assert (len(docs) == 2) == (nsp == 1)


def test_dupe_factor_repeats_the_corpus_with_new_static_masks(tmp_path):
    # Two sentences per document and no short targets: IsNext pairs are always "s0 | s1" of a
    # document, so the same pair appears in every round and the masks can be compared.
    corpus, vocab, _ = write_nsp_corpus(tmp_path, documents=40, sentences=2, length=(8, 12))
    tokenizer = load_pretraining_tokenizer(str(vocab))
    special_ids = {tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    common = dict(max_seq_length=32, fmt="lines", short_seq_prob=0.0, static_masking=True)
    once = build_pretraining_dataset([str(corpus)], tokenizer, str(tmp_path / "once"), dupe_factor=1, **common)
    thrice = build_pretraining_dataset([str(corpus)], tokenizer, str(tmp_path / "thrice"), dupe_factor=3, **common)
    assert 2.5 < thrice["instances"] / once["instances"] < 3.5
    dataset = load_from_disk(str(tmp_path / "thrice"))
    masks: dict[tuple, list[tuple]] = {}
    for example in dataset:
        ids, labels = example["input_ids"], example["labels"]
        assert len(ids) == len(labels) == len(example["token_type_ids"])
        predicted = [i for i, label in enumerate(labels) if label != IGNORE]
        assert 1 <= len(predicted) <= 20
        assert all(labels[i] not in special_ids for i in predicted), "never [CLS]/[SEP] as a target"
        original = tuple(label if label != IGNORE else i for i, label in zip(ids, labels, strict=True))
        if example["next_sentence_label"] == 0:
            masks.setdefault(original, []).append(tuple(predicted))
    repeated = [m for m in masks.values() if len(m) >= 2]  # the pair was IsNext in several rounds
    assert len(repeated) >= 10
    assert sum(len(set(m)) == len(m) for m in repeated) >= 0.9 * len(repeated), "each round draws new masks"


def test_train_tokenizer_saves_a_loadable_wordpiece(tmp_path):
    text = "The quick brown fox jumps over the lazy dog.\nA Quick Brown Dog naps.\n\nFoxes and dogs play.\n"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text * 20, encoding="utf-8")
    train_tokenizer([str(corpus)], vocab_size=120, lowercase=True, output_dir=str(tmp_path / "uncased"))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "uncased"))
    assert [loaded.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    encoded = loaded("The Quick brown fox.")["input_ids"]
    assert encoded[0] == 2 and encoded[-1] == 3
    assert loaded.decode(encoded, skip_special_tokens=True) == "the quick brown fox."
    pair = loaded("the fox", "the dog")
    assert pair["token_type_ids"] == [0] * 4 + [1] * 3
    vocab_lines = (tmp_path / "uncased" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab_lines == sorted(loaded.get_vocab(), key=loaded.get_vocab().get)
    assert load_pretraining_tokenizer(str(tmp_path / "uncased" / "vocab.txt")).get_vocab() == loaded.get_vocab()

    train_tokenizer([str(corpus)], vocab_size=120, lowercase=False, output_dir=str(tmp_path / "cased"))
    cased = load_pretraining_tokenizer(str(tmp_path / "cased"))
    assert cased.decode(cased("The Quick fox.")["input_ids"], skip_special_tokens=True) == "The Quick fox."


def test_wordpiece_merges_take_the_most_frequent_pair_and_break_ties_by_text():
    from bert_suite.pretraining.tokenizer import learn_wordpieces

    # ab and cd are equally frequent: the pair whose text sorts first is merged first
    assert learn_wordpieces({"ab": 3, "cd": 3}, 100, specials=("[PAD]",)) == ["[PAD]", "##b", "##d", "a", "c", "ab", "cd"]
    # abc x2, bc x5: b+##c (5) first; then ##b+##c and a+##b tie at 2 ("##b" < "a"); then a+##bc
    words = {"abc": 2, "bc": 5}
    alphabet = ["[PAD]", "##c", "b", "##b", "a"]
    assert learn_wordpieces(words, 100, specials=("[PAD]",)) == [*alphabet, "bc", "##bc", "abc"]
    assert learn_wordpieces(words, 100, min_frequency=3, specials=("[PAD]",)) == [*alphabet, "bc"]
    assert learn_wordpieces(words, 6, specials=("[PAD]",)) == [*alphabet, "bc"]
    assert learn_wordpieces(dict(reversed(words.items())), 100, specials=("[PAD]",)) == [*alphabet, "bc", "##bc", "abc"]
    # overlapping pairs merge left to right: ##a ##a ##a -> ##aa ##a; "aaaa" is learned in four merges
    assert learn_wordpieces({"aaaa": 1}, 100, 1, ("[PAD]",)) == ["[PAD]", "##a", "a", "##aa", "##aaa", "aaaa"]


def naive_wordpieces(word_counts: dict[str, int], vocab_size: int, min_frequency: int, specials=("[PAD]",)):
    """The merge rule written plainly (every pair counted anew before each merge): the reference the
    incremental learner must equal."""
    from collections import Counter

    words = {w: [w[0], *("##" + c for c in w[1:])] for w in word_counts}
    alphabet = Counter()
    for w, count in word_counts.items():
        for symbol in words[w]:
            alphabet[symbol] += count
    vocab = [*specials, *sorted(alphabet, key=lambda s: (-alphabet[s], s))]
    while len(vocab) < vocab_size:
        pairs = Counter()
        for w, count in word_counts.items():
            for pair in zip(words[w], words[w][1:], strict=False):
                pairs[pair] += count
        if not pairs:
            break
        (a, b), n = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        if n < min_frequency:
            break
        piece = a + b[2:]
        if piece not in vocab:
            vocab.append(piece)
        for w, symbols in words.items():
            out, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == (a, b):
                    out.append(piece)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            words[w] = out
    return vocab


@pytest.mark.parametrize("seed", range(18))
def test_the_wordpiece_learner_equals_the_plain_merge_rule(seed, monkeypatch):
    """Runs of one letter (a a a a: joined left to right), adjacent joins in one word (abab), pieces spelt
    by two merges, ties, rare pairs below min_frequency, at random; from seed 12 on, 150 words with every
    merge through the array path (a corpus this small would otherwise take the Python path for most)."""
    from bert_suite.pretraining import tokenizer
    from bert_suite.pretraining.tokenizer import learn_wordpieces

    if seed >= 12:
        monkeypatch.setattr(tokenizer, "SMALL", 0)

    rng = random.Random(seed)
    letters = "aab" if seed % 3 == 0 else "abcde"
    counts = {}
    for _ in range(150 if seed >= 12 else rng.randint(5, 60)):
        counts["".join(rng.choice(letters) for _ in range(rng.randint(1, 9)))] = rng.randint(1, 6)
    for min_frequency in (1, 2, 4):
        expected = naive_wordpieces(counts, 80, min_frequency)
        assert learn_wordpieces(dict(counts), 80, min_frequency, specials=("[PAD]",)) == expected, (counts, min_frequency)


def test_an_existing_vocab_is_used_as_is(tmp_path):
    tokens = [*SPECIAL_TOKENS, "hello", "world", "##s", ",", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    for source in (tmp_path / "vocab.txt", tmp_path):  # the file, or a folder holding only it
        tokenizer = load_pretraining_tokenizer(str(source))
        assert tokenizer.get_vocab() == {t: i for i, t in enumerate(tokens)}
        assert tokenizer("Hello worlds.", add_special_tokens=False)["input_ids"] == [5, 6, 7, 9]


def test_errors_name_the_file_and_the_expectation(tmp_path):
    corpus, vocab, _ = write_nsp_corpus(tmp_path, documents=3, sentences=3)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty.txt: the file is empty"):
        build_pretraining_dataset([str(corpus), str(empty)], str(vocab), str(tmp_path / "out"), fmt="lines")
    with pytest.raises(ValueError, match="empty.txt"):
        train_tokenizer([str(empty)], vocab_size=100, lowercase=True, output_dir=str(tmp_path / "tok"))
    with pytest.raises(ValueError, match="vocab_size must be at least 6"):
        train_tokenizer([str(corpus)], vocab_size=5, lowercase=True, output_dir=str(tmp_path / "tok"))
    single = tmp_path / "single.txt"
    single.write_text("one sentence.\nanother sentence.\n")
    with pytest.raises(ValueError, match=r"single\.txt: 1 document\(s\) with text; next-sentence prediction needs "
                                         "at least two"):
        build_pretraining_dataset([str(single)], str(vocab), str(tmp_path / "out"), fmt="lines")
    no_mask = tmp_path / "no_mask" / "vocab.txt"
    no_mask.parent.mkdir()
    no_mask.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
    with pytest.raises(ValueError, match=r"no_mask/vocab\.txt: the vocabulary has no \[MASK\] token"):
        load_pretraining_tokenizer(str(no_mask.parent))
    with pytest.raises(ValueError, match="max_seq_length must be at least 8"):
        build_pretraining_dataset([str(corpus)], str(vocab), str(tmp_path / "out"), max_seq_length=7)
    with pytest.raises(ValueError, match="dupe_factor"):
        build_pretraining_dataset([str(corpus)], str(vocab), str(tmp_path / "out"), dupe_factor=0)
    with pytest.raises(ValueError, match="missing.txt: no such file"):
        build_pretraining_dataset([str(tmp_path / "missing.txt")], str(vocab), str(tmp_path / "out"))


LINES_SAMPLE = "The cat sat.\nIt was happy.\nThen it slept.\n\nA new story begins.\nIt ends here!\n"
RAW_SAMPLE = ("CHAPTER I\n\nIt was a dark night, and Mr. Smith walked\nhome slowly. He met Dr. Jones on\n"
              "the way. \"Good evening,\" said he.\n\nThe next day came\nwith rain and wind.\n")
WIKI_SAMPLE = (" = Alpha = \n \n Alpha is a letter . It comes first in the 1 @,@ 000 @-@ year alphabet .\n"
               " \n = = History = = \n \n Greeks used it . \n \n = Empty = \n \n = Beta = \n \n Beta is second .\n")


def test_a_sentence_a_line_without_final_punctuation_is_lines_and_hard_wrapped_prose_stays_raw(tmp_path):
    """Headlines and lower-cased sentences (no final . ! ?) read as raw text would run together into a few huge
    "sentences"; lines that fill a width are wrapped prose whatever their punctuation."""
    words = "the market rose on news of a deal while rain fell across the north and the team won again".split()
    rng = random.Random(0)
    lengths = [min(60, 3 + int(rng.expovariate(1 / 8))) for _ in range(200)]  # words: skewed, as sentences are
    sentences = [" ".join(rng.choice(words) for _ in range(n)) for n in lengths]
    headlines = [s[0].upper() + s[1:] for s in sentences]
    prose, line = [], ""
    for word in " ".join(sentences).split():  # the same words wrapped at 70 columns, a blank line every 8 lines
        if len(line) + 1 + len(word) > 70:
            prose.append(line)
            line = word
            if len(prose) % 9 == 8:
                prose.append("")
        else:
            line = f"{line} {word}".strip()
    for name, lines, fmt in (("headlines", headlines, "lines"), ("lowercase", sentences, "lines"),
                             ("wrapped", prose, "raw"), ("few", headlines[:5], "raw")):
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        assert detect_format(tmp_path / f"{name}.txt") == fmt, name
    assert list(iter_documents(str(tmp_path / "headlines.txt"))) == [headlines]  # one document, a sentence a line
    assert max(len(s) for s in next(iter_documents(str(tmp_path / "wrapped.txt")))) > 4 * 70  # lines joined


def test_format_detection_and_reading(tmp_path):
    samples = {"lines": LINES_SAMPLE, "raw": RAW_SAMPLE, "wikitext": WIKI_SAMPLE}
    for fmt, text in samples.items():
        (tmp_path / f"{fmt}.txt").write_text(text, encoding="utf-8")
        assert detect_format(tmp_path / f"{fmt}.txt") == fmt

    assert list(iter_documents(str(tmp_path / "lines.txt"))) == [
        ["The cat sat.", "It was happy.", "Then it slept."], ["A new story begins.", "It ends here!"]]
    # raw: the whole file is one document; wrapped lines are joined, then split into sentences.
    assert list(iter_documents(str(tmp_path / "raw.txt"))) == [[
        "CHAPTER I", "It was a dark night, and Mr. Smith walked home slowly.", "He met Dr. Jones on the way.",
        "\"Good evening,\" said he.", "The next day came with rain and wind."]]
    counts = {}
    wiki = list(iter_documents(str(tmp_path / "wikitext.txt"), counts=counts))
    assert wiki == [["Alpha is a letter .", "It comes first in the 1,000-year alphabet .", "Greeks used it ."],
                    ["Beta is second ."]]
    assert counts == {"skipped_empty_documents": 1}  # the article "Empty" has no text


PARAGRAPHS_SAMPLE = ("The cat sat on the mat. It was happy there. Then it slept.\nThe dog came in. It barked twice!\n\n"
                     "A new story begins here. It is short.\nIt ends well. The end.\n")


def test_a_paragraph_a_line_is_split_into_sentences_and_keeps_its_documents(tmp_path):
    """A paragraph a line with blank lines between documents (Wikipedia extracts, the NLTK sample's State of the
    Union addresses): read as lines, each paragraph was one "sentence", cut at max_seq_length; read as raw, the
    file would be one document. `paragraphs` splits each line and keeps the blank-line documents."""
    path = tmp_path / "paragraphs.txt"
    path.write_text(PARAGRAPHS_SAMPLE, encoding="utf-8")
    assert detect_format(path) == "paragraphs"
    documents = [["The cat sat on the mat.", "It was happy there.", "Then it slept.", "The dog came in.",
                  "It barked twice!"], ["A new story begins here.", "It is short.", "It ends well.", "The end."]]
    assert list(iter_documents(str(path))) == list(iter_documents(str(path), "paragraphs")) == documents
    assert [len(d) for d in iter_documents(str(path), "lines")] == [2, 2]  # the old reading: a paragraph a sentence
    # a sentence a line with a few lines of two (under 10%) stays lines: its lines are not split
    mostly = [f"Sentence number {i} is here." for i in range(30)] + ['"Go!" He ran.']
    (tmp_path / "mostly.txt").write_text("\n".join(mostly) + "\n", encoding="utf-8")
    assert detect_format(tmp_path / "mostly.txt") == "lines"
    assert list(iter_documents(str(tmp_path / "mostly.txt")))[0][-1] == '"Go!" He ran.'
    # and so does a short one: fewer than 3 lines of several sentences (here 1 of 4) do not make paragraphs
    (tmp_path / "short.txt").write_text("\n".join(mostly[:3] + ['"Go!" He ran.']) + "\n", encoding="utf-8")
    assert detect_format(tmp_path / "short.txt") == "lines"
    (tmp_path / "three.txt").write_text("\n".join(['"Go!" He ran.'] * 3 + mostly[:27]) + "\n", encoding="utf-8")
    assert detect_format(tmp_path / "three.txt") == "paragraphs"  # 3 of 30: 10%, and 3
    # the instance builder plans its shards by the same documents (byte spans) and reads the same sentences
    tokenizer = train_tokenizer([str(path)], vocab_size=120, lowercase=True, output_dir=str(tmp_path / "tok"),
                                min_frequency=1)
    for fmt in ("auto", "paragraphs"):
        stats = build_pretraining_dataset([str(path)], tokenizer, str(tmp_path / fmt), max_seq_length=16, fmt=fmt)
        assert stats["formats"] == {str(path): "paragraphs"}
        assert stats["documents"] == 2 and stats["sentences"] == 9, stats
    # both commands take it, and every format the readers know
    parser = bert_suite_cli.build_parser()
    for command in ("pretrain-data", "decontaminate"):
        action = next(a for a in parser._subparsers._group_actions[0].choices[command]._actions
                      if "--format" in a.option_strings)
        assert list(action.choices) == list(FORMATS), command


def test_sentence_splitter_keeps_abbreviations_and_initials():
    text = ('Mr. Brown met Dr. Grey at 5 p.m. Sunday. "Is it far?" she asked. They left, e.g. by train, '
            "i.e. quickly. J. R. R. Tolkien wrote it (in 1937.) 2 copies sold! The U.S. Army came.")
    assert split_sentences(text) == [
        "Mr. Brown met Dr. Grey at 5 p.m. Sunday.", '"Is it far?" she asked.',
        "They left, e.g. by train, i.e. quickly.", "J. R. R. Tolkien wrote it (in 1937.)", "2 copies sold!",
        "The U.S. Army came."]
    assert split_sentences("no capital after. this stays together") == ["no capital after. this stays together"]


def test_documents_without_tokens_are_skipped_counted_and_reported(tmp_path):
    corpus, vocab, _ = write_nsp_corpus(tmp_path, documents=6, sentences=3)
    # Control characters survive reading but the tokenizer's normaliser removes them: an empty
    # sentence, and a document with nothing but that. With two documents per shard, the first
    # shard keeps one document and borrows NotNext segments from its neighbour.
    corpus.write_text("\x01\x02\n\n" + corpus.read_text().replace("d1s1 d1s1", "\x03 \x04\n" + "d1s1 d1s1", 1))
    stats = build_pretraining_dataset([str(corpus)], str(vocab), str(tmp_path / "out"), fmt="lines",
                                      docs_per_shard=2)
    assert stats["documents"] == 6 and stats["skipped_empty_documents"] == 1
    assert stats["sentences"] == 18 and stats["skipped_empty_sentences"] == 2  # one in each
    assert "1 empty documents, 2 sentences without tokens" in format_stats(stats)
    nothing = tmp_path / "nothing.txt"
    nothing.write_text("\x01\n\n\x02\n\n\x03\n\n\x04\n")
    for num_proc in (1, 2):  # the worker's error comes through as a ValueError from a worker process too
        with pytest.raises(ValueError, match=r"nothing\.txt bytes 0-\d+: 0 document\(s\) with tokens"):
            build_pretraining_dataset([str(nothing)], str(vocab), str(tmp_path / "out"), fmt="lines",
                                      docs_per_shard=2, num_proc=num_proc)


def test_a_line_of_unicode_white_space_separates_documents_for_the_shard_planner_as_for_the_reader(tmp_path):
    """The shard planner finds documents in bytes, the reader in text: a line holding only a no-break space is
    blank to str.strip, not to bytes.strip. The planner counted one document where the reader found two, and
    refused a two-document file ("1 document(s) with text")."""
    text = "The first story starts.\nIt goes on.\n\u00a0\nThe second story.\nIt ends.\n"
    for encoding in ("utf-8", "cp1252"):
        path = tmp_path / f"{encoding}.txt"
        path.write_bytes(text.encode(encoding))
        assert len(list(iter_documents(str(path), "lines"))) == 2
        tokenizer = train_tokenizer([str(path)], vocab_size=60, lowercase=True, output_dir=str(tmp_path / f"tok-{encoding}"),
                                    min_frequency=1)
        stats = build_pretraining_dataset([str(path)], tokenizer, str(tmp_path / encoding), max_seq_length=16,
                                          fmt="lines")
        assert stats["documents"] == 2 and stats["sentences"] == 4, (encoding, stats)


def test_windows_1252_text_is_decoded_and_reported(tmp_path):
    # Older Project Gutenberg books are Latin-1/Windows-1252, not UTF-8.
    old = tmp_path / "old.txt"
    old.write_bytes("Caf\u00e9 society met C\u00e6sar.\nIt rained.\n\nA second story.\nIt ended.\n".encode("cp1252") * 5)
    assert list(iter_documents(str(old)))[0][:2] == ["Caf\u00e9 society met C\u00e6sar.", "It rained."]
    tokenizer = train_tokenizer([str(old)], vocab_size=80, lowercase=True, output_dir=str(tmp_path / "tok"),
                                min_frequency=1)
    assert "##\u00e6" in tokenizer.get_vocab() or "\u00e6" in tokenizer.get_vocab()
    stats = build_pretraining_dataset([str(old)], tokenizer, str(tmp_path / "out"), max_seq_length=16)
    assert stats["not_utf8_files"] == {str(old): "cp1252"} and stats["formats"] == {str(old): "lines"}
    assert f"not UTF-8, read as cp1252: {old}" in format_stats(stats)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\x81\x8d\x8f\x90\x9d text")  # invalid in both UTF-8 and Windows-1252
    with pytest.raises(ValueError, match=r"binary\.txt: line 1 \(byte 0\): invalid start byte: the file is neither UTF-8"):
        build_pretraining_dataset([str(binary), str(old)], tokenizer, str(tmp_path / "out"))


def test_balance_nsp_makes_one_sentence_documents_isnext_half_the_time(tmp_path):
    """The reference makes every one-sentence chunk NotNext; --balance_nsp cuts such a sentence at a random token
    instead, half the time, so that B is A's own continuation (IsNext)."""
    corpus, vocab, id_to_token = write_nsp_corpus(tmp_path, documents=300, sentences=1, length=(3, 8))
    reference = build_pretraining_dataset([str(corpus)], str(vocab), str(tmp_path / "ref"), max_seq_length=32,
                                          fmt="lines", seed=3)
    assert reference["not_next_share"] == 1.0 and reference["balance_nsp"] is False
    stats = build_pretraining_dataset([str(corpus)], str(vocab), str(tmp_path / "bal"), max_seq_length=32,
                                      fmt="lines", seed=3, balance_nsp=True)
    assert 0.44 < stats["not_next_share"] < 0.56 and stats["balance_nsp"] is True
    special = {t: i for i, t in id_to_token.items() if t in SPECIAL_TOKENS}
    lengths = {line.split()[0]: len(line.split()) for line in corpus.read_text().split("\n") if line}
    for example in load_from_disk(str(tmp_path / "bal")):
        a, b = split_pair(example, special)
        if example["next_sentence_label"] == 0:  # one sentence, cut in two: the same word on both sides
            words = {id_to_token[i] for i in a + b}
            assert len(words) == 1 and len(a) + len(b) == lengths[words.pop()]


# The default output on this corpus, computed with the code as it was before --balance_nsp existed: the
# reference algorithm's instances must not move when the option is off.
REFERENCE_DIGEST = "a8aaed4b7ce5876ae7236157acc22e6bf2d2e8b1d4aadcc54281a13eeb6399d3"


def test_the_default_output_is_the_reference_algorithms_as_before_balance_nsp(tmp_path):
    corpus, vocab, _ = write_nsp_corpus(tmp_path, documents=40, sentences=5, length=(2, 9))
    build_pretraining_dataset([str(corpus)], str(vocab), str(tmp_path / "out"), max_seq_length=32, fmt="lines",
                              seed=5, dupe_factor=2)
    data = load_from_disk(str(tmp_path / "out"))
    found = json.dumps([list(data["input_ids"]), list(data["next_sentence_label"])])
    assert hashlib.sha256(found.encode()).hexdigest() == REFERENCE_DIGEST


# ------------------------------------------------------------------------------------ parts (--num_shards)


def part_rows(folder, count):
    """Rows of part folders 0..count-1 of `folder`, concatenated by hand (column -> values)."""
    rows: dict[str, list] = {}
    for index in range(count):
        for column, values in load_from_disk(str(folder / f"part-{index:05d}-of-{count:05d}")).to_dict().items():
            rows.setdefault(column, []).extend(values)
    return rows


def test_parts_built_in_separate_processes_are_the_single_build_in_order(tmp_path):
    """Three `pretrain-data --shard_index` processes at once into one folder (one of them with two workers)
    give, in part order, the rows of the one-folder build: every column, static masks included."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(40)]
    # The CLI cuts internal shards at 2,000 documents: 8,000 two-sentence documents make four, so the
    # parts are shards [0, 1), [1, 2) and [2, 4) and the last one has work for two processes.
    lines = [line for _ in range(8000) for line in
             (" ".join(rng.choices(words, k=rng.randint(2, 5))), " ".join(rng.choices(words, k=rng.randint(2, 5))), "")]
    corpus, vocab = tmp_path / "corpus.txt", tmp_path / "vocab.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    vocab.write_text("\n".join([*SPECIAL_TOKENS, *words]) + "\n", encoding="utf-8")
    common = ["--input", str(corpus), "--tokenizer", str(vocab), "--max_seq_length", "32", "--format", "lines",
              "--seed", "11", "--static_masking"]
    runs = [subprocess.Popen([sys.executable, "-m", "bert_suite.cli", "pretrain-data", *common, "--output_dir",
                              str(tmp_path / "parts"), "--num_shards", "3", "--shard_index", str(index),
                              *(["--num_proc", "2"] if index == 2 else [])],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for index in range(3)]
    single = build_pretraining_dataset([str(corpus)], str(vocab), str(tmp_path / "one"), max_seq_length=32,
                                       fmt="lines", seed=11, static_masking=True, num_proc=1)
    for index, run in enumerate(runs):
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
        assert f"wrote {tmp_path / 'parts' / f'part-{index:05d}-of-00003'}" in out
    assert single["shards"] == 4
    assert sorted(os.listdir(tmp_path / "parts")) == [f"part-{i:05d}-of-00003" for i in range(3)]  # no leftovers
    stats = [json.loads((tmp_path / "parts" / f"part-{i:05d}-of-00003" / "pretrain_data_stats.json").read_text())
             for i in range(3)]
    assert [s["internal_shards"] for s in stats] == [[0, 1], [1, 2], [2, 4]]
    assert [s["shard_index"] for s in stats] == [0, 1, 2] and {s["num_shards"] for s in stats} == {3}
    assert sum(s["instances"] for s in stats) == single["instances"]
    rows, expected = part_rows(tmp_path / "parts", 3), load_from_disk(str(tmp_path / "one")).to_dict()
    assert sorted(rows) == sorted(expected) == ["input_ids", "labels", "next_sentence_label", "token_type_ids"]
    for column in expected:
        assert rows[column] == expected[column], column


@pytest.fixture(scope="module")
def parts_build(tmp_path_factory):
    """A corpus of eight internal shards (four documents each), built in one folder and in three parts."""
    folder = tmp_path_factory.mktemp("parts")
    corpus, vocab, _ = write_nsp_corpus(folder, documents=30, sentences=4)
    common = dict(max_seq_length=32, fmt="lines", docs_per_shard=4, seed=5, dupe_factor=2)
    single = build_pretraining_dataset([str(corpus)], str(vocab), str(folder / "one"), **common)
    parts = build_pretraining_dataset([str(corpus)], str(vocab), str(folder / "all"), num_shards=3, **common)
    return folder, corpus, vocab, common, single, parts


def test_all_parts_in_one_call_equal_the_separate_calls(parts_build, tmp_path):
    folder, corpus, vocab, common, single, parts = parts_build
    assert single["shards"] == 8 and "shard_index" not in single
    assert [p["internal_shards"] for p in parts] == [[0, 2], [2, 5], [5, 8]]
    assert [p["shards"] for p in parts] == [2, 3, 3] and {p["corpus_shards"] for p in parts} == {8}
    assert "part 1 of parts 0-2: internal shards 2-4 of 8" in format_stats(parts[1])
    separate = [build_part([str(corpus)], str(vocab), str(tmp_path / "separate"), 3, index, **common)
                for index in range(3)]
    assert separate == parts
    for index in range(3):
        name = f"part-{index:05d}-of-00003"
        assert load_from_disk(str(tmp_path / "separate" / name)).to_dict() == \
            load_from_disk(str(folder / "all" / name)).to_dict(), name
    assert load_parts(folder / "all").to_dict() == load_from_disk(str(folder / "one")).to_dict()
    # --num_shards 1 --shard_index 0: the one-folder build's rows, in a part folder
    whole = build_part([str(corpus)], str(vocab), str(tmp_path / "whole"), 1, 0, **common)
    assert whole["internal_shards"] == [0, 8] and os.listdir(tmp_path / "whole") == ["part-00000-of-00001"]
    assert load_parts(tmp_path / "whole").to_dict() == load_from_disk(str(folder / "one")).to_dict()
    # A finished part built again is replaced whole (here with another seed), leaving nothing beside it.
    before = load_from_disk(str(tmp_path / "separate" / "part-00001-of-00003")).to_dict()
    build_part([str(corpus)], str(vocab), str(tmp_path / "separate"), 3, 1, **dict(common, seed=6))
    assert sorted(os.listdir(tmp_path / "separate")) == [f"part-{i:05d}-of-00003" for i in range(3)]
    assert load_from_disk(str(tmp_path / "separate" / "part-00001-of-00003")).to_dict() != before
    with pytest.raises(ValueError, match=r"part-00001-of-00003: seed 6 differs from part-00000-of-00003's 5"):
        find_parts(tmp_path / "separate")


def test_a_part_borrows_notnext_segments_across_its_boundary_as_the_single_build_does(tmp_path):
    # As in test_documents_without_tokens_...: the first shard keeps one document with tokens and borrows
    # NotNext segments from the second, which here is another part.
    corpus, vocab, _ = write_nsp_corpus(tmp_path, documents=6, sentences=3)
    corpus.write_text("\x01\x02\n\n" + corpus.read_text())
    common = dict(fmt="lines", docs_per_shard=2, seed=2)
    single = build_pretraining_dataset([str(corpus)], str(vocab), str(tmp_path / "one"), **common)
    parts = build_pretraining_dataset([str(corpus)], str(vocab), str(tmp_path / "parts"), num_shards=3, **common)
    assert single["shards"] == 3 and [p["internal_shards"] for p in parts] == [[0, 1], [1, 2], [2, 3]]
    assert parts[0]["documents"] == 1 and parts[0]["instances"] > 0
    assert load_parts(tmp_path / "parts").to_dict() == load_from_disk(str(tmp_path / "one")).to_dict()


def test_the_recipe_loads_a_folder_of_parts_and_refuses_an_incomplete_one(parts_build, tmp_path):
    folder, _, _, _, single, _ = parts_build
    recipe = load_recipe()
    data = recipe.load_instances(str(folder / "all"), 512, "train_data")
    assert data.to_dict() == load_from_disk(str(folder / "one")).to_dict()
    assert len(recipe.load_instances(str(folder / "one"), 512, "train_data")) == single["instances"]  # as before
    with pytest.raises(SystemExit, match=r"train_data .*all: max_seq_length 32 exceeds the model's 16 positions"):
        recipe.load_instances(str(folder / "all"), 16, "train_data")

    # part 1 as a killed build leaves it: under its hidden temporary name, never taken as finished
    broken = tmp_path / "broken"
    shutil.copytree(folder / "all", broken)
    os.rename(broken / "part-00001-of-00003", broken / ".part-00001-of-00003.tmp-0badc0de")
    with pytest.raises(SystemExit, match=r"train_data .*broken: part\(s\) 1 of 3 missing or unfinished .*"
                                         r"unfinished builds \(killed, or still running\): "
                                         r"\.part-00001-of-00003\.tmp-0badc0de"):
        recipe.load_instances(str(broken), 512, "train_data")
    (broken / ".part-00001-of-00003.tmp-0badc0de").rename(broken / "part-00001-of-00003")
    (broken / "part-00002-of-00003" / "pretrain_data_stats.json").unlink()  # unfinished: no statistics
    with pytest.raises(SystemExit, match=r"part\(s\) 2 of 3 missing or unfinished"):
        recipe.load_instances(str(broken), 512, "train_data")

    only_temporary = tmp_path / "only_temporary"
    (only_temporary / ".part-00000-of-00002.tmp-1234abcd").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"train_data .*only_temporary: part\(s\) 0, 1 of 2 missing or unfinished"):
        recipe.load_instances(str(only_temporary), 512, "train_data")

    mixed = tmp_path / "mixed"
    shutil.copytree(folder / "all", mixed)
    stats_file = mixed / "part-00002-of-00003" / "pretrain_data_stats.json"
    stats_file.write_text(json.dumps(dict(json.loads(stats_file.read_text()), max_seq_length=64)))
    with pytest.raises(SystemExit, match=r"part-00002-of-00003: max_seq_length 64 differs from part-00000-of-00003's 32"):
        recipe.load_instances(str(mixed), 512, "train_data")


def test_bad_part_arguments_are_refused_before_anything_is_written(tmp_path, capsys):
    corpus, vocab, _ = write_nsp_corpus(tmp_path, documents=30, sentences=4)
    out = tmp_path / "out"
    common = dict(fmt="lines", docs_per_shard=4)  # eight internal shards
    for settings, message in [
            (dict(num_shards=3, shard_index=3), "shard_index 3 is not below num_shards 3: the parts are numbered 0 to 2"),
            (dict(num_shards=3, shard_index=-1), "shard_index must be at least 0, got -1"),
            (dict(num_shards=0), "num_shards must be at least 1, got 0"),
            (dict(num_shards=9, shard_index=0), r"num_shards 9: the corpus is too small for 9 parts; it makes 8 internal "
                                                r"shard\(s\) \(runs of whole documents, up to 4 documents"),
            (dict(num_shards=9), "the corpus is too small for 9 parts")]:
        with pytest.raises(ValueError, match=message):
            build_pretraining_dataset([str(corpus)], str(vocab), str(out), **common, **settings)
        assert not out.exists(), settings
    with pytest.raises(ValueError, match="build_part needs a shard_index"):
        build_part([str(corpus)], str(vocab), str(out), 3, None)
    # A part that fails midway (its documents have no tokens) takes its temporary folder with it.
    nothing = tmp_path / "nothing.txt"
    nothing.write_text("\x01\n\n\x02\n\n\x03\n\n\x04\n")
    with pytest.raises(ValueError, match="0 document\\(s\\) with tokens"):
        build_part([str(nothing)], str(vocab), str(out), 2, 1, fmt="lines", docs_per_shard=2)
    assert os.listdir(out) == []
    shutil.rmtree(out)
    base = ["pretrain-data", "--input", str(corpus), "--tokenizer", str(vocab), "--format", "lines",
            "--output_dir", str(out)]
    for flags, message in [(["--num_shards", "3", "--shard_index", "3"], "shard_index 3 is not below num_shards 3"),
                           (["--num_shards", "2", "--shard_index", "-1"], "--shard_index must be at least 0, got -1"),
                           (["--num_shards", "0"], "--num_shards must be at least 1, got 0"),
                           (["--num_shards", "2"], "too small for 2 parts; it makes 1 internal shard")]:
        assert bert_suite_cli.main([*base, *flags]) == 2, flags
        assert message in capsys.readouterr().err, flags
        assert not out.exists(), flags
