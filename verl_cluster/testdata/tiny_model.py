"""A randomly initialised Qwen2.5-shaped model folder (config, bf16 safetensors, tokenizer) for offline runs.

verl's trainer needs a real Hugging Face model folder; on a machine that cannot download one this writes
one: the architecture transformers/vLLM load as Qwen2ForCausalLM, weights drawn from normal(0, 0.02), and a
small byte-level BPE tokenizer trained here on synthetic word problems. The weights need numpy only (no
torch): bf16 is stored as the upper half of float32, and the safetensors file is streamed in chunks so
the full 0.5B shape (~1 GB) is written with ~100 MB of memory.
"""

from __future__ import annotations

import json
import random
import struct
import zlib
from pathlib import Path
from typing import Iterator

import numpy as np

SHAPES = {
    # vocab None: the tokenizer's size rounded up to a multiple of 64
    "tiny": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 256, "vocab_size": None},
    # the real Qwen2.5-0.5B/1.5B/3B(-Instruct) numbers (all three tie the embeddings)
    "qwen2.5-0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936},
    "qwen2.5-1.5b": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
                     "num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936},
    "qwen2.5-3b": {"hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16,
                   "num_key_value_heads": 2, "intermediate_size": 11008, "vocab_size": 151936},
}
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # pad/bos, turn start, eos (as Qwen2.5)
SYSTEM_PROMPT = "You are a helpful assistant."
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\n" + SYSTEM_PROMPT + "<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen2's pre-tokenizer split (one digit per token); transformers 5's Qwen2Tokenizer rebuilds exactly this
# pipeline around the vocab/merges, so 4.x (reads tokenizer.json) and 5.x tokenise the same way.
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHUNK = 8 * 1024 * 1024  # elements per random draw: 32 MB of float32


def model_config(shape: str, vocab_size: int, pad_id: int, eos_id: int) -> dict:
    """config.json as Qwen2.5-0.5B-Instruct has it, with this shape's sizes and the tokenizer's ids."""
    s = dict(SHAPES[shape])
    s["vocab_size"] = s["vocab_size"] or -(-vocab_size // 64) * 64
    if s["vocab_size"] < vocab_size:
        raise ValueError(f"vocab_size {s['vocab_size']} < tokenizer size {vocab_size}")
    return {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_dropout": 0.0,
        "bos_token_id": pad_id, "eos_token_id": eos_id, "hidden_act": "silu", "initializer_range": 0.02,
        **s, "max_position_embeddings": 32768, "max_window_layers": s["num_hidden_layers"],
        "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None,
        "use_sliding_window": False, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
    }


def tensor_shapes(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Every weight Qwen2ForCausalLM loads, with its shape, in file order."""
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    hd = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.q_proj.bias", (q,)),
                (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.k_proj.bias", (kv,)),
                (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.v_proj.bias", (kv,)),
                (p + "self_attn.o_proj.weight", (h, q)),
                (p + "mlp.gate_proj.weight", (inter, h)), (p + "mlp.up_proj.weight", (inter, h)),
                (p + "mlp.down_proj.weight", (h, inter)),
                (p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    out.append(("model.norm.weight", (h,)))
    if not config.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (vocab, h)))
    return out


def to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    f = np.ascontiguousarray(a, dtype=np.float32)
    bits = f.view(np.uint32)
    out = ((bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16))
    out = out.astype(np.uint16)
    out[np.isnan(f)] = 0x7FC0
    return out


def from_bf16(u: np.ndarray) -> np.ndarray:
    return (u.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _values(name: str, n: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """The init, as float32 chunks: ones for norms, zeros for biases, normal(0, 0.02) for matrices."""
    for start in range(0, n, CHUNK):
        size = min(CHUNK, n - start)
        if name.endswith("norm.weight"):
            yield np.ones(size, np.float32)
        elif name.endswith(".bias"):
            yield np.zeros(size, np.float32)
        else:
            chunk = rng.standard_normal(size, dtype=np.float32)
            chunk *= np.float32(0.02)
            yield chunk


def write_weights(path: Path, config: dict, seed: int) -> int:
    """Stream model.safetensors (BF16); returns its size in bytes. Each tensor has its own generator seeded
    from (seed, name), so a tensor's values do not depend on the shapes before it."""
    shapes = tensor_shapes(config)
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes:
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data 8-byte aligned, as the safetensors library does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, shape in shapes:
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            for chunk in _values(name, int(np.prod(shape)), rng):
                f.write(to_bf16(chunk).astype("<u2").tobytes())
    return 8 + len(raw) + offset


def read_weights(path: Path) -> dict[str, np.ndarray]:
    """model.safetensors -> {name: float32 array} (BF16 and F32 only; enough to check what we wrote)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        if info["dtype"] == "BF16":
            arr = from_bf16(np.frombuffer(data[start:end], "<u2"))
        elif info["dtype"] == "F32":
            arr = np.frombuffer(data[start:end], "<f4").copy()
        else:
            raise ValueError(f"{name}: dtype {info['dtype']} not read here")
        out[name] = arr.reshape(info["shape"])
    return out


def tokenizer_corpus(seed: int = 0, problems: int = 4000) -> list[str]:
    """Text like what the model will see: word problems and answers, the instruction, chat scaffolding."""
    from verl_cluster.testdata.gsm8k import INSTRUCTION
    from verl_cluster.testdata.synthetic_gsm8k import make_problem

    rng = random.Random(seed)
    texts = ["0123456789 " * 4, "+ - * / = < > ( ) [ ] { } . , : ; ! ? $ % # ' \" _ @ & ^ ~ | \\ `"]
    for _ in range(problems):
        row = make_problem(rng)
        # rendered as a chat (special tokens left out) so the role words get their own tokens too
        texts.append(f"system\n{SYSTEM_PROMPT}\nuser\n{row['question']} {INSTRUCTION}\nassistant\n{row['answer']}\n")
    return texts


def train_tokenizer(seed: int = 0, vocab_size: int = 3000):
    """A byte-level BPE (any text encodes) with Qwen2.5's pipeline and its special tokens appended last.
    The corpus saturates near 1,000 tokens: every word it has becomes one token before 3,000 merges."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(tokenizer_corpus(seed), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def write_tokenizer(out: Path) -> dict[str, int]:
    """tokenizer.json + tokenizer_config.json + special_tokens_map.json; returns the size and special ids.
    Always the same tokenizer (corpus seed 0), so models of any shape or --seed can share data and roles."""
    tok = train_tokenizer(0)
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    added = {str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": True} for t in SPECIAL_TOKENS}
    config = {
        # Qwen2Tokenizer(Fast) loads this folder in transformers 4.x and 5.x alike
        "tokenizer_class": "Qwen2Tokenizer", "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "add_bos_token": False,
        "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
        "errors": "replace", "model_max_length": 32768, "split_special_tokens": False,
    }
    _write_json(out / "tokenizer_config.json", config)
    _write_json(out / "special_tokens_map.json", {
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "eos_token": {"content": "<|im_end|>", "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False},
        "pad_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False}})
    return {"size": tok.get_vocab_size(with_added_tokens=True), **ids}


def write_model(out: Path, shape: str = "tiny", seed: int = 0) -> dict:
    """The whole folder; returns what was written (config, file sizes, parameter count)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape `{shape}` (known: {', '.join(SHAPES)})")
    out.mkdir(parents=True, exist_ok=True)
    tok = write_tokenizer(out)
    pad, eos = tok["<|endoftext|>"], tok["<|im_end|>"]
    config = model_config(shape, tok["size"], pad_id=pad, eos_id=eos)
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", {
        "bos_token_id": pad, "eos_token_id": [eos, pad], "pad_token_id": pad, "do_sample": True,
        "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05})
    size = write_weights(out / "model.safetensors", config, seed)
    params = sum(int(np.prod(s)) for _, s in tensor_shapes(config))
    return {"config": config, "tokenizer_size": tok["size"], "weights_bytes": size, "params": params}


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")
