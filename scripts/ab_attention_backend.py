"""The attention kernels ONNX Runtime picks for a pass wider than one token, side by side:
engines of one package whose CUDA sessions differ only in the CUDA EP option ``sdpa_kernel``
(ORT's attention-backend mask: 1 flash, 2 memory-efficient, 8 cuDNN flash; unset: ORT's
choice, cuDNN's SDPA for a multi-token GroupQueryAttention on SM90), for every session or
for the target's alone. Greedy and chained tok/s interleaved repeat by repeat, tokens checked
against the default engine's greedy; then each engine's target pass at widths 1 and 5.

    python3 scripts/ab_attention_backend.py PACKAGE --repeats 5 --k 4
"""

from __future__ import annotations

import argparse
import json
import statistics

import speculant
from speculant.package.loader import load_package
from speculant.session import session as session_module
from speculant_bench.timing import prompts_rate, verify_width_curve

DEVICE = "cuda"
SETTINGS = {  # name -> (the target's sdpa_kernel, the drafter's); None: ORT's choice
    "default": (None, None),
    "flash": ("1", "1"),
    "flash target": ("1", None),
    "efficient target": ("2", None),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("package")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--k", action="append", default=None)
    parser.add_argument("--prompts", default="docs/benchmarks/val8-prompts.json")
    args = parser.parse_args()
    prompts = json.load(open(args.prompts))[:8]
    provider_for, init = session_module.provider_for, session_module.ComponentSession.__init__
    making: dict[str, str | None] = {}

    def patched_init(self, name, *a, **kw):
        making["name"] = name
        return init(self, name, *a, **kw)

    def patched_provider_for(device, seam, **kw):
        providers = provider_for(device, seam, **kw)
        value = making["target"] if making["name"] == making["target_name"] else making["other"]
        if value is not None and not isinstance(providers[0], str):
            providers = [(providers[0][0], {**providers[0][1], "sdpa_kernel": value})]
        return providers

    session_module.ComponentSession.__init__ = patched_init
    session_module.provider_for = patched_provider_for
    engines = {}
    making["target_name"] = load_package(args.package).plan.target  # its component's name
    for name, (target, other) in SETTINGS.items():
        making.update(target=target, other=other)
        engines[name] = speculant.load(args.package, device=DEVICE)

    def run(engine, k):
        return prompts_rate(engine, prompts, k)

    ks = [None, *(args.k or ["4"])]
    want = run(engines["default"], None)[1]
    same = {}
    for name, engine in engines.items():
        for k in ks:
            same[name, k] = run(engine, k)[1] == want
    rates: dict[tuple[str, str | None], list[float]] = {key: [] for key in same}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            for k in ks:
                rates[name, k].append(run(engine, k)[0])
    base = statistics.median(rates["default", None])
    for (name, k), values in rates.items():
        own = statistics.median(rates[name, None])
        print(f"{name:17s} {('k=' + k) if k else 'greedy':7s} {statistics.median(values):8.1f} "
              f"tok/s  {statistics.median(values) / own:.3f}x its greedy  "
              f"{statistics.median(values) / base:.3f}x default greedy  tokens = greedy's: "
              f"{same[name, k]}")
    for name, engine in engines.items():
        curve = verify_width_curve(engine, prompts[0], widths=(1, 5), repeats=20)
        print(name, " ".join(f"t({t.width}) {statistics.median(t.invoke_s) * 1e3:.3f} ms"
                             for t in curve))


if __name__ == "__main__":
    main()
