"""kombu's Redis transport, with a closed connection reported as a connection error.

When Redis drops the worker's connection while a channel is mid-BRPOP and then refuses
new connections, Celery's consumer `collect()`s the broken connection (which detaches
the transport from its kombu `Connection`) and then `close()`s it. That second close
restores the channel's unacknowledged messages, which needs a Redis connection pool,
which reads the host from the detached transport's `client` — `None` — and raises
`AttributeError`. Celery ignores only the transport's connection errors there, so the
`AttributeError` reaches the worker as "Unrecoverable error" and the worker exits.

This channel raises `redis.ConnectionError` instead: the close is ignored like any
other broker fault, the consumer reconnects, and the unacknowledged messages come back
through the visibility timeout (they stay in Redis's unacked index). `install()` points
the `redis://` and `rediss://` schemes at this transport, so kombu's scheme handling
(TLS defaults for `rediss`) is unchanged.
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis

TRANSPORT = "controlplane.worker.redis_broker:Transport"


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection.client is None:
            raise redis.ConnectionError("the broker connection was closed")
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)
        return params


class Transport(kombu_redis.Transport):
    Channel = Channel


def install() -> None:
    TRANSPORT_ALIASES["redis"] = TRANSPORT
    TRANSPORT_ALIASES["rediss"] = TRANSPORT
