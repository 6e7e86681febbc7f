"""The engine check: both branches and the cache, on every machine (stand-in children that crash, hang or
answer), and the real check of llama.cpp on this one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chatcodec import InputError, LoadError
from chatcodec.backends import probe

FAKE = [sys.executable, str(Path(__file__).with_name("fake_probe.py"))]
MODEL = Path(__file__)  # the stand-in children never open it


@pytest.fixture
def children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file each stand-in child writes its configuration to, one line a run."""
    log = tmp_path / "children.log"
    log.write_text("")
    monkeypatch.setenv("FAKE_PROBE_LOG", str(log))
    monkeypatch.delenv(probe.ENGINE_ENV, raising=False)
    return log


def runs(log: Path) -> list[str]:
    return log.read_text().split()


def choose(tmp_path: Path, **options: object) -> probe.EngineChoice:
    return probe.choose_engine(MODEL, directory=tmp_path / "cache", command=FAKE, **options)  # type: ignore[arg-type]


def test_a_clean_child_keeps_the_default_and_is_cached(tmp_path: Path, children: Path) -> None:
    first = choose(tmp_path)
    assert first.config is probe.DEFAULT and not first.cached and not first.forced
    assert first.tokens_per_second == 123.4
    assert first.line == "chatcodec: llama.cpp checked on this CPU: serving with llama.cpp's default parameters"
    again = choose(tmp_path)
    assert again.config is probe.DEFAULT and again.cached and again.line.endswith("(cached)")
    assert runs(children) == ["default"]  # the second start ran no child


def test_a_crash_falls_back_to_the_safe_configuration(
    tmp_path: Path, children: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_PROBE_CRASH", "default:SIGSEGV")
    choice = choose(tmp_path)
    assert choice.config is probe.SAFE and choice.model_params() == {"use_extra_bufts": False}
    assert [(a.config, a.ok, a.ended) for a in choice.attempts] == [("default", False, "SIGSEGV"), ("safe", True, "ok")]
    assert "crashed on this CPU (SIGSEGV); serving without extra buffer types" in choice.line
    assert runs(children) == ["default", "safe"]
    # cached: the next process starts on the safe configuration without a child
    cached = choose(tmp_path)
    assert cached.config is probe.SAFE and cached.cached
    assert runs(children) == ["default", "safe"]
    entry = next(iter(json.loads((tmp_path / "cache" / "engine-check.json").read_text())["entries"].values()))
    assert entry["config"] == "safe" and entry["key"]["llama_cpp_python"] and entry["key"]["cpu_flags"]
    # recheck ignores the cache
    assert choose(tmp_path, recheck=True).config is probe.SAFE and runs(children)[2:] == ["default", "safe"]


def test_a_hang_or_a_failed_load_counts_as_not_working(
    tmp_path: Path, children: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_PROBE_HANG", "default")
    choice = choose(tmp_path, timeout=3)
    assert choice.config is probe.SAFE and choice.attempts[0].ended == "timeout"
    monkeypatch.setenv("FAKE_PROBE_HANG", "")
    monkeypatch.setenv("FAKE_PROBE_FAIL", "default,safe")
    with pytest.raises(LoadError) as raised:
        choose(tmp_path / "other")
    assert "default: exit 1, safe: exit 1" in str(raised.value) and "bad magic" in str(raised.value)


def test_nothing_works_is_one_line_with_the_signal_library_and_fix(
    tmp_path: Path, children: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_PROBE_CRASH", "default:SIGILL,safe:SIGILL")
    with pytest.raises(LoadError) as raised:
        choose(tmp_path)
    message = str(raised.value)
    assert "\n" not in message
    assert "default: SIGILL, safe: SIGILL" in message
    assert probe.engine_build()["library"] in message
    assert 'CMAKE_ARGS="-DGGML_NATIVE=OFF"' in message
    # not cached: a rebuilt or fixed engine is checked at the next start
    monkeypatch.setenv("FAKE_PROBE_CRASH", "")
    assert choose(tmp_path).config is probe.DEFAULT
    assert runs(children) == ["default", "safe", "default"]


def test_another_build_or_cpu_is_checked_again(tmp_path: Path, children: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    choose(tmp_path)
    build = probe.engine_build()
    monkeypatch.setattr(probe, "engine_build", lambda: {**build, "library_mtime": build["library_mtime"] + 1})
    assert not choose(tmp_path).cached
    cpu = probe.cpu_facts()
    monkeypatch.setattr(probe, "cpu_facts", lambda: {**cpu, "flags": [*cpu["flags"], "amx_tile"]})
    monkeypatch.setenv("FAKE_PROBE_CRASH", "default:SIGSEGV")
    choice = choose(tmp_path)
    assert "AMX/repack path crashed on this CPU (SIGSEGV)" in choice.line
    assert runs(children) == ["default", "default", "default", "safe"]


def test_forcing_runs_no_check(tmp_path: Path, children: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_PROBE_CRASH", "default:SIGSEGV,safe:SIGSEGV")
    safe = choose(tmp_path, force="safe")
    assert safe.config is probe.SAFE and safe.forced and "--engine=safe" in safe.line
    monkeypatch.setenv(probe.ENGINE_ENV, "default")
    default = choose(tmp_path)
    assert default.config is probe.DEFAULT and default.forced and "CHATCODEC_ENGINE=default" in default.line
    assert runs(children) == []
    monkeypatch.setenv(probe.ENGINE_ENV, "fast")
    with pytest.raises(InputError, match="CHATCODEC_ENGINE must be auto, default or safe, not 'fast'"):
        choose(tmp_path)
    with pytest.raises(InputError, match="--engine must be"):
        choose(tmp_path, force="turbo")


def test_a_corrupt_cache_is_checked_again(tmp_path: Path, children: Path) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "engine-check.json").write_text("{not json")
    assert choose(tmp_path).config is probe.DEFAULT
    assert choose(tmp_path).cached


def test_the_safe_configuration_reaches_llama_cpp_s_model_parameters() -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is True
    with probe.engine_params(llama_cpp, probe.SAFE):
        assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is False
    assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is True
    with probe.engine_params(llama_cpp, probe.DEFAULT):
        assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is True


@pytest.mark.parametrize("config", [probe.DEFAULT, probe.SAFE], ids=lambda c: c.name)
def test_the_real_probe_runs_llama_cpp_here(config: probe.EngineConfig) -> None:
    """The real child on this machine: a configuration the check chose works, and says its speed and build."""
    from chatcodec.backends import default_model_path

    chosen = probe.choose_engine(default_model_path())
    if config is probe.DEFAULT and chosen.config is probe.SAFE:
        attempt = probe.probe(default_model_path(), config)
        assert not attempt.ok and attempt.ended.startswith("SIG")  # what the check found, found again
        return
    attempt = probe.probe(default_model_path(), config)
    assert attempt.ok, attempt
    assert attempt.tokens_per_second and attempt.tokens_per_second > 0
    assert "CPU" in attempt.system_info


def test_a_native_crash_in_a_test_fails_that_test_and_the_run_goes_on(tmp_path: Path) -> None:
    """The project's pytest settings run tests in a worker process: a test that dies by a signal is reported
    as failed, and the run goes on to print its summary."""
    tests = tmp_path / "test_native.py"
    tests.write_text(
        textwrap.dedent(
            """
            import os, signal

            def test_dies_natively():
                os.kill(os.getpid(), signal.SIGSEGV)

            def test_after_it():
                assert True
            """
        )
    )
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "CHATCODEC_NO_SKIP"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(root / "pyproject.toml"), "--rootdir", str(tmp_path),
         "--confcutdir", str(tmp_path), str(tests),
         "-p", "no:cacheprovider"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 1, out
    assert "1 failed, 1 passed" in out.splitlines()[-1], out[-2000:]
    assert "test_dies_natively" in out and ("crashed" in out or str(signal.SIGSEGV.value) in out), out[-2000:]
