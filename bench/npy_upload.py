#!/usr/bin/env python3
"""Uploads one .npy buffer of N f32 zeros (POST /v1/buffers, application/x-npy) and prints the
status, the rate and the buffer's bytes (standard library only).

    npy_upload.py URL N"""
import sys, time, http.client, urllib.parse, json
url = sys.argv[1]; n = int(sys.argv[2])
hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }" % n
pad = 64 - (10 + len(hdr) + 1) % 64
h = (hdr + " " * pad + "\n").encode()
body = b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h + bytes(4 * n)
u = urllib.parse.urlsplit(url)
c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
t0 = time.perf_counter()
c.request("POST", "/v1/buffers", body, {"Content-Type": "application/x-npy"})
r = c.getresponse(); data = r.read()
dt = time.perf_counter() - t0
print(r.status, f"{len(body)/dt/1e9:.2f} GB/s", json.loads(data).get("bytes"))
