#!/usr/bin/env python3
"""Drives N runs through a sidecar with C concurrent clients (standard library only).

Core (or cmd/coresim) on 127.0.0.1:19000, the sidecar on 127.0.0.1:18080;
see BENCHMARKS.md for the set-up. Usage: drive-load.py N C
"""
import json, sys, threading, urllib.request, time
CORE = "http://127.0.0.1:19000"; SIDE = "http://127.0.0.1:18080"
def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)
asst = post(CORE + "/v1/assistants", {"name": "a", "model": "vllm/x", "tools": []})
def one(results):
    th = post(CORE + "/v1/threads", {"meta_data": {}})
    msg = post(CORE + "/v1/messages", {"content": "hi", "thread_id": th["id"], "assistant_id": asst["id"], "role": "user", "meta_data": {}, "attachments": []})
    run = post(CORE + "/v1/runs", {"assistant_id": asst["id"], "thread_id": th["id"], "instructions": "", "meta_data": {}})
    s = post(SIDE + "/v1/runs/" + run["id"] + "/drive", {"thread_id": th["id"], "assistant_id": asst["id"], "message_id": msg["id"], "model": "vllm/x"})
    results.append(s["status"])
n, conc = int(sys.argv[1]), int(sys.argv[2])
results = []; t0 = time.time()
def worker(k):
    for _ in range(k): one(results)
ts = [threading.Thread(target=worker, args=(n // conc,)) for _ in range(conc)]
[t.start() for t in ts]; [t.join() for t in ts]
print(f"runs={len(results)} completed={results.count('completed')} seconds={time.time()-t0:.1f}")
