"""`count`: the number of values observed per layer per step, summed over the calls of a shared module."""

from __future__ import annotations

import torch
import torch.nn as nn

from hookscope.watch import watch


def test_count_is_the_number_of_output_values_per_step() -> None:
    shared = nn.Linear(3, 3)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    batches = [torch.randn(4, 3), torch.randn(7, 3)]
    with watch(model, select=["0", "1"], groups=("activations",)) as w:
        for x in batches:
            model(x)
    counts = w.results().activations
    assert counts["0"]["count"].tolist() == [2 * 4 * 3, 2 * 7 * 3]  # called twice per forward
    assert counts["1"]["count"].tolist() == [4 * 3, 7 * 3]
    reference = torch.cat(
        [shared(x).detach().flatten() for x in batches[1:]]
        + [shared(torch.relu(shared(batches[1]))).detach().flatten()]
    )
    assert torch.allclose(counts["0"]["mean"][1], reference.double().mean(), atol=1e-6)


def test_saved_results_load_in_model_order(tmp_path: object) -> None:
    from pathlib import Path

    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    model.add_module("a_last", nn.Linear(2, 2))  # sorts first alphabetically, runs last
    with watch(model, groups=("activations", "output_grads")) as w:
        model(torch.randn(2, 3)).sum().backward()
    results = w.results()
    loaded = type(results).load(results.save(Path(str(tmp_path)) / "r.safetensors"))
    assert list(loaded.activations) == list(results.activations) == ["0", "1", "2", "a_last"]
    assert list(loaded.output_grads) == list(results.output_grads)
    assert all(torch.equal(loaded.activations[p]["mean"], results.activations[p]["mean"]) for p in results.layers)
