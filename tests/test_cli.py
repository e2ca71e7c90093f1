"""The command line's front: help and usage errors without the heavy imports, grouped commands with an
example each, and `bert-suite tasks`."""

import os
import subprocess
import sys

import bert_suite_cli
from bert_suite.cli import main as cli_main


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_help_and_usage_errors_import_neither_torch_nor_the_package():
    probe = ("import sys, bert_suite_cli\n"
             "for argv in (['--help'], ['finetune', '--help'], ['fintune'], ['grid']):\n"
             "    try:\n"
             "        bert_suite_cli.main(argv)\n"
             "    except SystemExit:\n"
             "        pass\n"
             "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'bert_suite') if m in sys.modules))")
    done = _fresh(probe)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert "invalid choice: 'fintune'" in done.stderr and "required: --model" in done.stderr


def test_the_top_level_help_starts_a_newcomer_and_groups_every_command(capsys):
    assert cli_main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "start here:" in text and "bert-suite demo" in text and "bert-suite grid rte" in text
    parser = bert_suite_cli.build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)
    grouped = [name for names in bert_suite_cli.GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(commands) and set(bert_suite_cli.EXAMPLES) == commands
    for group in bert_suite_cli.GROUPS:
        assert f"\n{group}:\n" in text
    assert cli_main(["grid", "--help"]) == 0
    assert "example:\n  bert-suite grid rte" in capsys.readouterr().out


def test_a_typo_in_a_flag_value_still_names_the_flag(capsys):
    assert cli_main(["finetune", "rte", "--model", "preset:tiny", "--max_seq_length", "4"]) == 2
    assert "--max_seq_length must be at least 8" in capsys.readouterr().err


def test_tasks_lists_every_shipped_card_with_family_metric_and_source(capsys):
    from bert_suite.cards import available_cards

    assert cli_main(["tasks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["task", "family", "metric", "data", "card"]
    rows = {line.split()[0]: line for line in lines[1:] if line.strip() and not line.endswith("...`")}
    assert len(rows) == len(set(available_cards().values()))
    assert rows["squad_v2"].split()[1:3] == ["squad", "best_f1"] and "rajpurkar/squad_v2" in rows["squad_v2"]
    assert rows["conll2003"].split()[1] == "ner" and "local files" in rows["doc-intact"]


def _bert_suite(*argv: str, debug_env: bool = False) -> subprocess.CompletedProcess:
    """`bert-suite ARGV` in a fresh interpreter, with BERT_SUITE_DEBUG=1 or without it."""
    env = {k: v for k, v in os.environ.items() if k != "BERT_SUITE_DEBUG"}
    if debug_env:
        env["BERT_SUITE_DEBUG"] = "1"
    code = "import sys, bert_suite_cli; sys.exit(bert_suite_cli.main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, env=env)


def test_debug_or_its_variable_shows_the_traceback_of_an_input_error_else_one_line(tmp_path):
    missing = ["squad-small", "--input", str(tmp_path / "missing.json"), "--output_dir", str(tmp_path / "out")]
    plain = _bert_suite(*missing)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    lines = plain.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"bert-suite squad-small: error: {tmp_path / 'missing.json'}: ")
    for shown in (_bert_suite("--debug", *missing), _bert_suite(*missing, "--debug"),
                  _bert_suite(*missing, debug_env=True)):
        assert shown.returncode == 1 and shown.stderr.startswith("Traceback") and "SquadSmallError" in shown.stderr, \
            shown.stderr


def test_debug_is_every_commands_own_flag_and_the_help_says_so(capsys):
    parser = bert_suite_cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices
    said = "--debug show the traceback of an error instead of one line (or BERT_SUITE_DEBUG=1)"
    for argv in ([], *([name] for name in commands)):
        assert cli_main([*argv, "--help"]) == 0
        assert said in " ".join(capsys.readouterr().out.split()), argv
    # a command that hands unknown flags to TrainingArguments (which has a --debug of its own) keeps it
    args, rest = parser.parse_known_args(["finetune", "rte", "--model", "m", "--debug", "--num_train_epochs", "1"])
    assert args.debug and rest == ["--num_train_epochs", "1"]
    args, rest = parser.parse_known_args(["--debug", "grid", "rte", "--model", "m", "--num_train_epochs", "1"])
    assert args.debug and rest == ["--num_train_epochs", "1"]  # a command's default does not undo it
    assert not parser.parse_known_args(["grid", "rte", "--model", "m"])[0].debug
