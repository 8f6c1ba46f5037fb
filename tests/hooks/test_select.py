"""The selector language and path normalization across wrappers."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

from hookscope.hooks import CompiledModelWarning, named_modules, normalize_path, register_module_hook, select_modules
from hookscope.hooks._select import unwrap


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(4, 4)
        self.mlp = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.ModuleList([Block(), Block()])
        self.act = nn.ReLU()
        self.head = nn.Linear(4, 2)


def paths(model: nn.Module, selector: object) -> list[str]:
    return [p for p, _ in select_modules(model, selector)]


def test_none_selects_modules_with_own_parameters_in_model_order() -> None:
    assert paths(Net(), None) == [
        "encoder.0.attn", "encoder.0.mlp.0", "encoder.0.mlp.2",
        "encoder.1.attn", "encoder.1.mlp.0", "encoder.1.mlp.2", "head",
    ]  # fmt: skip


def test_glob_star_is_one_component_and_double_star_any_depth() -> None:
    net = Net()
    assert paths(net, "encoder.*.mlp") == ["encoder.0.mlp", "encoder.1.mlp"]
    assert paths(net, "encoder.*.mlp.?") == [f"encoder.{i}.mlp.{j}" for i in (0, 1) for j in (0, 1, 2)]
    assert paths(net, "**.attn") == ["encoder.0.attn", "encoder.1.attn"]
    assert paths(net, "encoder.1.**") == [p for p, _ in named_modules(net) if p.startswith("encoder.1")]
    assert paths(net, "") == [""]


def test_lists_types_predicates_and_modules() -> None:
    net = Net()
    assert paths(net, ["head", "act"]) == ["act", "head"]
    assert paths(net, nn.GELU) == ["encoder.0.mlp.1", "encoder.1.mlp.1"]
    assert paths(net, (nn.ReLU, nn.GELU)) == ["encoder.0.mlp.1", "encoder.1.mlp.1", "act"]
    assert paths(net, lambda p, m: p.endswith("attn")) == ["encoder.0.attn", "encoder.1.attn"]
    assert paths(net, net.head) == ["head"]
    assert paths(net, [nn.ReLU, "head"]) == ["act", "head"]


def test_unknown_path_lists_closest_paths() -> None:
    with pytest.raises(
        ValueError, match=r"select must name an existing module path, got 'encoder.0.atn'.*'encoder.0.attn'"
    ):
        select_modules(Net(), "encoder.0.atn")
    with pytest.raises(ValueError, match=r"got 'decoder.\*'"):
        select_modules(Net(), "decoder.*")


def test_bad_selector_kinds_are_refused() -> None:
    with pytest.raises(TypeError, match="select must be None, a path or glob, .* got 3"):
        select_modules(Net(), 3)
    with pytest.raises(ValueError, match="select must be a module inside the model"):
        select_modules(Net(), nn.Linear(1, 1))


def test_paths_are_the_same_through_compile_and_data_parallel_wrappers() -> None:
    net = Net()
    wrapped = nn.DataParallel(net)  # CPU-only DataParallel just wraps: same `module.` prefix as DDP
    compiled = torch.compile(net, backend="eager")
    plain = [p for p, _ in named_modules(net)]
    assert [p for p, _ in named_modules(wrapped)] == plain
    assert [p for p, _ in named_modules(compiled)] == plain
    assert select_modules(compiled, "head")[0][1] is net.head
    assert unwrap(wrapped) is net and unwrap(compiled) is net
    assert normalize_path("module._orig_mod.encoder.0._fsdp_wrapped_module.attn.weight") == "encoder.0.attn.weight"
    assert normalize_path("encoder.module_list") == "encoder.module_list"


def test_shared_module_appears_once_at_its_first_path() -> None:
    shared = nn.Linear(2, 2)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    assert paths(model, nn.Linear) == ["0"]


def test_scripted_modules_are_refused_and_compiled_ones_warn() -> None:
    scripted = torch.jit.script(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="module is a TorchScript module .*hooks are unsupported on ScriptModule"):
        register_module_hook(scripted, "forward", lambda *a: None)
    traced = torch.jit.trace(nn.Linear(2, 2), torch.zeros(1, 2))
    with pytest.raises(TypeError, match="TorchScript"):
        register_module_hook(traced, "forward", lambda *a: None)
    compiled = torch.compile(nn.Linear(2, 2), backend="eager")
    with pytest.warns(CompiledModelWarning, match="runs without them until torch.compile recompiles it"):
        register_module_hook(compiled, "forward", lambda *a: None).remove()


def test_hooks_attached_before_compiling_fire_in_the_compiled_model() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    seen: list[torch.Size] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompiledModelWarning)
        handle = register_module_hook(model[0], "forward", lambda m, a, o: seen.append(o.shape))
    compiled = torch.compile(model, backend="eager")
    compiled(torch.randn(2, 3))
    handle.remove()
    assert seen == [torch.Size([2, 3])]
