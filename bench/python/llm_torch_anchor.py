"""Same-run anchor for the LLM decoder (docs/llm.md): one fp16 decode step of the 1B- and 8B-shaped
Llama models in PyTorch, captured in a CUDA graph and replayed, at batch 1 and 16, context 25.

Random fp16 weights of the same shapes as gpuopt's seeded int4 decoder (q/k/v and gate/up fused,
untied lm_head), RMSNorm, rotate-half RoPE, grouped-query attention over a static KV cache of 64
positions, SiLU-gated FFN and a greedy argmax. Prints one `[llm-torch]` line per figure, with the
step's fraction of the H200's 4.8 TB/s HBM (fp16 weights + KV cache read).
"""
import sys

import torch

HBM = 4.8e12
SHAPES = {
    "llama-3.2-1b-shaped": dict(hidden=2048, layers=16, heads=32, kv=8, hd=64, ffn=8192),
    "llama-3.1-8b-shaped": dict(hidden=4096, layers=32, heads=32, kv=8, hd=128, ffn=14336),
}
VOCAB, CONTEXT, POSITION = 128256, 64, 24


def rms(x, eps=1e-5):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)


def step_fn(s, weights, cache_k, cache_v, cos, sin, batch):
    h, nh, nkv, hd = s["hidden"], s["heads"], s["kv"], s["hd"]
    x_in = torch.zeros(batch, h, dtype=torch.float16, device="cuda")
    out = torch.zeros(batch, dtype=torch.int64, device="cuda")
    mask = torch.zeros(1, 1, 1, CONTEXT, dtype=torch.float16, device="cuda")
    mask[..., POSITION + 1:] = float("-inf")

    def rope(t):  # [b, heads, 1, hd]
        a, b = t[..., : hd // 2], t[..., hd // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def run():
        x = x_in
        for l, (wqkv, wo, wgu, wd) in enumerate(weights["layers"]):
            qkv = rms(x) @ wqkv
            q = qkv[:, : nh * hd].view(batch, nh, 1, hd)
            k = qkv[:, nh * hd:(nh + nkv) * hd].view(batch, nkv, 1, hd)
            v = qkv[:, (nh + nkv) * hd:].view(batch, nkv, 1, hd)
            q, k = rope(q), rope(k)
            cache_k[l][:, :, POSITION:POSITION + 1] = k
            cache_v[l][:, :, POSITION:POSITION + 1] = v
            a = torch.nn.functional.scaled_dot_product_attention(
                q, cache_k[l], cache_v[l], attn_mask=mask, enable_gqa=True)
            x = x + a.reshape(batch, nh * hd) @ wo
            gu = rms(x) @ wgu
            g, u = gu.chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(g) * u) @ wd
        out.copy_(torch.argmax(rms(x) @ weights["lm_head"], dim=-1))

    return run


def main():
    torch.manual_seed(0)
    names = sys.argv[1:] or list(SHAPES)
    for name in names:
        s = SHAPES[name]
        h, nh, nkv, hd, f = s["hidden"], s["heads"], s["kv"], s["hd"], s["ffn"]
        mk = lambda k, n: (torch.randn(k, n, device="cuda", dtype=torch.float16) / k ** 0.5)
        weights = {"layers": [(mk(h, (nh + 2 * nkv) * hd), mk(nh * hd, h), mk(h, 2 * f), mk(f, h))
                              for _ in range(s["layers"])],
                   "lm_head": mk(h, VOCAB)}
        weight_bytes = sum(t.numel() * 2 for layer in weights["layers"] for t in layer)
        weight_bytes += weights["lm_head"].numel() * 2
        inv = 500000.0 ** (-torch.arange(0, hd // 2, device="cuda", dtype=torch.float64) * 2 / hd)
        cos = torch.cos(POSITION * inv).to(torch.float16)
        sin = torch.sin(POSITION * inv).to(torch.float16)
        for batch in (1, 16):
            cache_k = [torch.randn(batch, nkv, CONTEXT, hd, device="cuda", dtype=torch.float16)
                       for _ in range(s["layers"])]
            cache_v = [torch.randn_like(c) for c in cache_k]
            run = step_fn(s, weights, cache_k, cache_v, cos, sin, batch)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    run()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            for _ in range(3):
                graph.replay()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            repeats = 50
            start.record()
            for _ in range(repeats):
                graph.replay()
            stop.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(stop) / repeats
            kv_bytes = 2 * s["layers"] * batch * nkv * (POSITION + 1) * hd * 2
            moved = weight_bytes + kv_bytes
            print(f"[llm-torch] torch fp16 decode step batch {batch} ({name}, CUDA graph): "
                  f"{ms:.4f} ms, roofline {100 * moved / (ms * 1e-3) / HBM:.1f}% "
                  f"({moved / 1e6:.1f} MB moved)", flush=True)
            del graph, cache_k, cache_v
        del weights
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
