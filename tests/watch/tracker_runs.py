"""Test helpers for the tracker sinks: a short watched training, and a reader of W&B's offline run files.

`offline_run` reads the `.wandb` file an offline run leaves (a LevelDB-style log of protobuf records: 32 KiB
blocks, each record cut into FULL/FIRST/MIDDLE/LAST chunks behind a 7-byte header), so the test sees exactly what
W&B would upload with `wandb sync`, without a server.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

import hookscope
from hookscope.results import WatchResults

_BLOCK = 32768
_HEADER = struct.Struct("<4sHB")  # ident ":W&B", magic, version
_CHUNK = struct.Struct("<IHB")  # crc32, length, chunk type (1 full, 2 first, 3 middle, 4 last)


def train_watched(sinks: list[Any], steps: int = 5) -> tuple[WatchResults, list[float]]:
    """Train a small MLP `steps` steps with `watch(..., sinks=sinks)` (flushing every 2 recorded steps); return
    the results and the losses as the loop computed them (an oracle independent of the watch)."""
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with hookscope.watch(model, optimizer, sinks=sinks, buffer_steps=2, hist_bins=8) as w:
        for _ in range(steps):
            loss = model(torch.randn(16, 4)).pow(2).mean()
            w.log_loss(loss)
            losses.append(loss.item())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return w.results(), losses


@dataclass
class OfflineRun:
    """What an offline W&B run wrote: history rows, the final summary, defined metrics, artifacts."""

    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, str] = field(default_factory=dict)  # name or glob -> its step metric
    artifacts: list[dict[str, Any]] = field(default_factory=list)  # {"name", "type", "paths"}
    files: Path = Path()


def offline_run(wandb_dir: Path) -> OfflineRun:
    """Read the one offline run under `wandb_dir` (`WANDB_DIR`) back from its `.wandb` file."""
    from wandb.proto import wandb_internal_pb2

    (path,) = wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
    run = OfflineRun(files=path.parent / "files")
    for raw in _records(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            run.history.append({_key(item): json.loads(item.value_json) for item in record.history.item})
        elif kind == "summary":
            run.summary.update({_key(item): json.loads(item.value_json) for item in record.summary.update})
        elif kind == "metric":
            name = record.metric.name or record.metric.glob_name
            run.metrics[name] = record.metric.step_metric
        elif kind == "artifact":
            paths = [entry.path for entry in record.artifact.manifest.contents]
            run.artifacts.append({"name": record.artifact.name, "type": record.artifact.type, "paths": paths})
    return run


def _key(item: Any) -> str:
    return str(item.key) if item.key else "/".join(item.nested_key)


def _records(data: bytes) -> list[bytes]:
    ident, _, _ = _HEADER.unpack_from(data)
    if ident != b":W&B":
        raise ValueError(f"not a W&B run file: {ident!r}")
    records, parts, position = [], [], _HEADER.size
    while position + _CHUNK.size <= len(data):
        left = _BLOCK - position % _BLOCK
        if left < _CHUNK.size:  # the rest of a block too short for a header is padding
            position += left
            continue
        _, length, kind = _CHUNK.unpack_from(data, position)
        position += _CHUNK.size
        if kind == 0 and length == 0:
            position += left - _CHUNK.size  # zero padding to the end of the block
            continue
        parts.append(data[position : position + length])
        position += length
        if kind in (1, 4):
            records.append(b"".join(parts))
            parts = []
    return records
