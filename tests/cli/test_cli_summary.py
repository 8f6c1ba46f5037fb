"""`hookscope summary TARGET [--input-shape ...] [--dtype ...]`: loads factories by import or file path, refuses
pickles without --trust, summarizes parameters alone without --input-shape, and runs language models on token ids."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from hookscope.summary import summary

MODELS = """
import torch.nn as nn

def build():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

class Factory:
    @staticmethod
    def make():
        return nn.Linear(3, 3)

model = nn.Linear(2, 5)
not_a_model = 7

def broken():
    return "model"
"""


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "zoo_models.py"
    path.write_text(MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return path


def expected(model: nn.Module, shape: tuple[int, ...]) -> str:
    return summary(model, input_size=shape).to_text(shape_width=None)


def test_summary_of_an_import_path_factory(models: Path, hookscope: Callable[..., object]) -> None:
    done = hookscope("summary", "zoo_models:build", "--input-shape", "2,4")
    assert done.code == 0, done.err
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    assert done.out.strip() == expected(reference, (2, 4)).strip()
    assert "Total params: 58" in done.out  # 4*8+8 + 8*2+2


def test_summary_of_a_file_factory_a_nested_factory_and_a_module(models: Path, hookscope: Callable[..., object]):
    done = hookscope("summary", f"{models}:Factory.make", "--input-shape", "1,3")
    assert done.code == 0 and "Total params: 12" in done.out
    done = hookscope("summary", "zoo_models:model", "--input-shape", "1x2")
    assert done.code == 0 and "Total params: 15" in done.out


def test_several_inputs_are_separated_by_semicolons(tmp_path: Path, hookscope: Callable[..., object]) -> None:
    path = tmp_path / "two.py"
    path.write_text(
        "import torch.nn as nn\nclass Two(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.a, self.b = nn.Linear(2, 3), nn.Linear(5, 3)\n"
        "    def forward(self, x, y):\n        return self.a(x) + self.b(y)\n"
    )
    done = hookscope("summary", f"{path}:Two", "--input-shape", "1,2;1,5")
    assert done.code == 0, done.err
    assert "Total params: 27" in done.out  # 2*3+3 + 5*3+3


@pytest.mark.parametrize(
    ("target", "shape", "message"),
    [
        ("zoo_models:build", "2,x", r"--input-shape must be comma-separated positive ints like 1,3,32,32, got '2,x'"),
        ("zoo_models:build", "2,0", r"--input-shape must be comma-separated positive ints"),
        ("zoo_models:nothing", "2,4", r"TARGET 'zoo_models:nothing': 'zoo_models' has no attribute 'nothing'"),
        ("no_such_package.mod:f", "2,4", r"TARGET 'no_such_package.mod:f': cannot import 'no_such_package.mod'"),
        ("zoo_models:not_a_model", "2,4", r"TARGET 'zoo_models:not_a_model' must name a callable that returns"),
        ("zoo_models:broken", "2,4", r"TARGET 'zoo_models:broken' must return a torch.nn.Module, got str"),
        ("missing.py:build", "2,4", r"TARGET 'missing.py:build': file 'missing.py' does not exist"),
        ("zoo_models", "2,4", r"TARGET must be package.module:factory or path/to/file.py:factory"),
        (":build", "2,4", r"TARGET must be package.module:factory or path/to/file.py:factory, got ':build'"),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(
    models: Path, hookscope: Callable[..., object], target: str, shape: str, message: str
) -> None:
    done = hookscope("summary", target, "--input-shape", shape)
    assert done.code == 2 and done.out == ""
    (line,) = done.err.strip().splitlines()
    assert line.startswith("hookscope: error: ") and re.search(message, line), line
    assert line.endswith("(--verbose shows the traceback)")


def test_a_forward_that_fails_is_one_line_and_verbose_shows_the_traceback(
    models: Path, hookscope: Callable[..., object]
) -> None:
    done = hookscope("summary", "zoo_models:build", "--input-shape", "2,3")
    assert done.code == 1
    (line,) = done.err.strip().splitlines()
    assert line.startswith("hookscope: error: ") and "Traceback" not in done.err
    for verbose in (("summary", "--verbose"), ("--verbose", "summary")):  # after or before the subcommand
        done = hookscope(*verbose, "zoo_models:build", "--input-shape", "2,3")
        assert done.code == 1 and "Traceback (most recent call last)" in done.err
        assert "(--verbose shows the traceback)" not in done.err


def test_without_input_shape_the_parameters_are_listed(models: Path, hookscope: Callable[..., object]) -> None:
    done = hookscope("summary", "zoo_models:build")
    assert done.code == 0, done.err
    assert "parameters only, no forward run" in done.out and "No forward run: no example inputs were given" in done.out
    assert "Total params: 58" in done.out and "Total FLOPs: unknown (no forward run)" in done.out
    done = hookscope("summary", "zoo_models:build", "--depth", "0", "--columns", "params,trainable")
    assert done.code == 0, done.err
    header = next(line for line in done.out.splitlines() if line.startswith("Layer"))
    assert header.split() == ["Layer", "Params", "Trainable"] and "├─0" not in done.out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dtype", "lng"], r"--dtype must be a torch.dtype, a tensor type such as torch.LongTensor, or a name"),
        (["--dtype", "long;float;long"], r"--dtype must give one dtype, or one per input \(1 here\), got"),
        (["--columns", "params,size"], r"--columns must be comma-separated names from type, input_shape"),
    ],
)
def test_dtype_and_columns_mistakes_are_usage_errors(
    models: Path, hookscope: Callable[..., object], extra: list[str], message: str
) -> None:
    done = hookscope("summary", "zoo_models:build", "--input-shape", "2,4", *extra)
    assert done.code == 2 and re.search(message, done.err), done.err
    done = hookscope("summary", "zoo_models:build", "--dtype", "long")
    assert done.code == 2 and "--dtype needs --input-shape" in done.err


LANGUAGE_MODELS = """
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

def gpt2():
    config = GPT2Config(vocab_size=96, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)

def bert():
    config = BertConfig(vocab_size=96, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16)
    return BertModel(config)
"""


@pytest.mark.slow  # imports transformers: ~4-8 s on 2 loaded cores
def test_language_models_run_on_token_ids_with_dtype_long(
    tmp_path: Path, hookscope: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tmp_path / "language_models.py"
    path.write_text(LANGUAGE_MODELS)
    done = hookscope("summary", f"{path}:gpt2", "--input-shape", "2,8")
    assert done.code == 1 and "failed in module 'transformer.wte'" in done.err  # float token ids into Embedding
    assert "for token ids pass dtypes=torch.long (CLI: --dtype long)" in done.err
    for factory, spelling in (("gpt2", "long"), ("bert", "int64")):
        done = hookscope("summary", f"{path}:{factory}", "--input-shape", "2,8", "--dtype", spelling)
        assert done.code == 0, done.err
        module = importlib.import_module("transformers")
        model = (
            module.GPT2LMHeadModel(module.GPT2Config(vocab_size=96, n_positions=16, n_embd=16, n_layer=2, n_head=2))
            if factory == "gpt2"
            else module.BertModel(
                module.BertConfig(
                    vocab_size=96, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=16,
                )
            )
        )  # fmt: skip
        expected = sum(p.numel() for p in model.parameters())  # tied GPT-2 embeddings are one parameter
        assert f"Total params: {expected:,}" in done.out
        hidden = "[2, 8, 96]" if factory == "gpt2" else "[2, 8, 16]"  # logits over the vocabulary / hidden states
        assert hidden in done.out


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_pickled_and_torchscript_models_need_trust(tmp_path: Path, hookscope: Callable[..., object]) -> None:
    pickled, scripted = tmp_path / "model.pt", tmp_path / "scripted.pt"
    torch.save(nn.Linear(4, 2), pickled)
    torch.jit.script(nn.Linear(4, 2)).save(str(scripted))
    for path in (pickled, scripted):
        done = hookscope("summary", str(path), "--input-shape", "1,4")
        assert done.code == 2
        assert (
            f"TARGET {str(path)!r} is a saved model file: loading a pickled model or TorchScript runs code" in done.err
        )
    done = hookscope("summary", str(pickled), "--input-shape", "1,4", "--trust")
    assert done.code == 0 and "Total params: 10" in done.out
    done = hookscope("summary", str(scripted), "--input-shape", "1,4", "--trust")
    assert done.code == 0, done.err
    assert "Total params: 10" in done.out and "TorchScript modules (Linear (root)) run without Python hooks" in done.out
    assert "[1, 2]" in done.out  # the scripted root's own output, seen from outside
