#!/usr/bin/env python3
"""Same-run anchor: PyTorch's int4 weight-only GEMM (tinygemm, torch._weight_int4pack_mm, bf16
activations, group 128) against dense bf16 torch.nn.functional.linear, in one process, with the
method of `gpuopt bench gemm` (src/bench/gemm.cpp): one pair of CUDA events per launch, every
sample queued back to back before one sync, weights rotated over ceil(192e6 / weight bytes) copies
(2..32) so the 60 MB L2 cannot serve them, warm-up of max(warmup, rotations) launches, median /
min / max of 20 samples.

Python dispatch takes longer than a small GEMM, so by default a GPU sleep kernel is queued ahead
of the samples (--hold-us, 0 = off): the launches pile up behind it and then run back to back, as
the C++ bench's do; the script says if the sleep ended before all samples were queued.

The int4 packing API changed across torch versions; the plausible forms are tried in order and the
first whose result matches a dequantised bf16 reference (checked once per shape at M=4, max error
relative to max |reference|) is used; the script prints which.

Output, one line per (shape, M):
  torch_int4 K N M median_us min_us max_us torch_bf16_median_us speedup int4_spread bf16_spread
speedup = bf16 median / int4 median; spread = (p90 - p10) / median. Lines starting with '#' are
context. Exit codes: 0 ok, 1 some shape failed, 2 no usable GPU / torch, 3 bad arguments.
"""
import argparse
import math
import sys

ROTATION_BYTES = 192e6  # as src/bench/gemm.cpp: twice the H200's L2
GROUP = 128
CHECK_M = 4
CHECK_TOLERANCE = 3e-2  # bf16 rounding gives ~4e-3; a wrong packing gives O(1)
DEVICE = "cuda"


def quantile(sorted_values, q):
    """Linear interpolation between closest ranks (numpy's default), as src/bench/testcase.cpp."""
    position = q * (len(sorted_values) - 1)
    lower, upper = math.floor(position), math.ceil(position)
    weight = position - lower
    return sorted_values[lower] * (1 - weight) + sorted_values[upper] * weight


def summarize(times):
    s = sorted(times)
    median = quantile(s, 0.5)
    return {
        "median": median,
        "min": s[0],
        "max": s[-1],
        "spread": (quantile(s, 0.9) - quantile(s, 0.1)) / median if median else 0.0,
    }


class Timer:
    def __init__(self, torch, samples, warmup, hold_us):
        self.torch = torch
        self.samples = samples
        self.warmup = warmup
        self.hold_us = hold_us
        self.cycles_per_us = None
        if hold_us > 0:
            # Calibrate torch.cuda._sleep (GPU clock cycles) against events.
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            cycles = 20_000_000
            torch.cuda._sleep(cycles // 10)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            torch.cuda.synchronize()
            self.cycles_per_us = cycles / (start.elapsed_time(end) * 1000.0)

    def time_us(self, launch, rotations):
        """time_us of src/bench/gemm.cpp; launch i uses rotation i % rotations."""
        torch = self.torch
        warmup = max(self.warmup, rotations)
        for i in range(warmup):
            launch(i % rotations)
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.samples)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.samples)]
        held = None
        if self.cycles_per_us:
            torch.cuda._sleep(int(self.hold_us * self.cycles_per_us))
            held = torch.cuda.Event()
            held.record()
        for i in range(self.samples):
            starts[i].record()
            launch((warmup + i) % rotations)
            ends[i].record()
        if held is not None and held.query():
            print(f"# warning: --hold-us {self.hold_us:.0f} ended before all samples were queued;"
                  " host gaps may be in these times", flush=True)
        torch.cuda.synchronize()
        return summarize([s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)])


def pack_forms(torch):
    """(description, converter of int32 [N][K] values 0..15 to the packing op's input)."""
    return [
        ("uint8 [N][K/2], even k in the high nibble (torch >= 2.5)",
         lambda q: ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8).contiguous()),
        ("int32 [N][K] values 0..15 (torch < 2.5)",
         lambda q: q.to(torch.int32).contiguous()),
        ("uint8 [N][K/2], even k in the low nibble",
         lambda q: (q[:, ::2] | (q[:, 1::2] << 4)).to(torch.uint8).contiguous()),
    ]


def first_line(error):
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


def pack_and_check(torch, q, scale_zero, scales, zeros, k, n, preferred, inner_k_tiles_list):
    """Tries the packing forms; returns (packed, description, inner_k_tiles, error) of the first
    whose _weight_int4pack_mm result matches the dequantised reference, else raises."""
    x = torch.empty(CHECK_M, k, dtype=torch.bfloat16, device=DEVICE).uniform_(-1, 1)
    # Reference: w = (q - 8) * scale + zero per group of 128 along K (tinygemm's convention), fp32.
    s_full = scales.float().repeat_interleave(GROUP, dim=0).t()  # [N][K]
    z_full = zeros.float().repeat_interleave(GROUP, dim=0).t()
    w_ref = (q.float() - 8.0) * s_full + z_full
    del s_full, z_full
    reference = x.float() @ w_ref.t()
    del w_ref
    scale = reference.abs().max().item()
    candidates = [(d, f, t) for d, f in pack_forms(torch) for t in inner_k_tiles_list]
    if preferred is not None:
        candidates.sort(key=lambda c: (c[0], c[2]) != preferred)
    failures = []
    for description, convert, inner_k_tiles in candidates:
        try:
            packed = torch._convert_weight_to_int4pack(convert(q), inner_k_tiles)
            y = torch._weight_int4pack_mm(x, packed, GROUP, scale_zero)
            torch.cuda.synchronize()
        except Exception as error:  # noqa: BLE001 - any failure means "not this form"
            failures.append(f"{description}, innerKTiles={inner_k_tiles}: {first_line(error)}")
            continue
        error = ((y.float() - reference).abs().max().item() / scale) if scale > 0 else math.inf
        if math.isfinite(error) and error < CHECK_TOLERANCE:
            return packed, description, inner_k_tiles, error, failures
        failures.append(f"{description}, innerKTiles={inner_k_tiles}: runs but max rel error "
                        f"{error:.3g}")
        del packed, y
    raise RuntimeError("no packing form gave correct results:\n#   " + "\n#   ".join(failures))


def parse_ints(text):
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers: {text}")
    return values


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=parse_ints, default=[1, 2, 4, 8, 16, 32, 64, 128])
    parser.add_argument("--shape", type=parse_ints, action="append",
                        help="K,N (repeatable); default the four bench shapes")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--hold-us", type=float, default=None,
                        help="GPU sleep ahead of the samples (default max(2000, 150*samples); 0 off)")
    parser.add_argument("--inner-k-tiles", type=parse_ints, default=[8, 4, 2],
                        help="innerKTiles values to try, in order (default 8,4,2)")
    args = parser.parse_args()
    shapes = [tuple(s) for s in args.shape] if args.shape else [
        (8192, 28672), (28672, 8192), (4096, 14336), (4096, 4096)]
    if any(len(s) != 2 for s in shapes):
        print("torch_int4_bench: --shape takes K,N", file=sys.stderr)
        return 3
    if args.samples < 1 or args.warmup < 0:
        print("torch_int4_bench: --samples must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 3
    hold_us = args.hold_us if args.hold_us is not None else max(2000.0, 150.0 * args.samples)

    try:
        import torch
        import torch.nn.functional as F
    except Exception as error:  # noqa: BLE001
        print(f"torch_int4_bench: cannot import torch ({first_line(error)})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or torch.cuda.device_count() <= args.device:
        print(f"torch_int4_bench: no usable CUDA GPU for torch {torch.__version__} "
              f"(cuda {torch.version.cuda}); nothing was timed", file=sys.stderr)
        return 2
    torch.cuda.set_device(args.device)
    props = torch.cuda.get_device_properties(args.device)
    if props.major < 8:
        print(f"torch_int4_bench: {props.name} is sm_{props.major}{props.minor}; tinygemm needs"
              " sm_80 or newer", file=sys.stderr)
        return 2
    for op in ("_convert_weight_to_int4pack", "_weight_int4pack_mm"):
        if not hasattr(torch, op):
            print(f"torch_int4_bench: torch {torch.__version__} has no torch.{op}", file=sys.stderr)
            return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference stays fp32
    torch.manual_seed(0)
    timer = Timer(torch, args.samples, args.warmup, hold_us)

    print(f"# torch {torch.__version__} (cuda {torch.version.cuda}), device {args.device}: "
          f"{props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs)")
    for op in ("aten::_convert_weight_to_int4pack", "aten::_weight_int4pack_mm"):
        try:
            for schema in torch._C._jit_get_schemas_for_operator(op):
                print(f"# schema: {schema}")
        except Exception:  # noqa: BLE001 - informational only
            pass
    print(f"# method: events per launch, samples queued back to back, {args.samples} samples, "
          f"warm-up max({args.warmup}, rotations), rotation over ceil({ROTATION_BYTES / 1e6:.0f} MB"
          f" / bytes) copies (2..32), hold {hold_us:.0f} us"
          + (f" ({timer.cycles_per_us:.0f} cycles/us)" if timer.cycles_per_us else "")
          + f"; group {GROUP}, bf16 activations, dense = F.linear bf16")
    print("# columns: torch_int4 K N M median_us min_us max_us torch_bf16_median_us speedup"
          " int4_spread bf16_spread", flush=True)

    max_m = max(args.m)
    preferred = None
    failed = 0
    for k, n in shapes:
        try:
            if k % GROUP:
                raise RuntimeError(f"K={k} is not a multiple of the group size {GROUP}")
            groups = k // GROUP
            q = torch.randint(0, 16, (n, k), dtype=torch.int32, device=DEVICE)
            scales = torch.empty(groups, n, device=DEVICE).uniform_(0.005, 0.015).bfloat16()
            zeros = torch.empty(groups, n, device=DEVICE).uniform_(-0.01, 0.01).bfloat16()
            # qScaleAndZeros: [K/group][N][2], (scale, zero) pairs.
            scale_zero = torch.stack([scales, zeros], dim=2).contiguous()
            packed, description, inner_k_tiles, error, failures = pack_and_check(
                torch, q, scale_zero, scales, zeros, k, n, preferred, args.inner_k_tiles)
            for failure in failures:
                print(f"# tried: {failure}")
            preferred = (description, inner_k_tiles)
            print(f"# shape K={k} N={n}: packing {description}, innerKTiles={inner_k_tiles}, "
                  f"packed {tuple(packed.shape)} {packed.dtype}; check M={CHECK_M}: max error "
                  f"{error:.2e} of max |reference|", flush=True)
            del q

            compressed = packed.numel() * packed.element_size() + scale_zero.numel() * 2
            rotations = min(max(math.ceil(ROTATION_BYTES / compressed), 2), 32)
            weights = [packed] + [packed.clone() for _ in range(rotations - 1)]
            scale_zeros = [scale_zero] + [scale_zero.clone() for _ in range(rotations - 1)]
            dense_bytes = n * k * 2
            dense_rotations = min(max(math.ceil(ROTATION_BYTES / dense_bytes), 2), 32)
            dense = [torch.empty(n, k, dtype=torch.bfloat16, device=DEVICE).uniform_(-1, 1)
                     for _ in range(dense_rotations)]
            x_all = torch.empty(max_m, k, dtype=torch.bfloat16, device=DEVICE).uniform_(-1, 1)
            print(f"# shape K={k} N={n}: int4 {compressed / 1e6:.1f} MB x {rotations} rotations, "
                  f"bf16 {dense_bytes / 1e6:.1f} MB x {dense_rotations}", flush=True)

            for m in args.m:
                x = x_all[:m]
                try:
                    int4 = timer.time_us(
                        lambda r: torch._weight_int4pack_mm(x, weights[r], GROUP, scale_zeros[r]),
                        rotations)
                    bf16 = timer.time_us(lambda r: F.linear(x, dense[r]), dense_rotations)
                    finite = bool(torch.isfinite(
                        torch._weight_int4pack_mm(x, weights[0], GROUP, scale_zeros[0])).all())
                except Exception as error:  # noqa: BLE001
                    print(f"# FAILED K={k} N={n} M={m}: {first_line(error)}", flush=True)
                    failed += 1
                    continue
                print(f"torch_int4 {k} {n} {m} {int4['median']:.2f} {int4['min']:.2f} "
                      f"{int4['max']:.2f} {bf16['median']:.2f} {bf16['median'] / int4['median']:.3f}"
                      f" {int4['spread']:.3f} {bf16['spread']:.3f}" + ("" if finite else " NONFINITE"),
                      flush=True)
                failed += 0 if finite else 1
        except Exception as error:  # noqa: BLE001 - report and go on with the next shape
            message = str(error).strip().replace("\n", "\n# ")
            print(f"# FAILED shape K={k} N={n}: {type(error).__name__}: {message}", flush=True)
            failed += 1
        finally:
            q = packed = weights = scale_zeros = scale_zero = scales = zeros = None
            dense = x_all = x = None
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
