"""HF transformers (+ PEFT) on a bench/serving.py workload: the no-server reference arm.

    .venv/bin/python -m bench.serving_hf --model-dir M [--adapter A ...] \
        --num-requests 32 --input-len 128 --output-len 64 --batch 32 --seed S --out F

The workload is bench/serving.py's (`make_workload` with the same seed: the same prompt
ids, and with adapters the same request -> adapter assignment as `--num-models` over the
given adapters). Requests run in static batches of `--batch` through `generate` (greedy,
exactly `output_len` new tokens each; with adapters a mixed batch through PEFT's
`adapter_names`). Only `generate` is timed; loading is not. Writes a JSON summary with
`output_throughput` (tok/s) and the tokens in bench/serving.py's `--save-tokens` row shape,
so bench/serving_compare.py compares them with a server's. fp32, `torch.inference_mode`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bench.serving_workload import WorkloadSpec, make_workload


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--adapter", type=Path, action="append", default=[],
                   help="PEFT adapter directory, model index k = k-th --adapter")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=int, default=49152, help="as bench/serving.py's")
    p.add_argument("--min-token-id", type=int, default=100, help="as bench/serving.py's")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    if args.threads:
        torch.set_num_threads(args.threads)
    names = tuple(f"a{k}" for k in range(len(args.adapter))) or ("base",)
    requests = make_workload(WorkloadSpec(num_requests=args.num_requests,
                                          input_len=args.input_len,
                                          output_len=args.output_len, models=names,
                                          vocab_size=args.vocab_size,
                                          min_token_id=args.min_token_id, seed=args.seed))
    model: Any = AutoModelForCausalLM.from_pretrained(args.model_dir,
                                                      dtype=torch.float32).eval()
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter[0], adapter_name="a0")
        for k, path in enumerate(args.adapter[1:], start=1):
            model.load_adapter(path, adapter_name=f"a{k}")
        model.eval()
    rows, seconds = [], 0.0
    with torch.inference_mode():
        for start in range(0, len(requests), args.batch):
            batch = requests[start:start + args.batch]
            ids = torch.tensor([r.prompt for r in batch])
            kwargs: dict[str, Any] = {}
            if args.adapter:
                kwargs["adapter_names"] = [r.model for r in batch]
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=args.output_len,
                                 min_new_tokens=args.output_len, do_sample=False,
                                 pad_token_id=0, **kwargs)
            seconds += time.perf_counter() - t0
            for r, row in zip(batch, out, strict=True):
                rows.append({"index": r.index, "model": r.model, "model_index": r.model_index,
                             "prompt": r.prompt, "token_ids": row[ids.shape[1]:].tolist(),
                             "text": "", "error": None})
    tokens = sum(len(r["token_ids"]) for r in rows)
    doc = {"summary": {"output_throughput": tokens / seconds, "generate_s": seconds,
                       "output_tokens": tokens, "batch": args.batch,
                       "threads": torch.get_num_threads()},
           "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc))
    print(f"hf{'+peft' if args.adapter else ''}: {tokens / seconds:.2f} tok/s "
          f"({tokens} tokens in {seconds:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
