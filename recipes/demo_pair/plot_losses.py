#!/usr/bin/env python3
"""Loss curves of a demo-pair training log as a PNG.

    python3 recipes/demo_pair/plot_losses.py DIR/train_log.jsonl [OUT.png]

Four panels: target loss (train, validation) against tokens seen; drafter loss and validation
KL per unrolled step; drafter validation agreement per step (teacher-forced, step 0 = the
bootstrap); draft model loss (train, validation CE and KL to the target). Uses matplotlib where
it is installed, else draws the PNG itself with numpy and zlib (coarse, but labelled).
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f"]


def read_log(path: Path) -> list[dict]:
    recs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                recs.append(json.loads(line))
    # a resumed call appends to the log: per stage, keep the last call (segment) that logged it
    seg, segs = 0, []
    for r in recs:
        if r.get("stage") == "run" and r.get("kind") == "start":
            seg += 1
        segs.append(seg)
    last = {r.get("stage"): g for r, g in zip(recs, segs, strict=True)}
    return [r for r, g in zip(recs, segs, strict=True) if g == last.get(r.get("stage"))]


def smooth(y: np.ndarray, n: int = 25) -> np.ndarray:
    if len(y) < n:
        return y
    k = np.ones(n) / n
    pad = np.concatenate([np.full(n - 1, y[0]), y])
    return np.convolve(pad, k, mode="valid")


def series(recs):
    """-> list of panels: (title, xlabel, ylabel, [(label, x, y, style)])"""
    def sel(stage, kind):
        return [r for r in recs if r.get("stage") == stage and r.get("kind") == kind]

    panels = []
    tr, va = sel("target", "train"), sel("target", "val")
    lines = []
    if tr:
        x = np.array([r["tokens"] for r in tr]) / 1e6
        lines.append(("train (smoothed)", x, smooth(np.array([r["loss"] for r in tr])), "-"))
    if va:
        lines.append(("validation", np.array([r["tokens"] for r in va]) / 1e6,
                      np.array([r["val_loss"] for r in va]), "o-"))
    panels.append(("target: cross-entropy", "tokens (M)", "nats/token", lines))

    tr, va = sel("drafter", "train"), sel("drafter", "val")
    lines = []
    if tr:
        lines.append(("train, mean of steps", np.array([r["step"] for r in tr]),
                      smooth(np.array([r["loss"] for r in tr])), "-"))
    if va:
        J = len(va[0]["kl"])
        for j in range(J):
            lines.append((f"val KL step {j}", np.array([r["step"] for r in va]),
                          np.array([r["kl"][j] for r in va]), "o-"))
    panels.append(("drafter: KL(target || drafter)", "step", "nats", lines))

    lines = []
    if va:
        for j in range(len(va[0]["agree"])):
            lines.append((f"step {j}" + (" (bootstrap)" if j == 0 else ""),
                          np.array([r["step"] for r in va]),
                          np.array([r["agree"][j] for r in va]), "o-"))
    panels.append(("drafter: val argmax agreement", "step", "share", lines))

    tr, va = sel("draft", "train"), sel("draft", "val")
    lines = []
    if tr:
        lines.append(("train loss (smoothed)", np.array([r["step"] for r in tr]),
                      smooth(np.array([r["loss"] for r in tr])), "-"))
    if va:
        lines.append(("val CE", np.array([r["step"] for r in va]),
                      np.array([r["val_loss"] for r in va]), "o-"))
        lines.append(("val KL to target", np.array([r["step"] for r in va]),
                      np.array([r["val_kl"] for r in va]), "o-"))
    panels.append(("draft model", "step", "nats", lines))
    return panels


def plot(log_path, png_path):
    recs = read_log(Path(log_path))
    panels = series(recs)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        write_png_fallback(panels, Path(png_path))
        return "numpy"
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for ax, (title, xl, yl, lines) in zip(axes.flat, panels, strict=False):
        for i, (label, x, y, style) in enumerate(lines):
            ax.plot(x, y, style, label=label, color=COLORS[i % len(COLORS)],
                    markersize=3, linewidth=1.2)
        ax.set_title(title)
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        if lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return "matplotlib"


# ----------------------------------------------------------------------------- fallback

# 3x5 glyphs, rows top to bottom, 3 bits each (MSB = left column)
_FONT = {
    "0": "75557", "1": "26227", "2": "71747", "3": "71717", "4": "55711", "5": "74717",
    "6": "74757", "7": "71111", "8": "75757", "9": "75717", ".": "00002", "-": "00700",
    ":": "02020", "(": "24442", ")": "42224", "|": "22222", ",": "00024", "/": "11244",
    "A": "25755", "B": "65656", "C": "34443", "D": "65556", "E": "74647", "F": "74644",
    "G": "34553", "H": "55755", "I": "72227", "J": "11153", "K": "55655", "L": "44447",
    "M": "57755", "N": "65555", "O": "25552", "P": "65644", "Q": "25573", "R": "65655",
    "S": "34716", "T": "72222", "U": "55557", "V": "55552", "W": "55775", "X": "55255",
    "Y": "55222", "Z": "71247", " ": "00000", "=": "07070", "_": "00007",
}


def _hex(c):
    return np.array([int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)], np.uint8)


def _text(img, x, y, s, color=(0, 0, 0), scale=2):
    for ch in s.upper():
        g = _FONT.get(ch, "00000")
        for r, row in enumerate(g):
            bits = int(row, 16)
            for c in range(3):
                if bits & (4 >> c):
                    y0, x0 = y + r * scale, x + c * scale
                    img[y0:y0 + scale, x0:x0 + scale] = color
        x += 4 * scale


def _line(img, x0, y0, x1, y1, color):
    n = int(max(abs(x1 - x0), abs(y1 - y0), 1))
    xs = np.linspace(x0, x1, n + 1).round().astype(int)
    ys = np.linspace(y0, y1, n + 1).round().astype(int)
    h, w, _ = img.shape
    ok = (xs >= 0) & (xs < w - 1) & (ys >= 0) & (ys < h - 1)
    img[ys[ok], xs[ok]] = color
    img[ys[ok] + 1, xs[ok]] = color


def _fmt(v):
    return f"{v:.3g}"


def write_png_fallback(panels, path: Path, W=1200, H=800):
    img = np.full((H, W, 3), 255, np.uint8)
    pw, ph = W // 2, H // 2
    for pi, (title, xl, yl, lines) in enumerate(panels):
        ox, oy = (pi % 2) * pw, (pi // 2) * ph
        L, R, Tm, B = ox + 70, ox + pw - 20, oy + 30, oy + ph - 50
        _text(img, ox + 70, oy + 8, f"{title}  [{yl}]")
        _text(img, (L + R) // 2 - 20, B + 30, xl)
        img[B, L:R] = 0
        img[Tm:B, L] = 0
        if not lines:
            continue
        xs = np.concatenate([np.asarray(x, float) for _, x, _, _ in lines])
        ys = np.concatenate([np.asarray(y, float) for _, _, y, _ in lines])
        ys = ys[np.isfinite(ys)]
        if xs.size == 0 or ys.size == 0:
            continue
        x0, x1 = float(xs.min()), float(xs.max()) or 1.0
        y0, y1 = float(np.percentile(ys, 1)), float(np.percentile(ys, 99.5))
        if x1 == x0:
            x1 = x0 + 1
        if y1 == y0:
            y1 = y0 + 1
        for t in range(5):
            fy = y0 + (y1 - y0) * t / 4
            py = int(B - (B - Tm) * t / 4)
            img[py, L - 4:L] = 0
            _text(img, ox + 6, py - 4, _fmt(fy))
            fx = x0 + (x1 - x0) * t / 4
            px = int(L + (R - L) * t / 4)
            img[B:B + 4, px] = 0
            _text(img, px - 10, B + 10, _fmt(fx))
        for i, (label, x, y, _) in enumerate(lines):
            col = _hex(COLORS[i % len(COLORS)])
            px = L + (np.asarray(x, float) - x0) / (x1 - x0) * (R - L)
            py = B - (np.clip(np.asarray(y, float), y0, y1) - y0) / (y1 - y0) * (B - Tm)
            for a in range(len(px) - 1):
                _line(img, px[a], py[a], px[a + 1], py[a + 1], col)
            if len(px) == 1:
                _line(img, px[0], py[0], px[0] + 1, py[0], col)
            _text(img, R - 200, Tm + 6 + 14 * i, label, color=tuple(int(c) for c in col))
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(H))

    def chunk(tag, data):
        c = struct.pack(">I", len(data)) + tag + data
        return c + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    path.write_bytes(png)


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    log = Path(argv[0])
    png = Path(argv[1]) if len(argv) > 1 else log.with_name("loss_curves.png")
    how = plot(log, png)
    print(f"wrote {png} ({how})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
