#!/usr/bin/env python3
"""The peer of bench/e2e: the job server a lab user would write with aiohttp and PyTorch.

It takes the same requests as gpujobd's POST /v1/jobs for the op saxpy (one job object, or a
JSON array of them; inputs as base64 "b64" or inline "data") and computes out = a*x + y with
PyTorch on the GPU, one job after another inside the request, then answers 201 with the
finished job (or the array of them) in gpujobd's shape. Finished jobs are kept in a dict so
that GET /v1/jobs/{id}/wait answers at once and bench_loadgen's e2e mode runs unchanged.
Nothing is batched, nothing is tuned: that is the point of the comparison.

    aiohttp_torch_server.py [--host 127.0.0.1] [--port 8081] [--device cuda:0]

Port 0 picks a free port; "listening on http://HOST:PORT" is printed once it serves. Without
PyTorch (a machine for checking the flow only) jobs are computed with NumPy on the CPU, and the
first line printed says so."""
import argparse
import asyncio
import base64
import uuid

from aiohttp import web

try:
    import torch
except ImportError:
    torch = None
    import numpy

jobs = {}


def to_tensor(spec, device):
    if torch is None:
        if "b64" in spec:
            x = numpy.frombuffer(base64.b64decode(spec["b64"]), numpy.float32)
            return x.reshape(spec["shape"])
        return numpy.asarray(spec["data"], numpy.float32).reshape(spec["shape"])
    if "b64" in spec:
        x = torch.frombuffer(bytearray(base64.b64decode(spec["b64"])), dtype=torch.float32)
    else:
        x = torch.tensor(spec["data"], dtype=torch.float32)
    return x.reshape(spec["shape"]).to(device)


def run_job(req, device):
    if req.get("op") != "saxpy":
        raise web.HTTPBadRequest(text="only op saxpy is served here")
    a = float(req.get("params", {}).get("a", 1.0))
    x = to_tensor(req["inputs"]["x"], device)
    y = to_tensor(req["inputs"]["y"], device)
    out = a * x + y
    out = out if torch is None else out.cpu()
    job = {
        "id": uuid.uuid4().hex,
        "op": "saxpy",
        "state": "succeeded",
        "outputs": {
            "out": {"dtype": "f32", "shape": list(out.shape), "data": out.flatten().tolist()}
        },
    }
    jobs[job["id"]] = job
    return job


async def submit(request):
    body = await request.json()
    device = request.app["device"]
    if isinstance(body, list):
        return web.json_response([run_job(r, device) for r in body], status=201)
    return web.json_response(run_job(body, device), status=201)


async def wait(request):
    job = jobs.get(request.match_info["id"])
    if job is None:
        raise web.HTTPNotFound(text="no such job")
    return web.json_response(job)


async def healthz(request):
    return web.json_response({"status": "ok"})


async def serve(host, port, device):
    app = web.Application(client_max_size=1 << 30)
    app["device"] = device
    app.add_routes([
        web.post("/v1/jobs", submit),
        web.get("/v1/jobs/{id}/wait", wait),
        web.get("/healthz", healthz),
    ])
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"listening on http://{host}:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    if torch is None:
        print("compute: NumPy on the CPU (PyTorch is not installed)", flush=True)
    else:
        print(f"compute: PyTorch {torch.__version__} on {args.device}", flush=True)
        torch.zeros(1, device=args.device)  # CUDA's start-up cost is paid before the first job.
    asyncio.run(serve(args.host, args.port, args.device))


if __name__ == "__main__":
    main()
