"""The admin API's client, for the CLI, the Qt client and scripts. Imports nothing heavy:
no engine, no store, no SQLAlchemy (``api`` is the HTTP client, ``locate`` finds a daemon)."""

from jobcontrol.client.api import (
    ApiError,
    Client,
    DaemonTimeoutError,
    DaemonUnreachableError,
    Event,
    StreamHandle,
    base_url,
    parse_sse,
)

__all__ = [
    "ApiError",
    "Client",
    "DaemonTimeoutError",
    "DaemonUnreachableError",
    "Event",
    "StreamHandle",
    "base_url",
    "parse_sse",
]
