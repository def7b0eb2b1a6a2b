"""The documentation cannot drift from the code: the site builds with `mkdocs build --strict` (a broken
link, anchor, snippet or API reference fails it), every Python block of README.md runs as written, and
the README keeps the set-up and test commands that .ci/run runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def _blocks(text: str, language: str) -> list[str]:
    """The fenced code blocks of `text` whose opening fence names `language` ("": none named)."""
    blocks, opened, lines = [], None, []
    for line in text.splitlines():
        if opened is None and line.startswith("```"):
            opened, lines = line[3:].strip(), []
        elif opened is not None and line.strip() == "```":
            if opened == language:
                blocks.append("\n".join(lines) + "\n")
            opened = None
        elif opened is not None:
            lines.append(line)
    return blocks


def _env() -> dict[str, str]:
    # one thread, as the test workers compute (tests/conftest.py); mkdocs-material's notice kept quiet
    return {**os.environ, "OMP_NUM_THREADS": "1", "NO_MKDOCS_2_WARNING": "1"}


def test_the_site_builds_strictly(tmp_path):
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                            "-d", str(tmp_path / "site")], cwd=tmp_path, capture_output=True, text=True,
                           env=_env(), timeout=180)
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "reference" / "api" / "index.html").read_text().count("doc-heading") >= 10


README_BLOCKS = _blocks(README.read_text(), "python")


def test_the_readme_has_a_python_example():
    assert README_BLOCKS


@pytest.mark.parametrize("index", range(len(README_BLOCKS)))
def test_a_readme_python_block_runs_as_written(index, tmp_path):
    ran = subprocess.run([sys.executable, "-c", README_BLOCKS[index]], cwd=tmp_path, capture_output=True, text=True,
                         env=_env(), timeout=300)
    assert ran.returncode == 0, f"README's Python block {index + 1} failed:\n{ran.stdout}\n{ran.stderr}"


def test_the_readme_keeps_the_commands_ci_runs():
    """.ci/run runs the README's set-up and test commands verbatim; each stands in a code block of its own."""
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.startswith(("python3 ", ".venv/"))]
    assert len(ci) == 2
    plain = [block.strip() for block in _blocks(README.read_text(), "")]
    for command in ci:
        assert command in plain, f"README.md has no code block that is exactly {command!r}"


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub and mkdocs make it (lower case, punctuation dropped, spaces to hyphens)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_links_exist():
    for target, anchor in re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]*))?\)", README.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        assert (REPO / target).exists(), f"README.md links to {target}, which does not exist"
        if anchor and target.endswith(".md"):
            headings = re.findall(r"^#+ (.+)$", (REPO / target).read_text(), flags=re.M)
            assert anchor in {_slug(h) for h in headings}, f"README.md links to {target}#{anchor}: no such heading"


def test_the_cli_reference_names_every_option():
    """docs/reference/cli.md pastes each subcommand's help: every option the parser has appears in it."""
    from monet.cli import _parser

    reference = (REPO / "docs" / "reference" / "cli.md").read_text()
    parser = _parser()
    commands = next(action for action in parser._actions if action.choices and hasattr(action, "add_parser"))
    for name, sub in commands.choices.items():
        assert f"## monet {name}" in reference, f"docs/reference/cli.md has no section for monet {name}"
        for action in sub._actions:
            for flag in action.option_strings:
                assert flag in reference, f"docs/reference/cli.md does not name {name}'s {flag}"
