"""Service adapters: gRPC servicer, interceptors, protobuf mapping, server lifecycle."""
