"""The package's floors (docs/layout.md): no import from a lower floor to a higher one, no
sys.path edits, and the model's default config touched at few places."""

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "focus_lab"
# floor of each top-level part of focus_lab; a module may import only from floors <= its own
FLOORS = {"io": 0, "data": 0, "runs": 0, "model_names": 0, "method": 1, "patterns": 1, "hf": 2, "train": 3, "recording": 3, "eval": 3,
          "cli": 4, "errors": 4, "__main__": 4, "__init__": 4, "app": 4}


def _part(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "focus_lab" else None


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import; focus_lab uses absolute imports")
    return out


def test_no_import_from_a_lower_floor_to_a_higher_one():
    bad = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        part = rel.parts[0].removesuffix(".py")
        floor = FLOORS[part]
        for mod in _imports(path):
            target = _part(mod)
            if target in FLOORS and FLOORS[target] > floor and target != part:
                bad.append(f"{rel} imports {mod} (floor {FLOORS[target]} > {floor})")
    assert not bad, "\n".join(sorted(set(bad)))


def test_the_layer_check_catches_an_upward_import(tmp_path):
    """The check above can fail: an import of the CLI from method/ is reported."""
    src = PKG / "method" / "core.py"
    mods = _imports(src) + ["focus_lab.cli"]
    assert any(FLOORS[_part(m)] > FLOORS["method"] for m in mods if _part(m) in FLOORS)


def test_no_sys_path_edits_and_few_default_config_sites():
    for folder in (PKG, ROOT / "app"):
        for path in folder.rglob("*.py"):
            assert not re.search(r"sys\.path\.(insert|append)", path.read_text()), path
    out = subprocess.run(["git", "grep", "-c", r"set_config\|focus_config(model", "--", "focus_lab"],
                         cwd=ROOT, capture_output=True, text=True).stdout
    total = sum(int(line.rsplit(":", 1)[1]) for line in out.splitlines())
    assert total <= 5, out


def test_library_code_sets_no_environment_variable():
    for path in PKG.rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"os\.environ\[[^\]]+\]\s*=|os\.environ\.(setdefault|update)|putenv", text), path


def _module_graph() -> dict[str, set[str]]:
    """{module: the project modules it imports anywhere in its body (function-level imports too)}
    over focus_lab/, app/ (installed as focus_lab.app) and analyses/."""
    roots = {"focus_lab": PKG, "analyses": ROOT / "analyses", "focus_lab.app": ROOT / "app"}
    files = {}
    for pkg, root in roots.items():
        for f in root.rglob("*.py"):
            if pkg == "focus_lab" and f.relative_to(root).parts[0] == "app":
                continue
            parts = [p for p in f.relative_to(root).with_suffix("").parts if p != "__init__"]
            files[".".join([pkg, *parts])] = f
    graph = {m: set() for m in files}
    for m, f in files.items():
        for name in _imports(f):
            if name in files and name != m and not m.startswith(name + "."):  # a package's own parent
                graph[m].add(name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(_module_graph()) == []
    # the check can fail: a module importing back one that imports it is a cycle
    g = _module_graph()
    g["focus_lab.method.config"].add("focus_lab.method.core")
    assert ["focus_lab.method.config", "focus_lab.method.core"] in _cycles(g)


def test_analyses_import_no_private_name_and_not_the_cli():
    bad = []
    for f in (ROOT / "analyses").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("focus_lab"):
                bad += [f"{f.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
                if node.module == "focus_lab.cli" or (node.module == "focus_lab" and any(a.name == "cli" for a in node.names)):
                    bad.append(f"{f.name}: imports focus_lab.cli")
            elif isinstance(node, ast.Import):
                bad += [f"{f.name}: imports {a.name}" for a in node.names if a.name == "focus_lab.cli"]
    assert not bad, bad
