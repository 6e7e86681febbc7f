"""``Limits(isolate=True)``: render in a worker process, under hard limits from the operating system.

The budgets of :mod:`chatcodec.limits` bound every render from inside the interpreter. A server that
renders templates its users send may want a wall around that as well: with ``isolate=True`` the render
runs in a worker process (``python -m chatcodec.isolate``) that the caller's process only talks to
through a pipe, and the worker runs each render under

* an address-space limit (``RLIMIT_AS``) of twice ``max_memory`` above what it held before the render;
* a CPU-time limit (``RLIMIT_CPU``) of the timeout plus a second;
* a wall-clock limit enforced by the caller: after the timeout plus a second without an answer, the
  worker is killed.

A worker that dies or is killed costs only itself: the render raises :class:`~chatcodec.LimitError` and
the next one starts a fresh worker. Workers are reused between renders (one per concurrent render),
so only the first render pays for starting one. Requests go to the worker pickled; answers come back as
JSON, so nothing the worker sends can run code in the caller. POSIX only (Linux, macOS).
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from typing import IO, Any

from . import exceptions
from .exceptions import ChatcodecError, InputError, LimitError
from .limits import Limits

__all__ = ["render"]

#: seconds the caller waits beyond the timeout before it kills a worker
GRACE = 1.0
_HEADER = struct.Struct("!Q")


class _Worker:
    """One worker process and the pipe to it."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "chatcodec.isolate"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        )

    def ask(self, request: bytes, wait: float) -> dict[str, Any] | None:
        """Send a request; the answer, or None if the worker died or did not answer in ``wait`` seconds."""
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(_HEADER.pack(len(request)) + request)
            stdin.flush()
            header = _read(stdout, _HEADER.size, time.monotonic() + wait)
            if header is None:
                return None
            body = _read(stdout, _HEADER.unpack(header)[0], time.monotonic() + wait)
        except OSError:
            return None
        return None if body is None else json.loads(body)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


def _read(stream: IO[bytes], size: int, deadline: float) -> bytes | None:
    """Exactly ``size`` bytes from a pipe before ``deadline``; None on end of file or time out."""
    fd = stream.fileno()
    chunks = []
    while size:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return None
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


_IDLE: list[_Worker] = []
_LOCK = threading.Lock()


def _take() -> _Worker:
    with _LOCK:
        while _IDLE:
            worker = _IDLE.pop()
            if worker.process.poll() is None:
                return worker
            worker.stop()
    return _Worker()


def _give_back(worker: _Worker) -> None:
    with _LOCK:
        _IDLE.append(worker)


@atexit.register
def _stop_all() -> None:
    with _LOCK:
        while _IDLE:
            _IDLE.pop().stop()


def render(
    source: str,
    variables: Mapping[str, Any],
    *,
    name: str | None,
    limits: Limits,
    now: datetime | None,
    track_generation: bool,
) -> tuple[str, list[tuple[int, int]]]:
    """Render ``source`` with ``variables`` in a worker process; what :func:`chatcodec.sandbox.run` returns."""
    if os.name != "posix":
        raise InputError("Limits(isolate=True) needs a POSIX system (Linux, macOS).")
    request = pickle.dumps((source, dict(variables), name, limits, now, track_generation))
    worker = _take()
    answer = worker.ask(request, limits.timeout + GRACE)
    if answer is None:
        alive = worker.process.poll() is None
        worker.stop()
        if alive:
            raise LimitError(
                f"The isolated render took longer than {limits.timeout:g} s, the time limit, and its worker"
                " process was stopped.",
                template_name=name,
            )
        raise LimitError(
            "The isolated render was stopped by the operating system's limits on its worker process"
            f" (memory: {2 * limits.max_memory // 2**20:,} MiB, CPU time: {limits.timeout:g} s).",
            template_name=name,
        )
    _give_back(worker)
    if "text" in answer:
        return answer["text"], [(start, end) for start, end in answer["spans"]]
    raise _error(answer)


def _error(answer: dict[str, Any]) -> ChatcodecError:
    """The exception the worker reported, rebuilt from its description (only chatcodec's own classes)."""
    kind = getattr(exceptions, str(answer.get("error")), None)
    if not (isinstance(kind, type) and issubclass(kind, ChatcodecError)):
        kind = exceptions.TemplateRuntimeError
    error = kind.__new__(kind)
    ChatcodecError.__init__(error, str(answer.get("message", "")))
    for key in ("template_name", "lineno", "python_type"):
        if key in answer:
            setattr(error, key, answer[key])
    return error


# --- the worker side -----------------------------------------------------------------------------------


def _serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """The worker's loop: read a request, render it under OS limits, answer; until the pipe closes."""
    from . import limits as budgets
    from . import sandbox

    while True:
        header = requests.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return
        source, variables, name, limits, now, track_generation = pickle.loads(requests.read(_HEADER.unpack(header)[0]))
        answer: dict[str, Any]
        try:
            compiled = sandbox.compile_template(source, name)
            budget = budgets.Budget(limits, now=now, track_generation=track_generation)
            with _os_limits(limits):
                text = sandbox.run(compiled, variables, name=name, budget=budget)
            answer = {"text": text, "spans": budget.spans or []}
        except ChatcodecError as exc:
            answer = {"error": type(exc).__name__, "message": exc.message}
            answer.update({k: getattr(exc, k) for k in ("template_name", "lineno", "python_type") if hasattr(exc, k)})
        except MemoryError:
            answer = {"error": "LimitError", "message": "The template ran out of memory.", "template_name": name}
        body = json.dumps(answer).encode()
        answers.write(_HEADER.pack(len(body)) + body)
        answers.flush()


class _os_limits:
    """Hard limits for one render: address space and CPU time, lifted again afterwards."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def __enter__(self) -> None:
        import resource

        self.saved = {kind: resource.getrlimit(kind) for kind in (resource.RLIMIT_AS, resource.RLIMIT_CPU)}
        used = resource.getrusage(resource.RUSAGE_SELF)
        cpu = int(used.ru_utime + used.ru_stime + self.limits.timeout) + 2
        _lower(resource.RLIMIT_CPU, cpu)
        size = _address_space()
        if size is not None:
            _lower(resource.RLIMIT_AS, size + 2 * self.limits.max_memory)

    def __exit__(self, *_: object) -> None:
        import resource

        for kind, (soft, hard) in self.saved.items():
            resource.setrlimit(kind, (soft, hard))


def _lower(kind: int, value: int) -> None:
    import resource

    soft, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    if soft == resource.RLIM_INFINITY or value < soft:
        resource.setrlimit(kind, (value, hard))


def _address_space() -> int | None:
    """The process's current virtual memory size in bytes (Linux), else None."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def main() -> None:
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but answers goes to the caller
    _serve(requests, answers)


if __name__ == "__main__":
    main()
