"""Children the benchmarks start in folders of their own import the checkout their parent does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contextd_lab.service import child_environment


def test_a_child_in_another_folder_imports_from_the_parents_relative_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout, elsewhere = tmp_path / "checkout", tmp_path / "elsewhere"
    (checkout / "src").mkdir(parents=True)
    elsewhere.mkdir()
    (checkout / "src" / "which_checkout.py").write_text("NAME = 'this one'\n")
    monkeypatch.chdir(checkout)
    monkeypatch.setenv("PYTHONPATH", "src")
    child = subprocess.run(
        [sys.executable, "-c", "import which_checkout; print(which_checkout.NAME)"],
        cwd=elsewhere,
        env=child_environment({"EXTRA": "1"}),
        capture_output=True,
        text=True,
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "this one"
    assert child_environment({"EXTRA": "1"})["EXTRA"] == "1"
