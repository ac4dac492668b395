"""Protobuf and gRPC modules generated at build time from `proto/proto/warden.proto` (see
`setup.py`); internal to the package."""
