"""Compressors: reduced forms of tool outputs that keep their facts (view only).

A compressor writes an output's own lines, verbatim, choosing what stays by
fixed rules about where facts live (the error line, the failing test id,
the anomalous row, the definition of the symbol asked about); what it leaves
out is said by count and line range, and the original stays retrievable by
handle. The router (router.py) picks the compressor by declared type, tool
hint, then cheap sniffing, and remembers its choice by content hash.
"""

from contextd.engine.compress.router import KINDS, compress, route
from contextd.engine.compress.text import NO_FOCUS, Compressed, Focus

__all__ = ["KINDS", "NO_FOCUS", "Compressed", "Focus", "compress", "route"]
