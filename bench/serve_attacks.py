#!/usr/bin/env python3
"""Hostile clients against a served run (batchpilot-cli --serve), as issue 66's sweep sent them.

    bench/serve_attacks.py BATCHPILOT_CLI OUT.json

Starts a CLI run that serves on loopback, then sends each attack for 10 s (the slow connections
for 30 s) while a legitimate client asks GET / with the watch token every 200 ms. For each case:
the CLI's resident memory before and at its peak (VmRSS), the legitimate requests, how many
failed, the slowest, and whether the run was still alive. The legitimate client shares this
Python process (and its GIL) with the attackers, so its times are an upper bound.
"""
import gzip, json, os, random, socket, subprocess, sys, tempfile, threading, time, urllib.request

cli_path, out_path = sys.argv[1], sys.argv[2]
runs = tempfile.mkdtemp()
cli = subprocess.Popen([cli_path, "--model", "cnn", "--device", "virtual:24MiB", "--target-batch", "256",
                        "--samples", "2048", "--steps", "100000", "--threads", "1", "--quiet",
                        "--runs-dir", runs, "--serve", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
cli_pid = cli.pid
for _ in range(600):
    folders = [os.path.join(runs, f) for f in os.listdir(runs)]
    if folders and os.path.exists(os.path.join(folders[0], "serve.json")):
        break
    time.sleep(0.1)
time.sleep(0.5)
folder = folders[0]
serve = json.load(open(os.path.join(folder, "serve.json")))
port = int(serve["url"].split(":")[2].split("/")[0]); token = serve["url"].split("token=")[1]; watch = serve["watch_url"].split("token=")[1]
def rss():
    for line in open(f"/proc/{cli_pid}/status"):
        if line.startswith("VmRSS"): return int(line.split()[1]) // 1024
def alive():
    try: os.kill(cli_pid, 0); return True
    except OSError: return False
def legit():
    t = time.time()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/?token={watch}", timeout=10) as r: ok = r.status == 200
    except Exception as e: ok = False
    return ok, (time.time() - t) * 1000
def conn():
    s = socket.create_connection(("127.0.0.1", port)); return s
results = []
def case(name, fn, seconds=10, parallel=1):
    base = rss(); peak = base; stop = time.time() + seconds
    threads = [threading.Thread(target=fn, args=(stop,), daemon=True) for _ in range(parallel)]
    for t in threads: t.start()
    lat = []; fails = 0
    while time.time() < stop:
        ok, ms = legit(); lat.append(ms); fails += not ok
        peak = max(peak, rss() or 0); time.sleep(0.2)
    for t in threads: t.join(timeout=15)
    time.sleep(0.5)
    r = dict(case=name, rss_before_mb=base, rss_peak_mb=peak, growth_mb=peak - base, legit=len(lat), legit_failed=fails, legit_slowest_ms=round(max(lat), 1), alive=alive())
    results.append(r); print(json.dumps(r), flush=True)
def headers(stop):
    s = conn(); s.sendall(b"GET / HTTP/1.1\r\n")
    try:
        while time.time() < stop: s.sendall(b"X-A: b\r\n" * 1000)
    except OSError: pass
def chunked(stop):
    s = conn(); s.sendall(b"POST /command HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
    try:
        while time.time() < stop: s.sendall(b"100000\r\n" + b"a" * 0x100000 + b"\r\n")
    except OSError: pass
def nolength(stop):
    s = conn(); s.sendall(b"POST /command HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token.encode() + b"\r\n\r\n")
    try:
        while time.time() < stop: s.sendall(b"a" * 0x100000)
    except OSError: pass
bomb = gzip.compress(b"\0" * (64 << 20))
def gz(stop):
    while time.time() < stop:
        try:
            s = conn(); s.sendall(b"POST /command HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token.encode() + b"\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb) + bomb); s.close()
        except OSError: pass
held = []
def slowloris(stop):
    for i in range(600):
        try:
            s = conn(); s.sendall(b"GET / HTTP/1.1\r\nX-Slow: "); held.append(s)
        except OSError: pass
    while time.time() < stop:
        for s in list(held):
            try: s.send(b"z")
            except OSError: held.remove(s)
        time.sleep(1)
def idle(stop):
    h = []
    for i in range(400):
        try: h.append(conn())
        except OSError: pass
    while time.time() < stop: time.sleep(0.5)
noise = bytes(random.getrandbits(8) for _ in range(1 << 20))
def noisy(stop):
    while time.time() < stop:
        try:
            s = conn(); s.sendall(noise[: 1 << 20]); s.close()
        except OSError: pass
def lastid(stop):
    while time.time() < stop:
        try:
            s = conn(); s.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + watch.encode() + b"\r\nLast-Event-ID: 18446744073709551615\r\n\r\n"); s.recv(1000); s.close()
        except OSError: pass
def flood(stop):
    while time.time() < stop:
        try:
            s = conn(); s.sendall(b"GET / HTTP/9.9\r\n\r\n"); s.close()
        except OSError: pass
case("endless headers, 8 in parallel", headers, parallel=8)
case("chunked body 1 MiB chunks, 4 in parallel (with the token)", chunked, parallel=4)
case("body without Content-Length, 4 in parallel (with the token)", nolength, parallel=4)
case("gzip bomb 64 MiB of zeros, 4 in parallel (with the token)", gz, parallel=4)
case("600 slowloris connections", slowloris, seconds=30)
case("400 idle connections", idle)
case("1 MiB noise then close, 4 in parallel", noisy, parallel=4)
case("Last-Event-ID 2^64-1, 20 in parallel", lastid, parallel=20)
case("malformed request flood, 4 in parallel", flood, parallel=4)
json.dump(results, open(out_path, "w"), indent=1)
cli.terminate()
cli.wait()
