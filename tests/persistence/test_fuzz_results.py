"""Results files, fuzzed over `WatchResults.SCHEMA`: every tensor and JSON field of a real file is dropped,
retyped, reshaped, resized, or joined by an unknown key, and the loader must refuse it with a `ValueError` that
names the file and the field; files whose tensor names would reach attributes are refused.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save as st_save
from schema_fuzz import DROP, EXTRA, Mutation, is_about, mutations

from hookscope import watch
from hookscope._io import SCHEMA_VERSION, load_bundle
from hookscope._schema import Field, ListOf, Str
from hookscope.results import WatchResults
from hookscope.results._results import SCHEMA

_OPTIONAL_DOCUMENT_KEYS = {"skipped_steps", "tensor_order"}  # files written before skipped_steps existed


def real_results() -> WatchResults:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, optimizer, hist_bins=6) as watcher:
        for step in range(3):
            x = torch.randn(8, 3)
            x[0, 0] = math.nan if step == 2 else x[0, 0]
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            watcher.log_loss(loss)
    return watcher.results()


def write(
    path: Path, tensors: dict[str, torch.Tensor], document: dict[str, Any], version: Any = SCHEMA_VERSION
) -> Path:
    """Write a results file as `save_bundle` does, without any check (the loader is what is tested)."""
    header = {"kind": "watch_results", "schema_version": version, "document": document}
    path.write_bytes(st_save(tensors, metadata={"hookscope": json.dumps(header)}))
    return path


def tensor_field(key: str) -> tuple[str, Field]:
    """The field name and format of the tensor saved as `key`, as `WatchResults.save` lays them out."""
    group, _, rest = key.partition("/")
    name, _, stat = rest.rpartition("/")
    if key == "steps" or group == "losses":
        name = {"steps": "steps", "loss/loss": "losses", "loss/count": "loss_counts"}[rest or key]
        field = SCHEMA.fields[name]
        return f"results.{name}", field.options[1] if group == "losses" else field  # type: ignore[attr-defined]
    if group == "logged":
        name = {"steps": "logged_steps", "losses": "logged_losses"}[rest]
        return f"results.{name}", SCHEMA.fields[name].options[1]  # type: ignore[attr-defined]
    if group in ("activations", "output_grads", "param_grads", "residual", "optimizer"):
        return f"results.{group}[{name!r}][{stat!r}]", SCHEMA.fields[group].value.value  # type: ignore[attr-defined]
    if group == "attention":
        heads = SCHEMA.fields[group].value  # type: ignore[attr-defined]
        return f"results.{group}[{name!r}].{stat}", {**heads.fields, **heads.optional}[stat]
    if group == "update_ratios":
        return f"results.{group}[{name!r}]", SCHEMA.fields[group].value  # type: ignore[attr-defined]
    return f"results.{group}[{rest!r}]", SCHEMA.fields[group].value  # type: ignore[attr-defined]


def file_mutations(tensors: dict[str, torch.Tensor], document: dict[str, Any]) -> list[Mutation]:
    """Every invalid change of the file's tensors and JSON document (`Mutation.path` starts with the part)."""
    found = [Mutation("results", "extra key", ("document",), lambda old: {**old, EXTRA: 1}, key=EXTRA)]
    found.append(Mutation("'__dict__/summary'", "unknown tensor", ("tensors",), _attack))
    found.append(Mutation("results.steps", "dropped", ("tensors", "steps"), lambda _: DROP))
    for name, value in document.items():
        field = ListOf(Str()) if name == "tensor_order" else SCHEMA.fields[name]
        if name not in _OPTIONAL_DOCUMENT_KEYS:
            found.append(Mutation(f"results.{name}", "dropped", ("document", name), lambda _: DROP))
        found += mutations(field, value, f"results.{name}", ("document", name))
    for key, tensor in tensors.items():
        at, field = tensor_field(key)
        found += [m for m in mutations(field, tensor, at, ("tensors", key)) if m.kind != "wrong JSON type"]
    return found


def _attack(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {**tensors, "__dict__/summary": torch.zeros(3)}


def apply(mutation: Mutation, tensors: dict[str, torch.Tensor], document: dict[str, Any]) -> tuple[Any, Any]:
    whole = mutation.apply({"tensors": tensors, "document": document})
    return whole["tensors"], whole["document"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    path = real_results().save(tmp_path_factory.mktemp("results") / "r.safetensors")
    return load_bundle(path, "watch_results")


def test_every_field_of_a_results_file_is_checked(
    saved: tuple[dict[str, torch.Tensor], dict[str, Any]], tmp_path: Path
) -> None:
    tensors, document = saved
    found = file_mutations(tensors, document)
    assert {m.kind for m in found} >= {"dropped", "extra key", "wrong JSON type", "wrong dtype", "wrong shape"}
    for mutation in found:
        bad = write(tmp_path / "bad.safetensors", *apply(mutation, tensors, document))
        with pytest.raises(ValueError) as refused:
            WatchResults.load(bad)
        assert f"file {str(bad)!r}" in str(refused.value) and is_about(refused.value, mutation), (
            mutation.kind,
            mutation.field,
            str(refused.value),
        )
    good = WatchResults.load(write(tmp_path / "good.safetensors", tensors, document))
    assert good.steps.tolist() == [0, 1, 2] and callable(good.summary)


@settings(max_examples=30, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_stacked_mutations_of_a_results_file_are_refused(
    data: st.DataObject, saved: tuple[dict[str, torch.Tensor], dict[str, Any]], tmp_path: Path
) -> None:
    tensors, document = saved
    changes = data.draw(st.lists(st.sampled_from(file_mutations(tensors, document)), min_size=2, max_size=4))
    whole: Any = {"tensors": tensors, "document": document}
    try:
        for change in changes:
            whole = change.apply(whole)
    except (KeyError, IndexError, TypeError, AttributeError):
        return  # an earlier change removed or replaced what a later one edits
    bad = write(tmp_path / "stacked.safetensors", whole["tensors"], whole["document"])
    with pytest.raises(ValueError) as refused:
        WatchResults.load(bad)
    assert any(is_about(refused.value, change) for change in changes), str(refused.value)


def test_a_wrong_version_or_kind_is_refused_with_the_file_named(
    saved: tuple[dict[str, torch.Tensor], dict[str, Any]], tmp_path: Path
) -> None:
    tensors, document = saved
    bad = write(tmp_path / "v.safetensors", tensors, document, version=SCHEMA_VERSION + 1)
    with pytest.raises(ValueError, match=rf"v.safetensors' has schema version {SCHEMA_VERSION + 1}; this hookscope"):
        WatchResults.load(bad)
    with pytest.raises(ValueError, match="must hold hookscope data of kind 'watch_results', found 'state'"):
        from hookscope import save_state

        WatchResults.load(save_state(tmp_path / "s.safetensors", {"a": 1}))
