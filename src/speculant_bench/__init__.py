"""`speculant bench`: greedy and each proposer at each k, timed side by side in one run.

    from speculant_bench import BenchConfig, run_bench
    run = run_bench(BenchConfig(package, device="cpu", new_tokens=32, repeats=5))

Modules: ``prompts`` (the prompt set), ``runners`` (what is run), ``timing`` (invoke clocks,
the verify-width curve), ``run`` (warm-up and repeats), ``spread`` (medians with spread),
``report`` (JSON, Markdown, PNG), ``command`` (the CLI's entry point).
"""

from speculant_bench.run import BenchConfig, BenchRun, run_bench

__all__ = ["BenchConfig", "BenchRun", "run_bench"]
