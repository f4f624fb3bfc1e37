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
import enum
import typing
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Optional, Tuple, Union

__all__ = ["Call", "Tool", "ToolError", "Worker", "serve", "tool", "connect", "connect_options", "default_credentials", "no_credentials",
           "ERROR_CODES", "VERSION", "SERVICE_NAME", "CREDENTIALS_ENV", "TOOL_METADATA_KEY"]

#: The version the micro service announces.
VERSION = "0.2.0"

#: The micro service name every worker library registers under.
SERVICE_NAME = "toolsidecar-worker"

#: The variable naming the credentials file the sidecar's embedded NATS issues.
CREDENTIALS_ENV = "TOOLSIDECAR_WORKER_CREDENTIALS"

#: The endpoint metadata key under which a tool's declaration is published.
TOOL_METADATA_KEY = "toolsidecar.tool"


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


def no_credentials(env: Optional[Dict[str, str]] = None) -> str:
    """Why a worker connects without credentials: the file it looked for, and the variables that name others."""
    env = os.environ if env is None else env
    if env.get("NATS_URL"):
        return f"NATS_URL is set and neither {CREDENTIALS_ENV} (the sidecar's credentials file) nor NATS_USER is"
    return (f"no credentials file at {default_credentials()}, where a sidecar on its defaults writes it "
            f"(is the sidecar started?), and {CREDENTIALS_ENV} names no other")


class _FirstConnectFailed(Exception):
    """Raised from the error callback to end nats.connect at its first failure."""


async def connect(**kwargs: Any):
    """nats.connect with connect_options(); kwargs add to them or override them.

    Like the Go library's Connect, a first connection that fails raises at
    once (nats-py would retry for two minutes, a traceback each time), with
    a ConnectionError that names the URL, the cause and what to check. Once
    connected, the connection reconnects for ever, logging one line for
    each error, loss and return (no traceback): pass error_cb,
    disconnected_cb or reconnected_cb to replace them.
    """
    import nats  # nats-py

    opts = {"max_reconnect_attempts": -1, **connect_options(), **kwargs}
    servers = opts.get("servers")
    connected = False
    later_error_cb = opts.pop("error_cb", None)

    async def error_cb(e: Exception) -> None:
        if not connected:
            raise _FirstConnectFailed(e)
        if later_error_cb is not None:
            await later_error_cb(e)
        else:
            log.warning("nats: %s", _reason(e))

    async def disconnected() -> None:
        if nc.is_closed:  # closed on purpose: nothing to reconnect
            return
        log.warning("nats: disconnected from %s; reconnecting", _urls(servers))

    async def reconnected() -> None:
        log.warning("nats: reconnected to %s", _urls(servers))

    opts.setdefault("disconnected_cb", disconnected)
    opts.setdefault("reconnected_cb", reconnected)
    nc = nats.NATS()
    try:
        await nc.connect(**opts, error_cb=error_cb)
    except Exception as e:
        await nc.close()
        cause = e.args[0] if isinstance(e, _FirstConnectFailed) else e
        raise ConnectionError(f"connecting to {_urls(servers)}: {_reason(cause)} ({_fix(opts)})") from None
    connected = True
    return nc


def _urls(servers: Any) -> str:
    return servers if isinstance(servers, str) else ", ".join(servers or [])


def _reason(e: BaseException) -> str:
    """An error in one line: its text, or its type when it has none."""
    return str(e) or type(e).__name__


def _fix(opts: Dict[str, Any]) -> str:
    """What to check when the first connection fails, by the credentials used."""
    if not any(k in opts for k in ("user", "token", "user_credentials", "nkeys_seed")):
        return "without credentials: " + no_credentials()
    return ("is the sidecar (its NATS server) running there, and are these its credentials? "
            f"NATS_URL or {CREDENTIALS_ENV} names another")


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

    def __init__(self, nc, prefix: str, tools: Dict[str, Tuple[Handler, Optional[str]]], concurrency: int):
        self._nc = nc
        self._prefix = prefix
        self._tools = tools  # name: (handler, declaration as JSON or None)
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
        for name, (handler, declaration) in self._tools.items():
            async def start_call(req, name=name, handler=handler, declaration=declaration):
                if (req.headers or {}).get("Tool-Describe"):
                    await self._describe(req, name, declaration)
                    return
                task = asyncio.ensure_future(self._handle(name, handler, req))
                self._running.add(task)
                task.add_done_callback(self._running.discard)

            metadata = {TOOL_METADATA_KEY: declaration} if declaration is not None else None
            await self._service.add_endpoint(name=name, subject=f"{self._prefix}.{name}", handler=start_call, metadata=metadata)
        self._cancel_sub = await self._nc.subscribe(f"{self._prefix}.cancel.*", cb=self._on_cancel)
        await self._nc.flush()

    async def _on_cancel(self, msg) -> None:
        action_id = msg.subject[len(self._prefix) + len(".cancel."):]
        task = self._tasks.get(action_id)
        if task is not None:
            self._cancelled.add(action_id)
            task.cancel()

    async def _describe(self, req, name: str, declaration: Optional[str]) -> None:
        # The sidecar asks for a declaration on the tool's own subject, which
        # only a worker allowed to serve the tool receives; it never runs it.
        who = {"Tool-Worker": f"python {getattr(self._service, 'id', '')}"}
        try:
            if declaration is None:
                await req.respond_error("404", f"tool {name} is served without a declaration", headers=who)
            else:
                await req.respond(declaration.encode(), headers=who)
        except ValueError:
            pass

    @staticmethod
    async def _reply(req, data: bytes = b"", headers: Optional[Dict[str, str]] = None) -> None:
        try:
            await req.respond(data, headers=headers)
        except ValueError:  # no reply subject: nobody waits for an answer
            pass

    @staticmethod
    async def _reply_error(req, type: str, message: str) -> None:
        try:
            # One header line: a line break would end the header block early.
            message = " ".join(message.splitlines())
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


async def serve(nc, tools: Union[Dict[str, Union[Handler, "Tool"]], Iterable["Tool"]], prefix: str = "toolsidecar.tools",
                concurrency: int = 64, add_service=None) -> Worker:
    """Serve the tools on an open nats-py connection until stop().

    tools is a list of tools declared with @tool (the sidecar learns their
    schemas from this worker), or a dict of name to handler (tools the
    sidecar's configuration declares) or to a declared tool.
    add_service makes the NATS micro service; it defaults to nats-py's
    ``nats.micro.add_service`` (a test may pass another with its interface).
    """
    if add_service is None:
        from nats.micro import add_service  # nats-py 2.15 or later
    items = tools.items() if isinstance(tools, dict) else ((t.name, t) for t in tools)
    served: Dict[str, Tuple[Handler, Optional[str]]] = {}
    for name, h in items:
        served[name] = (h.handle, h.declaration()) if isinstance(h, Tool) else (h, None)
    w = Worker(nc, prefix, served, concurrency)
    await w._start(add_service)
    return w


# Declaring a tool in code -------------------------------------------------

_SIDE_EFFECTS = ("read_only", "idempotent", "unsafe")


class Tool:
    """A tool declared in code: what the sidecar reads of it (name,
    description, JSON Schema, side effects, timeout, retries) and its
    function. Made by @tool; served by serve()."""

    def __init__(self, fn: Callable[..., Any], name: str, description: str, parameters: Dict[str, Any],
                 side_effects: Optional[str], timeout: Optional[float], retries: int,
                 call_param: Optional[str], model: Any):
        if side_effects is not None and side_effects not in _SIDE_EFFECTS:
            raise ValueError(f"tool {name}: side_effects {side_effects!r}: want one of {', '.join(_SIDE_EFFECTS)}")
        self.fn, self.name, self.description, self.parameters = fn, name, description, parameters
        self.side_effects, self.timeout, self.retries = side_effects, timeout, retries
        self._call_param, self._model = call_param, model
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def declaration(self) -> str:
        """The declaration as the sidecar reads it from the endpoint's metadata."""
        d: Dict[str, Any] = {"description": self.description, "parameters": self.parameters}
        if self.side_effects:
            d["side_effects"] = self.side_effects
        if self.timeout:
            d["timeout"] = f"{int(self.timeout * 1000)}ms"
        if self.retries:
            d["retries"] = self.retries
        return json.dumps(d, separators=(",", ":"))

    async def handle(self, call: Call) -> Any:
        """The handler serve() runs: the call's arguments as the function's."""
        args = call.args if isinstance(call.args, dict) else {}
        if self._model is not None:
            try:
                kwargs = {self._model[0]: self._model[1].model_validate(args)}
            except Exception as e:  # pydantic's ValidationError, without importing pydantic here
                raise ToolError("invalid_args", str(e)) from None
        else:
            kwargs = dict(args)
        if self._call_param:
            kwargs[self._call_param] = call
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**kwargs)
        result = await asyncio.get_running_loop().run_in_executor(None, functools.partial(self.fn, **kwargs))
        if inspect.isawaitable(result):
            result = await result
        return result


def tool(fn: Optional[Callable[..., Any]] = None, *, name: Optional[str] = None, description: Optional[str] = None,
         side_effects: Optional[str] = None, timeout: Optional[float] = None, retries: int = 0,
         parameters: Optional[Dict[str, Any]] = None) -> Any:
    """Declare a tool from a type-annotated function, the sidecar needing no
    configuration entry for it::

        @tool(side_effects="read_only")
        async def get_weather(city: Annotated[str, "the city"], days: int = 1) -> dict:
            \"\"\"Weather forecast for a city.\"\"\"

    The parameters are the tool's arguments (required unless they have a
    default; str, int, float, bool, list, dict, Optional, Literal, Enum, and
    Annotated[T, "description"]); a parameter annotated Call receives the
    call. One parameter annotated with a pydantic model makes the model's
    schema the tool's, and the arguments arrive as that model. The
    description defaults to the docstring; timeout is in seconds.
    """

    def make(f: Callable[..., Any]) -> Tool:
        schema, call_param, model = _schema_of(f)
        doc = inspect.getdoc(f) or ""
        return Tool(f, name or f.__name__, description if description is not None else doc.split("\n\n")[0].replace("\n", " "),
                    parameters if parameters is not None else schema, side_effects, timeout, retries, call_param, model)

    return make(fn) if fn is not None else make


def _schema_of(fn: Callable[..., Any]) -> Tuple[Dict[str, Any], Optional[str], Any]:
    """The JSON Schema of fn's parameters, the parameter that takes the Call,
    and (name, model) when one pydantic model is the arguments."""
    hints = typing.get_type_hints(fn, include_extras=True)
    props: Dict[str, Any] = {}
    required: List[str] = []
    call_param = None
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    for p in params:
        if hints.get(p.name) is Call:
            call_param = p.name
    rest = [p for p in params if p.name != call_param]
    if len(rest) == 1 and _is_model(hints.get(rest[0].name)):
        model = hints[rest[0].name]
        return model.model_json_schema(), call_param, (rest[0].name, model)
    for p in rest:
        props[p.name] = _type_schema(hints.get(p.name, Any), f"{fn.__name__}({p.name})")
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    schema: Dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema, call_param, None


def _is_model(t: Any) -> bool:
    return inspect.isclass(t) and hasattr(t, "model_json_schema") and hasattr(t, "model_validate")


def _type_schema(t: Any, where: str) -> Dict[str, Any]:
    """The JSON Schema of one annotation."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Annotated:
        s = _type_schema(args[0], where)
        for extra in args[1:]:
            if isinstance(extra, str):
                s = {**s, "description": extra}
        return s
    if t is Any or t is inspect.Parameter.empty:
        return {}
    if origin is Union or (origin is not None and getattr(origin, "__name__", "") == "UnionType") or type(t).__name__ == "UnionType":
        kinds = [a for a in args if a is not type(None)]
        if len(kinds) == 1:
            return _type_schema(kinds[0], where)
        return {"anyOf": [_type_schema(a, where) for a in kinds]}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (list, List, tuple, set, frozenset) or t in (list, tuple, set):
        return {"type": "array", "items": _type_schema(args[0], where)} if args else {"type": "array"}
    if origin in (dict, Dict) or t is dict:
        return {"type": "object"}
    if inspect.isclass(t) and issubclass(t, enum.Enum):
        return {"enum": [m.value for m in t]}
    if _is_model(t):
        return t.model_json_schema()
    simple = {str: "string", bool: "boolean", int: "integer", float: "number"}
    if t in simple:
        return {"type": simple[t]}
    raise TypeError(f"{where}: no JSON Schema for the annotation {t!r}; pass parameters= to @tool")
