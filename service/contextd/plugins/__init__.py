"""Transforms that are not part of the engine: optional, off by default, registered through
the ``contextd.transforms`` entry-point group like any third party's."""
