"""A trace replay's figures (bench/trace_replay.py) as text and JSON: a line per request and server,
then a total per server. Columns: `ttft` the seconds to the first streamed piece of the answer,
`tok/s` generation after it ((tokens - 1) / (last - first), client-timed), `total` the request's
seconds from sending to the last event, `n` the tokens the server says it generated, `prompt` the
prompt's tokens it says it read (cached or not: two servers that render a request alike agree), and the greedy
answer against the reference's (llama-server plain): `=`, `prefix` (one stops earlier, e.g. at
t_max_predict_ms), or the first character where they differ."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import terminal_safe
from .trace_replay import Row


@dataclass(frozen=True)
class Total:
    name: str
    seconds: float  # every request's total, summed
    mean_ttft_s: float | None
    n_tokens: int
    tokens_per_second: float | None  # all tokens after each first one, over the time after each first token
    n_equal: int
    n_calls: int  # the same tool call, returned as a call by one server and as its JSON text by the other
    n_prefix: int
    n_compared: int
    n_errors: int


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def row_lines(row: Row) -> list[str]:
    request = row.request
    lines = [f"#{row.index} {request.path} (line {request.line}, gap {request.gap_s:g} s)"]
    for name, reply in row.replies.items():
        speed = reply.tokens_per_second
        lines.append(
            f"  {name:<28} ttft {_seconds(reply.ttft_s):>6}  tok/s {'—' if speed is None else f'{speed:.1f}':>6}"
            f"  total {reply.total_s:7.2f}  n {reply.n_tokens:4d}  prompt {reply.n_prompt or '—':>5}"
            f"  {row.comparisons[name].label()}" + (f"  {terminal_safe(reply.error)}" if reply.error else "")
        )
    return lines


def totals(rows: list[Row]) -> list[Total]:
    names = list(rows[0].replies) if rows else []
    out = []
    for name in names:
        replies = [row.replies[name] for row in rows]
        ttfts = [reply.ttft_s for reply in replies if reply.ttft_s is not None]
        timed = [reply for reply in replies if reply.tokens_per_second is not None]
        after_first = sum(reply.total_s - (reply.ttft_s or 0.0) for reply in timed)
        kinds = [row.comparisons[name].kind for row in rows]
        out.append(
            Total(
                name=name,
                seconds=sum(reply.total_s for reply in replies),
                mean_ttft_s=sum(ttfts) / len(ttfts) if ttfts else None,
                n_tokens=sum(reply.n_tokens for reply in replies),
                tokens_per_second=sum(r.n_tokens - 1 for r in timed) / after_first if after_first > 0 else None,
                n_equal=kinds.count("equal"),
                n_calls=kinds.count("call"),
                n_prefix=kinds.count("prefix"),
                n_compared=sum(kind not in ("reference", "error") for kind in kinds),
                n_errors=sum(reply.error is not None for reply in replies),
            )
        )
    return out


def total_lines(trace_name: str, rows: list[Row]) -> list[str]:
    """The totals, each server's time relative to the reference's and to the fastest llama-server's."""
    figures = totals(rows)
    if not figures:
        return []
    reference = figures[0].seconds
    llama = [total.seconds for total in figures if total.name.startswith("llama-server")]
    best_llama = min(llama) if llama else None
    lines = [f"{trace_name}: {len(rows)} requests"]
    for total in figures:
        relative = f"{total.seconds / reference:.2f}× ref" if reference > 0 else "—"
        if best_llama:
            relative += f", {total.seconds / best_llama:.2f}× best llama-server"
        calls = f", {total.n_calls} the same call" if total.n_calls else ""
        same = (
            f"{total.n_equal}/{total.n_compared} equal{calls}, {total.n_prefix} prefix" if total.n_compared else "(ref)"
        )
        speed = "—" if total.tokens_per_second is None else f"{total.tokens_per_second:.1f}"
        lines.append(
            f"  {total.name:<28} total {total.seconds:8.1f} s ({relative})  mean ttft {_seconds(total.mean_ttft_s)} s"
            f"  tok/s {speed}  tokens {total.n_tokens}  {same}"
            + (f"  errors {total.n_errors}" if total.n_errors else "")
        )
    return lines


def report_json(trace_name: str, rows: list[Row]) -> dict:
    return {
        "trace": trace_name,
        "requests": [
            {
                "index": row.index,
                "line": row.request.line,
                "path": row.request.path,
                "servers": {
                    name: {
                        "ttft_s": reply.ttft_s,
                        "tokens_per_second": reply.tokens_per_second,
                        "total_s": reply.total_s,
                        "n_tokens": reply.n_tokens,
                        "n_prompt": reply.n_prompt,
                        "compared": row.comparisons[name].kind,
                        "first_difference": row.comparisons[name].position,
                        "history_differs": row.comparisons[name].history_differs,
                        "error": reply.error,
                        "text": reply.text,
                    }
                    for name, reply in row.replies.items()
                },
            }
            for row in rows
        ],
        "totals": [total.__dict__ for total in totals(rows)],
    }
