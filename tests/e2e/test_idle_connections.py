"""Idle client connections: swapgate keeps them open longer than the proxy in front does.

nginx keeps idle upstream connections for 60 s (`keepalive_timeout`), httpx's pool for 5 s. A
server that closes an idle connection first races the client's next request on it: the request is
lost with no answer (nginx: 502 for a POST, which it does not retry). uvicorn's default is 5 s.
"""

from __future__ import annotations

import http.client
import time
from urllib.parse import urlsplit

import pytest

from tests.e2e.processes import gateway, instance, simulator

pytestmark = pytest.mark.e2e


def test_an_idle_connection_stays_open_for_server_idle_timeout() -> None:
    with simulator() as sim:
        config = {"server": {"idle_timeout": "1s"}, "instances": [instance("gpu-a", sim)]}
        with gateway(config) as gw:
            address = urlsplit(gw.url)
            connection = http.client.HTTPConnection(address.hostname or "", address.port)
            assert health(connection) == 200
            time.sleep(0.3)  # idle, but shorter than the timeout: the same connection serves
            assert health(connection) == 200
            time.sleep(1.8)  # idle longer than the timeout: swapgate has closed it
            with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
                health(connection)
            connection.close()


def health(connection: http.client.HTTPConnection) -> int:
    connection.request("GET", "/healthz")
    response = connection.getresponse()
    response.read()
    return response.status
