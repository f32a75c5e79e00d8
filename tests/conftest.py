"""Session-wide tiny checkpoints, built once per test session from code (no network).

Fixture -> what it is:
  tokenizer_dir   toy byte-level BPE + Qwen3.5 control tokens + chat template
  hf_tiny         SPEC_A (tied), flat Qwen3_5ForCausalLM, single model.safetensors
  hf_tiny_nested  SPEC_A, VL layout (model.language_model.* + model.visual.* + mtp.*);
                  text weights bit-identical to hf_tiny
  hf_tiny_b       SPEC_B (untied, 8 layers), flat, sharded (index.json + several shards)
  hf_tiny_c       SPEC_C (untied), flat, A_log / linear_attn.norm stored as BF16 (Qwen3.6 style)
  mlx_q4          mlx_lm 4-bit g64 of hf_tiny_b
  mlx_q8_g32      mlx_lm 8-bit g32 of hf_tiny (tied: quantized embedding doubles as the head)
  mlx_mixed       mlx_lm 4-bit g64 of hf_tiny_c with per-module bits (MIXED_RECIPE)
  hf_moe          a tiny Qwen3.5 MoE (qwen3_5_moe_text), experts saved one by one
  hf_moe_fused    the same weights, experts fused (experts.gate_up_proj / down_proj)
  hf_moe_ties     hf_moe_fused with router rows equal in runs of three: exact routing ties
  mlx_moe_q4      mlx_lm 4-bit g64 of hf_moe_fused (switch_mlp; router and shared gate 8-bit)
  mlx_moe_mixed   mlx_lm mixed bits of hf_moe_fused (MOE_MIXED_RECIPE)
  nine_b          the 9B shape, random weights, on the GPU (module scope; GPU tests only)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Tests import the builders as `from fixtures.checkpoints import ...`.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixtures.checkpoints import (  # noqa: E402
    HF_VARIANTS,
    MLX_VARIANTS,
    build_hf_checkpoint,
    build_mlx_checkpoint,
    build_tokenizer,
)

from tensorfold.tools.make_random import FORMATS  # noqa: E402


def _require_mlx() -> None:
    try:
        import mlx.core  # noqa: F401
        import mlx_lm  # noqa: F401
    except Exception as exc:  # ImportError, or a broken native wheel
        pytest.skip(f"mlx / mlx_lm not importable ({exc!r}); MLX fixtures need mlx[cpu] + mlx-lm")


def _hf(name: str, root: Path, tokenizer_dir: Path) -> Path:
    spec, kwargs = HF_VARIANTS[name]
    return build_hf_checkpoint(root / name, spec, tokenizer_dir=tokenizer_dir, **kwargs)


def _mlx(name: str, root: Path, source_dir: Path) -> Path:
    _require_mlx()
    _source, kwargs = MLX_VARIANTS[name]
    return build_mlx_checkpoint(source_dir, root / name, **kwargs)


# Files whose tests each run for a minute or more: started first, so that with two workers
# they run side by side rather than last on one of them.
LONG_FILES = ("test_triton_interpret.py", "test_readme.py", "test_demo_model.py", "test_soak.py")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.path.name not in LONG_FILES)  # stable: the rest keep order


def pytest_addoption(parser):
    parser.addoption(
        "--gpu-format",
        default="mixed",
        choices=sorted(FORMATS),
        help="the 9B checkpoint tests/test_gpu.py checks its invariants on",
    )
    parser.addoption(
        "--gdn-form",
        default="recurrence",
        choices=("recurrence", "chunk", "grid", "rows"),
        help="the gated delta rule's exact form tests/test_gpu.py's 9B engines run",
    )


@pytest.fixture(scope="module")
def nine_b(tmp_path_factory, request):
    """The 9B shape with random weights on the GPU, in --gpu-format (mixed 4/6-bit unless asked)."""
    import torch

    from tensorfold.models.loader import load_model
    from tensorfold.tools.make_random import make_random

    fmt = request.config.getoption("--gpu-format")
    out = tmp_path_factory.mktemp("ckpt") / f"9b-{fmt}"
    path = make_random(out, "9b", FORMATS[fmt], device="cuda")
    return load_model(path, dtype=torch.bfloat16, device="cuda")


@pytest.fixture(scope="session")
def checkpoint_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="session")
def tokenizer_dir(checkpoint_root: Path) -> Path:
    out = checkpoint_root / "tokenizer"
    build_tokenizer(out)
    return out


@pytest.fixture(scope="session")
def hf_tiny(checkpoint_root: Path, tokenizer_dir: Path) -> Path:
    return _hf("hf_tiny", checkpoint_root, tokenizer_dir)


@pytest.fixture(scope="session")
def hf_tiny_nested(checkpoint_root: Path, tokenizer_dir: Path) -> Path:
    return _hf("hf_tiny_nested", checkpoint_root, tokenizer_dir)


@pytest.fixture(scope="session")
def hf_tiny_b(checkpoint_root: Path, tokenizer_dir: Path) -> Path:
    return _hf("hf_tiny_b", checkpoint_root, tokenizer_dir)


@pytest.fixture(scope="session")
def hf_tiny_c(checkpoint_root: Path, tokenizer_dir: Path) -> Path:
    return _hf("hf_tiny_c", checkpoint_root, tokenizer_dir)


@pytest.fixture(scope="session")
def hf_uneven(checkpoint_root: Path, tokenizer_dir: Path) -> Path:
    return _hf("hf_uneven", checkpoint_root, tokenizer_dir)


@pytest.fixture(scope="session")
def mlx_q4(checkpoint_root: Path, hf_tiny_b: Path) -> Path:
    return _mlx("mlx_q4", checkpoint_root, hf_tiny_b)


@pytest.fixture(scope="session")
def mlx_q8_g32(checkpoint_root: Path, hf_tiny: Path) -> Path:
    return _mlx("mlx_q8_g32", checkpoint_root, hf_tiny)


@pytest.fixture(scope="session")
def mlx_mixed(checkpoint_root: Path, hf_tiny_c: Path) -> Path:
    return _mlx("mlx_mixed", checkpoint_root, hf_tiny_c)


@pytest.fixture(scope="session")
def hf_moe(checkpoint_root: Path, tokenizer_dir: Path) -> Path:
    """A tiny Qwen3.5 MoE (16 experts, top-4, a gated shared expert) as transformers saves it:
    experts one by one."""
    from fixtures.moe_build import build_hf_moe

    return build_hf_moe(checkpoint_root / "hf_moe", tokenizer_dir)


@pytest.fixture(scope="session")
def hf_moe_fused(checkpoint_root: Path, hf_moe: Path) -> Path:
    """The same weights with the experts fused, as the released files store them."""
    from fixtures.moe_build import fuse_experts

    return fuse_experts(hf_moe, checkpoint_root / "hf_moe_fused")


@pytest.fixture(scope="session")
def hf_moe_ties(checkpoint_root: Path, hf_moe_fused: Path) -> Path:
    """hf_moe_fused with router rows equal in runs of three experts: exact routing ties."""
    from fixtures.moe_build import tie_routers

    return tie_routers(hf_moe_fused, checkpoint_root / "hf_moe_ties")


@pytest.fixture(scope="session")
def mlx_moe_q4(checkpoint_root: Path, hf_moe_fused: Path) -> Path:
    """mlx_lm 4-bit g64 of hf_moe_fused (switch_mlp stacks; router and shared gate at 8 bits)."""
    _require_mlx()
    from fixtures.moe_build import build_mlx_moe

    return build_mlx_moe(hf_moe_fused, checkpoint_root / "mlx_moe_q4")


@pytest.fixture(scope="session")
def mlx_moe_mixed(checkpoint_root: Path, hf_moe_fused: Path) -> Path:
    """mlx_lm mixed bits of hf_moe_fused (experts' gate 4, up 3, down 6 bits; router at 8)."""
    _require_mlx()
    from fixtures.moe_build import build_mlx_moe

    return build_mlx_moe(hf_moe_fused, checkpoint_root / "mlx_moe_mixed", mixed=True)


@pytest.fixture(scope="module")
def live(hf_tiny):
    """A live server on 127.0.0.1 over the tiny checkpoint, one per test module."""
    from server_harness import make_engine, start_server  # FastAPI is imported only when needed

    server = start_server(make_engine(hf_tiny))
    yield server
    server.stop()
