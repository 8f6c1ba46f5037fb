"""A Hugging Face style loop: a tiny GPT-2 built from a config (random weights, no download), the loss computed by
the model from `labels=`, `out.loss.backward()`, AdamW. Prints six digits per step."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config)
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
tokens = torch.randint(0, config.vocab_size, (6, 4, 16))

for step, input_ids in enumerate(tokens):
    out = model(input_ids, labels=input_ids)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step}: loss {out.loss.item():.6f}")
