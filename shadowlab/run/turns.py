"""A cell's turns: one request at a time (``TurnExchange``: send, keep the raw answer, find the
turn's span in engine.log as it grows, ``LogSpan``) or several in flight (``ConcurrentTurns``).

Nothing here parses a log: a span is found with the engine's log family's two bounded patterns
(`LogFamily.turn_end`, `task_id`), and turns sent concurrently are tied to their tasks by the
judging step the run was handed (`RunOptions.judging`: shadowlab/judge/attribution.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import httpx

from shadowlab.engines import LogFamily, MalformedAnswer, TurnRequest
from shadowlab.errors import ProtocolError
from shadowlab.matrix import ChatPrompt, Generation
from shadowlab.plan import Cell, Turn
from shadowlab.results import records
from shadowlab.run import prompts
from shadowlab.run.context import PreparedEngine, RunContext, request_timeout
from shadowlab.run.engine import LiveEngine
from shadowlab.run.prompts import tokens_sha256

# Bounds on waiting for the engine's log after an answer (the `prompt eval time` line is
# written just before or after the HTTP response; it is normally there within milliseconds).
LOG_SPAN_WAIT_S = 5.0
# The family's patterns (LogFamily.turn_end, task_id) are bounded: a match is at most
# SPAN_OVERLAP bytes, so a span is read in chunks that overlap by that much and nothing of an
# engine's log is ever held whole (it may be one line of a gigabyte).
SPAN_CHUNK = 1 << 20
SPAN_OVERLAP = 64
MAX_RESPONSE_BYTES = 64 << 20  # an answer larger than this is an engine error, not a record


class ResponseTooLarge(Exception):
    pass


def _extends(reused: int | None, processed: int | None, cached: int, length: int | None) -> str | None:
    """Why a split-control request did not compute exactly [cached, length) (None: it did): it
    must extend the cache its predecessor left (plain reuse, no restore), or the batch schedule
    is not the warm turn's."""
    if reused == cached and length is not None and processed == length - cached:
        return None
    return (f"split control: the {length}-token request reused {reused} and processed {processed} "
            f"tokens, not {cached} and {None if length is None else length - cached}: the engine did "
            "not extend its cache as the warm batch schedule needs")


class TurnExchange:
    """Send one turn, keep the raw answer, find the turn's span in engine.log."""

    def __init__(self, ctx: RunContext, engine: PreparedEngine, live: LiveEngine | None, cell_dir: Path,
                 turn: Turn, replies: Mapping[int, str], *, generation: Generation | None) -> None:
        self.ctx, self.engine, self.live, self.cell_dir = ctx, engine, live, cell_dir
        self.turn = turn
        self.generation = generation  # the cell's (plan.json), else the engine default's
        self.replies = replies
        self.prefix_only = False  # set by _request: a split control's request up to a batch break
        self.claimed: tuple[int | None, int | None] = (None, None)  # the answer's (id_slot, id_task)

    def run(self, span: LogSpan | None) -> records.TurnRecord:
        """Send the turn; its log span starts at ``span.start`` (a byte offset of engine.log).
        None: sent among others in flight, its lines found afterwards (ConcurrentTurns)."""
        request = self._request()
        path, body = self.engine.adapter.completion_request(request, self._generation())
        record = self._empty_record(request, path)
        try:
            status, raw, ttft_ms, response_ms = self._post(path, body)
        except httpx.TimeoutException:
            record.error = f"no answer within {self._timeout():g} s (request timeout)"
            return self._close_span(record, span)
        except httpx.TransportError as exc:
            record.error = f"connection failed: {type(exc).__name__}: {exc}"
            return self._close_span(record, span)
        except MalformedAnswer as exc:
            record.error = f"malformed streamed answer: {exc}"
            return self._close_span(record, span)
        except (httpx.HTTPError, ResponseTooLarge) as exc:  # malformed HTTP, oversized answer
            record.error = f"unreadable answer: {type(exc).__name__}: {exc}"
            return self._close_span(record, span)
        record.http_status, record.ttft_ms, record.response_ms = status, ttft_ms, response_ms
        response_path = self.ctx.layout.response(self.cell_dir.name, self.turn.index)
        records.write_bytes_atomic(response_path, raw)
        record.response_file = response_path.relative_to(self.cell_dir).as_posix()
        self._read_answer(record, status, raw)
        if record.error is None and self._by_requests():
            points = self.turn.split_points or ()
            record.error = _extends(record.reused_tokens, record.processed_tokens,
                                    points[-2] if len(points) > 1 else 0, record.prompt_tokens)
        return self._close_span(record, span)

    def _by_requests(self) -> bool:
        """A turn of a llama-server split control (DESIGN §5): one request of the sequence."""
        return self.turn.split_points is not None and self.engine.adapter.split_control == "requests"

    def _generation(self) -> Any:
        """The cell's generation settings. A split control's request up to a batch break asks for
        one token (llama-server samples one even for 0), which is never decoded into the cache;
        the prompt itself the cell's."""
        generation = self.generation or Generation()
        return dataclasses.replace(generation, n_predict=1) if self.prefix_only else generation

    def _request(self) -> TurnRequest:
        spec = self.ctx.prompt_specs.get(self.turn.prompt_id)
        if spec is None:  # a traffic turn (DESIGN §2): token ids, the conversation, maybe a slot
            return self._traffic_request()
        delimiters = self._delimiters()
        extra: dict[str, Any] = {}
        if self.turn.split_points is not None:  # a split control (DESIGN §5): the warm schedule
            extra = self.engine.adapter.split_request_fields(self.turn.split_points)
        index, pid = self.turn.index, self.turn.prompt_id
        if isinstance(spec, ChatPrompt) and self.turn.endpoint == "chat":
            messages = prompts.chat_messages(spec, self.replies)
            return TurnRequest(index, pid, messages=tuple(messages), message_delimiters=delimiters,
                               extra_body=extra)
        if isinstance(spec, ChatPrompt):  # a conversation sent as ChatML tokens to /completion
            tokens = prompts.materialize_chat(spec, self.replies, self.live.tokenize).tokens
        else:
            tokens = self.engine.prompts[pid].tokens
        if self._by_requests():  # this request of a split control: the prompt up to its break
            self.prefix_only = self.turn.split_points[-1] < len(tokens)
            tokens = tokens[:self.turn.split_points[-1]]
        return TurnRequest(index, pid, prompt_tokens=tuple(tokens), message_delimiters=delimiters,
                           extra_body=extra)

    def _delimiters(self) -> tuple[Mapping[str, str], ...]:
        """The user-message delimiters the turn sends (plan.json: the turn's `message_delimiters`)."""
        return prompts.CHATML_MESSAGE_DELIMITERS if self.turn.message_delimiters else ()

    def _traffic_request(self) -> TurnRequest:
        """A traffic turn: its token ids, sent with its conversation (the engines' affinity key),
        its pinned slot, without cache for a replayed reference, and with the delimiters (the
        reference too: it differs from the warm turn only in reuse)."""
        turn = self.turn
        tokens = self.engine.prompts[turn.prompt_id].tokens
        return TurnRequest(turn.index, turn.prompt_id, prompt_tokens=tuple(tokens), conversation=turn.conversation,
                           slot=turn.slot, cache_prompt=turn.cache_prompt, message_delimiters=self._delimiters())

    def _empty_record(self, request: TurnRequest, path: str) -> records.TurnRecord:
        if request.is_chat:
            messages = [dict(m) for m in request.messages or ()]
            sha, ids, count = records.sha256_json(messages), None, None
        else:
            messages, ids = None, list(request.prompt_tokens or ())
            sha, count = tokens_sha256(ids), len(ids)
        return records.TurnRecord(
            index=self.turn.index, prompt_id=self.turn.prompt_id, prompt_sha256=sha,
            prompt_tokens=count, prompt_token_ids=ids, messages=messages, endpoint=path,
            http_status=None, error=None, timings={}, reused_tokens=None, processed_tokens=None,
            prefill_ms=None, ttft_ms=None, response_ms=None, completion=None, log_offsets=[0, 0],
            log_complete=False, task_ids=[], response_file=None, conversation=self.turn.conversation,
        )

    def _timeout(self) -> float:
        return request_timeout(self.ctx.options.request_timeout_s)

    def _post(self, path: str, body: dict) -> tuple[int, bytes, float, float]:
        """(status, raw body, ms to the first token, ms to whole answer), client-side. A streamed
        answer (server-sent events) comes back as the body its events add up to, its first
        token timed at the first event that carries one; any other answer's at its first byte."""
        limit = self._timeout()
        timeout = httpx.Timeout(limit, connect=min(10.0, limit))
        sent = time.monotonic()
        deadline = sent + limit  # whole answer: httpx's timeouts are per read (a trickle never trips them)
        # ASCII JSON: a spliced reply may hold lone surrogates (the engine's own escapes), which
        # httpx's UTF-8 encoding of json= would refuse; escaped, they go back as they came.
        content = json.dumps(body).encode("ascii")
        with self.live.client.stream("POST", path, content=content, timeout=timeout,
                                     headers={"content-type": "application/json"}) as response:
            chunks = response.iter_raw()
            answer = self.engine.adapter.read_streamed(response.headers.get("content-type"), chunks, body,
                                                       max_bytes=MAX_RESPONSE_BYTES, deadline=deadline)
            if answer is not None:
                return (response.status_code, json.dumps(answer.body).encode("ascii"),
                        (answer.first_token_at - sent) * 1000.0, (time.monotonic() - sent) * 1000.0)
            first = next(chunks, b"")
            ttft_ms = (time.monotonic() - sent) * 1000.0
            parts, size = [first], len(first)
            for chunk in chunks:
                parts.append(chunk)
                size += len(chunk)
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout("the answer did not end in time")
                if size > MAX_RESPONSE_BYTES:
                    raise ResponseTooLarge(f"answer larger than {MAX_RESPONSE_BYTES} bytes")
        return response.status_code, b"".join(parts), ttft_ms, (time.monotonic() - sent) * 1000.0

    def _read_answer(self, record: records.TurnRecord, status: int, raw: bytes) -> None:
        try:
            body = json.loads(raw)
        except ValueError:
            record.error = f"HTTP {status}: answer is not JSON ({len(raw)} bytes)"
            return
        if status != 200 or not isinstance(body, dict) or body.get("error") is not None:
            # An error body is an error whatever the status (some servers answer 200 with one).
            error = body.get("error") if isinstance(body, dict) else None
            message = error.get("message") if isinstance(error, dict) else error
            record.error = f"HTTP {status}: {message[:500] if isinstance(message, str) else 'error answer'}"
            return
        try:
            result = self.engine.adapter.parse_response(body)
        except Exception as exc:  # noqa: BLE001 - the body is untrusted; a parser surprise is its error
            record.error = f"HTTP {status}: answer of an unexpected shape ({type(exc).__name__}: {exc})"
            return
        record.timings = dict(result.timings)
        self.claimed = result.slot, result.task
        record.reused_tokens, record.processed_tokens = result.reused_tokens, result.processed_tokens
        record.prefill_ms = result.prompt_ms
        if record.prompt_tokens is None and result.reused_tokens is not None and result.processed_tokens is not None:
            record.prompt_tokens = result.reused_tokens + result.processed_tokens
        top = None if result.top_logprobs is None else [
            [records.TopLogprob(tok, lp) for tok, lp in per_token] for per_token in result.top_logprobs]
        record.completion = records.Completion(result.text, list(result.tokens),
                                               records.sha256_text(result.text), result.stop_type, top)

    def _close_span(self, record: records.TurnRecord, span: LogSpan | None) -> records.TurnRecord:
        """Wait (bounded) for this turn's `prompt eval time` line; the span ends after it."""
        if span is None:
            return record
        # No line to wait for when the turn failed or the engine's log format is unknown.
        expect_line = record.error is None and self.engine.family.turn_end is not None
        deadline = time.monotonic() + (LOG_SPAN_WAIT_S if expect_line else 0.0)
        while True:
            span.extend(line_boundary(span.path))
            span.apply(record)
            # No line will come from an engine that exited or can write no more to its log.
            if span.complete or time.monotonic() >= deadline or self.live.proc.poll() is not None \
                    or self.live.proc.log_at_cap():
                return record
            time.sleep(0.01)


class ConcurrentTurns:
    """A traffic's warm cell with `in_flight` N > 1 (DESIGN §2): up to N requests in flight, sent
    in the traffic's order, each once its conversation's previous request has been answered (a
    request that must wait holds back the ones after it, so the send order stays the traffic's).
    Their log lines interleave: after the last answer every turn is tied to its task by the
    run's judging step (`tie`: shadowlab/judge/attribution.py), and a turn that cannot be tied
    fails the cell."""

    def __init__(self, ctx: RunContext, engine: PreparedEngine, live: LiveEngine, cell_dir: Path, cell: Cell,
                 check: Callable[[Turn], None]) -> None:
        self.ctx, self.engine, self.live, self.cell_dir, self.cell = ctx, engine, live, cell_dir, cell
        self.check = check  # after each answer: the engine still healthy (raises when not)
        self.exchanges: dict[int, TurnExchange] = {}
        self.start = line_boundary(live.proc.log_path)

    def run(self, out: list[records.TurnRecord]) -> tuple[Turn, records.TurnRecord] | None:
        """Send every turn; `out` gets the answered turns' records in turn order (also when this
        raises); the first failed turn and its record, else None."""
        pending = list(self.cell.turns)  # the traffic's order
        running: dict[Future, tuple[Turn, float, int]] = {}
        answered: dict[int, records.TurnRecord] = {}
        busy: set[str] = set()  # conversations with a request in flight
        failed: tuple[Turn, records.TurnRecord] | None = None
        first_sent: float | None = None
        pool = ThreadPoolExecutor(max_workers=self.cell.in_flight, thread_name_prefix="shadowlab-turn")
        try:
            while running or (pending and failed is None):  # after a failure: wait for the rest only
                while (failed is None and pending and len(running) < self.cell.in_flight
                       and pending[0].conversation not in busy):
                    turn = pending.pop(0)
                    exchange = TurnExchange(self.ctx, self.engine, self.live, self.cell_dir, turn, {},
                                            generation=self.cell.generation)
                    self.exchanges[turn.index] = exchange
                    now = time.monotonic()
                    first_sent = now if first_sent is None else first_sent
                    running[pool.submit(exchange.run, None)] = (turn, (now - first_sent) * 1000.0, len(running) + 1)
                    if turn.conversation is not None:
                        busy.add(turn.conversation)
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    turn, sent_ms, in_flight = running.pop(future)
                    record = future.result()
                    record.sent_ms, record.in_flight = round(sent_ms, 3), in_flight
                    answered[turn.index] = record
                    busy.discard(turn.conversation)  # type: ignore[arg-type]
                    if record.error is not None:
                        failed = failed or (turn, record)
                    elif failed is None:
                        self.check(turn)
        finally:
            # Requests still in flight end when the engine is stopped; never wait on them here.
            pool.shutdown(wait=False, cancel_futures=True)
            out[:] = [answered[i] for i in sorted(answered)]
        return failed

    def tie(self, turns: list[records.TurnRecord]) -> None:
        """Each turn tied to its task by the run's judging step, which sets its task_ids and log
        span; ProtocolError naming the first turn that cannot be tied (never a guess)."""
        name = self.engine.spec.name
        judging = self.ctx.options.judging
        if judging is None:
            raise ProtocolError("requests sent concurrently cannot be tied to their tasks: this run was "
                                "given no judging step (`shadowlab run` gives it)", engine=name)
        self._wait_for_lines(len(turns))
        claims = {index: exchange.claimed for index, exchange in self.exchanges.items()}
        why = judging.tie_turns(self.live.proc.log_path, self.engine.family, self.start, turns, claims)
        if why is not None:
            raise ProtocolError(f"requests sent concurrently: {why}", engine=name)

    def _wait_for_lines(self, count: int) -> None:
        """Wait (bounded) until the log holds a turn-ending line (`LogFamily.turn_end`) per turn:
        llama-server prints it before the answer, an engine may flush it later."""
        pattern = self.engine.family.turn_end
        if pattern is None:
            return
        log, deadline = self.live.proc.log_path, time.monotonic() + LOG_SPAN_WAIT_S
        seen, at = 0, self.start
        while True:
            end = line_boundary(log)
            seen += _count_lines(log, at, end, pattern)
            at = end
            if seen >= count or time.monotonic() >= deadline or self.live.proc.poll() is not None:
                return
            time.sleep(0.02)


def _count_lines(path: Path, start: int, end: int, pattern: re.Pattern[bytes]) -> int:
    """Lines of [start, end) (whole lines) that match, read SPAN_CHUNK bytes at a time."""
    count, carry = 0, b""
    with open(path, "rb") as fh:
        fh.seek(start)
        left = end - start
        while left > 0:
            chunk = fh.read(min(SPAN_CHUNK, left))
            if not chunk:
                break
            left -= len(chunk)
            body = carry + chunk
            cut = body.rfind(b"\n") + 1 if left > 0 else len(body)
            count += len(pattern.findall(body[:cut]))
            carry = body[cut:]
            if len(carry) > SPAN_CHUNK:  # one line longer than a chunk: count what it holds once
                count += len(pattern.findall(carry))
                carry = b""
    return count


class LogSpan:
    """What a turn's span [start, end) of engine.log holds, read as it grows in chunks of
    SPAN_CHUNK bytes: memory stays bounded whatever the engine writes, and each byte is read
    about once however long the runner waits for the turn's turn-ending line."""

    def __init__(self, path: Path, start: int, family: LogFamily) -> None:
        self.path, self.start, self.end = path, start, start
        self.family = family
        self.complete = False  # holds its family's turn-ending line (llama.cpp: `prompt eval time`)
        self.task_ids: set[int] = set()

    def extend(self, end: int) -> None:
        if end <= self.end:
            return
        pos = max(self.start, self.end - SPAN_OVERLAP)  # a match cut by the previous end
        with open(self.path, "rb") as fh:
            while True:
                want = min(SPAN_CHUNK, end - pos)
                fh.seek(pos)
                chunk = fh.read(want)
                if self.family.turn_end is not None:
                    self.complete = self.complete or self.family.turn_end.search(chunk) is not None
                if self.family.task_id is not None:
                    self.task_ids.update(int(m) for m in self.family.task_id.findall(chunk))
                if len(chunk) < want or pos + want >= end:  # the span's end, or the file's
                    break
                pos += want - SPAN_OVERLAP
        self.end = end

    def apply(self, record: records.TurnRecord) -> None:
        record.log_offsets = [self.start, self.end]
        record.log_complete = self.complete
        record.task_ids = sorted(self.task_ids)


def line_boundary(path: Path) -> int:
    """Offset just after the last complete line of a growing log."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        back = min(size, 1 << 16)
        fh.seek(size - back)
        tail = fh.read(back)
    cut = tail.rfind(b"\n")
    return size - back + cut + 1 if cut >= 0 else size - back
