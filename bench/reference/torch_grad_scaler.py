#!/usr/bin/env python3
"""PyTorch reference for `gpuopt bench scaler` (run on the GPU machine, needs torch with CUDA).

1. Runs torch.amp.GradScaler on the scripted step sequence of gpuopt's bench and unit test and
   compares its scale / growth-tracker / skip sequence with the hand-derived expectation and with
   the sequence our device kernels produced (read from the bench's JSON).
2. Checks torch's unscale rounding against the semantics gpuopt copies: inv = fp32(1 / fp64(scale)),
   x' = dtype(fp32(x) * inv) rounded to nearest even (numpy as the independent oracle).
3. Times torch's fused _amp_foreach_non_finite_check_and_unscale_ over the same 1 GiB of fp16 in
   200 tensors, and a 1 GiB device copy, with CUDA events (median).
Prints RESULT lines and writes a JSON with every figure.
"""
import argparse
import json
import statistics
import sys

import numpy as np
import torch

SCRIPT = "FFFIFHNTFFIINFNFFT"
GROWTH_INTERVAL = 3
# Hand-derived from GradScaler's documented algorithm (init 2^16, growth 2, backoff 0.5, interval 3):
# an inf/NaN step is skipped, halves the scale and zeroes the tracker; the third consecutive finite
# step doubles it. Same table as tests/unit/kernels/loss_scaler_test.cpp.
EXPECTED_SCALES = [65536, 65536, 131072, 65536, 65536, 65536, 32768, 32768, 32768,
                   65536, 32768, 16384, 8192, 8192, 4096, 4096, 4096, 8192]
EXPECTED_TRACKERS = [1, 2, 0, 0, 1, 2, 0, 1, 2, 0, 0, 0, 0, 1, 0, 1, 2, 0]
EXPECTED_SKIPPED = [0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1, 1, 1, 0, 1, 0, 0, 0]

GRADIENT_BYTES = 1 << 30
TENSOR_COUNT = 200


def gradient_sizes(total_bytes, tensors, element_bytes):
    """Same integer formula as gpuopt::bench::scaler::gradient_sizes."""
    total = total_bytes // element_bytes
    weights = [1 + (i * 7919) % 251 for i in range(tensors)]
    weight_sum = sum(weights)
    sizes = []
    for i in range(tensors - 1):
        size = total * weights[i] // weight_sum
        if i % 2 == 1 and size % 2 == 0 and size > 0:
            size -= 1
        sizes.append(size)
    sizes.append(total - sum(sizes))
    return sizes


def step_gradients(letter, step, counts, device):
    generator = torch.Generator(device="cpu").manual_seed(1000 + step)
    grads = []
    for n in counts:
        if letter == "T":
            signs = torch.randint(0, 2, (n,), generator=generator) * 2 - 1
            values = (signs.to(torch.float32) * 2.0 ** -24).to(torch.float16)
        else:
            values = ((torch.rand(n, generator=generator) * 2 - 1) * 1000).to(torch.float16)
        grads.append(values)
    target = grads[step % len(grads)]
    at = (step * 37) % target.numel()
    special = {"H": 65504.0, "I": float("-inf") if step % 2 else float("inf"), "N": float("nan")}
    if letter in special:
        target[at] = special[letter]
    return [g.to(device=device, dtype=torch.float32) for g in grads]


def torch_sequence(device):
    counts = (1000, 333, 7)
    params = [torch.nn.Parameter(torch.ones(n, device=device)) for n in counts]
    taken = {"steps": 0}

    class CountingSGD(torch.optim.SGD):
        def step(self, closure=None):
            taken["steps"] += 1
            return super().step(closure)

    optimizer = CountingSGD(params, lr=0.5)
    scaler = torch.amp.GradScaler("cuda", init_scale=65536.0, growth_factor=2.0,
                                  backoff_factor=0.5, growth_interval=GROWTH_INTERVAL)
    scales, trackers, skipped = [], [], []
    for step, letter in enumerate(SCRIPT):
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(torch.ones((), device=device))  # GradScaler insists on a scale() per step
        for p, g in zip(params, step_gradients(letter, step, counts, device)):
            p.grad = g
        before = taken["steps"]
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
        trackers.append(int(scaler._growth_tracker.item()))
        skipped.append(0 if taken["steps"] > before else 1)
    return scales, trackers, skipped


def bench_data(path, key):
    if not path:
        return None
    try:
        with open(path) as f:
            document = json.load(f)
    except (OSError, ValueError) as error:
        print(f"torch_grad_scaler: cannot read {path}: {error}", file=sys.stderr)
        return None
    for testcase in document.get("testcases", []):
        if testcase.get("key") == key and testcase.get("outcome") == "passed":
            return testcase.get("data")
    return None


def bfloat16_bits_rn(values_f32):
    bits = values_f32.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(values_f32)
    rounded[nan] = 0x7FFF
    return rounded


def rounding_matches(device):
    """torch's unscale vs fp32 multiply + one round-to-nearest-even, for fp16, bf16 and fp32."""
    rng = np.random.default_rng(7)
    ok = True
    for scale in (3.0, 1000.5, 0.7, 65536.0):
        inv32 = np.float32(1.0 / np.float64(np.float32(scale)))
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            if dtype == torch.float32:
                raw = rng.integers(0, 2**32, 1 << 20, dtype=np.uint32)
                x = torch.from_numpy(raw.view(np.float32).copy())
            else:
                raw = rng.integers(0, 2**16, 1 << 20, dtype=np.uint16)
                x = torch.from_numpy(raw.view(np.int16).copy()).view(dtype)
            x = torch.where(torch.isfinite(x.float()), x, torch.zeros_like(x))
            found_inf = torch.zeros(1, device=device)
            inv = torch.full((1,), scale, device=device).double().reciprocal().float()
            y = x.to(device)
            try:
                torch._amp_foreach_non_finite_check_and_unscale_([y], found_inf, inv)
            except (NotImplementedError, RuntimeError) as error:
                # torch 2.11's CUDA op has no bf16 kernel: nothing to compare for that dtype.
                print(f"torch_grad_scaler: {dtype}: torch has no fused unscale ({error})")
                continue
            product = x.float().numpy() * inv32
            if dtype == torch.float16:
                want = product.astype(np.float16).view(np.uint16)
                got = y.cpu().view(torch.int16).numpy().view(np.uint16)
            elif dtype == torch.bfloat16:
                want = bfloat16_bits_rn(product)
                got = y.cpu().view(torch.int16).numpy().view(np.uint16)
            else:
                want = product.astype(np.float32).view(np.uint32)
                got = y.cpu().numpy().view(np.uint32)
            mismatches = int((want != got).sum())
            if mismatches or found_inf.item() != 0:
                print(f"torch_grad_scaler: {dtype} scale {scale}: {mismatches} elements differ "
                      f"from fp32 multiply + RN", file=sys.stderr)
                ok = False
    return ok


def time_ms(fn, warmup, samples):
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(samples):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times), times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench-json", help="JSON from `gpuopt bench scaler --json`")
    parser.add_argument("--out", help="write the figures here")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("RESULT: torch reference skipped: no CUDA device for torch")
        return 0
    device = "cuda"
    result = {"schema_version": 1, "torch_version": torch.__version__,
              "device": torch.cuda.get_device_name(0), "script": SCRIPT}

    scales, trackers, skipped = torch_sequence(device)
    torch_vs_expected = (scales == [float(s) for s in EXPECTED_SCALES]
                         and trackers == EXPECTED_TRACKERS and skipped == EXPECTED_SKIPPED)
    result["torch_sequence"] = {"scales": scales, "growth_trackers": trackers, "skipped": skipped}
    result["torch_matches_expected"] = torch_vs_expected
    ours = bench_data(args.bench_json, "sequence")
    ours_vs_torch = None
    if ours is not None:
        ours_vs_torch = (ours.get("script") == SCRIPT
                         and [float(s) for s in ours.get("scales", [])] == scales
                         and ours.get("growth_trackers") == trackers
                         and ours.get("skipped") == skipped)
    result["gpuopt_gpu_matches_torch"] = ours_vs_torch
    rounding_ok = rounding_matches(device)
    result["torch_rounding_is_fp32_multiply_rn"] = rounding_ok

    unscale = bench_data(args.bench_json, "unscale_fp16")
    sizes = (unscale or {}).get("tensor_elements") or gradient_sizes(GRADIENT_BYTES, TENSOR_COUNT, 2)
    grads = [torch.full((n,), 1.0625, dtype=torch.float16, device=device) for n in sizes]
    found_inf = torch.zeros(1, device=device)
    inv_scale = torch.full((1,), 65536.0, device=device).double().reciprocal().float()
    samples = 10 if args.quick else 30
    torch_ms, torch_samples = time_ms(
        lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale),
        3, samples)
    moved = 2.0 * sum(sizes) * 2
    del grads
    source = torch.empty(GRADIENT_BYTES, dtype=torch.uint8, device=device)
    destination = torch.empty_like(source)
    copy_ms, _ = time_ms(lambda: destination.copy_(source), 3, samples)
    result["torch_unscale_ms"] = torch_ms
    result["torch_unscale_samples_ms"] = torch_samples
    result["torch_unscale_bandwidth_gbps"] = moved / (torch_ms * 1e6)
    result["torch_copy_ms"] = copy_ms
    result["torch_copy_bandwidth_gbps"] = 2.0 * GRADIENT_BYTES / (copy_ms * 1e6)
    ours_ms = (unscale or {}).get("unscale_ms", {}).get("median")
    result["gpuopt_unscale_ms"] = ours_ms
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)

    ours_text = f"{ours_ms:.3f} ms" if ours_ms else "n/a"
    print(f"RESULT: torch fused unscale 1 GiB fp16/200 tensors {torch_ms:.3f} ms "
          f"({result['torch_unscale_bandwidth_gbps']:.0f} GB/s, torch copy "
          f"{result['torch_copy_bandwidth_gbps']:.0f} GB/s); gpuopt {ours_text}")
    match = torch_vs_expected and ours_vs_torch is True
    print(f"RESULT: sequence match {'yes' if match else 'no'} (torch=expected "
          f"{'yes' if torch_vs_expected else 'no'}, gpuopt gpu=torch "
          f"{'n/a' if ours_vs_torch is None else ('yes' if ours_vs_torch else 'no')}); "
          f"torch rounding = fp32 multiply + RN: {'yes' if rounding_ok else 'no'}")
    return 0 if (match and rounding_ok) else 1


if __name__ == "__main__":
    sys.exit(main())
