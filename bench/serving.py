"""Serving benchmark client for any OpenAI-compatible `/v1/completions` endpoint.

    .venv/bin/python -m bench.serving --base-url http://127.0.0.1:8500 --api-key $TOKEN \
        --model-prefix acme/bot- --num-models 8 --popularity uniform \
        --dataset random --input-len 128 --output-len 64 --num-requests 32 \
        --max-concurrency 32 --request-rate inf --out result.json --save-tokens tokens.jsonl

Every request streams (SSE; `--no-stream` asks for whole answers), greedy (`temperature`
0), with `ignore_eos` and `min_tokens = max_tokens = output_len`, so each produces exactly
its output length (both our agent and vLLM accept those fields; `--no-ignore-eos` leaves
them out for servers that do not). Prompts are token-id lists (`"prompt": [ids]`), so no
tokenizer is needed here and every server sees the same tokens. `return_token_ids` is
asked for (vLLM's field; our agent always streams `token_ids` and ignores the field), so
`--save-tokens` can compare servers token by token. Workloads: bench/serving_workload.py;
metrics: bench/serving_metrics.py. `/proc/loadavg` before and after the run goes into the
JSON, since on a shared machine the other load moves the numbers, and so does
`client_cpu_share`, this process's CPU time over the run's wall time: near 1 the client
itself is what limits the run.

The event loop is one asyncio task per request on one aiohttp session (connections kept
alive, as many as `--max-concurrency`): a request waits for its arrival time, then for a
concurrency slot, and its clock starts when it is sent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp

from bench.serving_metrics import RequestResult, summarize, table
from bench.serving_workload import WorkloadRequest, WorkloadSpec, make_workload

SCHEMA = "adapterplane.bench.serving/1"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8500")
    p.add_argument("--api-key", default="", help="sent as `Authorization: Bearer ...`")
    p.add_argument("--models", default="", help="comma-separated model names")
    p.add_argument("--model-prefix", default="",
                   help="with --num-models N: models PREFIX0 .. PREFIX{N-1}")
    p.add_argument("--num-models", type=int, default=0)
    p.add_argument("--popularity", default="uniform", help="uniform | zipf:S")
    p.add_argument("--dataset", default="random", choices=("random", "sharegpt-like"))
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128, help="random dataset")
    p.add_argument("--output-len", type=int, default=64, help="random dataset")
    p.add_argument("--vocab-size", type=int, default=49152,
                   help="prompt ids are drawn below this (default: SmolLM2's vocabulary)")
    p.add_argument("--min-token-id", type=int, default=100,
                   help="prompt ids are drawn at or above this (keeps special tokens out)")
    p.add_argument("--request-rate", type=float, default=math.inf, help="req/s, or inf")
    p.add_argument("--arrival", default="poisson", choices=("poisson", "constant"))
    p.add_argument("--max-concurrency", type=int, default=0, help="0: unbounded")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-requests", type=int, default=0,
                   help="sent first (same shapes, other prompts), not measured")
    p.add_argument("--no-stream", dest="stream", action="store_false",
                   help="ask for whole answers (TTFT is then the whole latency)")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="leave out ignore_eos / min_tokens")
    p.add_argument("--extra-body", default="{}", help="JSON merged into every request body")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per request")
    p.add_argument("--label", default="", help="name of this run in the table and JSON")
    p.add_argument("--out", type=Path, default=None, help="JSON result")
    p.add_argument("--save-tokens", type=Path, default=None,
                   help="JSON lines: index, model, prompt, token_ids, text per request")
    return p.parse_args(argv)


def model_names(args: argparse.Namespace) -> tuple[str, ...]:
    names = [m for m in args.models.split(",") if m]
    if args.num_models:
        names += [f"{args.model_prefix}{i}" for i in range(args.num_models)]
    return tuple(names)


def workload_spec(args: argparse.Namespace, seed: int | None = None) -> WorkloadSpec:
    return WorkloadSpec(dataset=args.dataset, num_requests=args.num_requests,
                        input_len=args.input_len, output_len=args.output_len,
                        vocab_size=args.vocab_size, min_token_id=args.min_token_id,
                        models=model_names(args), popularity=args.popularity,
                        request_rate=args.request_rate, arrival=args.arrival,
                        seed=args.seed if seed is None else seed)


def request_body(req: WorkloadRequest, ignore_eos: bool, extra: dict[str, Any],
                 stream: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"model": req.model, "prompt": req.prompt,
                            "max_tokens": req.output_len, "temperature": 0.0,
                            "stream": stream, "return_token_ids": True}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body.update(ignore_eos=True, min_tokens=req.output_len)
    body.update(extra)
    return body


def _error_key(payload: Any, prefix: str) -> str:
    err = payload.get("error") if isinstance(payload, dict) else None
    code = err.get("code") or err.get("type") if isinstance(err, dict) else None
    return f"{prefix}:{code}" if code else prefix


def _on_event(res: RequestResult, event: dict[str, Any], sent: float, now: float) -> None:
    """One SSE `data:` object: output chunk, usage chunk, or an error event."""
    if "error" in event:
        res.error = _error_key(event, "stream")
        return
    usage = event.get("usage")
    if usage and usage.get("completion_tokens") is not None:
        res.output_tokens = int(usage["completion_tokens"])
    for choice in event.get("choices") or []:
        ids = choice.get("token_ids") or []
        text = choice.get("text") or ""
        if not ids and not text:
            continue
        res.add_chunk(now - sent, [int(t) for t in ids], text)


async def send_one(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
                   res: RequestResult, t0: float) -> None:
    sent = time.perf_counter()
    res.sent_s = sent - t0
    try:
        async with http.post(url, json=body) as resp:
            if resp.status != 200:
                text = await resp.text()
                try:
                    payload = json.loads(text)
                except ValueError:
                    payload = None
                res.error = _error_key(payload, f"http_{resp.status}")
                return
            if not body.get("stream"):
                _on_event(res, await resp.json(), sent, time.perf_counter())
                res.latency = time.perf_counter() - sent
                return
            buffer = b""
            async for piece in resp.content.iter_any():
                buffer += piece
                *lines, buffer = buffer.split(b"\n")
                for line in lines:  # one `data:` line per event (\n or \r\n endings)
                    line = line.rstrip(b"\r")
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        res.latency = time.perf_counter() - sent
                    else:
                        _on_event(res, json.loads(data), sent, time.perf_counter())
        if res.latency is None and res.error is None:
            res.error = "stream_ended_without_done"
        if res.output_tokens == 0:
            res.output_tokens = len(res.token_ids) or res.chunks
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        res.error = type(exc).__name__


async def run_requests(args: argparse.Namespace, requests: list[WorkloadRequest]
                       ) -> tuple[list[RequestResult], float]:
    """Send `requests` at their arrival times; returns their results and the wall time."""
    url = f"{args.base_url.rstrip('/')}/v1/completions"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    extra = json.loads(args.extra_body)
    limit = args.max_concurrency if args.max_concurrency > 0 else None
    slots = asyncio.Semaphore(limit) if limit else None
    results = [RequestResult(r.index, r.model, len(r.prompt), r.output_len) for r in requests]
    connector = aiohttp.TCPConnector(limit=limit or 0)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     headers=headers) as http:
        t0 = time.perf_counter()

        async def one(req: WorkloadRequest, res: RequestResult) -> None:
            delay = t0 + req.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = request_body(req, args.ignore_eos, extra, args.stream)
            if slots is None:
                await send_one(http, url, body, res, t0)
                return
            async with slots:
                await send_one(http, url, body, res, t0)

        await asyncio.gather(*(one(q, r) for q, r in zip(requests, results, strict=True)))
        duration = time.perf_counter() - t0
    return results, duration


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return ""


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, run the workload, return the JSON result (also written per the flags)."""
    spec = workload_spec(args)
    requests = make_workload(spec)
    if args.warmup_requests:
        warm = make_workload(WorkloadSpec(**{**asdict(spec), "seed": spec.seed + 10_000,
                                             "num_requests": args.warmup_requests,
                                             "request_rate": math.inf}))
        asyncio.run(run_requests(args, warm))
    before, cpu = loadavg(), time.process_time()
    results, duration = asyncio.run(run_requests(args, requests))
    after, cpu = loadavg(), time.process_time() - cpu
    summary = summarize(results, duration)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
              if k not in ("api_key",)}
    config["request_rate"] = str(args.request_rate)
    doc = {"schema": SCHEMA, "label": args.label, "config": config,
           "models": list(spec.models), "loadavg_before": before, "loadavg_after": after,
           "client_cpu_share": cpu / duration if duration > 0 else None,
           "summary": summary, "requests": [r.record() for r in results]}
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1, allow_nan=True) + "\n")
    if args.save_tokens is not None:
        args.save_tokens.parent.mkdir(parents=True, exist_ok=True)
        with args.save_tokens.open("w") as f:
            for req, res in zip(requests, results, strict=True):
                f.write(json.dumps({"index": req.index, "model": req.model,
                                    "model_index": req.model_index, "prompt": req.prompt,
                                    "token_ids": res.token_ids, "text": res.text,
                                    "error": res.error}) + "\n")
    return doc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    doc = benchmark(args)
    print(f"loadavg before: {doc['loadavg_before']}   after: {doc['loadavg_after']}")
    print(table(doc["summary"], args.label))
    return 0 if doc["summary"]["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
