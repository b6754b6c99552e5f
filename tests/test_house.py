"""The house's own rules, held by a test: sizes, breadth, and references that resolve.

ARCHITECTURE.md ("Sizes") states them: no module over 600 lines and no class over 300 outside
tests and fakes, and no folder of core/ with more than 10 modules at one level (migrations aside:
one file per schema change); a module, a class or a folder that grew past them holds a concern
that wants its own home. And every cross-reference the
prose makes (a backticked `core.turns.parts.Part`, a `TurnRunner.submit`, a path such as
core/turns/runner.py, in docstrings, comments and the Markdown pages) names something that
exists: a reference left behind by a move misleads the next reader. (The arrows between packages
are checked by import-linter, in .ci/run.)
"""

import ast
import importlib
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CODE = ("bot", "channels", "core", "workflows")
PAGES = ("README.md", "ARCHITECTURE.md", "benchmarks/README.md")
MAX_MODULE_LINES, MAX_CLASS_LINES, MAX_MODULES_PER_FOLDER = 600, 300, 10
TOPS = "core|bot|channels|workflows|tests|benchmarks"
DOTTED = re.compile(rf"`((?:{TOPS})(?:\.\w+)+)(?:\(\))?`")
QUALIFIED = re.compile(r"`([A-Z]\w*)((?:\.\w+)+)(?:\(\))?`")
PATH = re.compile(rf"(?<![\w/.])((?:{TOPS})/[\w/.-]*\w)")


def modules() -> Iterator[Path]:
    for top in CODE:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a page, or of a module's docstrings and comments."""
    text = path.read_text()
    if path.suffix != ".py":
        yield from enumerate(text.split("\n"), 1)
        return
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
        elif token.type == tokenize.STRING and token.string.startswith(('"""', "'''")):
            for offset, line in enumerate(token.string.split("\n")):
                yield token.start[0] + offset, line


def prose_files() -> list[Path]:
    return [
        *modules(),
        *(ROOT / page for page in PAGES),
        *sorted((ROOT / "benchmarks").glob("*.py")),
    ]


def imported(path: Path) -> Any:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    return importlib.import_module(name)


def has(owner: Any, name: str) -> bool:
    """An attribute, a dataclass field, an annotation, or an attribute set in a method."""
    if hasattr(owner, name) or name in getattr(owner, "__annotations__", {}):
        return True
    if not isinstance(owner, type):
        return False
    source = Path(importlib.import_module(owner.__module__).__file__ or "").read_text()
    return re.search(rf"self\.{name}\b\s*[:=]", source) is not None


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not has(owner, name):
                return False
            owner = getattr(owner, name, None)
        return True
    return False


def resolves_on(owner: Any, attributes: list[str]) -> bool:
    for name in attributes:
        if not has(owner, name):
            return False
        owner = getattr(owner, name, None)
    return True


def our_classes() -> dict[str, list[type]]:
    classes: dict[str, list[type]] = {}
    for path in modules():
        if path.name == "__main__.py":
            continue
        module = imported(path)
        for name, value in vars(module).items():
            if isinstance(value, type) and value.__module__ == module.__name__:
                classes.setdefault(name, []).append(value)
    return classes


def test_no_module_or_class_outgrows_its_concern() -> None:
    too_big = []
    for path in modules():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            too_big.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_CLASS_LINES:
                    too_big.append(f"{path.relative_to(ROOT)}: class {node.name}, {length} lines")
    assert too_big == []


def test_no_folder_of_core_is_a_flat_list() -> None:
    crowded = [
        f"{folder.relative_to(ROOT)}: {count} modules"
        for folder in [ROOT / "core", *(ROOT / "core").rglob("*/")]
        if folder.is_dir() and not {"__pycache__", "migrations"} & set(folder.parts)
        if (count := len([m for m in folder.glob("*.py") if m.name != "__init__.py"]))
        > MAX_MODULES_PER_FOLDER
    ]
    assert crowded == []


def test_every_cross_reference_resolves() -> None:
    classes = our_classes()
    broken = []
    for path in prose_files():
        where = path.relative_to(ROOT)
        for number, line in prose(path):
            for match in DOTTED.finditer(line):
                if not resolves(match.group(1)):
                    broken.append(f"{where}:{number}: {match.group(1)}")
            for match in QUALIFIED.finditer(line):
                name, attributes = match.group(1), match.group(2).strip(".").split(".")
                if name in classes and not any(
                    resolves_on(each, attributes) for each in classes[name]
                ):
                    broken.append(f"{where}:{number}: {match.group(0)}")
            for match in PATH.finditer(line):
                if not (ROOT / match.group(1).split("::")[0].rstrip("/.")).exists():
                    broken.append(f"{where}:{number}: {match.group(1)}")
    assert broken == []
