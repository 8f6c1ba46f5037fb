"""steer.save / steer.load: safetensors + JSON, round trip, checked all or nothing, nothing unpickled."""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hookscope import steer


def _spec() -> dict[str, object]:
    return {
        "blocks.0": [steer.Add(torch.randn(8), scale=2.0, positions=[1, 3]), steer.Clamp(min=-1.0)],
        "blocks.1.attn.out_proj": steer.Zero(heads=[1], n_heads=2, positions=slice(2, None)),
        "embed": steer.Project(torch.randn(8), keep="on", seq_dim=1),
        "head": [steer.Replace(torch.zeros(2, 8)), steer.Mean(torch.ones(8), positions=-1), steer.Scale(0.5)],
    }


def test_a_spec_round_trips_exactly(tmp_path: Path) -> None:
    spec = _spec()
    path = steer.save(tmp_path / "spec.safetensors", spec)  # type: ignore[arg-type]
    loaded = steer.load(path)
    expected = {site: value if isinstance(value, list) else [value] for site, value in spec.items()}
    assert loaded == expected
    assert loaded["blocks.1.attn.out_proj"][0].positions == slice(2, None)


def test_a_pickle_is_refused_and_never_run(tmp_path: Path) -> None:
    ran = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (Path.touch, (str(ran),))  # type: ignore[return-value]

    path = tmp_path / "evil.safetensors"
    path.write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ValueError, match="truncated, corrupt or not a safetensors file"):
        steer.load(path)
    assert not ran.exists()


def test_another_kind_and_a_bad_field_are_refused_naming_the_field(tmp_path: Path) -> None:
    other = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(1)}, str(other))
    with pytest.raises(ValueError, match="must hold hookscope data of kind 'steer-spec', found None"):
        steer.load(other)
    good = steer.save(tmp_path / "good.safetensors", {"a": steer.Scale(2.0)})
    data = good.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    document = json.loads(header["__metadata__"]["hookscope"])
    for broken, match in [
        ({"type": "Explode", "fields": {}, "tensors": {}}, r"field document.spec\['a'\]\[0\].type must be one of"),
        (
            {"type": "Scale", "fields": {"factor": "x"}, "tensors": {}},
            r"does not build a Scale: factor must be a finite",
        ),
        ({"type": "Scale", "fields": {"factor": 1.0, "colour": 1}, "tensors": {}}, "unknown field 'colour' for Scale"),
        (
            {"type": "Add", "fields": {}, "tensors": {"vector": "missing"}},
            "must name a tensor of the file, got 'missing'",
        ),
    ]:
        document["document"]["spec"]["a"] = [broken]
        header["__metadata__"]["hookscope"] = json.dumps(document)
        encoded = json.dumps(header).encode()
        path = tmp_path / "broken.safetensors"
        path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data[8 + size :])
        with pytest.raises(ValueError, match=match):
            steer.load(path)


def test_save_refuses_what_is_not_a_spec(tmp_path: Path) -> None:
    with pytest.raises(
        TypeError, match=r"spec must be a mapping of str to Intervention or a list of Intervention, got \[\]"
    ):
        steer.save(tmp_path / "x.safetensors", [])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"spec must be a mapping of str to Intervention .*, got \{'a': 3\}"):
        steer.save(tmp_path / "x.safetensors", {"a": 3})  # type: ignore[dict-item]
