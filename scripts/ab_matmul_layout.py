"""The target's weights stored [N, K] and multiplied with ``com.microsoft.FusedMatMul``
(``transB=1``) instead of [K, N] with ``MatMul``: the same products, another cuBLAS layout
(TN instead of NN), which may choose other kernels for a block of one and of five tokens.
Writes the rewritten copy of PACKAGE beside it, then greedy and chained tok/s of both,
interleaved repeat by repeat, each checked against its own greedy, and each target's pass at
widths 1 and 5.

    python3 scripts/ab_matmul_layout.py PACKAGE --repeats 5 --k 4
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

import speculant
from speculant.package.loader import load_package
from speculant_bench.timing import prompts_rate, verify_width_curve


def rewrite(package: Path, out: Path) -> int:
    """Copy ``package`` to ``out`` with every target MatMul by a 2-D initializer made a
    FusedMatMul(transB=1) on the transposed initializer; the number rewritten."""
    loaded = load_package(package)
    target_path = Path(loaded.artifacts[loaded.plan.target])
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(package, out)
    relative = target_path.relative_to(package)
    for stale in (out / relative).parent.iterdir():
        stale.unlink()
    model = onnx.load(str(target_path))
    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    transposed = {n.output[0]: n for n in graph.node if n.op_type == "Transpose"
                  and n.input[0] in initializers and len(initializers[n.input[0]].dims) == 2}
    count, dropped = 0, set()
    for node in graph.node:
        if node.op_type != "MatMul":
            continue
        if node.input[1] in transposed:  # MatMul(X, Transpose(W [N, K])): W as it is stored
            dropped.add(node.input[1])
            node.input[1] = transposed[node.input[1]].input[0]
        elif node.input[1] in initializers and len(initializers[node.input[1]].dims) == 2:
            weight = initializers[node.input[1]]  # [K, N] -> [N, K]
            array = numpy_helper.to_array(weight)
            weight.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(array.T), weight.name))
        else:
            continue
        node.op_type, node.domain = "FusedMatMul", "com.microsoft"
        node.attribute.extend([helper.make_attribute("transB", 1)])
        count += 1
    still_read = {name for n in graph.node for name in n.input}
    kept = [n for n in graph.node
            if not (n.op_type == "Transpose" and n.output[0] in dropped
                    and n.output[0] not in still_read)]
    del graph.node[:]
    graph.node.extend(kept)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(out / relative), save_as_external_data=True, all_tensors_to_one_file=True,
              location=relative.name + ".data")
    return count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("package")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--k", default="4")
    parser.add_argument("--prompts", default="docs/benchmarks/val8-prompts.json")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    package = Path(args.package)
    out = package.with_name(package.name + "-transb")
    print("rewritten MatMuls:", rewrite(package, out))
    prompts = json.load(open(args.prompts))[:8]
    engines = {"MatMul [K, N]": speculant.load(package, device=args.device),
               "FusedMatMul transB": speculant.load(out, device=args.device)}

    def run(engine, k):
        return prompts_rate(engine, prompts, k)

    greedy = {name: run(engine, None)[1] for name, engine in engines.items()}
    print("same greedy tokens in both:", greedy["MatMul [K, N]"] == greedy["FusedMatMul transB"])
    for name, engine in engines.items():
        assert run(engine, args.k)[1] == greedy[name], name
    rates = {(name, k): [] for name in engines for k in (None, args.k)}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            for k in (None, args.k):
                rates[name, k].append(run(engine, k)[0])
    base = statistics.median(rates["MatMul [K, N]", None])
    for (name, k), values in rates.items():
        own = statistics.median(rates[name, None])
        label = f"k={k}" if k else "greedy"
        print(f"{name:19s} {label:7s} {statistics.median(values):8.1f} tok/s"
              f"  {statistics.median(values) / own:.3f}x its greedy  "
              f"{statistics.median(values) / base:.3f}x MatMul greedy")
    for name, engine in engines.items():
        curve = verify_width_curve(engine, prompts[0], widths=(1, 5), repeats=20)
        print(name, " ".join(f"t({t.width}) {statistics.median(t.invoke_s) * 1e3:.3f} ms"
                             for t in curve))


if __name__ == "__main__":
    main()
