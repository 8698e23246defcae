"""Every view the lab's replays render is the one recorded in tests/data/view_hashes.json.

scripts/view_hashes.py replays the traces of tests/data/traces/ and the lab's fixtures in both
view formats; a change meant to leave the views alone (a refactor) must keep every call's hash.
After a change that alters views on purpose: `python scripts/view_hashes.py record`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

# Two processes of about 30 s each, at once; a machine busy beside them may take twice that.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_every_view_is_the_one_recorded(repo_root: Path) -> None:
    spec = importlib.util.spec_from_file_location("view_hashes", repo_root / "scripts" / "view_hashes.py")
    assert spec is not None and spec.loader is not None
    view_hashes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(view_hashes)
    found = view_hashes.differences(view_hashes.compute())
    assert not found, f"the views differ from {view_hashes.HASHES.name} first at {found[0]}\n" + "\n".join(found)
