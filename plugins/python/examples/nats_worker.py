"""An example Python worker on nats-py: declares get_weather in its code and
serves it; the sidecar needs no tools entry for it.

    python3 examples/nats_worker.py

Beside a sidecar on its defaults it needs nothing more: connect() reads the
credentials the sidecar's embedded NATS server issued. Else
TOOLSIDECAR_WORKER_CREDENTIALS names that file (the sidecar logs its path), or
NATS_URL, NATS_USER and NATS_PASSWORD name a server and a user.
"""
import asyncio
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from typing import Annotated  # noqa: E402

from toolsidecar_worker import Call, connect, serve, tool  # noqa: E402


@tool(side_effects="read_only", timeout=10)
async def get_weather(city: Annotated[str, "the city"], call: Call) -> dict:
    """Weather forecast for a city."""
    await call.progress()  # a slow lookup would report progress as it goes
    return {"city": city, "forecast": "sunny", "served_by": "python"}


async def main():
    nc = await connect()
    worker = await serve(nc, [get_weather], prefix=os.environ.get("TOOLSIDECAR_PREFIX", "toolsidecar.tools"))
    print("ready", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await worker.stop()
    await nc.drain()


if __name__ == "__main__":
    asyncio.run(main())
