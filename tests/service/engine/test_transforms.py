"""The transform registry: built-ins and third-party transforms from entry points."""

from __future__ import annotations

from pathlib import Path

import pytest

from contextd.engine.policy import parse_policy
from contextd.engine.transforms import ENTRY_POINT_GROUP, Mask, TransformRegistry, UnknownTransform

PLUGIN = """
from contextd.engine.types import Proposal, Remove


class Squash:
    name = "squash"
    version = "7"

    def propose(self, context, candidates, params):
        for entry in candidates:
            yield Proposal(Remove(entry.seq), level=1, reason="squashed")
"""


@pytest.fixture
def installed_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A distribution on sys.path that declares a transform entry point, as `pip install` would leave it."""
    (tmp_path / "squash_plugin.py").write_text(PLUGIN)
    info = tmp_path / "squash_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: squash-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nsquash = squash_plugin:Squash\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_built_ins_are_registered() -> None:
    registry = TransformRegistry.default()
    assert isinstance(registry.get("mask"), Mask) and "mask" in registry.names()
    with pytest.raises(UnknownTransform):
        registry.get("nope")


def test_transforms_installed_as_entry_points_load_and_serve_policies(installed_plugin: None) -> None:
    registry = TransformRegistry.default()
    squash = registry.get("squash")
    assert (squash.name, squash.version) == ("squash", "7")
    policy = parse_policy("rules: [{name: s, transform: squash}]", registry)
    assert policy.rules[0].transform == "squash"
