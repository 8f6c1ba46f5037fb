"""steer.intervene: the steered forward against a hand-written one, and hook hygiene (nothing left, nothing of
anyone else's removed, a running watch() sees the steered values)."""

from __future__ import annotations

import copy
import gc
import io
import pickle
import warnings
import weakref
from collections import OrderedDict

import pytest
import torch
import torch.nn as nn

import hookscope
from hookscope import list_hooks, remove_hooks, steer


def _model() -> nn.Sequential:
    return nn.Sequential(OrderedDict(encoder=nn.Linear(4, 8), act=nn.ReLU(), decoder=nn.Linear(8, 2)))


def _counts(model: nn.Module) -> list[int]:
    return [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()]


def test_the_steered_output_is_the_hand_steered_forward() -> None:
    model, x = _model(), torch.randn(3, 4)
    vector = torch.randn(8)
    with steer.intervene(model, {"encoder": [steer.Add(vector, scale=2.0), steer.Clamp(max=0.5)]}):
        got = model(x)
    expected = model.decoder(model.act((model.encoder(x) + 2.0 * vector).clamp(max=0.5)))
    assert torch.equal(got, expected)
    assert torch.equal(model(x), model.decoder(model.act(model.encoder(x))))  # gone after the block


def test_at_input_edits_the_first_input() -> None:
    model, x = _model(), torch.randn(3, 4)
    with steer.intervene(model, {"decoder": steer.Zero(heads=[1], n_heads=2)}, at="input"):
        got = model(x)
    hidden = model.act(model.encoder(x))
    hidden[:, 4:] = 0.0
    assert torch.equal(got, model.decoder(hidden))


def test_a_glob_key_steers_every_module_it_matches() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
    x = torch.randn(2, 4)
    with steer.intervene(model, {"*": steer.Scale(0.5)}) as steering:
        got = model(x)
        assert list(steering.sites) == ["0", "1", "2"]
    assert torch.equal(got, model[2](model[1](model[0](x) * 0.5) * 0.5) * 0.5)


def test_a_wrong_site_among_several_leaves_nothing_attached_and_lists_the_closest_paths() -> None:
    model = _model()
    before = _counts(model)
    with pytest.raises(
        ValueError, match=r"interventions key must name an existing module path, got 'decodr'.*'decoder'"
    ):
        steer.intervene(model, {"encoder": steer.Zero(), "decodr": steer.Zero()})
    with pytest.raises(
        ValueError, match=r"Add.vector of shape \(3,\) does not fit site 'decoder': its last dimension must be 2"
    ):
        steer.intervene(model, {"encoder": steer.Zero(), "decoder": steer.Add(torch.ones(3))})  # width known: 2
    with pytest.raises(
        TypeError,
        match=r"interventions must be a mapping of str to Intervention or a list of .*, got \{'encoder': 'zero'\}",
    ):
        steer.intervene(model, {"encoder": "zero"})  # type: ignore[dict-item]
    assert _counts(model) == before and not list_hooks(model)


def test_a_shape_that_fails_in_the_forward_raises_naming_the_site_and_removes_every_hook() -> None:
    model = _model()
    steering = steer.intervene(model, {"encoder": steer.Zero(), "act": steer.Add(torch.ones(5))})  # act: width unknown
    assert len(list_hooks(model)) == 2
    with pytest.raises(ValueError, match=r"Add.vector of shape \(5,\) does not fit site 'act'"):
        model(torch.randn(2, 4))
    assert steering.is_removed and not list_hooks(model)


def test_an_exception_inside_the_block_leaves_nothing_attached() -> None:
    model = _model()
    with pytest.raises(KeyError), steer.intervene(model, {"encoder": steer.Zero(), "decoder": steer.Scale(2.0)}):
        model(torch.randn(1, 4))
        raise KeyError("user error")
    assert not list_hooks(model) and _counts(model) == [0, 0, 0, 0]


def test_user_hooks_and_a_running_watch_stay_attached_and_see_the_steered_value() -> None:
    model, x = _model(), torch.randn(16, 4)
    seen: list[torch.Tensor] = []
    user = model.encoder.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with hookscope.watch(model, opt) as w:
        for step in range(4):
            steering = steer.intervene(model, {"encoder": steer.Zero()}) if step % 2 == 0 else None
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.log_loss(loss)
            if steering is not None:
                steering.remove()
                steering.remove()  # idempotent
        watched = len([row for row in list_hooks(model) if row.is_hookscope])
    results = w.results()
    user.remove()
    assert watched > 0  # the watch's hooks were still there at the end
    assert [bool((s == 0).all()) for s in seen] == [True, False, True, False]  # the user's hook ran every step
    maxima = results.activations["encoder"]["max"]
    assert maxima[0] == 0 and maxima[2] == 0 and maxima[1] > 0 and maxima[3] > 0  # the watch saw the zeros
    assert not list_hooks(model)


def test_steer_never_removes_a_hook_it_did_not_place() -> None:
    model = _model()
    outer = hookscope.hook_output(model.encoder)
    user = model.encoder.register_forward_pre_hook(lambda m, a: None)
    with steer.intervene(model, {"encoder": steer.Zero()}):
        assert len(model.encoder._forward_hooks) == 2
    assert len(model.encoder._forward_hooks) == 1 and len(model.encoder._forward_pre_hooks) == 1
    outer.remove()
    user.remove()


def test_list_hooks_shows_the_tag_and_remove_hooks_by_tag_removes_them() -> None:
    model = _model()
    steering = steer.intervene(model, {"encoder": steer.Zero(), "decoder": steer.Zero()}, at="input")
    rows = [(row.path, row.kind, row.tags, row.owner) for row in list_hooks(model)]
    assert rows == [
        ("encoder", "forward_pre", ("steer",), "Steering"),
        ("decoder", "forward_pre", ("steer",), "Steering"),
    ]
    assert remove_hooks(tag="steer") == 2 and steering.is_removed and not list_hooks(model)


def test_scopes_remove_it_and_copies_and_pickles_of_the_model_carry_no_intervention() -> None:
    model, x = _model(), torch.randn(2, 4)
    plain = model(x)
    with hookscope.scope():
        steer.intervene(model, {"encoder": steer.Zero()})
        twin = copy.deepcopy(model)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        pickled = pickle.loads(pickle.dumps(model))
        assert not torch.equal(model(x), plain)
    assert not list_hooks(model)
    assert torch.equal(twin(x), plain) and torch.equal(pickled(x), plain)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, weights_only=False)(x), plain)


def test_the_model_is_freed_after_remove_without_the_garbage_collector() -> None:
    gc.disable()
    try:
        model = _model()
        steering = steer.intervene(model, {"encoder": steer.Add(torch.ones(8))})
        model(torch.randn(1, 4))
        steering.remove()
        alive = weakref.ref(model)
        del model
        assert alive() is None
    finally:
        gc.enable()


def test_bad_arguments_name_the_argument() -> None:
    model = _model()
    with pytest.raises(TypeError, match="interventions must be a non-empty dict"):
        steer.intervene(model, {})
    with pytest.raises(ValueError, match="at must be one of 'input', 'output', got 'middle'"):
        steer.intervene(model, {"encoder": steer.Zero()}, at="middle")


def test_a_transformer_compiled_after_intervene_runs_position_and_head_edits_and_attaching_later_warns() -> None:
    from hookscope.hooks import CompiledModelWarning

    from .models import AttentionOnly, forward_by_hand, induction_pair

    model = AttentionOnly().eval()
    tokens, _, _, _ = induction_pair(4)

    def by_hand(z: torch.Tensor) -> None:
        z[:, 5, 16:] = 0.0

    with torch.no_grad():
        expected = forward_by_hand(model, tokens, heads_0=by_hand)
        head = steer.Zero(positions=[5], heads=[1], n_heads=2)
        with steer.intervene(model, {"blocks.0.attn.out_proj": head}, at="input"):
            compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
            got = compiled(tokens)
        assert torch.allclose(got, expected, atol=1e-6)
        with pytest.warns(CompiledModelWarning, match="hooks are being attached to a torch.compile'd OptimizedModule"):
            steer.intervene(compiled, {"blocks.0": steer.Zero()}).remove()
    torch._dynamo.reset()


def test_torchscript_is_refused() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is deprecated; users still have some
        scripted = torch.jit.script(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="model is a TorchScript module"):
        steer.intervene(scripted, {"": steer.Zero()})


def test_a_keyword_only_input_is_rewritten_once() -> None:
    calls: list[torch.Tensor] = []

    class Keyword(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, *, hidden: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
            calls.append(hidden)
            return self.linear(hidden) * scale

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Keyword()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.block(hidden=x, scale=2.0)

    model, x = Outer(), torch.randn(2, 4)
    with steer.intervene(model, {"block": steer.Add(torch.ones(4))}, at="input"):
        got = model(x)
    assert torch.equal(calls[-1], x + 1.0) and torch.equal(got, model.block.linear(x + 1.0) * 2.0)
