"""An example Python worker on nats-py: serves get_weather.

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

from toolsidecar_worker import ToolError, connect, serve  # noqa: E402


async def get_weather(call):
    city = (call.args or {}).get("city")
    if not city:
        raise ToolError("invalid_args", "city is required")
    await call.progress()
    return {"city": city, "forecast": "sunny", "served_by": "python"}


async def main():
    nc = await connect()
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
