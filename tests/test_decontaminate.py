"""`bert-suite decontaminate`: planted overlaps with GLUE TSVs, SQuAD JSON, CoNLL and plain text are found and
named with file:line on both sides; a sentence sharing only N-1 words stays; the record's shape."""

import json

import pytest

from bert_suite.cli import main as cli_main
from bert_suite.pretraining.decontaminate import DecontaminationError, decontaminate

CORPUS = """The opening scene is one of the finest moments in recent film history, and it shows.
Nothing else here matters much.

A second document starts here.
Frankly, the plot twists like a pretzel in a hurricane of its own making.
It ends well.

Only clean text in this one.
Truly nothing to see.

Who wrote the Declaration of Independence in the summer of 1776?
"""


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_planted_overlaps_are_removed_and_named_on_both_sides(tmp_path):
    corpus = write(tmp_path / "corpus" / "reviews.txt", CORPUS)
    # SST-2's layout (its card: header, the sentence column), phrased as SST-2 is: lowercase, spaced punctuation
    sst2 = write(tmp_path / "SST-2" / "dev.tsv", "sentence\tlabel\nsomething short .\t1\n"
                 "one of the finest moments in recent film history , and\t1\n")
    squad = write(tmp_path / "squad.json", json.dumps({"data": [{"title": "t", "paragraphs": [{
        "context": "Nothing to do with the corpus at all, really not.",
        "qas": [{"id": "q1", "question": "who wrote the declaration of independence in the summer of 1776?",
                 "answers": []}]}]}]}, indent=1))
    conll = write(tmp_path / "test.txt", "-DOCSTART- -X- O O\n\nthe NN O\nplot NN O\ntwists VB O\nlike IN O\n"
                  "a DT O\npretzel NN O\nin IN O\na DT O\nhurricane NN O\n\n")
    report = decontaminate([str(corpus)], [str(sst2), str(squad), str(conll)], str(tmp_path / "clean"), ngram=8)
    assert (report.sentences, report.sentences_removed, report.documents, report.documents_removed) == (8, 3, 4, 1)
    found = {(m["input"].split("/")[-1], m["against"].split("/")[-1]) for m in report.matches}
    assert found == {("reviews.txt:1", "dev.tsv:3"), ("reviews.txt:5", "test.txt:3"), ("reviews.txt:11", "squad.json:11")}
    clean = (tmp_path / "clean" / "reviews.txt").read_text()
    assert clean == ("Nothing else here matters much.\n\nA second document starts here.\nIt ends well.\n\n"
                     "Only clean text in this one.\nTruly nothing to see.\n")  # the last document emptied: gone
    record = json.loads((tmp_path / "clean" / "decontamination.json").read_text())
    assert list(record) == ["ngram", "documents", "documents_removed", "sentences", "sentences_removed", "inputs",
                            "formats", "against", "matches"]
    assert record["formats"] == {str(corpus): "lines"}  # auto, resolved for this file
    assert record["ngram"] == 8 and record["sentences_removed"] == 3
    assert record["against"][str(sst2)] == {"sentences": 2, "shorter_than_8_words": 1}


def test_a_sentence_sharing_n_minus_1_words_stays(tmp_path):
    corpus = write(tmp_path / "c.txt", "alpha beta gamma delta epsilon zeta eta theta.\nAnother sentence stays.\n")
    against = write(tmp_path / "eval.txt", "x alpha beta gamma delta epsilon zeta eta y\n")  # 7 shared words
    assert decontaminate([str(corpus)], [str(against)], str(tmp_path / "o8"), ngram=8).sentences_removed == 0
    assert decontaminate([str(corpus)], [str(against)], str(tmp_path / "o7"), ngram=7).sentences_removed == 1


def test_words_are_compared_after_bert_normalisation(tmp_path):
    corpus = write(tmp_path / "c.txt", "Great Film, Really! I Loved Every Minute.\nOther words entirely here.\n")
    against = write(tmp_path / "eval.txt", "great film , really ! i loved every minute .\n")
    report = decontaminate([str(corpus)], [str(against)], str(tmp_path / "o"), ngram=5)
    assert report.sentences_removed == 1 and report.matches[0]["ngram"] == "great film , really !"


def test_the_command_and_its_refusals(tmp_path, capsys):
    corpus = write(tmp_path / "c.txt", CORPUS)
    against = write(tmp_path / "eval.txt", "only clean text in this one . truly nothing\n")
    assert cli_main(["decontaminate", "--input", str(corpus), "--against", str(against), "--ngram", "4",
                     "--output_dir", str(tmp_path / "out")]) == 0
    assert "removed 1 of 8 sentences" in capsys.readouterr().out
    with pytest.raises(DecontaminationError, match=r"--ngram 2: below 3"):
        decontaminate([str(corpus)], [str(against)], str(tmp_path / "o"), ngram=2)
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(DecontaminationError, match=r"model\.bin: cannot read it \(not UTF-8 text\) \(--against\)"):
        decontaminate([str(corpus)], [str(binary)], str(tmp_path / "o"))
    with pytest.raises(DecontaminationError, match=r"every one of the 8 sentences .* nothing is left"):
        decontaminate([str(corpus)], [str(corpus)], str(tmp_path / "o"), ngram=3)


def test_one_sentence_documents_stay_apart_when_read_as_lines(tmp_path):
    """A task's single-sentence examples (`corpus --from_task` writes one per document): auto-detection takes such
    a file for raw text, one document, and would run the examples together; --format lines keeps them apart."""
    corpus = write(tmp_path / "sst2-train.txt", "".join(f"a short review number {i} here\n\n" for i in range(40)))
    against = write(tmp_path / "dev.txt", "nothing in common with the corpus at all\n")
    decontaminate([str(corpus)], [str(against)], str(tmp_path / "auto"), ngram=8)
    assert (tmp_path / "auto" / "sst2-train.txt").read_text().count("\n\n") == 0  # one document
    assert cli_main(["decontaminate", "--input", str(corpus), "--against", str(against), "--format", "lines",
                     "--output_dir", str(tmp_path / "lines")]) == 0
    kept = (tmp_path / "lines" / "sst2-train.txt").read_text()
    assert kept.count("\n\n") == 39 and kept.startswith("a short review number 0 here\n\na short review number 1")
    record = json.loads((tmp_path / "lines" / "decontamination.json").read_text())
    assert record["documents"] == 40 and record["formats"] == {str(corpus): "lines"}
    assert json.loads((tmp_path / "auto" / "decontamination.json").read_text())["formats"] == {str(corpus): "raw"}


def test_a_match_deep_in_a_long_document_is_named_by_the_line_where_it_starts(tmp_path):
    """A book is one document of wrapped lines: a sentence's line is found by searching forward in the
    document's text, so a sentence whose first words run over a line break is named by the line where it starts
    (a scan of the lines, once per sentence, named the line before, and was quadratic in a book)."""
    import textwrap

    before = textwrap.fill(" ".join(f"Sentence {i} walks along the quiet road toward the village." for i in
                                    range(3000)), width=70).splitlines()
    lines = [*before, "Sentence 3000 walks along the quiet road toward the village of Saint",
             "Martin before dusk. The quick brown",  # the planted sentence starts here and runs on
             "fox jumps over the lazy dog near the old mill by the river bank today.", "It ends there."]
    corpus = write(tmp_path / "book.txt", "\n".join(lines) + "\n")
    against = write(tmp_path / "eval.txt", "the lazy dog near the old mill by the river bank\n")
    report = decontaminate([str(corpus)], [str(against)], str(tmp_path / "clean"), ngram=8)
    assert report.sentences_removed == 1 and report.documents == 1
    assert report.matches[0]["input"] == f"{corpus}:{len(before) + 2}"


def test_a_paragraph_a_line_loses_only_its_contaminated_sentence(tmp_path):
    """Read as lines, a paragraph was one "sentence", so one shared 8-gram dropped the whole paragraph; read as
    paragraphs (auto-detected), only the sentence that shares it goes, named by its line."""
    corpus = write(tmp_path / "address.txt",
                   "We met here today. The quick brown fox jumps over the lazy dog near the mill. We went home.\n"
                   "Then the rain came. It fell all night long.\n\n"
                   "A second speech began. It was short.\nIt ended well. Everyone left.\n")
    against = write(tmp_path / "eval.txt", "the lazy dog near the old mill by the river\n"
                                           "quick brown fox jumps over the lazy dog near\n")
    report = decontaminate([str(corpus)], [str(against)], str(tmp_path / "clean"), ngram=8)
    assert report.formats == {str(corpus): "paragraphs"} and report.sentences == 9 and report.sentences_removed == 1
    assert report.matches[0]["input"] == f"{corpus}:1"
    assert (tmp_path / "clean" / "address.txt").read_text() == (
        "We met here today.\nWe went home.\nThen the rain came.\nIt fell all night long.\n\n"
        "A second speech began.\nIt was short.\nIt ended well.\nEveryone left.\n")
    lines = decontaminate([str(corpus)], [str(against)], str(tmp_path / "lines"), ngram=8, fmt="lines")
    assert lines.sentences == 4 and lines.sentences_removed == 1  # the old reading: the whole first paragraph
