"""Renderers from items to provider message formats."""
