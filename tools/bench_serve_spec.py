#!/usr/bin/env python3
"""Speculative decoding through `osprey serve`: plain and --spec-ngram, paged and dense layouts.

Each round starts one server per arm (the arms' order reversed every other round), posts
`--requests` greedy completions of `--tokens` tokens at once (ignore_eos) with the quoting prompt
of docs/benchmark_results/2026-12-07-cpu-speculative-prompt.txt (request i > 0 of a concurrent
run prefixed with "[i] "), and records the decode rate of /metrics (generation tokens over the
seconds spent in decode steps), the aggregate rate (tokens over the wall time of the batch), the
server's CPU seconds per token (/proc, user + system), the drafts, and a hash of the replies.
Prints every run, then per arm the median, minimum and maximum.

    tools/bench_serve_spec.py [--rounds 9] [--requests 1] [--tokens 384] [--model models/demo]
        [--layouts paged,dense] [--binary LABEL=PATH ...]

--binary (repeatable) compares builds: every layout and drafting arm runs for each binary
(default: build/osprey), in the same interleaved rounds (PATH may be followed by serve flags for
that arm, space-separated: "nolimit=build/osprey --spec-max-batch 0"); /metrics' drafting stops and paused
steps are recorded where the binary reports them.
"""
import argparse, hashlib, json, os, statistics, subprocess, threading, time, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--requests", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=384)
    ap.add_argument("--model", default=os.path.join(ROOT, "models/demo"))
    ap.add_argument("--port", type=int, default=18931)
    ap.add_argument("--layouts", default="paged,dense")
    ap.add_argument("--binary", action="append", default=[])
    a = ap.parse_args()
    binaries = [b.split("=", 1) for b in a.binary] or [["build", os.path.join(ROOT, "build/osprey")]]
    ARMS = [(label, path, layout, spec) for label, path in binaries for layout in a.layouts.split(",")
            for spec in (False, True)]
    prompt = open(os.path.join(ROOT, "docs/benchmark_results/2026-12-07-cpu-speculative-prompt.txt")).read()
    base = f"http://127.0.0.1:{a.port}"

    def get(path):
        return urllib.request.urlopen(base + path, timeout=60).read().decode()

    def metric(text, name):
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0

    res = {arm: [] for arm in ARMS}
    for r in range(a.rounds):
        for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
            label, binary, layout, spec = arm
            cmd = binary.split()[:1] + ["serve"] + binary.split()[1:] + ["-m", a.model, "--port", str(a.port), "-t", "2",
                   "-np", str(a.requests), "--kv-layout", layout] + (["--spec-ngram"] if spec else [])
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                for _ in range(300):
                    try:
                        if json.loads(get("/health")).get("status") == "ok":
                            break
                    except Exception:
                        pass
                    time.sleep(0.1)

                def cpu():
                    f = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
                    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

                outs = [None] * a.requests

                def one(i):
                    text = prompt if i == 0 else f"[{i}] " + prompt
                    body = json.dumps({"prompt": text, "max_tokens": a.tokens, "temperature": 0, "ignore_eos": True})
                    req = urllib.request.Request(base + "/v1/completions", data=body.encode(),
                                                 headers={"Content-Type": "application/json"})
                    outs[i] = json.loads(urllib.request.urlopen(req, timeout=600).read())

                c0, t0 = cpu(), time.time()
                threads = [threading.Thread(target=one, args=(i,)) for i in range(a.requests)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                wall, cpus = time.time() - t0, cpu() - c0
                m = get("/metrics")
                toks = metric(m, "osprey:generation_tokens_total")
                rec = dict(rate=toks / metric(m, "osprey:generation_seconds_total"), agg=toks / wall,
                           cpu_ms_per_tok=1000 * cpus / toks, drafted=metric(m, "osprey:spec_drafted_tokens_total"),
                           accepted=metric(m, "osprey:spec_accepted_tokens_total"),
                           stops=metric(m, "osprey:spec_draft_stops_total"),
                           paused=metric(m, "osprey:spec_paused_steps_total"),
                           hash=hashlib.sha1("".join(o["choices"][0]["text"] for o in outs).encode()).hexdigest()[:10],
                           load=os.getloadavg()[0])
                res[arm].append(rec)
                print(label, layout, "spec" if spec else "plain", rec, flush=True)
            finally:
                p.terminate()
                p.wait()
    for arm in ARMS:
        runs = res[arm]
        print(arm[0], arm[2], "spec" if arm[3] else "plain",
              f"drafted {runs[0]['drafted']:.0f} accepted {runs[0]['accepted']:.0f}",
              f"stops {runs[0]['stops']:.0f} paused steps {runs[0]['paused']:.0f}",
              "hashes", sorted({x["hash"] for x in runs}))
        for key in ("rate", "agg", "cpu_ms_per_tok", "load"):
            v = [x[key] for x in runs]
            print(f"  {key}: median {statistics.median(v):.3f} min {min(v):.3f} max {max(v):.3f}",
                  [round(x, 2) for x in v])


if __name__ == "__main__":
    main()
