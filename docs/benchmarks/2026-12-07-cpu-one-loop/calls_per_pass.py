import sys, collections, speculant
e = speculant.load(sys.argv[2] if len(sys.argv) > 2 else "src/speculant/demo", threads=1)
SRC = speculant.__file__.rsplit("/speculant/", 1)[0] + "/speculant/"
p = e.tokenizer.encode("def fibonacci(n):\n    return")
res = []
for name, kw in (("greedy", {}), ("k4", dict(proposer="chained", k=4))):
    e.generate(p, 40, stop_on_eos=False, **kw)
    calls = collections.Counter()
    sys.setprofile(lambda f, ev, a: ev == "call" and f.f_code.co_filename.startswith(SRC) and calls.update([f.f_code.co_name]))
    g = e.generate(p, 40, stop_on_eos=False, **kw)
    sys.setprofile(None)
    passes = g.stats.target_passes
    res.append(f"{name}: {sum(calls.values())/passes:.0f} calls a pass ({passes} passes)")
print(sys.argv[1], "; ".join(res))
