"""Spec-Bench in `speculant bench --spec-bench`: the vendored questions (``question.jsonl``,
Apache-2.0: ``LICENSE`` and ``NOTICE`` beside this file; ``README.md`` says what they are).

Modules: ``questions`` (read, checked, grouped into the leaderboard's six categories,
selected), ``prompts`` (first turns through the chat template; each question's answer length),
``report`` (the per-category table of a bench report).
"""
