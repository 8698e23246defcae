"""The pure core: domain model, validation, token counting, rendering. No grpc, SQLAlchemy or redis imports."""
