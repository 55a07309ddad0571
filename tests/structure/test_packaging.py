"""The distributions as a user gets them: the sdist and the wheel, each installed in a fresh venv.

The sdist is built from the checkout's files (as a fresh clone has them) and the wheel from the *unpacked sdist* (so a file the
sdist leaves out fails the wheel or the tests below), both through the declared build backend's
PEP 517 hooks with no network. Each goes into a fresh venv of its own with ``--no-deps``; the
dependencies come from this environment's site-packages through a ``.pth`` line, which adds the
directory without running this environment's own ``.pth`` files, so the checkout's editable
install is not seen there.

- The wheel's venv: the packages import from that venv, ``turnkeeper-daemon`` starts and serves
  the viewer's files (package data), and ``turnkeeper`` creates and lists a session.
- The sdist's venv: a small part of the suite runs from the unpacked sdist (the layout and lint
  tests need the nested ruff.toml files, the docs test needs docs/, a real daemon answers).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.processes  # starts processes: not in make unit-fast

ROOT = Path(__file__).resolve().parents[2]
DEPS = sysconfig.get_paths()["purelib"]  # this environment: the dependencies, pytest, ruff
STEP_S = 300
# A small part of the suite, run from the unpacked sdist: each test needs a different part of
# it to be there (the nested ruff.toml files, the package's exports, a pure core and its
# property tests, docs/, the mock agent) and the last ones drive a real daemon through its HTTP
# API. The whole suite runs from the checkout; here only what the sdist must carry is proved.
FAST = ["tests/structure/test_core_layout.py", "tests/structure/test_exports.py",
        "tests/daemon/test_envelope_core.py",
        "tests/docs/test_docs_blocks.py::test_every_block_names_a_language_and_every_skip_says_why",
        "tests/docs/test_docs_blocks.py::test_json_blocks_parse",
        "tests/daemon/test_http_surface.py::test_unknown_session_and_route",
        "tests/daemon/test_http_surface.py::test_capabilities_and_status_show_effective_limits"]


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=STEP_S, check=False)
    assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def build(hook: str, source: Path, out: Path) -> Path:
    code = ("import sys; from setuptools import build_meta as backend; "
            f"print(backend.{hook}(sys.argv[1]))")
    name = run([sys.executable, "-c", code, str(out)], cwd=source).strip().splitlines()[-1]
    return out / name


@dataclass
class Venv:
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def bin(self, name: str) -> Path:
        return self.root / "bin" / name

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VIRTUAL_ENV", "QWEN_SERVER_TOKEN")}
        # This environment's tools (ruff for the layout tests) after the venv's own.
        tools = Path(sys.executable).parent
        return {**env, "PATH": os.pathsep.join([str(self.root / "bin"), str(tools),
                                                env.get("PATH", "")])}


def fresh_venv(where: Path, artifact: Path) -> Venv:
    run([sys.executable, "-m", "venv", "--without-pip", str(where)], cwd=where.parent)
    venv = Venv(where)
    site = run([str(venv.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               cwd=where).strip()
    Path(site, "turnkeeper-test-deps.pth").write_text(DEPS + "\n")
    run([sys.executable, "-m", "pip", "--python", str(venv.python), "install", "--quiet",
         "--no-deps", "--no-index", "--no-build-isolation", str(artifact)], cwd=where)
    return venv


@dataclass
class Dists:
    sdist: Path
    wheel: Path
    unpacked: Path


def clean_tree(dest: Path) -> Path:
    """The checkout's files as a fresh clone has them (tracked and new, not ignored): setuptools
    would otherwise add every file an earlier build listed in the checkout's egg-info."""
    files = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                cwd=ROOT).split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dists]:
    out = tmp_path_factory.mktemp("dist")
    sdist = build("build_sdist", clean_tree(tmp_path_factory.mktemp("clone")), out)
    with tarfile.open(sdist) as tar:
        tar.extractall(out / "unpacked", filter="data")
    unpacked = out / "unpacked" / sdist.name.removesuffix(".tar.gz")
    wheel = build("build_wheel", unpacked, out)
    yield Dists(sdist, wheel, unpacked)


def test_the_sdist_carries_what_its_tests_and_lint_need(dists: Dists) -> None:
    with tarfile.open(dists.sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    tracked = set(run(["git", "ls-files"], cwd=ROOT).splitlines())
    for needed in ("daemon/core/ruff.toml", "sdk/ruff.toml", "sdk/protocol/ruff.toml",
                   "webui_model/ruff.toml", "docs/sdk.md", "tests/conftest.py",
                   "daemon/ui/index.html", "LICENSE", "CHANGELOG.md"):
        assert needed in names, needed
    # Every tracked ruff.toml and viewer file: a new one cannot be forgotten.
    for path in tracked:
        if path.endswith("ruff.toml") or path.startswith("daemon/ui/"):
            assert path in names, path
    assert not [n for n in names if n.startswith("tests/artifacts/") or "__pycache__" in n]


def test_the_wheel_installs_and_its_commands_work(dists: Dists, tmp_path: Path) -> None:
    venv = fresh_venv(tmp_path / "wheel-venv", dists.wheel)
    where = run([str(venv.python), "-c",
                 "import daemon, sdk, webui_model, importlib.metadata as m; "
                 "print(daemon.__file__); print(m.version('turnkeeper'))"],
                cwd=tmp_path, env=venv.env()).splitlines()
    assert where[0].startswith(str(venv.root)), where  # not the checkout
    assert dists.wheel.name.startswith(f"turnkeeper-{where[1]}-")
    # The installed command, from a directory with no source tree in it.
    stderr_path = tmp_path / "daemon.stderr"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen([str(venv.bin("turnkeeper-daemon")), "--hostname", "127.0.0.1",
                                 "--port", "0", "--data-dir", str(tmp_path / "data"),
                                 "--workspace", str(tmp_path)],
                                cwd=tmp_path, env=venv.env(), stdout=subprocess.PIPE,
                                stderr=stderr)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().decode()
        assert first.startswith("turnkeeper daemon listening on http://"), (
            first, stderr_path.read_text())
        url = first.split(" on ", 1)[1].strip()
        for path in ("/ui/", "/ui/app.js", "/ui/viewer.css", "/ui/favicon.svg"):
            assert httpx.get(f"{url}{path}", timeout=10).status_code == 200, path
        cli = [str(venv.bin("turnkeeper")), "--url", url]
        sid = run([*cli, "create"], cwd=tmp_path, env=venv.env()).strip()
        listed = run([*cli, "list"], cwd=tmp_path, env=venv.env())
        assert sid in listed
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_sdist_installs_and_its_fast_tests_pass(dists: Dists, tmp_path: Path) -> None:
    venv = fresh_venv(tmp_path / "sdist-venv", dists.sdist)
    assert venv.bin("turnkeeper").exists() and venv.bin("turnkeeper-daemon").exists()
    # A few examples per property: the suite runs them in full from the checkout.
    out = run([str(venv.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *FAST],
              cwd=dists.unpacked, env={**venv.env(), "HYPOTHESIS_PROFILE": "fast"})
    assert " passed" in out and "error" not in out.splitlines()[-1], out[-2000:]
    assert "skipped" not in out.splitlines()[-1], out[-2000:]  # the lint ran too (ruff found)

