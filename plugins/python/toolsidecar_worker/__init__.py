"""toolsidecar worker library for Python (asyncio, nats-py).

Serves tools over NATS by the toolsidecar worker protocol
(docs/worker-protocol.md): each tool listens on ``<prefix>.<tool>`` in queue
group ``toolsidecar``; the request body is the manifest exactly as Core sent
it; a success reply is the result bytes; an error reply carries the headers
``Nats-Service-Error``, ``Nats-Service-Error-Code`` and ``Tool-Error-Type``.
``call.progress()`` keeps a long call alive; ``<prefix>.cancel.<action_id>``
cancels the handler's task. The tools are the endpoints of a NATS micro
service (nats-py's ``nats.micro``, nats-py 2.15 or later), which answers
``$SRV.PING``, ``$SRV.INFO`` and ``$SRV.STATS``: the sidecar sees the worker
alive, and an operator sees its calls and errors per tool.

    import asyncio
    from toolsidecar_worker import connect, serve, ToolError

    async def get_weather(call):
        if "city" not in call.args:
            raise ToolError("invalid_args", "city is required")
        return {"city": call.args["city"], "forecast": "sunny"}

    async def main():
        nc = await connect()  # the sidecar's credentials; see connect_options
        worker = await serve(nc, {"get_weather": get_weather})
        await asyncio.Event().wait()
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import os
import stat
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, Optional, Union

__all__ = ["Call", "ToolError", "Worker", "serve", "connect", "connect_options", "default_credentials",
           "ERROR_CODES", "VERSION", "SERVICE_NAME", "CREDENTIALS_ENV"]

#: The version the micro service announces.
VERSION = "0.2.0"

#: The micro service name every worker library registers under.
SERVICE_NAME = "toolsidecar-worker"

#: The variable naming the credentials file the sidecar's embedded NATS issues.
CREDENTIALS_ENV = "TOOLSIDECAR_WORKER_CREDENTIALS"


def default_credentials() -> str:
    """Where a sidecar on its defaults (embedded NATS on 127.0.0.1:4222) writes them."""
    return os.path.join(tempfile.gettempdir(), "toolsidecar-nats-4222", "worker-credentials.json")


def connect_options(env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Where and as whom a worker connects, as the Go and Node libraries decide it.

    The file TOOLSIDECAR_WORKER_CREDENTIALS names; else NATS_URL with NATS_USER
    and NATS_PASSWORD; else, with neither set, the file of a sidecar on its
    defaults when it exists. NATS_URL overrides the file's URL. The file must be
    this user's and readable by no one else: one anybody could write would send
    the worker's calls to another server. The result is nats.connect's keywords.
    """
    env = os.environ if env is None else env
    path = env.get(CREDENTIALS_ENV, "")
    if not path and not env.get("NATS_URL") and not env.get("NATS_USER") and os.path.exists(default_credentials()):
        path = default_credentials()
    if path:
        creds = _read_credentials(path)
        return {"servers": [env.get("NATS_URL") or creds.get("url") or "nats://127.0.0.1:4222"],
                "user": creds["user"], "password": creds["password"]}
    opts: Dict[str, Any] = {"servers": [env.get("NATS_URL") or "nats://127.0.0.1:4222"]}
    if env.get("NATS_USER"):
        opts.update(user=env["NATS_USER"], password=env.get("NATS_PASSWORD", ""))
    return opts


def _read_credentials(path: str) -> Dict[str, str]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ValueError(f"the credentials file {path} does not exist: is the sidecar started (it writes the file), "
                         f"and is {CREDENTIALS_ENV} its path?") from None
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise ValueError(f"the credentials file {path}: mode {stat.S_IMODE(st.st_mode):o}: others may read or change it "
                         "(the sidecar writes it 0600)")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise ValueError(f"the credentials file {path}: owned by uid {st.st_uid}, not by this user ({os.getuid()})")
    try:
        with open(path) as f:
            creds = json.load(f)
    except ValueError:
        creds = None
    if not isinstance(creds, dict) or not isinstance(creds.get("user"), str) or not isinstance(creds.get("password"), str) \
            or not creds["user"] or not creds["password"]:
        raise ValueError(f"the credentials file {path} is not the sidecar's (JSON with url, user and password)")
    return creds


async def connect(**kwargs: Any):
    """nats.connect with connect_options(); kwargs add to them or override them."""
    import nats  # nats-py

    return await nats.connect(**{**connect_options(), **kwargs})

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
        self._service = None
        self._cancel_sub = None
        self._tasks: Dict[str, asyncio.Task] = {}
        self._running: set = set()
        self._cancelled: set = set()

    async def _start(self, add_service) -> None:
        # One micro endpoint per tool, in queue group toolsidecar. nats-py
        # runs a subscription's handler to its end before the next
        # message, so the handler only starts the call's task: calls run
        # at once, up to the concurrency. The endpoint's stats therefore
        # count requests, and errors are this worker's replies.
        self._service = await add_service(self._nc, name=SERVICE_NAME, version=VERSION,
                                          metadata={"language": "python", "library_version": VERSION},
                                          description="toolsidecar tools served from Python", queue_group="toolsidecar")
        for tool, handler in self._tools.items():
            async def start_call(req, tool=tool, handler=handler):
                task = asyncio.ensure_future(self._handle(tool, handler, req))
                self._running.add(task)
                task.add_done_callback(self._running.discard)

            await self._service.add_endpoint(name=tool, subject=f"{self._prefix}.{tool}", handler=start_call)
        self._cancel_sub = await self._nc.subscribe(f"{self._prefix}.cancel.*", cb=self._on_cancel)
        await self._nc.flush()

    async def _on_cancel(self, msg) -> None:
        action_id = msg.subject[len(self._prefix) + len(".cancel."):]
        task = self._tasks.get(action_id)
        if task is not None:
            self._cancelled.add(action_id)
            task.cancel()

    @staticmethod
    async def _reply(req, data: bytes = b"", headers: Optional[Dict[str, str]] = None) -> None:
        try:
            await req.respond(data, headers=headers)
        except ValueError:  # no reply subject: nobody waits for an answer
            pass

    @staticmethod
    async def _reply_error(req, type: str, message: str) -> None:
        try:
            await req.respond_error(str(ERROR_CODES[type]), message, headers={"Tool-Error-Type": type})
        except ValueError:
            pass

    async def _handle(self, tool: str, handler: Handler, req) -> None:
        async with self._sem:
            try:
                m = json.loads(req.data)
            except ValueError as e:
                await self._reply_error(req, "invalid_args", f"request body is not a manifest: {e}")
                return
            h = req.headers or {}
            deadline_ms = h.get("Tool-Deadline")
            deadline = int(deadline_ms) / 1000 if deadline_ms else None
            budget = deadline - time.time() if deadline else None
            action_id = m.get("action_id", "")
            state = {"deadline": deadline}

            async def progress():
                await self._reply(req, headers={"Tool-Progress": "1"})
                if budget:
                    state["deadline"] = call.deadline = time.time() + budget

            loop = asyncio.get_running_loop()
            call = Call(tool=tool, run_id=m.get("run_id", ""), action_id=action_id, tool_call_id=m.get("tool_call_id", ""),
                        args=m.get("args"), manifest=req.data, attempt=int(h.get("Tool-Attempt", "1") or 1),
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
                        await self._reply_error(req, "timeout", "deadline passed")
                        return
                await self._reply(req, _encode(task.result()))
            except asyncio.CancelledError:
                if action_id in self._cancelled:
                    return  # the sidecar stopped waiting; nobody reads a reply
                await self._reply_error(req, "cancelled", "worker stopping")
            except ToolError as e:
                await self._reply_error(req, e.type, e.message)
            except Exception as e:  # a failed tool is an outcome, not a crash
                log.exception("tool %s failed (action %s)", tool, action_id)
                await self._reply_error(req, "tool_error", str(e) or type(e).__name__)
            finally:
                self._tasks.pop(action_id, None)
                self._cancelled.discard(action_id)

    async def stop(self) -> None:
        """Stop taking calls and wait for those in flight."""
        if self._service is not None:
            await self._service.stop()
        if self._cancel_sub is not None:
            await self._cancel_sub.unsubscribe()
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)


async def serve(nc, tools: Dict[str, Handler], prefix: str = "toolsidecar.tools", concurrency: int = 64,
                add_service=None) -> Worker:
    """Serve the tools on an open nats-py connection until stop().

    add_service makes the NATS micro service; it defaults to nats-py's
    ``nats.micro.add_service`` (a test may pass another with its interface).
    """
    if add_service is None:
        from nats.micro import add_service  # nats-py 2.15 or later
    w = Worker(nc, prefix, tools, concurrency)
    await w._start(add_service)
    return w
