"""Text of the summaries of five models, against golden files (rewrite: pytest tests/summary --update-golden)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
from summary_models import Encoder, LSTMTagger, Shared, SmallCNN, mlp

import hookscope.hooks as hooks
from hookscope.summary import module_summary, summary

Golden = Callable[[str, str], None]


def test_mlp(golden: Golden) -> None:
    golden("mlp", str(summary(mlp(), input_size=(8, 16))))


def test_cnn_with_batchnorm(golden: Golden) -> None:
    s = summary(SmallCNN(), input_size=(2, 3, 16, 16))
    golden("cnn", str(s))
    golden("cnn_depth1_ascii", s.to_text(depth=1, ascii_only=True))


def test_lstm(golden: Golden) -> None:
    golden("lstm", str(summary(LSTMTagger(), input_size=(4, 7), dtypes=torch.long)))


def test_transformer_encoder_with_dict_output(golden: Golden) -> None:
    s = summary(Encoder(), tokens=torch.zeros(2, 6, dtype=torch.long), scale=2.0)
    golden("encoder", str(s))


def test_shared_module_with_hooks(golden: Golden) -> None:
    model = Shared()
    model.stack[1].register_forward_pre_hook(lambda m, a: None)
    with hooks.hook_output(model.out):
        golden("shared", str(summary(model, input_size=(3, 5), dtypes=torch.long)))


def test_module_summary_cnn(golden: Golden) -> None:
    model = nn.Sequential(SmallCNN().features, nn.Flatten(), nn.LazyLinear(4))
    golden("module_summary_cnn", module_summary(model, torch.zeros(5, 3, 12, 12)))
