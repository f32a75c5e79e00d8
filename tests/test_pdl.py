"""Dependent launch is asked for where the card has it (Hopper or later, not under Triton's
interpreter) unless switched off (TENSORFOLD_PDL=0); the kernel's flag and the launch keyword
come together (tests/hopper.py's assert_waits_first checks the compiled kernels wait first)."""

import pytest
import torch

pytest.importorskip("triton")
from tensorfold.ops.triton import launch  # noqa: E402

CUDA = torch.device("cuda", 0)


@pytest.fixture
def card(monkeypatch):
    """A card of a given major version, nothing set, the cache of answers cleared around it."""
    launch._keywords.cache_clear()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("TENSORFOLD_PDL", raising=False)

    def make(major: int) -> None:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (major, 0))

    yield make
    launch._keywords.cache_clear()


@pytest.mark.parametrize("setting", [None, "1"])
def test_hopper_launches_early_and_the_kernel_waits(card, monkeypatch, setting):
    card(9)
    if setting is not None:
        monkeypatch.setenv("TENSORFOLD_PDL", setting)
    assert launch.pdl(CUDA) == {"PDL": True, "launch_pdl": True}


@pytest.mark.parametrize("why", ["ampere", "interpreter", "switched off", "cpu"])
def test_no_dependent_launch_elsewhere(card, monkeypatch, why):
    card(8 if why == "ampere" else 9)
    if why == "interpreter":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    if why == "switched off":
        monkeypatch.setenv("TENSORFOLD_PDL", "0")
    assert launch.pdl(torch.device("cpu") if why == "cpu" else CUDA) == {}
