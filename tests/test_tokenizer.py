"""The reply text's decoding: the tokenizer's backend gives the wrapper's text exactly (random ids,
special tokens and broken UTF-8 sequences included), and a tokenizer whose wrapper cleans up
spaces keeps the wrapper."""

import json
import random
import shutil
from pathlib import Path

from tensorfold.tokenizer import Tokenizer

DEMO = Path(__file__).resolve().parents[1] / "src" / "tensorfold" / "demo" / "bf16"


def test_backend_decode_equals_the_wrappers():
    tok = Tokenizer(DEMO)
    assert tok._backend is not None  # the demo's tokenizer takes the fast path
    rng = random.Random(0)
    specials = list(tok.hf.all_special_ids)
    for _ in range(300):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(0, 12))]
        ids += rng.sample(specials, min(2, len(specials)))
        rng.shuffle(ids)
        for skip in (True, False):
            assert tok.decode(ids, skip) == tok.hf.decode(ids, skip_special_tokens=skip), ids


def test_a_tokenizer_that_cleans_up_spaces_keeps_the_wrapper(tmp_path):
    path = tmp_path / "tok"
    shutil.copytree(DEMO, path, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["clean_up_tokenization_spaces"] = True
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer(path)
    assert tok._backend is None
    ids = tok.encode("Hello , world !")
    assert tok.decode(ids) == tok.hf.decode(ids, skip_special_tokens=True)
