"""Fixtures shared by the in-memory and the real-server tests."""
import asyncio
import json

from toolsidecar_worker import ToolError


def manifest(tool, action_id, args=None):
    """A request body as the sidecar sends it: the manifest Core sent."""
    return json.dumps({"type": "tool_call_manifest", "run_id": "run_1", "action_id": action_id,
                       "tool_call_id": "call_" + action_id, "tool": tool, "args": args or {}}).encode()


async def typed(call):
    raise ToolError("rate_limited", "slow down")


def hang_until_cancelled(cancelled: asyncio.Event):
    """A handler that waits until the sidecar cancels it, then sets cancelled."""
    async def hang(call):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
    return hang


async def assert_cancel_gets_no_reply(test, conn, prefix, action_id, cancelled: asyncio.Event):
    """The cancel subject stops a hanging call, and no reply follows."""
    inbox = conn.new_inbox()
    replies = []

    async def on_reply(m):  # nats-py takes coroutine callbacks only
        replies.append(m)

    await conn.subscribe(inbox, cb=on_reply)
    await conn.publish(f"{prefix}.hang", manifest("hang", action_id), reply=inbox)
    await conn.flush()
    await asyncio.sleep(0.1)
    await conn.publish(f"{prefix}.cancel.{action_id}", b"")
    await asyncio.wait_for(cancelled.wait(), 5)
    await asyncio.sleep(0.1)
    test.assertEqual(replies, [])
