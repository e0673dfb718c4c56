"""Import a local Hugging Face model folder as an archlab run folder that every tool reads.

    python -m tools.import_hf ~/gpt2 --out runs/gpt2
    python -m tools.import_hf ~/gpt2 --out runs/gpt2 --force      # replace runs/gpt2

FOLDER holds config.json, the weights as *.safetensors and, when there is one, tokenizer.json (e.g. a folder
from ``huggingface-cli download gpt2``); nothing is downloaded. The family is config.json's ``model_type``
(``archlab.hf.adapters``: gpt2, gptj, gpt_neox, llama, mistral, mixtral, qwen3_moe, deepseek_v3, bert, t5;
olmoe is refused with the reason). A config key archlab cannot express is refused by name (``hidden_act``,
``rope_parameters.rope_type``, ...). The run folder (docs/run-folder.md) is written beside --out and renamed
into place; then ``python -m tools.sample --checkpoint runs/gpt2``, ``python -m tools.explore runs/gpt2``,
``train.init_from=runs/gpt2`` or ``python -m tools.export_hf --checkpoint runs/gpt2`` read it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from archlab.config import RecipeError
from archlab.hf import from_hf
from archlab.train.checkpoint import load_recipe_of, resolve_checkpoint


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.import_hf", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="a Hugging Face model folder (config.json, *.safetensors)")
    p.add_argument("--out", type=Path, required=True, help="the run folder to write (must not exist unless --force)")
    p.add_argument("--force", action="store_true", help="replace an existing run folder")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        run = from_hf(args.folder, args.out, force=args.force)
    except (RecipeError, ValueError, FileExistsError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cfg = load_recipe_of(resolve_checkpoint(run))
    m = cfg.model
    tokenizer = "tokenizer.json" if (run / "tokenizer.json").is_file() else "no tokenizer"
    print(f"wrote {run}: {m.type}, {m.n_layers} layers, d_model {m.d_model}, vocab {m.vocab_size}, {tokenizer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
