"""`GenerationOptions`: what a request asks for, and the one home of every default.

The API (``Engine.generate`` / ``stream`` / ``chat``), the CLI and the server all read their
defaults here; the CLI's and the server's options are built from the fields (their defaults
and the ``help`` in their metadata, ``speculant.cli.generation_options``). Every field is
checked by type and range in :meth:`GenerationOptions.checked`, at admission, with a
:class:`RequestError` naming the field — never a bare ``TypeError`` or ``ValueError``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from speculant.errors import RequestError
from speculant.workflow.constraint import Grammar
from speculant.workflow.sampler import ACCEPTANCE_METHODS, GUMBEL


def _option(default: object, help_text: str) -> Any:
    """A field the command line offers, with its ``help``."""
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class GenerationOptions:
    """How to decode one request (the prompt and caller arrays come beside it).

    ``proposer``: None (plain decoding) or a kind of ``speculative/kinds.py`` (``chained``,
    ``draft``, ``prompt_lookup``, or ``auto``: chained where the package allows it); ``k``
    drafts per round: ``"auto"`` (the default) picks each round's width from the measured
    acceptance and costs (``speculative/width.py``), an int fixes it, None fixes it at the
    kind's default. ``temperature`` 0 is greedy (argmax,
    bit-exact), and so is any temperature below :data:`MIN_TEMPERATURE` (the limit, and where
    ``score / temperature`` would leave float range); above it tokens are drawn from
    ``T(row)`` (``top_k`` 0: no limit, ``top_p``, ``min_p``) with noise keyed by ``seed``
    and the position (None: a fresh seed per request, reported in the stats), so a seed
    reproduces the text whatever ``k`` and the proposer; ``acceptance`` ``"rejection"``
    verifies by rejection sampling instead (reproducible at a fixed ``k`` only). ``stop``
    strings end the text where they first appear (the stop text is not emitted);
    ``stop_token_ids`` add to the package's EOS ids, which stop the stream unless
    ``stop_on_eos`` is False. ``max_context`` caps the
    stream's length; ``ngram_range = (n_min, n_max)`` is prompt lookup's. ``grammar``: the
    output must match it (:class:`~speculant.workflow.constraint.Grammar`; the ``structured``
    extra), with or without speculation. ``logprobs``: record each generated token's
    log-probability under the target with this many alternatives (``prompt_logprobs``: the
    prompt's too), in ``Generation.logprobs``."""

    max_new_tokens: int = _option(64, "Tokens to generate at most.")
    proposer: str | None = None  # its command-line help lists the kinds registry
    k: int | str | None = _option("auto", "Drafts per round: auto (picked each round from the "
                                  "measured acceptance and pass costs, up to the proposer "
                                  "kind's bound) or a number.")
    temperature: float = _option(0.0, "0: greedy; above 0: sample (the output follows the "
                                      "target's distribution).")
    top_p: float = _option(1.0, "Sample within the smallest set of ids of this mass.")
    top_k: int = _option(0, "Sample among the k most probable ids (0: all).")
    min_p: float = _option(0.0, "Drop ids below this fraction of the most probable one's "
                                "probability.")
    seed: int | None = _option(None, "Seed of the sampling noise: the same seed gives the "
                                     "same text, with or without speculation, at any k "
                                     "(default: a fresh seed per request, printed by "
                                     "--stats).")
    acceptance: str = _option(GUMBEL, "How sampled drafts are accepted: gumbel (keyed noise; "
                                      "reproducible at any k) or rejection (rejection "
                                      "sampling; reproducible at a fixed k only).")
    stop: tuple[str, ...] = _option((), "Stop string (repeatable); the text ends before it.")
    stop_token_ids: tuple[int, ...] = ()
    stop_on_eos: bool = True
    max_context: int | None = None
    ngram_range: tuple[int, int] = (1, 3)
    grammar: Grammar | None = None
    logprobs: int | None = None
    prompt_logprobs: bool = False

    @classmethod
    def of(cls, options: GenerationOptions | int | None = None, /,
           **overrides: object) -> GenerationOptions:
        """``options`` (or the defaults) with ``overrides`` applied; an int is
        ``max_new_tokens`` (``generate(prompt, 16)``). ``speculative=True`` is shorthand for
        ``proposer="chained"``. Unknown names are a :class:`RequestError`."""
        if options is None:
            base = cls()
        elif isinstance(options, GenerationOptions):
            base = options
        elif _is_integer(options):
            base = cls(max_new_tokens=int(options))  # type: ignore[arg-type]
        else:
            raise RequestError("options must be GenerationOptions or max_new_tokens",
                               path="options", value=type(options).__name__,
                               expected="GenerationOptions, an int or None")
        if overrides.pop("speculative", False) and overrides.get("proposer") is None \
                and base.proposer is None:
            overrides["proposer"] = "chained"
        unknown = sorted(set(overrides) - FIELD_NAMES)
        if unknown:
            raise RequestError(f"unknown generation options {unknown}", path=unknown[0],
                               value=unknown, expected=f"fields of GenerationOptions: "
                                                       f"{', '.join(sorted(FIELD_NAMES))}")
        return replace(base, **overrides) if overrides else base  # type: ignore[arg-type]

    def checked(self) -> GenerationOptions:
        """These options with every field checked by type and range and normalized (tuples,
        ints, floats); raises :class:`RequestError` naming the first bad field."""
        return GenerationOptions(
            max_new_tokens=_integer("max_new_tokens", self.max_new_tokens, low=1),
            proposer=_optional_name("proposer", self.proposer),
            k=parse_width(self.k),
            temperature=_real("temperature", self.temperature, low=0.0),
            top_p=_real("top_p", self.top_p, low=0.0, high=1.0, low_open=True),
            top_k=_integer("top_k", self.top_k, low=0),
            min_p=_real("min_p", self.min_p, low=0.0, high=1.0),
            seed=None if self.seed is None else _integer("seed", self.seed, low=0),
            acceptance=_choice("acceptance", self.acceptance, ACCEPTANCE_METHODS),
            stop=_stop_strings(self.stop),
            stop_token_ids=tuple(_integer(f"stop_token_ids[{i}]", t, low=0)
                                 for i, t in enumerate(_sequence("stop_token_ids",
                                                                 self.stop_token_ids))),
            stop_on_eos=_boolean("stop_on_eos", self.stop_on_eos),
            max_context=(None if self.max_context is None
                         else _integer("max_context", self.max_context, low=1)),
            ngram_range=_ngram_range(self.ngram_range),
            grammar=_grammar(self.grammar),
            logprobs=None if self.logprobs is None else _integer("logprobs", self.logprobs,
                                                                 low=0),
            prompt_logprobs=_boolean("prompt_logprobs", self.prompt_logprobs))


FIELD_NAMES = frozenset(f.name for f in fields(GenerationOptions))
# Below this temperature a request decodes greedily: the limit of sampling as the temperature
# falls, reached long before ``score / temperature`` overflows (vLLM's _SAMPLING_EPS, 1e-5).
MIN_TEMPERATURE = 1e-5
DEFAULTS = GenerationOptions()  # what the CLI's and the server's options default to


def checked_text(name: str, text: object) -> str:
    """``text`` if it is a str that encodes to UTF-8 (no lone surrogates)."""
    if not isinstance(text, str):
        raise RequestError(f"{name} must be text", path=name, value=type(text).__name__,
                           expected="str" + (" (decode bytes first)"
                                             if isinstance(text, bytes | bytearray) else ""))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{name} is not valid Unicode: {exc.reason} at index {exc.start}",
                           path=name, value=text[exc.start:exc.end],
                           expected="text without lone surrogates") from None
    return text


def checked_token_ids(name: str, ids: object) -> tuple[int, ...]:
    """A flat sequence of integer token ids (numpy integers too; no floats, no bools); their
    range is admission's (the vocabulary)."""
    items = _sequence(name, ids)
    if any(isinstance(i, Sequence | bytes) or getattr(i, "ndim", 0) for i in items):
        raise RequestError("the prompt has more than one row; speculant decodes one sequence "
                           "per request", path=name, expected="a flat sequence of token ids")
    for i, token in enumerate(items):
        if not _is_integer(token):
            raise RequestError(f"{name}[{i}] must be an integer token id", path=name,
                               value=token, expected="int token ids")
    return tuple(int(t) for t in items)


def _is_integer(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _integer(name: str, value: object, *, low: int) -> int:
    if not _is_integer(value):
        raise RequestError(f"{name} must be an integer", path=name, value=value,
                           expected=f"an int >= {low}")
    number = int(value)  # type: ignore[call-overload]
    if number < low:
        raise RequestError(f"{name} = {number} is outside its range", path=name, value=number,
                           expected=f">= {low}")
    return number


def _real(name: str, value: object, *, low: float, high: float | None = None,
          low_open: bool = False) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise RequestError(f"{name} must be a number", path=name, value=value,
                           expected="a finite float")
    number = float(value)
    too_low = number <= low if low_open else number < low
    if not math.isfinite(number) or too_low or (high is not None and number > high):
        bounds = f"{'(' if low_open else '['}{low}, {high}]" if high is not None else f">= {low}"
        raise RequestError(f"{name} = {number} is outside its range", path=name, value=number,
                           expected=f"a finite number in {bounds}" if high is not None
                           else f"a finite number {bounds}")
    return number


def parse_width(value: object, *, is_text: bool = False) -> int | Literal["auto"] | None:
    """``k``, drafts per round: an int >= 1, ``"auto"`` (picked each round) or None (the
    proposer kind's default). ``is_text``: ``value`` is command-line text, where a number
    comes as digits. Anything else is a :class:`RequestError` naming ``k``."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return value  # type: ignore[return-value]
    if is_text and isinstance(value, str) and value.strip().isdecimal():
        value = int(value)
    if isinstance(value, str):
        raise RequestError(f"k = {value!r} is not a width", path="k", value=value,
                           expected="'auto', None or an int >= 1")
    return _integer("k", value, low=1)


def _boolean(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise RequestError(f"{name} must be True or False", path=name, value=value,
                           expected="a bool")
    return value


def _sequence(name: str, value: object) -> tuple:
    is_sequence = not isinstance(value, str | bytes | bytearray | dict) and \
        hasattr(value, "__iter__") and getattr(value, "ndim", 1) != 0
    if not is_sequence:
        raise RequestError(f"{name} must be a sequence", path=name,
                           value=type(value).__name__, expected="a list or tuple")
    return tuple(value)  # type: ignore[arg-type]


def _choice(name: str, value: object, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise RequestError(f"{name} = {value!r} is not one of {', '.join(choices)}",
                           path=name, value=value, expected=" or ".join(choices))
    return value


def _optional_name(name: str, value: object) -> str | None:
    if value is None:
        return None
    return checked_text(name, value)


def _stop_strings(value: object) -> tuple[str, ...]:
    items = (value,) if isinstance(value, str) else _sequence("stop", value)
    strings = tuple(checked_text(f"stop[{i}]", s) for i, s in enumerate(items))
    if any(s == "" for s in strings):
        raise RequestError("a stop string is empty", path="stop", value=strings,
                           expected="non-empty strings")
    return strings


def _grammar(value: object) -> Grammar | None:
    if value is None:
        return None
    if not isinstance(value, Grammar):
        raise RequestError("grammar must be a Grammar", path="grammar",
                           value=type(value).__name__,
                           expected="Grammar.json_schema(...), .lark(...), .regex(...) or None")
    return value.checked()


def _ngram_range(value: object) -> tuple[int, int]:
    items = _sequence("ngram_range", value)
    if len(items) != 2:
        raise RequestError("ngram_range must be (n_min, n_max)", path="ngram_range",
                           value=items, expected="two integers")
    if not all(_is_integer(n) for n in items):
        raise RequestError("ngram_range must be two integers", path="ngram_range",
                           value=items, expected="(n_min, n_max) with 1 <= n_min <= n_max")
    low, high = int(items[0]), int(items[1])
    if not 1 <= low <= high:
        raise RequestError(f"ngram_range = {(low, high)} is not (n_min, n_max) with "
                           "1 <= n_min <= n_max", path="ngram_range", value=(low, high),
                           expected="1 <= n_min <= n_max")
    return low, high
