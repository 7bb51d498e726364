"""The README and docs/ say what the code does: every `primekit ...` command they show parses with
today's command line (no renamed or dropped flag, no unknown subcommand), its dotted overrides
name real settings with valid values, every `python benchmarks/X.py ...` command parses with that
script's flags, and every relative link and #anchor resolves."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import re
import shlex
from pathlib import Path

import pytest

from primekit.cli import build_parser
from primekit.config import ConfigError, load_config, resolve_config

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md")
                                     if "records" not in p.parts)
# A value a reader fills in: RUN_DIR, S, <an RL run>, ...
NAME = r"[A-Z][A-Z_0-9]*"
PLACEHOLDER = re.compile(rf"^{NAME}$|<.*>|\.\.\.")


def commands(text: str, program: str = "primekit") -> list[str]:
    """The `primekit ...` (or other `program`) command lines of a markdown text: in fenced blocks
    (continuation lines joined, `#` comments and `&&` chains split off) and in inline code."""
    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("#"):
                continue
            for part in re.split(r"&&|\|\||;", line):
                m = re.search(rf"(?:^|\s)({program}\s.*)", part.split(" #")[0].strip())
                if m:
                    found.append(m.group(1))
    inline = re.sub(r"\\`", "", re.sub(r"\s*\n\s*", " ", text))
    found += re.findall(rf"`({program} [^`]+)`", inline)
    return found


def argv_of(command: str) -> list[str]:
    """The arguments, with optional parts written `[--flag X]` / `[overrides]` left out."""
    command = re.sub(r"\[(?:--|overrides)[^\]]*\]", "", command)
    return [a for a in shlex.split(command)[1:] if a != "..."]


def parse(argv: list[str]):
    """argparse's namespace, or its error line (None where the line only names a command whose
    required arguments it leaves out, as prose does: "`primekit dashboard` follows a run")."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return build_parser().parse_args(argv)
    except SystemExit as e:
        message = err.getvalue().strip().splitlines()[-1] if err.getvalue() else str(e)
        if "required" in message or "expected one argument" in message:
            return None
        return message


def test_the_helpers_find_and_reject_what_they_should():
    text = ("Run `primekit train --config tiny prm.beta=0.1` or\n```bash\n# a comment\n"
            "pip install x && primekit sft --config tiny \\\n  sft.seed=S  # one seed\n```\n")
    assert commands(text) == ["primekit sft --config tiny    sft.seed=S",
                              "primekit train --config tiny prm.beta=0.1"]
    assert argv_of("primekit export RUN [--step N] [--out DIR]") == ["export", "RUN"]
    assert isinstance(parse(["train", "--resum"]), str)  # a misspelt flag is caught
    assert isinstance(parse(["trian"]), str)
    assert parse(["dashboard"]) is None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_command_parses_and_its_overrides_validate(doc):
    problems = []
    for command in commands(doc.read_text()):
        args = parse(argv_of(command))
        if isinstance(args, str):
            problems.append(f"{command!r}: {args}")
            continue
        if args is None or args.command == "experiment":
            continue
        overrides = [o for o in getattr(args, "overrides", None) or []
                     if "=" in o and not PLACEHOLDER.search(o.split("=", 1)[1])]
        config = getattr(args, "config", None) or "tiny"
        try:
            path = resolve_config(config)
        except ConfigError:  # the reader's own file (my.yaml): only the overrides' names
            path = resolve_config("tiny")
        try:
            load_config(path, overrides)
        except ConfigError as e:
            problems.append(f"{command!r}: {e}")
    assert not problems, f"{doc.name}:\n" + "\n".join(problems)


class _Parsed(Exception):
    """Raised by a benchmark's parse_args once it has parsed: the benchmark itself never runs."""


def parse_benchmark(script: Path, argv: list[str], monkeypatch) -> str | None:
    """None if `script`'s own argument parser accepts argv, else its error line."""
    parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        parse_args(self, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr("sys.argv", [str(script), *argv])
    monkeypatch.syspath_prepend(str(script.parent))
    spec = importlib.util.spec_from_file_location(f"_bench_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            module.main(argv) if module.main.__code__.co_argcount else module.main()
    except _Parsed:
        return None
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    raise AssertionError(f"{script.name}: main() returned without parsing its arguments")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_benchmark_command_parses(doc, monkeypatch):
    problems = []
    for command in commands(doc.read_text(), program="python"):
        if not command.startswith("python benchmarks/"):
            continue
        argv = argv_of(command)
        script = ROOT / argv[0]
        if not script.exists():
            problems.append(f"{command!r}: no such script")
            continue
        filled = ["1" if re.fullmatch(NAME, a) else a for a in argv[1:]]
        error = parse_benchmark(script, filled, monkeypatch)
        if error:
            problems.append(f"{command!r}: {error}")
    assert not problems, f"{doc.name}:\n" + "\n".join(problems)


def test_a_benchmark_flag_that_does_not_exist_is_caught(monkeypatch):
    script = ROOT / "benchmarks" / "step_time.py"
    assert parse_benchmark(script, ["--steps", "2"], monkeypatch) is None
    assert "unrecognized" in parse_benchmark(script, ["--stepz", "2"], monkeypatch)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces as
    hyphens."""
    heading = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(doc):
    problems = []
    for m in re.finditer(r"\]\(([^)\s]+)\)|<img src=\"([^\"]+)\"", doc.read_text()):
        target = m.group(1) or m.group(2)
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        file = doc.parent / path if path else doc
        if not file.exists():
            problems.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in {
                _slug(h) for h in re.findall(r"^#+\s+(.*)$", file.read_text(), re.M)}:
            problems.append(f"{target}: no such heading")
    assert not problems, f"{doc.name}: " + "; ".join(problems)
