"""Write the bundled demo package: the float32 chained fixture pair, binary .onnx, with its
tokenizer, into src/speculant/demo/ (or the folder given).

    uv run python scripts/make_demo_package.py [OUT_DIR]

The output is deterministic; tests/fixtures checks the committed copy is up to date.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from speculant.fixtures import write_chained_package

DEMO_DIR = Path(__file__).resolve().parents[1] / "src" / "speculant" / "demo"
DEMO_FILES = ("inference_metadata.yaml", "tokenizer.json", "target", "assistant")


def write_demo(root: Path) -> Path:
    """(Re)write the demo package files under ``root``; other files there are left alone."""
    root.mkdir(parents=True, exist_ok=True)
    for name in DEMO_FILES:
        path = root / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    return write_chained_package(root, dtype="float32", fmt="onnx")


def main(argv: list[str]) -> None:
    root = write_demo(Path(argv[0]) if argv else DEMO_DIR)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        print(f"{path.stat().st_size:>8}  {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
