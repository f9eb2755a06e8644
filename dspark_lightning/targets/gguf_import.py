"""Bring your own target: a GGUF file turned into a Hugging Face model directory, offline.

    dspark-lightning target import --gguf gemma-3-270m-q4_k_m.gguf --out targets/gemma3-270m
    data: {target: targets/gemma3-270m}          # then any recipe, decode() or export uses it

transformers reads the GGUF (its architectures: Llama, Qwen2/3, Gemma 2/3, Mistral, Phi-3, ...), dequantises the
weights and converts the tokenizer; the result is saved as fp32 safetensors with its tokenizer (and, for a
SentencePiece GGUF, its ``tokenizer.model``), generation config and a ``dspark_import.json`` naming the source file
and its sha256. Dequantised weights are the quantised model's own
values, so the imported target decodes as the GGUF does up to the kernels' rounding.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import torch

from ..checks import UsageError

log = logging.getLogger(__name__)

IMPORT_RECORD = "dspark_import.json"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _check_gguf(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} not found")
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise UsageError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")


def load_gguf(path: Path, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """The dequantised HF model and its tokenizer read from one GGUF file (slow: minutes for large vocabularies)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _check_gguf(path)
    d, f = str(path.parent), path.name
    try:
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=dtype)
    except (ValueError, KeyError, NotImplementedError) as exc:
        msg = " ".join(str(exc).split())[:300]
        raise UsageError(f"transformers cannot read {path} as a causal LM ({type(exc).__name__}: {msg})") from None
    return model, tok


def write_hf_dir(model: Any, tok: Any, out: Path, record: dict[str, Any] | None = None) -> None:
    """Save a (GGUF-loaded) model as a plain fp32 HF directory: no quantization config, its tokenizer, a record."""
    from transformers import AutoModelForCausalLM

    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    plain.save_pretrained(out)
    tok.save_pretrained(out)
    if record is not None:
        (out / IMPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")


def write_sentencepiece(gguf: Path, out: Path) -> bool:
    """Write ``tokenizer.model`` (a SentencePiece model) from a GGUF whose tokenizer is SentencePiece (``llama``:
    Gemma, Llama 2, Mistral): its pieces, scores and types, as the GGUF stores them. Tools that read a model's
    vocabulary from ``tokenizer.model`` (llama.cpp's converter) then take the imported directory as they would the
    original; transformers keeps using ``tokenizer.json``. Returns whether a file was written (False: a BPE GGUF)."""
    from gguf import GGUFReader
    from sentencepiece import sentencepiece_model_pb2 as spm

    fields = GGUFReader(str(gguf)).fields

    def value(key: str, default: Any = None) -> Any:
        f = fields.get(key)
        if f is None or not f.data:
            return default
        part = f.parts[f.data[0]]
        return bytes(part).decode() if f.types[0].name == "STRING" else part.tolist()[0]

    if value("tokenizer.ggml.model") != "llama":
        return False
    tokens, scores, types = (fields[f"tokenizer.ggml.{k}"] for k in ("tokens", "scores", "token_type"))
    m = spm.ModelProto()
    for i in range(len(tokens.data)):
        p = m.pieces.add()
        p.piece = bytes(tokens.parts[tokens.data[i]]).decode("utf-8", errors="replace")
        p.score = float(scores.parts[scores.data[i]][0])
        p.type = int(types.parts[types.data[i]][0])  # GGUF's token types are SentencePiece's numbering
    t = m.trainer_spec
    t.model_type = spm.TrainerSpec.BPE
    t.vocab_size = len(tokens.data)
    t.byte_fallback = any(p.type == 6 for p in m.pieces)
    t.unk_id, t.bos_id = value("tokenizer.ggml.unknown_token_id", 0), value("tokenizer.ggml.bos_token_id", 1)
    t.eos_id, t.pad_id = value("tokenizer.ggml.eos_token_id", 2), value("tokenizer.ggml.padding_token_id", -1)
    n = m.normalizer_spec
    n.name, n.add_dummy_prefix = "identity", bool(value("tokenizer.ggml.add_space_prefix", True))
    n.remove_extra_whitespaces, n.escape_whitespaces = False, True
    (out / "tokenizer.model").write_bytes(m.SerializeToString())
    return True


def import_gguf(gguf: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """Write the HF model directory of ``gguf`` into ``out``. Returns ``out``.

    An existing ``out`` made from the same file (same sha256) is kept; another one needs ``overwrite``. The folder is
    built beside ``out`` and swapped in (:func:`~dspark_lightning.atomic.atomic_dir`: fsync'd, and a full disk, an
    error or a kill leaves the previous folder as it was)."""
    from ..atomic import atomic_dir

    src, final = Path(gguf).expanduser(), Path(out).expanduser()
    _check_gguf(src)
    digest = sha256_file(src)
    rec_file = final / IMPORT_RECORD
    if final.exists() and any(final.iterdir()):
        same = rec_file.is_file() and json.loads(rec_file.read_text()).get("sha256") == digest
        if same and (final / "config.json").is_file():
            return final
        if not overwrite:
            raise FileExistsError(f"{final} exists (not an import of {src.name}); pass --overwrite to replace it")
    log.warning("importing %s into %s (one time: dequantising the weights, converting the tokenizer)", src, final)
    model, tok = load_gguf(src)
    with atomic_dir(final, tag="import", what="target import") as tmp:
        write_hf_dir(model, tok, tmp, {"gguf": src.name, "sha256": digest, "architecture": model.config.model_type})
        write_sentencepiece(src, tmp)
    return final
