#!/usr/bin/env python3
"""Replays n-gram drafting and DraftPacer's rule (serve/speculative.h) over greedy replies.

A greedy reply fixes every prompt-lookup draft and its acceptance (a draft is accepted up to its
first token that differs from the reply), so a drafting policy can be replayed exactly from the
reply's tokens. Each FILE is the output of `osprey generate --json` (its `prompt_tokens` and
`tokens`; for a server's prompt, give generate the token ids its /tokenize returns). Prints, per
policy, the drafted and accepted tokens, the stops and the cost in one-row steps for a verify
cost c(k) = 1 + r k (docs/benchmark_results/2026-12-07-cpu-spec-policy.md).

    tools/spec_policy_replay.py FILE... [--r 0.15,0.2,0.25] [--windows 16,32] [--thresholds 0.25]
"""
import argparse, json


def ngram_draft(toks, nmin, nmax, k):
    # serve/speculative.cpp's ngram_draft: the most recent earlier match of the longest n-gram,
    # continued as a copy with overlap.
    n_tok = len(toks)
    for n in range(min(nmax, n_tok - 1), nmin - 1, -1):
        tail = toks[n_tok - n:]
        for i in range(n_tok - n - 1, -1, -1):
            if toks[i:i + n] == tail:
                d = []
                for j in range(k):
                    src = i + n + j
                    d.append(toks[src] if src < n_tok else d[src - n_tok])
                return d
    return []


class Pacer:  # DraftPacer
    def __init__(self, threshold, window, backoff=16, max_backoff=512):
        self.threshold, self.window, self.b0, self.bmax = threshold, window, backoff, max_backoff
        self.drafted = self.accepted = self.left = self.stops = 0
        self.backoff = backoff

    def drafts(self):
        if self.left == 0:
            return True
        self.left -= 1
        return False

    def verified(self, drafted, accepted):
        self.drafted += drafted
        self.accepted += accepted
        if self.drafted < self.window:
            return
        if self.accepted < self.threshold * self.drafted:
            self.left, self.backoff = self.backoff, min(2 * self.backoff, self.bmax)
            self.stops += 1
        else:
            self.backoff = self.b0
        self.drafted = self.accepted = 0


def replay(prompt, reply, pacer, r, draft_max=8, ngram=(1, 3)):
    toks, g, n = list(prompt) + [reply[0]], 1, len(reply)
    steps = verifies = drafted = accepted = 0
    while g < n:
        steps += 1
        k = min(draft_max, n - g - 1)
        d = ngram_draft(toks, ngram[0], ngram[1], k) if (pacer is None or pacer.drafts()) and k >= 1 else []
        if not d:
            toks.append(reply[g])
            g += 1
            continue
        a = 0
        while a < len(d) and d[a] == reply[g + a]:
            a += 1
        toks += reply[g:g + a + 1]
        g += a + 1
        verifies, drafted, accepted = verifies + 1, drafted + len(d), accepted + a
        if pacer:
            pacer.verified(len(d), a)
    return dict(drafted=drafted, accepted=accepted, stops=pacer.stops if pacer else 0,
                cost=steps + r * drafted)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--r", default="0.15,0.2,0.25")
    ap.add_argument("--windows", default="16,32")
    ap.add_argument("--thresholds", default="0.15,0.2,0.25")
    a = ap.parse_args()
    runs = [json.load(open(f)) for f in a.files]
    for r in map(float, a.r.split(",")):
        res = [replay(j["prompt_tokens"], j["tokens"], None, r) for j in runs]
        print(f"r={r} always: cost {sum(x['cost'] for x in res):.1f}",
              [(x["drafted"], x["accepted"]) for x in res])
        for w in map(int, a.windows.split(",")):
            for t in map(float, a.thresholds.split(",")):
                res = [replay(j["prompt_tokens"], j["tokens"], Pacer(t, w), r) for j in runs]
                print(f"  window {w} threshold {t}: cost {sum(x['cost'] for x in res):.1f}",
                      [(x["drafted"], x["accepted"], x["stops"]) for x in res])


if __name__ == "__main__":
    main()
