import statistics, sys, time, gc, speculant
e = speculant.load("src/speculant/demo", threads=2)
p = e.tokenizer.encode("def fibonacci(n):\n    return")
for _ in range(5): e.generate(p, 64, stop_on_eos=False)
ts = []
for _ in range(40):
    t = time.perf_counter(); g = e.generate(p, 64, stop_on_eos=False); ts.append((time.perf_counter() - t) / 64)
# in-process decomposition: time in ORT runs vs rest
print(sys.argv[1], f"median {statistics.median(ts)*1e3:.3f} ms/token  min {min(ts)*1e3:.3f}")
