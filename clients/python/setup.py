"""The part of the build that pyproject.toml cannot say: the gRPC stubs, generated at build time.

``build_py`` runs ``protoc`` with ``grpc_python_plugin`` (Debian 12: protobuf-compiler,
protobuf-compiler-grpc, and libprotobuf-dev for google/protobuf/duration.proto) on
``sluice/v1/sluice.proto`` and writes ``sluice/v1/sluice_pb2.py``, ``sluice_pb2.pyi`` and
``sluice_pb2_grpc.py`` into the build directory, beside ``sluice_client``: the wheel installs them
as the namespace package ``sluice.v1``, the layout the CMake build gives them
(clients/python/CMakeLists.txt), so ``from sluice.v1 import sluice_pb2`` works either way.

The proto is found, in order: ``$SLUICE_PROTO_DIR`` (a directory holding
sluice/v1/sluice.proto), ``proto/`` beside this file (an sdist carries it there, see
``sdist_with_proto``), ``../../proto`` (this file in a checkout, clients/python/setup.py).
``$PROTOC`` and ``$GRPC_PYTHON_PLUGIN`` override the tools found on PATH.

Nothing is written into the source directory by a wheel build (``pip install``): the build
and egg-info directories go to a scratch directory removed when the build exits, so a checkout
that several people (or ctest's parallel tests) use stays clean.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.egg_info import egg_info
from setuptools.command.sdist import sdist

try:
    from setuptools.command.build import build
except ImportError:  # setuptools < 62.4
    from distutils.command.build import build

HERE = Path(__file__).resolve().parent
PROTO = Path("sluice", "v1", "sluice.proto")
STUBS = ("sluice_pb2.py", "sluice_pb2.pyi", "sluice_pb2_grpc.py")

_scratch_dirs = []


def _scratch(what: str) -> str:
    d = tempfile.mkdtemp(prefix=f"sluice-client-{what}-")
    _scratch_dirs.append(d)
    return d


@atexit.register
def _remove_scratch() -> None:
    for d in _scratch_dirs:
        shutil.rmtree(d, ignore_errors=True)


def proto_root() -> Path:
    """The directory that holds sluice/v1/sluice.proto (protoc's -I for it)."""
    candidates = []
    if os.environ.get("SLUICE_PROTO_DIR"):
        candidates.append(Path(os.environ["SLUICE_PROTO_DIR"]))
    candidates += [HERE / "proto", HERE.parent.parent / "proto"]
    for c in candidates:
        if (c / PROTO).is_file():
            return c.resolve()
    raise SystemExit(
        "sluice-client: cannot find sluice/v1/sluice.proto (looked in "
        + ", ".join(str(c) for c in candidates)
        + "). Build from a checkout of sluice (clients/python), from an sdist, or set "
        "SLUICE_PROTO_DIR to the directory that holds sluice/v1/sluice.proto.")


def _tool(name: str, env: str) -> str:
    path = os.environ.get(env) or shutil.which(name)
    if not path:
        raise SystemExit(
            f"sluice-client: {name} not found on PATH (or ${env}); the gRPC stubs are generated "
            f"at build time. On Debian: apt-get install protobuf-compiler protobuf-compiler-grpc "
            f"libprotobuf-dev")
    return path


def _well_known_include(protoc: str) -> str:
    """The directory holding google/protobuf/duration.proto, which sluice.proto imports."""
    candidates = [os.environ.get("SLUICE_PROTOBUF_INCLUDE"),
                  str(Path(protoc).resolve().parent.parent / "include"),
                  "/usr/include", "/usr/local/include"]
    for c in candidates:
        if c and (Path(c) / "google" / "protobuf" / "duration.proto").is_file():
            return c
    raise SystemExit(
        "sluice-client: google/protobuf/duration.proto not found (looked in "
        + ", ".join(c for c in candidates if c)
        + "). On Debian: apt-get install libprotobuf-dev; or set SLUICE_PROTOBUF_INCLUDE.")


def generate_stubs(out: Path) -> None:
    """protoc --python_out --pyi_out --grpc_python_out for sluice/v1/sluice.proto, into `out`."""
    protoc = _tool("protoc", "PROTOC")
    plugin = _tool("grpc_python_plugin", "GRPC_PYTHON_PLUGIN")
    root = proto_root()
    out.mkdir(parents=True, exist_ok=True)
    cmd = [protoc, "-I", str(root), "-I", _well_known_include(protoc),
           f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}",
           f"--plugin=protoc-gen-grpc_python={plugin}", str(root / PROTO)]
    print("generating the gRPC stubs:", " ".join(cmd))
    subprocess.run(cmd, check=True)
    for name in STUBS:
        if not (out / PROTO.parent / name).is_file():
            raise SystemExit(f"sluice-client: protoc did not write {PROTO.parent / name}")


class build_py_with_stubs(build_py):
    """build_py, plus the stubs generated into the build directory (never the source tree)."""

    def run(self):
        super().run()
        if not self.dry_run:
            generate_stubs(Path(self.build_lib))

    def get_outputs(self, include_bytecode=1):
        generated = [str(Path(self.build_lib) / PROTO.parent / name) for name in STUBS]
        return list(super().get_outputs(include_bytecode)) + generated


class build_in_scratch(build):
    """The build directory defaults to a scratch directory (--build-base still wins)."""

    def initialize_options(self):
        super().initialize_options()
        self.build_base = _scratch("build")


class egg_info_in_scratch(egg_info):
    """The .egg-info directory defaults to a scratch directory, except for an sdist, which
    archives it from the source directory (setuptools' dist_info sets its own)."""

    def initialize_options(self):
        super().initialize_options()
        if "sdist" not in self.distribution.commands:
            self.egg_base = _scratch("egg-info")


class sdist_with_proto(sdist):
    """An sdist carries the proto (proto/sluice/v1/sluice.proto inside it), so that a wheel can
    be built from it away from the checkout. The .egg-info directory it needs in the source
    directory is removed afterwards unless it was there before."""

    def run(self):
        egg_info_dir = HERE / "sluice_client.egg-info"
        existed = egg_info_dir.exists()
        try:
            super().run()
        finally:
            if not existed:
                shutil.rmtree(egg_info_dir, ignore_errors=True)

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        src = proto_root() / PROTO
        dest = Path(base_dir) / "proto" / PROTO
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            dest.unlink()
        shutil.copyfile(src, dest)


setup(cmdclass={
    "build": build_in_scratch,
    "build_py": build_py_with_stubs,
    "egg_info": egg_info_in_scratch,
    "sdist": sdist_with_proto,
})
