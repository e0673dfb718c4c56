"""Export a checkpoint or recipe, dense or MoE, to a Hugging Face folder that transformers loads.

    python -m tools.export_hf --checkpoint runs/llama-tiny --out exports/llama-tiny
    python -m tools.export_hf --recipe recipes/dense/tiny.yaml --out /tmp/gpt2-tiny model.n_layers=2
    python -m tools.export_hf --checkpoint runs/<token-shard run> --tokenizer gpt2/tokenizer.json --out exports/x

The family is chosen from the architecture (``archlab.hf``). Dense: GPT-3-style models become
``GPT2LMHeadModel``, LLaMA-style ones ``LlamaForCausalLM``, sliding-window ones ``MistralForCausalLM``,
BERT-style encoders ``BertForMaskedLM``, T5-style encoder-decoders ``T5ForConditionalGeneration``. MoE:
Mixtral-style ``MixtralForCausalLM``, with q/k norm or dense layers ``Qwen3MoeForCausalLM``, DeepSeek-style
(shared experts, MLA, sigmoid router) ``DeepseekV3ForCausalLM``. Multi-token-prediction modules are dropped. A model no
HF class can express (ALiBi, post-LN, NTK RoPE, ...) is refused with the reason. ``--verify`` reloads the
folder with ``transformers`` and checks that its logits equal archlab's on random tokens.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from archlab.config import RecipeError
from archlab.hf import ADAPTERS, export_hf, find_adapter
from tools.export_verify import verify
from tools.sample import add_model_args, load_codec, load_model, recipe_eot_id


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.export_hf", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--out", type=Path, required=True, help="output folder (must not exist unless --force)")
    p.add_argument("--force", action="store_true", help="replace an existing output folder")
    p.add_argument("--verify", action="store_true", help="reload with transformers and compare logits")
    return p.parse_args(argv)


def family_refusal(cfg, model_cfg) -> Optional[str]:
    """One line for a recipe whose family has an exporter that refuses it: the exporter's reason and the family's
    recipes that export (e.g. deepseek tiny..s: grouped-query attention; recipes/deepseek/v3-tiny.yaml: MLA)."""
    family = cfg.get("family") if hasattr(cfg, "get") else None
    for name in ADAPTERS.names():
        exporter = ADAPTERS.get(name)()
        if family is None or getattr(exporter, "recipe_family", None) != family:
            continue
        why = exporter.matches(model_cfg)
        if why is None:
            return None
        ok = getattr(exporter, "exportable_recipes", ())
        hint = (f"; the exportable {family} recipes: {', '.join(ok)} (train one, e.g. python -m archlab.train "
                f"{ok[0]}, and export its run)") if ok else ""
        return f"{cfg.get('name', 'this model')} cannot be exported as {exporter.hf_class_name}: {why}{hint}"
    return None


def export(args: argparse.Namespace) -> str:
    model, cfg, tok_file = load_model(args)
    try:
        find_adapter(model.cfg)
    except ValueError:
        refusal = family_refusal(cfg, model.cfg)
        if refusal is None:
            raise
        raise ValueError(refusal) from None
    eos_id = None
    if tok_file is not None:  # the run's tokenizer.json, or --tokenizer
        eos_id = load_codec(tok_file, recipe_eot_id(cfg)).eos_id
    out = export_hf(model, args.out, tokenizer_file=tok_file, eos_id=eos_id, overwrite=args.force)
    msg = f"wrote {out}: {cfg.get('name', 'model')} as {find_adapter(model.cfg).hf_class_name}"
    if args.verify:
        msg += f"; verified: max |logit diff| = {verify(model, out):.2e}"
    return msg


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        print(export(args))
    except (RecipeError, ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except AssertionError as e:  # --verify found different logits: a bug, not a user mistake
        print(f"verification failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
