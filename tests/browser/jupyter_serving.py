"""A Jupyter server for a test: started on 127.0.0.1 with a token, awaited, and stopped with its children.

Used by the browser tests (`make lab`, formgrader) and by the classroom workflow test (`make
formgrader`), which imports it as ``browser.jupyter_serving``.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import time
import urllib.request

import pytest


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(command, *, port: int, token: str, log: pathlib.Path, what: str, timeout: float = 120, **popen):
    """Run ``command`` (a Jupyter server on 127.0.0.1:``port`` with ``token``, in a session of its own)
    with its output in ``log``; yield its base URL once ``/api/status`` answers. The test fails with
    the end of the log if the server stops or does not answer within ``timeout`` seconds. Afterwards
    the server's whole process group is stopped (SIGTERM, then SIGKILL after 20 s)."""
    out = open(log, "w")
    server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **popen)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{what} did not start: {pathlib.Path(log).read_text()[-2000:]}", pytrace=False)
            time.sleep(0.5)
        yield base
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        out.close()
