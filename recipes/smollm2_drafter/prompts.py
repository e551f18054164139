"""Chat prompts made from text found on the machine: Python docstrings (standard library and
installed packages), README / Markdown / reStructuredText files and package descriptions
(``*.dist-info/METADATA``) under site-packages, and plain files under ``/usr/share/doc``.

    texts = find_texts(max_files=20000)           # [Text(source, name, kind, body)], sorted
    train, held_out = split(texts, held_out_percent=3)
    messages = chat_messages(texts, seed=1234)    # [[{"role": "user", "content": ...}], ...]

Every file is read once; nothing of ours is used. The split is by source file (a hash of its
path), so no held-out prompt shares a file with a training prompt.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
import site
import sys
import sysconfig
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

DOC_EXTENSIONS = (".md", ".rst", ".txt")
MIN_CHARS, MAX_CHARS = 160, 900
MAX_PER_FILE = 6


@dataclass(frozen=True)
class Text:
    source: str  # the file it came from
    name: str  # a dotted Python name, or the file's name
    kind: str  # "docstring" | "document"
    body: str


def roots() -> list[Path]:
    found = {sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}
    found.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    found.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    found.add("/usr/share/doc")
    return sorted({Path(p).resolve() for p in found if Path(p).is_dir()})


def candidate_files(max_files: int) -> list[Path]:
    """Python and documentation files under :func:`roots`, deduplicated by real path, in the
    order of a hash of the path (a spread over packages when capped)."""
    files = set()
    for root in roots():
        for path in root.rglob("*"):
            name = path.name
            if "test" in path.parts or "tests" in path.parts:
                continue
            is_doc = (name.lower().endswith(DOC_EXTENSIONS) or name == "METADATA"
                      or name.upper().startswith("README"))
            if (name.endswith(".py") or is_doc) and path.is_file():
                files.add(path.resolve())
    ordered = sorted(files, key=lambda p: _hash(str(p)))
    return ordered[:max_files] if max_files else ordered


def _hash(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16)


def _clean(text: str) -> str | None:
    text = re.sub(r"\n{3,}", "\n\n", text.strip())
    if len(text) < MIN_CHARS:
        return None
    if len(text) > MAX_CHARS:  # cut at a paragraph (or line) break before MAX_CHARS
        cut = text.rfind("\n\n", 0, MAX_CHARS)
        cut = cut if cut > MIN_CHARS else text.rfind("\n", 0, MAX_CHARS)
        text = text[:cut if cut > MIN_CHARS else MAX_CHARS].rstrip()
    letters = sum(ch.isalpha() for ch in text)
    if letters < 0.5 * len(text) or len(text.split()) < 20 or not text.isascii():
        return None
    return text


def texts_of_file(path: Path) -> list[Text]:
    try:
        if path.stat().st_size > 1_000_000:
            return []
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    out: list[Text] = []
    if path.suffix == ".py":
        try:
            tree = ast.parse(raw)
        except (SyntaxError, ValueError, RecursionError):
            return []
        module = path.stem
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef,
                                 ast.ClassDef)):
                doc = ast.get_docstring(node)
                body = _clean(doc) if doc else None
                if body:
                    name = module if isinstance(node, ast.Module) else f"{module}.{node.name}"
                    out.append(Text(str(path), name, "docstring", body))
            if len(out) >= MAX_PER_FILE:
                break
    else:
        if path.name == "METADATA":  # the description follows the headers
            raw = raw.split("\n\n", 1)[1] if "\n\n" in raw else ""
            name = path.parent.name.split("-")[0]
        else:
            name = path.name
        for paragraph_block in re.split(r"\n(?=#+ |\S+\n[=\-~]{3,})", raw):
            body = _clean(paragraph_block)
            if body:
                out.append(Text(str(path), name, "document", body))
            if len(out) >= MAX_PER_FILE:
                break
    return out


def find_texts(max_files: int = 0, workers: int = 8) -> list[Text]:
    files = candidate_files(max_files)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        groups = list(pool.map(texts_of_file, files, chunksize=64))
    seen, texts = set(), []
    for group in groups:
        for text in group:
            key = hashlib.sha256(text.body.encode()).digest()
            if key not in seen:
                seen.add(key)
                texts.append(text)
    return texts


def split(texts: list[Text], held_out_percent: float) -> tuple[list[Text], list[Text]]:
    held = [t for t in texts if _hash("held-out:" + t.source) % 10000 < held_out_percent * 100]
    chosen = {id(t) for t in held}
    return [t for t in texts if id(t) not in chosen], held


DOCSTRING_FORMS = (
    "Explain what the following Python documentation describes:\n\n{body}",
    "Summarize this docstring of `{name}` in two or three sentences:\n\n{body}",
    "Write a Python function that does what this docstring says:\n\n{body}",
    "What does `{name}` do?",
    "Give an example of how to use `{name}`. Its documentation says:\n\n{body}",
    "{body}\n\nWhat is the most important thing to know about this?",
)
DOCUMENT_FORMS = (
    "Summarize the following text:\n\n{body}",
    "Here is part of a README:\n\n{body}\n\nWhat is this project for?",
    "Rewrite the following in plain English:\n\n{body}",
    "Read this and answer: what are the key points?\n\n{body}",
    "{body}\n\nExplain this to a beginner.",
)


def chat_messages(texts: list[Text], seed: int) -> list[list[dict]]:
    """One user message per text, its form drawn (seeded) from the forms of its kind."""
    rng = random.Random(seed)
    out = []
    for text in texts:
        forms = DOCSTRING_FORMS if text.kind == "docstring" else DOCUMENT_FORMS
        content = rng.choice(forms).format(name=text.name, body=text.body)
        out.append([{"role": "user", "content": content}])
    return out
