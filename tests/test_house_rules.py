"""Static rules of the house that the import contracts cannot state, checked on gpt1/'s source.

A name that starts with an underscore is its module's own: another module that needs it should
find it public where it belongs, so a module never reaches into another's private names.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

from gpt1.config import TASK_KINDS

PACKAGE = ROOT / "gpt1"


def module_name(file: Path, root: Path = ROOT) -> str:
    """gpt1/serve/engine.py -> gpt1.serve.engine; a package's __init__ is the package."""
    parts = file.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def imported_from(node: ast.ImportFrom, module: str) -> str:
    """The absolute module an import reads from (relative imports resolved against `module`)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")[: -node.level]
    return ".".join([*base, node.module] if node.module else base)


def private_imports(file: Path, modules: set[str], root: Path = ROOT) -> list[str]:
    """`from gpt1.x import _name`, and `m._name` where `m` is a gpt1 module imported by name."""
    module, where = module_name(file, root), file.relative_to(root)
    tree = ast.parse(file.read_text(), str(file))
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = imported_from(node, module)
            if not source.startswith("gpt1"):
                continue
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:  # a module: its attributes are checked
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
                elif private(alias.name) and source != module:
                    found.append(f"{where}:{node.lineno} {source}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("gpt1.") and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and private(node.attr)
        ):
            found.append(f"{where}:{node.lineno} {aliases[node.value.id]}.{node.attr}")
    return found


def test_no_module_imports_another_modules_private_names():
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    offenders = [hit for f in files for hit in private_imports(f, modules)]
    assert offenders == []


def test_the_private_import_check_sees_both_forms(tmp_path):
    """The check itself: it finds `from gpt1.x import _name` and `x._name`, and leaves a
    module's own names, dunders and public names alone."""
    root = tmp_path / "repo"
    (root / "gpt1" / "sub").mkdir(parents=True)
    (root / "gpt1" / "__init__.py").write_text("__version__ = '0'\n")
    (root / "gpt1" / "sub" / "__init__.py").write_text("")
    (root / "gpt1" / "sub" / "a.py").write_text("def _own(): pass\ndef public(): pass\n")
    (root / "gpt1" / "sub" / "b.py").write_text(
        "from gpt1 import __version__\n"
        "from gpt1.sub.a import public, _own\n"
        "from gpt1.sub import a\n"
        "from . import a as same\n"
        "from .a import _own as again\n"
        "a._own()\nsame._own()\na.public()\n"
    )
    files = sorted((root / "gpt1").rglob("*.py"))
    modules = {module_name(f, root) for f in files}
    found = private_imports(root / "gpt1" / "sub" / "b.py", modules, root)
    assert [hit.split(" ")[1] for hit in found] == [
        "gpt1.sub.a._own",  # from gpt1.sub.a import _own
        "gpt1.sub.a._own",  # from .a import _own as again
        "gpt1.sub.a._own",  # a._own()
        "gpt1.sub.a._own",  # same._own()
    ]


def test_no_function_is_long_or_wide():
    """A function spans at most 80 lines and takes at most 8 parameters (positional and
    keyword-only, *args and **kwargs one each; self and cls not counted): settings past that
    travel as one value."""
    long, wide = [], []
    for file in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            where = f"{file.relative_to(ROOT)} {node.name}"
            args = node.args
            rest = [args.vararg, args.kwarg]
            names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs + rest if a]
            if node.end_lineno - node.lineno + 1 > 80:
                long.append(where)
            if len(names) - (names[:1] in (["self"], ["cls"])) > 8:
                wide.append(where)
    assert (long, wide) == ([], [])


def kind_strings_compared(source: str) -> list[int]:
    """Lines that compare a value with a task kind's string (`kind == "choice"`,
    `kind in ("pair", "similarity")`, `case "single":`)."""

    def kinds(node: ast.AST) -> bool:
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(map(kinds, node.elts))
        return isinstance(node, ast.Constant) and node.value in TASK_KINDS

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(map(kinds, [node.left, *node.comparators])):
            lines.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and kinds(node.value):
            lines.append(node.lineno)
    return lines


def test_task_kinds_are_compared_as_strings_only_in_tasks():
    """What differs between task kinds is read from `gpt1.tasks.kinds.KINDS` (or the task);
    outside gpt1/tasks/ a kind is never compared with its string."""
    found = [
        f"{file.relative_to(ROOT)}:{line}"
        for file in sorted(PACKAGE.rglob("*.py"))
        if PACKAGE / "tasks" not in file.parents
        for line in kind_strings_compared(file.read_text())
    ]
    assert found == []
    sample = 'a == "choice"\nb in ("pair", "x")\nmatch c:\n    case "single": pass\nd == "x"\n'
    assert kind_strings_compared(sample) == [1, 2, 4]


def positional_sampling_calls(source: str) -> list[int]:
    """Lines that build a `Sampling` with positional arguments (`Sampling(20, 0.0)`)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "Sampling"
        and node.args
    ]


def test_sampling_is_built_by_keyword():
    """Every `Sampling(...)` in gpt1/ names its fields (`Sampling(max_new_tokens=20, top_k=40)`),
    so a new field takes no edit where one is built."""
    found = [
        f"{file.relative_to(ROOT)}:{line}"
        for file in sorted(PACKAGE.rglob("*.py"))
        for line in positional_sampling_calls(file.read_text())
    ]
    assert found == []
    sample = "Sampling()\nSampling(max_new_tokens=3, **o)\nSampling(3)\nsampling.Sampling(*a)\n"
    assert positional_sampling_calls(sample) == [3, 4]
