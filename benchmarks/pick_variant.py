"""The fastest prompt launch variant in an attention_depth.py log, as h200.py's --attention value."""

import json
import sys

from attention_depth import PROMPT_VARIANTS


def main() -> None:
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
    keys = int(sys.argv[2]) if len(sys.argv) > 2 else 32768
    variants = dict(PROMPT_VARIANTS)
    timed = [
        r
        for r in rows
        if r["what"] == f"prompt 4096 at {keys}" and "us" in r and r["variant"] in variants
    ]
    values = variants[min(timed, key=lambda r: r["us"])["variant"]]
    print(",".join(f"{k}={int(v)}" for k, v in values.items()))


if __name__ == "__main__":
    main()
