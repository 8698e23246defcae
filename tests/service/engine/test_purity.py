"""The engine is pure (DESIGN section 2): it imports no wire, database or cache library.

Checked on the source, statically, so an import inside a function or behind
TYPE_CHECKING counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import contextd.engine

ENGINE = Path(contextd.engine.__file__).parent

FORBIDDEN = (
    "grpc",
    "grpc_health",
    "grpc_reflection",
    "google.protobuf",
    "google.rpc",
    "contextd_client",  # the generated protobuf stubs live there
    "sqlalchemy",
    "alembic",
    "asyncpg",
    "aiosqlite",
    "redis",
    "contextd.api",
    "contextd_storage",
)


def imported_modules(source: str, module: str) -> set[str]:
    """Absolute names of every module `source` (the text of `module`) imports."""
    package = module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing module's package
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - (node.level - 1)])
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            # `from x import y` may import the module x.y
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def forbidden_imports(source: str, module: str) -> list[str]:
    return sorted(
        name
        for name in imported_modules(source, module)
        for bad in FORBIDDEN
        if name == bad or name.startswith(bad + ".")
    )


def engine_modules() -> list[tuple[str, Path]]:
    modules = []
    for path in sorted(ENGINE.rglob("*.py")):
        parts = path.relative_to(ENGINE.parent.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if parts[-1] == "__init__":
            name += ".__init__"  # so relative imports resolve against the package itself
        modules.append((name, path))
    return modules


def test_the_scan_sees_the_whole_engine() -> None:
    names = {name for name, _ in engine_modules()}
    for expected in (
        "contextd.engine.model",
        "contextd.engine.codec",
        "contextd.engine.validation",
        "contextd.engine.view",
        "contextd.engine.render.openai",
        "contextd.engine.render.anthropic",
    ):
        assert expected in names


@pytest.mark.parametrize(("module", "path"), engine_modules(), ids=[name for name, _ in engine_modules()])
def test_engine_module_is_pure(module: str, path: Path) -> None:
    assert forbidden_imports(path.read_text(encoding="utf-8"), module) == []


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("import grpc", "contextd.engine.view", ["grpc"]),
        ("import grpc.aio as aio", "contextd.engine.view", ["grpc.aio"]),
        ("from sqlalchemy import select", "contextd.engine.view", ["sqlalchemy", "sqlalchemy.select"]),
        ("def f():\n    import redis.asyncio\n", "contextd.engine.view", ["redis.asyncio"]),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from contextd_storage import history\n",
            "contextd.engine.view",
            ["contextd_storage", "contextd_storage.history"],
        ),
        ("from ..api import mapping", "contextd.engine.view", ["contextd.api", "contextd.api.mapping"]),
        (
            "from ...api.errors import x",
            "contextd.engine.render.openai",
            ["contextd.api.errors", "contextd.api.errors.x"],
        ),
        (
            "from contextd_client.v1 import content_pb2",
            "contextd.engine.view",
            ["contextd_client.v1", "contextd_client.v1.content_pb2"],
        ),
        ("import grpcio_tools, redisx", "contextd.engine.view", []),  # prefixes match whole names only
        ("from .model import Item\nfrom contextd.engine import codec", "contextd.engine.view", []),
    ],
)
def test_the_scan_catches_forbidden_imports(source: str, module: str, expected: list[str]) -> None:
    assert forbidden_imports(source, module) == expected
