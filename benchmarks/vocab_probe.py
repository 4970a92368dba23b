"""Times the output layer's matmuls (forward and both backward products) with the GPT-2 vocabulary of 50257
rows and with it padded to 50304, a multiple of 64, on the GPU: does an odd row count cost speed?"""
import torch
import torch.nn.functional as F


def time_ms(fn, reps=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


tokens, d_model = 16 * 1024, 2048
x = torch.randn(tokens, d_model, device="cuda", dtype=torch.bfloat16, requires_grad=True)
for vocab in (50257, 50304):
    w = torch.randn(vocab, d_model, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(lambda: F.linear(x, w).backward(grad))
    print(f"vocab {vocab}: forward+backward of the output layer {ms:.2f} ms, "
          f"{3 * 2 * tokens * d_model * vocab / ms / 1e9:.0f} TFLOP/s")
