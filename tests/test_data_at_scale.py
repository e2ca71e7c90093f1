"""The data pipeline at the size users bring: the vocabulary counted in parallel and streamed, the
word-table cap, and both stages run as tasks on a Dask cluster (a local one of 2 worker processes),
each giving the single-process bytes."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from datasets import load_from_disk

from bert_suite.pretraining.instances import load_parts
from bert_suite.pretraining.tokenizer import REPORT_FILE, count_words, train_tokenizer
from bert_suite.tokenization import SPECIAL_TOKENS

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", REPORT_FILE, "vocab.txt"]


def cli(*args: str, hash_seed: str = "0") -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "bert_suite.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": hash_seed, "TQDM_DISABLE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def zipf_corpus(path: Path, documents: int = 300, seed: int = 0) -> Path:
    """Documents of sentences over a Zipf-like vocabulary of syllable words (many ties, many rare words)."""
    rng = random.Random(seed)
    syllables = ["ka", "to", "ri", "me", "su", "no", "ha", "pe", "lu", "di", "zo", "qua"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(3000)]
    weights = [1 / (rank + 3) for rank in range(len(words))]
    lines = []
    for _ in range(documents):
        for _ in range(rng.randint(2, 8)):
            sentence = " ".join(rng.choices(words, weights, k=rng.randint(4, 14)))
            lines.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "!", "?", " (sic)."]))
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def reference_counts(path: Path, lowercase: bool) -> Counter:
    """The plain way: the whole text through BertNormalizer and BertPreTokenizer, word by word."""
    from tokenizers import normalizers, pre_tokenizers

    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=lowercase,
                                            lowercase=lowercase)
    text = normalizer.normalize_str(path.read_text(encoding="utf-8-sig"))
    return Counter(word for word, _ in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(text))


def test_fast_counting_equals_the_normaliser_and_pre_tokeniser_on_hostile_text(tmp_path):
    """Counting splits at white space in C and normalises distinct tokens only: it must equal the
    plain pipeline on accents, CJK, control characters, the white space that BERT deletes and
    Python splits at (\\x0b \\x1c \\x85), final sigma, ligatures, emoji, and a BOM, cut into tiny tasks."""
    pool = [*"abcXYZ \t\n.,;!?'\"-()éÉñçÅΣσςİıǅß日本語中文한국\x01\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u2028\u2029\u200b\u3000",
            *"\ufeff\ufffd\u0301\u0308😀$+<=>^`|~_0123456789ﬁⅫ²", "ΣΑΣ ", "hello ", "\r\n"]
    rng = random.Random(1)
    for trial in range(12):
        path = tmp_path / f"hostile{trial}.txt"
        text = ("\ufeff" if trial % 3 == 0 else "") + "".join(rng.choice(pool) for _ in range(rng.randint(200, 3000)))
        path.write_bytes(text.encode("utf-8"))
        for lowercase in (True, False):
            counts, report = count_words([path], lowercase, num_proc=1, task_bytes=rng.choice([64, 700, 1 << 20]))
            assert +counts == +reference_counts(path, lowercase), (trial, lowercase)
            assert report["occurrences"] == sum(counts.values())


def test_the_vocabulary_is_the_same_bytes_for_every_num_proc_and_hash_seed(tmp_path):
    """The `tokenizers` WordPiece trainer broke ties through per-process hash seeds (three runs on the
    demo corpus gave three vocabularies). Here many words tie, the two processes hash differently,
    and the second counts in two processes over many tasks."""
    corpus = zipf_corpus(tmp_path / "corpus.txt")
    outputs = []
    for run, (num_proc, hash_seed) in enumerate([("1", "1"), ("2", "2")]):
        out = tmp_path / f"run{run}"
        task_bytes = ["--count_task_bytes", "4096"] if run else []  # the first: one task; the others: ~10
        cli("tokenizer", "--input", str(corpus), "--vocab_size", "400", "--lowercase", "--output_dir", str(out),
            "--num_proc", num_proc, *task_bytes, hash_seed=hash_seed)
        outputs.append({name: (out / name).read_bytes() for name in TOKENIZER_FILES})
    vocab = outputs[0]["vocab.txt"].decode().splitlines()
    assert len(vocab) == 400 and vocab[:5] == list(SPECIAL_TOKENS) and "##ka" in vocab
    report = json.loads(outputs[0][REPORT_FILE])
    assert report["word_types"] > 1000 and report["dropped_word_types"] == 0
    assert sorted(p.name for p in (tmp_path / "run0").iterdir()) == TOKENIZER_FILES
    for name in TOKENIZER_FILES:
        if name == REPORT_FILE:  # the number of counting tasks differs; the counts do not
            assert {k: v for k, v in json.loads(outputs[1][name]).items() if k != "tasks"} == \
                {k: v for k, v in report.items() if k != "tasks"}
            assert json.loads(outputs[1][name])["tasks"] > 5
        else:
            assert outputs[0][name] == outputs[1][name], name


def test_the_word_table_cap_keeps_the_most_frequent_words_and_reports_what_it_dropped(tmp_path):
    corpus = zipf_corpus(tmp_path / "corpus.txt", documents=200)
    full, full_report = count_words([corpus], True, task_bytes=2048)
    cap = 300
    capped, report = count_words([corpus], True, max_word_types=cap, task_bytes=2048)
    assert len(full) > 2 * cap and len(capped) == cap and report["pruned"] >= 2
    assert report["occurrences"] == full_report["occurrences"] == sum(full.values())
    assert report["dropped_occurrences"] == report["occurrences"] - sum(capped.values()) > 0
    assert 0 < report["dropped_share"] < 0.5
    # the head of the distribution survives the cuts with its exact counts
    head = sorted(full.items(), key=lambda item: (-item[1], item[0]))[:100]
    assert all(capped[word] == count for word, count in head)
    # the same cap at the same points for any number of processes
    again, _ = count_words([corpus], True, num_proc=2, max_word_types=cap, task_bytes=2048)
    assert again == capped
    # and through the command: the report file and the printed line say what was dropped
    done = cli("tokenizer", "--input", str(corpus), "--vocab_size", "250", "--lowercase", "--output_dir",
               str(tmp_path / "capped"), "--max_word_types", str(cap), "--count_task_bytes", "2048")
    saved = json.loads((tmp_path / "capped" / REPORT_FILE).read_text())
    assert saved["max_word_types"] == cap and saved["word_types"] == cap
    assert saved["dropped_word_types"] == report["dropped_word_types"] > 0
    assert f"--max_word_types {cap}: dropped {saved['dropped_word_types']:,}" in done.stdout
    with pytest.raises(ValueError, match="max_word_types 200 is below vocab_size 300"):
        train_tokenizer([str(corpus)], 300, True, str(tmp_path / "refused"), max_word_types=200)
    assert not (tmp_path / "refused").exists()


def needs_dask() -> None:
    """Skip without Dask, without importing it here: importing distributed starts threads in this
    process, and the forks later tests make (datasets' num_proc) would inherit their held locks and hang."""
    if importlib.util.find_spec("distributed") is None:
        pytest.skip("Dask is not installed (pip install \"bert_suite[cluster]\")")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dask_cluster():
    """A scheduler and 2 worker processes started as a user would (`dask scheduler`, `dask worker`), in
    processes of their own: a Dask client's threads inside the test process would be inherited by the
    forks later tests make (datasets' num_proc), and a fork that inherits a held lock hangs."""
    needs_dask()
    address = f"tcp://127.0.0.1:{free_port()}"
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    scheduler = subprocess.Popen([*dask, "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
                                  "--dashboard-address", ":0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers", "2",
                                "--nthreads", "1", "--no-dashboard"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        subprocess.run([sys.executable, "-c", "import sys; from distributed import Client; "
                        "Client(sys.argv[1], timeout='60s').wait_for_workers(2, timeout=60)", address],
                       check=True, timeout=120)
        yield address
    finally:
        for proc in (workers, scheduler):
            proc.terminate()
        for proc in (workers, scheduler):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_a_local_dask_cluster_of_two_workers_gives_the_single_process_bytes(tmp_path, dask_cluster):
    corpus = zipf_corpus(tmp_path / "corpus.txt", documents=400)
    # the single-process runs in processes of their own too: this process must not start torch's threads
    # (static masking) before the forks of later tests
    cli("tokenizer", "--input", str(corpus), "--vocab_size", "400", "--lowercase", "--output_dir",
        str(tmp_path / "tok"), "--num_proc", "1")
    cli("tokenizer", "--input", str(corpus), "--vocab_size", "400", "--lowercase", "--output_dir",
        str(tmp_path / "tok_dask"), "--dask_scheduler", dask_cluster, "--count_task_bytes", "4096")
    for name in ("tokenizer.json", "vocab.txt"):
        assert (tmp_path / "tok" / name).read_bytes() == (tmp_path / "tok_dask" / name).read_bytes(), name
    assert json.loads((tmp_path / "tok_dask" / REPORT_FILE).read_text())["tasks"] > 10
    # the workers counted words without importing torch, transformers or the model (before static masking below)
    asked = subprocess.run([sys.executable, "-c", "import json, sys\nfrom distributed import Client\n"
                            f"with Client({dask_cluster!r}, timeout=30) as client:\n"
                            "    print(json.dumps(client.run(lambda: [m for m in ('torch', 'transformers', "
                            "'bert_suite.modeling_bert_suite') if m in sys.modules])))"],
                           capture_output=True, text=True, timeout=120)
    assert asked.returncode == 0, asked.stderr[-2000:]
    imported = json.loads(asked.stdout.strip().splitlines()[-1])
    assert len(imported) == 2 and not any(imported.values()), imported

    cli("pretrain-data", "--input", str(corpus), "--tokenizer", str(tmp_path / "tok"), "--max_seq_length", "64",
        "--static_masking", "--docs_per_shard", "50", "--output_dir", str(tmp_path / "single"), "--num_proc", "1")
    done = cli("pretrain-data", "--input", str(corpus), "--tokenizer", str(tmp_path / "tok"), "--max_seq_length", "64",
               "--static_masking", "--docs_per_shard", "50", "--output_dir", str(tmp_path / "dask"),
               "--dask_scheduler", dask_cluster)
    assert "part-00001-of-00002" in done.stdout  # two parts: the cluster's threads (the fixture waited for both)
    single, parts = load_from_disk(str(tmp_path / "single")), load_parts(tmp_path / "dask")
    assert len(single) == len(parts) > 100
    for column in single.column_names:
        assert single[column] == parts[column], column


def test_an_unreachable_scheduler_is_one_clear_error_and_nothing_is_written(tmp_path):
    """In a process of its own (a failed client's threads must not stay in the test process)."""
    needs_dask()
    corpus = zipf_corpus(tmp_path / "corpus.txt", documents=20)
    address = f"tcp://127.0.0.1:{free_port()}"
    for command in (["tokenizer", "--vocab_size", "100", "--lowercase"], ["pretrain-data", "--tokenizer", "unused"]):
        done = subprocess.run([sys.executable, "-m", "bert_suite.cli", *command, "--input", str(corpus),
                               "--output_dir", str(tmp_path / "out"), "--dask_scheduler", address],
                              capture_output=True, text=True,
                              env={**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "1s"})
        assert done.returncode != 0
        assert f"--dask_scheduler {address}: no Dask scheduler answered" in done.stderr, done.stderr[-2000:]
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_bad_input_files_are_named_with_the_line(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"empty\.txt: the file is empty"):
        train_tokenizer([str(empty)], 100, True, str(tmp_path / "a"))
    binary = tmp_path / "binary.bin"
    binary.write_bytes(b"text\nmore text\n\x00\x01\x02")
    with pytest.raises(ValueError, match=r"binary\.bin: line 3 \(byte 15\): a NUL byte"):
        train_tokenizer([str(binary)], 100, True, str(tmp_path / "b"))
    broken = tmp_path / "broken.txt"
    broken.write_bytes("fine line\nanother one\nbad \x81\x8d here\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"broken\.txt: line 3 \(byte 26\): invalid start byte"):
        train_tokenizer([str(broken)], 100, True, str(tmp_path / "c"))
    assert not any((tmp_path / name).exists() for name in "abc")
