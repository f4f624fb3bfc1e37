"""An example Python worker on nats-py: serves get_weather.

    NATS_URL=nats://127.0.0.1:4222 python3 examples/nats_worker.py
"""
import asyncio
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import nats  # noqa: E402

from toolsidecar_worker import ToolError, serve  # noqa: E402


async def get_weather(call):
    city = (call.args or {}).get("city")
    if not city:
        raise ToolError("invalid_args", "city is required")
    await call.progress()
    return {"city": city, "forecast": "sunny", "served_by": "python"}


async def main():
    nc = await nats.connect(os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    worker = await serve(nc, {"get_weather": get_weather}, prefix=os.environ.get("TOOLSIDECAR_PREFIX", "toolsidecar.tools"))
    print("ready", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await worker.stop()
    await nc.drain()


if __name__ == "__main__":
    asyncio.run(main())
