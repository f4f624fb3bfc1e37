"""toolsidecar worker library for Python (asyncio, nats-py).

Serves tools over NATS by the toolsidecar worker protocol
(docs/worker-protocol.md): each tool listens on ``<prefix>.<tool>`` in queue
group ``toolsidecar``; the request body is the manifest exactly as Core sent
it; a success reply is the result bytes; an error reply carries the headers
``Nats-Service-Error``, ``Nats-Service-Error-Code`` and ``Tool-Error-Type``.
``call.progress()`` keeps a long call alive; ``<prefix>.cancel.<action_id>``
cancels the handler's task. The worker also answers NATS micro's
``$SRV.PING`` and ``$SRV.INFO`` so the sidecar can see it is alive.

    import asyncio, nats
    from toolsidecar_worker import serve, ToolError

    async def get_weather(call):
        if "city" not in call.args:
            raise ToolError("invalid_args", "city is required")
        return {"city": call.args["city"], "forecast": "sunny"}

    async def main():
        nc = await nats.connect("nats://127.0.0.1:4222")
        worker = await serve(nc, {"get_weather": get_weather})
        await asyncio.Event().wait()
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, Optional, Union

__all__ = ["Call", "ToolError", "Worker", "serve", "ERROR_CODES"]

log = logging.getLogger("toolsidecar_worker")

ERROR_CODES = {
    "invalid_args": 400,
    "not_found": 404,
    "timeout": 504,
    "worker_crash": 500,
    "rate_limited": 429,
    "cancelled": 499,
    "tool_error": 422,
}


class ToolError(Exception):
    """Raise from a handler to choose the error type the model sees."""

    def __init__(self, type: str, message: str):
        if type not in ERROR_CODES:
            raise ValueError(f"unknown error type {type!r}")
        super().__init__(message)
        self.type = type
        self.message = message


@dataclass
class Call:
    """One call as a handler receives it."""

    tool: str
    run_id: str
    action_id: str
    tool_call_id: str
    args: Any
    manifest: bytes
    attempt: int
    deadline: Optional[float]  # unix seconds, moved on by progress()
    idempotency_key: str
    traceparent: str
    _progress: Callable[[], Awaitable[None]] = field(repr=False, default=None)  # type: ignore[assignment]
    _loop: Optional[asyncio.AbstractEventLoop] = field(repr=False, default=None)

    async def progress(self) -> None:
        """Tell the sidecar the call is alive; restarts both deadlines."""
        if self._progress is not None:
            await self._progress()

    def progress_sync(self) -> None:
        """progress() for a synchronous handler, which runs in a thread."""
        if self._progress is not None and self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._progress(), self._loop).result()


#: A handler is an ``async def`` (run on the event loop) or a plain
#: function (run in the loop's default executor, so that it does not block
#: the loop); either returns the result.
Handler = Callable[[Call], Union[Awaitable[Any], Any]]


async def _invoke(handler: Handler, call: Call, loop: asyncio.AbstractEventLoop) -> Any:
    """Run a handler: a coroutine function on the loop, a plain function in
    the default executor. An exception raised before the first await is
    raised here, inside the call's task, like any other."""
    if inspect.iscoroutinefunction(handler):
        return await handler(call)
    result = await loop.run_in_executor(None, functools.partial(handler, call))
    if inspect.isawaitable(result):  # a plain function that returned a coroutine
        result = await result
    return result


def _encode(result: Any) -> bytes:
    if isinstance(result, (bytes, bytearray)):
        return bytes(result)
    if isinstance(result, str):
        return result.encode()
    return json.dumps(result).encode()


class Worker:
    """A running worker; stop() drains it."""

    def __init__(self, nc, prefix: str, tools: Dict[str, Handler], concurrency: int):
        self._nc = nc
        self._prefix = prefix
        self._tools = tools
        self._sem = asyncio.Semaphore(concurrency)
        self._subs = []
        self._tasks: Dict[str, asyncio.Task] = {}
        self._running: set = set()
        self._cancelled: set = set()
        self._id = uuid.uuid4().hex

    async def _start(self) -> None:
        for tool, handler in self._tools.items():
            async def cb(msg, tool=tool, handler=handler):
                task = asyncio.ensure_future(self._handle(tool, handler, msg))
                self._running.add(task)
                task.add_done_callback(self._running.discard)

            self._subs.append(await self._nc.subscribe(f"{self._prefix}.{tool}", queue="toolsidecar", cb=cb))
        self._subs.append(await self._nc.subscribe(f"{self._prefix}.cancel.*", cb=self._on_cancel))
        info = {
            "type": "io.nats.micro.v1.info_response", "name": "toolsidecar-python-worker", "id": self._id,
            "version": "0.1.0", "metadata": {},
            "endpoints": [{"name": t, "subject": f"{self._prefix}.{t}", "queue_group": "toolsidecar"} for t in self._tools],
        }
        ping = {"type": "io.nats.micro.v1.ping_response", "name": info["name"], "id": self._id, "version": "0.1.0", "metadata": {}}
        for subject, reply in (("$SRV.INFO", info), ("$SRV.PING", ping)):
            payload = json.dumps(reply).encode()

            async def answer(msg, payload=payload):
                await msg.respond(payload)

            self._subs.append(await self._nc.subscribe(subject, cb=answer))
        await self._nc.flush()

    async def _on_cancel(self, msg) -> None:
        action_id = msg.subject[len(self._prefix) + len(".cancel."):]
        task = self._tasks.get(action_id)
        if task is not None:
            self._cancelled.add(action_id)
            task.cancel()

    async def _reply_error(self, msg, type: str, message: str) -> None:
        if msg.reply:
            headers = {"Nats-Service-Error": message, "Nats-Service-Error-Code": str(ERROR_CODES[type]), "Tool-Error-Type": type}
            await self._nc.publish(msg.reply, b"", headers=headers)

    async def _handle(self, tool: str, handler: Handler, msg) -> None:
        async with self._sem:
            try:
                m = json.loads(msg.data)
            except ValueError as e:
                await self._reply_error(msg, "invalid_args", f"request body is not a manifest: {e}")
                return
            h = msg.headers or {}
            deadline_ms = h.get("Tool-Deadline")
            deadline = int(deadline_ms) / 1000 if deadline_ms else None
            budget = deadline - time.time() if deadline else None
            action_id = m.get("action_id", "")
            state = {"deadline": deadline}

            async def progress():
                if msg.reply:
                    await self._nc.publish(msg.reply, b"", headers={"Tool-Progress": "1"})
                if budget:
                    state["deadline"] = call.deadline = time.time() + budget

            loop = asyncio.get_running_loop()
            call = Call(tool=tool, run_id=m.get("run_id", ""), action_id=action_id, tool_call_id=m.get("tool_call_id", ""),
                        args=m.get("args"), manifest=msg.data, attempt=int(h.get("Tool-Attempt", "1") or 1),
                        deadline=deadline, idempotency_key=h.get("Tool-Idempotency-Key", ""),
                        traceparent=h.get("traceparent", ""), _progress=progress, _loop=loop)
            task = asyncio.ensure_future(_invoke(handler, call, loop))
            if action_id:
                self._tasks[action_id] = task
            try:
                while True:
                    timeout = None if state["deadline"] is None else max(0.0, state["deadline"] - time.time())
                    done, _ = await asyncio.wait({task}, timeout=timeout)
                    if done:
                        break
                    if state["deadline"] is not None and time.time() >= state["deadline"]:
                        task.cancel()
                        await self._reply_error(msg, "timeout", "deadline passed")
                        return
                result = task.result()
                if msg.reply:
                    await self._nc.publish(msg.reply, _encode(result))
            except asyncio.CancelledError:
                if action_id in self._cancelled:
                    return  # the sidecar stopped waiting; nobody reads a reply
                await self._reply_error(msg, "cancelled", "worker stopping")
            except ToolError as e:
                await self._reply_error(msg, e.type, e.message)
            except Exception as e:  # a failed tool is an outcome, not a crash
                log.exception("tool %s failed (action %s)", tool, action_id)
                await self._reply_error(msg, "tool_error", str(e) or type(e).__name__)
            finally:
                self._tasks.pop(action_id, None)
                self._cancelled.discard(action_id)

    async def stop(self) -> None:
        """Stop taking calls and wait for those in flight."""
        for sub in self._subs:
            await sub.unsubscribe()
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)


async def serve(nc, tools: Dict[str, Handler], prefix: str = "toolsidecar.tools", concurrency: int = 64) -> Worker:
    """Serve the tools on an open nats-py connection until stop()."""
    w = Worker(nc, prefix, tools, concurrency)
    await w._start()
    return w
