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
