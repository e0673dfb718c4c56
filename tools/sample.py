"""Print a continuation of a prompt, from a recipe (random weights) or a trained checkpoint.

    python -m tools.sample --recipe recipes/llama/tiny.yaml --prompt "def " model.n_layers=2
    python -m tools.sample --checkpoint runs/llama-tiny --prompt "def " --temperature 0.8 --top-p 0.9

A bare recipe has no trained tokenizer: its prompt is encoded as UTF-8 bytes (ids 0-255) and the
continuation is random-init noise, which is still a useful smoke test of the whole path. A
checkpoint's run folder holds its tokenizer (``tokenizer.json``), and the text is real. A run on
token shards (``data.source=tokens``) keeps the tokenizer it was given or found beside the shards;
one trained without any needs ``--tokenizer PATH/tokenizer.json`` (the tokenizer the shards were made
with), which also replaces the run's own.
An encoder-decoder (T5, ``model.type: encoder_decoder``) fills spans: mark each with ``<extra_id_0>``,
``<extra_id_1>``, ...; the encoder reads the prompt, the decoder writes each span behind its sentinel, and the
prompt is printed with every mark replaced by ``[its span]``:

    python -m tools.sample --checkpoint runs/t5-tiny --prompt "def f(x): <extra_id_0> x" --temperature 0

A bad recipe, override or argument prints one line on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Optional, Protocol, Sequence

import torch

import archlab
from archlab.config import RecipeError
from archlab.data import Tokenizer
from archlab.data.tokenizer import BYTE_VOCAB_SIZE, byte_tokenizer
from archlab.model import generate_seq2seq
from archlab.nn.positions import position_class
from archlab.objectives.span_corruption import sentinel_ids
from archlab.train import checkpoint

SENTINEL = re.compile(r"<extra_id_(\d+)>")  # T5's span marks in a prompt
MAX_SENTINELS = 100  # ids from vocab_size - 2 - MAX_SENTINELS up are reserved (sentinels, start), never text


class TextCodec(Protocol):
    eos_id: Optional[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteCodec:
    """archlab's byte tokenizer (UTF-8 bytes as ids 0-255, 256 as end of text) for a recipe with no
    trained tokenizer. An untrained model emits ids beyond the bytes too (its vocabulary is the
    recipe's); ``decode`` shows them as ``<|id|>`` where the tokenizer would drop them."""

    def __init__(self):
        self._tokenizer = byte_tokenizer([], BYTE_VOCAB_SIZE)
        self.eos_id = self._tokenizer.eos_id

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text)

    def decode(self, ids: list[int]) -> str:
        parts, run = [], bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
                continue
            parts += [run.decode("utf-8", errors="replace"), f"<|{i}|>"]
            run = bytearray()
        return "".join(parts) + run.decode("utf-8", errors="replace")


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--recipe/--checkpoint and trailing ``key=value`` overrides, shared by the model tools."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--recipe", type=Path, help="recipe YAML (random-init weights)")
    src.add_argument("--checkpoint", type=Path, help="run folder (latest checkpoint) or checkpoint folder")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="tokenizer.json to use instead of the run folder's (e.g. for a run on token shards that "
                        "was trained without one)")
    p.add_argument("overrides", nargs="*", help="recipe overrides as OmegaConf dotlist, e.g. model.n_layers=4")


def load_model(args: argparse.Namespace):
    """(model, recipe cfg, tokenizer file or None) from --recipe or --checkpoint; ``--tokenizer``
    names the tokenizer file, else a checkpoint's run folder does."""
    given = getattr(args, "tokenizer", None)
    if given is not None and not given.is_file():
        raise ValueError(f"--tokenizer {given}: no such file")
    if args.recipe is not None:
        cfg = archlab.load_recipe(args.recipe, args.overrides)
        return archlab.build_model(cfg), cfg, given
    if args.overrides:
        raise ValueError("overrides apply to --recipe only; a checkpoint's architecture is fixed")
    if not args.checkpoint.exists():
        raise ValueError(f"checkpoint not found: {args.checkpoint}")
    model, cfg = checkpoint.load_model(args.checkpoint)  # the trainer's format
    return model, cfg, given if given is not None else find_tokenizer_file(args.checkpoint)


def find_tokenizer_file(path: Path) -> Optional[Path]:
    """The run's ``tokenizer.json``: in the given folder or up to two folders above it
    (run/checkpoints/step_N/ -> run/)."""
    for folder in [path, *list(path.resolve().parents)[:2]]:
        if (folder / "tokenizer.json").is_file():
            return folder / "tokenizer.json"
    return None


def load_codec(tokenizer_file: Optional[Path], eos_id: Optional[int] = None) -> TextCodec:
    """The tokenizer file's codec (end of text: ``eos_id``, else its ``<|endoftext|>`` if it has one),
    or the byte codec without a file."""
    if tokenizer_file is None:
        return ByteCodec()
    return Tokenizer.load(tokenizer_file, eos_id, require_eos=False)


def recipe_eot_id(cfg) -> Optional[int]:
    """``data.eot_id`` of a recipe (None when unset, or in a recipe of an older archlab)."""
    data = cfg.get("data") if hasattr(cfg, "get") else None
    return data.get("eot_id") if data is not None and hasattr(data, "get") else None


def check_codec_source(args: argparse.Namespace, cfg, tok_file: Optional[Path]) -> None:
    """A checkpoint trained on token shards without a tokenizer has no text codec: the byte codec would
    print noise for ids that are not bytes."""
    data = cfg.get("data") if hasattr(cfg, "get") else None
    if tok_file is None and args.checkpoint is not None and data is not None and data.get("source") == "tokens":
        raise ValueError(f"{args.checkpoint} was trained on token shards without a tokenizer file (no tokenizer.json "
                         "in its run folder): pass --tokenizer PATH/tokenizer.json, the tokenizer the shards were "
                         "made with")


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.sample", description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    p.add_argument("--max-new-tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus: smallest set with this mass (1 = off)")
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    if args.max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens={args.max_new_tokens}: must be >= 0")
    if args.temperature < 0:
        raise ValueError(f"--temperature={args.temperature}: must be >= 0 (0 = greedy)")
    if args.top_k < 0:
        raise ValueError(f"--top-k={args.top_k}: must be >= 0 (0 = off)")
    if not 0.0 < args.top_p <= 1.0:
        raise ValueError(f"--top-p={args.top_p}: must lie in (0, 1] (1 = off)")
    if args.num_samples < 1:
        raise ValueError(f"--num-samples={args.num_samples}: must be >= 1")


def encode_spans(codec: TextCodec, prompt: str, vocab_size: int) -> tuple[list[int], list[int]]:
    """(encoder ids, sentinel ids in prompt order) of a span-filling prompt: each ``<extra_id_N>`` becomes
    sentinel N (``vocab_size - 2 - N``), the text between the marks the codec's ids."""
    marks = list(SENTINEL.finditer(prompt))
    if not marks:
        raise ValueError("--prompt has no <extra_id_N> mark: an encoder-decoder (model.type=encoder_decoder) fills "
                         "spans, e.g. --prompt 'def f(x): <extra_id_0> x'")
    ids: list[int] = []
    sentinels: list[int] = []
    at = 0
    for mark in marks:
        n = int(mark.group(1))
        if n >= MAX_SENTINELS:
            raise ValueError(f"{mark.group(0)}: sentinels are numbered <extra_id_0> to <extra_id_{MAX_SENTINELS - 1}>")
        ids += codec.encode(prompt[at:mark.start()])
        sentinels.append(int(sentinel_ids(vocab_size, n + 1)[-1]))
        ids.append(sentinels[-1])
        at = mark.end()
    return ids + codec.encode(prompt[at:]), sentinels


def fill_spans(codec: TextCodec, prompt: str, out_ids: list[int], vocab_size: int) -> str:
    """The prompt with each ``<extra_id_N>`` replaced by ``[the decoder's ids behind sentinel N]``; the decoder's
    output ends at end of text or at a reserved id the prompt does not hold (another sentinel, the start id)."""
    marked = {int(sentinel_ids(vocab_size, int(m.group(1)) + 1)[-1]) for m in SENTINEL.finditer(prompt)}
    spans: dict[int, list[int]] = {}
    current = None
    for i in out_ids[1:]:  # out_ids[0]: the start id
        if i in marked:
            current = i
            spans[i] = []
        elif (codec.eos_id is not None and i == codec.eos_id) or i >= vocab_size - 2 - MAX_SENTINELS:
            break
        elif current is not None:
            spans[current].append(i)
    return SENTINEL.sub(lambda m: "[" + codec.decode(spans.get(vocab_size - 2 - int(m.group(1)), [])) + "]", prompt)


def sample_spans(args: argparse.Namespace, model, cfg, codec: TextCodec) -> list[str]:
    """An encoder-decoder's span filling: the prompt with each ``<extra_id_N>`` replaced by ``[its span]``."""
    V = cfg.model.vocab_size
    ids, _ = encode_spans(codec, args.prompt, V)
    too_big = [i for i in ids if i >= V]
    if too_big:
        raise ValueError(f"prompt token ids {too_big[:5]} are outside model.vocab_size={V}")
    limit = position_class(cfg.model).max_length(cfg.model)
    if limit is not None and max(len(ids), args.max_new_tokens) > limit:
        raise ValueError(f"prompt ({len(ids)} tokens) or --max-new-tokens={args.max_new_tokens} exceeds the "
                         f"{cfg.model.position.type} positions (up to model.max_seq_len={limit}); shorten it")
    gen = torch.Generator().manual_seed(args.seed)
    out = generate_seq2seq(model, torch.tensor([ids] * args.num_samples), args.max_new_tokens,
                           temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                           eos_id=codec.eos_id, generator=gen)
    return [fill_spans(codec, args.prompt, row, V) for row in out.tolist()]


def sample(args: argparse.Namespace) -> list[str]:
    """The continuations (prompt excluded), one per sample; an encoder-decoder's: the prompt with its spans
    filled."""
    return _sample(args)[0]


def _sample(args: argparse.Namespace) -> tuple[list[str], bool]:
    """(the texts, whether each is the whole prompt with its spans filled rather than a continuation)."""
    check_args(args)
    torch.manual_seed(args.seed)
    model, cfg, tok_file = load_model(args)
    check_codec_source(args, cfg, tok_file)
    codec = load_codec(tok_file, recipe_eot_id(cfg))
    if cfg.model.get("type") == "encoder_decoder":
        return sample_spans(args, model, cfg, codec), True
    prompt = codec.encode(args.prompt)
    if not prompt:
        raise ValueError("--prompt encodes to no tokens; give at least one character")
    too_big = [i for i in prompt if i >= cfg.model.vocab_size]
    if too_big:
        raise ValueError(f"prompt token ids {too_big[:5]} are outside model.vocab_size={cfg.model.vocab_size}")
    limit = position_class(cfg.model).max_length(cfg.model)  # learned positions: the table size
    if limit is not None and len(prompt) + args.max_new_tokens - 1 > limit:  # the last token is never fed back
        raise ValueError(f"prompt ({len(prompt)} tokens) + --max-new-tokens={args.max_new_tokens} exceeds the "
                         f"{cfg.model.position.type} positions (up to model.max_seq_len={limit}); "
                         "lower --max-new-tokens")
    ids = torch.tensor([prompt] * args.num_samples)  # (B, S)
    gen = torch.Generator().manual_seed(args.seed)
    out = archlab.generate(model, ids, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                           top_p=args.top_p, eos_id=codec.eos_id, generator=gen)
    texts = []
    for row in out[:, len(prompt):].tolist():
        if codec.eos_id is not None and codec.eos_id in row:
            row = row[: row.index(codec.eos_id)]
        texts.append(codec.decode(row))
    return texts, False


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        texts, filled = _sample(args)
    except (RecipeError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for i, text in enumerate(texts):
        if len(texts) > 1:
            print(f"--- sample {i}")
        print(text if filled else args.prompt + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
