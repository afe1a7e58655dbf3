#!/usr/bin/env python3
"""A multi-turn conversation against a running `osprey serve`, as token ids over /v1/completions.

Turn k's prompt is turn k-1's prompt, its reply (the reply's token ids, read back from the
streamed logprobs' pieces through the byte-level BPE vocabulary of --tokenizer) and a new user
message of random ids. Prints per turn: prompt tokens, cached tokens
(usage.prompt_tokens_details.cached_tokens), time to first token (ms: the first streamed chunk
that carries a token) and the whole request's time. Greedy, ignore_eos, so each reply has
exactly --reply tokens. Standard library only.

  osprey serve -m MODEL -np 1 --port 8080 &
  tools/multiturn_chat_bench.py --port 8080 --turns 3 --user 600 --reply 100 --tokenizer MODEL/tokenizer.json
"""
import argparse
import json
import random
import time
import urllib.request


def byte_pieces(tokenizer_path):
    """Each vocabulary entry of a byte-level BPE tokenizer.json as the bytes it decodes to -> id."""
    tok = json.load(open(tokenizer_path))
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    dec = {chr(c): b for b, c in zip(bs, cs)}
    by_piece = {}
    for piece, i in tok["model"]["vocab"].items():
        if all(ch in dec for ch in piece):
            by_piece.setdefault(bytes(dec[ch] for ch in piece), i)
    for a in tok.get("added_tokens", []):
        by_piece.setdefault(a["content"].encode(), a["id"])
    return by_piece, len(tok["model"]["vocab"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--user", type=int, default=300, help="tokens of each new user message")
    ap.add_argument("--reply", type=int, default=100, help="tokens of each reply")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer", required=True, help="the served model's tokenizer.json (byte-level BPE)")
    args = ap.parse_args()
    by_piece, vocab = byte_pieces(args.tokenizer)
    rng = random.Random(args.seed)
    prompt = [0]
    for k in range(args.turns):
        prompt = prompt + [rng.randrange(2, vocab) for _ in range(args.user)]
        body = {"prompt": prompt, "max_tokens": args.reply, "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}, "logprobs": 0}
        req = urllib.request.Request(f"http://127.0.0.1:{args.port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        ttft, pieces, cached = None, [], None
        for line in urllib.request.urlopen(req, timeout=600):
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            choices = d.get("choices") or []
            if choices and choices[0].get("logprobs"):
                if ttft is None:
                    ttft = (time.perf_counter() - t0) * 1000
                pieces += choices[0]["logprobs"]["tokens"]
            if d.get("usage"):
                cached = d["usage"].get("prompt_tokens_details", {}).get("cached_tokens")
        total = (time.perf_counter() - t0) * 1000
        ids = [by_piece.get(p.encode("utf-8", "surrogateescape")) for p in pieces]
        unmapped = sum(i is None for i in ids)
        print(f"turn {k + 1} prompt {len(prompt)} cached {cached} ttft_ms {ttft:.1f} total_ms {total:.1f} "
              f"reply {len(ids)} unmapped {unmapped}", flush=True)
        # An unmapped piece breaks the repeated conversation there (the next turn's reuse shows it).
        prompt = prompt + [i if i is not None else 2 for i in ids]


if __name__ == "__main__":
    main()
