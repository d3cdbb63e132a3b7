"""Docs, examples, units and code name only files the project has: every `*.md` they mention and
every path under one of the project's top-level directories exists (no METHOD.md, no moved doc)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = ("docs", "examples", "systemd", "scripts", "benchmarks", "templates", "migrations", "vmplacer", "tests")
# A word ending in a file extension: `docs/rebalance.md`, `research/method.md`, `vmplacer/core/placement/scoring.py`.
REFERENCE = re.compile(r"(?<![\w/.*<{-])((?:[\w.-]+/)*[\w-]+(?:\.\w+)+)")
EXTENSIONS = {"md", "py", "sh", "yaml", "xml", "service", "timer", "json", "j2", "ini", "cfg", "txt"}
PLACEHOLDER = re.compile(r"NAME|FILE|[A-Z]{3,}\.|example\.com|/path/to|site-packages")


def sources() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "systemd").iterdir()),
             *sorted((ROOT / "examples").rglob("*.yaml")), *sorted((ROOT / "examples").rglob("*.md"))]
    found += sorted((ROOT / "vmplacer").rglob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))
    found += sorted((ROOT / "scripts").glob("*"))
    return [path for path in found if path.is_file() and "__pycache__" not in path.parts]


def exists(reference: str, where: Path) -> bool:
    candidates = [where.parent / reference, ROOT / reference, ROOT / "docs" / reference]
    return any(candidate.exists() for candidate in candidates)


def checked(reference: str) -> bool:
    """Every Markdown file, and paths inside the project's own top-level directories."""
    if reference.rsplit(".", 1)[-1] not in EXTENSIONS:
        return False
    return reference.endswith(".md") or reference.split("/", 1)[0] in TOP and "/" in reference


def test_every_referenced_file_exists():
    missing = []
    for path in sources():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            if PLACEHOLDER.search(line) and not re.search(r"\bdocs/|\.md\b", line):
                continue
            for reference in REFERENCE.findall(line):
                if checked(reference) and not exists(reference, path):
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {reference}")
    assert not missing, "references to files the project does not have:\n" + "\n".join(missing)


def test_the_rebalance_doc_is_for_operators_and_the_lab_notes_are_apart():
    operator = (ROOT / "docs" / "rebalance.md").read_text()
    notes = ROOT / "docs" / "research" / "rebalance-diagnoses.md"
    assert notes.is_file() and "research/rebalance-diagnoses.md" in operator
    assert "### Diagnosis: why vmplacer ended below" not in operator
    assert len(operator.splitlines()) < 1000


COMMAND_LINE = re.compile(r"(?:/bin/vmplacer|^vmplacer) "
                          r"((?:protect|profile|plans|rebalance|reconcile|guard|db|serve)\b[^>#|`]*)")
VERBS = {"profile": {"run", "show", "replay"}, "plans": {"list", "show", "cancel"}, "protect": {"run", "status"}}


def invocations() -> list[tuple[str, list[str]]]:
    """(where, argv) of every vmplacer command line in the units, and the cron lines and command
    examples of the docs."""
    import shlex

    found = []
    texts = [*sorted((ROOT / "systemd").iterdir()), *sorted((ROOT / "docs").glob("*.md"))]
    for path in texts:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            match = COMMAND_LINE.search(line)
            if match and "[" not in match.group(1):  # `[--option]` is a synopsis, not a command line
                words = match.group(1).replace("%i", "h1").rstrip("\\ ")
                found.append((f"{path.relative_to(ROOT)}:{number}", shlex.split(words)))
    return found


def test_units_cron_lines_and_examples_use_the_current_spellings():
    from vmplacer.cli.main import build_parser

    seen = invocations()
    assert any(where.startswith("systemd/vmplacer-protect@") for where, _ in seen)
    assert any("rebalance" in argv[:1] and "docs/rebalance.md" in where for where, argv in seen)
    for where, argv in seen:
        build_parser(argv).parse_args(argv)  # exits 2 on a spelling the parser does not know
        command = argv[0]
        if command in VERBS:
            assert len(argv) > 1 and argv[1] in VERBS[command], f"{where}: {' '.join(argv)}: name the action"
        if command != "plans":
            assert "--all" not in argv, f"{where}: {' '.join(argv)}: --all-hosts"
