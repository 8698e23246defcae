"""JSON: the schema once, constants factored out, the rows that stand out kept whole.

An array of objects becomes its field list with types, the fields whose
value is the same in every row (said once), and the rows worth reading,
verbatim, with their index: the first and the last, every row with an
error-like value, a field missing or extra, a rare value of a field that
takes few values, a numeric outlier, or a mention of the focus. Other rows
are counted by index range. Objects are walked: the large arrays inside
are treated the same way, the rest is written as it was.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import Counter
from typing import Any

from contextd.engine.compress.text import Compressed, Focus, Lines

MIN_ROWS = 8
MAX_WHOLE_TEXTS = 50
"""A list of strings this long or shorter is written whole."""
"""Shorter arrays are written whole."""
_ERRORISH = ("error", "fail", "exception", "fatal", "denied", "invalid", "timeout", "refused", "panic", "critical")
"""A value holding one of these (in any case, inside any word) says something went wrong."""
_ERROR_KEYS = re.compile(r"^(?:error|errors|err|exception|failure|fault)s?$", re.IGNORECASE)
_RARE = 0.05
"""A value seen in at most this share of the rows, of a field that takes few values, stands out."""
_FENCE = 3.0
"""Numbers beyond this many interquartile ranges outside the quartiles are outliers."""


_last_parsed: tuple[str, Any] | None = None


def parse(text: str) -> Any | None:
    """The JSON value the text holds (None when it is not JSON of an array or object). The last
    text parsed is remembered (by identity): sniffing parses it, then its compression needs it."""
    global _last_parsed
    last = _last_parsed
    if last is not None and last[0] is text:
        return last[1]
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        value = json.loads(stripped)
    except (ValueError, RecursionError):  # deeper than the parser goes: not data to compress
        return None
    _last_parsed = (text, value)
    return value


def compress_json(text: str, focus: Focus, value: Any | None = None) -> Compressed | None:
    data = parse(text) if value is None else value
    if data is None:
        return None
    notes: list[str] = []
    out = _write(data, focus, "$", notes, 0)
    if not notes:
        return None  # no array long enough to crush
    return Compressed("json", out, "; ".join(notes[:3]) + (f"; {len(notes) - 3} more arrays" if len(notes) > 3 else ""))


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _write(value: Any, focus: Focus, path: str, notes: list[str], depth: int) -> str:
    pad = "  " * depth
    if isinstance(value, list) and len(value) >= MIN_ROWS:
        if all(isinstance(v, dict) for v in value):
            return _rows(value, focus, path, notes, pad)
        if all(isinstance(v, (int, float, str, bool)) or v is None for v in value):
            return _scalars(value, focus, path, notes, pad)
    if isinstance(value, dict) and depth < 4:
        inner = [
            f"{pad}  {_dump(str(k))}: {_write(v, focus, f'{path}.{k}', notes, depth + 1).lstrip()}"
            for k, v in value.items()
        ]
        return pad + "{\n" + ",\n".join(inner) + "\n" + pad + "}" if inner else pad + "{}"
    if isinstance(value, list) and depth < 4 and any(isinstance(v, (list, dict)) for v in value):
        inner = [_write(v, focus, f"{path}[{i}]", notes, depth + 1) for i, v in enumerate(value)]
        return pad + "[\n" + ",\n".join(inner) + "\n" + pad + "]"
    return pad + _dump(value)


_TYPE_NAMES = {type(None): "null", bool: "bool", int: "int", float: "number", str: "string", list: "array"}


_MISSING = object()
"""A row without the field (a column holds it where the row has no value)."""


def _rows(rows: list[dict[str, Any]], focus: Focus, path: str, notes: list[str], pad: str) -> str:
    # Read by column: each test runs over a list at C speed where it can.
    n = len(rows)
    fields = list(dict.fromkeys(itertools.chain.from_iterable(rows)))
    columns = {k: [r.get(k, _MISSING) for r in rows] for k in fields}
    counts = {k: n - column.count(_MISSING) for k, column in columns.items()}
    kinds = {k: set(map(type, column)) - {object} for k, column in columns.items()}
    types = {k: sorted(_TYPE_NAMES.get(t, "object") for t in kinds[k]) for k in fields}
    constant = {
        k: column[0]
        for k, column in columns.items()
        if counts[k] == n and len(kinds[k]) == 1 and column.count(column[0]) == n
    }
    usual = {k for k in fields if counts[k] > n / 2}
    why: dict[int, str] = {0: "first", n - 1: "last"}

    def flag(i: int, reason: str) -> None:
        why[i] = why[i] + ", " + reason if i in why and reason not in why[i] else why.get(i, reason)

    for i in [i for i, row in enumerate(rows) if row.keys() != usual]:
        keys = set(rows[i])
        missing, extra = sorted(usual - keys), sorted(keys - usual)
        flag(i, "fields " + " ".join([*(f"-{k}" for k in missing), *(f"+{k}" for k in extra)]))
    for k, column in columns.items():
        if k in constant:
            continue
        if _ERROR_KEYS.match(k):
            for i, v in enumerate(column):
                if v is not _MISSING and v not in (None, "", [], {}, 0, False):
                    flag(i, f"{k} set")
            continue
        _search(k, column, kinds[k], focus, flag)
        seen = {int if t is float else t for t in kinds[k]}  # (numbers are one kind, as in _kind)
        if len(seen) > 1 or seen & {list, dict}:  # (else every value is of one kind: none stands out)
            _odd_types(k, column, flag)
        _rare_values(k, column, flag)
        _outliers(k, column, flag)
    shown = sorted(why)
    lines = [
        f"{pad}[contextd: JSON array at {path}: {n:,} objects; fields: "
        + ", ".join(f"{k} ({'|'.join(types[k])}{'' if counts[k] == n else f', in {counts[k]:,}'})" for k in fields)
        + "]"
    ]
    if constant:
        lines.append(f"{pad}[the same in every row, left out of the rows below: {_dump(constant)}]")
    previous = -1
    for i in shown:
        if i > previous + 1:
            lines.append(
                f"{pad}[… rows {previous + 1}-{i - 1} left out …]"
                if i > previous + 2
                else f"{pad}[… row {previous + 1} left out …]"
            )
        row = {k: v for k, v in rows[i].items() if k not in constant}
        lines.append(f"{pad}[{i}] {_dump(row)}  # {why[i]}")
        previous = i
    notes.append(
        f"{path}: {len(shown):,} of {n:,} rows kept" + (f", {len(constant)} constant fields" if constant else "")
    )
    return "\n".join(lines)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _search(key: str, column: list[Any], kinds: set[type], focus: Focus, flag: Any) -> None:
    """Flag the rows whose value in `column` says an error, or mentions the focus: each distinct
    text once, all of them in one pass per word (matches are rare)."""
    if kinds <= {bool, int, float, type(None)}:
        return
    held: dict[str, list[int]] = {}
    for i, v in enumerate(column):
        if type(v) is str:
            held.setdefault(v, []).append(i)
        elif v is not _MISSING and isinstance(v, (dict, list)):
            held.setdefault(_dump(v), []).append(i)
    values = list(held)
    found = Lines.of(values)
    for n in found.having(_ERRORISH, fold_case=True, anywhere=True):
        for i in held[values[n]]:
            flag(i, f"{key} says {values[n][:40]!r}")
    for n in focus.lines_mentioning(found):
        for i in held[values[n]]:
            flag(i, "mentions the focus")


def _odd_types(key: str, column: list[Any], flag: Any) -> None:
    """Flag the rows whose value is of another type than most rows' (a null, a string among
    numbers) or an empty array or object where most are not empty."""
    present = [(i, v) for i, v in enumerate(column) if v is not _MISSING]
    kinds = Counter(_kind(v) for _, v in present)
    if len(kinds) < 2:
        return
    usual, count = kinds.most_common(1)[0]
    if count < len(present) / 2:
        return  # no usual type to stand out from
    for i, v in present:
        kind = _kind(v)
        if kind != usual:
            flag(i, f"{key} is {kind}" + ("" if kind.startswith("empty") else f" where most are {usual}"))


def _kind(value: Any) -> str:
    if isinstance(value, (list, dict)) and not value:
        return f"empty {_TYPE_NAMES.get(type(value), 'object')}"
    if type(value) is float:
        return "int"  # numbers are one kind here: 1 and 1.5 do not stand out from each other
    return _TYPE_NAMES.get(type(value), "object")


def _rare_values(key: str, column: list[Any], flag: Any) -> None:
    # Keyed with the type: True and 1 are different values here.
    values = [(type(v), v) for v in column if v is None or type(v) in (str, bool)]
    if len(values) < MIN_ROWS:
        return
    counts = Counter(values)
    if len(counts) > max(3, len(values) // 10):
        return  # a field of many values (names, ids): nothing is rare in it
    limit = max(1, int(len(values) * _RARE))
    rare = {value for value, count in counts.items() if count <= limit}
    for i, v in enumerate(column):
        if rare and (v is None or type(v) in (str, bool)) and (type(v), v) in rare:
            flag(i, f"rare {key}={v!r:.40}")


def _outliers(key: str, column: list[Any], flag: Any) -> None:
    numbers = [(i, float(v)) for i, v in enumerate(column) if type(v) in (int, float) and math.isfinite(v)]
    if len(numbers) < MIN_ROWS:
        return
    ordered = sorted(v for _, v in numbers)
    q1, q3 = ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]
    spread = q3 - q1
    if spread == 0:
        median = ordered[len(ordered) // 2]
        counts = Counter(ordered)
        limit = max(1, int(len(numbers) * _RARE))
        for i, v in numbers:
            if v != median and counts[v] <= limit:
                flag(i, f"{key}={v:g} (all but a few are {median:g})")
        return
    low, high = q1 - _FENCE * spread, q3 + _FENCE * spread
    for i, v in numbers:
        if v < low or v > high:
            flag(i, f"{key}={v:g} outlier")


def _scalars(values: list[Any], focus: Focus, path: str, notes: list[str], pad: str) -> str:
    n = len(values)
    if n <= MAX_WHOLE_TEXTS and all(isinstance(v, str) for v in values):
        return pad + _dump(values)  # a list of messages or names: each may be the fact
    keep = set(range(min(5, n))) | set(range(max(0, n - 3), n))
    keep.update(
        i
        for i, v in enumerate(values)
        if isinstance(v, str) and (focus.mentions(v) or any(word in v.lower() for word in _ERRORISH))
    )
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    described = f"{n:,} values"
    if len(numbers) == n:
        described += f", min {min(numbers):g}, max {max(numbers):g}"
        _outliers("v", values, lambda i, _: keep.add(i))
    if len(keep) >= n:
        return pad + _dump(values)
    shown = sorted(keep)
    notes.append(f"{path}: {len(shown):,} of {n:,} values kept")
    parts, previous = [], -1
    for i in shown:
        if i > previous + 1:
            parts.append(f"/* … {i - previous - 1:,} left out … */")
        parts.append(_dump(values[i]))
        previous = i
    return f"{pad}[{', '.join(parts)}]  // {described}, at {path}"
