#!/usr/bin/env python3
"""Serving benchmark for `osprey serve` (or any OpenAI-compatible completions server).

For each concurrency level c it runs c client threads that send streaming /v1/completions
requests back to back until the level's fixed number of requests has been sent, and measures
per request the time to first token (TTFT), the gaps between streamed chunks (ITL), the time
per output token after the first (TPOT), the end-to-end latency and the token counts; per
level it reports percentiles and throughput. Replies are forced to their full length with
`ignore_eos`, so every level does the same work.

Standard library only (threads + http.client). Every request is bounded by --timeout; errors
are counted and reported, never fatal.

    build/osprey serve -m MODEL -np 16 --port 8080 &
    scripts/bench_serving.py --concurrency 1,4,16 --out results.json --plot plots/
"""
from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

# Words for text prompts (--prompt-format text): common English words, mostly one token each.
WORDS = (
    "the of and to in is was that for it with as his on be at by had not are but from or have "
    "an they which one you were her all she there would their we him been has when who will more "
    "no if out so said what up its about into than them can only other new some could time these "
    "two may then do first any my now such like our over man me even most made after also did many "
    "before must through back years where much your way well down should because each just those "
    "people how too little state good very make world still own see men work long get here between "
    "both life being under never day same another know while last might us great old year off come "
    "since against go came right used take three house"
).split()


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""               # a short kind: "http 503", "timeout", "connection", ...
    detail: str = ""              # the first part of the message, for the report
    ttft: float = math.nan        # seconds from send to the first chunk with text
    e2e: float = math.nan         # seconds from send to [DONE]
    itl: list = field(default_factory=list)  # seconds between consecutive text chunks
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str = ""


class Target:
    """Where the server is and how to talk to it."""

    def __init__(self, url: str, api_key: str):
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", ""):
            raise SystemExit(f"--url: only http:// is supported, not {u.scheme}://")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 80
        self.base = u.path.rstrip("/")
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get_json(self, path: str, timeout: float = 10.0):
        conn = self.connect(timeout)
        try:
            conn.request("GET", self.base + path, headers=self.headers)
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError(f"GET {path}: HTTP {r.status}: {body[:200]!r}")
            return json.loads(body)
        finally:
            conn.close()

    def get_text(self, path: str, timeout: float = 10.0) -> str:
        """The body of a GET, or "" when it fails (the caller only reads what it can)."""
        conn = self.connect(timeout)
        try:
            conn.request("GET", self.base + path, headers=self.headers)
            r = conn.getresponse()
            body = r.read()
            return body.decode("utf-8", "replace") if r.status == 200 else ""
        except (OSError, http.client.HTTPException):
            return ""
        finally:
            conn.close()


def percentile(xs: list, q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation (numpy's default); NaN if empty."""
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def stream_completion(target: Target, body: dict, timeout: float) -> RequestResult:
    """Sends one streaming completion and reads it to [DONE]; never raises, never blocks
    past `timeout` seconds (each socket operation gets the time that is left)."""
    res = RequestResult()
    payload = json.dumps(body).encode()
    t0 = time.perf_counter()
    deadline = t0 + timeout
    conn = None
    last_chunk = None
    done = False

    def fail(kind: str, detail: str = "") -> RequestResult:
        res.ok = False
        res.error = kind
        res.detail = detail[:300]
        return res

    try:
        conn = target.connect(timeout)
        conn.request("POST", target.base + "/v1/completions", body=payload, headers=target.headers)
        if conn.sock is not None:
            conn.sock.settimeout(max(deadline - time.perf_counter(), 0.001))
        resp = conn.getresponse()
        if resp.status != 200:
            text = resp.read(4096).decode("utf-8", "replace")
            return fail(f"http {resp.status}", text)
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                return fail("timeout", f"no [DONE] within --timeout {timeout:g} s")
            if conn.sock is not None:
                conn.sock.settimeout(left)
            line = resp.readline()
            if not line:
                break  # the server closed the stream
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            now = time.perf_counter()
            try:
                event = json.loads(data)
            except ValueError:
                return fail("malformed event", data.decode("utf-8", "replace"))
            if "error" in event:
                err = event["error"]
                msg = err.get("message", str(err)) if isinstance(err, dict) else str(err)
                return fail("stream error", msg)
            usage = event.get("usage")
            if usage:
                res.prompt_tokens = int(usage.get("prompt_tokens", 0))
                res.completion_tokens = int(usage.get("completion_tokens", 0))
                details = usage.get("prompt_tokens_details") or {}
                res.cached_tokens = int(details.get("cached_tokens") or 0)
            for choice in event.get("choices") or []:
                if choice.get("finish_reason"):
                    res.finish_reason = choice["finish_reason"]
                if not choice.get("text"):
                    continue  # the closing chunk, or a token still held back as partial text
                if last_chunk is None:
                    res.ttft = now - t0
                else:
                    res.itl.append(now - last_chunk)
                last_chunk = now
        if not done:
            return fail("truncated", "the stream ended without [DONE]")
        res.e2e = time.perf_counter() - t0
        res.ok = True
        return res
    except (socket.timeout, TimeoutError):
        return fail("timeout", f"no reply within --timeout {timeout:g} s")
    except (ConnectionError, OSError, http.client.HTTPException) as e:
        return fail("connection", f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001: a benchmark counts every failure and goes on
        return fail("client", f"{type(e).__name__}: {e}")
    finally:
        if conn is not None:
            conn.close()


class PromptMaker:
    """Prompts of about --prompt-tokens tokens, unique per request after a common prefix of
    --shared-prefix-tokens, as token ids (exact lengths) or as text (about one token a word)."""

    def __init__(self, args, vocab_size: int):
        self.fmt = args.prompt_format
        self.n_tokens = args.prompt_tokens
        self.n_shared = min(args.shared_prefix_tokens, args.prompt_tokens)
        self.rng = random.Random(args.seed)
        # Ids from the middle of the vocabulary stay clear of the special tokens that most
        # tokenizers put first or last.
        self.lo = min(vocab_size // 16, 1000) if vocab_size > 64 else 0
        self.hi = max(self.lo + 1, vocab_size - vocab_size // 16)
        self.prefix = self._piece(self.n_shared)

    def _piece(self, n: int):
        if self.fmt == "ids":
            return [self.rng.randrange(self.lo, self.hi) for _ in range(n)]
        return [self.rng.choice(WORDS) for _ in range(n)]

    def make(self):
        tokens = self.prefix + self._piece(self.n_tokens - self.n_shared)
        return tokens if self.fmt == "ids" else " ".join(tokens)


def sampling_fields(args, mode: str) -> dict:
    """The request's sampling fields for a mode: greedy (temperature 0) or sampled."""
    if mode == "greedy":
        return {"temperature": 0.0}
    return {"temperature": args.temperature, "top_p": args.top_p}


def run_level(target: Target, args, model: str, prompts: PromptMaker, concurrency: int, n_requests: int,
              stop: threading.Event, mode: str = "sampled") -> dict:
    bodies = []
    for _ in range(n_requests):
        body = {
            "prompt": prompts.make(),
            "max_tokens": args.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        body.update(sampling_fields(args, mode))
        if model:
            body["model"] = model
        if args.ignore_eos:
            body["ignore_eos"] = True
        bodies.append(body)

    results: list = [None] * n_requests
    next_index = [0]
    lock = threading.Lock()

    def client():
        while not stop.is_set():
            with lock:
                i = next_index[0]
                if i >= n_requests:
                    return
                next_index[0] += 1
            results[i] = stream_completion(target, bodies[i], args.timeout)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    # Each request is bounded by --timeout, so the clients end; the join bound is a backstop.
    bound = time.monotonic() + args.timeout * (n_requests // max(concurrency, 1) + 2)
    for t in threads:
        while t.is_alive() and time.monotonic() < bound:
            t.join(0.5)
    duration = time.perf_counter() - t0
    return {"mode": mode, **summarize(args, concurrency, [r for r in results if r is not None], n_requests, duration)}


def summarize(args, concurrency: int, results: list, n_requests: int, duration: float) -> dict:
    ok = [r for r in results if r.ok]
    errors: dict = {}
    examples: dict = {}
    for r in results:
        if not r.ok:
            errors[r.error] = errors.get(r.error, 0) + 1
            examples.setdefault(r.error, r.detail)
    not_run = n_requests - len(results)
    if not_run:
        errors["not run"] = not_run
    ttft = [r.ttft for r in ok if not math.isnan(r.ttft)]
    itl = [x for r in ok for x in r.itl]
    tpot = [(r.e2e - r.ttft) / (r.completion_tokens - 1) for r in ok
            if r.completion_tokens > 1 and not math.isnan(r.ttft)]
    e2e = [r.e2e for r in ok]
    out_tokens = sum(r.completion_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    # With ignore_eos every reply should be max_tokens long (fewer when the context ends it).
    short = sum(1 for r in ok if r.completion_tokens < args.max_tokens)

    def stats(xs):
        return {"mean": sum(xs) / len(xs) if xs else math.nan, "p50": percentile(xs, 50),
                "p95": percentile(xs, 95), "p99": percentile(xs, 99), "max": max(xs) if xs else math.nan}

    return {
        "concurrency": concurrency,
        "requests": n_requests,
        "completed": len(ok),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "error_examples": examples,
        "short_replies": short,
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_token_throughput": out_tokens / duration if duration > 0 else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration > 0 else 0.0,
        "prompt_tokens": in_tokens,
        "completion_tokens": out_tokens,
        "cached_prompt_tokens": sum(r.cached_tokens for r in ok),
        "ttft_s": stats(ttft),
        "itl_s": stats(itl),
        "tpot_s": stats(tpot),
        "e2e_s": stats(e2e),
        "raw": {
            "ttft_s": ttft,
            "e2e_s": e2e,
            "completion_tokens": [r.completion_tokens for r in ok],
            "itl_s": [r.itl for r in ok],
        },
    }


def ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1000:.1f}"


def markdown(levels: list) -> str:
    head = ("| mode | conc | reqs | ok | err | req/s | out tok/s | total tok/s | TTFT p50 / p95 / p99 ms "
            "| ITL p50 / p95 / p99 ms | TPOT p50 ms | E2E p50 ms |")
    rows = [head, "|" + " --- |" * 12]
    for lv in levels:
        t, i = lv["ttft_s"], lv["itl_s"]
        rows.append(
            f"| {lv.get('mode', '-')} | {lv['concurrency']} | {lv['requests']} | {lv['completed']} | {lv['errors']} "
            f"| {lv['request_throughput']:.2f} | {lv['output_token_throughput']:.1f} "
            f"| {lv['total_token_throughput']:.1f} "
            f"| {ms(t['p50'])} / {ms(t['p95'])} / {ms(t['p99'])} "
            f"| {ms(i['p50'])} / {ms(i['p95'])} / {ms(i['p99'])} "
            f"| {ms(lv['tpot_s']['p50'])} | {ms(lv['e2e_s']['p50'])} |")
    return "\n".join(rows)


def write_plot(directory: str, levels: list, title: str) -> None:
    os.makedirs(directory, exist_ok=True)
    dat = os.path.join(directory, "bench_serving.dat")
    with open(dat, "w") as f:
        f.write("# concurrency req_per_s out_tok_per_s total_tok_per_s ttft_p50_ms ttft_p99_ms "
                "itl_p50_ms itl_p99_ms tpot_p50_ms e2e_p50_ms errors\n")
        for lv in levels:
            vals = [lv["ttft_s"]["p50"], lv["ttft_s"]["p99"], lv["itl_s"]["p50"], lv["itl_s"]["p99"],
                    lv["tpot_s"]["p50"], lv["e2e_s"]["p50"]]
            cols = [f"{v * 1000:.3f}" if not math.isnan(v) else "NaN" for v in vals]
            f.write(f"{lv['concurrency']} {lv['request_throughput']:.4f} {lv['output_token_throughput']:.3f} "
                    f"{lv['total_token_throughput']:.3f} {' '.join(cols)} {lv['errors']}\n")
    gp = os.path.join(directory, "bench_serving.gp")
    safe_title = title.replace('"', "'")
    with open(gp, "w") as f:
        f.write(f"""# gnuplot {os.path.basename(gp)} (run in this folder) draws bench_serving.png
set terminal pngcairo size 1400,450 noenhanced
set output "bench_serving.png"
set multiplot layout 1,3 title "{safe_title}"
set logscale x 2
set xlabel "concurrent clients"
set grid
set key top left
set title "throughput"
set ylabel "output tokens/s"
plot "bench_serving.dat" using 1:3 with linespoints title "output tok/s"
set title "time to first token"
set ylabel "ms"
plot "bench_serving.dat" using 1:5 with linespoints title "p50", "" using 1:6 with linespoints title "p99"
set title "inter-token latency"
set ylabel "ms"
plot "bench_serving.dat" using 1:7 with linespoints title "p50", "" using 1:8 with linespoints title "p99"
unset multiplot
""")
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        print(f"wrote {gp} and {dat} (gnuplot is not installed: no PNG)", file=sys.stderr)
        return
    try:
        p = subprocess.run([gnuplot, os.path.basename(gp)], cwd=directory, capture_output=True, text=True,
                           timeout=60)
        if p.returncode != 0:
            print(f"gnuplot failed ({p.returncode}): {p.stderr.strip()[:500]}", file=sys.stderr)
        else:
            print(f"wrote {os.path.join(directory, 'bench_serving.png')}", file=sys.stderr)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"gnuplot failed: {e}", file=sys.stderr)


def positive_ints(text: str) -> list:
    try:
        xs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, not {text!r}")
    if not xs or any(x < 1 for x in xs):
        raise argparse.ArgumentTypeError(f"every concurrency must be >= 1: {text!r}")
    return xs


def wait_ready(target: Target, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    last = ""
    while True:
        try:
            conn = target.connect(5)
            conn.request("GET", target.base + "/health", headers=target.headers)
            r = conn.getresponse()
            r.read()
            conn.close()
            if r.status == 200:
                return
            last = f"HTTP {r.status}"
        except OSError as e:
            last = str(e)
        if time.monotonic() >= deadline:
            raise SystemExit(f"the server at {target.host}:{target.port} is not ready after {seconds:g} s ({last})")
        time.sleep(0.5)


def server_metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                return math.nan
    return math.nan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="the server's base URL (default: %(default)s)")
    ap.add_argument("--api-key", default="", help="bearer token, if the server wants one")
    ap.add_argument("--model", default="", help="the model id to send (default: the server's first, from /v1/models)")
    ap.add_argument("--concurrency", type=positive_ints, default="1,4,16,64",
                    help="comma-separated numbers of concurrent clients, one level each (default: %(default)s)")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (0: max(4 x concurrency, 16))")
    ap.add_argument("--prompt-tokens", type=int, default=512, help="prompt length in tokens (default: %(default)s)")
    ap.add_argument("--shared-prefix-tokens", type=int, default=0,
                    help="leading prompt tokens that every request shares (to exercise prefix caching)")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens generated per request (default: %(default)s)")
    ap.add_argument("--prompt-format", choices=["ids", "text"], default="ids",
                    help="token-id prompts (exact lengths; the default) or text prompts (about one token a word)")
    ap.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                    help="let replies end at an end-of-sequence token (default: run to --max-tokens)")
    ap.add_argument("--modes", default="sampled,greedy",
                    help="comma-separated request kinds, each level run once per kind: sampled "
                         "(--temperature, --top-p) and greedy (temperature 0) (default: %(default)s)")
    ap.add_argument("--temperature", type=float, default=0.8,
                    help="temperature of the sampled requests (default: %(default)s)")
    ap.add_argument("--top-p", type=float, default=0.95, help="top_p of the sampled requests (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=1, help="requests sent (and not measured) before the first level (default: %(default)s)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one request may take, end to end (default: %(default)s)")
    ap.add_argument("--wait-ready", type=float, default=60.0, help="seconds to wait for GET /health to answer 200 (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompt generator (default: %(default)s)")
    ap.add_argument("--out", default="", help="write the per-level numbers (and raw samples) here as JSON")
    ap.add_argument("--plot", default="", metavar="DIR",
                    help="write a gnuplot script and its data here (and the PNG, when gnuplot is installed)")
    args = ap.parse_args()
    for name in ("prompt_tokens", "max_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.shared_prefix_tokens < 0 or args.requests < 0 or args.warmup < 0:
        ap.error("--shared-prefix-tokens, --requests and --warmup must be >= 0")
    if args.timeout <= 0:
        ap.error("--timeout must be > 0")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m not in ("sampled", "greedy") for m in args.modes):
        ap.error("--modes: a comma-separated list of sampled and greedy")
    if not (0 < args.top_p <= 1) or args.temperature < 0:
        ap.error("--top-p must be in (0, 1] and --temperature >= 0")

    target = Target(args.url, args.api_key)
    wait_ready(target, args.wait_ready)
    model = args.model
    vocab_size = 32000
    try:
        models = target.get_json("/v1/models")
        first = (models.get("data") or [{}])[0]
        model = model or first.get("id", "")
        vocab_size = int((first.get("meta") or {}).get("n_vocab") or vocab_size)
        n_ctx = (first.get("meta") or {}).get("n_ctx")
        if n_ctx and args.prompt_tokens + args.max_tokens > int(n_ctx):
            print(f"warning: prompt {args.prompt_tokens} + max_tokens {args.max_tokens} exceed the server's "
                  f"context of {n_ctx} tokens: requests will fail or replies will be short", file=sys.stderr)
    except (OSError, RuntimeError, ValueError, http.client.HTTPException) as e:
        print(f"warning: GET /v1/models failed ({e}); assuming a vocabulary of {vocab_size}", file=sys.stderr)
    prompts = PromptMaker(args, vocab_size)

    stop = threading.Event()
    config = {k: v for k, v in vars(args).items() if k != "api_key"}
    report = {"config": config, "model": model, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "levels": []}
    try:
        if args.warmup:
            warm = run_level(target, args, model, prompts, 1, args.warmup, stop)
            if warm["errors"]:
                print(f"warning: warm-up: {warm['errors']} of {args.warmup} failed: {warm['error_examples']}",
                      file=sys.stderr)
        for c, mode in [(c, m) for c in args.concurrency for m in args.modes]:
            n = args.requests or max(4 * c, 16)
            print(f"level: {c} clients, {n} {mode} requests ...", file=sys.stderr, flush=True)
            metrics_before = target.get_text("/metrics")
            level = run_level(target, args, model, prompts, c, n, stop, mode)
            metrics_after = target.get_text("/metrics")
            hits = (server_metric(metrics_after, "osprey:prompt_cache_hits_total")
                    - server_metric(metrics_before, "osprey:prompt_cache_hits_total"))
            level["server_prompt_cache_hits"] = None if math.isnan(hits) else hits
            report["levels"].append(level)
            print(f"  {level['completed']}/{n} ok, {level['errors']} errors, {level['duration_s']:.1f} s, "
                  f"{level['output_token_throughput']:.1f} output tok/s", file=sys.stderr, flush=True)
            for kind, detail in level["error_examples"].items():
                print(f"  error {kind} x{level['error_kinds'][kind]}: {detail}", file=sys.stderr)
            if level["short_replies"] and args.ignore_eos:
                print(f"  warning: {level['short_replies']} replies were shorter than --max-tokens "
                      "(does the server honour ignore_eos?)", file=sys.stderr)
    except KeyboardInterrupt:
        stop.set()
        print("interrupted: reporting the levels that finished", file=sys.stderr)

    print(f"\nmodel {model}, prompt {args.prompt_tokens} tokens ({args.shared_prefix_tokens} shared), "
          f"{args.max_tokens} generated per request\n")
    print(markdown(report["levels"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1, allow_nan=False, default=str,
                      cls=_NanToNull)
        print(f"\nwrote {args.out}", file=sys.stderr)
    if args.plot and report["levels"]:
        write_plot(args.plot, report["levels"],
                   f"{model}: prompt {args.prompt_tokens}, generate {args.max_tokens}")
    return 0 if all(lv["errors"] == 0 for lv in report["levels"]) else 1


class _NanToNull(json.JSONEncoder):
    """JSON has no NaN: an empty statistic is written as null."""

    def iterencode(self, o, _one_shot=False):
        return super().iterencode(_nan_to_none(o), _one_shot)


def _nan_to_none(o):
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    if isinstance(o, dict):
        return {k: _nan_to_none(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_nan_to_none(v) for v in o]
    return o


if __name__ == "__main__":
    sys.exit(main())
