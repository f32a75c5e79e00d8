"""The in-memory random checkpoint (tools/random_checkpoint.py): the same tensors, headers and
model as make_random's files, through the loader's own path, with no weight file written."""

import pytest
import torch
from engine_util import position_logits, sample_prompt

from tensorfold.engine.engine import Engine, EngineConfig
from tensorfold.errors import MissingTensor
from tensorfold.models.checkpoint import Checkpoint
from tensorfold.models.loader import load_model
from tensorfold.tools.make_random import RandomPlan, make_random
from tensorfold.tools.random_checkpoint import RandomCheckpoint, load_random


@pytest.mark.parametrize("quantize", [None, "4", "8", "mixed"])
def test_in_memory_tensors_are_the_files(quantize, tmp_path):
    plan = RandomPlan("tiny-moe", quantize, seed=3)
    files = Checkpoint(make_random(tmp_path / "f", "tiny-moe", quantize, seed=3))
    memory = RandomCheckpoint(plan.write_config(tmp_path / "m"), plan)
    assert memory.reads == 0 and sorted(memory.infos) == sorted(files.infos)
    assert memory.nbytes == files.nbytes
    names = list(files.infos)
    for name in names[::-1]:  # drawn out of file order: each entry has its own generator
        a, b = files.info(name), memory.info(name)
        assert (a.dtype, a.shape, a.nbytes) == (b.dtype, b.shape, b.nbytes), name
        assert torch.equal(files.read(name), memory.read(name)), name
    with pytest.raises(MissingTensor):
        memory.read("model.layers.0.nothing")
    assert not list((tmp_path / "m").glob("*.safetensors"))


def test_in_memory_model_is_the_files_model(tmp_path):
    """Loaded through the loader, the two give the same logits; the seed changes them."""
    path = make_random(tmp_path / "f", "tiny-moe", "4")

    def logits(model):
        eng = Engine(model, None, EngineConfig(parallel=1, context=256, chunk=64))
        return position_logits(eng, sample_prompt(5, 24, 500))

    ref = logits(load_model(path))
    assert torch.equal(logits(load_random(tmp_path / "m", RandomPlan("tiny-moe", "4"), torch.float32, "cpu")), ref)  # fmt: skip
    other = load_random(tmp_path / "s", RandomPlan("tiny-moe", "4", seed=1), torch.float32, "cpu")
    assert not torch.equal(logits(other), ref)
