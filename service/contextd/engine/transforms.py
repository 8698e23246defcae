"""The registry of transforms: the built-ins (observation masking, and the strategies of
strategies.py) and those installed packages register.

Third-party transforms register under the entry-point group
`contextd.transforms` (an object or class with `name`, `version` and
`propose`; the shapes are types.py's).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, ClassVar

from contextd.engine.compress.strategy import Compress
from contextd.engine.strategies import (
    Completed,
    Dedupe,
    ErroredInputs,
    Errors,
    SameSource,
    Snapshots,
    Supersede,
)
from contextd.engine.types import Entry, Proposal, Remove, Transform, TransformContext, prunable

ENTRY_POINT_GROUP = "contextd.transforms"

BUILT_IN_STRATEGIES = (
    Dedupe(),
    SameSource(),
    Supersede(),
    Snapshots(),
    Errors(),
    ErroredInputs(),
    Completed(),
    Compress(),
)
"""The strategies on the evidence ladder (strategies.py), then compression."""

# ------------------------------------------------------------- built-ins


class Mask:
    """Observation masking: replace each candidate with a placeholder.

    A heuristic (level 4, off by default): it assumes old outputs are no
    longer needed without proving it. It is the baseline the evidence-based
    strategies are measured against.
    """

    name: ClassVar[str] = "mask"
    version: ClassVar[str] = "1"

    def propose(
        self, context: TransformContext, candidates: Sequence[Entry], params: Mapping[str, Any]
    ) -> Iterator[Proposal]:
        for entry in candidates:
            if prunable(entry):
                yield Proposal(Remove(entry.seq), level=4, reason="masked", evidence="matched the rule's conditions")

    def keys(self, context: TransformContext, entry: Entry, params: Mapping[str, Any]) -> tuple[Hashable, ...]:
        return ()  # the entry alone (types.Incremental)


def built_in() -> tuple[Transform, ...]:
    return (Mask(), *BUILT_IN_STRATEGIES)


class UnknownTransform(KeyError):
    pass


class TransformRegistry:
    def __init__(self, transforms: Iterable[Transform] = ()) -> None:
        self._transforms: dict[str, Transform] = {}
        for transform in transforms:
            self.register(transform)

    def register(self, transform: Transform) -> None:
        self._transforms[transform.name] = transform

    def get(self, name: str) -> Transform:
        try:
            return self._transforms[name]
        except KeyError:
            raise UnknownTransform(name) from None

    def names(self) -> list[str]:
        return sorted(self._transforms)

    @classmethod
    def default(cls) -> TransformRegistry:
        """The built-in transforms and those installed packages register as entry points."""
        registry = cls(built_in())
        for point in entry_points(group=ENTRY_POINT_GROUP):
            loaded = point.load()
            registry.register(loaded() if isinstance(loaded, type) else loaded)
        return registry
