#!/usr/bin/env python3
"""The peer of cuda_attention_bench: PyTorch's scaled_dot_product_attention on the same
decode shapes (one query token per sequence, bf16 K/V of `context` tokens, GQA), on the
flash backend where it takes the shape, else the backend PyTorch picks (reported).

Layers are cycled so that the K/V read per call is not served from L2; time per call is the
median over trials of CUDA-event time / calls; GB/s counts K, V (and q, out) once.

  python3 bench/cuda/sdpa_bench.py --contexts 4096,32768 --batch 1,8
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def copy_gbs():
    a = torch.randn(1 << 29, device="cuda", dtype=torch.float32)  # 2 GiB
    b = torch.empty_like(a)
    return 2 * a.numel() * 4 / (median_us(lambda i: b.copy_(a), 4, 7) * 1e3)


def median_us(fn, calls, trials):
    for i in range(calls):
        fn(i)
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for i in range(calls):
            fn(i)
        e.record()
        e.synchronize()
        times.append(1e3 * s.elapsed_time(e) / calls)
    times.sort()
    return times[len(times) // 2]


def run(ctx, batch, args, l2_bytes):
    h, d, g = args.kv_heads, args.head_dim, args.group
    layer_bytes = batch * ctx * h * d * 2 * 2
    layers = max(1, min(64, math.ceil(8 * l2_bytes / layer_bytes)))
    kv = [(torch.randn(batch, h, ctx, d, device="cuda", dtype=torch.bfloat16),
           torch.randn(batch, h, ctx, d, device="cuda", dtype=torch.bfloat16)) for _ in range(layers)]
    q = torch.randn(batch, h * g, 1, d, device="cuda", dtype=torch.bfloat16)
    results = {}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, kv[0][0], kv[0][1], enable_gqa=True)
                us = median_us(lambda i: F.scaled_dot_product_attention(q, kv[i % layers][0], kv[i % layers][1],
                                                                        enable_gqa=True), layers * 4, args.trials)
            results[name] = us
        except RuntimeError as e:
            results[name] = None
            results[name + "_error"] = str(e).splitlines()[0][:120]
    nbytes = layer_bytes + 2 * q.numel() * 2
    return layers, nbytes, results


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", default="4096,8192,32768,65536,131072")
    p.add_argument("--batch", default="1,8,32,64")
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--trials", type=int, default=7)
    p.add_argument("--max-gb", type=float, default=24.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    prop = torch.cuda.get_device_properties(0)
    l2 = getattr(prop, "L2_cache_size", 50 << 20)
    bw = copy_gbs()
    print(f"# {prop.name}, torch {torch.__version__}; device-to-device copy {bw:.0f} GB/s (read + written)")
    print(f"{'context':>7} {'batch':>5} {'backend':>9} {'us/call':>9} {'GB/s':>7} {'%copy':>6}")
    for ctx in map(int, args.contexts.split(",")):
        for batch in map(int, args.batch.split(",")):
            gb = batch * ctx * args.kv_heads * args.head_dim * 4 / 1e9
            if gb > args.max_gb:
                print(f"# skip ctx {ctx} batch {batch}: {gb:.1f} GB > --max-gb")
                continue
            layers, nbytes, res = run(ctx, batch, args, l2)
            for name in ("flash", "efficient", "cudnn"):
                us = res.get(name)
                if args.json:
                    print(json.dumps({"device": prop.name, "peer": "sdpa-" + name, "context": ctx, "batch": batch,
                                      "layers": layers, "us": us, "bytes": nbytes, "copy_gbs": bw,
                                      "error": res.get(name + "_error")}))
                elif us is None:
                    print(f"{ctx:7d} {batch:5d} {name:>9} {'-':>9}  ({res.get(name + '_error')})")
                else:
                    gbs = nbytes / (us * 1e3)
                    print(f"{ctx:7d} {batch:5d} {name:>9} {us:9.1f} {gbs:7.0f} {100 * gbs / bw:5.0f}%")
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
