"""The upstream's answer passed on: its status and headers (or, after keep-alives committed a
200, its body alone), each chunk as it comes (translated where the client speaks another API),
its first byte timed for the engine's decay, its tokens given back to the key's limits before
its end goes out, and a failure told the one way still open to it."""

from __future__ import annotations

import contextlib
import functools
import logging
import time

from swapgate.control.routing.key_limits import KeyLimits
from swapgate.control.state.registry import Registry
from swapgate.data.lease import Lease
from swapgate.errors import SwapgateError, UpstreamError, UpstreamTimeout
from swapgate.metrics import Metrics
from swapgate.proxy.exchange import Exchange
from swapgate.proxy.headers import DROP_RESPONSE, route_headers
from swapgate.proxy.keepalive import Pinging
from swapgate.proxy.records import RequestRecords
from swapgate.proxy.upstream import UpstreamResponse
from swapgate.proxy.writer import BodyMode, ResponseWriter

log = logging.getLogger("swapgate.access")


class Answers:
    """Built once: what it uses outlives a config reload."""

    def __init__(
        self,
        registry: Registry,
        metrics: Metrics,
        limits: KeyLimits,
        records: RequestRecords,
    ) -> None:
        self._registry, self._metrics, self._limits = registry, metrics, limits
        self._records = records

    async def answer(
        self,
        response: UpstreamResponse,
        writer: ResponseWriter,
        ex: Exchange,
        lease: Lease,
        pinging: Pinging | None,
    ) -> None:
        """Pass the upstream's answer on: its status and headers if none went out yet, else
        (after keep-alives committed a 200) its body, or its failure in-band."""
        ex.committed_early = writer.started
        if not writer.started:
            headers = self._response_headers(response, ex)
            if ex.capture is not None:
                ex.capture.response_headers = headers
            events = response.is_event_stream
            if ex.translation is not None:
                headers = ex.translation.answer_headers(response.status, events, headers)
            mode: BodyMode = "events" if events else "body"
            await writer.start(response.status, headers, mode)
        elif ex.translation is not None:
            ex.translation.answer_headers(response.status, response.is_event_stream, [])
        elif not response.ok:
            detail = await response.excerpt()
            error = UpstreamError(f"{ex.route} answered {response.status}: {detail}")
            await report_failure(ex, writer, error)
            return
        await self._relay_body(response, writer, ex, lease, pinging)

    def _response_headers(
        self, response: UpstreamResponse, ex: Exchange
    ) -> list[tuple[bytes, bytes]]:
        headers = [(k, v) for k, v in response.headers if k.lower() not in DROP_RESPONSE]
        headers += route_headers(ex.route, ex.waited)
        if response.is_event_stream:
            headers.append((b"x-accel-buffering", b"no"))
        return headers

    async def _relay_body(
        self,
        response: UpstreamResponse,
        writer: ResponseWriter,
        ex: Exchange,
        lease: Lease,
        pinging: Pinging | None,
    ) -> None:
        """Copy the upstream's body; keep-alives still ``pinging`` stop at its first byte. An
        upstream that breaks off or stalls past ``stream_idle_timeout`` after the status went
        out (docs/architecture.md) is told as the writer's mode allows; either way the request
        counts as failed."""
        translation, pulse, capture = ex.translation, lease.pulse, ex.capture
        # The answer's tail, for its usage: its row in the activity log, its key's tpm
        counts = ex.admission is not None and ex.admission.counts_tokens
        first, tail = True, self._records.activity is not None or counts or ex.span is not None
        if ex.admission is not None and ex.admission.settles_at_end:
            writer.hold_end(functools.partial(self.release_key, ex))
        try:
            async for chunk in response.chunks():
                pulse.beat()
                if first:
                    first = False
                    await self._first_chunk(response, writer, ex, lease, pinging)
                    pinging = None
                if translation is not None:
                    chunk = translation.feed(chunk)
                    if not chunk:
                        continue
                await writer.write(chunk)
                if tail:
                    ex.keep_tail(chunk)
                if capture is not None:
                    capture.add(chunk)
                if translation is not None and translation.finished:
                    break  # its last event is out: end the answer now (Codex hangs up on it)
            last = translation.close() if translation is not None else b""
        except (UpstreamError, UpstreamTimeout) as exc:
            kind = "stall" if isinstance(exc, UpstreamTimeout) else "broken"
            self._metrics.upstream_errors.labels(lease.name, kind).inc()
            log.warning("%s failed mid-answer for %s: %s", lease.route, ex.request_id, exc)
            await report_failure(ex, writer, exc)
            return
        if ex.committed_early and writer.mode == "events" and writer.dialect.sse:
            # the header went out with the wait so far; an SSE comment, which parsers skip
            last += b": swapgate waited %d ms\n\n" % round(ex.waited * 1000)
        if tail:
            ex.keep_tail(last)
        if capture is not None:
            capture.add(last)
        await writer.end(last)
        # What the upstream still sends after a translation's last event is read to its end,
        # so that its connection is used again.
        with contextlib.suppress(UpstreamError, UpstreamTimeout):
            async for _ in response.chunks():
                pass
        response.release()

    async def release_key(
        self, ex: Exchange, usage: tuple[int | None, int | None] | None = None
    ) -> None:
        """Give back the request's place under its key's limits, with the tokens its answer
        spent (``usage``, read from its tail when not given): before the answer's end goes out
        where that matters (``settles_at_end``), else once it is over."""
        admission, ex.admission = ex.admission, None
        if admission is not None:
            tokens_in, tokens_out = usage or (ex.usage() if ex.tail else (None, None))
            await self._limits.release(admission, (tokens_in or 0) + (tokens_out or 0))

    async def _first_chunk(
        self,
        response: UpstreamResponse,
        writer: ResponseWriter,
        ex: Exchange,
        lease: Lease,
        pinging: Pinging | None,
    ) -> None:
        """The upstream's first byte: its time, reported to the records, and the keep-alives
        stop (their last words, if any, go out before it)."""
        ex.first_byte = time.perf_counter()
        self._records.first_byte(ex, lease, response.is_event_stream)
        if pinging is not None:
            last_words = await pinging.stop()
            writer.upstream_body(writer.mode == "pings")
            if last_words:  # the wait's total, to a client told the load's progress
                await writer.write(last_words)


async def report_failure(ex: Exchange, writer: ResponseWriter, exc: SwapgateError) -> None:
    """The one way to report a failure: the writer knows what the client got so far."""
    ex.failed = exc
    if not writer.started:
        writer.headers += route_headers(ex.route, ex.waited)
    await writer.fail(exc)
