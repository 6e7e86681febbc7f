"""``chatcodec serve --workers N``: N server processes on one listening socket.

The parent binds the port and builds the app once, then forks N children that each serve the same socket (the
kernel hands each new connection to one of them); the parent serves nothing. It forwards SIGINT and SIGTERM to
the children and waits for them; a child that exits on its own stops the rest. A child whose parent is gone
(killed, even with SIGKILL) stops too: it watches its parent's pid. Each child's request lines name its pid, so
that the log says which worker answered.

Forking needs a POSIX system; it happens before any event loop or worker thread exists in the parent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["run_workers"]

#: how often a child looks whether its parent is still there, and how long a child may take to stop
_WATCH_SECONDS = 0.5
_STOP_SECONDS = 20.0


def run_workers(count: int, serve: Callable[[], None]) -> int:
    """Fork ``count`` children that each call ``serve`` (which returns when the child is told to stop), and wait
    for them: 0 when they were stopped by a signal to this process, 1 when one of them ended on its own."""
    parent = os.getpid()
    children: list[int] = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                _watch_parent(parent)
                _name_the_worker()
                serve()
                code = 0
            except SystemExit as exc:  # uvicorn's own exit (it has said why)
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                logging.getLogger("chatcodec.server").exception("worker %d failed", os.getpid())
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children.append(pid)
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        _signal(children, signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        while children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            if pid in children:
                children.remove(pid)
            if not stopping:  # a worker ended by itself: the server is not whole any more
                print(
                    f"chatcodec: worker {pid} exited ({_how(status)}); stopping the other workers",
                    file=sys.stderr,
                    flush=True,
                )
                stopping, code = True, 1
                _signal(children, signal.SIGTERM)
    finally:
        _reap(children)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _reap(pids: list[int]) -> None:
    """Wait for ``pids`` to end, killing those still there after :data:`_STOP_SECONDS`."""
    deadline = time.monotonic() + _STOP_SECONDS
    while pids and time.monotonic() < deadline:
        for pid in list(pids):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                pids.remove(pid)
        time.sleep(0.05)
    _signal(pids, signal.SIGKILL)
    for pid in pids:
        os.waitpid(pid, 0)


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"status {os.waitstatus_to_exitcode(status)}"


def _watch_parent(parent: int) -> None:
    """Stop this child (SIGTERM, so that it finishes as on Ctrl-C) once ``parent`` is gone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_WATCH_SECONDS)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="chatcodec-parent-watch", daemon=True).start()


def _name_the_worker() -> None:
    """Put this child's pid in front of its request lines: ``chatcodec[4242]: POST /v1/messages 200 ...``."""
    pid = os.getpid()

    class Pid(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if isinstance(record.msg, str) and record.msg.startswith("chatcodec: "):
                record.msg = f"chatcodec[{pid}]: " + record.msg.removeprefix("chatcodec: ")
            return True

    logging.getLogger("chatcodec.access").addFilter(Pid())
