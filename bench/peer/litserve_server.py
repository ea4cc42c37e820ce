#!/usr/bin/env python3
"""The LitServe peer of bench/e2e: saxpy served the way LitServe's documentation shows it, with
dynamic batching (batches of up to 64 requests gathered within 2 ms), 4 API server processes
and one inference worker computing each batch with PyTorch.

It takes gpujobd's POST /v1/jobs body for the op saxpy with its inputs as JSON numbers
("data"), and answers with the finished job in gpujobd's shape (outputs.out.data), so that the
same request body goes to every server. Query parameters such as ?wait= are ignored: every
answer comes once the job is done. LitServe answers 200 where gpujobd answers 201.

    litserve_server.py [--port 8082] [--device cuda:0] [--api-servers 4]
                       [--max-batch 64] [--batch-timeout 0.002]

Port 0 picks a free port. "listening on http://127.0.0.1:PORT" is printed once /health
answers, that is once the inference worker has run setup(). Without PyTorch (a machine for
checking the flow only) the batch is computed with NumPy on the CPU, and the first line printed
says so."""
import argparse
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

import litserve as ls

try:
    import torch
except ImportError:
    torch = None
import numpy


class SaxpyAPI(ls.LitAPI):
    def setup(self, device):
        self.device = device

    def decode_request(self, request):
        """LitServe passes the parsed JSON body as `request`: (a, x, y) as lists of numbers."""
        if request.get("op") != "saxpy":
            raise ValueError("only op saxpy is served here")
        inputs = request["inputs"]
        return (float(request.get("params", {}).get("a", 1.0)), inputs["x"]["data"],
                inputs["y"]["data"])

    def batch(self, inputs):
        """The batch as one column of a and two rows of x, y per request (equal lengths)."""
        a = [[item[0]] for item in inputs]
        x = [item[1] for item in inputs]
        y = [item[2] for item in inputs]
        if torch is None:
            return (numpy.asarray(a, numpy.float32), numpy.asarray(x, numpy.float32),
                    numpy.asarray(y, numpy.float32))
        return tuple(torch.tensor(v, dtype=torch.float32).to(self.device) for v in (a, x, y))

    def predict(self, batch):
        a, x, y = batch
        out = a * x + y
        return out if torch is None else out.cpu()

    def unbatch(self, output):
        return [row.tolist() for row in output]

    def encode_response(self, output):
        return {"id": uuid.uuid4().hex, "op": "saxpy", "state": "succeeded",
                "outputs": {"out": {"dtype": "f32", "shape": [len(output)], "data": output}}}


def free_port():
    """A port that nothing listens on now; LitServe refuses port 0 itself."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def announce_when_healthy(port, limit_s=150):
    """Prints the listening line once /health answers 200 (the workers are ready). When it
    answers 500 (the server runs, but a request cannot be served: a broken package), or stays
    unready for limit_s, says why and ends the process, which LitServe would not do itself."""
    url = f"http://127.0.0.1:{port}/health"
    why = f"/health did not answer 200 within {limit_s} s"
    for _ in range(limit_s * 10):
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    print(f"listening on http://127.0.0.1:{port}", flush=True)
                    return
        except urllib.error.HTTPError as e:
            if e.code == 500:
                why = "/health answered 500 (see the traceback above)"
                break
        except OSError:
            pass
        time.sleep(0.1)
    print(f"litserve_server: {why}", flush=True)
    os._exit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8082)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--api-servers", type=int, default=4)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--batch-timeout", type=float, default=0.002)
    args = parser.parse_args()
    on_gpu = args.device.startswith("cuda")
    if torch is None:
        print("compute: NumPy on the CPU (PyTorch is not installed)", flush=True)
        on_gpu = False
    else:
        print(f"compute: PyTorch {torch.__version__} on {'cuda' if on_gpu else 'cpu'}",
              flush=True)
    port = args.port or free_port()
    api = SaxpyAPI(max_batch_size=args.max_batch, batch_timeout=args.batch_timeout,
                   api_path="/v1/jobs")
    server = ls.LitServer(api, accelerator="cuda" if on_gpu else "cpu", devices=1,
                          workers_per_device=1, timeout=60)
    threading.Thread(target=announce_when_healthy, args=(port,), daemon=True).start()
    server.run(host="127.0.0.1", port=port, num_api_servers=args.api_servers,
               log_level="warning", generate_client_file=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
