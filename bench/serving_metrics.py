"""Per-request measurements of bench/serving.py and their summary (vLLM `bench serve` terms).

Per request (`RequestResult`), times in seconds from the moment the request was sent:
  ttft     first streamed chunk that carries output (text or token ids);
  latency  the last byte of the stream (`[DONE]`);
  itl      gaps between consecutive output chunks (one per chunk, as vLLM's benchmark
           counts them; `chunks` beside `output_tokens` shows whether a server streamed
           one token per chunk);
  tpot     (latency - ttft) / (output_tokens - 1), for requests with two tokens or more.
Output tokens are the server's `usage.completion_tokens` when it sends usage, else the
token ids streamed, else one per chunk.

Summary: throughputs over the wall time from the first request sent to the last answer;
mean / p50 / p90 / p99 (linear interpolation, as numpy's default) of TTFT, TPOT, ITL and
end-to-end latency over the completed requests, in milliseconds; failed requests counted
by error key (`http_<status>:<code>`, `stream:<code>` for an error event inside a 200
stream, or the exception's class name).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    index: int
    model: str
    prompt_len: int
    output_len: int
    """Tokens asked for (`max_tokens`)."""
    sent_s: float = 0.0
    """When it was sent, from the start of the run."""
    ttft: float | None = None
    latency: float | None = None
    output_tokens: int = 0
    chunks: int = 0
    last_output_s: float = 0.0
    """When the latest output chunk came, from when the request was sent."""
    itl: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    error: str | None = None

    def add_chunk(self, at: float, token_ids: Sequence[int], text: str) -> None:
        """One output chunk that came `at` seconds after the request was sent."""
        if self.ttft is None:
            self.ttft = at
        else:
            self.itl.append(at - self.last_output_s)
        self.last_output_s = at
        self.chunks += 1
        self.token_ids.extend(token_ids)
        self.text += text

    @property
    def ok(self) -> bool:
        return self.error is None and self.latency is not None

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.ttft is None or self.latency is None or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    def record(self) -> dict[str, Any]:
        """The per-request row of the JSON result (no token lists: see --save-tokens)."""
        return {"index": self.index, "model": self.model, "prompt_len": self.prompt_len,
                "output_len": self.output_len, "output_tokens": self.output_tokens,
                "chunks": self.chunks, "sent_s": self.sent_s, "ttft_s": self.ttft,
                "latency_s": self.latency, "tpot_s": self.tpot, "error": self.error}


def percentile(values: list[float], q: float) -> float:
    """numpy's default (linear) percentile; nan for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def distribution_ms(values: list[float]) -> dict[str, float]:
    ms = [v * 1e3 for v in values]
    out = {"mean": sum(ms) / len(ms) if ms else math.nan}
    out.update({f"p{q}": percentile(ms, q) for q in PERCENTILES})
    return out


def summarize(results: list[RequestResult], duration_s: float) -> dict[str, Any]:
    done = [r for r in results if r.ok]
    errors = Counter(r.error or "incomplete" for r in results if not r.ok)
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_len for r in done)
    return {
        "requests": len(results),
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": dict(sorted(errors.items())),
        "short_outputs": sum(1 for r in done if r.output_tokens != r.output_len),
        "duration_s": duration_s,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(done) / duration_s if duration_s > 0 else math.nan,
        "output_throughput": out_tokens / duration_s if duration_s > 0 else math.nan,
        "total_token_throughput": (in_tokens + out_tokens) / duration_s
        if duration_s > 0 else math.nan,
        "ttft_ms": distribution_ms([r.ttft for r in done if r.ttft is not None]),
        "tpot_ms": distribution_ms([t for r in done if (t := r.tpot) is not None]),
        "itl_ms": distribution_ms([g for r in done for g in r.itl]),
        "e2el_ms": distribution_ms([r.latency for r in done if r.latency is not None]),
    }


def table(summary: dict[str, Any], label: str = "") -> str:
    """The summary as a fixed-width text table (what bench/serving.py prints)."""
    s = summary
    lines = [f"{'=' * 22} serving benchmark {label} {'=' * 22}".rstrip(),
             f"{'completed / requests':<34}{s['completed']} / {s['requests']}",
             f"{'failed':<34}{s['failed']}  {s['errors'] or ''}".rstrip(),
             f"{'outputs not of output-len tokens':<34}{s['short_outputs']}",
             f"{'duration (s)':<34}{s['duration_s']:.2f}",
             f"{'input / output tokens':<34}{s['total_input_tokens']} / "
             f"{s['total_output_tokens']}",
             f"{'request throughput (req/s)':<34}{s['request_throughput']:.3f}",
             f"{'output token throughput (tok/s)':<34}{s['output_throughput']:.2f}",
             f"{'total token throughput (tok/s)':<34}{s['total_token_throughput']:.2f}",
             f"{'(ms)':<10}{'mean':>12}{'p50':>12}{'p90':>12}{'p99':>12}"]
    for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"),
                      ("e2el_ms", "E2E")):
        d = s[key]
        lines.append(f"{name:<10}" + "".join(f"{d[k]:>12.2f}"
                                             for k in ("mean", "p50", "p90", "p99")))
    return "\n".join(lines)
