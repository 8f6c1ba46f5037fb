"""Run hookscope callbacks (`watch()`, `ActivationStats`, `HookCallback`, any `hookscope.callbacks.Callback`)
inside trainers.

`lightning.py` holds a Lightning `Callback` for `Trainer.fit`; `transformers.py` a Hugging Face
`TrainerCallback` for `Trainer.train`. Each maps its trainer's events onto the `Callback` protocol (fit start/end,
batch start/end, after backward, before/after the optimizer step) and imports its trainer only when imported
itself, so `import hookscope` never needs Lightning or transformers (extras `hookscope[lightning]`,
`hookscope[transformers]`).
"""

__all__: list[str] = []
