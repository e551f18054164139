"""Which quantization of a chained drafter pays on a device: each variant's package (the
target shared by symlink), then ``speculant bench`` of greedy and chained k=4 for each.

    python scripts/drafter_quant_sweep.py PACKAGE --device cuda --out OUT_DIR

Variants: float (the package as it is); int4 symmetric, block 32 (``--quantize-drafter
int4``); int4 with zero points; int4 block 16; int4 with the LM head left in float; int8.
Prints each variant's row (tok/s, × greedy, mean accepted length, ms a round).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from speculant_tools.export.config import EMBEDDING
from speculant_tools.importers.int4 import DRAFTER_ACCURACY_LEVEL, quantize_int4

VARIANTS = {
    "float": None,
    "int4-sym-b32": {},
    "int4-asym-b32": {"symmetric": False},
    "int4-sym-b16": {"block_size": 16},
    "int4-sym-b32-float-head": {"keep": frozenset({EMBEDDING})},
    "int8-sym-b32": {"bits": 8},
}


def variant_package(source: Path, work: Path, name: str, options: dict | None) -> Path:
    if options is None:
        return source
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for entry in source.iterdir():
        # copies: a package admits no symlink leaving it, ONNX no hard-linked external data
        (shutil.copytree if entry.is_dir() else shutil.copyfile)(entry, out / entry.name)
    quantize_int4(out / "assistant" / "model.onnx", DRAFTER_ACCURACY_LEVEL, **options)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("package", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("/tmp/quant-sweep"))
    parser.add_argument("--prompts", default="docs/benchmarks/val8-prompts.json")
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    for name, options in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        try:
            package = variant_package(args.package, args.out / "packages", name, options)
        except Exception as error:  # noqa: BLE001 - a variant the quantizer refuses
            print(f"{name}: not built: {type(error).__name__}: {error}", flush=True)
            continue
        report = args.out / "bench" / name
        done = subprocess.run([sys.executable, "-m", "speculant", "bench", str(package),
                               "--device", args.device, "--prompts", args.prompts,
                               "--proposer", "chained", "--k", "4", "--new-tokens", "64",
                               "--warmup", "1", "--repeats", "3", "--out", str(report)],
                              capture_output=True, text=True)
        rows = [line for line in (report / "bench.md").read_text().splitlines()
                if line.startswith(("| greedy", "| chained"))] if done.returncode == 0 else \
            [done.stderr[-600:]]
        print(f"== {name}", *rows, sep="\n", flush=True)


if __name__ == "__main__":
    main()
