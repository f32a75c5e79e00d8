"""Memory-mapped safetensors files, single or sharded.

Headers are read first so every tensor's dtype and shape can be checked before any data is
touched; tensors are then views into the mapped files (no copy until a dtype changes).
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CheckpointError, MissingTensor

DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "U32": torch.uint32,
    "I32": torch.int32,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I64": torch.int64,
    "I16": torch.int16,
    "U16": torch.uint16,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    start: int  # byte offset of the data in the file
    nbytes: int


class Checkpoint:
    """The tensors of a checkpoint folder, by name; data is mapped only on `read`."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.infos: dict[str, TensorInfo] = {}
        for file in self._files():
            self.infos.update(_read_header(file))
        self._maps: dict[Path, mmap.mmap] = {}
        self.reads = 0

    def _files(self) -> list[Path]:
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map", {})
            files = sorted({self.folder / f for f in weight_map.values()})
        else:
            files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{self.folder}: no .safetensors files")
        for f in files:
            if not f.is_file():
                raise CheckpointError(f"{self.folder}: the index names {f.name}, which is missing")
        return files

    def __contains__(self, name: str) -> bool:
        return name in self.infos

    def info(self, name: str) -> TensorInfo:
        if name not in self.infos:
            raise MissingTensor(f"{self.folder}: tensor {name} is missing")
        return self.infos[name]

    def read(self, name: str) -> torch.Tensor:
        """A tensor viewing the mapped file (copy-on-write pages: writable, never written back)."""
        info = self.info(name)
        if info.dtype not in DTYPES:
            raise CheckpointError(f"{name}: unsupported safetensors dtype {info.dtype}")
        mm = self._maps.get(info.file)
        if mm is None:
            with open(info.file, "rb") as fh:
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
            self._maps[info.file] = mm
        self.reads += 1
        dtype = DTYPES[info.dtype]
        count = info.nbytes // torch.empty((), dtype=dtype).element_size()
        if count == 0:
            return torch.empty(info.shape, dtype=dtype)
        flat = torch.frombuffer(mm, dtype=dtype, count=count, offset=info.start)
        return flat.view(info.shape)

    @property
    def nbytes(self) -> int:
        return sum(i.nbytes for i in self.infos.values())


def _read_header(file: Path) -> dict[str, TensorInfo]:
    with open(file, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise CheckpointError(f"{file}: not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", head)
        try:
            header = json.loads(fh.read(length))
        except ValueError as exc:
            raise CheckpointError(f"{file}: unreadable safetensors header ({exc})") from exc
    base = 8 + length
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        out[name] = TensorInfo(
            name, meta["dtype"], tuple(meta["shape"]), file, base + begin, end - begin
        )
    return out
