"""The README and docs/ pages: every relative link resolves (file, and heading for an #anchor), every
`bert-suite ...` command line in them parses with the real parser (TrainingArguments flags included), and
the README stays a front page."""

import re
import shlex
from pathlib import Path

import pytest

from bert_suite.cli import _training_overrides
from bert_suite_cli import _give_back_flag_value, _plain_negative_numbers, build_parser
from helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)
INLINE = re.compile(r"(?<!`)`(bert-suite [^`]+)`(?!`)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def links(page: Path):
    text = FENCE.sub("", page.read_text())
    for target in LINK.findall(text):
        if not re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            yield target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no file {file.relative_to(REPO) if file.is_relative_to(REPO) else file})")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no heading #{anchor} in {file.name})")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def command_lines(page: Path) -> list[str]:
    """Whole `bert-suite ...` command lines: those of the page's shell blocks (continuations joined)."""
    found = []
    for lang, body in FENCE.findall(page.read_text()):
        if lang not in ("bash", "sh", "shell", ""):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = re.sub(r"^(\w+\$ |(\w+=\S* )+)", "", line.strip())  # machine1$ , CUDA_VISIBLE_DEVICES=0
            line = re.sub(r"^accelerate launch .*?-m bert_suite\.cli ", "bert-suite ", line)  # the CLI under a launcher
            line = re.sub(r"\s*&$", "", line)
            if line.startswith("bert-suite "):
                found.append(line)
    return found


def check_flags(span: str) -> None:
    """An inline `bert-suite COMMAND --flag ...` in prose is often a fragment (no required flags): its command
    must exist and each --flag it names must be one of the command's, or a TrainingArguments flag where the
    command takes them."""
    import dataclasses

    from transformers import TrainingArguments

    words = re.sub(r"\[[^\[\]]*\]", "", span).split()
    subparsers = next(a for a in build_parser()._actions if a.dest == "command").choices
    if len(words) < 2 or words[1].startswith("-") or not re.fullmatch(r"[a-z][a-z-]*", words[1]):
        return  # `bert-suite --help`, `bert-suite COMMAND ...`, `bert-suite CMD: error: ...`: patterns
    assert words[1] in subparsers, f"no command {words[1]!r}"
    command = subparsers[words[1]]
    known = {o for a in command._actions for o in a.option_strings}
    if command.get_default("takes_training_flags"):
        fields = {f.name for f in dataclasses.fields(TrainingArguments)}
        known |= {f"--{n}" for n in fields} | {f"--no_{n}" for n in fields}
    unknown = [w.split("=")[0] for w in words[2:] if w.startswith("--") and w.split("=")[0] not in known]
    assert not unknown, f"{words[1]} has no flag {', '.join(unknown)}"


def parse(line: str) -> None:
    """Parse a documented command as `bert-suite` would: an error raises."""
    line = re.sub(r"\s\[[^\[\]]*\]", "", line)  # [--optional FLAGS] as documentation writes them
    argv = shlex.split(line, comments=True)[1:]
    argv = _plain_negative_numbers(argv)
    parser = build_parser()
    try:
        args, rest = parser.parse_known_args(argv)
    except SystemExit as done:
        if done.code == 0:  # --help
            return
        raise AssertionError(f"argparse refused it (exit {done.code})") from None
    _give_back_flag_value(args, argv, rest)
    if rest and not getattr(args, "takes_training_flags", False):
        raise AssertionError(f"unrecognized arguments: {' '.join(rest)}")
    if rest:
        _training_overrides(rest)  # TrainingArguments flags, as HfArgumentParser reads them


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_documented_command_parses(page, capsys):
    wrong = []
    for line in command_lines(page):
        if "COMMAND" in line:  # a pattern, not a command
            continue
        line = re.sub(r"\s\.\.\.(?=\s|$)", "", line)  # `--learning_rates ...`: more values like those before
        try:
            parse(line)
        except (AssertionError, ValueError) as err:
            wrong.append(f"{line}\n    -> {str(err).splitlines()[0] if str(err) else type(err).__name__} "
                         f"{capsys.readouterr().err.strip().splitlines()[-1:]}")
    for span in INLINE.findall(FENCE.sub("", page.read_text())):
        try:
            check_flags(span)
        except AssertionError as err:
            wrong.append(f"`{span}`\n    -> {err}")
    assert not wrong, f"{page.relative_to(REPO)}:\n" + "\n".join(wrong)


def test_the_checker_catches_a_wrong_flag_and_a_broken_link(tmp_path):
    with pytest.raises(ValueError, match="did you mean --learning_rate"):
        parse("bert-suite grid rte --model M --learning_rate_list 1e-3")
    with pytest.raises(AssertionError, match="unrecognized arguments: --opset"):
        parse("bert-suite predict --model M --opset 3")
    with pytest.raises(AssertionError, match="export has no flag --format"):
        check_flags("bert-suite export --format onnx")
    check_flags("bert-suite finetune --bf16")
    with pytest.raises(ValueError):
        parse("bert-suite finetune rte --model M --num_train_epoch 3")  # a TrainingArguments near-miss
    parse("bert-suite finetune rte --model M --num_train_epochs 3 [--data_dir DIR]")
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](missing.md) [bad](#nowhere)\n")
    assert list(links(page)) == ["#title", "missing.md", "#nowhere"] and anchors(page) == {"title"}


def test_the_readme_is_a_front_page():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move the detail to docs/"
    text = "\n".join(lines)
    assert "make demo" in text and "make test" in text  # the two commands
    assert all(f"docs/{p.name}" in text for p in PAGES[1:]), "every docs/ page is linked from the README"
