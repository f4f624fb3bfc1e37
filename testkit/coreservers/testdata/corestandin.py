"""A small stand-in for Project David Core: only the requests a sidecar
and an application's set-up make on a run, served by Python's standard
library (http.server.ThreadingHTTPServer, its default listen backlog of 5)
or by uvicorn (an ASGI app, uvicorn's defaults: keep-alive closed after
5 s idle), the servers Core's users meet.

Every run plays one script: a turn of CALLS calls of TOOL (arguments
{"i": "<k>"}), then a turn that answers "done". Everything received is
recorded, in arrival order, and answered by GET /_sim/requests, so that a
test checks Core's side of a run (one output per call, in call order,
every Action final) on what this server saw.

    corestandin.py --server threading|uvicorn --calls 16 --tool slow

prints its base URL on stdout and serves until stdin closes.
"""

import argparse
import json
import secrets
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

FINAL = ("completed", "failed", "cancelled")


def new_id(prefix):
    return prefix + secrets.token_hex(11)


class Core:
    """The state of the stand-in, shared by every request under one lock."""

    def __init__(self, calls, tool):
        self.calls, self.tool = calls, tool
        self.lock = threading.Lock()
        self.requests = []  # {"method", "path", "body"} in arrival order
        self.assistants, self.threads, self.runs, self.actions = {}, {}, {}, {}
        self.seq = 0

    def handle(self, method, target, raw):
        """Answers one request: (status, content type, body bytes)."""
        url = urlsplit(target)
        parts = url.path.strip("/").split("/")
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return 422, "application/json", dumps({"detail": "invalid JSON"})
        with self.lock:
            if parts[:2] != ["_sim", "requests"]:
                self.requests.append({"method": method, "path": url.path, "body": body})
            return self.route(method, parts, query, body)

    def route(self, method, parts, query, body):
        match (method, parts):
            case ("GET", ["_sim", "requests"]):
                return ok(self.requests)
            case ("POST", ["v1", "assistants"]):
                a = {"id": new_id("asst_"), "name": body.get("name", ""), "model": body.get("model", ""),
                     "tools": body.get("tools") or []}
                self.assistants[a["id"]] = a
                return ok(a)
            case ("GET", ["v1", "assistants", aid]):
                return found(self.assistants.get(aid), "Assistant not found")
            case ("POST", ["v1", "threads"]):
                t = {"id": new_id("thread_"), "meta_data": {}, "messages": []}
                self.threads[t["id"]] = t
                return ok({"id": t["id"], "meta_data": {}})
            case ("POST", ["v1", "messages"]):
                return self.message(body, body.get("role", "user"))
            case ("POST", ["v1", "messages", "tools"]):
                return self.message(body, "tool")
            case ("GET", ["v1", "threads", tid, "messages"]):
                t = self.threads.get(tid)
                if t is None:
                    return detail(404, "Thread not found")
                msgs = list(t["messages"])
                if query.get("order") == "desc":
                    msgs.reverse()
                limit = min(int(query.get("limit", "20")), 100)
                return ok({"object": "list", "data": msgs[:limit], "has_more": len(msgs) > limit})
            case ("POST", ["v1", "runs"]):
                if body.get("assistant_id") not in self.assistants or body.get("thread_id") not in self.threads:
                    return detail(404, "Assistant or thread not found")
                r = {"id": new_id("run_"), "assistant_id": body["assistant_id"], "thread_id": body["thread_id"],
                     "status": "queued", "model": body.get("model") or "vllm/test", "meta_data": body.get("meta_data") or {},
                     "started_at": None, "turns": 0}
                self.runs[r["id"]] = r
                return ok(public(r))
            case ("GET", ["v1", "runs", rid]):
                r = self.runs.get(rid)
                return found(r and dict(public(r), actions=[]), "Run not found")
            case ("GET", ["v1", "runs"]):
                data = [public(r) for r in self.runs.values()]
                if query.get("order") == "desc":
                    data.reverse()
                data = data[: int(query.get("limit", "20"))]
                return ok({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                           "last_id": data[-1]["id"] if data else None, "has_more": False})
            case ("POST", ["v1", "runs", rid, "cancel"]):
                r = self.runs.get(rid)
                if r is None:
                    return detail(404, "Run not found")
                r["status"] = "cancelled"
                return ok(public(r))
            case ("GET", ["v1", "runs", rid, "actions", "status"]):
                return ok([a for a in self.actions.values() if a["run_id"] == rid and a["status"] == query.get("status")])
            case ("GET", ["v1", "actions", "pending", rid]):
                return ok([{"action_id": a["id"], "tool_call_id": a["tool_call_id"], "action_status": a["status"],
                            "function_arguments": a["function_args"], "tool_name": a["tool_name"], "run_id": rid,
                            "run_status": self.runs[rid]["status"]}
                           for a in self.actions.values() if a["run_id"] == rid and a["status"] == "pending"])
            case ("GET", ["v1", "actions", aid]):
                return found(self.actions.get(aid), "Action not found")
            case ("PUT", ["v1", "actions", aid]):
                a = self.actions.get(aid)
                if a is None:
                    return detail(404, "Action not found")
                a["status"], a["result"] = body["status"], body.get("result")
                a["is_processed"] = a["status"] == "completed"
                return ok(a)
            case ("POST", ["v1", "completions"]):
                return self.turn(body)
        return detail(404, "Not Found")

    def message(self, body, role):
        t = self.threads.get(body.get("thread_id"))
        if t is None:
            return detail(404, "Thread not found")
        m = {"id": new_id("message_"), "thread_id": t["id"], "role": role, "content": body.get("content", ""),
             "tool_id": body.get("tool_id"), "tool_call_id": body.get("tool_call_id")}
        t["messages"].append(m)
        return ok(m)

    def turn(self, body):
        """One scripted turn as Core streams it: a frame per chunk, then [DONE]."""
        r = self.runs.get(body.get("run_id"))
        if r is None:
            return detail(404, "Run not found.")
        r["turns"] += 1
        rid = r["id"]
        frames = [{"type": "status", "status": "started", "run_id": rid}]
        if r["turns"] > 1:
            r["status"] = "completed"
            frames += [{"type": "content", "content": "done", "run_id": rid},
                       {"type": "status", "status": "complete", "run_id": rid}]
        else:
            if r["started_at"] is None:
                r["started_at"] = int(time.time())
            calls = []
            for k in range(self.calls):
                self.seq += 1
                args = {"i": str(k)}
                calls.append((f"call_{self.seq:08x}", args))
                frames.append({"type": "tool_call", "content": {"name": self.tool, "arguments": json.dumps(args)},
                               "run_id": rid})
            frames.append({"type": "status", "status": "processing", "run_id": rid})
            r["status"] = "action_required"
            for k, (call_id, args) in enumerate(calls):
                a = {"id": new_id("act_"), "run_id": rid, "tool_name": self.tool, "tool_call_id": call_id,
                     "turn_index": k, "status": "pending", "function_args": args, "result": None,
                     "is_processed": False, "triggered_at": time.strftime("%Y-%m-%dT%H:%M:%S") + f".{k:06d}"}
                self.actions[a["id"]] = a
                frames.append({"type": "tool_call_manifest", "run_id": rid, "action_id": a["id"],
                               "tool_call_id": call_id, "tool": self.tool, "args": args})
        sse = b"".join(b"data: " + dumps(f) + b"\n\n" for f in frames) + b"data: [DONE]\n\n"
        return 200, "text/event-stream", sse


def public(run):
    return {k: v for k, v in run.items() if k != "turns"}


def dumps(v):
    return json.dumps(v).encode()


def ok(v):
    return 200, "application/json", dumps(v)


def detail(status, msg):
    return status, "application/json", dumps({"detail": msg})


def found(v, msg):
    return ok(v) if v is not None else detail(404, msg)


def serve_threading(core):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    # The handler as most Python peers have it: HTTP/1.0 (the default
    # protocol_version), one connection per request, Nagle's algorithm on.
    # (On a kept HTTP/1.1 connection, its two writes an answer, head and
    # body, would meet the client's delayed ACK: 40 ms an answer.)
    class Handler(BaseHTTPRequestHandler):
        def answer(self):
            n = int(self.headers.get("Content-Length") or 0)
            status, ctype, body = core.handle(self.command, self.path, self.rfile.read(n))
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = answer

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # request_queue_size: 5
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return "http://127.0.0.1:%d" % srv.server_address[1], srv.server_close  # its threads are daemons


def serve_uvicorn(core):
    import uvicorn

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        target = scope["path"] + ("?" + scope["query_string"].decode() if scope["query_string"] else "")
        status, ctype, body = core.handle(scope["method"], target, raw)
        if ctype == "text/event-stream":
            # Core's StreamingResponse: chunked, a write per frame.
            await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", ctype.encode())]})
            for frame in body.split(b"\n\n")[:-1]:
                await send({"type": "http.response.body", "body": frame + b"\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    # uvicorn binds as Core's does (uvicorn --host --port): asyncio then
    # sets TCP_NODELAY on each connection, which it does not on a socket
    # handed over without its protocol.
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))  # timeout_keep_alive: 5
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]

    def stop():
        server.should_exit = True

    return "http://127.0.0.1:%d" % port, stop


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--server", choices=["threading", "uvicorn"], default="threading")
    p.add_argument("--calls", type=int, default=16)
    p.add_argument("--tool", default="slow")
    o = p.parse_args()
    core = Core(o.calls, o.tool)
    url, stop = (serve_uvicorn if o.server == "uvicorn" else serve_threading)(core)
    print(url, flush=True)
    sys.stdin.read()  # until the test closes it
    stop()


if __name__ == "__main__":
    main()
