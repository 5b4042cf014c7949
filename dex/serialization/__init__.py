"""The edge between Python values / domain events and bytes.

:mod:`dex.serialization.payloads` turns user values into payloads and back (docs/reference/contract.md §2);
:mod:`dex.serialization.history` maps domain events to the ``dex.v1`` protobuf messages
(each event kind's body in :mod:`dex.serialization.bodies`).
The domain never imports this package: adapters and the engine hand a converter in.
"""

from dex.serialization.payloads import (
    BINARY_PLAIN,
    BINARY_PROTOBUF,
    DEFAULT_MAX_PAYLOAD_SIZE,
    JSON_PLAIN,
    PayloadConverter,
)

__all__ = [
    "BINARY_PLAIN",
    "BINARY_PROTOBUF",
    "DEFAULT_MAX_PAYLOAD_SIZE",
    "JSON_PLAIN",
    "PayloadConverter",
]
