"""The committed gRPC stubs are exactly what the pinned grpcio-tools generates from proto/."""

from __future__ import annotations

from treadle import protogen


def test_committed_stubs_are_up_to_date() -> None:
    stale = protogen.stale_files()
    assert stale == [], f"stubs out of date, run `make proto`: {stale}"


def test_every_proto_has_stubs() -> None:
    names = {p.stem for p in protogen.protos()}
    assert names, "no .proto files found"
    for name in names:
        assert (protogen.OUT_PACKAGE / f"{name}_pb2.py").is_file()
