"""Steps of real workloads on one GPU, for agent-cost.sh: prints one RESULT line per pattern.

Patterns (PATTERNS, comma list): `eager` (600 tiny elementwise kernels then a synchronisation: a
launch-bound loop, as eager PyTorch code is), `gpt2` (a GPT-2 124M training step, bf16, batch
8 x 512, random weights: nothing is downloaded). MEASURE_SECS per pattern (default 8), LABEL names
the run.
"""
import os, time
import torch

MEASURE_SECS = float(os.environ.get("MEASURE_SECS", 8))
LABEL = os.environ.get("LABEL", "run")
dev = "cuda"


def measure(step, warmup=5):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < MEASURE_SECS:
        step()
        n += 1
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1000, n


def eager():
    x = torch.zeros(256, device=dev)

    def step():
        y = x
        for _ in range(600):
            y = y + 1.0
        torch.cuda.synchronize()

    return measure(step)


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).to(dev, dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 50257, (8, 512), device=dev)

    def step():
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()

    return measure(step, warmup=3)


for pattern in os.environ.get("PATTERNS", "eager,gpt2").split(","):
    ms, n = {"eager": eager, "gpt2": gpt2}[pattern]()
    print(f"RESULT {LABEL} {pattern} {ms:.3f} ms/step ({n} steps)", flush=True)
