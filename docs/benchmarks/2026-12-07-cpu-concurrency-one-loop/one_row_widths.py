import collections, json, time, sys
import speculant
from speculant import GenerationOptions
from speculant.speculative import step_width
from speculant_tools.builtin import smollm2
engine = speculant.load(smollm2("cpu", batch=16), max_batch=8, threads=2)
prompts = json.loads(open("src/speculant_bench/prompts.json").read())[:8]
proposer = sys.argv[1]
opts = GenerationOptions(max_new_tokens=64, stop_on_eos=False, proposer=proposer, k="auto")
chosen = collections.Counter()
choose = step_width.StepWidth.choose
def counted(self, rows, num_run):
    w = choose(self, rows, num_run); chosen[w] += 1; return w
step_width.StepWidth.choose = counted
for rep in range(2):
    t = time.perf_counter(); lone = [engine.generate(p, opts) for p in prompts]; tl = time.perf_counter() - t
    t = time.perf_counter(); chosen.clear(); sched = [engine.generate_many([p], opts)[0] for p in prompts]; ts = time.perf_counter() - t
    ntok = sum(len(g.token_ids) for g in lone)
    lw = collections.Counter(k for g in lone for k, _ in g.stats.trace)
    print(f"rep {rep}: lone {ntok/tl:.1f} tok/s widths {sorted(lw.items())} acc {sum(g.stats.mean_accepted_length for g in lone)/8:.2f} passes {sum(g.stats.target_passes for g in lone)}")
    print(f"       sched {ntok/ts:.1f} tok/s W {sorted(chosen.items())} acc {sum(g.stats.mean_accepted_length for g in sched)/8:.2f} passes {sum(g.stats.target_passes for g in sched)}")
c = engine.scheduler.widths.costs
print("passes n=1:", {w: round(s*1e3,1) for w, s in sorted(c.passes.get(1).seconds.items())} if c.passes.get(1) else None)
print("propose:", {k: {w: round(s*1e3,1) for w, s in sorted(t.seconds.items())} for k, t in c.propose.items()})
print("propose_rows:", {k: {w: round(s*1e3,1) for w, s in sorted(t.seconds.items())} for k, t in c.propose_rows.items()})
print("outside:", {w: round(s*1e3,1) for w, s in sorted(c.outside.seconds.items())})
print("pooled:", {k: [round(a,2) for a in v.acceptance] for k, v in engine.scheduler.widths.pooled.items()})
lc = engine.proposer_sources.costs
print("lone verify:", {w: round(s*1e3,1) for w, s in sorted(lc.verify.seconds.items())} if hasattr(lc, "verify") else vars(lc).keys())
