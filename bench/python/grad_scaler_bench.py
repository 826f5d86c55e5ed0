"""torch.amp.GradScaler against gpuopt.amp.GradScaler on one CUDA device, in one run.

1. unscale_ of 1 GiB of fp32 gradients in 200 tensors;
2. unscale_ + clip_grad_norm_(foreach=True) against unscale_and_clip_ on the same gradients
   (with a non-fused optimizer: gpuopt makes its second multiply pass; with a fused one the clip
   travels in grad_scale);
3. a whole training step of a GPT-shaped model (~100M parameters, random tokens, AdamW fused and
   not, clipping at 1.0): step time and host synchronisations with each scaler.

Each figure is the median of --repeats timed runs (CUDA events) after --warmup untimed ones.
Prints one `RESULT:` line per figure and writes every sample as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings

import torch

from gpuopt.amp import GradScaler


def time_ms(setup, work, repeats: int, warmup: int) -> list[float]:
    """Milliseconds of work() for each of `repeats` runs, setup() untimed before each."""
    samples = []
    for i in range(warmup + repeats):
        setup()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        if i >= warmup:
            samples.append(start.elapsed_time(end))
    return samples


def split_ms(setup, work, calls: int = 10) -> dict[str, float]:
    """Where one call's time goes: the device time of the kernels work() launches (a profile of
    setup() + work() less one of setup() alone, per call) and the host time of work() itself
    (perf_counter, no synchronisation; median)."""

    def kernel_total(with_work: bool) -> float:
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                setup()
                if with_work:
                    work()
            torch.cuda.synchronize()
        return sum(
            e.self_device_time_total for e in prof.key_averages() if e.self_device_time_total > 0
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernels = (kernel_total(True) - kernel_total(False)) / calls / 1000.0
    host = []
    for _ in range(calls):
        setup()
        torch.cuda.synchronize()
        begin = time.perf_counter()
        work()
        host.append((time.perf_counter() - begin) * 1000.0)
        torch.cuda.synchronize()
    return {"kernel_ms": kernels, "host_ms": statistics.median(host)}


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": samples,
    }


def gradient_set(total_bytes: int, tensors: int):
    count = total_bytes // 4 // tensors
    params = [torch.nn.Parameter(torch.zeros(count, device="cuda")) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn(count, device="cuda") * 65536.0
    return params


def bench_unscale(args, results):
    params = gradient_set(args.bytes, args.tensors)
    for fused in (False, True):
        opt = torch.optim.AdamW(params, lr=1e-3, fused=fused)
        for name, make in (("torch", lambda: torch.amp.GradScaler("cuda")), ("gpuopt", GradScaler)):
            scaler = make()
            scaler.scale(torch.ones((), device="cuda"))

            def reset():
                scaler.update(new_scale=65536.0)  # back to READY for the next unscale_

            def unscale():
                scaler.unscale_(opt)

            key = f"unscale_{name}{'_fusedopt' if fused else ''}"
            results[key] = summary(time_ms(reset, unscale, args.repeats, args.warmup))
            results[key].update(split_ms(reset, unscale))

            def clip_work():
                if name == "torch":
                    scaler.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
                else:
                    scaler.unscale_and_clip_(opt, 1.0)

            key = f"unscale_clip_{name}{'_fusedopt' if fused else ''}"
            results[key] = summary(time_ms(reset, clip_work, args.repeats, args.warmup))
            results[key].update(split_ms(reset, clip_work))
    # The memory ceiling in the same run: an in-place multiply over the same tensors (the bytes an
    # unscale must move: read and write each gradient once) and a read-only norm (what a pass that
    # defers the multiply into the optimizer moves).
    grads = [p.grad for p in params]
    results["foreach_mul_reference"] = summary(
        time_ms(lambda: None, lambda: torch._foreach_mul_(grads, 1.0), args.repeats, args.warmup)
    )
    results["foreach_norm_reference"] = summary(
        time_ms(lambda: None, lambda: torch._foreach_norm(grads), args.repeats, args.warmup)
    )
    gib = args.bytes / 2**30
    m = results["foreach_mul_reference"]["median"]
    n = results["foreach_norm_reference"]["median"]
    print(
        f"RESULT: amp references {gib:.2f} GiB fp32 in {args.tensors} tensors: in-place "
        f"_foreach_mul_ {m:.3f} ms ({2 * args.bytes / m / 1e6:.0f} GB/s), read-only "
        f"_foreach_norm {n:.3f} ms ({args.bytes / n / 1e6:.0f} GB/s)"
    )
    for key, entry in results.items():
        if "kernel_ms" in entry:
            print(
                f"RESULT: amp split {key}: call {entry['median']:.3f} ms, its kernels "
                f"{entry['kernel_ms']:.3f} ms, host {entry['host_ms']:.3f} ms"
            )
    for suffix, what in (("", "non-fused optimizer"), ("_fusedopt", "fused AdamW")):
        t = results[f"unscale_torch{suffix}"]["median"]
        g = results[f"unscale_gpuopt{suffix}"]["median"]
        print(
            f"RESULT: amp unscale_ {gib:.2f} GiB fp32 in {args.tensors} tensors ({what}): "
            f"torch {t:.3f} ms, gpuopt {g:.3f} ms, speed-up {t / g:.2f}x (target 2x)"
        )
        t = results[f"unscale_clip_torch{suffix}"]["median"]
        g = results[f"unscale_clip_gpuopt{suffix}"]["median"]
        print(
            f"RESULT: amp unscale_+clip_grad_norm_ ({what}): torch {t:.3f} ms, gpuopt "
            f"unscale_and_clip_ {g:.3f} ms, speed-up {t / g:.2f}x (target 2.5x)"
        )
    del params


class Block(torch.nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)
        )

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(torch.nn.Module):
    """GPT-2-small-shaped: 12 layers, width 768, vocabulary 32000 (~110M parameters)."""

    def __init__(self, vocab=32000, dim=768, layers=12, heads=12, context=512):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.position = torch.nn.Parameter(torch.zeros(context, dim))
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        n = tokens.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf"), device=tokens.device), diagonal=1)
        x = self.embed(tokens) + self.position[:n]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def bench_training_step(args, results):
    torch.manual_seed(0)
    tokens = torch.randint(0, 32000, (args.batch, args.context + 1), device="cuda")
    for fused in (False, True):
        for name, make in (("torch", lambda: torch.amp.GradScaler("cuda")), ("gpuopt", GradScaler)):
            model = TinyGPT(context=args.context).cuda()
            parameters = sum(p.numel() for p in model.parameters())
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
            scaler = make()

            def step():
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.float16):
                    logits = model(tokens[:, :-1])
                    loss = torch.nn.functional.cross_entropy(
                        logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1)
                    )
                scaler.scale(loss).backward()
                if name == "torch":
                    scaler.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
                else:
                    scaler.unscale_and_clip_(opt, 1.0)
                scaler.step(opt)
                scaler.update()

            samples = time_ms(lambda: None, step, args.repeats, args.warmup)
            if args.profile:  # where the step's GPU time goes, per op
                with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CUDA]
                ) as profiler:
                    for _ in range(3):
                        step()
                    torch.cuda.synchronize()
                print(f"profile {name} {'fused' if fused else 'nonfused'} (3 steps):")
                print(profiler.key_averages().table(sort_by="cuda_time_total", row_limit=12))
            # Host synchronisations of one step, as torch's sync debug mode reports them.
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    step()
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            syncs = sum("synchroniz" in str(w.message).lower() for w in caught)
            key = f"train_step_{name}_{'fused' if fused else 'nonfused'}"
            results[key] = {**summary(samples), "host_syncs": syncs, "parameters": parameters}
            del model, opt
            torch.cuda.empty_cache()
    for kind in ("nonfused", "fused"):
        t = results[f"train_step_torch_{kind}"]
        g = results[f"train_step_gpuopt_{kind}"]
        print(
            f"RESULT: amp training step GPT {t['parameters'] / 1e6:.0f}M params batch "
            f"{args.batch}x{args.context} AdamW {kind} + clip: torch {t['median']:.2f} ms "
            f"({t['host_syncs']} syncs), gpuopt {g['median']:.2f} ms ({g['host_syncs']} syncs)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=2**30, help="gradient bytes (fp32)")
    parser.add_argument("--tensors", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--profile", action="store_true", help="print a torch profile per step")
    parser.add_argument("--out", default=None, help="JSON file for every sample")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("RESULT: amp bench skipped: no CUDA device")
        return 0
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    bench_unscale(args, results)
    if not args.skip_training:
        bench_training_step(args, results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
