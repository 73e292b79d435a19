"""`pip install` of clients/python, offline, into a fresh venv (--system-site-packages: Debian's
grpcio and protobuf), then the README's quick start (its first ```python block, read from the
README now) run by the venv's Python against a real `sluice serve`, with no PYTHONPATH: the
package and its generated stubs must come from the venv, nothing from the checkout. Then an
sdist (when python3-build is there) must carry the proto and install from a copy away from the
checkout."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1]  # clients/python
REPO = PACKAGE.parents[1]
README = PACKAGE / "README.md"
PYTHON = "/usr/bin/python3"
README_TARGET = "127.0.0.1:7070"

# Runs the example given as argv[1] as __main__, then prints where every sluice module came
# from (one JSON line after the example's own output).
RUNNER = r"""
import json, sys
source = open(sys.argv[1]).read()
exec(compile(source, "README.md quick start", "exec"), {"__name__": "__main__"})
mods = {name: getattr(m, "__file__", None) for name, m in sorted(sys.modules.items())
        if name == "sluice_client" or name.startswith(("sluice_client.", "sluice."))}
print("MODULES " + json.dumps({"modules": mods, "path": sys.path}))
"""


def clean_env(**extra) -> dict:
    """The environment without what would reach the checkout or a package index: no
    PYTHONPATH (ctest sets it to the CMake stubs and clients/python), no pip configuration."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1",
               PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env


def run(args, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)
    assert r.returncode == 0, f"{args} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


def readme_example() -> str:
    """The README's first ```python block."""
    m = re.search(r"^```python\n(.*?)^```$", README.read_text(), re.S | re.M)
    assert m, f"{README}: no ```python block"
    return m.group(1)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    missing = [pkg for module, pkg in (("ensurepip", "python3-venv"),
                                       ("setuptools", "python3-setuptools"),
                                       ("wheel", "python3-wheel"))
               if importlib.util.find_spec(module) is None]
    if missing:
        pytest.skip(f"needs {' '.join(missing)} (Debian)")
    for tool in ("protoc", "grpc_python_plugin"):
        assert shutil.which(tool), f"{tool} not on PATH (protobuf-compiler, protobuf-compiler-grpc)"
    root = tmp_path_factory.mktemp("venv") / "venv"
    run([PYTHON, "-m", "venv", "--system-site-packages", str(root)], env=clean_env())
    return root


def installed_from(venv: Path, tmp_path: Path, server_target: str) -> dict:
    """Runs the README's quick start in `venv`; returns its output and its modules' files."""
    example = readme_example()
    assert example.count(README_TARGET) == 1, \
        f"the quick start must name the server as {README_TARGET} once"
    script = tmp_path / "quick_start.py"
    script.write_text(example.replace(README_TARGET, server_target))
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER)
    r = run([str(venv / "bin" / "python"), str(runner), str(script)], cwd=tmp_path,
            env=clean_env())
    out, _, last = r.stdout.rstrip("\n").rpartition("\n")
    assert last.startswith("MODULES "), r.stdout
    return {"stdout": out, **json.loads(last[len("MODULES "):])}


def assert_from_venv(venv: Path, found: dict) -> None:
    site = next((venv / "lib").glob("python3*/site-packages")).resolve()
    mods = found["modules"]
    for name in ("sluice_client", "sluice_client.client", "sluice.v1.sluice_pb2",
                 "sluice.v1.sluice_pb2_grpc"):
        assert mods.get(name), f"{name} was not imported: {mods}"
    for name, file in mods.items():
        if file is None:  # a namespace package (sluice, sluice.v1)
            continue
        path = Path(file).resolve()
        assert site in path.parents, f"{name} imported from {path}, not from {site}"
        assert REPO not in path.parents, f"{name} imported from the checkout: {path}"
    on_path = [p for p in found["path"] if p and (Path(p).resolve() == REPO
                                                  or REPO in Path(p).resolve().parents)]
    assert not on_path, f"the checkout is on sys.path: {on_path}"


def test_pip_install_from_checkout_runs_the_readme_quick_start(venv, server, tmp_path):
    r = run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index",
             "--no-build-isolation", str(PACKAGE)], cwd=tmp_path, env=clean_env())
    assert "Successfully installed sluice-client" in r.stdout, r.stdout
    found = installed_from(venv, tmp_path, server.grpc_target)
    assert "allowed: True" in found["stdout"], found["stdout"]
    assert "in flight: 1" in found["stdout"], found["stdout"]
    assert_from_venv(venv, found)
    # The example spent a hit of api-rate for user-42 on this server.
    assert server.client().peek("api-rate", "user-42").remaining < \
        server.client().policies()["api-rate"].limit
    # The stubs were generated by the build: not in the checkout.
    assert not list(PACKAGE.glob("**/sluice_pb2*.py")), "stubs written into the checkout"


def test_sdist_carries_the_proto_and_installs_away_from_the_checkout(venv, server, tmp_path):
    pytest.importorskip("build", reason="python3-build makes the sdist")
    dist = tmp_path / "dist"
    run([PYTHON, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(dist),
         str(PACKAGE)], cwd=tmp_path, env=clean_env())
    (sdist,) = dist.glob("sluice-client-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    assert any(n.endswith("/proto/sluice/v1/sluice.proto") for n in names), names
    assert not any("sluice_pb2" in n for n in names), "an sdist carries no generated stub"
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index",
         "--no-build-isolation", "--force-reinstall", "--no-deps", str(sdist)],
        cwd=tmp_path, env=clean_env())
    found = installed_from(venv, tmp_path, server.grpc_target)
    assert "allowed: True" in found["stdout"], found["stdout"]
    assert_from_venv(venv, found)
