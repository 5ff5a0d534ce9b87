"""Generated protobuf and gRPC stubs of the ``gnomon.worker.v1`` protocol.

Do not edit the ``worker_pb2*`` modules: ``gen.sh`` regenerates them from the
canonical ``worker.proto``.
"""
