# Generated gRPC stubs of proto/modelstate/v1 (protoc 3.21.12,
# grpc_python_plugin 1.51.1). Do not edit: regenerate with
#   tests/python/stubs_current.py --write PROTOC GRPC_PYTHON_PLUGIN
# The ctest python_stubs_current fails when they drift from the protos.
