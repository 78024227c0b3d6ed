"""Listening ports for the servers tests start (the control plane, operators, Prometheus, webhooks).

A port comes from below the kernel's ephemeral range (ip_local_port_range, 32768-60999 by default): a port the kernel
hands out as the source of some outgoing connection between our check and the server's bind would make the server
fail with "address already in use". Each xdist worker (.ci/test runs two) has a slice of its own, so two workers
never hand out the same port; within a worker the ports are handed out in turn from a random start, so a port given
to a server that has not bound it yet is not given again, and two pytest runs on one machine rarely meet.
"""

from __future__ import annotations

import itertools
import os
import random
import socket

LISTEN_PORTS = range(20000, 32000)
WORKER_SLICE = 2000  # ports per xdist worker: six slices, more workers share them


def _worker_ports() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # set by xdist in each worker; absent in a serial run
    index = int(worker.removeprefix("gw") or 0) % (len(LISTEN_PORTS) // WORKER_SLICE)
    start = LISTEN_PORTS.start + index * WORKER_SLICE
    return range(start, start + WORKER_SLICE)


_PORTS = _worker_ports()
# Its own generator: tests that seed the global one (Hypothesis does) must not make workers or runs pick alike.
_START = random.Random().randrange(len(_PORTS))
_NEXT = itertools.cycle([*_PORTS[_START:], *_PORTS[:_START]])


def free_port() -> int:
    for _ in range(len(_PORTS)):
        port = next(_NEXT)
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue  # in use (a server of this run, or another program)
            return port
    raise RuntimeError(f"no free port in {_PORTS.start}-{_PORTS.stop - 1}")
