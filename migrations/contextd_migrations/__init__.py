"""contextd's Alembic history, one for Postgres and SQLite: `env.py` and `versions/`.

A package so that the wheel carries the scripts and an installed contextd migrates
without its checkout (contextd_storage.migrate finds them beside this file).
"""
