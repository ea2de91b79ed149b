"""The package's shape: imports run one way (formats <- ops <- layers <- convert <- checkpoints
<- cli, distributed <- layers/convert, nn re-exports), no import of our own modules inside a
function (the way cycles hide), no sys.modules patching, no file over 600 lines."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "python" / "mlx_fp4"
MAX_LINES = 600

# A module may import only modules of a lower rank.
RANK = {
    "_build_info": 0, "_version": 0, "_ext": 0, "_version_check": 1, "formats": 0, "tuning": 1.2, "ops": 1.5,
    "layers.linear": 2, "layers.swiglu": 3, "layers.sharded": 3, "layers.switch": 3, "layers.sharded_switch": 3.5, "layers": 4,
    "convert": 5, "recipes": 5.5, "distributed": 6,
    "checkpoints.dialects": 6, "checkpoints.gguf": 6, "checkpoints.safetensors_header": 6, "checkpoints.recipe": 6, "checkpoints.source": 6, "checkpoints.config_check": 6.5, "checkpoints.io": 7, "checkpoints.experts": 7, "checkpoints.models": 8, "checkpoints": 9,
    "export": 1, "bench": 9, "bench.__main__": 9, "cli": 10, "nn": 11, "__init__": 12, "__main__": 13,
}


def _modules():
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG).with_suffix("")
        if rel.parts[0] == "bench":
            continue  # the harness sits on top of the package
        name = ".".join(rel.parts)
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        yield name, f


def _own_imports(name, tree):
    """(target module, node) for every import of an mlx_fp4 module in ``tree``."""
    pkg = name.split(".") if name in ("layers", "checkpoints") else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - node.level + 1]
            elif node.module and node.module.split(".")[0] == "mlx_fp4":
                base, node_mod = [], node.module.split(".")[1:]
                target = ".".join(node_mod)
                yield (target or "__init__"), node
                continue
            else:
                continue
            mod = ".".join(base + (node.module.split(".") if node.module else []))
            if node.module:
                yield (mod or "__init__"), node
            else:  # from . import a, b
                for alias in node.names:
                    yield ".".join(base + [alias.name]), node
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "mlx_fp4":
                    yield (".".join(alias.name.split(".")[1:]) or "__init__"), node


def _rank(name):
    if name in RANK:
        return RANK[name]
    raise AssertionError(f"python/mlx_fp4/{name}: new module, give it a rank in tests/test_layout.py")


@pytest.mark.parametrize("name,path", list(_modules()), ids=lambda v: str(v))
def test_module_shape(name, path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_LINES, f"{path.name}: over {MAX_LINES} lines"
    assert "sys.modules" not in text, f"{path.name}: patches or walks sys.modules"
    tree = ast.parse(text)
    top_level = {id(n) for n in tree.body}
    for target, node in _own_imports(name, tree):
        if name == "_version_check" and target in ("_build_info", "_ext"):
            continue  # imported late on purpose: the version check must run first
        if name == "__init__" and isinstance(node, ast.Import):
            continue  # the docstring's example
        assert id(node) in top_level or _inside_if_or_try(tree, node), (
            f"{name} imports {target} inside a function (line {node.lineno})"
        )
        assert _rank(target) < _rank(name), (
            f"{name} (rank {_rank(name)}) imports {target} (rank {_rank(target)}): "
            "imports must run one way"
        )


def _inside_if_or_try(tree, node):
    for top in tree.body:
        if isinstance(top, (ast.If, ast.Try)) and any(n is node for n in ast.walk(top)):
            return True
    return False
