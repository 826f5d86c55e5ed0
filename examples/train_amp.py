"""A mixed-precision training loop with gpuopt.amp.GradScaler: fp16 autocast, the fused
unscale-and-clip, and a fused AdamW whose step gpuopt's scaler drives without host syncs."""

import argparse

import torch

from gpuopt.amp import GradScaler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--max-norm", type=float, default=1.0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("train_amp: no CUDA device, nothing to do")
        return
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 10)
    ).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scaler = GradScaler("cuda")
    inputs = torch.randn(4096, 512, device="cuda")
    labels = torch.randint(0, 10, (4096,), device="cuda")
    for step in range(args.steps):
        batch = torch.randint(0, inputs.shape[0], (256,), device="cuda")
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(inputs[batch]), labels[batch])
        scaler.scale(loss).backward()
        norm = scaler.unscale_and_clip_(optimizer, args.max_norm)  # a device tensor
        scaler.step(optimizer)
        scaler.update()
        if step % 10 == 0 or step == args.steps - 1:  # reading loss and norm syncs: only here
            print(f"step {step}: loss {loss.item():.4f} grad norm {norm.item():.3f} "
                  f"scale {scaler.get_scale():.0f}")


if __name__ == "__main__":
    main()
