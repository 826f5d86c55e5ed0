#!/usr/bin/env python3
"""Writes a Llama-shaped GGUF file with seeded random Q4_0 weights for the llama.cpp anchor.

The llama.cpp anchor (scripts/anchors/llama_cpp.sh, docs/llm.md) times llama.cpp's batch-1 decode
on a model of the same layer shapes as gpuopt's `llama_1b_shaped()` / `llama_8b_shaped()`. No
weights can be downloaded, so every weight matrix here is random Q4_0 data: each block of 32
weights is an fp16 scale d followed by 16 bytes of 4-bit codes q (value = (q - 8) * d). The codes
are uniform random bytes from a seeded numpy generator; the scales are drawn from a narrow range
around 1 / (8 sqrt(K)) so that activations stay finite through the layers. Norm weights are f32
ones, as in gpuopt's decoder.

What is the same as gpuopt's model: hidden size, layer count, query/KV heads, head size, FFN size,
vocabulary, RoPE theta, RMSNorm epsilon, and an untied lm_head (`output.weight`) quantised like the
other matrices. What differs: Q4_0 groups are 32 weights with one fp16 scale (4.5 bits a weight),
gpuopt's W4A16 groups are 128 (4.125 bits a weight); the token embedding is Q4_0 here (llama.cpp
reads one row per token either way); q/k/v and gate/up are separate tensors, as llama.cpp's loader
expects them.

The tokenizer is the smallest SentencePiece-style ("llama") vocabulary llama.cpp loads: <unk>,
<s>, </s>, the 256 byte tokens <0x00>..<0xFF> (the loader looks up <0x0A> for the newline token),
then distinct placeholder pieces up to the vocabulary size. llama-bench feeds random token ids and
never tokenizes text, so the pieces do not matter; the count does, because llama.cpp sizes the
embedding and lm_head from it.

Needs numpy and PyPI's `gguf` package (which imports PyYAML). The data is written one tensor at a
time, so memory stays near the size of the largest tensor.

    python3 bench/python/write_llama_gguf.py --shape 1b --out /tmp/llama-1b-q4_0.gguf
    python3 bench/python/write_llama_gguf.py --shape 8b --out /tmp/llama-8b-q4_0.gguf
    python3 bench/python/write_llama_gguf.py --check /tmp/llama-1b-q4_0.gguf
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np

try:
    import gguf
except ImportError as error:  # a clear message instead of a trace
    sys.exit(
        f"write_llama_gguf: cannot import the gguf package ({error}); "
        "pip install gguf, or put its folder on PYTHONPATH"
    )

QK4_0 = 32  # weights per Q4_0 block
Q4_0_BLOCK_BYTES = 2 + QK4_0 // 2  # fp16 scale + 16 bytes of nibbles


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float
    rms_eps: float
    context: int


SHAPES = {
    # gpuopt's llama_1b_shaped() (include/gpuopt/pipeline/llm.hpp).
    "1b": Shape("llama-1b-shaped", 2048, 16, 32, 8, 64, 8192, 128256, 500000.0, 1e-5, 131072),
    # gpuopt's llama_8b_shaped().
    "8b": Shape("llama-8b-shaped", 4096, 32, 32, 8, 128, 14336, 128256, 500000.0, 1e-5, 131072),
    # A small shape for checking the writer and the loader on a CPU.
    "tiny": Shape("llama-tiny", 256, 2, 4, 2, 64, 512, 512, 500000.0, 1e-5, 4096),
}


def matrices(shape: Shape) -> list[tuple[str, int, int]]:
    """(tensor name, rows N, columns K) of every Q4_0 matrix, in file order.

    A GGUF weight of numpy shape (N, K) is ggml's ne = (K, N): y = W x with x of length K.
    """
    q = shape.heads * shape.head_dim
    kv = shape.kv_heads * shape.head_dim
    out = [("token_embd.weight", shape.vocab, shape.hidden)]
    for layer in range(shape.layers):
        b = f"blk.{layer}."
        out += [
            (b + "attn_q.weight", q, shape.hidden),
            (b + "attn_k.weight", kv, shape.hidden),
            (b + "attn_v.weight", kv, shape.hidden),
            (b + "attn_output.weight", shape.hidden, q),
            (b + "ffn_gate.weight", shape.ffn, shape.hidden),
            (b + "ffn_up.weight", shape.ffn, shape.hidden),
            (b + "ffn_down.weight", shape.hidden, shape.ffn),
        ]
    out.append(("output.weight", shape.vocab, shape.hidden))
    return out


def norms(shape: Shape) -> list[str]:
    names = []
    for layer in range(shape.layers):
        names += [f"blk.{layer}.attn_norm.weight", f"blk.{layer}.ffn_norm.weight"]
    names.append("output_norm.weight")
    return names


def q4_0_bytes(rows: int, cols: int) -> int:
    return rows * (cols // QK4_0) * Q4_0_BLOCK_BYTES


def random_q4_0(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Q4_0 blocks as a uint8 array (rows, cols / 32 * 18): fp16 scale, then 16 code bytes."""
    if cols % QK4_0:
        raise ValueError(f"Q4_0 needs the row length to be a multiple of {QK4_0}, got {cols}")
    blocks = rows * (cols // QK4_0)
    out = np.empty((blocks, Q4_0_BLOCK_BYTES), dtype=np.uint8)
    base = 1.0 / (8.0 * np.sqrt(cols))
    scales = (base * rng.uniform(0.5, 1.5, size=blocks)).astype(np.float16)
    out[:, :2] = scales.view(np.uint8).reshape(blocks, 2)
    out[:, 2:] = rng.integers(0, 256, size=(blocks, QK4_0 // 2), dtype=np.uint8)
    return out.reshape(rows, (cols // QK4_0) * Q4_0_BLOCK_BYTES)


def vocabulary(size: int) -> tuple[list[str], list[float], list[int]]:
    if size < 3 + 256:
        raise ValueError(f"vocabulary of {size} is smaller than the 259 fixed tokens")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    extra = size - len(tokens)
    tokens += [f"\u2581t{i}" for i in range(extra)]
    types += [gguf.TokenType.NORMAL] * extra
    scores = [0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(extra)]
    return tokens, scores, [int(t) for t in types]


def write(shape: Shape, path: str, seed: int) -> int:
    arch = "llama"
    w = gguf.GGUFWriter(path, arch)
    w.add_name(shape.name)
    w.add_description("seeded random Q4_0 weights with Llama layer shapes (no trained weights)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_vocab_size(shape.vocab)

    tokens, scores, types = vocabulary(shape.vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)

    mats = matrices(shape)
    norm_names = norms(shape)
    for name, rows, cols in mats:
        w.add_tensor_info(
            name,
            (rows, cols // QK4_0 * Q4_0_BLOCK_BYTES),
            np.dtype(np.uint8),
            q4_0_bytes(rows, cols),
            raw_dtype=gguf.GGMLQuantizationType.Q4_0,
        )
    for name in norm_names:
        w.add_tensor_info(name, (shape.hidden,), np.dtype(np.float32), shape.hidden * 4)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    total = 0
    for name, rows, cols in mats:
        data = random_q4_0(rng, rows, cols)
        w.write_tensor_data(data)
        total += data.nbytes
    ones = np.ones(shape.hidden, dtype=np.float32)
    for _ in norm_names:
        w.write_tensor_data(ones)
        total += ones.nbytes
    w.close()
    return total


def check(path: str, shape: Shape | None) -> list[str]:
    """Reads the file back with gguf's reader; returns a list of problems (empty when fine)."""
    reader = gguf.GGUFReader(path)
    problems = []
    fields = reader.fields

    def scalar(key):
        field = fields.get(key)
        if field is None:
            problems.append(f"missing key {key}")
            return None
        return field.contents()

    arch = scalar("general.architecture")
    if arch != "llama":
        problems.append(f"general.architecture is {arch!r}, expected 'llama'")
    got = {
        "hidden": scalar("llama.embedding_length"),
        "layers": scalar("llama.block_count"),
        "heads": scalar("llama.attention.head_count"),
        "kv_heads": scalar("llama.attention.head_count_kv"),
        "ffn": scalar("llama.feed_forward_length"),
        "vocab": scalar("llama.vocab_size"),
    }
    if shape is None:
        shape = next(
            (s for s in SHAPES.values() if all(getattr(s, k) == v for k, v in got.items())), None
        )
        if shape is None:
            problems.append(f"hyperparameters {got} match no known shape")
            return problems
    for key, value in got.items():
        if value != getattr(shape, key):
            problems.append(f"{key} is {value}, expected {getattr(shape, key)}")
    tokens = fields.get("tokenizer.ggml.tokens")
    if tokens is None or len(tokens.data) != shape.vocab:
        problems.append("tokenizer.ggml.tokens missing or not vocab-sized")

    by_name = {t.name: t for t in reader.tensors}
    expected = {name: (cols, rows) for name, rows, cols in matrices(shape)}
    for name in norms(shape):
        expected[name] = (shape.hidden,)
    if set(by_name) != set(expected):
        problems.append(
            f"tensor names differ: missing {sorted(set(expected) - set(by_name))[:5]}, "
            f"extra {sorted(set(by_name) - set(expected))[:5]}"
        )
    for name, ne in expected.items():
        t = by_name.get(name)
        if t is None:
            continue
        if tuple(int(x) for x in t.shape) != ne:
            problems.append(f"{name}: ne {tuple(t.shape)}, expected {ne}")
        want = gguf.GGMLQuantizationType.F32 if len(ne) == 1 else gguf.GGMLQuantizationType.Q4_0
        if t.tensor_type != want:
            problems.append(f"{name}: type {t.tensor_type.name}, expected {want.name}")
        if len(ne) == 2 and t.n_bytes != q4_0_bytes(ne[1], ne[0]):
            problems.append(f"{name}: {t.n_bytes} bytes, expected {q4_0_bytes(ne[1], ne[0])}")
    # Dequantise one block row of layer 0's q matrix with gguf's own Q4_0 code and compare it with
    # the definition (q - 8) * d read straight from the bytes.
    t = by_name.get("blk.0.attn_q.weight")
    if t is not None:
        raw = np.asarray(t.data, dtype=np.uint8).reshape(-1, Q4_0_BLOCK_BYTES)[:64]
        d = raw[:, :2].copy().view(np.float16).astype(np.float32)
        lo = (raw[:, 2:] & 0x0F).astype(np.int32) - 8
        hi = (raw[:, 2:] >> 4).astype(np.int32) - 8
        mine = np.concatenate([lo, hi], axis=1) * d
        theirs = gguf.quants.dequantize(raw.reshape(1, -1), gguf.GGMLQuantizationType.Q4_0)
        if not np.array_equal(mine.reshape(-1), np.asarray(theirs, np.float32).reshape(-1)):
            problems.append(
                "blk.0.attn_q.weight: gguf's Q4_0 dequantisation disagrees with (q-8)*d"
            )
        if not np.all(np.isfinite(d)) or np.any(d <= 0):
            problems.append("blk.0.attn_q.weight: non-finite or non-positive scales")
        codes = np.concatenate([lo, hi]).reshape(-1) + 8
        if len(np.unique(codes)) != 16:
            problems.append("blk.0.attn_q.weight: the codes do not cover all 16 values")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    parser.add_argument("--out", help="GGUF file to write")
    parser.add_argument("--seed", type=int, default=20260101)
    parser.add_argument("--check", metavar="FILE", help="read FILE back and check it")
    args = parser.parse_args()
    if not args.out and not args.check:
        parser.error("give --out FILE and/or --check FILE")
    shape = SHAPES[args.shape]
    if args.out:
        mats = matrices(shape)
        weights = sum(r * c for _, r, c in mats)
        data = write(shape, args.out, args.seed)
        print(
            f"wrote {args.out}: {shape.name}, {len(mats)} Q4_0 matrices, {weights} weights, "
            f"{data} tensor bytes ({data * 8 / weights:.3f} bits a weight incl. norms)"
        )
    if args.check:
        problems = check(args.check, shape if args.out or "--shape" in sys.argv else None)
        for p in problems[:12]:
            print(f"check: {p}", file=sys.stderr)
        if len(problems) > 12:
            print(f"check: ... and {len(problems) - 12} more", file=sys.stderr)
        if problems:
            return 1
        print(f"check: {args.check} reads back with the expected keys, tensors and Q4_0 blocks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
