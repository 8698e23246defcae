"""Thin Python client for contextd."""
