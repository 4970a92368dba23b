"""The layout's own rules (docs/layout.md), held on the product's code: the top-level scripts and the package
zero3bench/, not tests/ or benchmarks/."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = sorted([*ROOT.glob("*.py"), *ROOT.glob("zero3bench/**/*.py")])
# a stage's number compared with a literal: stage == 3, args.stage != 0, r.stage in (1, 2), stage < 3
STAGE_LITERAL = re.compile(r"\bstage\w*\)? *(==|!=|<=|>=|<|>|in|not in) *\(?\d")


@pytest.mark.parametrize("path", PRODUCT, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_over_400_lines(path):
    assert len(path.read_text().splitlines()) <= 400


@pytest.mark.parametrize("path", PRODUCT, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_line_is_over_120_characters(path):
    assert [i for i, line in enumerate(path.read_text().splitlines(), 1) if len(line) > 120] == []

@pytest.mark.parametrize("path", PRODUCT, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_function_is_over_40_lines(path):
    long = [f"{node.name}: {node.end_lineno - node.lineno + 1} lines" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > 40]
    assert long == []


@pytest.mark.parametrize("path", [p for p in PRODUCT if p.name != "stages.py"], ids=lambda p: str(p.relative_to(ROOT)))
def test_stage_numbers_are_compared_only_in_stages_py(path):
    compared = [f"{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
                if STAGE_LITERAL.search(line.split("#")[0])]
    assert compared == []


def untyped(tree: ast.AST) -> list[str]:
    """The public functions of a module, and its special methods (__init__, __getattr__), that leave an argument
    or their return without a hint; a method's first argument needs none."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                not node.name.startswith("_") or node.name.startswith("__") and node.name.endswith("__")):
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                    *filter(None, (node.args.vararg, node.args.kwarg))]
            bare = [a.arg for a in args if a.annotation is None and a.arg not in ("self", "cls")]
            found += [f"{node.name}: {', '.join(bare) or 'return'}"] if bare or node.returns is None else []
    return found


@pytest.mark.parametrize("path", sorted(ROOT.glob("zero3bench/**/*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_public_function_of_the_package_is_typed(path):
    assert untyped(ast.parse(path.read_text())) == []


def test_a_function_without_a_hint_is_found():
    code = "def f(a: int, b): pass\ndef g(a: int): pass\ndef _h(a): pass\nasync def k(a, /) -> int: pass\ndef __e__(x): pass"
    assert untyped(ast.parse(code)) == ["f: b", "g: return", "k: a", "__e__: x"]
