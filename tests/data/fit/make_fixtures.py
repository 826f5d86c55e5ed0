#!/usr/bin/env python3
"""Writes the checkpoints `gpuopt doctor --fit` tests read (tests/data/fit/<name>/):
  tiny-llama/  a 2-layer Llama-shaped model in two bf16 safetensors shards (real, zero-filled data)
  truncated/   the same config with one shard cut short, as an interrupted download leaves it
  tiny-llama-int4/  the tiny model's linear layers as a GPTQ checkpoint (I32 qweight/qzeros,
               F16 scales, group size 16), with quantization_config in config.json
The Llama-3 8B/70B and Qwen2.5 7B configs beside them are written by hand from the published
shapes. Rerun after changing a fixture:
    python3 tests/data/fit/make_fixtures.py
"""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4}

TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def safetensors(tensors, cut=0):
    """tensors: list of (name, dtype, shape). Zero data; `cut` bytes removed from the end."""
    header, offset = {}, 0
    for name, dtype, shape in tensors:
        size = DTYPE_BYTES[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    blob = struct.pack("<Q", len(text)) + text + b"\0" * offset
    return blob[:len(blob) - cut] if cut else blob


def tiny_tensors(config, linear):
    """HF Llama tensor names; `linear(prefix, out, in)` gives the tensors of one linear layer."""
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    hd = h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", "BF16", (v, h))]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        for name, rows, cols in (("self_attn.q_proj", q, h), ("self_attn.k_proj", kv, h),
                                 ("self_attn.v_proj", kv, h), ("self_attn.o_proj", h, q),
                                 ("mlp.gate_proj", i, h), ("mlp.up_proj", i, h),
                                 ("mlp.down_proj", h, i)):
            out += linear(p + name, rows, cols)
        out += [(p + "input_layernorm.weight", "BF16", (h,)),
                (p + "post_attention_layernorm.weight", "BF16", (h,))]
    out += [("model.norm.weight", "BF16", (h,)), ("lm_head.weight", "BF16", (v, h))]
    return out


def write_model(name, config, tensors, cut=0):
    root = os.path.join(HERE, name)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    half = len(tensors) // 2
    for index, part in enumerate((tensors[:half], tensors[half:])):
        path = os.path.join(root, f"model-{index + 1:05d}-of-00002.safetensors")
        with open(path, "wb") as f:
            f.write(safetensors(part, cut if index == 1 else 0))


def bf16_linear(prefix, rows, cols):
    return [(prefix + ".weight", "BF16", (rows, cols))]


def gptq_linear(group):
    def linear(prefix, rows, cols):
        # GPTQ: qweight [in/8, out] I32 (eight 4-bit weights a word), qzeros [in/group, out/8],
        # scales [in/group, out] F16.
        return [(prefix + ".qweight", "I32", (cols // 8, rows)),
                (prefix + ".qzeros", "I32", (cols // group, rows // 8)),
                (prefix + ".scales", "F16", (cols // group, rows))]
    return linear


if __name__ == "__main__":
    write_model("tiny-llama", TINY, tiny_tensors(TINY, bf16_linear))
    write_model("truncated", TINY, tiny_tensors(TINY, bf16_linear), cut=100)
    quantized = dict(TINY, quantization_config={"quant_method": "gptq", "bits": 4,
                                                "group_size": 16, "desc_act": False})
    write_model("tiny-llama-int4", quantized, tiny_tensors(quantized, gptq_linear(16)))
