"""The README documents every setting, exactly as the code defines it."""

from __future__ import annotations

from pathlib import Path

from contextd.config import markdown_table


def test_readme_configuration_table_is_current(repo_root: Path) -> None:
    readme = (repo_root / "README.md").read_text()
    assert markdown_table() in readme, "README's configuration table is stale: paste `contextd config --markdown`"
