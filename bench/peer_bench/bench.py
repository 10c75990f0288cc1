#!/usr/bin/env python3
"""hack-run vs llama.cpp (llama-cpp-python, built from source) on the same token ids.

Measures, per thread count: decode tok/s (--decode-tokens after a short chat prompt, batch 1,
greedy), prompt tok/s and TTFT for each --prompt-lens, hack-run with --kv fp and --kv hack,
llama.cpp with flash attention off and on (f16 KV). Medians of --repeats; the repeats are
interleaved (every engine/config once, then again) so a change of machine load hits all alike.

Token ids come from llama.cpp's tokenizer (the GGUF's vocab); hack-run gets them through
--prompt-ids. The two tokenizers are compared on the same text, and the greedy continuations
of the two engines are compared token by token, as checks of the conversion.

Timing definitions follow hack-run's (src/backend/engine.cpp generate()):
  prompt tok/s = prompt tokens / (prefill of the whole prompt, logits of its last token)
  TTFT         = prefill + sampling the first token
  decode tok/s = (generated - 1) / (time from the first sampled token to the last)
hack-run is a fresh process per run (weights mmapped, first touch inside its first prefill);
llama.cpp loads the model once and each context gets one warm-up decode (as llama-cli does).
"""
import argparse
import ctypes
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import re

import numpy as np

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = REPO / "models" / "smollm2-135m-instruct"
QWEN = "qwen2.5-coder-1.5b-instruct"
# The Q4_K_M GGUF scripts/fetch-models.sh converts the Qwen directory from (the bf16 GGUF's metadata).
QWEN_SOURCE_GGUF = REPO / ".cache" / "models" / f"{QWEN}-q4_k_m.gguf"
USER_TURN = "<|im_start|>user\nExplain in a few paragraphs how a CPU cache works.<|im_end|>\n<|im_start|>assistant\n"
CHAT_PROMPTS = {  # each model's own default system prompt (both use ChatML)
    "smollm2": "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
    "qwen": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n",
}
# Text the long prompts are cut from (repeated if it is too short).
PROMPT_SOURCES = ["README.md", "bench/RESULTS.md"]


# ---------------------------------------------------------------- machine load

def loadavg_1m():
    return float(Path("/proc/loadavg").read_text().split()[0])


def wait_quiet(threshold, max_wait_s):
    """Waits up to max_wait_s for the 1-minute load average to fall below threshold."""
    t0 = time.time()
    load = loadavg_1m()
    while load >= threshold and time.time() - t0 < max_wait_s:
        print(f"[peer] load {load:.2f} >= {threshold}: waiting ({time.time() - t0:.0f}/{max_wait_s} s)", flush=True)
        time.sleep(min(15, max(1, max_wait_s - (time.time() - t0))))
        load = loadavg_1m()
    return {"loadavg_1m_at_start": load, "quiet": load < threshold, "waited_s": round(time.time() - t0, 1),
            "threshold": threshold}


class OtherCpu:
    """CPU time (in cores) used by processes other than this one and its children while a
    measurement ran: /proc/stat's busy time minus our own rusage."""

    @staticmethod
    def _busy_s():
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _ours_s():
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def __init__(self):
        self.samples = []

    def __enter__(self):
        self.t0, self.busy0, self.ours0 = time.time(), self._busy_s(), self._ours_s()
        return self

    def __exit__(self, *exc):
        wall = time.time() - self.t0
        if wall > 0.2:
            other = (self._busy_s() - self.busy0) - (self._ours_s() - self.ours0)
            self.samples.append(max(0.0, other / wall))

    def summary(self):
        s = sorted(self.samples)
        if not s:
            return {}
        return {"other_cores_median": round(statistics.median(s), 2), "other_cores_max": round(s[-1], 2),
                "other_cores_mean": round(sum(s) / len(s), 2)}


def cpu_info():
    """The CPU model name and which of the flags that pick hack's kernels it has."""
    text = Path("/proc/cpuinfo").read_text()
    model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    flags = set((re.search(r"^flags\s*:\s*(.*)$", text, re.M) or re.match("()", "")).group(1).split())
    wanted = ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16"]
    return {"model": model.group(1) if model else "?",
            "flags": " ".join(f"{f}{'+' if f in flags else '-'}" for f in wanted)}


# ---------------------------------------------------------------- models

def write_random_llama_1b(out_dir: Path):
    """An HF Llama dir of the llama-1b synthetic shape (Llama-3.2-1B config) with random bf16
    weights (GPT-2 init as in src/model/synthetic.cpp) and the SmolLM2 tokenizer files. Both
    engines load these same weights; only speed is meaningful."""
    import torch
    from safetensors.torch import save_file
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    h, ffn, layers, heads, kv_heads, hd, vocab = 2048, 8192, 16, 32, 8, 64, 128256
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
        "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": hd, "hidden_act": "silu", "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "vocab_size": vocab, "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
    }
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    for name in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        if (SMOLLM2 / name).exists():
            shutil.copy(SMOLLM2 / name, tmp / name)
    g = torch.Generator().manual_seed(42)
    std, out_std = 0.02, 0.02 / (2 * layers) ** 0.5

    def normal(shape, s, mean=0.0):
        return (torch.randn(shape, generator=g) * s + mean).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": normal((vocab, h), std), "model.norm.weight": normal((h,), 0.05, 1.0)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = normal((h,), 0.05, 1.0)
        tensors[p + "post_attention_layernorm.weight"] = normal((h,), 0.05, 1.0)
        tensors[p + "self_attn.q_proj.weight"] = normal((heads * hd, h), std)
        tensors[p + "self_attn.k_proj.weight"] = normal((kv_heads * hd, h), std)
        tensors[p + "self_attn.v_proj.weight"] = normal((kv_heads * hd, h), std)
        tensors[p + "self_attn.o_proj.weight"] = normal((h, heads * hd), out_std)
        tensors[p + "mlp.gate_proj.weight"] = normal((ffn, h), std)
        tensors[p + "mlp.up_proj.weight"] = normal((ffn, h), std)
        tensors[p + "mlp.down_proj.weight"] = normal((h, ffn), out_std)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tmp.rename(out_dir)


def gguf_from_source(source: Path, hf_dir: Path, gguf: Path, llama_src: Path):
    """bf16 GGUF with the HF directory's weights and the source GGUF's metadata (gguf_from_hf.py):
    for a model whose HF directory was itself converted from a GGUF (Qwen)."""
    if gguf.exists():
        return
    if not source.exists():
        sys.exit(f"no {source}: scripts/fetch-models.sh {QWEN} keeps it there (or pass --source-gguf)")
    gguf.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["nice", sys.executable, str(Path(__file__).with_name("gguf_from_hf.py")), "--source-gguf", str(source),
           "--hf-dir", str(hf_dir), "--out", str(gguf), "--gguf-py", str(llama_src / "gguf-py")]
    print("[peer] " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def decode_weight_bytes(hf_dir: Path):
    """Bytes of weights one decode step streams: all of them but the embedding table when the
    model has its own lm_head (a tied table is read whole as the output matrix)."""
    total, embed, untied = 0, 0, False
    for st in hf_dir.glob("model*.safetensors"):
        with open(st, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            n = t["data_offsets"][1] - t["data_offsets"][0]
            total += n
            embed += n if name == "model.embed_tokens.weight" else 0
            untied |= name == "lm_head.weight"
    return total - embed if untied else total


def convert_to_gguf(hf_dir: Path, gguf: Path, llama_src: Path):
    """bf16 GGUF by llama.cpp's own converter (it puts its gguf-py first on sys.path)."""
    if gguf.exists():
        return
    gguf.parent.mkdir(parents=True, exist_ok=True)
    tmp = gguf.with_suffix(".tmp.gguf")
    cmd = [sys.executable, str(llama_src / "convert_hf_to_gguf.py"), "--outtype", "bf16", "--outfile", str(tmp),
           str(hf_dir)]
    log = gguf.with_suffix(".convert.log")
    print("[peer] " + " ".join(cmd) + f" > {log}", flush=True)
    with open(log, "w") as f:
        subprocess.run(["nice"] + cmd, check=True, stdout=f, stderr=subprocess.STDOUT)
    tmp.rename(gguf)


# ---------------------------------------------------------------- llama.cpp

class LlamaCpp:
    def __init__(self, gguf: Path):
        import llama_cpp as L
        self.L = L
        self._log_cb = L.llama_log_callback(lambda level, text, user: None)  # keep a reference
        L.llama_log_set(self._log_cb, ctypes.c_void_p(0))
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = L.llama_model_load_from_file(str(gguf).encode(), mp)
        assert self.model, f"llama.cpp could not load {gguf}"
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.ctx = None

    def tokenize(self, text: str, special: bool):
        n_max = len(text.encode()) + 16
        buf = (self.L.llama_token * n_max)()
        n = self.L.llama_tokenize(self.vocab, text.encode(), len(text.encode()), buf, n_max, False, special)
        assert n >= 0
        return list(buf[:n])

    def new_context(self, threads: int, flash_attn: bool, n_ctx: int, n_seqs: int = 1):
        """n_ctx: cells per sequence; with n_seqs > 1 each sequence gets its own n_ctx cells."""
        L = self.L
        self.free_context()
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx * n_seqs
        cp.n_batch = 2048  # llama.cpp's defaults: the whole prompt in one llama_decode,
        cp.n_ubatch = 512  # computed in ubatches of 512
        cp.n_seq_max = n_seqs
        cp.kv_unified = False  # a KV stream per sequence, as llama-batched-bench's default
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.type_k = cp.type_v = 1  # GGML_TYPE_F16
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        assert self.ctx, "llama.cpp could not create a context"
        self.mem = L.llama_get_memory(self.ctx)
        self._eval([1, 2])  # warm-up, as llama-cli's common_init does
        L.llama_memory_clear(self.mem, True)

    def free_context(self):
        if self.ctx:
            self.L.llama_free(self.ctx)
            self.ctx = None

    def _eval(self, ids):
        arr = (self.L.llama_token * len(ids))(*ids)
        rc = self.L.llama_decode(self.ctx, self.L.llama_batch_get_one(arr, len(ids)))
        assert rc == 0, f"llama_decode returned {rc}"

    def _argmax(self, i=-1):
        logits = np.ctypeslib.as_array(self.L.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))
        return int(logits.argmax())

    def generate(self, prompt, max_tokens):
        """Greedy; returns (ids, timing) with hack-run's timing fields."""
        self.L.llama_memory_clear(self.mem, True)
        t0 = time.perf_counter()
        self._eval(prompt)
        t_prefilled = time.perf_counter()
        ids = [self._argmax()]
        t_first = time.perf_counter()
        while len(ids) < max_tokens:
            self._eval([ids[-1]])
            ids.append(self._argmax())
        t_end = time.perf_counter()
        prefill_s = t_prefilled - t0
        decode_s = t_end - t_first
        return ids, {"prefill_s": prefill_s, "ttft_s": t_first - t0, "decode_s": decode_s,
                     "prefill_tok_s": len(prompt) / prefill_s,
                     "decode_tok_s": (len(ids) - 1) / decode_s if len(ids) > 1 else 0.0}


    def generate_batch(self, prompt, n_seqs, max_tokens):
        """n_seqs greedy sequences of the same prompt decoded together through llama.cpp's batch
        API (one llama_batch of n_seqs tokens per step, logits for each); the prompts are
        prefilled one sequence at a time. Timing as decode_bench's: one untimed warm-up step,
        then max_tokens - 1 steps; decode tok/s = n_seqs * steps / their time."""
        L = self.L
        L.llama_memory_clear(self.mem, True)
        batch = L.llama_batch_init(max(len(prompt), n_seqs), 0, 1)
        try:
            def run(entries):  # [(token, position, sequence, wants logits)]
                batch.n_tokens = len(entries)
                for i, (tok, pos, seq, out) in enumerate(entries):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
                    batch.seq_id[i][0], batch.logits[i] = seq, 1 if out else 0
                rc = L.llama_decode(self.ctx, batch)
                assert rc == 0, f"llama_decode returned {rc}"

            t0 = time.perf_counter()
            nxt = []
            for s in range(n_seqs):
                run([(tok, pos, s, pos == len(prompt) - 1) for pos, tok in enumerate(prompt)])
                nxt.append(self._argmax())
            prefill_s = time.perf_counter() - t0

            def step(k):
                run([(nxt[s], len(prompt) + k, s, True) for s in range(n_seqs)])
                for s in range(n_seqs):
                    nxt[s] = self._argmax(s)

            step(0)  # warm-up
            t1 = time.perf_counter()
            for k in range(1, max_tokens):
                step(k)
            decode_s = time.perf_counter() - t1
        finally:
            L.llama_batch_free(batch)
        steps = max_tokens - 1
        return {"prefill_s": prefill_s, "ttft_s": prefill_s, "decode_s": decode_s,
                "prefill_tok_s": n_seqs * len(prompt) / prefill_s, "decode_tok_s": n_seqs * steps / decode_s}


# ---------------------------------------------------------------- hack-run

def hack_run(hack_bin: Path, model_dir: Path, prompt, max_tokens, threads, kv):
    """kv: a --kv mode, optionally "+bf16" for --matmul-precision bf16 (fp+bf16)."""
    mode, _, precision = kv.partition("+")
    cmd = [str(hack_bin), "--model", str(model_dir), "--prompt-ids", ",".join(map(str, prompt)), "--json",
           "--threads", str(threads), "--kv", mode, "--max-tokens", str(max_tokens), "--temperature", "0",
           "--ignore-eos", "--max-model-len", str(len(prompt) + max_tokens),
           "--matmul-precision", precision or "fp32"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"hack-run failed ({p.returncode}): {p.stderr[-2000:]}")
    out = json.loads(p.stdout)
    assert out["prompt_ids"] == list(prompt)
    # The CPU path its kernels took, from the summary line ("... | cpu, 2 threads, isa avx512bf16, ...").
    isa = re.search(r"\bisa (\S+?),", p.stderr)
    return out["ids"], {**out["timing"], "isa": isa.group(1) if isa else "?"}


def hack_batch(decode_bench: Path, model_dir: Path, prompt_tokens, n_seqs, max_tokens, threads, kv):
    """n_seqs sequences decoded together by bench/decode_bench (the engine hack-run and the
    decode node run; random prompt ids of the same length, fixed next tokens: speed only)."""
    mode, _, precision = kv.partition("+")
    cmd = [str(decode_bench), "--model", str(model_dir), "--threads", str(threads), "--batch", str(n_seqs),
           "--prompt-tokens", str(prompt_tokens), "--decode-tokens", str(max_tokens), "--json", "--kv", mode,
           "--kv-dtype", "bf16", "--matmul-precision", precision or "fp32"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"decode_bench failed ({p.returncode}): {p.stderr[-2000:]}")
    r = json.loads(p.stdout)[0]
    prefill_s = n_seqs * prompt_tokens / r["prefill_tok_s"]
    return {"prefill_s": prefill_s, "ttft_s": prefill_s, "decode_s": r["decode_step_ms"] * 1e-3 * (max_tokens - 1),
            "prefill_tok_s": r["prefill_tok_s"], "decode_tok_s": r["decode_tok_s"]}


def hack_tokenize(tokenize_bin: Path, model_dir: Path, text: str):
    """hack's tokenizer (hack-tokenize, no BOS/EOS added; special tokens in the text are matched)."""
    # Through a file: the text outgrows one argument's limit (128 KiB) as RESULTS.md grows.
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write(text)
        f.flush()
        p = subprocess.run([str(tokenize_bin), "--tokenizer", str(model_dir), "--text-file", f.name, "--json"],
                           capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"hack-tokenize failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout)


# ---------------------------------------------------------------- main

def progress(engine, cfg, t, kind, n, timing):
    print(f"[peer]   {engine} {cfg} {t}t {kind} {n}: prompt {timing['prefill_tok_s']:.1f} tok/s, TTFT "
          f"{timing['ttft_s'] * 1e3:.1f} ms, decode {timing['decode_tok_s']:.1f} tok/s (load {loadavg_1m():.2f})",
          flush=True)


def median_timing(runs):
    keys = [k for k in runs[0].keys() if k != "isa"]
    return {k: statistics.median(r[k] for r in runs) for k in keys}


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--llama-src", required=True, help="llama.cpp source (convert_hf_to_gguf.py, gguf-py)")
    ap.add_argument("--model", default="smollm2",
                    help=f"smollm2 | 1b (llama-1b shape, random bf16 weights) | qwen ({QWEN}, models/{QWEN})")
    ap.add_argument("--source-gguf", default=str(QWEN_SOURCE_GGUF),
                    help="qwen: the GGUF models/%(default)s was converted from (metadata of the bf16 GGUF)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--prompt-lens", default="512,2048")
    ap.add_argument("--batch", type=int, default=8,
                    help="also decode this many sequences together (llama.cpp's batch API vs decode_bench); 0: skip")
    ap.add_argument("--kv", default="fp,hack,fp+bf16",
                    help="hack-run --kv modes; MODE+bf16 adds --matmul-precision bf16 (llama.cpp's prefill arithmetic)")
    ap.add_argument("--flash-attn", default="off,on", help="llama.cpp flash attention modes")
    ap.add_argument("--quiet-load", type=float, default=0.5, help="wait for the 1-min load average below this")
    ap.add_argument("--quiet-wait-s", type=float, default=300, help="... for at most this long, then run anyway")
    ap.add_argument("--out", default="", help="JSON results (default: BUILD/peer/results-MODEL-TIME.json)")
    a = ap.parse_args()

    build = Path(a.build_dir).resolve()
    peer = build / "peer"
    hack_bin = build / "bin" / "hack-run"
    llama_src = Path(a.llama_src).resolve()
    chat_prompt = CHAT_PROMPTS["qwen" if a.model in ("qwen", QWEN) else "smollm2"] + USER_TURN
    if a.model == "smollm2":
        hf_dir, name = SMOLLM2, "smollm2-135m-instruct"
    elif a.model in ("qwen", QWEN):
        hf_dir, name = REPO / "models" / QWEN, QWEN
        if not (hf_dir / "config.json").exists():
            sys.exit(f"no {hf_dir}: scripts/fetch-models.sh {QWEN}")
    elif a.model == "1b":
        name = "llama-1b-random"
        hf_dir = peer / "models" / name
        if not hf_dir.exists():
            print(f"[peer] writing {hf_dir} (random bf16 weights, llama-1b shape)", flush=True)
            write_random_llama_1b(hf_dir)
    else:
        sys.exit(f"--model: smollm2, 1b or qwen, got {a.model}")
    gguf = peer / "gguf" / f"{name}-bf16.gguf"
    if name == QWEN:
        gguf_from_source(Path(a.source_gguf), hf_dir, gguf, llama_src)
    else:
        convert_to_gguf(hf_dir, gguf, llama_src)
    weight_bytes = decode_weight_bytes(hf_dir)

    threads = [int(t) for t in a.threads.split(",")]
    prompt_lens = [int(n) for n in a.prompt_lens.split(",") if n]
    kvs = [k for k in a.kv.split(",") if k]
    fas = [f == "on" for f in a.flash_attn.split(",") if f]

    import llama_cpp
    llm = LlamaCpp(gguf)

    # Token ids, from llama.cpp's tokenizer; hack's tokenizer must agree on the same text.
    text = "\n".join((REPO / p).read_text() for p in PROMPT_SOURCES)
    long_ids = llm.tokenize(text, special=False)
    chat_ids = llm.tokenize(chat_prompt, special=True)
    tokenize_bin = build / "bin" / "hack-tokenize"
    long_hack, chat_hack = hack_tokenize(tokenize_bin, hf_dir, text), hack_tokenize(tokenize_bin, hf_dir, chat_prompt)
    tokenizer_check = {"text_chars": len(text), "text_ids_llama": len(long_ids), "text_ids_hack": len(long_hack),
                       "text_identical": long_ids == long_hack, "text_common_prefix": common_prefix(long_ids, long_hack),
                       "chat_ids": len(chat_ids), "chat_identical": chat_ids == chat_hack}
    print(f"[peer] tokenizers: {len(text)} chars of text -> llama.cpp {len(long_ids)} ids, hack {len(long_hack)} ids, "
          f"identical={long_ids == long_hack}; chat prompt ({len(chat_ids)} ids) identical={chat_ids == chat_hack}",
          flush=True)
    while len(long_ids) < max(prompt_lens, default=0):
        long_ids += long_ids
    n_ctx = (max(prompt_lens + [len(chat_ids) + a.decode_tokens]) + 255) // 256 * 256

    # (kind, n_prompt): decode runs the chat prompt for decode_tokens; prompt runs sample 1 token;
    # batch decodes a.batch sequences of the chat prompt's length together for decode_tokens.
    workloads = [("decode", len(chat_ids))] + [("prompt", n) for n in prompt_lens]
    if a.batch > 0:
        workloads.append(("batch", len(chat_ids)))

    def prompt_of(kind, n):
        return chat_ids if kind == "decode" else long_ids[:n]

    def max_tokens_of(kind):
        return 1 if kind == "prompt" else a.decode_tokens

    cpu = cpu_info()
    quiet = wait_quiet(a.quiet_load, a.quiet_wait_s)
    print(f"[peer] load {quiet['loadavg_1m_at_start']:.2f} at start (quiet={quiet['quiet']}, waited "
          f"{quiet['waited_s']} s)", flush=True)
    # The bound for decode: membw's read bandwidth at each thread count, measured in this run.
    membw = {r["threads"]: r["read_gbs"] for r in json.loads(subprocess.run(
        [str(build / "bin" / "membw"), "--threads", str(max(threads)), "--mib", "512", "--json"],
        capture_output=True, text=True, check=True).stdout)}
    print(f"[peer] membw read GB/s: {membw}", flush=True)
    other = OtherCpu()
    loads = []
    runs = {}  # (engine, config, threads, kind, n) -> [timing]
    outputs = {}  # (engine, config, threads) -> greedy ids of the decode workload (first repeat)
    started = datetime.datetime.now(datetime.timezone.utc)
    def report(reps_done):
        """Prints the table and writes the JSON (after every repeat, so an interrupted run keeps what it measured)."""
        # Greedy agreement: every engine/config against llama.cpp (fa off where it ran, else fa on)
        # at the same thread count.
        agreement = []
        ref_cfg = "fa off" if False in fas else "fa on"
        for (engine, cfg, t), ids in sorted(outputs.items()):
            ref = outputs.get(("llama.cpp", ref_cfg, t))
            if ref is not None and (engine, cfg) != ("llama.cpp", ref_cfg):
                agreement.append({"engine": engine, "config": cfg, "threads": t, "vs": f"llama.cpp {ref_cfg}",
                                  "common_prefix": common_prefix(ids, ref), "of": len(ref)})

        results = []
        for (engine, cfg, t, kind, n), rs in runs.items():
            med = median_timing(rs)
            results.append({"engine": engine, "config": cfg, "threads": t, "workload": kind, "prompt_tokens": n,
                            "max_tokens": max_tokens_of(kind), "median": med, "runs": rs})

        def get(engine, cfg, t, kind, n, key):
            for r in results:
                if (r["engine"], r["config"], r["threads"], r["workload"], r["prompt_tokens"]) == (engine, cfg, t, kind, n):
                    return r["median"][key]
            return None

        cols = [("hack", f"kv {kv}") for kv in kvs] + [("llama.cpp", f"fa {'on' if fa else 'off'}") for fa in fas]
        ref_col = ("llama.cpp", "fa on") if True in fas else cols[-1]
        header = ["metric", "thr"] + [f"{e} {c}" for e, c in cols] + [f"{c}/{ref_col[1]}" for e, c in cols
                                                                       if e == "hack"]
        rows = []
        for t in threads:
            for kind, n in workloads:
                metrics = {"decode": [("decode tok/s", "decode_tok_s", 1)],
                           "batch": [(f"batch-{a.batch} decode tok/s", "decode_tok_s", 1)],
                           "prompt": [(f"prompt {n} tok/s", "prefill_tok_s", 1), (f"TTFT {n} ms", "ttft_s", 1e3)]}[kind]
                for label, key, scale in metrics:
                    vals = {c: get(c[0], c[1], t, kind, n, key) for c in cols}
                    row = [label, str(t)] + [f"{vals[c] * scale:.1f}" for c in cols]
                    ref = vals[ref_col]
                    for c in cols:
                        if c[0] == "hack":
                            # Speed ratio: > 1 means hack-run is faster (for TTFT: llama's time / ours).
                            r = (vals[c] / ref) if key != "ttft_s" else (ref / vals[c])
                            row.append(f"{r:.2f}x")
                    rows.append(row)
                if kind == "decode":
                    vals = [get(c[0], c[1], t, kind, n, "decode_tok_s") for c in cols]
                    rows.append(["  weights GB/s", str(t)] + [f"{v * weight_bytes / 1e9:.1f}" for v in vals] +
                                [""] * (len(header) - 2 - len(cols)))
                    rows.append([f"  of membw {membw[t]:.1f} GB/s", str(t)] +
                                [f"{v * weight_bytes / 1e9 / membw[t]:.0%}" for v in vals] +
                                [""] * (len(header) - 2 - len(cols)))
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        lines = ["  ".join(h.ljust(widths[i]) if i == 0 else h.rjust(widths[i]) for i, h in enumerate(header))]
        for r in rows:
            lines.append("  ".join(v.ljust(widths[i]) if i == 0 else v.rjust(widths[i]) for i, v in enumerate(r)))
        table = "\n".join(lines)

        load_summary = {**quiet, "loadavg_1m_during": {"min": min(loads), "median": statistics.median(loads),
                                                       "max": max(loads)}, **other.summary()}
        print()
        isas = sorted({r.get("isa", "?") for k, rs in runs.items() if k[0] == "hack" for r in rs if "isa" in r})
        print(f"machine: {cpu['model']}; {cpu['flags']}; hack-run's CPU path (isa): {', '.join(isas) or '-'}")
        print(f"model {name} ({weight_bytes / 1e6:.0f} MB of bf16 weights read per decode token), decode after a {len(chat_ids)}-token chat "
              f"prompt for {a.decode_tokens} tokens, medians of {reps_done} (of {a.repeats}); ratio = hack / llama.cpp {ref_col[1]}")
        print(table)
        print()
        print(f"load: 1-min loadavg {quiet['loadavg_1m_at_start']:.2f} at start (quiet={quiet['quiet']}), during "
              f"{load_summary['loadavg_1m_during']['min']:.2f}..{load_summary['loadavg_1m_during']['max']:.2f} (includes "
              f"this benchmark); other processes used {load_summary.get('other_cores_median', 0):.2f} cores median, "
              f"{load_summary.get('other_cores_max', 0):.2f} max of {os.cpu_count()}")
        print(f"tokenizers (llama.cpp vs hack): {len(text)}-char text identical={tokenizer_check['text_identical']}, "
              f"chat prompt identical={tokenizer_check['chat_identical']}")
        for g in agreement:
            print(f"greedy: {g['engine']} {g['config']} {g['threads']}t agrees with {g['vs']} on the first "
                  f"{g['common_prefix']}/{g['of']} tokens")

        out = {
            "date": started.isoformat(timespec="seconds"), "model": name, "hf_dir": str(hf_dir), "gguf": str(gguf),
            "weight_bytes": weight_bytes, "cpu": cpu, "hack_isa": isas, "llama_cpp_python": llama_cpp.__version__,
            "hack_commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                          text=True).stdout.strip(),
            "cpu_count": os.cpu_count(), "threads": threads, "repeats": a.repeats, "repeats_done": reps_done, "decode_tokens": a.decode_tokens,
            "chat_prompt_tokens": len(chat_ids), "prompt_lens": prompt_lens, "token_ids_from": "llama.cpp tokenizer",
            "tokenizer_check": tokenizer_check, "membw_read_gbs": membw, "greedy_agreement": agreement, "load": load_summary,
            "table": table, "results": results,
        }
        out_path = Path(a.out) if a.out else peer / f"results-{name}-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(out, indent=1))
        print(f"[peer] wrote {out_path}")

    for rep in range(a.repeats):
        for t in threads:
            for kv in kvs:
                for kind, n in workloads:
                    loads.append(loadavg_1m())
                    with other:
                        if kind == "batch":
                            ids, timing = None, hack_batch(build / "bin" / "decode_bench", hf_dir, n, a.batch,
                                                           max_tokens_of(kind), t, kv)
                        else:
                            ids, timing = hack_run(hack_bin, hf_dir, prompt_of(kind, n), max_tokens_of(kind), t, kv)
                    runs.setdefault(("hack", f"kv {kv}", t, kind, n), []).append(timing)
                    progress("hack", f"kv {kv}", t, kind, n, timing)
                    if kind == "decode" and rep == 0:
                        outputs[("hack", f"kv {kv}", t)] = ids
            for fa in fas:
                cfg = f"fa {'on' if fa else 'off'}"
                llm.new_context(t, fa, n_ctx)
                for kind, n in workloads:
                    if kind == "batch":
                        continue  # in a context of a.batch sequences, below
                    loads.append(loadavg_1m())
                    with other:
                        ids, timing = llm.generate(prompt_of(kind, n), max_tokens_of(kind))
                    runs.setdefault(("llama.cpp", cfg, t, kind, n), []).append(timing)
                    progress("llama.cpp", cfg, t, kind, n, timing)
                    if kind == "decode" and rep == 0:
                        outputs[("llama.cpp", cfg, t)] = ids
                llm.free_context()
                if a.batch > 0:
                    llm.new_context(t, fa, n_ctx, a.batch)
                    loads.append(loadavg_1m())
                    with other:
                        timing = llm.generate_batch(chat_ids, a.batch, a.decode_tokens)
                    runs.setdefault(("llama.cpp", cfg, t, "batch", len(chat_ids)), []).append(timing)
                    progress("llama.cpp", cfg, t, "batch", len(chat_ids), timing)
                    llm.free_context()
        print(f"[peer] repeat {rep + 1}/{a.repeats} done (load {loadavg_1m():.2f})", flush=True)

        report(rep + 1)

    llm.free_context()


if __name__ == "__main__":
    main()
