"""Read wandb offline `.wandb` run files back (the leveldb-log record format of protobuf Records)."""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK_LEN = 32768
HEADER_LEN = 7  # both the file header (ident, magic, version) and each record header (crc, length, type)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class WandbRunFiles:
    run_id: str
    history: list[dict]  # one dict per run.log call, in order across every offline dir of the run
    config: dict


def read_records(path: Path) -> list[wandb_internal_pb2.Record]:
    """Every complete protobuf Record in one `.wandb` file (a torn tail is ignored)."""
    data = path.read_bytes()
    if len(data) < HEADER_LEN:
        return []  # created, nothing flushed yet
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER_LEN])
    if ident != b":W&B" or magic != 0xBEE1:
        raise ValueError(f"{path} is not a wandb datastore file (header {ident!r}, magic {magic:#x})")
    records, pos, parts = [], HEADER_LEN, []
    while pos + HEADER_LEN <= len(data):
        left_in_block = BLOCK_LEN - pos % BLOCK_LEN
        if left_in_block < HEADER_LEN:
            pos += left_in_block  # zero trailer of the block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER_LEN])
        if kind == 0 and length == 0:
            pos += left_in_block
            continue
        chunk = data[pos + HEADER_LEN:pos + HEADER_LEN + length]
        if len(chunk) < length:
            break
        pos += HEADER_LEN + length
        if kind == FULL:
            parts = [chunk]
        elif kind == FIRST:
            parts = [chunk]
            continue
        elif kind == MIDDLE:
            parts.append(chunk)
            continue
        elif kind == LAST:
            parts.append(chunk)
        record = wandb_internal_pb2.Record()
        record.ParseFromString(b"".join(parts))
        records.append(record)
    return records


def read_offline_run(wandb_dir: Path, run_id: str) -> WandbRunFiles:
    """History and config of a run, concatenating every offline dir it was resumed in."""
    # a resumed run gets a new offline dir (with a suffix when started within the same second);
    # the earlier dir stopped being written first
    files = sorted(Path(wandb_dir).rglob(f"offline-run-*-{run_id}*/run-{run_id}.wandb"),
                   key=lambda p: p.stat().st_mtime)
    if not files:
        return WandbRunFiles(run_id=run_id, history=[], config={})
    history, config = [], {}
    for path in files:
        for record in read_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                for item in record.history.item})
            elif kind == "config":
                for item in record.config.update:
                    config[item.key] = json.loads(item.value_json)
            elif kind == "run" and record.run.config.update:
                for item in record.run.config.update:
                    config[item.key] = json.loads(item.value_json)
    return WandbRunFiles(run_id=run_id, history=history, config=config)


def offline_history_rows(wandb_dir: Path, run_id: str) -> int:
    """How many history rows the offline files of a run hold (flushed rows only)."""
    return len(read_offline_run(wandb_dir, run_id).history)
