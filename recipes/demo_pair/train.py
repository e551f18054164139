#!/usr/bin/env python3
"""Train the demo pair: corpus + tokenizer, target, chained drafter, draft model, evaluation.

    python3 recipes/demo_pair/train.py --out DIR [--pack DIR2] [--deadline-seconds 570] ...

Stages run in order and each one, once done, is recorded in DIR/summary.json ("stages_done");
a second call with the same --out skips the stages already done (--fresh starts over).
--pack DIR2 mirrors DIR into two files after every stage, for machines that return few files:
DIR2/target.safetensors and DIR2/rest.tar (everything else; `tar -xf rest.tar -C DIR`).
See README.md beside this file.
"""

from __future__ import annotations

import time

T_START = time.time()

import argparse  # noqa: E402
import hashlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import tarfile  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import corpus as corpus_mod  # noqa: E402
import numpy as np  # noqa: E402
import pairlib  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

STAGES = ("data", "target", "drafter", "draft", "eval")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--pack", type=Path, default=None,
                   help="also write DIR/target.safetensors + DIR/rest.tar after every stage")
    p.add_argument("--cache-dir", type=Path, default=Path("/tmp/demo_pair_cache"),
                   help="token arrays (too large for --out)")
    p.add_argument("--fresh", action="store_true", help="ignore stages done in --out")
    p.add_argument("--resume-from", type=Path, default=None,
                   help="a --pack folder of an earlier call (target.safetensors + rest.tar): "
                        "unpacked into --out first, then its finished stages are skipped")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                   help="training precision; auto: bf16 autocast on CUDA, float32 on CPU")
    p.add_argument("--deadline-seconds", type=float, default=570.0,
                   help="wall-clock limit for the whole call (0: none); later stages shrink "
                        "their budgets to fit")
    p.add_argument("--eval-interval-seconds", type=float, default=20.0)
    # corpus + tokenizer
    g = p.add_argument_group("corpus")
    g.add_argument("--extra-root", action="append", default=[])
    g.add_argument("--max-files", type=int, default=0, help="0: all (toy runs: a sample)")
    g.add_argument("--max-file-bytes", type=int, default=1_000_000)
    g.add_argument("--val-percent", type=float, default=1.0)
    g.add_argument("--max-train-tokens", type=int, default=64_000_000)
    g.add_argument("--tokenizer-sample-bytes", type=int, default=64_000_000)
    g.add_argument("--vocab-size", type=int, default=4096)
    g.add_argument("--num-prompts", type=int, default=32)
    g.add_argument("--prompt-len", type=int, default=64)
    g.add_argument("--cont-len", type=int, default=64)
    # target
    g = p.add_argument_group("target")
    g.add_argument("--target-seconds", type=float, default=240.0)
    g.add_argument("--target-steps", type=int, default=0,
                   help="fixed step count (LR schedule by step); 0: by time")
    g.add_argument("--target-layers", type=int, default=5)
    g.add_argument("--target-batch", type=int, default=256)
    g.add_argument("--seq-len", type=int, default=512)
    g.add_argument("--target-lr", type=float, default=3e-3)
    g.add_argument("--target-warmup", type=int, default=200)
    g.add_argument("--compile", action="store_true", help="torch.compile the target")
    # drafter
    g = p.add_argument_group("drafter")
    g.add_argument("--drafter-seconds", type=float, default=150.0)
    g.add_argument("--drafter-steps", type=int, default=0)
    g.add_argument("--drafter-batch", type=int, default=64)
    g.add_argument("--drafter-lr", type=float, default=2e-3)
    g.add_argument("--drafter-warmup", type=int, default=100)
    g.add_argument("--drafter-unroll", type=int, default=5,
                   help="unrolled steps per position, the bootstrap step included")
    g.add_argument("--drafter-inproj-noise", type=float, default=1e-3)
    g.add_argument("--drafter-greedy-frac", type=float, default=0.0,
                   help="share of each batch taken from the target's own greedy "
                        "continuations of real 64-token prompts (0: real text only)")
    g.add_argument("--drafter-greedy-pool", type=int, default=1024)
    g.add_argument("--drafter-init", type=Path, default=None,
                   help="start from this drafter.safetensors (a drafter trained before, e.g. "
                        "`speculant export-hf src/speculant/demo` writes one) instead of the "
                        "target's layer")
    g.add_argument("--drafter-inter", type=int, default=0,
                   help="the drafter's MLP width (0: --drafter-init's, else the target's); "
                        "wider than --drafter-init's, the added units start with zero "
                        "down_proj columns (the same function)")
    # draft model
    g = p.add_argument_group("draft model")
    g.add_argument("--draft-seconds", type=float, default=60.0)
    g.add_argument("--draft-steps", type=int, default=0)
    g.add_argument("--draft-batch", type=int, default=128)
    g.add_argument("--draft-lr", type=float, default=3e-3)
    g.add_argument("--draft-warmup", type=int, default=100)
    g.add_argument("--draft-loss", choices=("kd", "lm"), default="kd",
                   help="kd: forward KL to the target's distribution; lm: next-token CE")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- plumbing


def now() -> float:
    return time.time() - T_START


def say(msg: str):
    print(f"[{now():7.1f}s] {msg}", flush=True)


class Log:
    def __init__(self, path: Path, append: bool):
        self.f = open(path, "a" if append else "w")

    def __call__(self, **rec):
        rec.setdefault("t", round(now(), 3))
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json(path: Path, obj):
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def save_safetensors(path: Path, tensors: dict, metadata: dict | None = None):
    """float32 safetensors with a byte-stable layout (sorted names, sorted JSON header), so
    that equal weights give equal files (safetensors' own writer orders metadata by hash)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu", torch.float32).contiguous()
        b = t.numpy().astype("<f4", copy=False).tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)
    from safetensors.torch import load_file

    back = load_file(str(tmp))
    if sorted(back) != sorted(tensors) or any(
            not torch.equal(back[k], tensors[k].detach().to("cpu", torch.float32))
            for k in tensors):
        raise RuntimeError(f"{path.name}: safetensors round trip failed")
    os.replace(tmp, path)


def pack(out: Path, dest: Path | None):
    """Mirror `out` into dest/target.safetensors + dest/rest.tar (few files to fetch)."""
    if dest is None:
        return
    dest.mkdir(parents=True, exist_ok=True)
    tgt = out / "target.safetensors"
    if tgt.exists():
        tmp = dest / "target.safetensors.tmp"
        tmp.write_bytes(tgt.read_bytes())
        os.replace(tmp, dest / "target.safetensors")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for f in sorted(out.iterdir()):
            if f.is_file() and f.name != "target.safetensors" and not f.name.endswith(".tmp"):
                tar.add(f, arcname=f.name)
    tmp = dest / "rest.tar.tmp"
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, dest / "rest.tar")


def unpack(src: Path, out: Path):
    """Inverse of pack(): src/rest.tar and src/target.safetensors into out."""
    rest = src / "rest.tar"
    if rest.exists():
        with tarfile.open(rest) as tar:
            for m in tar.getmembers():
                if not m.isfile() or "/" in m.name or m.name.startswith("."):
                    raise RuntimeError(f"unexpected member {m.name!r} in {rest}")
                (out / m.name).write_bytes(tar.extractfile(m).read())
    if (src / "target.safetensors").exists():
        (out / "target.safetensors").write_bytes((src / "target.safetensors").read_bytes())
    say(f"unpacked {src} into {out}")


class Budget:
    """Shares the time left before the deadline among the remaining training stages."""

    RESERVE = {"eval": 25.0, "save": 5.0}

    def __init__(self, args):
        self.deadline = args.deadline_seconds
        self.want = {"target": args.target_seconds, "drafter": args.drafter_seconds,
                     "draft": args.draft_seconds}

    def grant(self, stage: str, remaining_stages: list[str], args) -> float:
        want = self.want[stage]
        if not self.deadline:
            args.hard_stop = None
            return want
        args.hard_stop = (self.deadline - sum(self.RESERVE.values())
                          - 10.0 * (len(remaining_stages) - 1))
        left = self.deadline - now() - sum(self.RESERVE.values())
        total = sum(self.want[s] for s in remaining_stages)
        if total <= left:
            return want
        got = max(1.0, want * left / total)
        say(f"{stage}: budget {want:.0f}s shrunk to {got:.0f}s to meet the deadline")
        return got


def lr_at(step: int, progress: float, peak: float, warmup: int, floor: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(max(progress, 0.0), 1.0)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


class Schedule:
    """Progress by step count when steps are fixed, else by training time against budget."""

    def __init__(self, steps: int, seconds: float, hard_stop: float | None = None):
        self.steps, self.seconds = steps, seconds
        self.hard_stop = hard_stop  # process time (now()) at which a fixed-step run stops
        self.t0 = time.time()
        self.paused = 0.0

    def elapsed(self) -> float:
        return time.time() - self.t0 - self.paused

    def progress(self, step: int) -> float:
        if self.steps:
            return step / self.steps
        return self.elapsed() / self.seconds

    def done(self, step: int) -> bool:
        if self.steps:
            if self.hard_stop is not None and now() >= self.hard_stop and step < self.steps:
                say(f"WARNING: stopped at step {step} of {self.steps} to meet the deadline")
                self.steps = step
            return step >= self.steps
        return self.elapsed() >= self.seconds


class Pause:
    def __init__(self, sched: Schedule):
        self.sched = sched

    def __enter__(self):
        self.t = time.time()

    def __exit__(self, *a):
        self.sched.paused += time.time() - self.t


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def autocast(dev, on: bool):
    if on:
        return torch.autocast(dev.type, dtype=torch.bfloat16)
    return torch.autocast(dev.type, enabled=False)


def windows(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator):
    """Random windows [batch, length] of a 1-D token stream (on its device)."""
    hi = stream.numel() - length
    off = torch.randint(0, max(hi, 1), (batch,), generator=gen, device=stream.device)
    idx = off[:, None] + torch.arange(length, device=stream.device)[None, :]
    return stream[idx].long()


def fixed_windows(stream: torch.Tensor, n: int, length: int) -> torch.Tensor:
    length = min(length, stream.numel())
    n = max(1, min(n, stream.numel() // length))
    step = stream.numel() // n
    return torch.stack([stream[i * step:i * step + length] for i in range(n)]).long()


def count_params(module, trainable_only=False) -> int:
    seen, n = set(), 0
    for p in module.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        n += p.numel()
    return n


def adamw(params_groups, lr, dev):
    kw = {"lr": lr, "betas": (0.9, 0.95), "eps": 1e-8}
    if dev.type == "cuda":
        kw["fused"] = True
    return torch.optim.AdamW(params_groups, **kw)


def decay_groups(model, wd: float):
    decay, no = [], []
    seen = set()
    for n, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 and "embed" not in n else no).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no, "weight_decay": 0.0}]


# ----------------------------------------------------------------------------- stage: data


def stage_data(args, out: Path, state: dict, log: Log):
    from tokenizers import Tokenizer

    t0 = time.time()
    got = corpus_mod.collect(args.extra_root, args.max_files, args.max_file_bytes,
                             args.val_percent, args.seed, log=say)
    info, texts = got["info"], got["texts"]
    tok_path = out / "tokenizer.json"
    reuse = "data" in state["stages_done"] and tok_path.exists()
    if reuse:
        tok = Tokenizer.from_file(str(tok_path))
        old = json.loads((out / "corpus.json").read_text())
        if old.get("file_list_sha256") != info["file_list_sha256"]:
            say("WARNING: the file list differs from the one recorded in corpus.json")
        say("tokenizer: reused from --out")
    else:
        sample = corpus_mod.tokenizer_sample(texts, got["train"], args.tokenizer_sample_bytes,
                                             args.seed)
        t1 = time.time()
        tok = corpus_mod.train_tokenizer(sample, args.vocab_size)
        info["tokenizer_sample_bytes"] = sum(len(s) for s in sample)
        info["tokenizer_seconds"] = round(time.time() - t1, 2)
        tok.save(str(tok_path))
        say(f"tokenizer: vocab {tok.get_vocab_size()} from "
            f"{info['tokenizer_sample_bytes'] / 1e6:.1f} MB in {info['tokenizer_seconds']} s")
    eos_id = tok.token_to_id(corpus_mod.EOS)
    vocab = tok.get_vocab_size()
    if vocab != args.vocab_size:
        say(f"WARNING: tokenizer vocab {vocab} != {args.vocab_size} (corpus too small?)")
    # train stream: seeded shuffle of the training files, capped
    order = list(got["train"])
    random.Random(args.seed).shuffle(order)
    key = hashlib.sha256(f"{info['file_list_sha256']}|{sha256_file(tok_path)}|{args.seed}|"
                         f"{args.max_train_tokens}".encode()).hexdigest()[:16]
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    cache = args.cache_dir / f"tokens-{key}.npz"
    t1 = time.time()
    val_docs = [e.ids for e in corpus_mod.encode_many(tok, [texts[p] for p in got["val"]])]
    if cache.exists():
        z = np.load(cache)
        train_arr, used = z["train"], int(z["used"])
        say(f"tokens: reused {cache}")
    else:
        train_arr, used = corpus_mod.encode_stream(tok, [texts[p] for p in order], eos_id,
                                                   args.max_train_tokens)
        np.savez(cache, train=train_arr, used=used)
    val_arr = np.concatenate([np.asarray(d + [eos_id], np.uint16) for d in val_docs]) \
        if val_docs else np.zeros(0, np.uint16)
    info.update({
        "tokenizer": {"type": "byte-level BPE (tokenizers)", "vocab_size": vocab,
                      "eos_token": corpus_mod.EOS, "eos_id": eos_id,
                      "sha256": sha256_file(tok_path)},
        "documents": "concatenated, </s> after each document",
        "train_order": f"random.Random({args.seed}).shuffle(sorted train paths)",
        "max_train_tokens": args.max_train_tokens,
        "train_files_used": used,
        "tokens_train": int(train_arr.size),
        "tokens_val": int(val_arr.size),
        "bytes_per_token_train": round(sum(len(texts[p].encode()) for p in order[:used])
                                       / max(1, train_arr.size), 3),
        "encode_seconds": round(time.time() - t1, 2),
    })
    say(f"tokens: train {train_arr.size:,} from {used} files, val {val_arr.size:,} "
        f"({info['encode_seconds']} s)")
    # validation prompts: 64-token windows of held-out files + their real continuations
    prompts = make_val_prompts(val_docs, got["val"], args)
    write_json(out / "val_prompts.json", prompts)
    if len(prompts["prompts"]) < args.num_prompts:
        say(f"WARNING: only {len(prompts['prompts'])} validation prompts")
    if not reuse:
        write_json(out / "corpus.json", info)
    log(stage="data", kind="done", seconds=round(time.time() - t0, 2),
        tokens_train=int(train_arr.size), tokens_val=int(val_arr.size), vocab=vocab)
    return tok, eos_id, train_arr, val_arr, prompts


def make_val_prompts(val_docs, val_paths, args) -> dict:
    need = args.prompt_len + args.cont_len
    order = sorted(range(len(val_paths)),
                   key=lambda i: hashlib.sha256(val_paths[i].encode()).hexdigest())
    rng = random.Random(args.seed + 7)
    items, used = [], set()
    for _ in range(4):  # more windows per file only if there are too few files
        for i in order:
            ids = val_docs[i]
            if len(ids) < need or len(items) >= args.num_prompts:
                continue
            off = rng.randrange(0, len(ids) - need + 1)
            if (i, off) in used:
                continue
            used.add((i, off))
            items.append({"prompt": ids[off:off + args.prompt_len],
                          "continuation": ids[off + args.prompt_len:off + need],
                          "source": os.path.basename(val_paths[i]), "offset": off})
        if len(items) >= args.num_prompts:
            break
    return {"description": f"{len(items)} windows of held-out (validation) files: "
                           f"{args.prompt_len} prompt tokens + the real {args.cont_len}-token "
                           "continuation; token ids of tokenizer.json",
            "prompt_len": args.prompt_len, "continuation_len": args.cont_len,
            "prompts": items}


# ----------------------------------------------------------------------------- stage: target


def stage_target(args, out, dev, use_bf16, train_ids, val_ids, eos_id, budget, log):
    cfg_d = pairlib.config_dict(dict(pairlib.TARGET_ARCH, num_hidden_layers=args.target_layers,
                                     max_position_embeddings=max(512, args.seq_len)), eos_id)
    torch.manual_seed(args.seed)
    model = pairlib.build_hf(cfg_d).to(dev)
    assert model.lm_head.weight is model.model.embed_tokens.weight, "embeddings not tied"
    n_params = count_params(model)
    say(f"target: {n_params:,} parameters, budget {budget:.0f}s"
        + (f", {args.target_steps} steps" if args.target_steps else ""))
    fwd = torch.compile(model) if args.compile else model
    opt = adamw(decay_groups(model, 0.1), args.target_lr, dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed + 11)
    T, B, V = args.seq_len, args.target_batch, cfg_d["vocab_size"]
    val_x = fixed_windows(val_ids, 64, T + 1)

    def val_loss():
        model.eval()
        tot, n = 0.0, 0
        with torch.no_grad(), autocast(dev, use_bf16):
            for i in range(0, val_x.shape[0], 16):
                xb = val_x[i:i + 16]
                lg = fwd(input_ids=xb[:, :-1]).logits.float()
                tot += F.cross_entropy(lg.reshape(-1, V), xb[:, 1:].reshape(-1),
                                       reduction="sum").item()
                n += xb[:, 1:].numel()
        model.train()
        return tot / n

    model.train()
    sched = Schedule(args.target_steps, budget, args.hard_stop)
    step, pending, last_eval, tokens = 0, [], time.time(), 0
    while not sched.done(step):
        lr = lr_at(step, sched.progress(step), args.target_lr, args.target_warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x = windows(train_ids, B, T + 1, gen)
        with autocast(dev, use_bf16):
            logits = fwd(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, V), x[:, 1:].reshape(-1))
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens += B * T
        pending.append((step, lr, loss.detach(), gn.detach()))
        if len(pending) >= 25 or sched.done(step):
            with Pause(sched):
                vals = torch.stack([torch.stack([p[2].float(), p[3].float()])
                                    for p in pending]).tolist()
                for (s, lr_, _, _), (lv, gv) in zip(pending, vals, strict=True):
                    log(stage="target", kind="train", step=s, loss=round(lv, 5),
                        grad_norm=round(gv, 4), lr=lr_, tokens=s * B * T,
                        train_seconds=round(sched.elapsed(), 3))
                pending = []
        if time.time() - last_eval > args.eval_interval_seconds or sched.done(step):
            with Pause(sched):
                vl = val_loss()
                el = sched.elapsed()
                log(stage="target", kind="val", step=step, val_loss=round(vl, 5),
                    tokens=tokens, train_seconds=round(el, 3))
                say(f"target step {step} loss {loss.item():.4f} val {vl:.4f} "
                    f"lr {lr:.2e} {tokens / max(el, 1e-9) / 1e6:.2f}M tok/s")
                last_eval = time.time()
    sync(dev)
    el = sched.elapsed()
    vl = val_loss()
    model.eval()
    say(f"target done: {step} steps, {tokens / 1e6:.0f}M tokens in {el:.0f}s, val loss {vl:.4f}")
    write_json(out / "target_config.json", cfg_d)
    save_safetensors(out / "target.safetensors", pairlib.hf_state_dict(model),
                     {"format": "pt", "config": "target_config.json"})
    res = {"parameters": n_params, "steps": step, "tokens_seen": tokens,
           "train_seconds": round(el, 2), "tokens_per_second": round(tokens / max(el, 1e-9)),
           "val_loss": round(vl, 5), "batch": [B, T], "lr": args.target_lr,
           "warmup_steps": args.target_warmup, "schedule": "linear warmup, cosine to 0.1x",
           "optimizer": "AdamW(0.9, 0.95), wd 0.1 on matrices (not embedding/norms), clip 1.0",
           "precision": "bf16 autocast" if use_bf16 else "float32",
           "compiled": bool(args.compile)}
    log(stage="target", kind="done", **res)
    return model, res


# ----------------------------------------------------------------------------- stage: drafter


def target_states(tv, x, use_bf16, dev):
    with torch.no_grad(), autocast(dev, use_bf16):
        st = tv(x)
    logp = torch.log_softmax(st.pop("logits").float(), dim=-1)
    st["p"] = logp.exp()
    st["neg_entropy"] = (st["p"] * logp).sum(-1)  # sum_v p log p, per position
    st["argmax"] = logp.argmax(-1)
    return st


def drafter_losses(drafter, tv, x, st, J):
    """Unrolled chain over every position c in [0, T-J] of x [B, T]; step j feeds x[c+j]
    (real-text teacher forcing) and predicts the target's distribution at c+j."""
    B, T = x.shape
    R = T - J + 1
    dev = x.device
    cos, sin = pairlib.rope_tables(torch.arange(R, device=dev), drafter.hd, drafter.theta)
    E = tv.embed.detach()
    k, v = st["k"][:, :, :R], st["v"][:, :, :R]
    carry = st["h"][:, :R]
    kls, agree = [], []
    for j in range(J):
        h = drafter.step(E, x[:, j:j + R], carry, cos, sin, k, v, causal=True)
        logq = torch.log_softmax((h @ E.t().to(h.dtype)).float(), dim=-1)
        # KL(p || q) = sum p log p - sum p log q
        kl = st["neg_entropy"][:, j:j + R] - (st["p"][:, j:j + R] * logq).sum(-1)
        kls.append(kl.mean())
        agree.append((logq.argmax(-1) == st["argmax"][:, j:j + R]).float().mean())
        carry = h
    return torch.stack(kls), torch.stack(agree)


def stage_drafter(args, out, dev, use_bf16, target, train_ids, val_ids, budget, log):
    tv = pairlib.TargetView(target)
    for p in target.parameters():
        p.requires_grad_(False)
    cfg = target.config
    torch.manual_seed(args.seed + 21)
    g = torch.Generator().manual_seed(args.seed + 22)
    if args.drafter_init is None:
        drafter = pairlib.Drafter.for_target(tv, cfg.intermediate_size).to(dev)
        drafter.init_from_target(tv, args.drafter_inproj_noise, g)
    else:  # continue a drafter trained before, at its own MLP width
        from safetensors.torch import load_file

        drafter = pairlib.Drafter.from_export_state(load_file(str(args.drafter_init)), tv)
        drafter = drafter.to(dev)
        say(f"drafter: continued from {args.drafter_init}")
    have = drafter.layer.mlp.up_proj.weight.shape[0]  # its MLP units, fresh or continued
    inter = args.drafter_inter or have
    if inter != have:
        drafter = pairlib.widen_drafter_mlp(drafter, inter, g).to(dev)
        say(f"drafter: MLP widened to {inter} units (added units: zero down_proj columns)")
    n_tr = count_params(drafter, trainable_only=True)
    J, T, B = args.drafter_unroll, args.seq_len, args.drafter_batch
    say(f"drafter: {n_tr:,} trainable parameters, {J} unrolled steps, budget {budget:.0f}s")
    opt = adamw(decay_groups(drafter, 0.01), args.drafter_lr, dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed + 23)
    val_x = fixed_windows(val_ids, 16, T)
    t_pool = time.time()
    pool = None
    n_greedy = int(round(B * args.drafter_greedy_frac))
    if n_greedy:
        # the target's own greedy continuations of real prompts (what the runtime feeds)
        P = min(64, T // 2)
        seeds = windows(train_ids, args.drafter_greedy_pool, P, gen)
        parts = []
        with torch.no_grad(), autocast(dev, use_bf16):
            for i in range(0, seeds.shape[0], 1024):
                s = seeds[i:i + 1024]
                parts.append(torch.cat([s, tv.greedy(s, T - P)], dim=1))
        pool = torch.cat(parts)
        say(f"drafter: greedy pool {tuple(pool.shape)} in {time.time() - t_pool:.1f}s")

    def val():
        drafter.eval()
        kl_sum = torch.zeros(J, device=dev)
        ag_sum = torch.zeros(J, device=dev)
        n = 0
        with torch.no_grad():
            for i in range(0, val_x.shape[0], 8):
                xb = val_x[i:i + 8]
                st = target_states(tv, xb, use_bf16, dev)
                with autocast(dev, use_bf16):
                    kl, ag = drafter_losses(drafter, tv, xb, st, J)
                kl_sum += kl * xb.shape[0]
                ag_sum += ag * xb.shape[0]
                n += xb.shape[0]
        drafter.train()
        return (kl_sum / n).tolist(), (ag_sum / n).tolist()

    kl0, ag0 = val()
    log(stage="drafter", kind="val", step=0, kl=[round(x, 5) for x in kl0],
        agree=[round(x, 4) for x in ag0], train_seconds=0.0)
    say(f"drafter init: val KL {[round(x, 3) for x in kl0]} agree {[round(x, 3) for x in ag0]}")
    sched = Schedule(args.drafter_steps, budget, args.hard_stop)
    step, pending, last_eval = 0, [], time.time()
    while not sched.done(step):
        lr = lr_at(step, sched.progress(step), args.drafter_lr, args.drafter_warmup)
        for gr in opt.param_groups:
            gr["lr"] = lr
        x = windows(train_ids, B, T, gen)
        if pool is not None:
            idx = torch.randint(0, pool.shape[0], (n_greedy,), generator=gen, device=dev)
            x = torch.cat([pool[idx], x[n_greedy:]], dim=0)
        st = target_states(tv, x, use_bf16, dev)
        with autocast(dev, use_bf16):
            kl, ag = drafter_losses(drafter, tv, x, st, J)
        loss = kl.mean()
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        pending.append((step, lr, torch.cat([loss.detach()[None], gn.detach()[None].float(),
                                             kl.detach(), ag.detach()])))
        if len(pending) >= 25 or sched.done(step):
            with Pause(sched):
                vals = torch.stack([p[2] for p in pending]).tolist()
                for (s, lr_, _), v in zip(pending, vals, strict=True):
                    log(stage="drafter", kind="train", step=s, loss=round(v[0], 5),
                        grad_norm=round(v[1], 4), lr=lr_,
                        kl=[round(a, 5) for a in v[2:2 + J]],
                        agree=[round(a, 4) for a in v[2 + J:]],
                        train_seconds=round(sched.elapsed(), 3))
                pending = []
        if time.time() - last_eval > args.eval_interval_seconds or sched.done(step):
            with Pause(sched):
                kl_v, ag_v = val()
                log(stage="drafter", kind="val", step=step, kl=[round(a, 5) for a in kl_v],
                    agree=[round(a, 4) for a in ag_v], train_seconds=round(sched.elapsed(), 3))
                say(f"drafter step {step} loss {loss.item():.4f} val KL "
                    f"{[round(a, 3) for a in kl_v]} agree {[round(a, 3) for a in ag_v]}")
                last_eval = time.time()
    el = sched.elapsed()
    kl_v, ag_v = val()
    drafter.eval()
    meta = {"format": "pt", "hidden": str(drafter.H), "embedding_scale": repr(drafter.scale),
            "embedding": "target model.embed_tokens.weight (tied LM head), frozen",
            "carry_0": "target hidden state after the final norm at the last consumed position",
            "kv_source_layer": str(len(target.model.layers) - 1),
            "rope_theta": repr(drafter.theta), "position_id": "c (last consumed) at every step",
            "teacher_forcing": "real text"
            + (f" + {args.drafter_greedy_frac:.2f} target greedy" if n_greedy else "")}
    save_safetensors(out / "drafter.safetensors", drafter.export_state(), meta)
    res = {"trainable_parameters": n_tr, "steps": step, "train_seconds": round(el, 2),
           "unroll": J, "batch": [B, T], "lr": args.drafter_lr,
           "loss": "mean over steps of forward KL(target || drafter), bootstrap step included",
           "teacher_forcing": meta["teacher_forcing"],
           "greedy_frac": args.drafter_greedy_frac, "inproj_noise": args.drafter_inproj_noise,
           "val_kl_by_step": kl_v, "val_agree_by_step": ag_v,
           "val_agree_note": "teacher-forced on real val text: argmax(drafter step j at c) == "
                             "argmax(target at c+j); step 0 is the bootstrap"}
    say(f"drafter done: {step} steps in {el:.0f}s, val KL {[round(a, 3) for a in kl_v]}, "
        f"agree {[round(a, 3) for a in ag_v]}")
    log(stage="drafter", kind="done", **res)
    return drafter, res


# ----------------------------------------------------------------------------- stage: draft


def stage_draft(args, out, dev, use_bf16, target, train_ids, val_ids, eos_id, budget, log):
    tv = pairlib.TargetView(target)
    cfg_d = pairlib.config_dict(
        dict(pairlib.DRAFT_ARCH, max_position_embeddings=max(512, args.seq_len)), eos_id)
    torch.manual_seed(args.seed + 31)
    dm = pairlib.build_hf(cfg_d).to(dev)
    n_params = count_params(dm)
    say(f"draft model: {n_params:,} parameters, loss {args.draft_loss}, budget {budget:.0f}s")
    opt = adamw(decay_groups(dm, 0.1), args.draft_lr, dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed + 33)
    T, B, V = args.seq_len, args.draft_batch, cfg_d["vocab_size"]
    val_x = fixed_windows(val_ids, 32, T + 1)

    def val():
        dm.eval()
        ce = kl = ag = 0.0
        n = 0
        with torch.no_grad(), autocast(dev, use_bf16):
            for i in range(0, val_x.shape[0], 16):
                xb = val_x[i:i + 16]
                lq = torch.log_softmax(dm(input_ids=xb[:, :-1]).logits.float(), -1)
                lp = torch.log_softmax(tv(xb[:, :-1])["logits"].float(), -1)
                m = xb[:, 1:].numel()
                ce += F.nll_loss(lq.reshape(-1, V), xb[:, 1:].reshape(-1),
                                 reduction="sum").item()
                kl += (lp.exp() * (lp - lq)).sum().item()
                ag += (lq.argmax(-1) == lp.argmax(-1)).sum().item()
                n += m
        dm.train()
        return ce / n, kl / n, ag / n

    dm.train()
    sched = Schedule(args.draft_steps, budget, args.hard_stop)
    step, pending, last_eval = 0, [], time.time()
    while not sched.done(step):
        lr = lr_at(step, sched.progress(step), args.draft_lr, args.draft_warmup)
        for gr in opt.param_groups:
            gr["lr"] = lr
        x = windows(train_ids, B, T + 1, gen)
        with autocast(dev, use_bf16):
            logits = dm(input_ids=x[:, :-1]).logits
        lq = torch.log_softmax(logits.float(), -1)
        if args.draft_loss == "kd":
            with torch.no_grad(), autocast(dev, use_bf16):
                tl = tv(x[:, :-1])["logits"]
            lp = torch.log_softmax(tl.float(), -1)
            loss = (lp.exp() * (lp - lq)).sum(-1).mean()
        else:
            loss = F.nll_loss(lq.reshape(-1, V), x[:, 1:].reshape(-1))
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(dm.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        pending.append((step, lr, loss.detach(), gn.detach()))
        if len(pending) >= 25 or sched.done(step):
            with Pause(sched):
                vals = torch.stack([torch.stack([p[2].float(), p[3].float()])
                                    for p in pending]).tolist()
                for (s, lr_, _, _), (lv, gv) in zip(pending, vals, strict=True):
                    log(stage="draft", kind="train", step=s, loss=round(lv, 5),
                        grad_norm=round(gv, 4), lr=lr_, train_seconds=round(sched.elapsed(), 3))
                pending = []
        if time.time() - last_eval > args.eval_interval_seconds or sched.done(step):
            with Pause(sched):
                ce, kl, ag = val()
                log(stage="draft", kind="val", step=step, val_loss=round(ce, 5),
                    val_kl=round(kl, 5), val_agree=round(ag, 4),
                    train_seconds=round(sched.elapsed(), 3))
                say(f"draft step {step} loss {loss.item():.4f} val CE {ce:.4f} KL {kl:.4f} "
                    f"agree {ag:.3f}")
                last_eval = time.time()
    el = sched.elapsed()
    ce, kl, ag = val()
    dm.eval()
    write_json(out / "draft_config.json", cfg_d)
    save_safetensors(out / "draft.safetensors", pairlib.hf_state_dict(dm),
                     {"format": "pt", "config": "draft_config.json"})
    res = {"parameters": n_params, "steps": step, "train_seconds": round(el, 2),
           "loss": args.draft_loss, "batch": [B, T], "lr": args.draft_lr,
           "val_loss": round(ce, 5), "val_kl_to_target": round(kl, 5),
           "val_top1_agreement_with_target": round(ag, 4)}
    say(f"draft model done: {step} steps in {el:.0f}s, val CE {ce:.4f}, KL {kl:.4f}, "
        f"agree {ag:.3f}")
    log(stage="draft", kind="done", **res)
    return dm, res


# ----------------------------------------------------------------------------- stage: eval


def stage_eval(args, out, dev, target, drafter, dm, prompts, log):
    items = prompts["prompts"]
    if not items:
        say("eval: no validation prompts; skipped")
        return {}
    t0 = time.time()
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    tv = pairlib.TargetView(target)
    chk = tv.check(torch.tensor([it["prompt"] for it in items[:4]], device=dev))
    say(f"eval: functional target forward vs transformers, max|dlogits| {chk:.2e}")
    # the vectorised chain must equal the plain §9.4 loop on one context
    ctx = items[0]["prompt"]
    pend = items[0]["continuation"][0]
    ref = pairlib.drafter_reference_round(tv, drafter, ctx, pend, 8)
    stream = torch.tensor([ctx + [pend]], device=dev)
    vec = pairlib.chain_drafts_all_positions(tv, drafter, stream, 8)[0, len(ctx) - 1].tolist()
    if ref != vec:
        say(f"WARNING: vectorised chain {vec} != reference loop {ref}")
    rep = pairlib.acceptance_report(tv, [it["prompt"] for it in items],
                                    [it["continuation"] for it in items], drafter=drafter,
                                    draft_model=dm, new_tokens=args.cont_len)
    rep["num_prompts"] = len(items)
    rep["new_tokens"] = args.cont_len
    rep["precision"] = "float32 (TF32 off)"
    rep["reference_loop_matches_vectorised"] = ref == vec
    rep["functional_forward_max_abs_logit_diff"] = chk
    rep["seconds"] = round(time.time() - t0, 2)
    for who in ("drafter", "draft_model"):
        for mode in ("greedy_continuations", "real_text", "real_context"):
            k4 = rep[who][mode]["4"]
            say(f"eval {who:11s} {mode:20s} k=4: mean accepted length "
                f"{k4['mean_accepted_length']:.3f}, first-draft acceptance "
                f"{k4['first_draft_acceptance']:.3f}")
    log(stage="eval", kind="acceptance", **rep)
    return rep


# ----------------------------------------------------------------------------- main


def contract(target, drafter) -> dict:
    """What the exporter must reproduce (see README.md and pairlib.py)."""
    c = target.config
    return {
        "eos_id_note": "tokenizer.json special token </s>",
        "target_weights": "HF LlamaForCausalLM names; lm_head tied to model.embed_tokens.weight "
                          "(not stored)",
        "target_hidden_output": "model.norm output (after the final RMSNorm) = carry_0 / "
                                "folded-carry seed",
        "drafter_weights": sorted(f"drafter.{k}" for k in drafter.state_dict()),
        "drafter_fused_input": "concat(E[token] * scale, carry): embedding first (width "
                               f"{drafter.H}), carry second (width {drafter.H})",
        "embedding_table": "target model.embed_tokens.weight",
        "embedding_scale": drafter.scale,
        "embedding_scale_expr": f"sqrt({drafter.H})",
        "kv_source": f"target layer {c.num_hidden_layers - 1} (the last): keys after RoPE, "
                     "values; positions 0..c",
        "gqa": f"query head i reads KV head i // {drafter.nh // drafter.nkv}",
        "heads": {"query": drafter.nh, "kv": drafter.nkv, "head_dim": drafter.hd},
        "rope": {"theta": drafter.theta, "style": "HF rotate_half", "query_position": "c"},
        "rms_norm_eps": drafter.eps,
        "drafter_outputs": "h = drafter.norm(x) (next carry); logits = h @ E^T",
        "teacher_forcing": "real text (step j feeds x[c+j]; step 0 is the bootstrap)",
    }


def load_state(out: Path, fresh: bool) -> dict:
    p = out / "summary.json"
    if not fresh and p.exists():
        s = json.loads(p.read_text())
        s.setdefault("stages_done", [])
        return s
    return {"stages_done": []}


def main(argv=None):
    args = parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.resume_from is not None:
        unpack(args.resume_from, out)
    state = load_state(out, args.fresh)
    log = Log(out / "train_log.jsonl", append=bool(state["stages_done"]))
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(args.device)
    use_bf16 = dev.type == "cuda" if args.precision == "auto" else args.precision == "bf16"
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    import tokenizers
    import transformers

    env = {"python": sys.version.split()[0], "torch": torch.__version__,
           "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
           "numpy": np.__version__, "platform": platform.platform(),
           "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "threads": torch.get_num_threads()}
    say(f"start: {env}")
    log(stage="run", kind="start", args={k: str(v) for k, v in vars(args).items()}, env=env)
    state.setdefault("runs", []).append({"args": {k: str(v) for k, v in vars(args).items()},
                                         "env": env})
    timings = state.setdefault("timings", {})
    budget = Budget(args)

    def finish(stage, result=None):
        if result is not None:
            state[stage] = result
        if stage not in state["stages_done"]:
            state["stages_done"].append(stage)
        timings[stage] = round(time.time() - t_stage, 2)
        state["wall_seconds_this_call"] = round(now(), 2)
        write_json(out / "summary.json", state)
        pack(out, args.pack)

    t_stage = time.time()
    tok, eos_id, train_arr, val_arr, prompts = stage_data(args, out, state, log)
    state.update(eos_token=corpus_mod.EOS, eos_id=eos_id, vocab_size=tok.get_vocab_size())
    state["corpus"] = {k: v for k, v in json.loads((out / "corpus.json").read_text()).items()
                       if k != "val_files"}
    finish("data")
    train_ids = torch.from_numpy(train_arr.astype(np.int32)).to(dev)
    val_ids = torch.from_numpy(val_arr.astype(np.int32)).to(dev)

    t_stage = time.time()
    if "target" in state["stages_done"] and (out / "target.safetensors").exists():
        target, _ = pairlib.load_hf(out / "target_config.json", out / "target.safetensors", dev)
        say("target: loaded from --out (stage done)")
    else:
        b = budget.grant("target", ["target", "drafter", "draft"], args)
        target, res = stage_target(args, out, dev, use_bf16, train_ids, val_ids, eos_id, b, log)
        finish("target", res)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)

    t_stage = time.time()
    if "drafter" in state["stages_done"] and (out / "drafter.safetensors").exists():
        from safetensors.torch import load_file

        drafter = pairlib.Drafter.from_export_state(
            load_file(str(out / "drafter.safetensors")), pairlib.TargetView(target))
        drafter = drafter.to(dev).eval()
        say("drafter: loaded from --out (stage done)")
    else:
        b = budget.grant("drafter", ["drafter", "draft"], args)
        drafter, res = stage_drafter(args, out, dev, use_bf16, target, train_ids, val_ids, b, log)
        finish("drafter", res)

    t_stage = time.time()
    if "draft" in state["stages_done"] and (out / "draft.safetensors").exists():
        dm, _ = pairlib.load_hf(out / "draft_config.json", out / "draft.safetensors", dev)
        say("draft model: loaded from --out (stage done)")
    else:
        b = budget.grant("draft", ["draft"], args)
        dm, res = stage_draft(args, out, dev, use_bf16, target, train_ids, val_ids, eos_id, b,
                              log)
        finish("draft", res)

    state["contract"] = contract(target, drafter)
    t_stage = time.time()
    rep = stage_eval(args, out, dev, target, drafter, dm.eval(), prompts, log)
    state["acceptance"] = rep
    try:
        import plot_losses

        plot_losses.plot(out / "train_log.jsonl", out / "loss_curves.png")
        say("loss curves: loss_curves.png")
    except Exception as e:  # noqa: BLE001 - the plot is optional here
        say(f"loss curves not drawn here ({type(e).__name__}: {e})")
    log(stage="run", kind="end", wall_seconds=round(now(), 2))
    files = {}
    for f in sorted(out.iterdir()):
        if f.is_file() and f.name != "summary.json" and not f.name.endswith(".tmp"):
            files[f.name] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
    state["files"] = files
    state["committed_bytes_weights_tokenizer"] = sum(
        files[n]["bytes"] for n in ("target.safetensors", "drafter.safetensors",
                                    "draft.safetensors", "tokenizer.json") if n in files)
    finish("eval")
    say(f"done in {now():.0f}s; outputs in {out}" + (f", packed into {args.pack}"
                                                     if args.pack else ""))


if __name__ == "__main__":
    main()
