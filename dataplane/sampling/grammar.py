"""Grammar-constrained decoding for structured output (OpenAI `response_format`), on llguidance.

One `GrammarCompiler` per engine (tokenizer + logits width) compiles a `ResponseFormat` into
a `CompiledGrammar`, cached by the format's value. Each constrained request owns a
`GrammarState`. Every decode step the engine fills one bitmask row per constrained request
on the host (`GrammarState.fill_bitmask`, or `GrammarCompiler.fill_bitmasks` for a batch on
several threads), `apply_bitmask` masks those logits rows on their device in one batched op,
the sampler draws, and the drawn token is `accept`ed into the request's state.

Contract:

* EOS. The tokenizer's EOS ids are allowed only once the JSON is complete (and then nothing
  else is, unless the value could still grow, as a top-level number can); accepting one
  terminates the state, and the request must finish: a terminated state has no next mask.
* Vocabulary. Masks are `vocab_size` bits wide: the model's logits width, which may exceed
  the tokenizer's vocabulary (padding ids). Padding ids and the tokenizer's special tokens
  (other than EOS) are never allowed, so no control token appears inside a JSON string.
  `apply_bitmask` also masks any logits column beyond the bitmask's width.
* JSON Schema. A schema means what it says: properties come in the schema's order, and one
  the schema does not forbid (`additionalProperties`) may appear. Between JSON tokens at
  most one space is allowed (`WHITESPACE`): compact JSON, so a model cannot spend its
  tokens on newlines and indentation (small models loop on them when whitespace is free).
  A strict format whose schema uses a keyword llguidance does not implement
  (`not`, `if`/`then`/`else`, `uniqueItems`, `contains`, `propertyNames`, an unknown
  `format`, ...) is refused; a non-strict one is compiled without it (OpenAI's best effort),
  and `CompiledGrammar.warnings` says what was ignored.
* Preemption / recompute. A state depends only on the tokens accepted so far: rebuild one
  with `CompiledGrammar.new_state(output_token_ids)` (replay, a few µs a token), or keep the
  request's state, which stays valid since recompute does not change the output tokens.
  `rollback(n)` undoes the last n accepts (speculative decoding).
* Threads. `GrammarCompiler.compile` may run on any thread, concurrently; llguidance drops
  the GIL while it builds a grammar (measured on a 2-core CPU: 0.3-2 ms for ordinary
  schemas, ~30 ms for a 50 kB one, first mask included), so the engine can compile off its
  step loop. A `GrammarState` is not thread-safe: one owner at a time.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import llguidance as llg
import torch
from tokenizers import Tokenizer as HFTokenizer

from dataplane.errors import EngineError
from dataplane.h2d import to_device, upload
from dataplane.response_format import InvalidResponseFormat, ResponseFormat

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

    from dataplane.tokenizer import Tokenizer

__all__ = [
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarState",
    "InvalidResponseFormat",
    "ResponseFormat",
    "allocate_bitmask",
    "apply_bitmask",
]

WHITESPACE = r"[\x20]?"
"""What may separate two JSON tokens: nothing or one space."""

DEFAULT_CACHE_ENTRIES = 256
"""Compiled grammars a compiler keeps (least recently used evicted first)."""

_ANY_OBJECT = '{"type":"object"}'


class GrammarError(EngineError):
    """A grammar used against its contract: replaying tokens it rejects, a mask asked of a
    terminated state, a rollback past the start, a tokenizer without EOS, or the matcher
    failing (a parser resource limit)."""

    code = "GRAMMAR_ERROR"


class CompiledGrammar:
    """A `ResponseFormat` compiled for one tokenizer; immutable, shared by all its requests.

    `warnings`: what a non-strict compile ignored (keywords llguidance does not enforce)."""

    def __init__(self, spec: ResponseFormat, template: llg.LLMatcher, *, vocab_size: int,
                 eos_token_ids: frozenset[int]) -> None:
        self.spec = spec
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.warnings = tuple(template.get_grammar_warnings())
        self._template = template  # never advanced: states start as copies of it

    def new_state(self, accepted: Iterable[int] = ()) -> GrammarState:
        """A fresh state that has accepted `accepted` (a preempted request's output tokens).

        Raises GrammarError when the grammar rejects one of them."""
        state = GrammarState(self, self._template.deep_copy())
        for i, token_id in enumerate(accepted):
            if not state.accept(token_id):
                raise GrammarError("the grammar rejects a replayed token", index=i,
                                   token_id=token_id)
        return state


class GrammarState:
    """One request's position in its grammar; `accept` each generated token in order.

    Built by `CompiledGrammar.new_state`. EOS is tracked here rather than fed to the matcher,
    so `rollback` counts it like any other token."""

    def __init__(self, grammar: CompiledGrammar, matcher: llg.LLMatcher) -> None:
        self.grammar = grammar
        self._matcher = matcher
        self._num_accepted = 0
        self._terminated = False

    @property
    def num_accepted(self) -> int:
        return self._num_accepted

    def accept(self, token_id: int) -> bool:
        """Advance by `token_id`; False (state unchanged) when the grammar forbids it, the
        id is outside the vocabulary, or the state has terminated."""
        token_id = int(token_id)
        if self._terminated or not 0 <= token_id < self.grammar.vocab_size:
            return False
        if token_id in self.grammar.eos_token_ids:
            if not self._matcher.is_accepting():
                return False
            self._terminated = True
        elif self._matcher.try_consume_tokens([token_id]) != 1:
            self._raise_if_failed()
            return False
        self._num_accepted += 1
        return True

    def is_terminated(self) -> bool:
        """True once an EOS was accepted: the JSON is complete and the request must finish."""
        return self._terminated

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (bit i of word j: id 32*j + i).

        `bitmask` is an `allocate_bitmask(rows, vocab_size)` tensor (int32, CPU)."""
        _check_bitmask(bitmask, 1, self.grammar.vocab_size)
        if not 0 <= row < bitmask.shape[0]:
            raise ValueError(f"row {row} is outside the bitmask's {bitmask.shape[0]} rows")
        self._check_live()
        words = bitmask.shape[1]
        self._matcher.unsafe_compute_mask_ptr(bitmask.data_ptr() + row * words * 4, words * 4)
        self._raise_if_failed()

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepts (an accepted EOS included)."""
        if not 0 <= num_tokens <= self._num_accepted:
            raise GrammarError("rollback past the start of the output",
                               num_tokens=num_tokens, num_accepted=self._num_accepted)
        in_matcher = num_tokens
        if num_tokens and self._terminated:
            self._terminated = False
            in_matcher -= 1
        if in_matcher and not self._matcher.rollback(in_matcher):
            self._raise_if_failed()
        self._num_accepted -= num_tokens

    def reset(self) -> None:
        """Back to the start of the output, as `grammar.new_state()`."""
        self._matcher.reset()
        self._num_accepted = 0
        self._terminated = False

    def _check_live(self) -> None:
        if self._terminated:
            raise GrammarError("a terminated grammar state has no next-token mask")

    def _raise_if_failed(self) -> None:
        if self._matcher.is_error():
            raise GrammarError(f"grammar matcher failed: {self._matcher.get_error()}")


class GrammarCompiler:
    """Compiles response formats for one tokenizer and one logits width; a bounded LRU
    cache maps each `ResponseFormat` (canonical, hashable) to its `CompiledGrammar`.

    `tokenizer` is the `tokenizers.Tokenizer` the model's tokenizer wraps; `eos_token_ids`
    its EOS ids (non-empty: a constrained request could not finish otherwise); `vocab_size`
    the width of the model's logits (at least the tokenizer's vocabulary). Building one
    reads the whole vocabulary (~0.2 s for 49k tokens, ~1 s for 128k): once per engine.
    `max_threads`: threads of `fill_bitmasks` (on a 16-core H200 host 4 fill 64 rows of a
    128k-token vocabulary faster than 14 do)."""

    def __init__(self, tokenizer: HFTokenizer, *, eos_token_ids: Iterable[int],
                 vocab_size: int, max_threads: int = 4,
                 cache_entries: int = DEFAULT_CACHE_ENTRIES) -> None:
        eos = frozenset(eos_token_ids)
        if not eos:
            raise GrammarError("the tokenizer has no EOS token: constrained output could "
                               "never finish")
        if any(not 0 <= e < vocab_size for e in eos):
            raise GrammarError("vocab_size must cover the EOS ids", vocab_size=vocab_size,
                               eos_token_ids=sorted(eos))
        try:
            self._tokenizer = llg.LLTokenizer(tokenizer.to_str(), n_vocab=vocab_size,
                                              eos_token=sorted(eos))
        except ValueError as exc:
            raise GrammarError(f"llguidance refuses the tokenizer: {exc}",
                               vocab_size=vocab_size) from exc
        self.vocab_size = vocab_size
        self.eos_token_ids = eos
        self._executor = llg.LLExecutor(max_threads)
        self._cache: OrderedDict[ResponseFormat, CompiledGrammar] = OrderedDict()
        self._cache_entries = cache_entries
        self._lock = threading.Lock()

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, vocab_size: int,
                       **kwargs: Any) -> GrammarCompiler:
        """From the data plane's `Tokenizer` (its `hf` tokenizer and its EOS ids)."""
        return cls(tokenizer.hf, eos_token_ids=tokenizer.eos_token_ids, vocab_size=vocab_size,
                   **kwargs)

    def compile(self, spec: ResponseFormat) -> CompiledGrammar:
        """The compiled grammar of `spec`, from the cache or compiled now (thread-safe).

        Raises InvalidResponseFormat for a schema llguidance refuses: invalid, unsatisfiable,
        or (strict) using a keyword it does not implement."""
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
                return hit
        grammar = self._compile(spec)
        with self._lock:
            self._cache[spec] = grammar
            self._cache.move_to_end(spec)
            while len(self._cache) > self._cache_entries:
                self._cache.popitem(last=False)
        return grammar

    def fill_bitmasks(self, bitmask: torch.Tensor, states: Sequence[GrammarState]) -> None:
        """`states[i].fill_bitmask(bitmask, i)` for every i, on the compiler's threads."""
        if not states:
            return
        _check_bitmask(bitmask, len(states), self.vocab_size)
        for state in states:
            if state.grammar.vocab_size != self.vocab_size:
                raise ValueError("a state of another compiler's vocabulary")
            state._check_live()
        words = bitmask.shape[1]
        self._executor.unsafe_compute_mask_ptr(
            [(state._matcher, i) for i, state in enumerate(states)], bitmask.data_ptr(),
            words * 4, bitmask.shape[0])
        for state in states:
            state._raise_if_failed()

    def _compile(self, spec: ResponseFormat) -> CompiledGrammar:
        options: JsonCompileOptions = {"whitespace_pattern": WHITESPACE,
                                       "lenient": not spec.strict}
        grammar = llg.LLMatcher.grammar_from_json_schema(
            _ANY_OBJECT if spec.schema is None else spec.schema, defaults=options)
        template = llg.LLMatcher(self._tokenizer, grammar, log_level=0)
        if template.is_error():
            raise InvalidResponseFormat(f"invalid JSON schema: {template.get_error()}")
        compiled = CompiledGrammar(spec, template, vocab_size=self.vocab_size,
                                   eos_token_ids=self.eos_token_ids)
        # The lexer is built lazily and shared by every copy of the template: computing the
        # first mask here keeps that cost (up to milliseconds) on the compiling thread.
        compiled.new_state().fill_bitmask(allocate_bitmask(1, self.vocab_size), 0)
        return compiled


def _check_bitmask(bitmask: torch.Tensor, min_rows: int, vocab_size: int) -> None:
    words = math.ceil(vocab_size / 32)
    if (bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or bitmask.dim() != 2
            or bitmask.shape[1] != words or bitmask.shape[0] < min_rows
            or not bitmask.is_contiguous()):
        raise ValueError(f"bitmask must be a contiguous CPU int32 [>= {min_rows}, {words}] "
                         f"tensor, got {bitmask.dtype} {tuple(bitmask.shape)} on "
                         f"{bitmask.device}")


def allocate_bitmask(num_rows: int, vocab_size: int) -> torch.Tensor:
    """A host bitmask [num_rows, ceil(vocab_size / 32)] int32, all tokens allowed.

    Pageable on purpose: `apply_bitmask` stages its upload through pinned memory, so the
    engine may refill the buffer for the next step as soon as `apply_bitmask` returns."""
    return torch.full((num_rows, math.ceil(vocab_size / 32)), -1, dtype=torch.int32)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]) -> None:
    """Mask `logits[rows[i]]` by `bitmask[i]`, in place: an id whose bit is 0 gets -inf.

    logits [N, V] float on any device; bitmask [>= len(rows), W] int32 (host, or on logits'
    device); rows: distinct logits row indices, one per constrained request, in bitmask row
    order. Ids >= 32 * W (model padding beyond the grammar's vocabulary) are masked too.
    Rows not listed are not touched. One gather, one masked fill and one scatter for all
    rows, with no host sync on CUDA."""
    if not rows:
        return
    k = len(rows)
    if logits.dim() != 2 or bitmask.dim() != 2 or bitmask.dtype != torch.int32:
        raise ValueError("logits must be [N, V] and bitmask [rows, words] int32")
    if bitmask.shape[0] < k or len(set(rows)) != k or not all(0 <= r < logits.shape[0]
                                                              for r in rows):
        raise ValueError("rows must be distinct logits rows, at most one per bitmask row")
    dev = logits.device
    words = upload(bitmask[:k], dev)
    shifts = torch.arange(32, dtype=torch.int32, device=dev)
    allowed = ((words.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)  # [k, 32 * W]
    vocab = logits.shape[1]
    if allowed.shape[1] >= vocab:
        allowed = allowed[:, :vocab]
    else:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
    index = to_device(list(rows), torch.int64, dev)
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
