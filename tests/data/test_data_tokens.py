"""``data.source: tokens``: llm.c / modded-nanogpt shards, nanoGPT's raw ``train.bin`` and archlab cache
folders, read as memory maps; every refusal names the file; a tiny training run, sampling and the
Hugging Face export on shards."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

import archlab
from archlab.config import RecipeError
from archlab.data import DataError, ShardedTokens, TokenBatches, eval_windows, prepare_data, unigram_entropy
from archlab.data.shards import LLMC_HEADER_BYTES, open_shard
from archlab.data.tokens import NoTokenizer, count_ids

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "recipes/llama/tiny.yaml"
DENSE = ROOT / "recipes/dense/tiny.yaml"
SEQ = 16


def write_llmc(path: Path, ids, magic: int = 20240520, version: int = 1, count=None, dtype=np.uint16) -> Path:
    """An llm.c shard: 256 int32 header (magic, version, token count), then the ids."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = magic, version, len(ids) if count is None else count
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header.tobytes() + np.asarray(ids, dtype=dtype).tobytes())
    return path


def write_raw(path: Path, ids, dtype=np.uint16) -> Path:
    """A nanoGPT file: raw ids, no header."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(np.asarray(ids, dtype=dtype).tobytes())
    return path


def tokens_recipe(tmp_path: Path, *overrides: str, base: Path = LLAMA):
    return archlab.load_recipe(base, ["data.source=tokens", f"data.cache_dir={tmp_path / 'cache'}",
                                      "model.vocab_size=512", f"train.seq_len={SEQ}", *overrides])


@pytest.fixture
def llmc(tmp_path):
    """Three training shards (one shorter than a window, so windows span shards) and one validation
    shard: (folder, the training ids concatenated, the validation ids)."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "fineweb10B"
    train = [rng.integers(0, 500, n) for n in (700, 9, 900)]
    for i, ids in enumerate(train):
        write_llmc(folder / f"fineweb_train_{i + 1:06d}.bin", ids)
    val = rng.integers(0, 500, 300)
    write_llmc(folder / "fineweb_val_000000.bin", val)
    return folder, np.concatenate(train), val


def llmc_overrides(folder: Path) -> list[str]:
    return [f"data.train_shards={folder}/fineweb_train_*.bin", f"data.val_shards={folder}/fineweb_val_*.bin"]


# ----------------------------------------------------------------------------- reading the formats


def test_llmc_windows_are_slices_of_the_concatenated_files(tmp_path, llmc):
    folder, train, val = llmc
    data = prepare_data(tokens_recipe(tmp_path, *llmc_overrides(folder)))
    assert isinstance(data.train, ShardedTokens) and len(data.train) == len(train) and len(data.val) == len(val)
    assert all(isinstance(a, np.memmap) for a in data.train.arrays)  # read in place, not copied
    assert data.meta["shard_format"] == "llmc" and data.meta["n_files"] == {"train": 3, "val": 1}
    assert [Path(r["path"]).name for r in data.meta["shards"]["train"]] == [
        "fineweb_train_000001.bin", "fineweb_train_000002.bin", "fineweb_train_000003.bin"]  # sorted by name
    batches = TokenBatches(data.train, SEQ, 4, 2, seed=3)
    for step in range(20):
        for micro in range(2):
            x = batches.get(step, micro).numpy()
            for row, start in zip(x, batches.starts(step, micro)):
                assert (row == train[start:start + SEQ + 1]).all()
    spanning = np.arange(695, 712)  # shard 1 ends at 700, shard 2 (9 ids) at 709
    assert (data.train[spanning] == train[spanning]).all()
    for w in eval_windows(data.val, SEQ, 2, 3):
        for row in w.numpy():
            assert any((row == val[s:s + SEQ + 1]).all() for s in range(len(val) - SEQ))
    assert unigram_entropy(data.train) == pytest.approx(unigram_entropy(train), abs=1e-12)
    assert isinstance(data.tokenizer, NoTokenizer) and data.tokenizer.eos_id is None


def test_llmc_llama3_shards_hold_uint32_ids(tmp_path):
    ids = np.array([0, 70000, 128255, 5, 9] * 10)
    write_llmc(tmp_path / "s" / "train_0.bin", ids, magic=20240801, version=7, dtype=np.uint32)
    write_llmc(tmp_path / "s" / "val_0.bin", ids[::-1], magic=20240801, version=7, dtype=np.uint32)
    data = prepare_data(tokens_recipe(tmp_path, f"data.train_shards={tmp_path}/s/train_*.bin",
                                      f"data.val_shards={tmp_path}/s/val_*.bin", "model.vocab_size=128256"))
    assert data.train.dtype == np.uint32 and (data.train[np.arange(len(ids))] == ids).all()
    assert data.meta["shards"]["train"][0]["max_id"] == 128255


def test_nanogpt_folder_with_meta_pkl(tmp_path):
    folder = tmp_path / "shakespeare_char"
    rng = np.random.default_rng(1)
    train, val = rng.integers(0, 65, 1000), rng.integers(0, 65, 200)
    write_raw(folder / "train.bin", train)
    write_raw(folder / "val.bin", val)
    chars = [chr(32 + i) for i in range(65)]
    with open(folder / "meta.pkl", "wb") as f:  # what nanoGPT's data/shakespeare_char/prepare.py writes
        pickle.dump({"vocab_size": 65, "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}, f)
    data = prepare_data(tokens_recipe(tmp_path, f"data.train_shards={folder}", "model.vocab_size=65"))
    assert data.meta["shard_format"] == "nanogpt" and data.meta["vocab_limit"]["size"] == 65
    assert (np.asarray(data.train) == train).all() and (np.asarray(data.val) == val).all()
    padded = prepare_data(tokens_recipe(tmp_path, f"data.train_shards={folder}", "model.vocab_size=128"))
    assert padded.meta["vocab_limit"] == {"size": 65, "from": f"vocab_size in {folder / 'meta.pkl'}"}
    with pytest.raises(DataError, match=rf"model.vocab_size=64 is smaller than vocab_size in {folder}/meta.pkl"):
        prepare_data(tokens_recipe(tmp_path, f"data.train_shards={folder}", "model.vocab_size=64"))
    write_raw(folder / "val.bin", [*val, 70])  # an id the sidecar's vocabulary does not have
    with pytest.raises(DataError, match=rf"{folder}/val.bin: token id 70 >= 65 \(vocab_size in .*meta.pkl\)"):
        prepare_data(tokens_recipe(tmp_path, f"data.train_shards={folder}", "model.vocab_size=128"))


class _Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_a_meta_pkl_with_code_is_refused_without_running_it(tmp_path):
    folder = tmp_path / "d"
    write_raw(folder / "train.bin", range(100))
    write_raw(folder / "val.bin", range(100))
    marker = tmp_path / "ran"
    (folder / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": _Payload(str(marker))}))
    with pytest.raises(DataError, match=r"meta.pkl: not a plain nanoGPT meta.pkl .*refusing to load pathlib"):
        prepare_data(tokens_recipe(tmp_path, f"data.train_shards={folder}"))
    assert not marker.exists()


def test_an_archlab_cache_folder_is_a_source(tmp_path, text_recipe):
    built = prepare_data(text_recipe())  # a text corpus tokenised by a BPE trained here
    data = prepare_data(tokens_recipe(tmp_path, f"data.train_shards={built.cache_path}", "model.vocab_size=320"))
    assert data.meta["shard_format"] == "archlab"
    assert (np.asarray(data.train) == np.asarray(built.train)).all()
    assert (np.asarray(data.val) == np.asarray(built.val)).all()
    # the tokenizer beside the shards (data.tokenizer=bpe) and the end of text from its meta.json
    assert data.tokenizer.eos_id == built.tokenizer.eos_id and data.tokenizer.vocab_size == 320
    assert data.tokenizer.encode("def f(x):") == built.tokenizer.encode("def f(x):")
    assert unigram_entropy(data.train) == pytest.approx(unigram_entropy(built.train), abs=1e-12)
    by_file = prepare_data(tokens_recipe(tmp_path, f"data.train_shards={built.cache_path}/train.bin",
                                         f"data.val_shards={built.cache_path}/val.bin", "model.vocab_size=320",
                                         "data.shard_format=archlab"))
    assert len(by_file.train) == len(built.train)
    with pytest.raises(DataError, match=r"model.vocab_size=300 is smaller than the tokenizer's vocabulary"):
        prepare_data(tokens_recipe(tmp_path, f"data.train_shards={built.cache_path}", "model.vocab_size=300"))
    meta = json.loads((built.cache_path / "meta.json").read_text())
    meta["tokens"]["train"] += 1
    (built.cache_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=rf"{built.cache_path}/train.bin: .*meta.json says .* an incomplete cache"):
        prepare_data(tokens_recipe(tmp_path, f"data.train_shards={built.cache_path}", "model.vocab_size=320"))


# ----------------------------------------------------------------------------- refusals name the file


@pytest.mark.parametrize("case,message", [
    ("magic", r"bad magic 12345 in the llm.c header \(expected 20240520 .*data.shard_format=nanogpt"),
    ("version", r"unsupported llm.c header version 2: magic 20240520 .* is read as version 1 \(uint16 ids\)"),
    ("count", r"the header says 305 tokens \(1634 bytes with the header\) but the file holds 1624 bytes: a "
              r"truncated or damaged shard"),
    ("short", r"100 bytes, shorter than the 1024-byte llm.c header"),
    ("id", r"token id 600 >= 512 \(model.vocab_size=512\): the shard was tokenised with a larger vocabulary"),
    ("empty", r"an empty file holds no tokens"),
])
def test_a_bad_llmc_shard_is_refused_naming_the_file(tmp_path, llmc, case, message):
    folder, _, val = llmc
    bad = folder / "fineweb_val_000000.bin"
    if case == "magic":
        write_llmc(bad, val, magic=12345)
    elif case == "version":
        write_llmc(bad, val, version=2)
    elif case == "count":
        write_llmc(bad, val, count=len(val) + 5)
    elif case == "short":
        bad.write_bytes(b"\0" * 100)
    elif case == "id":
        write_llmc(bad, [*val, 600])
    else:
        bad.write_bytes(b"")
    with pytest.raises(DataError, match=rf"^{bad}: {message}"):
        prepare_data(tokens_recipe(tmp_path, *llmc_overrides(folder), "data.shard_format=llmc"))


def test_auto_detection_refuses_a_mix_of_formats(tmp_path, llmc):
    """A shard whose magic is damaged reads as raw ids under auto: it differs from its siblings."""
    folder, _, val = llmc
    write_llmc(folder / "fineweb_train_000002.bin", val, magic=12345)
    with pytest.raises(DataError, match=r"the shards are of different formats \(.* is llmc; .*fineweb_train_000002"
                                        r".bin is nanogpt\): set data.shard_format"):
        prepare_data(tokens_recipe(tmp_path, *llmc_overrides(folder)))


def test_a_version_error_under_auto_still_names_the_file(tmp_path, llmc):
    folder, _, val = llmc
    bad = write_llmc(folder / "fineweb_train_000003.bin", val, version=3)
    with pytest.raises(DataError, match=rf"^{bad}: unsupported llm.c header version 3"):
        prepare_data(tokens_recipe(tmp_path, *llmc_overrides(folder)))


def test_the_id_counts_are_cached_by_size_and_mtime(tmp_path, llmc):
    folder, train, _ = llmc
    cfg = tokens_recipe(tmp_path, *llmc_overrides(folder))
    assert prepare_data(cfg).meta["id_counts"]["counted_now"] == 4
    again = prepare_data(cfg)
    assert again.meta["id_counts"] == {"cache": str(tmp_path / "cache" / "token-counts"), "counted_now": 0,
                                       "cached": 4}
    assert unigram_entropy(again.train) == pytest.approx(unigram_entropy(train), abs=1e-12)
    shard = folder / "fineweb_train_000001.bin"
    ids = train[:700].copy()
    ids[3] = 511  # same size: only the mtime tells
    write_llmc(shard, ids)
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert prepare_data(cfg).meta["shards"]["train"][0]["max_id"] == 511
    ids[4] = 512
    write_llmc(shard, ids)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 2 * 10**9))
    with pytest.raises(DataError, match=rf"^{shard}: token id 512 >= 512"):
        prepare_data(cfg)


def test_which_files(tmp_path, llmc):
    folder, _, _ = llmc
    with pytest.raises(DataError, match=r"data.train_shards='.*/nothing_\*.bin': the glob matches no file"):
        prepare_data(tokens_recipe(tmp_path, f"data.train_shards={folder}/nothing_*.bin"))
    with pytest.raises(DataError, match=r"data.val_shards is null and data.train_shards=.* is not a folder"):
        prepare_data(tokens_recipe(tmp_path, f"data.train_shards={folder}/fineweb_train_*.bin"))
    with pytest.raises(DataError, match=r"fineweb_train_000001.bin is both a training and a validation shard"):
        prepare_data(tokens_recipe(tmp_path, f"data.train_shards={folder}/fineweb_train_*.bin",
                                   f"data.val_shards={folder}/fineweb_train_000001.bin"))
    with pytest.raises(DataError, match=r"data.train_shards='.*fineweb10B': the folder holds no train.bin; give a "
                                        r"glob of its shards"):
        prepare_data(tokens_recipe(tmp_path, f"data.train_shards={folder}"))


def test_end_of_text_and_vocabulary_from_a_json_sidecar(tmp_path, llmc):
    folder, _, _ = llmc
    (folder / "meta.json").write_text(json.dumps({"vocab_size": 500, "eot_id": 499}))
    data = prepare_data(tokens_recipe(tmp_path, *llmc_overrides(folder)))
    assert data.tokenizer.eos_id == 499 and data.meta["vocab_limit"]["size"] == 500
    assert data.meta["tokenizer"]["eos_from"] == str(folder / "meta.json")
    data = prepare_data(tokens_recipe(tmp_path, *llmc_overrides(folder), "data.eot_id=7"))
    assert data.tokenizer.eos_id == 7  # the recipe wins
    (folder / "meta.json").write_text(json.dumps({"vocab_size": 400}))
    with pytest.raises(DataError, match=r"token id 49\d >= 400 \(vocab_size in .*meta.json\)"):
        prepare_data(tokens_recipe(tmp_path, *llmc_overrides(folder)))


def test_shard_keys_belong_to_the_tokens_source():
    with pytest.raises(RecipeError, match=r"^data.train_shards='a/\*.bin': only used by data.source tokens; "
                                          r"this recipe's data source is stdlib$"):
        archlab.load_recipe(LLAMA, ["data.train_shards=a/*.bin"])
    with pytest.raises(RecipeError, match=r"^data.shard_format='llmc': only used by data.source tokens;"):
        archlab.load_recipe(LLAMA, ["data.shard_format=llmc"])
    tokens = ["data.source=tokens", "data.train_shards=a/*.bin"]
    with pytest.raises(RecipeError, match=r"^data.paths=\['x.txt'\]: only used by data.source text; "
                                          r"this recipe's data source is tokens$"):
        archlab.load_recipe(LLAMA, [*tokens, "data.paths=[x.txt]"])
    with pytest.raises(RecipeError,
                       match=r"^data.max_bytes=1000: only used by data.source hf, shakespeare, stdlib, text;"):
        archlab.load_recipe(LLAMA, [*tokens, "data.max_bytes=1000"])
    with pytest.raises(RecipeError, match=r"^data.train_shards=None: data.source=tokens needs a glob"):
        archlab.load_recipe(LLAMA, ["data.source=tokens"])
    with pytest.raises(RecipeError, match=r"^data.shard_format='bin': must be one of: auto, llmc, nanogpt, archlab"):
        archlab.load_recipe(LLAMA, [*tokens, "data.shard_format=bin"])
    cfg = archlab.load_recipe(LLAMA, [*tokens, "data.val_shards=b/*.bin", "data.shard_format=nanogpt",
                                      "data.eot_id=0", "model.vocab_size=65"])  # a char vocabulary: no BPE minimum
    assert cfg.data.shard_format == "nanogpt"


def test_sharded_tokens_indexes_like_the_concatenation():
    parts = [np.arange(0, 5, dtype=np.uint16), np.arange(5, 7, dtype=np.uint16), np.arange(7, 12, dtype=np.uint16)]
    cat = np.concatenate(parts)
    st = ShardedTokens(parts)
    assert len(st) == 12 and st.shape == (12,) and st.dtype == np.uint16
    assert [int(st[i]) for i in range(-12, 12)] == [int(cat[i]) for i in range(-12, 12)]
    for sl in (slice(0, 12), slice(3, 9), slice(5, 7), slice(6, 6), slice(-4, None), slice(1, 11, 3)):
        assert (st[sl] == cat[sl]).all(), sl
    idx = np.array([[0, 4, 5, 6], [11, 7, 2, -1]])
    assert (st[idx] == cat[idx]).all() and st[idx].shape == (2, 4)
    assert (np.asarray(st) == cat).all()
    with pytest.raises(IndexError):
        st[12]
    with pytest.raises(IndexError):
        st[np.array([3, 12])]
    assert (count_ids(cat, chunk=5) == np.bincount(cat)).all()


def test_open_shard_reads_the_header_offset(tmp_path):
    path = write_llmc(tmp_path / "a.bin", [7, 8, 9])
    shard = open_shard(path)
    assert (shard.format, shard.offset, shard.n_tokens) == ("llmc", LLMC_HEADER_BYTES, 3)
    assert shard.open().tolist() == [7, 8, 9]


# ----------------------------------------------------------------------------- training, sampling, export


def encode_documents(tokenizer_json: Path, n_docs: int = 12) -> np.ndarray:
    """Standard-library modules as GPT-2-style shard ids: <|endoftext|> before every document (as llm.c's
    fineweb.py writes them)."""
    import tokenizers

    from archlab.data.sources import stdlib_root

    tok = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    eot = tok.token_to_id("<|endoftext|>")
    names = sorted(p for p in stdlib_root().glob("*.py"))[:n_docs]
    ids = []
    for p in names:
        ids += [eot, *tok.encode(p.read_text()[:4000]).ids]
    return np.array(ids)


def train_tiny(tmp_path: Path, shards: Path, name: str, base: Path = DENSE):
    from archlab.train import train

    cfg = tokens_recipe(tmp_path, f"data.train_shards={shards}/fineweb_train_*.bin",
                        f"data.val_shards={shards}/fineweb_val_*.bin", "model.vocab_size=320", "model.d_model=32",
                        "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=64", "train.max_steps=3",
                        "train.warmup_steps=1", "train.micro_batch_size=2", "train.eval_every=3",
                        "train.eval_batches=1", "train.eval_context_multipliers=[1]", "train.ckpt_every=3",
                        "train.log_every=1", "train.tensorboard=false", f"train.out_dir={tmp_path / 'runs'}",
                        f"train.run_name={name}", base=base)
    summary = train(cfg)
    assert summary["status"] == "completed" and summary["step"] == 3
    return Path(summary["run_dir"]), summary


def test_train_sample_and_export_on_llmc_shards_with_a_tokenizer_beside_them(tmp_path, tokenizer_json):
    from transformers import AutoTokenizer

    from tools import export_hf, sample

    ids = encode_documents(tokenizer_json)
    shards = tmp_path / "fineweb10B"
    cut = len(ids) * 3 // 4
    write_llmc(shards / "fineweb_train_000001.bin", ids[:cut // 2])
    write_llmc(shards / "fineweb_train_000002.bin", ids[cut // 2:cut])
    write_llmc(shards / "fineweb_val_000000.bin", ids[cut:])
    shutil.copy(tokenizer_json, shards / "tokenizer.json")

    run, summary = train_tiny(tmp_path, shards, "with-tokenizer")
    assert (run / "tokenizer.json").read_bytes() == tokenizer_json.read_bytes()  # the run keeps a copy
    env = json.loads((run / "env.json").read_text())
    assert env["data_meta"]["tokenizer"]["eos_id"] == 299 and env["data_meta"]["vocab_limit"]["size"] == 300
    assert env["unigram_entropy_train"] == pytest.approx(unigram_entropy(ids[:cut]), abs=1e-9)
    assert summary["unigram_entropy_train"] == env["unigram_entropy_train"]

    texts = sample.sample(sample.parse_args(["--checkpoint", str(run), "--prompt", "def f(x):",
                                             "--max-new-tokens", "8", "--temperature", "0"]))
    assert len(texts) == 1 and isinstance(texts[0], str)

    out = tmp_path / "hf"
    assert export_hf.main(["--checkpoint", str(run), "--out", str(out), "--verify"]) == 0
    hf_tok = AutoTokenizer.from_pretrained(out)
    assert hf_tok("def f(x):").input_ids == archlab.data.load_tokenizer_file(tokenizer_json).encode("def f(x):")
    assert hf_tok.eos_token_id == 299


def test_train_without_a_tokenizer_then_sample_and_export_with_one(tmp_path, tokenizer_json, capsys):
    from transformers import AutoTokenizer

    from tools import export_hf, sample

    ids = encode_documents(tokenizer_json, n_docs=6)
    shards = tmp_path / "shards"
    write_llmc(shards / "fineweb_train_000001.bin", ids[:-300])
    write_llmc(shards / "fineweb_val_000000.bin", ids[-300:])
    run, _ = train_tiny(tmp_path, shards, "no-tokenizer", base=LLAMA)
    assert not (run / "tokenizer.json").exists()
    args = ["--checkpoint", str(run), "--prompt", "def", "--max-new-tokens", "4", "--temperature", "0"]
    assert sample.main(args) == 2
    assert "trained on token shards without a tokenizer file" in capsys.readouterr().err
    assert sample.main([*args, "--tokenizer", str(tokenizer_json)]) == 0
    assert capsys.readouterr().out.startswith("def")
    assert sample.main([*args, "--tokenizer", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err
    assert "--tokenizer" in err and "nope.json: no such file" in err
    out = tmp_path / "hf"
    assert export_hf.main(["--checkpoint", str(run), "--tokenizer", str(tokenizer_json), "--out", str(out)]) == 0
    assert AutoTokenizer.from_pretrained(out).eos_token_id == 299
