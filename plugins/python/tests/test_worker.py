"""Tests of the Python worker against a real NATS server.

They need nats-py and NATS_URL (scripts/with-nats.sh starts a server). Where
nats-py cannot be imported the module is skipped as a whole, and says so.
"""
import asyncio
import json
import logging
import os
import sys
import time
import unittest
import unittest.mock

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

try:
    import nats  # noqa: F401
except ImportError:  # pragma: no cover
    raise unittest.SkipTest("nats-py is not importable here")

from toolsidecar_worker import CREDENTIALS_ENV, TOOL_METADATA_KEY, VERSION, connect, serve, tool  # noqa: E402
from shared import assert_cancel_gets_no_reply, hang_until_cancelled, manifest, typed  # noqa: E402

PREFIX = "pytest"




class WorkerTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.nc = await nats.connect(os.environ["NATS_URL"])
        self.side = await nats.connect(os.environ["NATS_URL"])
        self.cancelled = asyncio.Event()

        async def echo(call):
            return {"args": call.args, "attempt": call.attempt, "key": call.idempotency_key}

        hang = hang_until_cancelled(self.cancelled)

        self.worker = await serve(self.nc, {"echo": echo, "typed": typed, "hang": hang}, prefix=PREFIX)

    async def asyncTearDown(self):
        await self.worker.stop()
        await self.nc.close()
        await self.side.close()

    async def test_success(self):
        headers = {"Tool-Attempt": "2", "Tool-Idempotency-Key": "act_1", "Tool-Deadline": str(int(time.time() * 1000) + 2000)}
        r = await self.side.request(f"{PREFIX}.echo", manifest("echo", "act_1", {"x": 1}), timeout=2, headers=headers)
        self.assertEqual(json.loads(r.data), {"args": {"x": 1}, "attempt": 2, "key": "act_1"})

    async def test_typed_error(self):
        r = await self.side.request(f"{PREFIX}.typed", manifest("typed", "act_2", {}), timeout=2)
        self.assertEqual(r.headers["Tool-Error-Type"], "rate_limited")
        self.assertEqual(r.headers["Nats-Service-Error-Code"], "429")
        self.assertEqual(r.headers["Nats-Service-Error"], "slow down")

    async def test_cancel_subject(self):
        await assert_cancel_gets_no_reply(self, self.side, PREFIX, "act_h", self.cancelled)

    async def test_info(self):
        r = await self.side.request("$SRV.INFO", b"", timeout=2)
        info = json.loads(r.data)
        subjects = sorted(e["subject"] for e in info["endpoints"])
        self.assertEqual(subjects, [f"{PREFIX}.echo", f"{PREFIX}.hang", f"{PREFIX}.typed"])
        self.assertEqual({e["queue_group"] for e in info["endpoints"]}, {"toolsidecar"})
        r = await self.side.request("$SRV.PING", b"", timeout=2)
        info = json.loads(r.data)
        self.assertEqual(info["name"], "toolsidecar-worker")
        self.assertEqual(info["metadata"], {"language": "python", "library_version": VERSION})

    async def test_declared_tool_in_info(self):
        """A tool declared with @tool: nats.micro publishes its declaration."""
        @tool(side_effects="read_only")
        async def lookup(city: str) -> dict:
            """Look a city up."""
            return {"city": city}

        w = await serve(self.nc, [lookup], prefix=PREFIX + "d")
        try:
            r = await self.side.request(f"{PREFIX}d.lookup", manifest("lookup", "act_d", {"city": "Oslo"}), timeout=2)
            self.assertEqual(json.loads(r.data), {"city": "Oslo"})
            inbox = self.side.new_inbox()
            sub = await self.side.subscribe(inbox)
            await self.side.publish("$SRV.INFO", b"", reply=inbox)
            decl = None
            while decl is None:
                info = json.loads((await sub.next_msg(timeout=2)).data)
                for e in info["endpoints"]:
                    if e["subject"] == f"{PREFIX}d.lookup":
                        decl = json.loads(e["metadata"][TOOL_METADATA_KEY])
            self.assertEqual(decl["description"], "Look a city up.")
            self.assertEqual(decl["parameters"]["required"], ["city"])
        finally:
            await w.stop()

    async def test_stats(self):
        """nats.micro answers $SRV.STATS: the calls each tool took."""
        for i in range(2):
            await self.side.request(f"{PREFIX}.echo", manifest("echo", f"act_s{i}", {}), timeout=2)
        await self.side.request(f"{PREFIX}.typed", manifest("typed", "act_s2", {}), timeout=2)
        r = await self.side.request("$SRV.STATS", b"", timeout=2)
        stats = {e["name"]: e for e in json.loads(r.data)["endpoints"]}
        self.assertEqual(stats["echo"]["num_requests"], 2)
        self.assertEqual(stats["typed"]["num_requests"], 1)


class ConnectWithoutCredentialsTest(unittest.IsolatedAsyncioTestCase):
    """A worker that finds no credentials and cannot connect says what it looked for."""

    async def test_failure_names_the_file_and_the_variable(self):
        import socket
        import tempfile

        with socket.socket() as s:  # a port nothing serves
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("NATS_") and k != CREDENTIALS_ENV}
        with tempfile.TemporaryDirectory() as d, unittest.mock.patch.dict(os.environ, {**env, "TMPDIR": d}, clear=True):
            tempfile.tempdir = None  # gettempdir reads TMPDIR again
            try:
                with self.assertRaises(ConnectionError) as caught:
                    await connect(servers=[f"nats://127.0.0.1:{port}"], allow_reconnect=False, max_reconnect_attempts=1, reconnect_time_wait=0.01, connect_timeout=2)
            finally:
                tempfile.tempdir = None
        self.assertIn("without credentials", str(caught.exception))
        self.assertIn(os.path.join(d, "toolsidecar-nats-4222", "worker-credentials.json"), str(caught.exception))
        self.assertIn(CREDENTIALS_ENV, str(caught.exception))


class ConnectFailsAtOnceTest(unittest.IsolatedAsyncioTestCase):
    """A worker whose first connection fails says why at once, in one line.

    nats-py on its defaults retries for two minutes, logging a traceback for
    each attempt, before it raises; connect() raises at the first failure,
    naming the URL and what to check, and logs no traceback.
    """

    async def test_one_attempt_no_traceback(self):
        attempts = 0

        async def refuse(reader, writer):  # a server that is not NATS: it hangs up
            nonlocal attempts
            attempts += 1
            writer.close()

        server = await asyncio.start_server(refuse, "127.0.0.1", 0)
        url = f"nats://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        records = []

        class Keep(logging.Handler):
            def emit(self, record):
                records.append(record)

        handler = Keep()
        logging.getLogger().addHandler(handler)
        try:
            with self.assertRaises(ConnectionError) as caught:
                await connect(servers=[url], user="w", password="p")
        finally:
            logging.getLogger().removeHandler(handler)
            server.close()
            await server.wait_closed()
        self.assertEqual(attempts, 1, "connect retried a first connection that failed")
        self.assertIn(url, str(caught.exception))
        self.assertIn("is the sidecar", str(caught.exception))
        self.assertEqual([r.getMessage() for r in records if r.exc_info], [], "a traceback was logged")


if __name__ == "__main__":
    unittest.main()
