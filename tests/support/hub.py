"""A hub that is not there: a fresh hub cache with no proxy and nothing remembered (``hub_env``), and a loopback
server that accepts every connection and never answers (``silent_hub``). Fixtures for every test through
``pytest_plugins`` in tests/conftest.py."""

from __future__ import annotations

import socket
import threading
from collections import OrderedDict

import pytest

from core import models

PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    """A fresh hub cache, no proxy, no offline flag, no remembered probe and no loaded models: each load here is real."""
    for v in PROXY_VARS + ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(models.hub, "_REACH", {})
    monkeypatch.setattr(models.loading, "_CACHE", OrderedDict())
    return tmp_path / "hub-cache"


class SilentHub:
    """A loopback server that accepts every connection, reads what is sent and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(32)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.requests = 0  # connections that sent something (an HTTP request), as opposed to a bare connect
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        try:
            if conn.recv(65536):
                self.requests += 1
            while conn.recv(65536):
                pass
        except OSError:
            pass

    def close(self) -> None:
        self._stop = True
        for c in self.conns + [self.sock]:
            try:
                c.close()
            except OSError:
                pass


@pytest.fixture
def silent_hub(monkeypatch, hub_env):
    hub = SilentHub()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{hub.port}")
    yield hub
    hub.close()
