"""Generated protobuf and gRPC stubs for contextd.v1 (scripts/gen_protos.py)."""
