"""Generated protobuf modules for the ``dex.v1`` wire contract (``proto/dex/v1/*.proto``).

Do not edit the ``*_pb2`` files by hand: change the ``.proto`` sources and run
``python scripts/gen_proto.py`` from the repository root.
"""
