"""A mixed-precision training loop on gpuopt's drop-ins: gpuopt.data.prefetch stages a torch
DataLoader's batches to the GPU ahead of the step, and gpuopt.amp.GradScaler unscales and clips
the gradients in one pass, feeding a fused AdamW with no host synchronisation."""

import argparse

import torch

from gpuopt.amp import GradScaler
from gpuopt.data import prefetch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-norm", type=float, default=1.0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("train_loop: no CUDA device, nothing to do")
        return
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(8192, 512), torch.randint(0, 10, (8192,)))
    loader = torch.utils.data.DataLoader(data, batch_size=256, shuffle=True, num_workers=2)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 10)
    ).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scaler = GradScaler("cuda")
    for epoch in range(args.epochs):
        for inputs, labels in prefetch(loader, "cuda"):  # CUDA tensors, ready on this stream
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(inputs), labels)
            scaler.scale(loss).backward()
            norm = scaler.unscale_and_clip_(optimizer, args.max_norm)  # a device tensor
            scaler.step(optimizer)
            scaler.update()
        # Reading loss and norm synchronises: once per epoch, not per step.
        print(f"epoch {epoch}: loss {loss.item():.4f} grad norm {norm.item():.3f} "
              f"scale {scaler.get_scale():.0f}")


if __name__ == "__main__":
    main()
