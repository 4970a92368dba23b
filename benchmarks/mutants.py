"""Mutation testing of the pure modules with their fast tests: each mutant is one small change of one function,
made one at a time; the tests that hold that module run against it, and a mutant that they all pass survives.
Its kinds (--kinds): the operators' (`comparison` flipped, `constant` changed, + and - or * and / swapped
(`binary`), and/or swapped (`boolean`), a `not` dropped (`unary`)), and the operands' (`operand`: one operand
replaced by its neighbour of the same type, f(a, b) -> f(b, b), a - b -> b - b, x.n, y.n -> y.n, y.n, not two
arguments that the callee hints apart; `parameter`: x.attr read as y.attr, x and y parameters of one hint;
`sides`: a < b -> b < a; `default`: a keyword argument, or the last positional one, dropped to the callee's
default; `bound`: a range()'s argument or a slice's end off by one).

    python3 benchmarks/mutants.py [--budget-s 900] [--only predict] [--kinds operand,sides] [--survivors-of LOG]
                                  [--rest-of LOG] [--log FILE]

mutmut and cosmic-ray rewrite the files and start the tests anew for each mutant; here the tests are imported
once and each mutant runs in a fork of this process, whose function takes the mutated code (its __code__ and
defaults swapped, so that every name bound to it sees the change) and whose functools caches are emptied, which is
what makes about a thousand mutants fit in an hour on two busy cores. Each mutant runs the tests that call its
function (as the unmutated run traced them), each file's quickest first, and where they all pass, all of its
module's tests (a test may reach the function unseen by the trace: through a cache an earlier test filled, which
the fork empties, or in a fixture's setup). Only
launch-free tests run: a test that asks a launch fixture (conftest's @shared ones), is marked gpu, or took over 5 s
unmutated is left out. A mutant whose tests run past TIMEOUT_S, or past SLOWER times what they took unmutated where
that is longer (a constant's mutant runs all its module's tests), is stopped and told as a timeout (an endless
loop, or a machine too busy). Mutants are keyed by module, function and the line's text, never by line number.
Where the budget cannot hold every mutant, each module gets its share of the budget (by its count of mutants), and
its mutants run in turns over its functions (each function's first, then each one's second, ...), so that those
run where the time ran out are spread over every function.
"""
import argparse
import ast
import builtins
import copy
import functools
import gc
import inspect
import os
import re
import signal
import sys
import time
import types
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
TIMEOUT_S = 30
SLOWER = 3  # a loaded machine runs the same tests up to about twice as slowly

# module -> its fast tests (the files that exercise it), the most killing first as -x stops at the first failure
# (test_bad_input.py's --check cases and test_sharding.py also read the prediction, but cost 4 s a mutant more)
EDGES = ["tests/test_edges.py"]  # the pure modules' edges, each test written against a survivor: fast, first
ACCOUNTING = EDGES + ["tests/test_golden.py", "tests/test_accounting.py", "tests/test_stages.py"]
VERDICT = EDGES + ["tests/test_verdict_clauses.py", "tests/test_golden.py", "tests/test_verdict.py",
                   "tests/test_faults.py", "tests/test_summary.py", "tests/test_verdict_off_default.py",
                   "tests/test_training.py"]
PLAN = EDGES + ["tests/test_plan.py", "tests/test_plan_inputs.py"]
TARGETS = {
    "zero3bench.accounting.predict": ACCOUNTING + ["tests/test_plan.py"],
    "zero3bench.accounting.moments": ACCOUNTING,
    "zero3bench.accounting.memory": ACCOUNTING + ["tests/test_plan.py"],
    "zero3bench.accounting.host": ACCOUNTING,
    "zero3bench.accounting.shapes": ACCOUNTING + ["tests/test_plan.py"],
    "zero3bench.accounting.timing": PLAN,
    "zero3bench.accounting.traffic": EDGES + ["tests/test_comms.py", "tests/test_plan.py", "tests/test_golden.py"],
    "zero3bench.reporting.verdict": VERDICT,
    "zero3bench.reporting.bounds": VERDICT,
    "zero3bench.reporting.losses": VERDICT,
    "plan": PLAN + ["tests/test_hf.py"],  # hf_shape: a Hugging Face config, where transformers is installed
    "zero3bench.planning.inputs": PLAN,
    "zero3bench.planning.cluster": PLAN,
    "zero3bench.planning.steptime": PLAN,
}
SLOWEST_S = 5.0


# -----------------------------------------------------------------------------
# the mutations: (node type, what it becomes, its name)

COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
           ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
BINARY = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
          ast.Pow: ast.Mult, ast.Mod: ast.Mult}
BOOLEAN = {ast.And: ast.Or, ast.Or: ast.And}
# the kinds of mutation: the first run's operators, then the operand mutations
KINDS = ("comparison", "binary", "boolean", "unary", "constant", "operand", "parameter", "sides", "default", "bound")
SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
          ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+", ast.Sub: "-", ast.Mult: "*",
          ast.Div: "/", ast.FloorDiv: "//", ast.Pow: "**", ast.Mod: "%", ast.And: "and", ast.Or: "or"}


def changed_constant(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 1.5 if value else 1.0
    return None


def points(node, scope):
    """The mutations one node offers: (its kind, a description, a function that applies it to the node in place)."""
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in COMPARE:
                yield ("comparison", f"{SYMBOL[type(op)]} -> {SYMBOL[COMPARE[type(op)]]}",
                       lambda n, i=i: n.ops.__setitem__(i, COMPARE[type(n.ops[i])]()))
    elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in BINARY:
        yield ("binary", f"{SYMBOL[type(node.op)]} -> {SYMBOL[BINARY[type(node.op)]]}",
               lambda n: setattr(n, "op", BINARY[type(n.op)]()))
    elif isinstance(node, ast.BoolOp):
        yield ("boolean", f"{SYMBOL[type(node.op)]} -> {SYMBOL[BOOLEAN[type(node.op)]]}",
               lambda n: setattr(n, "op", BOOLEAN[type(n.op)]()))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        yield ("unary", "not dropped" if isinstance(node.op, ast.Not) else "- dropped",
               lambda n: setattr(n, "op", ast.UAdd()))
    elif isinstance(node, ast.Constant) and changed_constant(node.value) is not None:
        yield ("constant", f"{node.value!r} -> {changed_constant(node.value)!r}",
               lambda n: setattr(n, "value", changed_constant(n.value)))
    yield from operand_points(node, scope)


# -----------------------------------------------------------------------------
# the operand mutations: one operand replaced by another, a comparison's sides swapped, an argument dropped to its
# default, a bound off by one

OPERANDS = (ast.Name, ast.Attribute, ast.Subscript)  # what one operand may be replaced by another of its own type
ORDERED = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)  # the comparisons whose sides mean something apart


def slots(node):
    """The places of a node's sibling operands, as paths of fields and indices: a call's arguments (keyword values
    too), both sides of an arithmetic or a comparison, the values of an and/or, the items of a tuple or list read."""
    if isinstance(node, ast.Call):
        return [("args", i) for i in range(len(node.args))] + [("keywords", i, "value")
                                                                 for i in range(len(node.keywords))]
    if isinstance(node, ast.BinOp):
        return [("left",), ("right",)]
    if isinstance(node, ast.Compare):
        return [("left",)] + [("comparators", i) for i in range(len(node.comparators))]
    if isinstance(node, ast.BoolOp):
        return [("values", i) for i in range(len(node.values))]
    if isinstance(node, (ast.Tuple, ast.List)) and isinstance(node.ctx, ast.Load):
        return [("elts", i) for i in range(len(node.elts))]
    return []


def at(node, path):
    for step in path:
        node = node[step] if isinstance(step, int) else getattr(node, step)
    return node


def put(node, path, value):
    holder, last = at(node, path[:-1]), path[-1]
    holder.__setitem__(last, value) if isinstance(last, int) else setattr(holder, last, value)


def off_by_one(n, path, sign):
    put(n, path, ast.BinOp(at(n, path), ast.Add() if sign > 0 else ast.Sub(), ast.Constant(1)))


def bounds(node):
    """The paths of a range()'s arguments and a slice's ends."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
        return [("args", i) for i in range(len(node.args))]
    if isinstance(node, ast.Slice):
        return [(end,) for end in ("lower", "upper") if getattr(node, end) is not None]
    return []


def droppable(node, scope):
    """(description, path) of each argument of a call that its callee gives a default: a keyword, or the last of
    the positional ones; not one that passes the default itself."""
    signature = scope.signature(node.func) if isinstance(node, ast.Call) else None
    if signature is None or any(isinstance(a, ast.Starred) for a in node.args):
        return
    params = list(signature.parameters.values())
    given = [(k.arg, k.value, ("keywords", i)) for i, k in enumerate(node.keywords) if k.arg]
    if node.args and len(node.args) <= len(params) and params[len(node.args) - 1].kind in (
            inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        given.append((params[len(node.args) - 1].name, node.args[-1], ("args", len(node.args) - 1)))
    for name, value, path in given:
        default = signature.parameters[name].default if name in signature.parameters else inspect.Parameter.empty
        same = isinstance(value, ast.Constant) and type(value.value) is type(default) and value.value == default
        if default is not inspect.Parameter.empty and not same:
            yield f"default {name}={ast.unparse(value)} dropped", path


def swap_sides(n):
    n.left, n.comparators[0] = n.comparators[0], n.left


def dropped(n, path):
    at(n, path[:-1]).pop(path[-1])


def alike(a, b, scope):
    """Whether two neighbouring operands may stand for each other: of one type; two names not parameters of
    different hints; two attributes of one name or one object, two subscripts of one value or one index."""
    if type(a) is not type(b) or not isinstance(a, OPERANDS) or ast.unparse(a) == ast.unparse(b):
        return False
    if isinstance(a, ast.Name):
        hints = [scope.params.get(n.id) for n in (a, b)]
        return None in hints or hints[0] == hints[1]
    if isinstance(a, ast.Attribute):
        return a.attr == b.attr or ast.unparse(a.value) == ast.unparse(b.value)
    return ast.unparse(a.value) == ast.unparse(b.value) or ast.unparse(a.slice) == ast.unparse(b.slice)


def hints(node, scope):
    """{path: the hint of the callee's parameter it is passed to} of a call's arguments, where the callee is known."""
    signature = scope.signature(node.func) if isinstance(node, ast.Call) else None
    if signature is None or any(isinstance(a, ast.Starred) for a in node.args):
        return {}
    params, found = list(signature.parameters.values()), {}
    for i in range(min(len(node.args), len(params))):
        found[("args", i)] = params[i].annotation
    for i, k in enumerate(node.keywords):
        found[("keywords", i, "value")] = signature.parameters[k.arg].annotation if k.arg in signature.parameters \
            else None
    return {path: hint for path, hint in found.items() if hint not in (None, inspect.Parameter.empty)}


def operand_points(node, scope):
    found, typed = slots(node), hints(node, scope)
    for i, j in [*zip(found, found[1:]), *zip(found[1:], found)]:  # each operand replaced by its neighbour
        a, b = at(node, i), at(node, j)
        if alike(a, b, scope) and (i not in typed or j not in typed or typed[i] == typed[j]):
            yield ("operand", f"operand {ast.unparse(a)} -> {ast.unparse(b)}",
                   lambda n, i=i, j=j: put(n, i, copy.deepcopy(at(n, j))))
    if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.value, ast.Name) \
            and node.value.id in scope.params:  # x.attr read as y.attr, x and y parameters of one hint
        name = node.value.id
        for other, hint in scope.params.items():
            if other != name and hint == scope.params[name]:
                yield ("parameter", f"parameter {name} -> {other}",
                       lambda n, other=other: setattr(n.value, "id", other))
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ORDERED):
        yield "sides", "sides swapped", swap_sides
    for what, path in droppable(node, scope):
        yield "default", what, lambda n, path=path: dropped(n, path)
    for path in bounds(node):
        signs = (-1,) if isinstance(at(node, path), ast.Constant) else (1, -1)  # a constant's +1 is its own kind's
        for sign in signs:
            yield ("bound", f"bound {ast.unparse(at(node, path))} {'+' if sign > 0 else '-'} 1",
                   lambda n, path=path, sign=sign: off_by_one(n, path, sign))


class Scope:
    """What the operand mutations of one function need: its parameters (name -> its hint's text, self and cls
    left out) and the signature of a callee that the module names (a function or class of it, or of a module it
    imports), None where it names none."""
    def __init__(self, fn, module):
        args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs] if isinstance(fn, ast.FunctionDef) else []
        self.params = {a.arg: a.annotation and ast.unparse(a.annotation) for a in args if a.arg not in ("self", "cls")}
        self.module = module

    def signature(self, func):
        names = []
        while isinstance(func, ast.Attribute):
            names.insert(0, func.attr)
            func = func.value
        if not isinstance(func, ast.Name) or self.module is None:
            return None
        target = vars(self.module).get(func.id, getattr(builtins, func.id, None))
        if names and not isinstance(target, (types.ModuleType, type)):
            return None  # a method of a value: its callee is not known before it runs
        for name in names:
            target = getattr(target, name, None)
        try:
            return inspect.signature(target) if callable(target) else None
        except (TypeError, ValueError):  # a builtin without a signature
            return None


def docstrings(tree):
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def functions(tree):
    """(qualname, node) of every function and method, the outermost only (a nested function is its parent's),
    and ("<module>", node) of each assignment at the top of the module (its constants: bounds.py's)."""
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            yield "<module>", node
        elif isinstance(node, ast.FunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for inner in node.body:
                if isinstance(inner, ast.FunctionDef):
                    yield f"{node.name}.{inner.name}", inner


def mutants(source, module=None, kinds=KINDS):
    """Every mutant of a module's source of these kinds: (function, line's text, description, its index among the
    same function, line and description, the mutated module's source). module, the module imported, names the
    callees whose defaults an argument may be dropped to. A mutant that another one already makes is made once."""
    tree = ast.parse(source)
    lines = source.splitlines()
    hinted = [m for n in ast.walk(tree) if isinstance(n, ast.AnnAssign) for m in ast.walk(n.annotation)]
    # a hint's words, and a subscript's tuple: a type's arguments (list[tuple[str, int]]), not operands
    skip = docstrings(tree) | {id(m) for m in hinted} | {id(n.slice) for n in ast.walk(tree)
                                                         if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Tuple)}
    found, made = [], {source}
    for qualname, fn in functions(tree):
        scope = Scope(fn, module)
        nodes = [n for n in ast.walk(fn) if id(n) not in skip and not isinstance(n, ast.JoinedStr)]
        skip |= {id(c) for n in ast.walk(fn) if isinstance(n, ast.JoinedStr) for c in ast.walk(n)}
        for n in nodes:
            if id(n) in skip or (qualname != "<module>" and getattr(n, "lineno", fn.lineno) < fn.body[0].lineno):
                continue  # f-strings' parts, and the signature (defaults, hints)
            for kind, what, apply in points(n, scope):
                if kind not in kinds:
                    continue
                text = lines[n.lineno - 1].strip()
                twin = copy.deepcopy(tree)
                [target] = [m for m in ast.walk(twin) if type(m) is type(n)
                            and (m.lineno, m.col_offset, getattr(m, "end_col_offset", None)) ==
                            (n.lineno, n.col_offset, getattr(n, "end_col_offset", None))]
                apply(target)
                mutated = ast.unparse(twin)
                if mutated in made:
                    continue
                made.add(mutated)
                same = sum(1 for f in found if f[:3] == (qualname, text, what))
                found.append((qualname, text, what, same, mutated))
    return found


# -----------------------------------------------------------------------------
# running the tests against one mutant, in a fork

def swapped(module, qualname, source):
    """The module's function `qualname` given the code of its mutant in `source` (its __code__ and defaults)."""
    space = {"__name__": module.__name__, "__file__": module.__file__, "__builtins__": __builtins__}
    if getattr(module, "__package__", None):
        space["__package__"] = module.__package__
    exec(compile(source, module.__file__, "exec"), space)
    if qualname == "<module>":  # a constant: rebound here and wherever it was imported by name
        for name, value in space.items():
            was = module.__dict__.get(name, value)
            if isinstance(value, (int, float, str, tuple, frozenset, dict, list)) and value != was:
                for other in list(sys.modules.values()):
                    if getattr(other, name, None) is was:
                        setattr(other, name, value)
        return
    old, new = module, space
    for part in qualname.split("."):
        old, new = attribute(old, part), (new[part] if isinstance(new, dict) else attribute(new, part))
    old, new = plain(old), plain(new)
    old.__code__, old.__defaults__, old.__kwdefaults__ = new.__code__, new.__defaults__, new.__kwdefaults__


def attribute(holder, name):
    value = holder.__dict__[name] if hasattr(holder, "__dict__") and name in holder.__dict__ else getattr(holder, name)
    return value


def plain(f):
    """The function under a property, staticmethod, classmethod or functools wrapper."""
    f = f.fget if isinstance(f, property) else f
    f = f.__func__ if isinstance(f, (staticmethod, classmethod)) else f
    while hasattr(f, "__wrapped__"):
        f = f.__wrapped__
    return f


class Selection:
    """A pytest plugin that keeps the launch-free tests, and, once timed, the quick ones; given `codes` (a code
    object -> the target function it belongs to), it records which of them each test calls (`calls`)."""
    def __init__(self, launch_fixtures, slow=(), codes=None):
        self.launch_fixtures, self.slow, self.durations, self.failed = launch_fixtures, set(slow), {}, []
        self.codes, self.calls, self.called = codes, {}, set()

    def tracer(self, frame, event, arg):
        hit = self.codes.get(frame.f_code)
        if hit:
            self.called.add(hit)
        return None

    def pytest_runtest_call(self, item):
        if self.codes is not None:
            self.called = set()
            sys.settrace(self.tracer)

    def pytest_runtest_teardown(self, item):
        if self.codes is not None:
            sys.settrace(None)
            self.calls[item.nodeid] = self.calls.get(item.nodeid, set()) | self.called

    def pytest_collection_modifyitems(self, config, items):
        keep = [i for i in items if not (set(getattr(i, "fixturenames", ())) & self.launch_fixtures)
                and not i.get_closest_marker("gpu") and i.nodeid not in self.slow]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep

    def pytest_runtest_logreport(self, report):
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0) + report.duration
        if report.failed:
            self.failed.append(report.nodeid)


def run_tests(files, selection, first_failure=True):
    """pytest on these files or test ids, in their order."""
    import pytest
    args = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--no-header", "-o", "addopts=", *files]
    return pytest.main([*(["-x"] if first_failure else []), *args], plugins=[selection])


@functools.cache
def caches():
    """Every functools cache in this process, once the tests are imported: the unmutated run filled them with
    unmutated results (tests/test_golden.py's reports of every committed folder among them), which a mutant's
    tests would read back rather than compute."""
    with warnings.catch_warnings():  # isinstance on torch.distributed's deprecated names warns
        warnings.simplefilter("ignore")
        return [o for o in gc.get_objects() if isinstance(o, functools._lru_cache_wrapper) and o is not caches]


def in_a_fork(module_name, qualname, source, files, selection, unmutated_s=0.0):
    """'killed', 'survived', 'timeout', or 'invalid' where the mutated module does not run: the tests against
    the mutant, in a child process (unmutated_s: what these tests took unmutated), its caches emptied."""
    filled = caches()
    child = os.fork()
    if child == 0:
        try:
            sys.stdout.flush()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1), os.dup2(devnull, 2)
            swapped(sys.modules[module_name], qualname, source)
            for cache in filled:
                cache.cache_clear()
        except BaseException:  # noqa: BLE001 -- a mutant that cannot even be made (a tuple less a tuple)
            os._exit(3)
        os._exit(0 if run_tests(files, selection) == 0 else 1)
    deadline = time.monotonic() + max(TIMEOUT_S, SLOWER * unmutated_s)
    while time.monotonic() < deadline:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            return {0: "survived", 3: "invalid"}.get(os.waitstatus_to_exitcode(status), "killed")
        time.sleep(0.02)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    return "timeout"


def codes_of(module):
    """{code object: "module:qualname"} of every function of the module, its nested functions' code counted as
    its outermost function's (as `functions` keys the mutants)."""
    found = {}

    def walk(code, name):
        found[code] = name
        for const in code.co_consts:
            if hasattr(const, "co_code"):
                walk(const, name)
    for name, value in vars(module).items():
        holders = vars(value).items() if isinstance(value, type) and value.__module__ == module.__name__ else []
        for qualname, f in [(name, value), *((f"{name}.{k}", v) for k, v in holders)]:
            f = plain(f) if callable(f) or isinstance(f, (property, staticmethod, classmethod)) else None
            if getattr(f, "__code__", None) is not None and getattr(f, "__module__", None) == module.__name__:
                walk(f.__code__, f"{module.__name__}:{qualname}")
    return found


def launch_fixtures():
    """conftest's @shared fixtures, each a launch, and the fixtures built on them that the tests name."""
    text = (TESTS / "conftest.py").read_text()
    return set(re.findall(r"@shared\ndef (\w+)", text)) | {"stage0", "stage3", "gpu_launches", "engines"}


def in_turns(ms):
    """Each function's first mutant, then each one's second, and so on."""
    by_function = {}
    for m in ms:
        by_function.setdefault(m[0], []).append(m)
    turns = max(len(fn) for fn in by_function.values())
    return [fn[i] for i in range(turns) for fn in by_function.values() if i < len(fn)]


# a mutant that a log names as not killed: SURVIVED, TIMEOUT or UNCOVERED, module:function, the change (#n where the
# function's line has it more than once), the line's text
LINE = re.compile(r"^(SURVIVED|TIMEOUT|UNCOVERED)  (\S+):(\S+)  (.*?)(?: \(#(\d+)\))?  in: (.*)$")


def named_in(log):
    """The mutants that a log names as not killed, keyed as mutants() keys them (module, function, line's text,
    change, index)."""
    return {(m[2], m[3], m[6], m[4], int(m[5] or 1) - 1)
            for m in map(LINE.match, Path(log).read_text().splitlines()) if m}


def reached_in(log):
    """{module: (mutants run, mutants made)} as a log's lines "## MODULE: N of M run" say."""
    found = (re.match(r"^## (\S+): (\d+) of (\d+) run", line) for line in Path(log).read_text().splitlines())
    return {m[1]: (int(m[2]), int(m[3])) for m in found if m}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=900, help="the mutants' seconds, after the unmutated run")
    ap.add_argument("--only", default="", help="the targets whose name holds this")
    ap.add_argument("--survivors-of", default="", help="a log: run only the mutants it names as not killed")
    ap.add_argument("--rest-of", default="", help="a log whose time ran out: run only the mutants it did not reach "
                    "(a module whose count of mutants has changed since, whole)")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"the kinds of mutation, of {','.join(KINDS)}")
    ap.add_argument("--log", default="")
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    if set(kinds) - set(KINDS):
        ap.error(f"--kinds: not a kind: {','.join(sorted(set(kinds) - set(KINDS)))}")
    again = named_in(args.survivors_of) if args.survivors_of else None
    reached = reached_in(args.rest_of) if args.rest_of else {}
    os.chdir(ROOT)
    sys.path[:0] = [str(ROOT), str(TESTS)]
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    targets = {m: files for m, files in TARGETS.items() if args.only in m}
    log = open(args.log, "w") if args.log else sys.stdout
    say = lambda line: (print(line, file=log, flush=True), log is not sys.stdout and print(line, flush=True))
    fixtures = launch_fixtures()
    files = sorted({f for fs in targets.values() for f in fs})
    codes = {}
    for module_name in targets:
        __import__(module_name)
        codes.update(codes_of(sys.modules[module_name]))
    timing = Selection(fixtures, codes=codes)  # timed, and what each test calls
    timed = time.monotonic()
    assert run_tests(files, timing, first_failure=False) == 0, f"the unmutated tests fail: {timing.failed}"
    slow = {t for t, s in timing.durations.items() if s > SLOWEST_S}
    say(f"# unmutated: {len(timing.durations)} launch-free tests of {len(files)} files pass in "
        f"{time.monotonic() - timed:.0f} s; {len(slow)} over {SLOWEST_S} s left out: {sorted(slow)}")
    started = time.monotonic()  # the budget is the mutants'; the unmutated run above comes before it
    selection = Selection(fixtures, slow)
    plans = {}
    for module_name, tfiles in targets.items():
        __import__(module_name)
        module = sys.modules[module_name]
        ms = mutants(Path(module.__file__).read_text(), module, kinds)
        ms = ms if again is None else [m for m in ms if (module_name, *m[:4]) in again]
        if module_name in reached:  # a module whose mutants have changed since runs whole
            ran, made = reached[module_name]
            ms = in_turns(ms)[ran:] if made == len(ms) else ms
        if ms:
            plans[module_name] = (tfiles, ms)
    left = sum(len(ms) for _, ms in plans.values())
    say(f"# {left} mutants of the kinds {','.join(kinds)} over {len(plans)} modules, within {args.budget_s:.0f} s")
    counts = {}
    for module_name, (tfiles, ms) in plans.items():
        deadline = time.monotonic() + (args.budget_s - (time.monotonic() - started)) * len(ms) / left
        left -= len(ms)
        ran, mine_counted = 0, {}
        say(f"## {module_name}: {len(ms)} mutants; tests {' '.join(tfiles)}")
        mine = [t for t in timing.durations if t not in slow and t.split("::")[0] in tfiles]
        fastest = sorted(mine, key=lambda t: (tfiles.index(t.split("::")[0]), timing.durations[t]))
        for qualname, text, what, same, source in in_turns(ms):
            if time.monotonic() > deadline:
                break
            # the tests that call the function (all the module's tests for a constant), each file's quickest first
            tests = [t for t in fastest if qualname == "<module>" or f"{module_name}:{qualname}" in timing.calls[t]]
            if not tests:
                outcome = "uncovered"
            else:
                outcome = in_a_fork(module_name, qualname, source, tests, selection,
                                    sum(timing.durations[t] for t in tests))
            if outcome in ("survived", "uncovered") and tests != fastest:  # a test the trace did not see call it
                outcome = in_a_fork(module_name, qualname, source, fastest, selection,
                                    sum(timing.durations[t] for t in fastest))
            counts[outcome] = counts.get(outcome, 0) + 1
            mine_counted[outcome] = mine_counted.get(outcome, 0) + 1
            ran += 1
            if outcome not in ("killed", "invalid"):
                say(f"{outcome.upper()}  {module_name}:{qualname}  {what}" + (f" (#{same + 1})" if same else "") +
                    f"  in: {text}")
        say(f"## {module_name}: {ran} of {len(ms)} run" + ("" if ran == len(ms) else
                                                            ", in turns over its functions, as the time ran out")
            + " (" + ", ".join(f"{n} {k}" for k, n in sorted(mine_counted.items())) + ")")
    say(f"# {sum(counts.values())} mutants run in {time.monotonic() - started:.0f} s: " +
        ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))


if __name__ == "__main__":
    main()
