"""The committed policy_pb2 must be what grpcio-tools generates from protos/ now."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from grpc_tools import protoc

from testing_support.qwen import REPO

PROTO = "extproc/core/policy/v1/policy.proto"
GENERATED = ("extproc/core/policy/v1/policy_pb2.py", "extproc/core/policy/v1/policy_pb2.pyi")


def test_generated_policy_code_is_fresh(tmp_path: Path) -> None:
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{REPO / 'protos'}",
            # the well-known types (google/protobuf/struct.proto), as the command line adds
            f"-I{resources.files('grpc_tools') / '_proto'}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            str(REPO / "protos" / PROTO),
        ]
    )
    assert status == 0
    for name in GENERATED:
        fresh = (tmp_path / name).read_text()
        committed = (REPO / name).read_text()
        assert fresh == committed, (
            f"{name} is stale: regenerate with `python -m grpc_tools.protoc -Iprotos "
            f"--python_out=. --pyi_out=. protos/{PROTO}`"
        )
