"""``python -m archlab.data RECIPE [key=value ...]``: prepare (or find) a recipe's data cache (or check
its token shards) and print what it holds. Bad input prints one line and exits 2."""

from __future__ import annotations

import argparse
import sys
import time

from archlab.config import load_recipe
from archlab.data.batches import unigram_entropy
from archlab.errors import RecipeError
from archlab.objectives import token_data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m archlab.data", description=__doc__.splitlines()[0])
    parser.add_argument("recipe", help="recipe YAML file, e.g. recipes/dense/tiny.yaml")
    parser.add_argument("overrides", nargs="*", help="dotlist overrides, e.g. data.max_bytes=200000")
    args = parser.parse_args(argv)
    try:
        cfg = load_recipe(args.recipe, args.overrides)
        t0 = time.perf_counter()
        data = token_data(cfg)
        seconds = time.perf_counter() - t0
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    m = data.meta
    print(f"corpus     {m['corpus']}")
    where = "shards" if m.get("format") == "tokens" else "cache"
    print(f"{where:<10} {data.cache_path}  (ready in {seconds:.1f} s; built in {m['build_seconds']:.1f} s)")
    tok = m["tokenizer"]
    print(f"tokenizer  {tok['kind']}, vocab {tok['vocab_size']}, eos id {tok['eos_id']}")
    for split in ("train", "val"):
        if "bytes" not in m:  # token shards: no text, no bytes
            print(f"{split:<10} {m['n_files'][split]} shards, {m['tokens'][split]:,} tokens")
            continue
        print(f"{split:<10} {m['n_files'][split]} documents, {m['bytes'][split]:,} bytes, "
              f"{m['tokens'][split]:,} tokens ({m['bytes'][split] / m['tokens'][split]:.2f} bytes/token)")
    print(f"unigram entropy of train: {unigram_entropy(data.train):.3f} nats/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
