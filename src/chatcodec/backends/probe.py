"""The engine check: llama.cpp is tried in a child process before any process of ours loads it.

llama.cpp's CPU library picks its fast paths from what the CPU says it has. Where the CPU (or a
hypervisor) advertises a path it does not run, such as AMX tiles on some x86 VMs, or where the library
was built with ``-march=native`` on another CPU and reused from a wheel cache, the first evaluation dies
by a signal (SIGSEGV at ``ldtilecfg``, SIGILL), and takes the whole process with it. A server must find
this out before it takes traffic, so before the embedded model loads:

1. a child process (``python -m chatcodec.backends.probe``) loads the model with llama.cpp's default
   parameters and decodes a few tokens;
2. if the child dies by a signal (or hangs), the *safe* configuration is tried the same way: no extra
   buffer types (``use_extra_bufts=False``: no weight repacking, so neither the AMX nor the other repack
   kernels run);
3. the first configuration that works is used, and the outcome is cached under the user's cache
   directory, keyed by the llama-cpp-python version, the CPU library's path and mtime, and the CPU's
   flags: a rebuild or another machine checks again, a restart does not.

If nothing works, :func:`choose_engine` raises one :class:`~chatcodec.LoadError` line naming the signal, the
library and the fix (rebuild llama-cpp-python with ``CMAKE_ARGS="-DGGML_NATIVE=OFF"``), never a dead process.
``CHATCODEC_ENGINE=default|safe`` (or ``--engine`` on the command line) forces a configuration with no check;
``auto`` (the default) checks.

>>> SAFE.model_params()
{'use_extra_bufts': False}
>>> DEFAULT.model_params()
{}
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..exceptions import InputError, LoadError

__all__ = [
    "CONFIGS",
    "DEFAULT",
    "ENGINE_ENV",
    "SAFE",
    "Attempt",
    "EngineChoice",
    "EngineConfig",
    "cache_dir",
    "choose_engine",
    "cpu_facts",
    "engine_build",
    "engine_params",
    "probe",
]

#: the environment variable that forces a configuration (``auto``, ``default`` or ``safe``)
ENGINE_ENV = "CHATCODEC_ENGINE"
#: how long one probe child may take to load the model and decode (a busy CI machine loads in seconds)
PROBE_TIMEOUT = 120.0
#: tokens a probe decodes after its prompt (the prompt's batch and single-token steps both run)
PROBE_TOKENS = 8
_FIX = (
    'rebuild it for this CPU: CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install --force-reinstall --no-cache-dir'
    " llama-cpp-python"
)
_CACHE_VERSION = 1


@dataclass(frozen=True)
class EngineConfig:
    """A way to run llama.cpp: ``name`` as the option spells it, and whether extra buffer types are used."""

    name: str
    extra_bufts: bool
    description: str

    def model_params(self) -> dict[str, Any]:
        """The fields of llama.cpp's model parameters this configuration sets (beside their defaults)."""
        return {} if self.extra_bufts else {"use_extra_bufts": False}


DEFAULT = EngineConfig("default", True, "llama.cpp's default parameters")
SAFE = EngineConfig("safe", False, "without extra buffer types (no weight repacking, no AMX)")
#: the configurations in the order the check tries them
CONFIGS: dict[str, EngineConfig] = {c.name: c for c in (DEFAULT, SAFE)}


@dataclass(frozen=True)
class Attempt:
    """One probe child: the configuration, whether it worked, how it ended, and its speed when it worked."""

    config: str
    ok: bool
    ended: str  # "ok", a signal's name ("SIGSEGV"), "exit 1", "timeout"
    detail: str = ""  # the child's last lines of stderr when it failed
    tokens_per_second: float | None = None
    system_info: str = ""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attempt:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class EngineChoice:
    """The configuration chosen for this machine and engine build, and why (:attr:`line` says it in one line)."""

    config: EngineConfig
    reason: str
    attempts: tuple[Attempt, ...] = ()
    cached: bool = False
    forced: bool = False
    key: Mapping[str, Any] = field(default_factory=dict)

    @property
    def line(self) -> str:
        """The line a command prints at start: ``chatcodec: ...``."""
        return f"chatcodec: {self.reason}"

    @property
    def tokens_per_second(self) -> float | None:
        return next((a.tokens_per_second for a in self.attempts if a.ok and a.config == self.config.name), None)

    def model_params(self) -> dict[str, Any]:
        return self.config.model_params()


# ---------------------------------------------------------------------------------------------------------------
# what the cache is keyed by


def cpu_facts() -> dict[str, Any]:
    """The CPU's name, its core count and its flags, as the kernel reports them (``/proc/cpuinfo`` on Linux)."""
    name, flags = platform.processor() or platform.machine(), ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and name in ("", platform.machine(), platform.processor()):
                name = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = value.strip()
    return {"name": name, "machine": platform.machine(), "cores": os.cpu_count() or 1, "flags": sorted(flags.split())}


def engine_build() -> dict[str, Any]:
    """llama-cpp-python's version and its CPU library (path and mtime), found without loading it."""
    try:
        from importlib import metadata

        version = metadata.version("llama-cpp-python")
    except Exception:  # not installed: the caller's import of llama_cpp says so
        version = "not installed"
    library, mtime = "", 0
    spec = _find_spec("llama_cpp")
    if spec is not None and spec.origin:
        folder = Path(spec.origin).parent / "lib"
        found = sorted(folder.glob("*ggml-cpu*")) or sorted(folder.glob("*llama*"))
        if found:
            library = str(found[0])
            mtime = found[0].stat().st_mtime_ns
    return {"llama_cpp_python": version, "library": library, "library_mtime": mtime}


def _find_spec(name: str) -> Any:
    import importlib.util

    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _key(build: Mapping[str, Any], cpu: Mapping[str, Any]) -> dict[str, Any]:
    flags = hashlib.sha256(" ".join(cpu["flags"]).encode()).hexdigest()[:16]
    return {**build, "cpu": cpu["name"], "cpu_flags": flags}


def cache_dir() -> Path:
    """Where the check keeps what it found: ``$CHATCODEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/chatcodec``, else
    ``~/.cache/chatcodec`` (``%LOCALAPPDATA%\\chatcodec`` on Windows)."""
    given = os.environ.get("CHATCODEC_CACHE_DIR")
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or (os.environ.get("LOCALAPPDATA") if os.name == "nt" else None)
    return (Path(base) if base else Path.home() / ".cache") / "chatcodec"


# ---------------------------------------------------------------------------------------------------------------
# the check


def _forced(force: str | None) -> str:
    value = force if force is not None else os.environ.get(ENGINE_ENV, "auto")
    value = value.strip().lower() or "auto"
    if value != "auto" and value not in CONFIGS:
        where = "--engine" if force is not None else ENGINE_ENV
        raise InputError(f"{where} must be auto, default or safe, not {value!r}.")
    return value


def choose_engine(
    model: str | Path,
    *,
    force: str | None = None,
    recheck: bool = False,
    directory: Path | None = None,
    command: Sequence[str] | None = None,
    timeout: float = PROBE_TIMEOUT,
) -> EngineChoice:
    """The llama.cpp configuration to run ``model`` with on this machine (see the module docstring).

    ``force`` is ``auto`` (check; the default, or ``$CHATCODEC_ENGINE``), ``default`` or ``safe`` (no check).
    ``recheck`` ignores what the cache holds. ``directory`` is the cache's folder (default :func:`cache_dir`).
    ``command`` is the probe child's command, to which ``--config NAME --model PATH`` is added (default: this
    interpreter running :mod:`chatcodec.backends.probe`); it prints one JSON line, as :func:`main` does.
    """
    mode = _forced(force)
    if mode != "auto":
        config = CONFIGS[mode]
        source = "--engine" if force is not None else ENGINE_ENV
        return EngineChoice(config, f"llama.cpp runs {config.description} ({source}={mode}; not checked)", forced=True)
    cpu, build = cpu_facts(), engine_build()
    key = _key(build, cpu)
    folder = directory if directory is not None else cache_dir()
    with _locked(folder):
        cache = _read_cache(folder)
        entry = cache.get(_digest(key))
        if entry is not None and not recheck and entry.get("config") in CONFIGS:
            attempts = tuple(Attempt.from_json(a) for a in entry.get("attempts", ()))
            return EngineChoice(CONFIGS[entry["config"]], entry["reason"] + " (cached)", attempts, True, key=key)
        attempts_list: list[Attempt] = []
        for config in CONFIGS.values():
            attempt = probe(model, config, command=command, timeout=timeout)
            attempts_list.append(attempt)
            if attempt.ok:
                break
        attempts = tuple(attempts_list)
        chosen = next((CONFIGS[a.config] for a in attempts if a.ok), None)
        if chosen is None:
            raise LoadError(_failure(attempts, build, cpu))
        reason = _reason(chosen, attempts, cpu)
        cache[_digest(key)] = {
            "config": chosen.name,
            "reason": reason,
            "attempts": [dataclasses.asdict(a) for a in attempts],
            "key": key,
            "model": str(model),
            "checked_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        _write_cache(folder, cache)
    return EngineChoice(chosen, reason, attempts, key=key)


def _reason(chosen: EngineConfig, attempts: Sequence[Attempt], cpu: Mapping[str, Any]) -> str:
    if chosen is DEFAULT:  # (the check's speed is kept in its attempts; `chatcodec doctor` measures a fresh one)
        return f"llama.cpp checked on this CPU: serving with {DEFAULT.description}"
    crash = attempts[0]
    path = "AMX/repack path" if any(f.startswith("amx") for f in cpu["flags"]) else "repack path"
    return f"llama.cpp's {path} crashed on this CPU ({crash.ended}); serving without extra buffer types"


def _failure(attempts: Sequence[Attempt], build: Mapping[str, Any], cpu: Mapping[str, Any]) -> str:
    ends = ", ".join(f"{a.config}: {a.ended}" for a in attempts)
    library = build["library"] or "llama-cpp-python's library"
    last = next((a.detail.strip().splitlines()[-1] for a in reversed(attempts) if a.detail.strip()), "")
    said = f" (last said: {last[:200]})" if last and not any(a.ended.startswith("SIG") for a in attempts) else ""
    return f"llama.cpp cannot run on this CPU ({cpu['name']}) in any configuration ({ends}) in {library}{said}; {_FIX}"


def probe(
    model: str | Path,
    config: EngineConfig,
    *,
    command: Sequence[str] | None = None,
    timeout: float = PROBE_TIMEOUT,
    tokens: int = PROBE_TOKENS,
) -> Attempt:
    """Run one probe child with ``config`` (decoding ``tokens`` tokens) and say how it ended."""
    argv = [*(command or (sys.executable, "-m", "chatcodec.backends.probe"))]
    argv += ["--config", config.name, "--model", str(model), "--tokens", str(tokens)]
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        return Attempt(config.name, False, "timeout", _tail(exc.stderr or b""))
    except OSError as exc:
        return Attempt(config.name, False, "not started", str(exc))
    detail = _tail(done.stderr)
    if done.returncode < 0:
        try:
            ended = signal.Signals(-done.returncode).name
        except ValueError:
            ended = f"signal {-done.returncode}"
        return Attempt(config.name, False, ended, detail)
    if done.returncode != 0:
        return Attempt(config.name, False, f"exit {done.returncode}", detail)
    try:
        answer = json.loads(done.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        speed = float(answer["tokens_per_second"])
    except (ValueError, KeyError, IndexError, TypeError):
        return Attempt(config.name, False, "no answer", detail or done.stdout.decode("utf-8", "replace")[-500:])
    return Attempt(config.name, True, "ok", "", round(speed, 1), str(answer.get("system_info", "")))


def _tail(data: bytes) -> str:
    return "\n".join(data.decode("utf-8", "replace").strip().splitlines()[-12:])


def _digest(key: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


_THREAD_LOCK = threading.Lock()


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One check at a time across the threads and processes of this machine (server workers, test workers)."""
    with _THREAD_LOCK:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handle = (folder / "engine-check.lock").open("a")
        except OSError:  # a read-only home: check without the cache's lock
            yield
            return
        with handle:
            try:
                import fcntl
            except ImportError:  # Windows: the thread lock alone
                yield
                return
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _read_cache(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / "engine-check.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != _CACHE_VERSION or not isinstance(data.get("entries"), dict):
        return {}
    entries: dict[str, Any] = data["entries"]
    return {k: v for k, v in entries.items() if isinstance(v, dict)}


def _write_cache(folder: Path, entries: Mapping[str, Any]) -> None:
    # the newest 32 builds and machines; written whole to a new file, then renamed over the old one
    kept = dict(list(entries.items())[-32:])
    with contextlib.suppress(OSError):
        path = folder / "engine-check.json"
        temporary = path.with_name(f".engine-check.{os.getpid()}.tmp")
        temporary.write_text(json.dumps({"version": _CACHE_VERSION, "entries": kept}, indent=1), encoding="utf-8")
        os.replace(temporary, path)


# ---------------------------------------------------------------------------------------------------------------
# applying a configuration to llama-cpp-python

_PARAMS_LOCK = threading.Lock()


@contextlib.contextmanager
def engine_params(llama_cpp: Any, config: EngineConfig) -> Iterator[None]:
    """While the block runs, ``llama_cpp.Llama(...)`` builds its model with ``config``'s parameters.

    llama-cpp-python's ``Llama`` takes no argument for ``use_extra_bufts``: its model parameters start from
    ``llama_model_default_params()``, so for the time of one construction that function's answer carries the
    configuration's fields. The default configuration changes nothing.
    """
    fields = config.model_params()
    if not fields:
        yield
        return
    module = llama_cpp.llama_cpp
    with _PARAMS_LOCK:
        original = module.llama_model_default_params

        def default_params() -> Any:
            params = original()
            for name, value in fields.items():
                setattr(params, name, value)
            return params

        module.llama_model_default_params = default_params
        try:
            yield
        finally:
            module.llama_model_default_params = original


def _threads() -> int:
    return max(1, min(4, (os.cpu_count() or 2) - 1))


def main(argv: Sequence[str] | None = None) -> int:
    """The probe child: load ``--model`` with ``--config``, decode a few tokens, print one JSON line."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m chatcodec.backends.probe")
    parser.add_argument("--config", choices=tuple(CONFIGS), required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=PROBE_TOKENS)
    args = parser.parse_args(argv)
    import llama_cpp

    config = CONFIGS[args.config]
    with engine_params(llama_cpp, config):
        llama = llama_cpp.Llama(model_path=args.model, n_ctx=512, n_threads=_threads(), verbose=False)
    prompt = llama.tokenize(b"The engine check: a few words to evaluate in one batch, then", add_bos=True)
    llama.eval(prompt)
    start = time.perf_counter()
    for _ in range(args.tokens):
        token = int(llama.scores[llama.n_tokens - 1].argmax())  # greedy: the same tokens on every run
        llama.eval([token])
    seconds = time.perf_counter() - start
    info = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    print(json.dumps({"config": config.name, "tokens_per_second": args.tokens / seconds, "system_info": info}))
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a child by probe()
    sys.exit(main())
