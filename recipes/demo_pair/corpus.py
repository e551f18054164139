"""Corpus and tokenizer of the demo pair: Python sources installed on the machine.

Files: every ``*.py`` under the interpreter's stdlib, purelib and platlib, ``site``'s
site-packages and any extra roots; real paths deduplicated; files over ``max_file_bytes`` or not
valid UTF-8 skipped; contents deduplicated by SHA-256 (the first path in sorted order is kept).
Split: a file is validation when ``int(sha256(path)[:8], 16) % 10000 < val_percent * 100``.
Training files are shuffled with the seed and concatenated, ``</s>`` after each document, until
``max_train_tokens``; validation files are concatenated in sorted path order.
"""

from __future__ import annotations

import hashlib
import os
import random
import site
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

EOS = "</s>"


def source_roots(extra: list[str]) -> list[str]:
    paths = sysconfig.get_paths()
    cands = [paths.get("stdlib"), paths.get("purelib"), paths.get("platlib")]
    try:
        cands += site.getsitepackages()
    except AttributeError:  # pragma: no cover - virtualenv's old site.py
        pass
    cands += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    cands += ["/opt/torch/.venv/lib/python3.12/site-packages"]
    cands += list(extra)
    roots = []
    for c in cands:
        if c and os.path.isdir(c):
            r = os.path.realpath(c)
            if r not in roots:
                roots.append(r)
    return sorted(roots)


def list_files(roots: list[str]) -> list[str]:
    seen = set()
    for root in roots:
        for d, dirs, files in os.walk(root):
            dirs.sort()
            for f in files:
                if f.endswith(".py"):
                    seen.add(os.path.realpath(os.path.join(d, f)))
    return sorted(p for p in seen if os.path.isfile(p))


def path_is_val(path: str, val_percent: float) -> bool:
    h = int(hashlib.sha256(path.encode("utf-8")).hexdigest()[:8], 16)
    return (h % 10000) < val_percent * 100


def _read(path: str, max_bytes: int):
    try:
        if os.path.getsize(path) > max_bytes:
            return path, None, "too_large"
        with open(path, "rb") as f:
            raw = f.read()
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return path, None, "undecodable"
    except OSError:
        return path, None, "unreadable"
    if not text.strip():
        return path, None, "empty"
    return path, text, hashlib.sha256(raw).hexdigest()


def collect(extra_roots: list[str], max_files: int, max_file_bytes: int, val_percent: float,
            seed: int, log=print) -> dict:
    t0 = time.time()
    roots = source_roots(extra_roots)
    paths = list_files(roots)
    n_found = len(paths)
    if max_files and len(paths) > max_files:  # toy runs: a seeded sample of the files
        rng = random.Random(seed)
        paths = sorted(rng.sample(paths, max_files))
    with ThreadPoolExecutor(max_workers=min(32, (os.cpu_count() or 2) * 2)) as ex:
        results = list(ex.map(lambda p: _read(p, max_file_bytes), paths, chunksize=64))
    skipped = {"too_large": 0, "undecodable": 0, "unreadable": 0, "empty": 0}
    by_hash: dict[str, str] = {}
    texts: dict[str, str] = {}
    dups = 0
    for path, text, tag in results:
        if text is None:
            skipped[tag] += 1
            continue
        if tag in by_hash:
            dups += 1
            continue
        by_hash[tag] = path
        texts[path] = text
    hashes = {p: h for h, p in by_hash.items()}
    train = sorted(p for p in texts if not path_is_val(p, val_percent))
    val = sorted(p for p in texts if path_is_val(p, val_percent))

    def list_hash(ps):
        return hashlib.sha256("".join(f"{p}\t{hashes[p]}\n" for p in ps).encode()).hexdigest()

    info = {
        "roots": roots,
        "files_found": n_found,
        "files_considered": len(paths),
        "max_files": max_files,
        "max_file_bytes": max_file_bytes,
        "skipped": skipped,
        "duplicates_removed": dups,
        "files_kept": len(texts),
        "files_train": len(train),
        "files_val": len(val),
        "val_percent": val_percent,
        "split_rule": "val iff int(sha256(realpath)[:8], 16) % 10000 < val_percent*100",
        "file_list_sha256": list_hash(sorted(texts)),
        "train_file_list_sha256": list_hash(train),
        "val_file_list_sha256": list_hash(val),
        "file_list_hash_rule": "sha256 of ''.join(f'{path}\\t{sha256(content)}\\n') over sorted "
                               "paths",
        "bytes_train": sum(len(texts[p].encode()) for p in train),
        "bytes_val": sum(len(texts[p].encode()) for p in val),
        "val_files": val,
        "python": sys.version.split()[0],
        "scan_seconds": round(time.time() - t0, 2),
    }
    log(f"[corpus] {n_found} files under {len(roots)} roots; kept {len(texts)} "
        f"(train {len(train)}, val {len(val)}), {dups} duplicates, skipped {skipped}; "
        f"{info['bytes_train'] / 1e6:.1f} MB train text; {info['scan_seconds']} s")
    return {"info": info, "texts": texts, "train": train, "val": val}


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def tokenizer_sample(texts: dict[str, str], train: list[str], sample_bytes: int,
                     seed: int) -> list[str]:
    order = list(train)
    random.Random(seed + 1).shuffle(order)
    out, size = [], 0
    for p in order:
        out.append(texts[p])
        size += len(texts[p])
        if size >= sample_bytes:
            break
    return out


def encode_many(tok, texts: list[str]):
    """encode_batch_fast (no offsets; parallel) where this tokenizers version has it."""
    fast = getattr(tok, "encode_batch_fast", None)
    return fast(texts) if fast is not None else tok.encode_batch(texts)


def encode_stream(tok, texts: list[str], eos_id: int, max_tokens: int | None,
                  chunk: int = 4096) -> tuple[np.ndarray, int]:
    """Concatenate documents with EOS after each; stop after max_tokens. -> (uint16 array,
    documents used)."""
    parts, total, used = [], 0, 0
    for i in range(0, len(texts), chunk):
        batch = texts[i:i + chunk]
        for enc in encode_many(tok, batch):
            ids = enc.ids
            ids.append(eos_id)
            parts.append(np.asarray(ids, dtype=np.uint16))
            total += len(ids)
            used += 1
            if max_tokens and total >= max_tokens:
                break
        if max_tokens and total >= max_tokens:
            break
    arr = np.concatenate(parts) if parts else np.zeros(0, np.uint16)
    if max_tokens:
        arr = arr[:max_tokens]
    return arr, used
