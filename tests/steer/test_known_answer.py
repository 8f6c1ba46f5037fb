"""Known answers on a 2-layer attention-only transformer: exact recoveries on any weights, interventions equal to
a forward edited by hand, a batched sweep equal to a loop of single interventions, and, once trained on repeated
segments, the induction circuit where it must be."""

from __future__ import annotations

import pytest
import torch

from hookscope import steer

from .models import HALF, SEQ, WIDTH, AttentionOnly, forward_by_hand, induction_pair, train

SOURCE = 4


def test_patching_the_embedding_stream_recovers_exactly_one_where_the_inputs_differ_and_zero_elsewhere() -> None:
    model = AttentionOnly().eval()
    clean, corrupted, metric, _ = induction_pair(8, source=SOURCE)
    expected = torch.zeros(1, SEQ, dtype=torch.float64)
    expected[0, SOURCE] = 1.0
    one_at_a_time = steer.patch(model, clean, corrupted, metric, select="embedded", positions="each", batch_size=1)
    assert torch.equal(one_at_a_time.effects, expected)  # same batch shape as the clean run: bitwise
    stacked = steer.patch(model, clean, corrupted, metric, select="embedded", positions="each")
    assert torch.allclose(stacked.effects, expected, atol=1e-6, rtol=0)
    assert stacked.sites == ["embedded"] and stacked.positions == list(range(SEQ)) and stacked.heads is None


def test_an_intervention_at_a_position_is_bitwise_the_forward_edited_by_hand() -> None:
    model = AttentionOnly().eval()
    tokens, _, _, _ = induction_pair(4)
    value = torch.randn(4, WIDTH)

    def by_hand(x: torch.Tensor) -> None:
        x[:, 3] = value

    with torch.no_grad():
        expected = forward_by_hand(model, tokens, resid_pre_1=by_hand)
        with steer.intervene(model, {"blocks.1.resid_pre": steer.Replace(value.unsqueeze(1), positions=[3])}):
            got = model(tokens)
        with steer.intervene(model, {"blocks.1": steer.Replace(value, positions=3)}, at="input"):
            got_at_input = model(tokens)
    assert torch.equal(got, expected) and torch.equal(got_at_input, expected)


def test_an_intervention_on_one_head_is_bitwise_the_forward_edited_by_hand() -> None:
    model = AttentionOnly().eval()
    tokens, _, _, _ = induction_pair(4)

    def by_hand(z: torch.Tensor) -> None:
        z[:, 5, WIDTH // 2 :] *= 0.0

    with torch.no_grad():
        expected = forward_by_hand(model, tokens, heads_0=by_hand)
        head = steer.Zero(positions=5, heads=[1], n_heads=2)
        with steer.intervene(model, {"blocks.0.attn.out_proj": head}, at="input"):
            got = model(tokens)
    assert torch.equal(got, expected)


def _loop_of_interventions(
    model: AttentionOnly, clean: torch.Tensor, corrupted: torch.Tensor, metric: object, sites: list[str]
) -> torch.Tensor:
    """The oracle of a batched sweep: one forward per cell, patched with `intervene` and a `Replace`."""
    with torch.no_grad(), steer.record(model, sites, at="input") as rec:
        clean_metric, corrupted_metric = metric(model(clean)), metric(model(corrupted))  # type: ignore[operator]
    rows = []
    for site in sites:
        value = rec.calls(site)[0]  # the clean run's value
        row = []
        for position in range(SEQ):
            for head in range(2):
                piece = value[:, position, head * WIDTH // 2 : (head + 1) * WIDTH // 2]
                spec = steer.Replace(piece, positions=position, heads=head, n_heads=2)
                with torch.no_grad(), steer.intervene(model, {site: spec}, at="input"):
                    row.append(metric(model(corrupted)))  # type: ignore[operator]
        rows.append(torch.stack(row))
    patched = torch.stack(rows).double()
    return (patched - corrupted_metric.double()) / (clean_metric.double() - corrupted_metric.double())


def test_a_batched_sweep_equals_a_loop_of_single_interventions() -> None:
    model = AttentionOnly().eval()
    clean, corrupted, metric, _ = induction_pair(4, source=SOURCE)
    sites = ["blocks.0.attn.out_proj", "blocks.1.attn.out_proj"]
    result = steer.patch(
        model, clean, corrupted, metric, select=sites, positions="each", heads="each", n_heads=2, at="input",
        batch_size=7,
    )  # fmt: skip
    expected = _loop_of_interventions(model, clean, corrupted, metric, sites)
    assert result.effects.shape == (2, SEQ * 2) and result.effects.dtype == torch.float64
    assert torch.allclose(result.effects, expected, atol=1e-6, rtol=0)
    assert result.cells[:3] == [(0, 0), (0, 1), (1, 0)]


@pytest.mark.slow
def test_after_training_the_induction_circuit_is_where_patching_says() -> None:
    torch.manual_seed(0)
    model = train(AttentionOnly(), steps=500)  # ~5-10 s on one thread
    clean, corrupted, metric, query = induction_pair(32, source=SOURCE)
    with torch.no_grad():
        accuracy = (model(clean)[:, HALF : 2 * HALF - 1].argmax(-1) == clean[:, HALF + 1 : 2 * HALF]).float().mean()
    assert accuracy > 0.95  # it learned the repeat
    residual = steer.patch(model, clean, corrupted, metric, select="blocks.1.resid_pre", positions="each")
    effects = residual.effects[0]
    assert effects[SOURCE] >= 0.9
    assert torch.cat([effects[:SOURCE], effects[SOURCE + 1 :]]).abs().max() <= 0.05
    heads = steer.patch(
        model, clean, corrupted, metric, select="blocks.*.attn.out_proj", at="input", positions=[query],
        heads="each", n_heads=2,
    )  # fmt: skip
    assert heads.effects[0].abs().max() <= 0.05  # layer 0's heads at the query: about 0
    together = steer.patch(model, clean, corrupted, metric, select="blocks.1.attn.out_proj", at="input",
                           positions=[query])  # fmt: skip
    assert together.effects[0, 0] >= 0.7  # layer 1's heads together
    grid = {"select": "blocks.*.attn.out_proj", "at": "input", "positions": "each", "heads": "each", "n_heads": 2}
    activation = steer.patch(model, clean, corrupted, metric, **grid)  # type: ignore[arg-type]
    assert activation.effects.shape == (2, 2 * SEQ)
    assert activation.top(1)[0][:2] == ("blocks.1.attn.out_proj", query)  # an induction head, at the query
    # Attribution through a nonlinear path (layer 1's attention reads the residual stream): the same top cell.
    grid = {"select": ["blocks.0.attn", "blocks.1.resid_pre"], "positions": "each"}
    activation = steer.patch(model, clean, corrupted, metric, **grid)  # type: ignore[arg-type]
    attribution = steer.attribution_patch(model, clean, corrupted, metric, **grid)  # type: ignore[arg-type]
    assert attribution.effects.shape == activation.effects.shape and attribution.method == "attribution"
    assert activation.top(1)[0][:2] == attribution.top(1)[0][:2] == ("blocks.1.resid_pre", SOURCE)
