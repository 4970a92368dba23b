"""The mutation harness's operand kinds (benchmarks/mutants.py) make the mutants that its operators missed: the
held-out one of (a) among them, which compared stage 3's checksum with itself. No launch."""
import ast
import sys
import types

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import mutants  # noqa: E402

SOURCE = '''
import math


def near(x: float, y: float, rel: float = 1e-9) -> bool:
    return math.isclose(x, y, rel_tol=rel)


def scaled(x: float, n: int) -> float:
    return x * n


def judge(dense: list, zero3: list, steps: int) -> bool:
    a, b = dense[0].checksum, zero3[0].checksum
    early = [x for x in range(steps)][:steps]
    return a < b and near(a, b, rel=1e-3) and scaled(a, steps)
'''


MODULE = types.ModuleType("source")
exec(SOURCE, vars(MODULE))  # the module imported, whose callees' defaults a mutant may drop to
UNMUTATED = ast.unparse(ast.parse(SOURCE)).splitlines()


def made(kind):
    """{(function, description, the mutated line)} of SOURCE's mutants of one kind."""
    return {(m[0], m[2], next(line.strip() for line in m[4].splitlines() if line not in UNMUTATED))
            for m in mutants.mutants(SOURCE, MODULE, (kind,))}


def test_one_operand_replaced_by_its_neighbour_compares_stage_3s_checksum_with_itself():
    found = made("operand")
    assert ("judge", "operand dense[0].checksum -> zero3[0].checksum",
            "a, b = (zero3[0].checksum, zero3[0].checksum)") in found
    assert {("judge", "operand a -> b", "return b < b and near(a, b, rel=0.001) and scaled(a, steps)"),
            ("judge", "operand a -> b", "return a < b and near(b, b, rel=0.001) and scaled(a, steps)")} < found
    assert ("near", "operand x -> y", "return math.isclose(y, y, rel_tol=rel)") in found
    # not where two parameters, or a callee's, are hinted apart: a float for an int
    assert not [m for m in found if m[1] in ("operand x -> n", "operand n -> x", "operand a -> steps")]


def test_a_parameters_attribute_is_read_from_another_parameter_of_the_same_hint_only():
    assert {m[:2] for m in made("parameter")} == {("judge", "parameter dense -> zero3"),
                                                  ("judge", "parameter zero3 -> dense")}


def test_an_ordering_comparisons_sides_are_swapped():
    assert made("sides") == {("judge", "sides swapped", "return b < a and near(a, b, rel=0.001) and scaled(a, steps)")}


def test_an_argument_that_its_callee_gives_a_default_is_dropped_unless_it_passes_the_default():
    assert made("default") == {("near", "default rel_tol=rel dropped", "return math.isclose(x, y)"),
                               ("judge", "default rel=0.001 dropped", "return a < b and near(a, b) and scaled(a, steps)")}


def test_a_ranges_argument_and_a_slices_end_are_off_by_one():
    assert {m[1:] for m in made("bound")} == {
        ("bound steps + 1", "early = [x for x in range(steps + 1)][:steps]"),
        ("bound steps - 1", "early = [x for x in range(steps - 1)][:steps]"),
        ("bound steps + 1", "early = [x for x in range(steps)][:steps + 1]"),
        ("bound steps - 1", "early = [x for x in range(steps)][:steps - 1]")}
