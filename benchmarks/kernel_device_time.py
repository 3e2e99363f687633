"""Device time of the Triton log-prob pass from given logits (8192 rows, bf16), by the profiler.

``benchmarks/kernels_gpu.py`` times one call with CUDA events, which also counts the host's time
before the kernel starts (Python, the autograd function, Triton's launcher: about 0.5 ms a call).
Here the profiler sums the kernels' own time over 10 calls: the stats kernel alone and every kernel
of the pass, each as a share of one read of the logits at the data sheet's HBM bandwidth.

    python benchmarks/kernel_device_time.py 49152 128256 151936    # vocabularies; CUDA only
"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from nemo_azr.kernels import token_logprobs

HBM_BYTES_PER_S = 4.8e12  # H200 data sheet (benchmarks/kernels_gpu.py has the table by device)
CALLS = 10


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("kernel_device_time.py measures CUDA kernels; no GPU here")
    for vocab in [int(v) for v in sys.argv[1:]] or [49152, 128256, 151936]:
        z = torch.randn(8192, vocab, device="cuda", dtype=torch.bfloat16)
        t = torch.randint(0, vocab, (8192,), device="cuda")
        for _ in range(3):  # compile and warm up
            token_logprobs(z, t, backend="triton")
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(CALLS):
                token_logprobs(z, t, backend="triton")
            torch.cuda.synchronize()
        events = prof.key_averages()
        by_key = {e.key: e for e in events}
        stats = by_key["_stats_kernel"].self_device_time_total / CALLS / 1e6
        every = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA") / CALLS / 1e6
        host = by_key["_TokenLogprobs"].cpu_time_total / CALLS / 1e6
        read = z.numel() * z.element_size() / HBM_BYTES_PER_S
        print(
            f"{vocab} stats kernel {stats * 1e3:.4f} ms = {100 * read / stats:.1f}% roofline; "
            f"all kernels {every * 1e3:.4f} ms = {100 * read / every:.1f}%; host per call {host * 1e3:.3f} ms",
            flush=True,
        )
        del z, t
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
