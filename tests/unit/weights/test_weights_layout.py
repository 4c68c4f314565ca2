"""Bucket planning, manifest encoding and the checks that make a damaged manifest unusable."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from treadle import errors
from treadle.weights import layout, tensors

PLANS = {
    # sizes, bucket_bytes, expected (bucket, offset) per tensor
    "packs_aligned": ([10, 10, 300], 1024, [(0, 0), (0, 256), (0, 512)]),
    "spills_to_next": ([600, 600], 1024, [(0, 0), (1, 0)]),
    "exact_fit_after_align": ([100, 768], 1024, [(0, 0), (0, 256)]),
    "oversized_alone": ([100, 5000, 10], 1024, [(0, 0), (1, 0), (2, 0)]),
    "oversized_first": ([5000, 10], 1024, [(0, 0), (1, 0)]),
    "empty_tensor": ([0, 0, 10], 256, [(0, 0), (0, 0), (0, 0)]),
}


@pytest.mark.parametrize("sizes,bucket_bytes,want", PLANS.values(), ids=list(PLANS))
def test_plan_buckets(sizes: list[int], bucket_bytes: int, want: list[tuple[int, int]]) -> None:
    assert layout.plan_buckets(sizes, bucket_bytes) == want


def test_plan_rejects_tiny_buckets() -> None:
    with pytest.raises(errors.SpecError) as exc:
        layout.plan_buckets([1], 16)
    assert exc.value.field == "bucket_bytes"


def _manifest() -> layout.Manifest:
    return layout.Manifest(
        version=7,
        prefix="job/a",
        buckets=(layout.BucketEntry(layout.bucket_key("job/a", 7, 0), 512, "00" * 16),),
        tensors=(
            layout.TensorEntry("w", "float32", (2, 3), 0, 0, 24),
            layout.TensorEntry("b", "float32", (3,), 0, 256, 12),
        ),
        published_at=1.5,
    )


def test_manifest_round_trip() -> None:
    m = _manifest()
    assert layout.Manifest.from_json(m.to_json(), prefix="job/a", version=7) == m
    assert m.total_bytes == 512


def _tamper(raw: bytes, **changes: object) -> bytes:
    body = json.loads(raw)
    body.update(changes)
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"{}",
        _tamper(_manifest().to_json(), published_at=2.0),  # digest no longer matches
        _tamper(_manifest().to_json(), digest="0"),
    ],
    ids=["garbage", "empty", "edited_body", "edited_digest"],
)
def test_damaged_manifest_is_corrupt(raw: bytes) -> None:
    with pytest.raises(layout.CorruptVersion):
        layout.Manifest.from_json(raw, prefix="job/a", version=7)


def test_manifest_for_another_version_is_corrupt() -> None:
    with pytest.raises(layout.CorruptVersion, match="v7"):
        layout.Manifest.from_json(_manifest().to_json(), prefix="job/a", version=8)


@pytest.mark.parametrize(
    "tensor",
    [
        layout.TensorEntry("w", "float32", (200,), 0, 0, 800),  # past the bucket's end
        layout.TensorEntry("w", "float32", (1,), 3, 0, 4),  # no such bucket
        layout.TensorEntry("w", "float32", (1,), 0, -4, 4),
    ],
    ids=["past_end", "no_bucket", "negative_offset"],
)
def test_tensor_outside_its_bucket_is_corrupt(tensor: layout.TensorEntry) -> None:
    m = dataclasses.replace(_manifest(), tensors=(tensor,))
    with pytest.raises(layout.CorruptVersion, match="outside"):
        layout.Manifest.from_json(m.to_json(), prefix="job/a", version=7)


def test_bucket_offsets_are_aligned() -> None:
    buckets = tuple(
        layout.BucketEntry(layout.bucket_key("p", 1, i), n, "") for i, n in enumerate([100, 300, 5])
    )
    m = layout.Manifest(1, "p", buckets, (), 0.0)
    assert m.bucket_offsets() == [0, 256, 768]
    assert m.layout_bytes == 773


@pytest.mark.parametrize("prefix", ["", "/abs", "a//b", "a/../b", "a b", "a/"])
def test_bad_prefix_names_the_field(prefix: str) -> None:
    with pytest.raises(errors.SpecError) as exc:
        layout.check_prefix(prefix)
    assert exc.value.field == "prefix"


@pytest.mark.parametrize("version", [-1, 10**12, True, 1.0, "3"])
def test_bad_version_names_the_field(version: object) -> None:
    with pytest.raises(errors.SpecError) as exc:
        layout.check_version(version)  # type: ignore[arg-type]
    assert exc.value.field == "version"


def test_flatten_and_rebuild_numpy_round_trip() -> None:
    state: dict[str, np.ndarray] = {
        "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
        "f16": np.ones((5,), dtype=np.float16),
        "i64": np.array(7, dtype=np.int64),
        "mask": np.array([True, False]),
        "strided": np.arange(20, dtype=np.int32)[::2],  # not contiguous: copied
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    flats = tensors.flatten(state)
    placements = layout.plan_buckets([f.data.nbytes for f in flats], 256)
    nbuckets = placements[-1][0] + 1
    sizes = [0] * nbuckets
    for f, (b, off) in zip(flats, placements, strict=True):
        sizes[b] = max(sizes[b], off + f.data.nbytes)
    buckets = tuple(layout.BucketEntry(layout.bucket_key("p", 1, i), sizes[i], "") for i in range(nbuckets))
    entries = tuple(
        layout.TensorEntry(f.name, f.dtype, f.shape, b, off, f.data.nbytes)
        for f, (b, off) in zip(flats, placements, strict=True)
    )
    m = layout.Manifest(1, "p", buckets, entries, 0.0)
    buf = np.zeros(m.layout_bytes, dtype=np.uint8)
    for f, (b, off) in zip(flats, placements, strict=True):
        at = m.bucket_offsets()[b] + off
        buf[at : at + f.data.nbytes] = f.data
    out = tensors.rebuild(m, buf)
    assert list(out) == list(state)
    for name, want in state.items():
        assert out[name].dtype == want.dtype and out[name].shape == want.shape
        np.testing.assert_array_equal(out[name], want)


@pytest.mark.parametrize(
    "state,field",
    [
        ({}, "state_dict"),
        ({"w": [1.0, 2.0]}, "state_dict['w']"),
        ({"w": np.array(["a"])}, "state_dict['w']"),
        ({"": np.zeros(1)}, "state_dict['']"),
        ({"c": np.zeros(2, dtype=np.complex64)}, "state_dict['c']"),
    ],
    ids=["empty", "list", "strings", "empty_name", "complex"],
)
def test_flatten_rejects_bad_entries(state: dict[str, object], field: str) -> None:
    with pytest.raises(errors.SpecError) as exc:
        tensors.flatten(state)
    assert exc.value.field == field


def test_torch_tensors_round_trip_with_their_dtypes(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from treadle.weights import objects, publish, pull

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {
        "bf16": base.to(torch.bfloat16),
        "f32_transposed": base.t(),  # not contiguous
        "i64": torch.tensor([1, -2, 3]),
        "scalar": torch.tensor(2.5),
        "param": torch.nn.Parameter(base.clone()),  # requires grad: published detached
    }
    store = objects.FileStore(tmp_path)
    publish.Publisher(store, "t", bucket_bytes=1024).publish(state, 1)
    as_torch = pull.Reader(store, "t").pull(1, kind="torch").tensors
    for name, want in state.items():
        assert as_torch[name].dtype == want.dtype and torch.equal(as_torch[name], want.detach()), name
    as_numpy = pull.Reader(store, "t").pull(1).tensors
    assert as_numpy["bf16"].dtype == np.uint16  # bfloat16 bit patterns
    np.testing.assert_array_equal(as_numpy["bf16"], state["bf16"].view(torch.int16).numpy().view(np.uint16))
