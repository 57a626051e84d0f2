"""Per-request stop rules and streamable text (torch-free).

Order of checks for each appended token: eos (unless ignore_eos) and `stop_token_ids` finish
with reason "stop" and contribute no text; otherwise the token's text is appended and stop
strings are searched (the output is cut before the earliest match, which is not returned);
then `max_tokens` / the model length finish with reason "length". Stop tokens and strings
apply from the `min_tokens`-th generated token on (the sampler does not draw stop tokens
before then). Streaming text holds back the last max(len(stop)) - 1 characters until the
request finishes, so a stop string that spans tokens is never partially streamed.
"""

from __future__ import annotations

from typing import Protocol

from dataplane.core import FinishReason, Sequence, SequenceStatus


class TextPusher(Protocol):
    def push(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


class StopChecker:
    def __init__(self, seq: Sequence, eos_token_ids: frozenset[int],
                 detokenizer: TextPusher | None, max_len: int) -> None:
        self.seq = seq
        self.eos_token_ids = eos_token_ids
        self.detokenizer = detokenizer
        self.max_len = max_len
        stops = seq.sampling.stop
        self._holdback = max((len(s) for s in stops), default=1) - 1
        self._emitted = 0

    def _finish(self, reason: FinishReason, stop_reason: int | str | None = None) -> None:
        self.seq.status = SequenceStatus.FINISHED
        self.seq.finish_reason = reason
        self.seq.stop_reason = stop_reason

    def abort(self) -> None:
        self._finish(FinishReason.ABORT)

    def expire(self) -> None:
        self._finish(FinishReason.DEADLINE)

    def on_token(self, token_id: int) -> str:
        """The token was appended to seq.token_ids; update text and status, return new text.
        (Runs for every row of every step: the sequence's counts are read once.)"""
        seq, sp = self.seq, self.seq.sampling
        num_tokens = len(seq.token_ids)
        num_output = num_tokens - len(seq.prompt_token_ids)
        stops = num_output >= sp.min_tokens
        if stops and ((token_id in self.eos_token_ids and not sp.ignore_eos)
                      or token_id in sp.stop_token_ids):
            self._finish(FinishReason.STOP, token_id)
        else:
            piece = self.detokenizer.push(token_id) if self.detokenizer else ""
            if piece:
                seq.output_text += piece
                if stops and sp.stop:
                    self._check_stop_strings(len(piece))
        finished = seq.status is SequenceStatus.FINISHED
        if not finished and (num_output >= sp.max_tokens or num_tokens >= self.max_len):
            self._finish(FinishReason.LENGTH)
            finished = True
        if finished and self.detokenizer and not isinstance(seq.stop_reason, str):
            seq.output_text += self.detokenizer.flush()  # held-back incomplete text
        return self._emit(finished)

    def _check_stop_strings(self, new_chars: int) -> None:
        text = self.seq.output_text
        window = max(0, len(text) - new_chars - self._holdback)
        best: tuple[int, str] | None = None
        for s in self.seq.sampling.stop:
            at = text.find(s, window)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, s)
        if best is not None:
            self.seq.output_text = text[: best[0]]
            self._finish(FinishReason.STOP, best[1])

    def _emit(self, finished: bool) -> str:
        text = self.seq.output_text
        end = len(text) if finished else len(text) - self._holdback
        if end <= self._emitted:
            return ""
        delta = text[self._emitted:end]
        self._emitted = end
        return delta
