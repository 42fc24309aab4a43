"""The Redis broker transport: kombu's, with a channel that closes cleanly when Redis has died.

Why (issue 24 item 1). A worker always has its consumer waiting on Redis (a BRPOP in flight)
while a task runs with its message unacknowledged (`task_acks_late`; the forecast debounce's
countdown tasks too). kombu's `Channel.close` first reads the reply of that BRPOP, so as not to
lose a message Redis popped for it (celery/kombu#1733), and only ignores `Empty` there. When
Redis was killed the read raises a connection error, and the close stops before anything was
closed. Celery then cuts the transport off its connection (`Connection.collect()`, which sets
`transport.client = None`) and closes the connection again; that second close finds the channel
still open, restores the unacknowledged messages through the cut transport and raises
`AttributeError: 'NoneType' object has no attribute 'hostname'` in `_connparams`. An
AttributeError is no connection error to Celery: "Unrecoverable error", and the worker exits
instead of reconnecting.

Here a dead connection ends that read as `Empty` does: there is no reply to wait for, and
nothing it could have delivered is lost by not reading it (a message Redis popped before dying
is gone with or without the read). The close then goes on while the transport is still whole;
restoring the unacknowledged messages fails on the dead server, a connection error that
Celery ignores, and they stay in Redis's `unacked` set, where the visibility timeout
(settings: CELERY_BROKER_TRANSPORT_OPTIONS) gives them back to a worker.
"""

from __future__ import annotations

from kombu.transport import redis
from kombu.transport.virtual import Empty


class RedisChannel(redis.Channel):  # type: ignore[misc]
    def close(self) -> None:
        if self._in_poll:
            try:
                self._brpop_read()  # resets _in_poll whatever happens
            except (Empty, *self.connection_errors):
                pass
        super().close()


class RedisTransport(redis.Transport):  # type: ignore[misc]
    Channel = RedisChannel
