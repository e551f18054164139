import statistics, sys, time
import speculant
e = speculant.load(sys.argv[2] if len(sys.argv) > 2 else "src/speculant/demo", threads=2)
p = e.tokenizer.encode("def fibonacci(n):\n    return")
for _ in range(5): e.generate(p, 64, stop_on_eos=False)
out = {}
for name, kw in (("greedy", {}), ("k4", dict(proposer="chained", k=4)), ("auto", dict(proposer="chained", k="auto"))):
    ts = []
    for _ in range(25):
        t = time.perf_counter(); g = e.generate(p, 64, stop_on_eos=False, **kw); ts.append((time.perf_counter() - t) / len(g.token_ids))
    out[name] = statistics.median(ts) * 1e3
print(sys.argv[1], " ".join(f"{k} {v:.3f}ms" for k, v in out.items()))
