"""Build hook: generates `warden/_proto/` from the repository's `.proto` files at build time.

The generated modules are never committed: each build compiles `proto/proto/warden.proto`
(and whatever it imports, transitively; today nothing) of the checkout it is built from, so
the package always speaks the API of its own commit. The protos are found relative to this
file (`../../proto/proto`), as the package lives in `client/python/` of the repository.

Each `.proto` is compiled as if it lived at `warden/_proto/NAME.proto`, so the generated
modules import each other as `warden._proto.NAME_pb2` (protoc names imports after the
`.proto`'s path) instead of as top-level modules.
"""

import atexit
import re
import shutil
import tempfile
from pathlib import Path
from typing import List

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PROTO_DIR = HERE / ".." / ".." / "proto" / "proto"
ROOT_PROTO = "warden.proto"
PACKAGE_PROTO_DIR = Path("warden") / "_proto"
IMPORT = re.compile(r'^(\s*import\s+(?:public\s+|weak\s+)?")([^"]+)(";)', re.MULTILINE)


def needed_protos(root: str) -> List[str]:
    """`root` and every `.proto` of PROTO_DIR it imports, transitively (well-known types,
    `google/...`, come with grpcio-tools and are not copied)."""
    found: List[str] = []
    pending = [root]
    while pending:
        name = pending.pop()
        if name in found:
            continue
        path = PROTO_DIR / name
        if not path.is_file():
            raise RuntimeError(f"{path} is missing: build warden-client from a Warden checkout (client/python)")
        found.append(name)
        for match in IMPORT.finditer(path.read_text(encoding="utf-8")):
            imported = match.group(2)
            if not imported.startswith("google/"):
                pending.append(imported)
    return found


def generate(out_dir: Path) -> None:
    """Compiles the needed protos into `out_dir/warden/_proto/`."""
    from grpc_tools import protoc  # a build requirement (pyproject.toml)
    import grpc_tools

    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    names = needed_protos(ROOT_PROTO)
    with tempfile.TemporaryDirectory(prefix="warden-protos-") as scratch:
        staged = Path(scratch) / PACKAGE_PROTO_DIR
        staged.mkdir(parents=True)
        for name in names:
            text = (PROTO_DIR / name).read_text(encoding="utf-8")

            def rewrite(match: "re.Match[str]") -> str:
                imported = match.group(2)
                if imported.startswith("google/"):
                    return match.group(0)
                return f"{match.group(1)}{PACKAGE_PROTO_DIR.as_posix()}/{imported}{match.group(3)}"

            (staged / name).write_text(IMPORT.sub(rewrite, text), encoding="utf-8")
        target = out_dir / PACKAGE_PROTO_DIR
        target.mkdir(parents=True, exist_ok=True)
        arguments = [
            "grpc_tools.protoc",
            f"-I{scratch}",
            f"-I{well_known}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
        ] + [f"{PACKAGE_PROTO_DIR.as_posix()}/{name}" for name in names]
        if protoc.main(arguments) != 0:
            raise RuntimeError(f"protoc failed on {names} (arguments {arguments})")
    init = out_dir / PACKAGE_PROTO_DIR / "__init__.py"
    if not init.exists():
        shutil.copyfile(HERE / PACKAGE_PROTO_DIR / "__init__.py", init)


class BuildWithProtos(build_py):
    """`build_py` that also generates the protobuf and gRPC modules."""

    def run(self) -> None:
        super().run()
        # An editable install imports from the source tree: generate there (git-ignored).
        generate(HERE if getattr(self, "editable_mode", False) else Path(self.build_lib))


# Build in a scratch directory, removed at exit: nothing is left in the checkout, and no file
# of an earlier build (a module since removed) can slip into this one.
SCRATCH = tempfile.mkdtemp(prefix="warden-client-build-")
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)

setup(
    cmdclass={"build_py": BuildWithProtos},
    options={"build": {"build_base": str(Path(SCRATCH) / "build")}, "egg_info": {"egg_base": SCRATCH}},
)
