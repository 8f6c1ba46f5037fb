"""The demo behind `hookscope demo`: a small CNN trained on scikit-learn's bundled digits, with every monitor on.

`_data.py` loads the 8x8 handwritten digits that ship inside scikit-learn (no download) and splits them;
`_model.py` holds the CNN and the faults `--fault` plants (`FAULTS`: a learning rate far too high, dead ReLU
units, constant initialization, a NaN source), each with the doctor check that should find it; `_train.py`
trains it under `watch()`, `ActivationStats` and the weight update monitor and returns a `DemoRun`. The command
line (`hookscope.cli`) prints the run and writes the report through `hookscope.report`. `_transformer.py` holds
`TinyGPT`, the tiny decoder the transformer instabilities are reproduced on (the doctor's transformer checks and
their guide), and its training loop.
"""

from ._transformer import TinyGPT, TinyGPTConfig, tiny_gpt_optimizer, train_tiny_gpt

__all__ = ["TinyGPT", "TinyGPTConfig", "tiny_gpt_optimizer", "train_tiny_gpt"]
