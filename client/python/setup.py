"""Builds the fusebox-client package: generates the fusebox.v1 modules from the .proto files at
build time with grpcio-tools, and pins grpcio and protobuf at or above the versions that
generated them (newer generated code checks its runtime at import and refuses an older one).

Where the .proto files come from, and why: the repository keeps one copy, proto/ at its root,
which the server and the C++ client are built from too. A copy here would need a test that
the two agree, and committed generated code would tie the package to one protobuf release.
So a build from the repository (`pip install ./client/python`, which pip builds in place)
reads ../../proto, and an sdist carries the files it was made from under proto/, so a wheel
built from the sdist (`python -m build`, which builds the wheel in an isolated copy) finds them
there.
"""
import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PROTO_FILES = ["fusebox/v1/kernel_service.proto"]


def proto_root() -> Path:
    """The directory the .proto files are imported from: the sdist's copy, else the repo's."""
    for root in (HERE / "proto", HERE.parent.parent / "proto"):
        if all((root / p).is_file() for p in PROTO_FILES):
            return root
    sys.exit(f"fusebox-client: cannot find {PROTO_FILES[0]} under {HERE / 'proto'} or "
             f"{HERE.parent.parent / 'proto'}: build from the repository or from an sdist")


class BuildPyWithProtos(build_py):
    """build_py that also writes fusebox/v1/*_pb2.py, *_pb2.pyi and *_pb2_grpc.py."""

    def run(self) -> None:
        super().run()
        from grpc_tools import protoc  # a build requirement (pyproject.toml)
        import grpc_tools

        out = Path(self.build_lib)
        root = proto_root()
        include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        args = ["grpc_tools.protoc", f"--proto_path={root}", f"--proto_path={include}",
                f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}",
                *(str(root / p) for p in PROTO_FILES)]
        if protoc.main(args) != 0:
            sys.exit("fusebox-client: protoc failed on " + ", ".join(PROTO_FILES))
        for pkg in ("fusebox", "fusebox/v1"):
            (out / pkg / "__init__.py").touch()
        # The generated .pyi stubs make fusebox.v1 typed for mypy.
        (out / "fusebox/v1/py.typed").touch()


class SdistWithProtos(sdist):
    """sdist that carries the .proto files, so a wheel can be built from it alone."""

    def make_release_tree(self, base_dir: str, files: list) -> None:
        super().make_release_tree(base_dir, files)
        root = proto_root()
        for p in PROTO_FILES:
            dst = Path(base_dir) / "proto" / p
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / p, dst)


def install_requires() -> list:
    """grpcio and protobuf no older than the generator's; numpy for arrays."""
    try:
        import grpc_tools
        from importlib.metadata import version
        tools = version("grpcio-tools")
        pb = version("protobuf")
    except Exception:  # metadata only (egg_info without the build requirements)
        return ["grpcio>=1.51", "protobuf>=4.21", "numpy>=1.22"]
    del grpc_tools

    def major_minor(v: str) -> str:
        return ".".join(v.split(".")[:2])

    return [f"grpcio>={major_minor(tools)}", f"protobuf>={major_minor(pb)}", "numpy>=1.22"]


setup(
    cmdclass={"build_py": BuildPyWithProtos, "sdist": SdistWithProtos},
    packages=["fusebox_client"],
    install_requires=install_requires(),
)
