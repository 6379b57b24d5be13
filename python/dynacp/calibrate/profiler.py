"""``dynacp calibrate profile``: micro-benchmarks through torch on the devices at hand -> a profile file.

Every measurement runs on ``world_size`` spawned processes (``torch.distributed``: gloo on CPU, NCCL when every
process has its own GPU), all busy at once as in training:

* ``attention``: the runtime's ring attention (``dynacp.torch.ring_attention``: the Python ring loop with
  ``TorchBlock`` on CPU, FlashAttention varlen blocks on CUDA) over THD packs of one or several documents, causal
  and full masks, forward + backward, one layer, on a ring of one rank (every rank its own pack);
* ``linear``: one layer's QKV, output and MLP matmuls (gated when the model is), forward + backward, or a
  user-supplied ``linear_fn(tokens)`` that runs one microbatch's linear work;
* ``p2p``: one ring hop (every rank sends to its successor and receives from its predecessor with
  ``batch_isend_irecv``) per ring size, message sizes from 1 KiB up;
* ``group``: whole layers (linear + ring attention + linear, forward + backward) of packs on rings of every degree
  that divides the world, times ``layers``: the whole-step group times the fit uses.

Each point: ``warmup`` untimed runs, then ``repeats`` timed runs (a barrier before each; the time of a run is the
slowest rank's), spread over ``passes`` passes over all the points (in a seeded random order); the median is stored
with the relative interquartile range as ``spread``.
"""

from __future__ import annotations

import datetime
import logging
import os
import pickle
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from dynacp.calibrate.fileformat import Profile

logger = logging.getLogger("dynacp")


@dataclass
class ProfileConfig:
    """What ``dynacp calibrate profile`` measures (every field has a CLI flag of the same name)."""

    model: Any = "tiny"
    """The model: ``"tiny"`` (:data:`TINY_MODEL`, small enough for a CPU), a planner model preset name
    (``dynacp configs --list``), a model JSON file, a dict or a ``ModelConfig`` (layers, hidden, heads, KV heads,
    head dim, FFN width)."""
    world_size: int = 2
    """Processes to spawn (ranks); rings of every divisor of it >= 2 are measured."""
    ranks_per_node: Optional[int] = None
    """Ranks per node (a ring spanning nodes is an inter-node ring); default: all on one node."""
    max_tokens: Optional[int] = None
    """Longest pack in tokens (the memory budget of one rank); default 1024 on CPU (the CPU block function's s^2
    temporaries leave the caches beyond it and its time grows faster than s^2), 32768 on CUDA."""
    min_tokens: int = 64
    """Shortest document in tokens."""
    pack_docs: Sequence[int] = (1, 4)
    """Documents per THD pack (equal lengths summing to the pack's tokens)."""
    masks: Sequence[str] = ("causal", "full")
    warmup: int = 1
    """Untimed runs before each point."""
    repeats: int = 5
    """Timed runs per point (median and spread over them); P2P points run 4 x as many (they are short)."""
    passes: int = 5
    """The timed runs of every point are spread over this many passes over all the points (capped at ``repeats``;
    warm-up in the first pass only), so that a burst of load from other processes that lasts less than a pass
    slows only some of a point's runs, and the median drops it; 1: every point's runs back to back."""
    p2p_max_bytes: Optional[int] = None
    """Largest P2P message in bytes; default 4 MiB on CPU, 256 MiB on CUDA."""
    dtype: Optional[str] = None
    """float32 (CPU default) or bfloat16 (CUDA default)."""
    seed: int = 0
    progress: bool = True
    """tqdm progress bar on stderr."""
    timeout: float = 120.0
    """Seconds any one collective or ring hop may take."""


TINY_MODEL = {"name": "tiny", "num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 512, "num_attention_heads": 4,
              "num_kv_heads": 2, "head_dim": 64, "vocab_size": 32000, "gated_mlp": True}
"""The default model of ``dynacp calibrate profile``: 4 layers, hidden 256, 4 heads (2 KV heads) of 64, FFN 512."""


def _model(spec: Any) -> Any:
    from dynacp.planner.presets import resolve_model

    return resolve_model(dict(TINY_MODEL) if spec == "tiny" else spec)


def kv_bytes_per_token(model: Any, dtype_bytes: int) -> float:
    """Bytes per token per ring hop over the whole step: K and V of every layer forward, and K, V, dK, dV backward
    (3 x (K,V))."""
    return float(model.kv_size * 2 * dtype_bytes * model.attention_layers * 3)


def pack_shapes(cfg: ProfileConfig, max_tokens: int) -> list[list[int]]:
    """The THD packs profiled: for each total T = round(min_tokens * 2^(k/2)) <= max_tokens (half-octave steps,
    so that most sizes are not powers of two, as real lengths are not), ``n`` documents of T/n tokens for each n
    in ``pack_docs`` with T/n >= min_tokens."""
    out = []
    k = 0
    while (t := int(round(cfg.min_tokens * 2 ** (k / 2)))) <= max_tokens:
        for n in cfg.pack_docs:
            if t // n >= cfg.min_tokens:
                out.append([t // n] * n)
        k += 1
    return out


@dataclass
class Job:
    """One measured point: ``kind`` (attention, linear, p2p, group), the lengths (or bytes) and the ring degree."""

    kind: str
    lengths: list[int] = field(default_factory=list)
    degree: int = 1
    mask: str = "causal"
    nbytes: int = 0


def profile_jobs(cfg: ProfileConfig, max_tokens: int, p2p_max: int) -> list[Job]:
    """Every point of a profile, in run order."""
    packs = pack_shapes(cfg, max_tokens)
    degrees = [d for d in range(1, cfg.world_size + 1) if cfg.world_size % d == 0]
    jobs = [Job("linear", [p[0] * len(p)]) for p in packs if len(p) == 1]
    jobs += [Job("attention", p, 1, m) for p in packs for m in cfg.masks if m == "causal" or len(p) == 1]
    sizes = [int(x) for x in 2.0 ** np.arange(10, int(np.log2(p2p_max)) + 1, 2)]
    jobs += [Job("p2p", degree=d, nbytes=b) for d in degrees if d > 1 for b in sizes]
    jobs += [Job("group", p, d, m) for d in degrees for p in packs for m in cfg.masks
             if (m == "causal" or len(p) == 1) and sum(p) // d >= 2]
    return jobs


# -- worker side --------------------------------------------------------------------------------------------------------

class _Layer:
    """One transformer layer's weights (QKV, output, MLP) and its whole-layer step."""

    def __init__(self, model: Any, device: Any, dtype: Any, gen: Any):
        import torch

        h, q, kv, f = model.hidden_size, model.q_size, model.kv_size, model.ffn_hidden_size or 4 * model.hidden_size
        self.heads, self.kv_heads, self.dh = model.num_attention_heads, model.kv_heads, model.dh
        self.gated = bool(model.gated_mlp)

        def w(a: int, b: int) -> Any:
            return (torch.randn(a, b, generator=gen) / np.sqrt(a)).to(device=device, dtype=dtype).requires_grad_()

        self.wqkv, self.wo = w(h, q + 2 * kv), w(q, h)
        self.w1, self.w2 = w(h, f * (2 if self.gated else 1)), w(f, h)
        self.h, self.q, self.kv = h, q, kv

    def linear(self, x: Any) -> Any:
        qkv = x @ self.wqkv
        return self.mlp(qkv[:, :self.q] @ self.wo + x)

    def mlp(self, y: Any) -> Any:
        """The MLP block with its residual: y + W2 act(W1 y) (SwiGLU when gated, else GELU)."""
        import torch

        m = y @ self.w1
        if self.gated:
            a, b = m.chunk(2, dim=-1)
            m = torch.nn.functional.silu(a) * b
        else:
            m = torch.nn.functional.gelu(m)
        return m @ self.w2 + y

    def whole(self, x: Any, attend: Callable[[Any, Any, Any], Any]) -> Any:
        qkv = x @ self.wqkv
        n = x.shape[0]
        q = qkv[:, :self.q].reshape(n, self.heads, self.dh)
        k = qkv[:, self.q:self.q + self.kv].reshape(n, self.kv_heads, self.dh)
        v = qkv[:, self.q + self.kv:].reshape(n, self.kv_heads, self.dh)
        o = attend(q, k, v).reshape(n, self.q)
        return self.mlp(o @ self.wo + x)


def _time_runs(fn: Callable[[], None], warmup: int, repeats: int, sync: Callable[[], None]) -> list[float]:
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    sync()
    out = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def _ring_of(rank: int, degree: int) -> list[int]:
    first = rank // degree * degree
    return list(range(first, first + degree))


def _run_job(job: Job, ctx: dict) -> list[float]:
    """Time one job on this rank (every rank runs every job; rings of ``job.degree`` consecutive ranks)."""
    import torch
    import torch.distributed as dist

    from dynacp.torch import ring_attention

    rank, dev, dt, layer, gen = ctx["rank"], ctx["device"], ctx["dtype"], ctx["layer"], ctx["gen"]
    ring = _ring_of(rank, job.degree)
    causal = job.mask == "causal"
    if job.kind == "p2p":
        send = torch.empty(job.nbytes // 4, dtype=torch.float32, device=dev)
        recv = torch.empty_like(send)
        me = ring.index(rank)
        nxt, prv = ring[(me + 1) % len(ring)], ring[(me - 1) % len(ring)]

        def fn() -> None:
            ops = [dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        return _time_runs(fn, ctx["warmup"] + 1, 4 * ctx["repeats"], ctx["sync"])
    cu = np.concatenate([[0], np.cumsum(job.lengths)]).astype(np.int64)
    pad = [(s + 2 * job.degree - 1) // (2 * job.degree) * 2 * job.degree for s in job.lengths]
    cu_p = np.concatenate([[0], np.cumsum(pad)]).astype(np.int64)
    rows = int(cu_p[-1]) // job.degree

    def attend(q: Any, k: Any, v: Any) -> Any:
        return ring_attention(q, k, v, cu, group=None, causal=causal, ranks=ring, cu_seqlens_padded=cu_p,
                              timeout=ctx["timeout"])

    if job.kind == "linear":
        x = torch.randn(job.lengths[0], layer.h, generator=gen).to(dev, dt).requires_grad_()
        return _time_runs(lambda: layer.linear(x).sum().backward(), ctx["warmup"], ctx["repeats"], ctx["sync"])
    if job.kind == "attention":
        q = torch.randn(rows, layer.heads, layer.dh, generator=gen).to(dev, dt).requires_grad_()
        k = torch.randn(rows, layer.kv_heads, layer.dh, generator=gen).to(dev, dt).requires_grad_()
        v = torch.randn(rows, layer.kv_heads, layer.dh, generator=gen).to(dev, dt).requires_grad_()
        return _time_runs(lambda: attend(q, k, v).sum().backward(), ctx["warmup"], ctx["repeats"], ctx["sync"])
    x = torch.randn(rows, layer.h, generator=gen).to(dev, dt).requires_grad_()
    return _time_runs(lambda: layer.whole(x, attend).sum().backward(), ctx["warmup"], ctx["repeats"], ctx["sync"])


def pass_runs(repeats: int, passes: int) -> list[int]:
    """Timed runs of every point in each pass: ``repeats`` split as evenly as possible over
    ``min(passes, repeats)`` passes, the larger shares first."""
    n = max(1, min(passes, repeats))
    return [repeats // n + (1 if p < repeats % n else 0) for p in range(n)]


def _run_passes(jobs: list[Job], ctx: dict, runs: list[int], progress: bool) -> list[list[float]]:
    """Every job's run times (the slowest rank's), the runs spread over passes (:attr:`ProfileConfig.passes`)."""
    import torch
    import torch.distributed as dist

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs) * len(runs), desc="dynacp calibrate profile", unit="point")
    times: list[list[float]] = [[] for _ in jobs]
    for p, n in enumerate(runs):
        here = dict(ctx, warmup=ctx["warmup"] if p == 0 else 0, repeats=n)
        for j, job in enumerate(jobs):
            t = torch.tensor(_run_job(job, here), dtype=torch.float64, device=ctx["device"])  # NCCL: on the GPU
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # a run takes as long as its slowest rank
            times[j] += t.tolist()
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return times


def _worker(rank: int, world: int, port: int, cfg: dict, jobs: list[Job], out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    result: dict[str, Any]
    try:
        cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world
        if cuda:
            torch.cuda.set_device(rank)
        else:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=cfg["timeout"]))
        dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
        dtype = getattr(torch, cfg["dtype"])
        gen = torch.Generator().manual_seed(cfg["seed"] + rank)
        ctx = {"rank": rank, "device": dev, "dtype": dtype, "gen": gen, "warmup": cfg["warmup"],
               "repeats": cfg["repeats"], "timeout": cfg["timeout"],
               "sync": torch.cuda.synchronize if cuda else (lambda: None),
               "layer": _Layer(_model(cfg["model"]), dev, dtype, gen)}
        times = _run_passes(jobs, ctx, pass_runs(cfg["repeats"], cfg["passes"]), rank == 0 and cfg["progress"])
        device_name = torch.cuda.get_device_name(rank) if cuda else "cpu"
        result = {"ok": True, "times": times, "device": device_name, "backend": dist.get_backend()}
    except BaseException as exc:  # reported to the parent, which raises it
        import traceback

        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "tb": traceback.format_exc()}
    if rank == 0 or not result["ok"]:
        with open(os.path.join(out_dir, f"{rank}.pkl"), "wb") as f:
            pickle.dump(result, f)
    try:
        dist.destroy_process_group()
    except Exception:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_jobs(cfg: ProfileConfig, jobs: list[Job], settings: dict, deadline: float = 3600.0) -> dict:
    """Run ``jobs`` on ``cfg.world_size`` spawned processes; rank 0's result dict (``times`` per job)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    port = _free_port()
    with tempfile.TemporaryDirectory() as out_dir:
        procs = [ctx.Process(target=_worker, args=(r, cfg.world_size, port, settings, jobs, out_dir), daemon=True)
                 for r in range(cfg.world_size)]
        for p in procs:
            p.start()
        end = time.monotonic() + deadline
        for p in procs:
            p.join(max(0.0, end - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        results = {}
        for r in range(cfg.world_size):
            path = os.path.join(out_dir, f"{r}.pkl")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    results[r] = pickle.load(f)
    bad = [(r, res) for r, res in sorted(results.items()) if not res["ok"]]
    if bad:
        r, res = bad[0]
        raise RuntimeError(f"dynacp calibrate profile: rank {r} failed: {res['error']}\n{res['tb']}")
    if 0 not in results:
        raise RuntimeError(f"dynacp calibrate profile: rank 0 returned no result within {deadline:g} s (a rank died "
                           "or hung; run with fewer points or a larger timeout)")
    return results[0]


def _settings(cfg: ProfileConfig) -> tuple[dict, int, int]:
    import torch

    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= cfg.world_size
    max_tokens = cfg.max_tokens or (32768 if cuda else 1024)
    p2p_max = cfg.p2p_max_bytes or (256 << 20 if cuda else 4 << 20)
    model = _model(cfg.model)
    settings = {"model": asdict(model), "dtype": cfg.dtype or ("bfloat16" if cuda else "float32"),
                "warmup": cfg.warmup, "repeats": cfg.repeats, "passes": cfg.passes, "timeout": cfg.timeout,
                "seed": cfg.seed, "progress": cfg.progress}
    if cfg.world_size < 1 or cfg.repeats < 1 or cfg.passes < 1 or cfg.warmup < 0:
        raise ValueError("ProfileConfig: world_size, repeats and passes must be >= 1 and warmup >= 0, got "
                         f"{cfg.world_size}, {cfg.repeats}, {cfg.passes}, {cfg.warmup}")
    return settings, max_tokens, p2p_max


def _stats(times: list[float]) -> tuple[float, float]:
    q25, med, q75 = np.quantile(np.asarray(times), [0.25, 0.5, 0.75])
    return float(med), float((q75 - q25) / med) if med > 0 else 0.0


def _configured(config: Optional[ProfileConfig], overrides: dict) -> ProfileConfig:
    cfg = config or ProfileConfig()
    for k, v in overrides.items():
        if not hasattr(cfg, k):
            raise ValueError(f"ProfileConfig has no field {k!r}")
        setattr(cfg, k, v)
    return cfg


def run_profile(config: Optional[ProfileConfig] = None, linear_fn: Optional[Callable[[int], None]] = None,
                **overrides: Any) -> Profile:
    """Measure a profile (see the module docstring); ``overrides`` set :class:`ProfileConfig` fields.

    ``linear_fn(tokens)`` (optional): runs one microbatch's linear work of ``tokens`` tokens, forward + backward,
    on this process; it replaces the model's matmuls in the ``linear`` table (timed here, in the calling process).
    """
    return _profile(_configured(config, overrides), linear_fn, [])[0]


def _profile(cfg: ProfileConfig, linear_fn: Optional[Callable[[int], None]],
             extra: list[Job]) -> tuple[Profile, list[list[float]]]:
    """The profile, and the times of ``extra`` jobs run in the same world, interleaved with the profile's."""
    import torch

    import dynacp

    settings, max_tokens, p2p_max = _settings(cfg)
    jobs = profile_jobs(cfg, max_tokens, p2p_max)
    everything = jobs + extra
    # run in a seeded random order, so that a change of the machine's load during the run (other processes) spreads
    # over every shape instead of biasing some; rows are written in the canonical order
    order = np.random.default_rng(cfg.seed).permutation(len(everything))
    t0 = time.perf_counter()
    shuffled = run_jobs(cfg, [everything[i] for i in order], settings)
    times: list[Any] = [None] * len(everything)
    for k, i in enumerate(order):
        times[i] = shuffled["times"][k]
    res = dict(shuffled, times=times[:len(jobs)])
    model = _model(cfg.model)
    rpn = cfg.ranks_per_node or cfg.world_size
    prof = Profile(source="<profile>")
    prof.meta = {"device": res["device"], "dtype": settings["dtype"], "torch": torch.__version__,
                 "dynacp": dynacp.__version__, "backend": res["backend"], "world_size": cfg.world_size,
                 "ranks_per_node": rpn, "layers": model.num_layers, "step_factor": 1, "model": settings["model"],
                 "warmup": cfg.warmup, "repeats": cfg.repeats, "passes": len(pass_runs(cfg.repeats, cfg.passes)),
                 "max_tokens": max_tokens,
                 "kv_bytes_per_token": kv_bytes_per_token(model, 2 if settings["dtype"] in ("bfloat16", "float16")
                                                          else 4),
                 "seconds": round(time.perf_counter() - t0, 1)}
    for job, runs in zip(jobs, res["times"]):
        med, spread = _stats(runs)
        crosses = int(job.degree > 1 and job.degree > rpn)
        if job.kind == "linear":
            row: dict[str, Any] = {"tokens": job.lengths[0], "seconds": med, "spread": spread}
            if linear_fn is not None:
                continue
        elif job.kind == "attention":
            row = {"lengths": job.lengths, "degree": job.degree, "mask": job.mask, "seconds": med, "spread": spread}
        elif job.kind == "p2p":
            row = {"group_size": job.degree, "crosses_nodes": crosses, "bytes": job.nbytes, "seconds": med,
                   "spread": spread}
        else:
            row = {"lengths": job.lengths, "degree": job.degree, "mask": job.mask, "crosses_nodes": crosses,
                   "seconds": med * model.num_layers, "spread": spread}
        prof.tables.setdefault(job.kind, []).append(row)
    if linear_fn is not None:
        prof.tables["linear"] = _user_linear(linear_fn, [j.lengths[0] for j in jobs if j.kind == "linear"], cfg)
    return prof, times[len(jobs):]


def _user_linear(fn: Callable[[int], None], tokens: list[int], cfg: ProfileConfig) -> list[dict]:
    rows = []
    for n in tokens:
        for _ in range(cfg.warmup):
            fn(n)
        times = []
        for _ in range(cfg.repeats):
            t0 = time.perf_counter()
            fn(n)
            times.append(time.perf_counter() - t0)
        med, spread = _stats(times)
        rows.append({"tokens": n, "seconds": med, "spread": spread})
    return rows


# -- acceptance check: predicted vs measured whole-group times of random microbatches -----------------------------------

def random_groups(count: int, max_tokens: int, world_size: int, seed: int = 0, min_len: int = 64) -> list[Job]:
    """``count`` causal microbatches: long-tailed document lengths (log-uniform in [min_len, max_tokens]) packed up
    to ``max_tokens`` tokens, on rings of a random divisor of ``world_size``; deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    degrees = [d for d in range(1, world_size + 1) if world_size % d == 0]
    jobs = []
    for _ in range(count):
        budget = int(rng.integers(max_tokens // 4, max_tokens + 1))
        lengths: list[int] = []
        while True:
            s = int(np.exp(rng.uniform(np.log(min_len), np.log(max_tokens))))
            if sum(lengths) + s > budget:
                break
            lengths.append(s)
        jobs.append(Job("group", lengths or [budget], int(rng.choice(degrees)), "causal"))
    return jobs


def profile_with_holdout(config: Optional[ProfileConfig] = None, count: int = 24, seed: int = 1,
                         **overrides: Any) -> tuple[Profile, list[dict[str, Any]]]:
    """A profile, and ``count`` held-out random microbatches (:func:`random_groups`, causal) measured as whole steps
    (all layers, forward + backward) in the same run, interleaved with the profile's points so that both see the
    same machine load. Held-out rows: ``lengths``, ``degree``, ``measured`` (median s), ``spread`` (relative IQR)."""
    cfg = _configured(config, overrides)
    _, max_tokens, _ = _settings(cfg)
    jobs = random_groups(count, max_tokens, cfg.world_size, seed, cfg.min_tokens)
    prof, times = _profile(cfg, None, jobs)
    layers = _model(cfg.model).num_layers
    rows = []
    for job, t in zip(jobs, times):
        med, spread = _stats(t)
        rows.append({"lengths": job.lengths, "degree": job.degree, "measured": med * layers, "spread": spread})
    return prof, rows


def predict_rows(cost: Any, links: dict[str, float], rows: list[dict[str, Any]], world_size: int,
                 ranks_per_node: Optional[int] = None) -> list[float]:
    """``cost.time`` (seconds) of held-out rows on a cluster with the measured ``links``."""
    from dynacp import _core
    from dynacp.calibrate.fileformat import apply_links

    rpn = ranks_per_node or world_size
    cluster = apply_links(_core.Cluster(num_ranks=world_size, ranks_per_node=rpn), links)
    return [cost.time(r["lengths"], r["degree"], cluster) for r in rows]
