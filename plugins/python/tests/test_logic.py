"""Tests of the Python worker's logic against an in-memory connection.

They run everywhere (no nats-py needed): FakeConn has the part of nats-py's
connection interface the library uses (subscribe with queue and coroutine
callback, publish with reply and headers, flush, msg.respond), and delivers
messages as nats-py does, each callback as a task; fake_add_service has the
part of nats.micro's the library uses (add_service, add_endpoint, a request's
respond and respond_error, stop). test_worker.py runs the same library on
nats-py's own nats.micro against a real server, where nats-py exists.
"""
import asyncio
import json
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from typing import Annotated, Literal, Optional  # noqa: E402

from toolsidecar_worker import CREDENTIALS_ENV, TOOL_METADATA_KEY, Call, ToolError, connect_options, serve, tool  # noqa: E402
from shared import assert_cancel_gets_no_reply, hang_until_cancelled, manifest, typed  # noqa: E402

PREFIX = "t"


class FakeMsg:
    def __init__(self, conn, subject, data, reply, headers):
        self._conn, self.subject, self.data, self.reply, self.headers = conn, subject, data, reply, headers

    async def respond(self, data):
        await self._conn.publish(self.reply, data)


class FakeSub:
    def __init__(self, conn, subject, cb):
        self._conn, self.subject, self.cb = conn, subject, cb

    async def unsubscribe(self):
        self._conn.subs.remove(self)


def matches(pattern, subject):
    p, s = pattern.split("."), subject.split(".")
    return len(p) == len(s) and all(a in ("*", b) for a, b in zip(p, s))


class FakeConn:
    def __init__(self):
        self.subs = []
        self.published = []  # (subject, data, headers)
        self._n = 0

    async def subscribe(self, subject, queue="", cb=None):
        sub = FakeSub(self, subject, cb)
        self.subs.append(sub)
        return sub

    async def publish(self, subject, payload=b"", reply="", headers=None):
        self.published.append((subject, payload, headers))
        for sub in list(self.subs):
            if matches(sub.subject, subject):
                asyncio.ensure_future(sub.cb(FakeMsg(self, subject, payload, reply, headers)))

    async def flush(self):
        await asyncio.sleep(0)

    def new_inbox(self):
        self._n += 1
        return f"_INBOX.{self._n}"

    async def request(self, subject, payload, headers=None, timeout=2):
        inbox, got = self.new_inbox(), asyncio.get_running_loop().create_future()

        async def on(m):
            if not (m.headers or {}).get("Tool-Progress") and not got.done():
                got.set_result(m)

        sub = await self.subscribe(inbox, cb=on)
        await self.publish(subject, payload, reply=inbox, headers=headers)
        try:
            return await asyncio.wait_for(got, timeout)
        finally:
            await sub.unsubscribe()




class FakeRequest:
    """nats.micro's Request: the message, and replies to its reply subject."""

    def __init__(self, msg):
        self._msg = msg
        self.subject, self.data, self.headers = msg.subject, msg.data, msg.headers

    async def respond(self, data=b"", headers=None):
        if not self._msg.reply:
            raise ValueError("no reply subject set")
        await self._msg._conn.publish(self._msg.reply, data, headers=headers)

    async def respond_error(self, code, description, data=b"", headers=None):
        headers = dict(headers or {})
        headers.update({"Nats-Service-Error": description, "Nats-Service-Error-Code": code})
        await self.respond(data, headers=headers)


class FakeService:
    def __init__(self, nc, config):
        self.nc, self.config, self.subs, self.metadata = nc, config, [], {}

    async def add_endpoint(self, name, subject, handler, queue_group=None, metadata=None):
        self.metadata[name] = metadata

        async def cb(msg):
            await handler(FakeRequest(msg))
        self.subs.append(await self.nc.subscribe(subject, queue=queue_group or self.config["queue_group"], cb=cb))

    async def stop(self):
        for sub in self.subs:
            await sub.unsubscribe()


async def fake_add_service(nc, **config):
    return FakeService(nc, config)


class LogicTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.nc = FakeConn()
        self.cancelled = asyncio.Event()
        self.deadlines = []
        self.sync_thread = None

        def sync_tool(call):  # a plain function: runs in a thread, not on the loop
            self.sync_thread = threading.current_thread()
            time.sleep(0.05)
            return {"sync": call.args}

        def sync_fails(call):
            raise RuntimeError("disk full")

        async def fails_at_once(call):
            raise KeyError("no such key")  # before its first await

        hang = hang_until_cancelled(self.cancelled)

        async def slow(call):
            self.deadlines.append(call.deadline)
            await asyncio.sleep(0.05)
            await call.progress()
            self.deadlines.append(call.deadline)
            return "done"

        self.worker = await serve(self.nc, {"sync_tool": sync_tool, "sync_fails": sync_fails, "fails_at_once": fails_at_once,
                                            "typed": typed, "hang": hang, "slow": slow}, prefix=PREFIX,
                                  add_service=fake_add_service)

    async def asyncTearDown(self):
        await self.worker.stop()

    async def test_sync_handler_replies_from_a_thread(self):
        r = await self.nc.request(f"{PREFIX}.sync_tool", manifest("sync_tool", "a1", {"x": 1}))
        self.assertEqual(json.loads(r.data), {"sync": {"x": 1}})
        self.assertIsNot(self.sync_thread, threading.main_thread())

    async def test_failures_become_typed_replies_and_tracebacks(self):
        for tool, type_, message in [("sync_fails", "tool_error", "disk full"), ("fails_at_once", "tool_error", "'no such key'"),
                                     ("typed", "rate_limited", "slow down")]:
            with self.subTest(tool=tool):
                if type_ == "tool_error":
                    with self.assertLogs("toolsidecar_worker", "ERROR") as logs:
                        r = await self.nc.request(f"{PREFIX}.{tool}", manifest(tool, "a_" + tool))
                    self.assertIn("Traceback", "\n".join(logs.output))
                else:
                    r = await self.nc.request(f"{PREFIX}.{tool}", manifest(tool, "a_" + tool))
                self.assertEqual(r.headers["Tool-Error-Type"], type_)
                self.assertEqual(r.headers["Nats-Service-Error"], message)

    async def test_cancelled_call_gets_no_reply(self):
        await assert_cancel_gets_no_reply(self, self.nc, PREFIX, "a_h", self.cancelled)

    async def test_progress_moves_the_deadline(self):
        deadline = str(int(time.time() * 1000) + 500)
        r = await self.nc.request(f"{PREFIX}.slow", manifest("slow", "a_s"), headers={"Tool-Deadline": deadline})
        self.assertEqual(r.data, b"done")
        self.assertEqual(len(self.deadlines), 2)
        self.assertGreater(self.deadlines[1], self.deadlines[0])
        progress = [h for _, _, h in self.nc.published if h and h.get("Tool-Progress") == "1"]
        self.assertEqual(len(progress), 1)

    async def test_one_endpoint_per_tool_in_queue_group_toolsidecar(self):
        subjects = sorted(s.subject for s in self.nc.subs if not s.subject.startswith("_INBOX"))
        self.assertEqual(subjects, [f"{PREFIX}.cancel.*"] + sorted(f"{PREFIX}.{t}" for t in
                         ["sync_tool", "sync_fails", "fails_at_once", "typed", "hang", "slow"]))
        self.assertEqual(self.worker._service.config["queue_group"], "toolsidecar")




class ConnectOptionsTest(unittest.TestCase):
    """connect_options reads the sidecar's credentials file as the Go and Node
    libraries do, and refuses a file others may read."""

    def test_credentials_file(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "worker-credentials.json")
            with open(path, "w") as f:
                json.dump({"url": "nats://127.0.0.1:4999", "user": "toolsidecar-worker", "password": "pw"}, f)
            os.chmod(path, 0o600)
            self.assertEqual(connect_options({CREDENTIALS_ENV: path}),
                             {"servers": ["nats://127.0.0.1:4999"], "user": "toolsidecar-worker", "password": "pw"})
            self.assertEqual(connect_options({CREDENTIALS_ENV: path, "NATS_URL": "nats://h:1"})["servers"], ["nats://h:1"])
            os.chmod(path, 0o644)
            with self.assertRaisesRegex(ValueError, "others may read"):
                connect_options({CREDENTIALS_ENV: path})
            with self.assertRaisesRegex(ValueError, "does not exist: is the sidecar started"):
                connect_options({CREDENTIALS_ENV: os.path.join(d, "none")})
        self.assertEqual(connect_options({"NATS_URL": "nats://h:2", "NATS_USER": "u", "NATS_PASSWORD": "p"}),
                         {"servers": ["nats://h:2"], "user": "u", "password": "p"})


@tool(side_effects="read_only", timeout=2.5, retries=1)
async def forecast(city: Annotated[str, "the city"], call: Call, days: int = 1,
                   units: Literal["metric", "imperial"] = "metric", tags: Optional[list] = None) -> dict:
    """Weather forecast for a city.

    Not part of the description."""
    return {"city": city, "days": days, "units": units, "action": call.action_id}


class DeclareTest(unittest.IsolatedAsyncioTestCase):
    """A tool declared in code: its schema from the annotations, published
    in the endpoint's metadata, its function called with the arguments."""

    async def test_declaration_in_the_endpoint_metadata(self):
        nc = FakeConn()
        worker = await serve(nc, [forecast], prefix=PREFIX, add_service=fake_add_service)
        try:
            decl = json.loads(worker._service.metadata["forecast"][TOOL_METADATA_KEY])
            self.assertEqual(decl["description"], "Weather forecast for a city.")
            self.assertEqual(decl["side_effects"], "read_only")
            self.assertEqual(decl["timeout"], "2500ms")
            self.assertEqual(decl["retries"], 1)
            params = decl["parameters"]
            self.assertEqual(params["required"], ["city"])
            self.assertFalse(params["additionalProperties"])
            self.assertEqual(params["properties"]["city"], {"type": "string", "description": "the city"})
            self.assertEqual(params["properties"]["units"], {"enum": ["metric", "imperial"]})
            self.assertNotIn("call", params["properties"])
            r = await nc.request(f"{PREFIX}.forecast", manifest("forecast", "a_f", {"city": "Oslo", "days": 3}))
            self.assertEqual(json.loads(r.data), {"city": "Oslo", "days": 3, "units": "metric", "action": "a_f"})
        finally:
            await worker.stop()

    async def test_handlers_without_declaration_publish_none(self):
        nc = FakeConn()
        worker = await serve(nc, {"plain": typed, "declared": forecast}, prefix=PREFIX, add_service=fake_add_service)
        try:
            self.assertIsNone(worker._service.metadata["plain"])
            self.assertIn(TOOL_METADATA_KEY, worker._service.metadata["declared"])
        finally:
            await worker.stop()

    async def test_describe_answers_the_declaration_and_runs_nothing(self):
        nc = FakeConn()
        ran = []

        async def plain(call):
            ran.append(call)
            return {}
        worker = await serve(nc, {"plain": plain, "declared": forecast}, prefix=PREFIX, add_service=fake_add_service)
        try:
            r = await nc.request(f"{PREFIX}.declared", b"", headers={"Tool-Describe": "1"})
            self.assertEqual(json.loads(r.data), json.loads(worker._service.metadata["declared"][TOOL_METADATA_KEY]))
            self.assertTrue(r.headers["Tool-Worker"].startswith("python "))
            r = await nc.request(f"{PREFIX}.plain", b"", headers={"Tool-Describe": "1"})
            self.assertEqual(r.headers["Nats-Service-Error-Code"], "404")
            self.assertEqual(ran, [])
        finally:
            await worker.stop()

    def test_an_annotation_without_a_schema_is_named(self):
        class Opaque:
            pass

        def f(x: Opaque):
            pass
        with self.assertRaisesRegex(TypeError, r"f\(x\): no JSON Schema"):
            tool(f)
        with self.assertRaisesRegex(ValueError, "side_effects 'sometimes'"):
            tool(side_effects="sometimes")(forecast.fn)

    async def test_a_pydantic_model_is_the_schema_and_the_arguments(self):
        try:
            import pydantic
        except ImportError:
            self.skipTest("pydantic is not installed here; the library imports it only when a model is used")

        class Booking(pydantic.BaseModel):
            hotel: str
            nights: int = pydantic.Field(1, ge=1)

        @tool(description="Book a room")
        def book(booking: Booking) -> dict:
            return {"hotel": booking.hotel, "nights": booking.nights}

        decl = json.loads(book.declaration())
        self.assertEqual(decl["parameters"]["required"], ["hotel"])
        self.assertEqual(decl["parameters"]["properties"]["nights"]["minimum"], 1)
        call = Call(tool="book", run_id="r", action_id="a", tool_call_id="c", args={"hotel": "Pod 51"}, manifest=b"",
                    attempt=1, deadline=None, idempotency_key="a", traceparent="")
        self.assertEqual(await book.handle(call), {"hotel": "Pod 51", "nights": 1})
        call.args = {"hotel": "Pod 51", "nights": 0}
        with self.assertRaises(ToolError) as e:
            await book.handle(call)
        self.assertEqual(e.exception.type, "invalid_args")


if __name__ == "__main__":
    unittest.main()
