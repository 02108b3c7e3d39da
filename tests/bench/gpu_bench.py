"""Training speed on one GPU: ftk-train --device cuda against PyTorch + transformers, same
GPU, same run, same shape, batch and optimizer.

Rows: for each shape, PyTorch's LlamaForCausalLM (bf16 weights, SDPA attention, fused
AdamW, activation checkpointing; torch.compile as a second row where it works) and
ftk-train on the same packed Alpaca rows of MAXLEN tokens. Each row prints tokens/s, MFU
(6 * params * tokens / time / the bf16 matmul peak measured here first) and peak GPU
memory, then the ratio ftk / PyTorch eager. Also the device-to-device copy bandwidth
(the ceiling of the memory-bound kernels).

Shapes: llama-1b and llama2-7b; both sides in bf16-true (PyTorch: model.to(bfloat16) and
AdamW on bf16 parameters; ftk: --precision bf16-true, 8 bytes per parameter, which the
memory plan puts at 59.5 GB for 7B at micro-batch 4 × 512 with --recompute).

usage: gpu_bench.py BIN DATA WORK [--shapes llama-1b,llama2-7b] [--steps N] [--micro-batch B] [--no-compile]
                   [--attn cudnn,mma] [--recompute auto] [--profile] [--time-limit S]
       gpu_bench.py BIN DATA WORK --alpaca1024 [--attn mma] [--recompute auto]   (the Alpaca1024 epoch,
                   ftk only: wall time)
--attn: one ftk row (or epoch) for each FTK_CUDA_ATTN value listed (default: ftk's own choice);
       cudnn runs with FTK_CUDNN_STRICT=1, so a fallback to the flash kernels fails the row
       instead of being reported under cuDNN's name. Per shape the rows run in the order: the
       first attention, PyTorch eager, the other attentions (the ratio lands second).
--recompute: ftk-train's --recompute for every ftk row and the epoch (default auto: the least
       recompute whose memory plan fits the device).
--profile: after the timed rows (which never run under FTK_PROFILE: its events cost time), one
       more ftk row with FTK_PROFILE (kernels/prof.h: a pair of timer events around every op,
       read once a step) with the fastest attention, which prints where its steps' time went,
       per op and per shape; the PyTorch eager row runs one more step under torch.profiler and
       prints its kernels by time. Each only while --time-limit leaves room for it.
--time-limit S: the seconds this run may take (the bundle's step limit): a row beyond the
       headline (the profiled ones, the cat of the weights file) starts only when the time left
       exceeds what the longest ftk row took, with a margin.
       gpu_bench.py BIN DATA WORK --cpu-smoke   (a tiny shape on the CPU: checks the script)
Every ftk run is planned first (ftk-train --plan with the same options): each row and the
epoch print the plan's total beside the backend's high-water mark (metrics.jsonl's
mem_peak_bytes) and the device memory the ftk-train process added (nvidia-smi, polled every
0.5 s: per process where the driver lists it, else the device's used memory over its level
before the run; between polls a peak can be missed), and ftk's own view of the driver on cuda
(metrics.jsonl's mem_device_peak_bytes, its cudaMalloc pages at their peak, plus
mem_device_other_bytes, what the device held beside them at start: the plan's total counts the
first and, for its own context, the second).
A row that runs out of device memory under --recompute auto (the plan fell short) is run
again with --recompute block, where time is left; the failed row stays in the table.
--emulated: BIN's ftk-train runs on the host emulation of CUDA (tests/gpu/emu; the GPU bundle's
       rehearsal, tests/gpu/bundle/run.sh): ftk rows only, PyTorch is not imported, tiny shapes
       (--alpaca1024: the smoke shape, 4 records in rows of 128); the figures mean nothing.
--goals FILE: the goal figures as they land, one "KEY<tab>VALUE" line each (the last of a key
       counts): 7b_mfu, 7b_ratio, peak_7b, plan_7b (llama2-7b, or the emulated shape), 7b_attn_order
       (the FTK_CUDA_ATTN values of the ftk rows, fastest first: the bundle's epoch takes the
       first whose correctness step passed), epoch_steps,
       epoch_wall, epoch_load (the weights' read speed, against cat's), peak_epoch, plan_epoch.
Each row is printed as it lands (a run killed halfway keeps what it measured). Exit 0 with
figures, 1 when an ftk run failed, 77 when skipped (no GPU, no PyTorch, no data: it says why).
The Alpaca1024 epoch: Llama-2-7B (random weights of its shape), the first 1024 records of
the largest Alpaca file in DATA packed into rows of 512, one epoch in bf16-true with
ftk-train's defaults (LitGPT's: global batch 64, micro-batch 4), no checkpoint; prints the
wall time of the ftk-train process (loading the weights included) and of the steps, and the
weights' read speed (ftk-train's "weights loaded in" line) against `cat FILE > /dev/null` of
the same file just after (a warm cache, as the run left it; when --time-limit leaves room).
No run writes a checkpoint (--no-save: a 7B checkpoint would not fit the GPU machine's disk).
DATA holds llama2-tokenizer/tokenizer.model and alpaca/*.json (../shared/data's layout).
"""
import argparse, contextlib, glob, json, os, re, subprocess, sys, threading, time
from reuse import reuse  # tests/bench/reuse.py, beside this script

ap = argparse.ArgumentParser()
ap.add_argument("bin")
ap.add_argument("data")
ap.add_argument("work")
ap.add_argument("--shapes", default="llama-1b,llama2-7b")
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--micro-batch", type=int, default=8)
ap.add_argument("--maxlen", type=int, default=512)
ap.add_argument("--cpu-smoke", action="store_true")
ap.add_argument("--no-compile", action="store_true")
ap.add_argument("--alpaca1024", action="store_true")
ap.add_argument("--attn", default="", help="FTK_CUDA_ATTN values, comma-separated: an ftk row or epoch each")
ap.add_argument("--profile", action="store_true", help="ftk rows with FTK_PROFILE: their per-op times printed")
ap.add_argument("--emulated", action="store_true", help="ftk on the host emulation of CUDA: ftk rows only")
ap.add_argument("--goals", default="", help="append the goal figures to this file as KEY<tab>VALUE lines")
ap.add_argument("--recompute", default="auto", help="ftk-train's --recompute: auto (default), none, norms or block")
ap.add_argument("--time-limit", type=float, default=0, help="seconds this run may take: optional rows only with room left")
a = ap.parse_args()
T_START = time.time()


def time_left():
    """Seconds left of --time-limit (infinite without one)."""
    return a.time_limit - (time.time() - T_START) if a.time_limit > 0 else float("inf")


def room_for(seconds):
    """Whether an optional part expected to take this long fits what is left, with a margin."""
    return time_left() > 1.2 * seconds + 10
os.makedirs(a.work, exist_ok=True)
dev = "cpu" if a.cpu_smoke else "cuda"


def skip(why):
    """Nothing measured: say why and exit 77 (never 0: no figures is not a pass)."""
    print(f"gpu bench: skipped ({why})", flush=True)
    sys.exit(77)


def goal(key, value, raw=False):
    """A goal figure (raw: a value for programs, never marked as emulated)."""
    if a.goals:
        with open(a.goals, "a") as f:
            f.write(f"{key}\t{'emulated, meaningless: ' if a.emulated and not raw else ''}{value}\n")


if a.emulated:
    torch = None
else:
    try:
        import torch
    except Exception as e:
        skip(f"{sys.executable} cannot import torch: {type(e).__name__}: {e}")
    if dev == "cuda" and not torch.cuda.is_available():
        skip("no GPU: torch.cuda.is_available() is False")

SHAPES = {  # ftk-init presets, as transformers configs
    "llama-1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4),
    "llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32),
    "smoke": dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2),
}


def n_params(sh, vocab=32000):
    """Parameters of an untied Llama of this shape (what 6·N·tokens counts)."""
    d, f, L = sh["hidden_size"], sh["intermediate_size"], sh["num_hidden_layers"]
    hd = d // sh["num_attention_heads"]
    attn = d * d * 2 + 2 * d * sh["num_key_value_heads"] * hd  # q, o; k, v
    return 2 * vocab * d + L * (attn + 3 * d * f + 2 * d) + d


shapes = ["smoke"] if a.cpu_smoke else a.shapes.split(",")
GOAL_SHAPE = "smoke" if a.emulated else "llama2-7b"  # the shape whose figures are the goals
steps, mb, maxlen = (2, 2, 64) if a.cpu_smoke else (a.steps, a.micro_batch, a.maxlen)
results = []


def sync():
    if dev == "cuda" and torch:
        torch.cuda.synchronize()


def peaks():
    """bf16 matmul TFLOP/s and copy GB/s (bytes read + written), medians of 10."""
    if dev != "cuda" or a.emulated:
        return 1e12, 1e10
    n = 8192
    x, y = torch.randn(n, n, device=dev, dtype=torch.bfloat16), torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    src = torch.randn(1 << 30, device=dev, dtype=torch.float32)  # 4 GiB
    dst = torch.empty_like(src)

    def med(f, reps=10):
        f(); f(); sync()
        ts = []
        for _ in range(reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(); f(); e1.record(); sync()
            ts.append(e0.elapsed_time(e1) / 1e3)
        return sorted(ts)[len(ts) // 2]

    mm = 2 * n ** 3 / med(lambda: x @ y)
    bw = 2 * src.numel() * 4 / med(lambda: dst.copy_(src))
    del x, y, src, dst
    torch.cuda.empty_cache()
    return mm, bw


mm_peak, copy_bw = peaks()
if a.emulated:
    print("device: the host emulation of CUDA; peaks taken as 1 TFLOP/s and 10 GB/s (the figures mean nothing)")
else:
    print(f"device: {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}; bf16 matmul {mm_peak / 1e12:.0f} "
          f"TFLOP/s, copy {copy_bw / 1e9:.0f} GB/s (measured here)", flush=True)


def sh(*args, **kw):
    return subprocess.run([str(x) for x in args], check=True, **kw)


tok = os.path.join(a.data, "llama2-tokenizer", "tokenizer.model")
alp = sorted(glob.glob(os.path.join(a.data, "alpaca", "*1k*.json")) or glob.glob(os.path.join(a.data, "alpaca", "*.json")))
if not os.path.exists(tok) or not alp:
    skip(f"{a.data} has no llama2-tokenizer/tokenizer.model or alpaca/*.json")
packed = os.path.join(a.work, f"alpaca-{maxlen}.h5")
if not reuse(packed, os.path.join(a.bin, "ftk-pack"), tok, alp[0]):
    sh(os.path.join(a.bin, "ftk-pack"), "-q", "-t", tok, alp[0], "-o", packed, "--pack", "--max-len", maxlen,
       "--val-count", "0")


def packed_rows():
    """The packed rows as token tensors (ftk's file: /train) and their real (non-padding)
    token counts, which is what both sides count as tokens."""
    import h5py
    with h5py.File(packed, "r") as f:
        t, off = f["train/tokens"][:], f["train/row_offsets"][:]
        rs, sl = f["train/row_samples"][:], f["train/sample_lengths"][:]
    return [(torch.tensor(t[off[i]:off[i + 1]].astype("int64")), int(sl[rs[i]:rs[i + 1]].sum()))
            for i in range(len(off) - 1)]


rows = None  # read when PyTorch's first row needs them (h5py)


def torch_row(name, compiled):
    global rows
    if rows is None:
        rows = packed_rows()
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
                      tie_word_embeddings=False, **SHAPES[name])
    # SDPA on the GPU (torch 2.x); the CPU smoke run's old torch has only eager attention
    cfg._attn_implementation = "sdpa" if dev == "cuda" else "eager"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    # made on the GPU where torch can (2.x), not initialised on the CPU and copied
    with torch.device(dev) if hasattr(torch.device, "__enter__") else contextlib.nullcontext():
        model = LlamaForCausalLM(cfg).to(dev, dt)
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    nparams = sum(p.numel() for p in model.parameters())
    kw = {"fused": True} if dev == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1, **kw)
    fwd = torch.compile(model) if compiled else model
    def step(s):
        picked = [rows[(s * mb + i) % len(rows)] for i in range(mb)]
        batch = torch.stack([r[0] for r in picked]).to(dev)
        out = fwd(input_ids=batch, labels=batch)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return sum(r[1] for r in picked)

    tokens, t0 = 0, None
    for s in range(steps + 1):  # step 0 warms up
        if s == 1:
            sync()
            t0 = time.time()
        n = step(s)
        if s >= 1:
            tokens += n
    sync()
    dt_s = time.time() - t0
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if dev == "cuda" else 0
    # one more step under torch.profiler (ftk's table's peer), where time is left for it
    if a.profile and not compiled and room_for(2 * dt_s / steps + 10):
        torch_profile(name, lambda: step(steps + 1))
    del model, opt, fwd
    if dev == "cuda":
        torch.cuda.empty_cache()
    return nparams, tokens / dt_s, peak


def torch_profile(name, run_step):
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    with profile(activities=acts) as prof:
        run_step()
        sync()
    ka = prof.key_averages()
    keys = ["self_device_time_total", "self_cuda_time_total"] if dev == "cuda" else ["self_cpu_time_total"]
    for k in keys:  # the column's name changed between torch versions
        try:
            table = ka.table(sort_by=k, row_limit=25, max_name_column_width=60)
            break
        except Exception:
            table = None
    print(f"\npytorch eager at {name}, torch.profiler (one step, by self time):\n{table}", flush=True)


def smi(*query):
    """nvidia-smi's answer to one query, as rows of fields; None when it does not answer."""
    try:
        out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10)
    except Exception:
        return None
    if out.returncode != 0:
        return None
    return [[f.strip() for f in l.split(",")] for l in out.stdout.splitlines() if l.strip()]


def device_used_mib():
    rows = smi("--query-gpu=memory.used")
    try:
        return float(rows[0][0])
    except Exception:
        return None


class DevicePeak:
    """The device memory a child process holds at its most, polled every 0.5 s by a thread:
    the process's own line of nvidia-smi where the driver lists it (its context included),
    else the device's used memory over its level before the child started (a container's
    own process ids may not be the driver's). None where nothing answered (the emulation)."""

    def __init__(self):
        self.peak_mib, self.how, self.stop = None, "", threading.Event()
        self.base = None if a.emulated or dev != "cuda" else device_used_mib()
        self.thread = None

    def watch(self, pid):
        if self.base is None:
            return
        self.pid = pid
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            own = [r for r in (smi("--query-compute-apps=pid,used_memory") or []) if r[0] == str(self.pid)]
            try:
                v, how = (float(own[0][1]), "the process, nvidia-smi") if own else \
                         (device_used_mib() - self.base, "device used over its level before, nvidia-smi")
            except Exception:
                v = None
            if v is not None and (self.peak_mib is None or v > self.peak_mib):
                self.peak_mib, self.how = v, how
            self.stop.wait(0.5)

    def end(self):
        """The peak in GiB, or None."""
        self.stop.set()
        if self.thread:
            self.thread.join(timeout=20)
        return None if self.peak_mib is None else self.peak_mib / 1024


def ftk_plan(cmd, env):
    """ftk-train --plan with a run's own command line and environment: (total GiB, what the
    plan says of --recompute) or (None, why not)."""
    try:
        p = subprocess.run([str(x) for x in cmd] + ["--plan"], capture_output=True, text=True, env=env, timeout=120)
    except Exception as e:
        return None, f"--plan: {type(e).__name__}"
    mo = re.search(r"^\s*total\s.*\((\d+) bytes", p.stdout, re.M)
    if p.returncode != 0 or not mo:
        last = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        return None, f"--plan failed: {last[:160]}"
    rec = re.search(r"--recompute (auto: \w+|\w+)", p.stdout.splitlines()[0])
    return int(mo.group(1)) / 2 ** 30, (rec.group(1) if rec else "none")


def mem_line(plan, backend, device, how, rec=None):
    """plan, backend peak and device peak side by side, with the plan's error against each; rec,
    the run's last metrics record, adds ftk's own view of the driver (cudaMalloc's pages at their
    peak, and what the device held beside them at start: this context, other processes')."""
    def vs(x):
        return f" ({100 * (x - plan[0]) / plan[0]:+.1f}% against the plan)" if plan[0] and x else ""
    ps = f"plan {plan[0]:.2f} GiB (--recompute {plan[1]})" if plan[0] is not None else f"plan: {plan[1]}"
    bs = f"backend peak {backend:.2f} GiB{vs(backend)}" if backend else "backend peak: not measured"
    ds = f"device {device:.2f} GiB{vs(device)} ({how})" if device is not None else \
        "device: not measured" + (" (emulated)" if a.emulated else "")
    out = f"{ps}; {bs}; {ds}"
    if rec and "mem_device_peak_bytes" in rec:
        pages = rec["mem_device_peak_bytes"] / 2 ** 30
        other = rec.get("mem_device_other_bytes", 0) / 2 ** 30
        out += f"; pages {pages:.2f} GiB + beside them at start {other:.2f} GiB = {pages + other:.2f} GiB{vs(pages + other)}"
    return out


ATTNS = [x for x in a.attn.split(",") if x] or [""]
row_secs = []  # how long each ftk row took: what an optional row is expected to take


def ftk_env(attn, profile=None):
    env = dict(os.environ)
    env.pop("FTK_PROFILE", None)  # the timed rows never run under it
    if attn:
        env["FTK_CUDA_ATTN"] = attn
    if attn == "cudnn":  # a fallback to the flash kernels fails the row, not reported as cuDNN's
        env["FTK_CUDNN_STRICT"] = "1"
    if profile:
        env["FTK_PROFILE"] = profile
    return env


def ftk_label(attn, profiled=False, recompute=None):  # a profiled row says so: its events cost time
    return ((f"ftk attn={attn}" if attn else "ftk") + (f" --recompute {recompute}" if recompute not in (None, a.recompute) else "")
            + (" profiled" if profiled else ""))


def ftk_row(name, attn, profiled=False, recompute=None):
    """One ftk run: (tokens/s or None, peak GiB or the error, the memory line)."""
    recompute = recompute or a.recompute
    t_row = time.time()
    w = ftk_weights(name)
    run = os.path.join(a.work, f"run-{name}{attn}")
    sh("rm", "-rf", run)
    cmd = [os.path.join(a.bin, "ftk-train"), "-q", "-m", w, "-d", packed, "-o", run, "--steps", steps + 1,
           "--global-batch", mb, "--micro-batch", mb, "--schedule", "constant", "--warmup", 0, "--eval-every", 0,
           "--device", dev, "--recompute", recompute, "--no-save"]
    if dev == "cuda":  # PyTorch's row is model.to(bf16) with AdamW on bf16 parameters: bf16-true
        cmd += ["--precision", "bf16-true"]
    prof = os.path.join(a.work, f"profile-{name}{attn}.md") if profiled else None
    env = ftk_env(attn, prof)
    plan = ftk_plan(cmd, env)
    dp = DevicePeak()
    p = subprocess.Popen([str(x) for x in cmd], stderr=subprocess.PIPE, text=True, env=env)
    dp.watch(p.pid)
    err = p.stderr.read()
    p.wait()
    device = dp.end()
    if not profiled:
        row_secs.append(time.time() - t_row)
    if p.returncode != 0:
        print(f"ftk-train failed (exit {p.returncode}):\n{err.strip()[-2000:]}", flush=True)
        # the plan beside what the device held until the failure (an out of memory is the
        # plan's error)
        print(f"MEM {name} {ftk_label(attn, profiled, recompute)}: {mem_line(plan, None, device, dp.how)}; "
              f"the run failed (exit {p.returncode})", flush=True)
        return None, err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}", None
    m = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if '"loss"' in l]
    t = m[-1]["elapsed_s"] - m[0]["elapsed_s"]
    backend = m[-1].get("mem_peak_bytes", 0) / 2 ** 30
    mem = mem_line(plan, backend, device, dp.how, m[-1])
    print(f"MEM {name} {ftk_label(attn, profiled, recompute)}: {mem}", flush=True)
    if profiled and os.path.exists(prof):  # the per-op summary and the longest shapes
        print(f"\n{ftk_label(attn, profiled, recompute)} at {name}, FTK_PROFILE (steps after the first):")
        print("".join(open(prof).readlines()[:72]), flush=True)
    return sum(x["tokens"] for x in m[1:]) / t, device if device is not None else backend, mem


def ftk_weights(name):
    """ftk-init weights of the shape PyTorch runs (random: speed does not depend on values)."""
    w = os.path.join(a.work, f"{name}.h5")
    if not reuse(w, os.path.join(a.bin, "ftk-init"), tok):
        c = os.path.join(a.work, f"{name}.json")
        json.dump(dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=32000,
                       max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                       bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16", initializer_range=0.02,
                       **SHAPES[name]), open(c, "w"))
        t0 = time.time()
        sh(os.path.join(a.bin, "ftk-init"), "-q", "--config", c, "-t", tok, "-o", w)
        print(f"ftk-init {name}: {time.time() - t0:.1f} s", flush=True)
    return w


def fmt_row(r, eager):
    """One line of the table: shape, system, tokens/s, MFU, peak GiB, ratio to eager."""
    name, label, tps, mfu, peak = r[:5]
    if tps is None:
        return f"{name:<10} {label:<34} {'-':>10} {'-':>7} {'-':>9}  {peak}"
    ratio = f"{tps / eager[2]:.2f}x" if eager and eager[2] else "-"
    mfu_s = f"{100 * mfu:.1f}%" if mfu is not None and not a.emulated else "-"
    return f"{name:<10} {label:<34} {tps:>10.0f} {mfu_s:>7} {peak:>9.1f}  {ratio}"


HEADER = f"{'shape':<10} {'system':<34} {'tokens/s':>10} {'MFU':>7} {'peak GiB':>9}  vs pytorch eager"


def add_row(r):
    """Prints the row at once (a killed run keeps it) and updates the goal figures (the ratio
    once eager's row is there). r: (shape, label, tokens/s, MFU, peak or error[, memory line,
    attention])."""
    results.append(r)
    name = r[0]
    eager = next((x for x in results if x[0] == name and x[1] == "pytorch eager" and x[2]), None)
    print(f"ROW {fmt_row(r, eager)}", flush=True)
    if name != GOAL_SHAPE:
        return
    # the headline: ftk's timed rows, never the profiled one
    ftk = [x for x in results if x[0] == name and x[1].startswith("ftk") and not x[1].endswith("profiled") and x[2]]
    if ftk:
        goal("7b_mfu", ", ".join(f"{100 * x[3]:.1f}% ({x[1]})" for x in ftk)
             if not a.emulated else ", ".join(f"{x[2]:.0f} tokens/s ({x[1]})" for x in ftk))
        if eager:
            goal("7b_ratio", ", ".join(f"{x[2] / eager[2]:.2f}x ({x[1]})" for x in ftk) +
                 f"; PyTorch eager {eager[2]:.0f} tokens/s")
        # the attentions, fastest first (the bundle's epoch takes the first whose checks passed)
        goal("7b_attn_order", " ".join(x[6] or "default" for x in sorted(ftk, key=lambda x: -x[2])), raw=True)
    peaks_s = [f"{x[1]} {x[4]:.1f} GiB" for x in results if x[0] == name and x[2]]
    if peaks_s:
        goal("peak_7b", f"{name} {mb}x{maxlen}: " + ", ".join(peaks_s))
    mems = [f"{x[1]}: {x[5]}" for x in results if x[0] == name and len(x) > 5 and x[5]]
    if mems:
        goal("plan_7b", f"{name} {mb}x{maxlen}: " + "; ".join(mems))


if a.alpaca1024:
    # the epoch: Llama-2-7B, 1024 records in rows of 512, LitGPT's batches (64, micro 4);
    # emulated: the smoke shape, 4 records in rows of 128, batches of 2
    big = max(glob.glob(os.path.join(a.data, "alpaca", "*.json")), key=os.path.getsize)
    n_rec, shape, mlen = (4, "smoke", 128) if a.emulated else (1024, "llama2-7b", 512)
    batch = ["--global-batch", 2, "--micro-batch", 2] if a.emulated else []
    recs = json.load(open(big))[:n_rec]
    src = os.path.join(a.work, f"alpaca{n_rec}.json")
    json.dump(recs, open(src, "w"))
    data = os.path.join(a.work, f"alpaca{n_rec}-{mlen}.h5")
    sh(os.path.join(a.bin, "ftk-pack"), "-q", "-t", tok, src, "-o", data, "--pack", "--max-len", mlen, "--val-count", 0,
       "--force")
    t_init = time.time()
    w = ftk_weights(shape)
    print(f"weights of {shape} ready in {time.time() - t_init:.1f} s (ftk-init, or kept from an earlier run)", flush=True)
    failed = False
    for attn in ATTNS:
        run = os.path.join(a.work, "run-alpaca")
        sh("rm", "-rf", run)
        env = ftk_env(attn)
        # not -q: the time of each line splits the wall time (weights loaded: start-up and
        # load; the steps from metrics.jsonl; what follows the last step: the end)
        cmd = [os.path.join(a.bin, "ftk-train"), "-m", w, "-d", data, "-o", run, "--epochs", 1, "--device", dev,
               "--precision", "bf16-true", "--recompute", a.recompute, "--eval-every", 0, "--no-save"] + batch
        plan = ftk_plan(cmd, env)
        dp = DevicePeak()
        t0 = time.time()
        p = subprocess.Popen([str(x) for x in cmd], stderr=subprocess.PIPE, text=True, env=env)
        dp.watch(p.pid)
        t_ready, load_s, load_gb, tail, level = None, None, None, [], None
        for line in p.stderr:
            tail = (tail + [line.rstrip()])[-20:]
            mo = re.search(r"weights loaded in ([0-9.]+) s(?:: ([0-9.]+) GB read)?", line)
            if mo:
                load_s = float(mo.group(1))
                load_gb = float(mo.group(2)) if mo.group(2) else None
            mo = re.search(r"--recompute auto: (\w+)", line)
            if mo:
                level = mo.group(1)
            if t_ready is None and " parameters, " in line:
                t_ready = time.time() - t0
        p.wait()
        wall = time.time() - t0
        device = dp.end()
        label = (f" (FTK_CUDA_ATTN={attn}" if attn else " (attention: ftk's default") + \
            f", --recompute {a.recompute}{': ' + level if level else ''})"
        if p.returncode != 0:
            print(f"Alpaca epoch{label}: ftk-train failed (exit {p.returncode}):\n" + "\n".join(tail), flush=True)
            failed = True
            continue
        m = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if '"loss"' in l]
        toks = sum(x["tokens"] for x in m)
        steps_s = m[-1]["elapsed_s"]
        mfu = 6 * n_params(SHAPES[shape]) * toks / steps_s / mm_peak * 100
        backend = m[-1].get("mem_peak_bytes", 0) / 2 ** 30
        mem = mem_line(plan, backend, device, dp.how, m[-1])
        split = "not measured (no 'weights loaded' line)"
        if t_ready is not None and load_s is not None:
            split = (f"start-up {t_ready - load_s:.1f} s, weights load {load_s:.1f} s, steps {steps_s:.1f} s, "
                     f"end {max(wall - t_ready - steps_s, 0):.1f} s (no final checkpoint: --no-save)")
        # the weights' read speed against cat's of the same file, the cache as the run left it
        load = "not measured (no 'weights loaded' line)"
        if load_s:
            gb = load_gb if load_gb else os.path.getsize(w) / 1e9
            load = f"{gb:.2f} GB in {load_s:.2f} s, {gb / load_s:.2f} GB/s"
            if room_for(load_s + 5):
                t_cat = time.time()
                try:
                    subprocess.run(["cat", w], stdout=subprocess.DEVNULL, timeout=max(time_left() - 5, 5), check=True)
                    cat_s = time.time() - t_cat
                    cat_bw = os.path.getsize(w) / 1e9 / cat_s
                    load += f"; cat FILE > /dev/null just after: {cat_bw:.2f} GB/s; ratio {gb / load_s / cat_bw:.2f} (goal 0.8)"
                except Exception as e:
                    load += f"; cat: not measured ({type(e).__name__})"
            else:
                load += "; cat: not measured (no time left)"
        print(f"Alpaca1024 epoch{label} ({len(recs)} records of {os.path.basename(big)}, rows of {mlen}, {shape} "
              f"bf16-true, {len(m)} steps, {toks} tokens): wall {wall:.1f} s (ftk-train process: {split}); "
              f"{toks / steps_s:.0f} tokens/s, {mfu:.1f}% MFU, last loss {m[-1]['loss']:.3f}", flush=True)
        print(f"MEM Alpaca1024 epoch{label}: {mem}", flush=True)
        print(f"LOAD Alpaca1024 epoch weights: {load}", flush=True)
        if not attn or attn == ATTNS[0]:
            goal("epoch_steps", f"{len(m)} steps, {toks} tokens in {steps_s:.1f} s{label} ({toks / steps_s:.0f} "
                 f"tokens/s, {mfu:.1f}% MFU; goal: at most 12 s on an H200)")
            goal("epoch_wall", f"{wall:.1f} s{label}: {split} (goal: at most 30 s on an H200)")
            goal("epoch_load", load)
            goal("peak_epoch", f"Alpaca1024 epoch {device if device is not None else backend:.1f} GiB")
            goal("plan_epoch", f"Alpaca1024 epoch{label}: {mem}")
    sys.exit(1 if failed else 0)

print(HEADER, flush=True)
ftk_failed = False


def run_ftk(name, attn, recompute=None):
    global ftk_failed
    tps, peak, mem = ftk_row(name, attn, recompute=recompute)
    ftk_failed |= tps is None
    rec = recompute or a.recompute
    add_row((name, ftk_label(attn, False, rec), tps, 6 * n_params(SHAPES[name]) * tps / mm_peak if tps else None, peak,
             mem, attn, rec))
    # --recompute auto trusts the plan; a device that ran out of memory says the plan was
    # short (the row above fails): the same row with block recompute, where time is left
    if tps is None and rec == "auto" and "out of memory" in str(peak).lower() and room_for(max(row_secs)):
        print(f"{ftk_label(attn)}: out of memory with --recompute auto (the plan fell short): again with block",
              flush=True)
        run_ftk(name, attn, "block")


for name in shapes:
    # the first attention's row, PyTorch eager's (the ratio lands second), the other
    # attentions', then the profiled ones: a run cut short keeps the headline
    run_ftk(name, ATTNS[0])
    if not a.emulated:
        for compiled in ([False] if a.no_compile or a.cpu_smoke else [False, True]):
            label = "pytorch eager" if not compiled else "pytorch compile"
            try:
                n, tps, peak = torch_row(name, compiled)
                assert n == n_params(SHAPES[name]), (n, n_params(SHAPES[name]))
                add_row((name, label, tps, 6 * n * tps / mm_peak, peak))
            except Exception as e:  # out of memory, compile failure: say so and go on
                add_row((name, label, None, None, f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"))
                if dev == "cuda":
                    torch.cuda.empty_cache()
            if not compiled:
                for attn in ATTNS[1:]:
                    run_ftk(name, attn)
    else:
        for attn in ATTNS[1:]:
            run_ftk(name, attn)
    if a.profile:  # where the fastest attention's time went, beside the timed rows
        timed = [r for r in results if r[0] == name and r[1].startswith("ftk") and r[2]]
        if not timed:
            print(f"\nno profiled ftk row at {name}: no ftk row passed", flush=True)
        elif room_for(max(row_secs)):
            best = max(timed, key=lambda r: r[2])
            tps, peak, mem = ftk_row(name, best[6], profiled=True, recompute=best[7])
            add_row((name, ftk_label(best[6], True, best[7]), tps,
                     6 * n_params(SHAPES[name]) * tps / mm_peak if tps else None, peak, None, best[6], best[7]))
        else:
            print(f"\nno profiled ftk row at {name}: {time_left():.0f} s left of --time-limit, a row took up to "
                  f"{max(row_secs):.0f} s", flush=True)

print(f"\n{HEADER}")
for name in shapes:
    eager = next((r for r in results if r[0] == name and r[1] == "pytorch eager" and r[2]), None)
    for r in results:
        if r[0] == name:
            print(fmt_row(r, eager))
sys.exit(1 if ftk_failed else 0)
