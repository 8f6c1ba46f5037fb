"""One comparison of saved states for the tests: nested dicts, lists, tensors and plain values, equal to the bit."""

from __future__ import annotations

import torch


def assert_same_state(got: object, expected: object) -> None:
    """Assert `got` equals `expected`: same keys and lengths, tensors equal to the bit (NaN equals NaN)."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys()
        for key in expected:
            assert_same_state(got[key], expected[key])
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected)
        for left, right in zip(got, expected, strict=True):
            assert_same_state(left, right)
    elif isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    else:
        assert got == expected
