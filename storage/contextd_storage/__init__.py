"""Storage adapters: schema, database and locks, history store, migrations."""
