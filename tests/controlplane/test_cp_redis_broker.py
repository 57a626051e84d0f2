"""The worker's Redis connection closes cleanly after Redis dropped it mid-BRPOP and
refuses new connections.

Celery's consumer then `collect()`s the connection (detaching its transport) and
`close()`s it. Closing the channels in `collect()` is cut short by the refused broker
(a fanout queue's delete fails first), so the second close restores the consumer
channel's unacknowledged message through the detached transport: stock kombu raises
`AttributeError` there, which Celery treats as unrecoverable (the worker exits); ours
raises the transport's connection error, which `close()` ignores. Real Redis behind a
TCP proxy that drops and refuses connections.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path

from cp_helpers import make_settings
from kombu import Consumer, Exchange, Message, Producer, Queue
from sqlalchemy.engine import make_url

from controlplane.worker import redis_broker
from controlplane.worker.celery_app import make_celery
from tests.tcp_proxy import TcpProxy


def test_a_connection_lost_mid_poll_closes_without_killing_the_worker(
        redis_url: str, tmp_path: Path) -> None:
    url = make_url(redis_url)
    tag = uuid.uuid4().hex[:8]
    with TcpProxy(int(url.port or 6379)) as proxy:
        broker = url.set(port=proxy.port).render_as_string()
        settings = make_settings("sqlite://", tmp_path, celery_broker_url=broker,
                                 celery_task_always_eager=False)
        conn = make_celery(settings).connection_for_read()
        assert isinstance(conn.transport, redis_broker.Transport)
        tasks = Queue(f"broker-test-{tag}")
        channel = conn.default_channel
        Producer(conn.channel()).publish({"n": 1}, routing_key=tasks.name, declare=[tasks])
        got: list[Message] = []
        channel.basic_qos(0, 2, False)  # room for a second task: the channel keeps polling
        Consumer(channel, [tasks], callbacks=[lambda _body, m: got.append(m)]).consume()
        fanout = Queue(f"broker-fan-{tag}", Exchange(f"broker-fanx-{tag}", type="fanout"),
                       auto_delete=True)  # like the worker's remote-control queue
        Consumer(conn.channel(), [fanout], callbacks=[lambda _body, _m: None]).consume()
        deadline = time.monotonic() + 10
        while not (got and channel._in_poll) and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.2)
        assert got and channel._in_poll and len(channel.qos._delivered) == 1

        proxy.down()  # open connections dropped, new ones refused
        conn.collect(socket_timeout=0.5)
        assert not channel.closed  # the first close was cut short
        conn.close()  # stock kombu: AttributeError here
    with make_celery(make_settings("sqlite://", tmp_path, celery_broker_url=redis_url,
                                   celery_task_always_eager=False)
                     ).connection_for_write() as admin:
        admin.default_channel.queue_delete(tasks.name)  # the restored message with it
