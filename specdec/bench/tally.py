"""The prompt suite's sums and its table: speedups, tau, alpha, acceptance by position and by length.

bench/suite.py times the decoding; this file adds up what each run gave, per drafter and category (`Tally`), and
writes the markdown the suite prints (`suite_table`). Two speedups: end to end, and of decoding alone, the prompt's
pass (the same in plain and speculative decoding) left out of both.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TextIO


@dataclass
class Tally:
    """Sums over the prompts of one category, for one drafter, over every timed repeat."""

    ar_seconds: list[float] = field(default_factory=list)  # per repeat: seconds of plain decoding
    spec_seconds: list[float] = field(default_factory=list)  # per repeat: seconds of speculative decoding
    ar_tokens: list[int] = field(default_factory=list)  # per repeat: tokens plain decoding wrote
    spec_tokens: list[int] = field(default_factory=list)  # per repeat: tokens speculative decoding wrote
    tokens: int = 0  # the last repeat's counts (every repeat decodes the same: same seeds)
    rounds: int = 0
    accepted: int = 0
    judged: int = 0
    prompts: int = 0
    by_position: list[list[int]] = field(default_factory=list)  # [i] = [accepted, judged] of draft position i + 1
    lengths: list[int] = field(default_factory=lambda: [0] * len(LENGTH_BINS))  # rounds by drafts accepted, binned
    each: list[list[float]] = field(default_factory=list)  # [i] = prompt i's speedup (of rates) in each repeat
    seen: list[int] = field(default_factory=list)  # per repeat: prompts added so far
    # Decoding alone: the prompt's pass (timed as plain decoding's first token, which comes with it) taken out of
    # both. Plain decoding then wrote its tokens but the first; speculative decoding, which reads all of the prompt
    # but its last token before its first round, wrote all of its own.
    prompt_seconds: list[float] = field(default_factory=list)  # per repeat: seconds of the prompts' passes
    each_decode: list[list[float]] = field(default_factory=list)  # [i] = prompt i's decoding-alone speedup per repeat

    def add(
        self, repeat: int, ar_seconds: float, ar_tokens: int, spec_seconds: float, result, prompt_seconds: float
    ) -> None:
        """One prompt's timed pair: plain decoding (ar_seconds, ar_tokens written), speculative decoding (spec_seconds,
        its DecodeResult), and prompt_seconds, the prompt's pass (plain decoding's time to its first token)."""
        while len(self.ar_seconds) <= repeat:
            for series in (self.ar_seconds, self.spec_seconds, self.ar_tokens, self.spec_tokens, self.seen):
                series.append(0)
            self.prompt_seconds.append(0.0)
        i, self.seen[repeat] = self.seen[repeat], self.seen[repeat] + 1
        if i == len(self.each):
            self.each.append([])
            self.each_decode.append([])
        self.each[i].append(len(result.tokens) * ar_seconds / (spec_seconds * ar_tokens))
        ar_decode = (ar_seconds - prompt_seconds, ar_tokens - 1)
        spec_decode = (spec_seconds - prompt_seconds, len(result.tokens))
        if ar_decode[1] > 0 and min(ar_decode[0], spec_decode[0]) > 0:  # a 1-token reply has no decoding to time
            self.each_decode[i].append(spec_decode[1] * ar_decode[0] / (spec_decode[0] * ar_decode[1]))
        self.prompt_seconds[repeat] += prompt_seconds
        self.ar_seconds[repeat] += ar_seconds
        self.spec_seconds[repeat] += spec_seconds
        self.ar_tokens[repeat] += ar_tokens
        self.spec_tokens[repeat] += len(result.tokens)
        if repeat > 0:
            return
        self.tokens += len(result.tokens)
        self.rounds += result.rounds
        self.accepted += result.accepted
        self.judged += sum(result.judged)
        self.prompts += 1
        for accepted, judged in zip(result.accepted_per_round, result.judged):
            self.lengths[length_bin(accepted)] += 1
            while len(self.by_position) < judged:
                self.by_position.append([0, 0])
            for i in range(judged):  # draft i + 1 was judged; accepted when i < accepted
                self.by_position[i][0] += i < accepted
                self.by_position[i][1] += 1

    def row(self) -> dict:
        ratio = lambda a, b: a / b if b else math.nan  # noqa: E731
        # Speedup = speculative tokens/s over plain tokens/s, per repeat: equal to the ratio of times when both
        # wrote the same number of tokens (always at T=0), and still fair when a chat reply ended early.
        speedups = sorted(
            ratio(st * a, s * at)
            for a, s, at, st in zip(self.ar_seconds, self.spec_seconds, self.ar_tokens, self.spec_tokens)
        )
        # Decoding alone, per repeat: both times less the prompts' passes; plain decoding credited with its tokens
        # but each prompt's first (seen[repeat] prompts), speculative decoding with all of its own.
        decode = sorted(
            ratio(st * (a - p), (s - p) * (at - n))
            for a, s, at, st, p, n in zip(
                self.ar_seconds, self.spec_seconds, self.ar_tokens, self.spec_tokens, self.prompt_seconds, self.seen
            )
        )
        return {
            **_spread("speedup", speedups),
            **_spread("decode_speedup", decode),  # the prompt's pass left out
            "repeats": len(speedups),
            "tau": ratio(self.tokens, self.rounds),
            "alpha": ratio(self.accepted, self.judged),
            "prompts": self.prompts,
            "tokens": self.tokens,
            "acceptance_by_position": [ratio(a, j) for a, j in self.by_position],
            "accepted_per_round": dict(zip(LENGTH_LABELS, self.lengths)),  # rounds by drafts accepted in them
            "prompt_speedups": [statistics.median(x) for x in self.each],  # each prompt's, the median of repeats
            "prompt_decode_speedups": [statistics.median(x) if x else math.nan for x in self.each_decode],
            "ar_seconds": statistics.median(self.ar_seconds) if self.ar_seconds else math.nan,
            "spec_seconds": statistics.median(self.spec_seconds) if self.spec_seconds else math.nan,
            "prompt_seconds": statistics.median(self.prompt_seconds) if self.prompt_seconds else math.nan,
            # the prompts' passes as a share of plain decoding's time, per repeat, the median
            "prompt_share": statistics.median(ratio(p, a) for p, a in zip(self.prompt_seconds, self.ar_seconds))
            if self.prompt_seconds
            else math.nan,
        }


# The acceptance-length histogram's bins: rounds that kept 0, 1, 2-3, 4-7, 8-15, 16-31 or 32+ drafts (a suffix
# drafter's long copies land in the last bins, a K=4 chain's never pass the fourth).
LENGTH_BINS = [0, 1, 2, 4, 8, 16, 32]
LENGTH_LABELS = ["0", "1", "2-3", "4-7", "8-15", "16-31", "32+"]


def _spread(key: str, values: list[float]) -> dict:
    """{key: the median, key_min, key_max} of sorted `values` (NaN when there are none)."""
    if not values:
        return {key: math.nan, key + "_min": math.nan, key + "_max": math.nan}
    return {key: statistics.median(values), key + "_min": values[0], key + "_max": values[-1]}


def length_bin(accepted: int) -> int:
    """The LENGTH_BINS bin of a round that kept `accepted` drafts."""
    return max(i for i, low in enumerate(LENGTH_BINS) if accepted >= low)


def suite_table(results: dict[str, dict[str, dict]], out: TextIO) -> None:
    """Markdown: one row per category, speedup / decoding alone / tau / alpha for each drafter (a speedup's range
    over repeats in brackets when there were several), then each drafter's acceptance by draft position."""
    labels = list(results)
    cats = list(next(iter(results.values())))
    out.write(
        "| category | " + " | ".join(f"{x} speedup | {x} decoding alone | {x} tau | {x} alpha" for x in labels) + " |\n"
    )
    out.write("|---" * (1 + 4 * len(labels)) + "|\n")
    for cat in cats:
        cells = []
        for label in labels:
            row = results[label][cat]
            speedups = []
            for key in ("speedup", "decode_speedup"):
                cell = f"{_num(row[key])}x"
                if row.get("repeats", 1) > 1:
                    cell += f" [{_num(row[key + '_min'])}-{_num(row[key + '_max'])}]"
                speedups.append(cell)
            cells += [*speedups, f"{row['tau']:.2f}", _num(row["alpha"])]
        out.write(f"| {cat} | " + " | ".join(cells) + " |\n")
    lengths = {label: results[label]["all"].get("accepted_per_round") for label in labels}
    if all(lengths.values()):
        bins = list(next(iter(lengths.values())))
        out.write("\n| drafts accepted in a round (share of rounds, all prompts) | " + " | ".join(bins) + " |\n")
        out.write("|---" * (1 + len(bins)) + "|\n")
        for label, counts in lengths.items():
            total = sum(counts.values()) or 1
            out.write(f"| {label} | " + " | ".join(f"{100 * counts[b] / total:.0f}%" for b in bins) + " |\n")
    for label in labels:
        for key, what in (("prompt_speedups", "speedup"), ("prompt_decode_speedups", "decoding alone")):
            each = [x for x in results[label]["all"].get(key) or [] if not math.isnan(x)]
            if not each:
                continue
            out.write(
                f"\n{label}: {what} per prompt (each the median of its repeats): median "
                f"{statistics.median(each):.2f}x, {min(each):.2f}x to {max(each):.2f}x over {len(each)} prompts\n"
            )
            kinds = [(cat, [x for x in results[label][cat].get(key) or [] if not math.isnan(x)]) for cat in cats]
            out.write(
                "  by category, the median prompt (lowest-highest): "
                + ", ".join(
                    f"{c} {statistics.median(x):.2f}x ({min(x):.2f}-{max(x):.2f}x)"
                    for c, x in kinds
                    if x and c != "all"
                )
                + "\n"
            )
        by_position = results[label]["all"].get("acceptance_by_position") or []
        if by_position:
            out.write(
                f"\n{label}: acceptance by draft position (all prompts): "
                + ", ".join(f"{i + 1}: {_num(a)}" for i, a in enumerate(by_position))
                + "\n"
            )
    shares = [(cat, results[labels[0]][cat].get("prompt_share")) for cat in cats]  # the same for every drafter
    if all(share is not None for _, share in shares):
        out.write(
            "\nthe prompts' passes (left out of decoding alone), share of plain decoding's time: "
            + ", ".join(f"{cat} " + ("-" if math.isnan(share) else f"{100 * share:.0f}%") for cat, share in shares)
            + "\n"
        )


def _num(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.2f}"
