"""Where an agent's interpreter lock goes: a summary of a `py-spy record --gil --threads
--format raw` profile (what `bench/http_vs_engine.py --profile-agent` writes).

Each raw line is one stack, root first, ending in its sample count; with `--threads` the
first frame names the thread ("thread (tid): name" or "thread (tid)"). With `--gil` only
the thread holding the lock is sampled, so a thread's share of the samples is its share
of the lock. Reported: samples, each thread's share, and the inclusive share of the most
sampled functions (a function counts once per stack, so recursion is not counted twice).

    python -m bench.gil_profile /tmp/http-vs-engine/http/agent-gil.prof --top 40
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any


def _thread(frame: str) -> str:
    """The thread's name from a raw profile's first frame ("thread (12): engine-loop")."""
    _, sep, name = frame.partition(": ")
    return name.strip() if sep else frame.strip()


def _function(frame: str) -> str:
    """`Class.method (path/to/file.py:12)` -> `Class.method`."""
    return frame.split(" (", 1)[0]


def summarize(path: Path, top: int = 30) -> dict[str, Any]:
    """Sample count, thread shares and the `top` functions' inclusive shares."""
    threads: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        threads[_thread(frames[0])] += n
        for name in {_function(f) for f in frames[1:]}:
            functions[name] += n
    share = (lambda n: round(n / total, 4)) if total else (lambda n: 0.0)
    return {"samples": total,
            "threads": {t: share(n) for t, n in threads.most_common()},
            "functions": {f: share(n) for f, n in functions.most_common(top)}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profile", type=Path)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = p.parse_args(argv)
    doc = summarize(args.profile, args.top)
    if args.json:
        print(json.dumps(doc, indent=1))
        return
    print(f"samples {doc['samples']}")
    for name, s in doc["threads"].items():
        print(f"thread {name:32s} {s:7.1%}")
    for name, s in doc["functions"].items():
        print(f"{s:7.1%} {name}")


if __name__ == "__main__":
    main()
