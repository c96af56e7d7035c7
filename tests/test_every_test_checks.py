"""Every test function under tests/ checks something: a test that cannot fail is a defect.

A check is an `assert` statement, `pytest.raises` / `pytest.warns` / `pytest.fail`, a call of an
`assert*` function (`np.testing.assert_allclose`, a helper named `assert_error`), or a call of a
function defined in the test suite that itself checks (transitively: helpers, and fixtures that
return checking callables). Functions are matched by name across the suite, which is loose on
purpose: a helper imported from another test module counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent
CHECKING_PYTEST_CALLS = {"raises", "warns", "fail", "deprecated_call"}


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _is_direct_check(node: ast.AST) -> bool:
    if isinstance(node, ast.Assert):
        return True
    if isinstance(node, ast.Call):
        func = node.func
        if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and func.value.id == "pytest" and func.attr in CHECKING_PYTEST_CALLS):
            return True
        name = _called_name(node)
        return name is not None and name.startswith("assert")
    return False


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def checking_functions(trees: dict[Path, ast.AST]) -> set[str]:
    """Names of the suite's functions that check, directly or through a checking callee."""
    bodies: dict[str, list[ast.AST]] = {}
    for tree in trees.values():
        for fn in _functions(tree):
            bodies.setdefault(fn.name, []).append(fn)
    checking: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, fns in bodies.items():
            if name in checking:
                continue
            for fn in fns:
                if any(_is_direct_check(n) or (isinstance(n, ast.Call)
                                               and _called_name(n) in checking)
                       for n in ast.walk(fn)):
                    checking.add(name)
                    changed = True
                    break
    return checking


def unchecked_tests(trees: dict[Path, ast.AST]) -> list[str]:
    checking = checking_functions(trees)
    found = []
    for path, tree in trees.items():
        if not path.name.startswith("test_"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("Test"):
                continue
            body = node.body if isinstance(node, ast.Module | ast.ClassDef) else []
            for fn in body:
                if (isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
                        and fn.name.startswith("test") and fn.name not in checking):
                    found.append(f"{path.relative_to(TESTS)}::{fn.name} (line {fn.lineno})")
    return found


def parse_suite(root: Path = TESTS) -> dict[Path, ast.AST]:
    return {p: ast.parse(p.read_text(), filename=str(p)) for p in sorted(root.rglob("*.py"))}


def test_every_test_function_checks_something():
    trees = parse_suite()
    assert len(trees) > 30, "the suite was not found"
    assert unchecked_tests(trees) == []


def test_the_meta_test_finds_tests_without_checks():
    source = '''
import numpy as np
import pytest

def helper_that_checks(x):
    assert x

def helper_that_prints(x):
    print(x)

@pytest.fixture
def checker():
    def check(v):
        np.testing.assert_array_equal(v, 1)
    return check

def test_assert():
    assert 1
def test_raises():
    with pytest.raises(ValueError):
        int("x")
def test_warns():
    with pytest.warns(UserWarning):
        pass
def test_numpy_assert():
    np.testing.assert_allclose(1, 1)
def test_helper():
    helper_that_checks(1)
def test_fixture_callable(checker):
    checker(1)
def test_fail():
    pytest.fail("no")

def test_prints_only():
    print({"a": 1})
def test_helper_without_check():
    helper_that_prints(1)
def test_nothing():
    pass
def test_approx_without_assert():
    1 == pytest.approx(1)

class TestGroup:
    def test_method_without_check(self):
        x = 1
    def test_method_with_check(self):
        assert True
'''
    found = unchecked_tests({TESTS / "test_fake.py": ast.parse(source)})
    names = [f.split("::")[1].split(" ")[0] for f in found]
    assert names == ["test_prints_only", "test_helper_without_check", "test_nothing",
                     "test_approx_without_assert", "test_method_without_check"]
