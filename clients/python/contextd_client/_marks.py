"""Item metadata the service reads."""

from __future__ import annotations

COMPLETES = "contextd.completes"


def completes(first_seq: int, last_seq: int) -> dict[str, str]:
    """Metadata for an item that records the outcome of the work in items
    `first_seq`..`last_seq`: once it is appended (and shown in full), the
    default policy may take that span out of the view, each item behind a
    placeholder with its handle (certificates say "completed", level 3).

        outcome = pb.Item(role=pb.ROLE_ASSISTANT, content=[...], metadata=completes(12, 40))
    """
    if not 1 <= first_seq <= last_seq:
        raise ValueError(f"not a span of seqs: {first_seq}-{last_seq}")
    return {COMPLETES: f"{first_seq}-{last_seq}"}
