#!/usr/bin/env python3
"""Prepares the training text of the demo model (models/demo) from a Debian package.

Source: the Debian package r-cran-janeaustenr (Jane Austen's six completed novels, as
Project Gutenberg transcribed them; the texts are in the public domain, the package is
MIT-licensed). The novels are stored as R character vectors (one element per printed
line) in the package's lazy-load database data/Rdata.rdb; this script reads that database
with a small reader of R's serialization format (no R needed).

Output, under OUT (default .demo_data/text):
  train.txt   the training text: one paragraph per line, UTF-8
  val.txt     held out for choosing among training runs: ~1% of each novel's paragraphs,
              just before the test part
  test.txt    held out for the reported perplexity: the last ~2% of each novel's paragraphs
  meta.json   package, version, license, sha256 of the .deb, per-novel counts

Usage (on a Debian machine, from the repository root):
  python3 tools/demo_data.py [--out .demo_data/text] [--deb PATH] [--val 0.01] [--test 0.02]
Without --deb, the package is fetched with `apt-get download` into OUT/../deb.
"""

import argparse
import gzip
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import zlib

PACKAGE = "r-cran-janeaustenr"
DATA_DIR = "usr/lib/R/site-library/janeaustenr/data"
COPYRIGHT = "usr/share/doc/r-cran-janeaustenr/copyright"
NOVELS = [
    ("sensesensibility", "Sense and Sensibility"),
    ("prideprejudice", "Pride and Prejudice"),
    ("mansfieldpark", "Mansfield Park"),
    ("emma", "Emma"),
    ("northangerabbey", "Northanger Abbey"),
    ("persuasion", "Persuasion"),
]


# ---------------------------------------------------------------------------------------
class RVector(list):
    """A vector with attributes (attrs: {name: value}, e.g. "names")."""
    attrs = {}

    def named(self):
        return dict(zip(self.attrs.get("names", []), self))


# A reader of R's serialization format (XDR, versions 2 and 3), for the types that data
# objects use. Values come back as Python objects: STRSXP -> list of str (None for NA),
# INTSXP/LGLSXP -> list of int, REALSXP -> list of float, VECSXP -> list, pairlists ->
# list of (tag, value), SYMSXP -> ("sym", name).
class RReader:
    NILVALUE, EMPTYENV, BASEENV, GLOBALENV, UNBOUNDVALUE, MISSINGARG, BASENAMESPACE = (
        254, 242, 241, 253, 252, 251, 250)
    REFSXP, PERSISTSXP, ALTREP = 255, 247, 238
    ATTRLISTSXP, ATTRLANGSXP = 239, 240

    def __init__(self, data):
        self.d = data
        self.p = 0
        self.refs = []

    def int(self):
        v = struct.unpack_from(">i", self.d, self.p)[0]
        self.p += 4
        return v

    def length(self):
        n = self.int()
        if n == -1:
            hi, lo = self.int(), self.int()
            n = (hi << 32) + lo
        return n

    def header(self):
        if self.d[:2] != b"X\n":
            raise ValueError("not an XDR R serialization (header %r)" % self.d[:2])
        self.p = 2
        version = self.int()
        self.int()  # writer's R version
        self.int()  # minimal reader version
        if version == 3:
            n = self.int()
            self.p += n  # native encoding name
        elif version != 2:
            raise ValueError("unsupported serialization version %d" % version)

    def item(self):
        flags = self.int()
        t = flags & 0xFF
        has_attr = bool(flags & (1 << 9))
        has_tag = bool(flags & (1 << 10))
        if t in (self.NILVALUE, self.EMPTYENV, self.BASEENV, self.GLOBALENV, self.UNBOUNDVALUE,
                 self.MISSINGARG, self.BASENAMESPACE):
            return None
        if t == self.REFSXP:
            idx = flags >> 8
            if idx == 0:
                idx = self.int()
            return self.refs[idx - 1]
        if t == 1:  # SYMSXP
            name = self.item()
            sym = ("sym", name)
            self.refs.append(sym)
            return sym
        if t in (2, 6, self.ATTRLISTSXP, self.ATTRLANGSXP, 17):  # pairlist-like
            out = []
            while True:
                if has_attr:
                    self.item()  # the cell's attributes
                tag = self.item() if has_tag else None
                out.append((tag[1] if isinstance(tag, tuple) else tag, self.item()))
                flags = self.int()
                t = flags & 0xFF
                if t == self.NILVALUE:
                    return out
                if t not in (2, 6, self.ATTRLISTSXP, self.ATTRLANGSXP, 17):
                    self.p -= 4
                    out.append((None, self.item()))
                    return out
                has_attr = bool(flags & (1 << 9))
                has_tag = bool(flags & (1 << 10))
        if t == 9:  # CHARSXP
            n = self.int()
            if n == -1:
                return None
            s = self.d[self.p:self.p + n]
            self.p += n
            levels = flags >> 12
            return s.decode("latin-1" if levels & (1 << 2) else "utf-8")
        if t in (10, 13):  # LGLSXP, INTSXP
            n = self.length()
            v = list(struct.unpack_from(">%di" % n, self.d, self.p))
            self.p += 4 * n
        elif t == 14:  # REALSXP
            n = self.length()
            v = list(struct.unpack_from(">%dd" % n, self.d, self.p))
            self.p += 8 * n
        elif t in (16, 19, 20):  # STRSXP, VECSXP, EXPRSXP
            n = self.length()
            v = [self.item() for _ in range(n)]
        elif t == self.ALTREP:
            info = self.item()
            state = self.item()
            self.item()  # attributes
            return ("altrep", info, state)
        else:
            raise ValueError("unsupported R type %d at byte %d" % (t, self.p))
        if has_attr:
            v = RVector(v)
            v.attrs = dict(self.item())
        return v


def unserialize(data):
    r = RReader(data)
    r.header()
    return r.item()


def lazyload(rdx_path, rdb_path):
    """Returns {name: value} for the objects of an R lazy-load database."""
    index = unserialize(gzip.open(rdx_path).read())
    variables = index.named()["variables"].named()
    with open(rdb_path, "rb") as f:
        rdb = f.read()
    out = {}
    for name, (offset, size) in variables.items():
        block = rdb[offset:offset + size]
        n = struct.unpack(">i", block[:4])[0]
        kind = block[4:5]
        if kind in (b"2", b"X", b"Z", b"0"):
            raise ValueError("%s: compression type %r not handled" % (name, kind))
        raw = zlib.decompress(block[4:])
        if len(raw) != n:
            raise ValueError("%s: expected %d bytes, got %d" % (name, n, len(raw)))
        out[name] = unserialize(raw)
    return out


# ---------------------------------------------------------------------------------------
def paragraphs_of(lines):
    """Project Gutenberg lines -> cleaned paragraphs (blank lines separate paragraphs)."""
    paras, cur = [], []
    for line in lines + [""]:
        line = (line or "").strip()
        if line:
            cur.append(line)
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    out = []
    for p in paras:
        p = p.replace("_", "")  # Gutenberg's italics markers
        p = p.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
        p = re.sub(r"\s+", " ", p).strip()
        if p:
            out.append(p)
    return out


def deb_version(deb):
    return subprocess.run(["dpkg-deb", "-f", deb, "Version"], check=True, capture_output=True,
                          text=True).stdout.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".demo_data/text")
    ap.add_argument("--deb", default=None, help="an already downloaded .deb of " + PACKAGE)
    ap.add_argument("--val", type=float, default=0.01, help="fraction of each novel held out for run selection")
    ap.add_argument("--test", type=float, default=0.02, help="fraction of each novel held out for perplexity")
    args = ap.parse_args()

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    deb = args.deb
    if deb is None:
        deb_dir = os.path.join(os.path.dirname(out), "deb")
        os.makedirs(deb_dir, exist_ok=True)
        debs = [f for f in os.listdir(deb_dir) if f.startswith(PACKAGE + "_") and f.endswith(".deb")]
        if not debs:
            subprocess.run(["apt-get", "download", PACKAGE], cwd=deb_dir, check=True)
            debs = [f for f in os.listdir(deb_dir) if f.startswith(PACKAGE + "_") and f.endswith(".deb")]
        deb = os.path.join(deb_dir, sorted(debs)[-1])
    x = os.path.join(os.path.dirname(out), "deb", "x")
    os.makedirs(x, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", deb, x], check=True)

    objects = lazyload(os.path.join(x, DATA_DIR, "Rdata.rdx"), os.path.join(x, DATA_DIR, "Rdata.rdb"))
    train, val, test, per_novel = [], [], [], {}
    for key, title in NOVELS:
        lines = objects[key]
        if not isinstance(lines, list) or not all(isinstance(s, str) or s is None for s in lines):
            raise ValueError("%s: expected a character vector" % key)
        paras = paragraphs_of(lines)
        n_test = max(1, int(round(len(paras) * args.test)))
        n_val = max(1, int(round(len(paras) * args.val)))
        n_train = len(paras) - n_test - n_val
        train += paras[:n_train]
        val += paras[n_train:n_train + n_val]
        test += paras[n_train + n_val:]
        per_novel[title] = {"lines": len(lines), "paragraphs": len(paras), "val_paragraphs": n_val,
                            "test_paragraphs": n_test, "characters": sum(len(p) + 1 for p in paras)}
        print("%-22s %6d lines  %5d paragraphs  %3d val  %3d test" % (title, len(lines), len(paras), n_val, n_test))

    with open(os.path.join(out, "train.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(train) + "\n")
    for name, part in (("val.txt", val), ("test.txt", test)):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.write("\n".join(part) + "\n")
    with open(deb, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    license_text = open(os.path.join(x, COPYRIGHT), encoding="utf-8").read()
    meta = {
        "package": PACKAGE,
        "version": deb_version(deb),
        "deb": os.path.basename(deb),
        "deb_sha256": sha,
        "license": "MIT (Debian copyright file: Files: * License: MIT); the novels themselves are in the public domain",
        "upstream": "janeaustenr (CRAN), Julia Silge; texts from Project Gutenberg",
        "split": "per novel, in order: train, then %g of the paragraphs (val), then the last %g (test)"
                 % (args.val, args.test),
        "novels": per_novel,
        "train_characters": sum(len(p) + 1 for p in train),
        "val_characters": sum(len(p) + 1 for p in val),
        "test_characters": sum(len(p) + 1 for p in test),
        "copyright_file": license_text,
    }
    with open(os.path.join(out, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
    print("train %d chars, val %d chars, test %d chars -> %s"
          % (meta["train_characters"], meta["val_characters"], meta["test_characters"], out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
