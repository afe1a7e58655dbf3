#!/usr/bin/env python3
"""Trains the demo model shipped in models/demo, and its transformers reference fixture.

Input: the text that tools/demo_data.py prepares (train.txt, val.txt, test.txt: one
paragraph per line; meta.json). Needs torch, transformers, tokenizers and a CUDA device.

What it does, in one run:
  1. trains a byte-level BPE tokenizer (HF tokenizers: ByteLevel pre-tokenizer and decoder,
     a TemplateProcessing post-processor that prepends <|begin_of_text|>) on train.txt;
  2. checks the export path early (a random model saved, reloaded and run; three training
     steps), so that a broken environment fails in seconds rather than after training;
  3. trains several Llama models of one shape at once on the GPU (one process each; they
     differ in dropout, epochs and learning rate), each until its epoch count or the shared
     deadline, keeping its checkpoint of lowest val.txt loss;
  4. saves the run with the lowest val loss in bf16 with save_pretrained, reloads that
     folder with from_pretrained (float32, eager attention, TF32 off) and from the reloaded
     model only computes: perplexity on test.txt (and val.txt), 64-token greedy
     continuations of PROMPTS (a loop of full forward passes, eos not a stop) with the
     top1 - top2 logit margin of every step, and sampled continuations for the model card;
  5. draws the loss curves.

Training samples: <|begin_of_text|> followed by ctx - 1 tokens of train.txt starting at a
paragraph start (paragraphs are tokenized one by one, each followed by "\\n"; this equals
tokenizing the whole text, since "\\n" before a letter is a pre-token of its own).
Perplexity windows: the held-out paragraphs packed greedily into windows of at most ctx
tokens, each window read after <|begin_of_text|>; every token of the text is predicted once.

Outputs under --out:
  demo_model.tar   demo/{config.json, generation_config.json, model.safetensors,
                   tokenizer.json, tokenizer_config.json, loss_curve.png}
  reference.json   the fixture for tests/fixtures/demo (prompts, ids, tokens, margins, text)
  report.json      everything measured (runs, timings, perplexities, samples, checks)
  runs.json        per-run loss logs
  loss_curve.png   the same plot as in the tar

Usage:
  PYTHONUNBUFFERED=1 python3 tools/train_demo_model.py --data .demo_data/text --out OUT

The draft model for speculative decoding (models/demo-draft, osprey --model-draft): the same
runs on the same text with the tokenizer of models/demo reused as is (not trained again, so
that every id is the demo's) and the DRAFT_ARCH shape (2 layers, hidden 128: about an eighth
of the demo's parameters); outputs demo_draft_model.tar (demo-draft/...) instead:
  PYTHONUNBUFFERED=1 python3 tools/train_demo_model.py --data .demo_data/text --out OUT_DRAFT \
      --arch draft --tokenizer models/demo --work /tmp/demo_draft_work --train-until 245
  tar -xf OUT_DRAFT/demo_draft_model.tar -C models/    # models/demo-draft/
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import time
import traceback

import numpy as np

T0 = time.time()

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
# Rendered as "<|begin_of_text|>user: Hello\n\nassistant:"; encode the result with
# add_special=False (the template holds the BOS).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\n\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}"
)

ARCH = {
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
}

# --arch draft: the draft model of speculative decoding, of the demo's tokenizer.
DRAFT_ARCH = {
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
}
# The folder (and tar member) and model_dir each --arch ships as.
ARCH_NAMES = {"demo": "demo", "draft": "demo-draft"}

# Runs trained side by side; the one with the lowest val loss is shipped.
RUNS = {
    "a": {"dropout": 0.0, "epochs": 6, "lr": 2e-3, "seed": 11},
    "b": {"dropout": 0.1, "epochs": 12, "lr": 2e-3, "seed": 12},
    "c": {"dropout": 0.1, "epochs": 24, "lr": 2e-3, "seed": 13},
    "d": {"dropout": 0.2, "epochs": 24, "lr": 2e-3, "seed": 14},
    "e": {"dropout": 0.2, "epochs": 48, "lr": 2e-3, "seed": 15},
    "f": {"dropout": 0.1, "epochs": 24, "lr": 1e-3, "seed": 16},
}
WARMUP_STEPS = 100
MIN_LR_FRACTION = 0.1
WEIGHT_DECAY = 0.1

PROMPTS = [
    "It is a truth universally acknowledged, that",
    "The weather was fine, and the young ladies walked",
    '"I cannot think," said she, "why',
    "When the letter arrived, she",
    "Mr. Knightley was",
]
SAMPLE_PROMPTS = [
    "The morning was cold and bright, and",
    "Elizabeth looked at her sister and",
    "There was nothing in the world that",
]
N_GREEDY = 64
N_SAMPLE = 120


def log(*a):
    print("[%6.1fs]" % (time.time() - T0), *a, flush=True)


def read_paragraphs(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]


# ---------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer(paragraphs, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((p + "\n" for p in paragraphs), trainer=trainer, length=len(paragraphs))
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS}:0 $A:0",
        pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1",
        special_tokens=[(BOS, bos_id)],
    )
    return tok


def write_tokenizer_files(tok, folder, ctx):
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    added = {}
    for text in (BOS, EOS):
        added[str(tok.token_to_id(text))] = {
            "content": text, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
    config = {
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "eos_token": EOS,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": ctx,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")


def encode_paragraphs(tok, paragraphs):
    enc = tok.encode_batch([p + "\n" for p in paragraphs], add_special_tokens=False)
    return [e.ids for e in enc]


def pack_windows(paragraph_ids, ctx):
    """Paragraph token lists -> windows of at most ctx tokens that start at paragraph starts
    (a paragraph longer than ctx is cut into pieces)."""
    windows, cur = [], []
    for p in paragraph_ids:
        p = list(p)
        while len(p) > ctx:
            if cur:
                windows.append(cur)
                cur = []
            windows.append(p[:ctx])
            p = p[ctx:]
        if len(cur) + len(p) > ctx:
            windows.append(cur)
            cur = []
        cur = cur + p
    if cur:
        windows.append(cur)
    return windows


# ---------------------------------------------------------------------------------------
# model


def llama_config(transformers, vocab_size, ctx, bos_id, eos_id, dropout=0.0):
    kw = {
        "vocab_size": vocab_size,
        "hidden_size": ARCH["hidden_size"],
        "intermediate_size": ARCH["intermediate_size"],
        "num_hidden_layers": ARCH["num_hidden_layers"],
        "num_attention_heads": ARCH["num_attention_heads"],
        "num_key_value_heads": ARCH["num_key_value_heads"],
        "head_dim": ARCH["head_dim"],
        "rms_norm_eps": ARCH["rms_norm_eps"],
        "max_position_embeddings": ctx,
        "tie_word_embeddings": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": dropout,
        "initializer_range": 0.02,
    }
    try:
        return transformers.LlamaConfig(
            rope_parameters={"rope_type": "default", "rope_theta": ARCH["rope_theta"]}, **kw)
    except TypeError:
        return transformers.LlamaConfig(rope_theta=ARCH["rope_theta"], **kw)


def add_residual_dropout(model, p):
    """Dropout on the embedding output and on each attention / MLP output before the residual
    add (Llama in transformers has attention-probability dropout only)."""
    import torch.nn.functional as F

    if p <= 0:
        return []

    def hook(module, inputs, output):
        if not module.training:
            return output
        if isinstance(output, tuple):
            return (F.dropout(output[0], p, True),) + tuple(output[1:])
        return F.dropout(output, p, True)

    handles = [model.model.embed_tokens.register_forward_hook(hook)]
    for layer in model.model.layers:
        handles.append(layer.self_attn.register_forward_hook(hook))
        handles.append(layer.mlp.register_forward_hook(hook))
    return handles


def window_batches(windows, bos_id, pad_id, batch, device):
    import torch

    out = []
    for i in range(0, len(windows), batch):
        chunk = windows[i:i + batch]
        T = max(len(w) for w in chunk)
        inp = torch.full((len(chunk), T), pad_id, dtype=torch.long)
        lab = torch.full((len(chunk), T), -100, dtype=torch.long)
        for j, w in enumerate(chunk):
            w = torch.tensor(w, dtype=torch.long)
            inp[j, 0] = bos_id
            inp[j, 1:len(w)] = w[:-1]
            lab[j, :len(w)] = w
        out.append((inp.to(device), lab.to(device)))
    return out


def mean_nll(model, batches, autocast):
    """Mean next-token NLL (nats) over the labelled positions, and their count. Padding sits
    after the text of each row, so with causal attention it changes nothing."""
    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for inp, lab in batches:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                logits = model(input_ids=inp, use_cache=False).logits
            nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), lab.reshape(-1),
                                  ignore_index=-100, reduction="sum")
            total += float(nll)
            count += int((lab != -100).sum())
    model.train(was_training)
    return total / max(count, 1), count


# ---------------------------------------------------------------------------------------
# one training run (a worker process, or the smoke test in the main process)


def train_one(args, name, deadline, max_steps=None, save_dir=None):
    import torch
    import torch.nn.functional as F
    import transformers

    run = RUNS[name]
    torch.set_num_threads(2)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = "cuda"
    data = np.load(os.path.join(args.work, "data.npz"))
    meta = json.load(open(os.path.join(args.work, "data_meta.json")))
    vocab, bos_id, eos_id, ctx, B = meta["vocab_size"], meta["bos_id"], meta["eos_id"], args.ctx, args.batch
    stream = torch.from_numpy(data["train_stream"].astype(np.int64)).to(dev)
    starts = torch.from_numpy(data["train_starts"].astype(np.int64)).to(dev)
    val_windows = [list(map(int, w)) for w in np.split(data["val_flat"], data["val_splits"])]
    val_batches = window_batches(val_windows, bos_id, eos_id, 32, dev)
    n_train_tokens = int(stream.numel())

    torch.manual_seed(run["seed"])
    config = llama_config(transformers, vocab, ctx, bos_id, eos_id, dropout=run["dropout"])
    model = transformers.LlamaForCausalLM(config).to(dev)
    model.train()
    add_residual_dropout(model, run["dropout"])
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
        lr=run["lr"], betas=(0.9, 0.95), eps=1e-8, fused=True)

    tokens_per_step = B * ctx
    steps_for_epochs = int(math.ceil(run["epochs"] * n_train_tokens / tokens_per_step))
    steps_per_epoch = n_train_tokens / tokens_per_step
    eval_every = max(25, int(steps_per_epoch / 2))
    gen = torch.Generator(device=dev)
    gen.manual_seed(run["seed"])
    ar = torch.arange(ctx, device=dev)
    bos_col = torch.full((B, 1), bos_id, dtype=torch.long, device=dev)

    t_start = time.time()
    available = max(deadline - t_start, 1.0)
    step, acc, acc_n = 0, torch.zeros((), device=dev), 0
    train_log, val_log = [], []
    best = {"loss": float("inf"), "step": 0, "state": None}
    last_print = t_start
    stop_reason = "epochs"

    def evaluate():
        v, _ = mean_nll(model, val_batches, autocast=True)
        val_log.append({"step": step, "tokens": step * tokens_per_step, "time": time.time() - t_start,
                        "loss": v})
        if v < best["loss"]:
            best.update(loss=v, step=step,
                        state={k: t.detach().to("cpu", copy=True) for k, t in model.state_dict().items()})
        return v

    while True:
        frac_steps = step / steps_for_epochs
        frac_time = (time.time() - t_start) / available
        if max_steps is not None and step >= max_steps:
            stop_reason = "max_steps"
            break
        if frac_steps >= 1.0:
            stop_reason = "epochs"
            break
        if frac_time >= 1.0:
            stop_reason = "deadline"
            break
        frac = max(frac_steps, frac_time)
        lr = run["lr"] * min(1.0, (step + 1) / WARMUP_STEPS) * (
            MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * frac)))
        for group in opt.param_groups:
            group["lr"] = lr
        idx = starts[torch.randint(starts.numel(), (B,), device=dev, generator=gen)]
        toks = stream[idx[:, None] + ar[None, :]]  # [B, ctx]
        inp = torch.cat([bos_col, toks[:, :-1]], dim=1)  # [B, ctx]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=inp, use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), toks.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        acc += loss.detach()
        acc_n += 1
        if step % 10 == 0 or (max_steps is not None and step >= max_steps):
            mean = float(acc) / acc_n
            if not math.isfinite(mean):
                raise RuntimeError("run %s: loss is %r at step %d" % (name, mean, step))
            train_log.append({"step": step, "tokens": step * tokens_per_step, "time": time.time() - t_start,
                              "loss": mean, "lr": lr})
            acc, acc_n = torch.zeros((), device=dev), 0
        if step % eval_every == 0:
            evaluate()
        now = time.time()
        if now - last_print > 20:
            last_print = now
            log("run %s: step %d/%d (%.1f epochs), train %.3f, val %s, lr %.2e, %.1f ms/step" % (
                name, step, steps_for_epochs, step / steps_per_epoch,
                train_log[-1]["loss"] if train_log else float("nan"),
                "%.3f" % val_log[-1]["loss"] if val_log else "-", lr, 1000 * (now - t_start) / step))
    v = evaluate()
    elapsed = time.time() - t_start
    result = {
        "name": name, "run": run, "steps": step, "steps_for_epochs": steps_for_epochs,
        "stop_reason": stop_reason, "tokens_seen": step * tokens_per_step,
        "epochs_seen": step / steps_per_epoch, "train_tokens": n_train_tokens, "batch": B, "ctx": ctx,
        "seconds": elapsed, "ms_per_step": 1000 * elapsed / max(step, 1), "final_val_loss": v,
        "best_val_loss": best["loss"], "best_step": best["step"], "eval_every": eval_every,
        "train_log": train_log, "val_log": val_log,
        "n_params": sum(p.numel() for p in model.parameters()),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
    }
    log("run %s: done, %d steps (%.1f epochs, %s), %.1f s, best val %.4f at step %d" % (
        name, step, step / steps_per_epoch, stop_reason, elapsed, best["loss"], best["step"]))
    if save_dir:
        os.makedirs(save_dir, exist_ok=True)
        torch.save(best["state"], os.path.join(save_dir, "best.pt"))
        with open(os.path.join(save_dir, "result.json"), "w") as f:
            json.dump(result, f)
    return result


# ---------------------------------------------------------------------------------------
# main


def prepare(args, report):
    import torch
    import tokenizers
    import transformers

    report["versions"] = {
        "python": sys.version.split()[0], "torch": torch.__version__,
        "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    log("versions", json.dumps(report["versions"]))
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")

    train = read_paragraphs(os.path.join(args.data, "train.txt"))
    val = read_paragraphs(os.path.join(args.data, "val.txt"))
    test = read_paragraphs(os.path.join(args.data, "test.txt"))
    report["data_meta"] = json.load(open(os.path.join(args.data, "meta.json")))
    report["data_meta"].pop("copyright_file", None)
    log("paragraphs: train %d, val %d, test %d" % (len(train), len(val), len(test)))

    tok_dir = os.path.join(args.work, "tokenizer")
    if args.tokenizer:
        # Reused as is (a draft model's ids must be the target's).
        os.makedirs(tok_dir, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(args.tokenizer, name), os.path.join(tok_dir, name))
        log("tokenizer: reused from %s" % args.tokenizer)
    else:
        tok = train_tokenizer(train, args.vocab)
        write_tokenizer_files(tok, tok_dir, args.ctx)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))  # as saved
    vocab = tok.get_vocab_size(with_added_tokens=True)
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    log("tokenizer: vocab %d, bos %d, eos %d" % (vocab, bos_id, eos_id))

    train_ids = encode_paragraphs(tok, train)
    stream = np.fromiter((t for p in train_ids for t in p), dtype=np.int32)
    lengths = np.array([len(p) for p in train_ids], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    starts = starts[starts + args.ctx <= len(stream)].astype(np.int64)
    # Whole-text encoding equals the paragraph-by-paragraph one (checked on a slice).
    probe = "\n".join(train[:200]) + "\n"
    whole = tok.encode(probe, add_special_tokens=False).ids
    pieces = [t for p in train_ids[:200] for t in p]
    report["tokenization_check_whole_equals_paragraphs"] = whole == pieces
    chars = sum(len(p) + 1 for p in train)
    log("train tokens %d (%.2f chars/token), %d window starts, whole==paragraphs: %s" % (
        len(stream), chars / len(stream), len(starts), whole == pieces))

    def flat(windows):
        return (np.array([t for w in windows for t in w], dtype=np.int32),
                np.cumsum([len(w) for w in windows])[:-1].astype(np.int64))

    val_windows = pack_windows(encode_paragraphs(tok, val), args.ctx)
    test_windows = pack_windows(encode_paragraphs(tok, test), args.ctx)
    vf, vs = flat(val_windows)
    tf, ts = flat(test_windows)
    np.savez(os.path.join(args.work, "data.npz"), train_stream=stream, train_starts=starts,
             val_flat=vf, val_splits=vs, test_flat=tf, test_splits=ts)
    meta = {"vocab_size": vocab, "bos_id": bos_id, "eos_id": eos_id, "train_tokens": int(len(stream)),
            "val_tokens": int(len(vf)), "test_tokens": int(len(tf)), "train_chars": chars,
            "val_chars": sum(len(p) + 1 for p in val), "test_chars": sum(len(p) + 1 for p in test),
            "train_paragraphs": len(train), "window_starts": int(len(starts))}
    with open(os.path.join(args.work, "data_meta.json"), "w") as f:
        json.dump(meta, f)
    report["data"] = meta
    log("val tokens %d in %d windows, test tokens %d in %d windows" % (
        len(vf), len(val_windows), len(tf), len(test_windows)))
    return tok, meta


def export_and_reload(args, state, meta, folder):
    """Writes folder (bf16 via save_pretrained + tokenizer files); returns the model reloaded
    from it in float32 with eager attention, and the config.json written."""
    import torch
    import transformers

    config = llama_config(transformers, meta["vocab_size"], args.ctx, meta["bos_id"], meta["eos_id"])
    writer = transformers.LlamaForCausalLM(config)
    if state is not None:
        missing, unexpected = writer.load_state_dict(state, strict=False)
        missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            raise RuntimeError("state dict: missing %s, unexpected %s" % (missing, unexpected))
    writer = writer.to(torch.bfloat16)
    writer.generation_config = transformers.GenerationConfig(bos_token_id=meta["bos_id"],
                                                             eos_token_id=meta["eos_id"])
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    writer.save_pretrained(folder)
    if not os.path.exists(os.path.join(folder, "generation_config.json")):
        writer.generation_config.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.work, "tokenizer", name), os.path.join(folder, name))
    written = {k: v.detach().float().clone() for k, v in writer.state_dict().items()}
    del writer
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                                  attn_implementation="eager")
    except TypeError:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32,
                                                                  attn_implementation="eager")
    model = model.to("cuda").eval()
    loaded = model.state_dict()
    for k, v in written.items():
        if not torch.equal(loaded[k].detach().float().cpu(), v):
            raise RuntimeError("reloaded %s differs from the bf16 weights written" % k)
    with open(os.path.join(folder, "config.json")) as f:
        written_config = json.load(f)
    return model, written_config


class _PlainTokenizer:
    """The tokenizers library behind the two calls used here, when transformers cannot load it."""

    def __init__(self, path):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(path)

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": self.tok.encode(text, add_special_tokens=add_special_tokens).ids}

    def decode(self, ids, skip_special_tokens=False, **_):
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


def load_hf_tokenizer(folder):
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(folder), "AutoTokenizer"
    except Exception as e:  # noqa: BLE001
        log("AutoTokenizer failed: %s" % e)
    try:
        return transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"),
                                                    bos_token=BOS, eos_token=EOS), "PreTrainedTokenizerFast"
    except Exception as e:  # noqa: BLE001
        log("PreTrainedTokenizerFast failed: %s" % e)
    return _PlainTokenizer(os.path.join(folder, "tokenizer.json")), "tokenizers only"


def render_chat(hf_tok):
    try:
        return hf_tok.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=False,
                                          add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001
        return "failed: %s" % e


def greedy(model, prompt_ids, n):
    import torch

    seq = torch.tensor([prompt_ids], dtype=torch.long, device="cuda")
    tokens, margins = [], []
    with torch.no_grad():
        for _ in range(n):
            last = model(input_ids=seq, use_cache=False).logits[0, -1].float()
            top = torch.topk(last, 2)
            nxt = int(top.indices[0])
            tokens.append(nxt)
            margins.append(float(top.values[0] - top.values[1]))
            seq = torch.cat([seq, torch.tensor([[nxt]], device="cuda")], dim=1)
    return tokens, margins


def smoke_checks(args, tok, meta, report):
    """Exercises the export path and the training loop for a few seconds before the long part."""
    import torch

    folder = os.path.join(args.work, "smoke_model")
    model, written_config = export_and_reload(args, None, meta, folder)
    ids = tok.encode(PROMPTS[0], add_special_tokens=True).ids
    if ids[0] != meta["bos_id"]:
        raise RuntimeError("the post-processor did not prepend BOS: %s" % ids[:5])
    tokens, margins = greedy(model, ids, 3)
    hf_tok, kind = load_hf_tokenizer(folder)
    hf_ids = hf_tok(PROMPTS[0], add_special_tokens=True)["input_ids"]
    chat = render_chat(hf_tok)
    try:
        inv = model.model.rotary_emb.inv_freq.detach().double().cpu().numpy()
        hd = ARCH["head_dim"]
        inv_expected = 1.0 / (ARCH["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
        inv_diff = float(np.max(np.abs(inv / inv_expected - 1)))
    except Exception as e:  # noqa: BLE001
        inv_diff = "unavailable: %s" % e
    report["smoke"] = {"config_json": written_config, "files": sorted(os.listdir(folder)),
                       "prompt_ids": ids, "hf_prompt_ids": hf_ids, "hf_tokenizer": kind,
                       "chat_template_rendered": chat, "inv_freq_max_rel_diff": inv_diff,
                       "attn_implementation": getattr(model.config, "_attn_implementation", None)}
    log("smoke: export/reload ok, files %s, hf ids equal %s, chat %r, inv_freq rel diff %s" % (
        report["smoke"]["files"], hf_ids == ids, chat, inv_diff))
    del model
    torch.cuda.empty_cache()
    r = train_one(args, "b", time.time() + 30, max_steps=3)
    report["smoke"]["train_steps"] = {"steps": r["steps"], "val_loss": r["final_val_loss"],
                                      "n_params": r["n_params"]}
    log("smoke: 3 training steps ok, val loss %.3f, %d parameters" % (r["final_val_loss"], r["n_params"]))


def run_workers(args, deadline, report):
    procs = {}
    for name in args.runs.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, "--deadline", repr(deadline)]
        for key in ("data", "out", "work"):
            cmd += ["--" + key, getattr(args, key)]
        cmd += ["--ctx", str(args.ctx), "--batch", str(args.batch), "--vocab", str(args.vocab), "--arch", args.arch]
        procs[name] = subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    log("started runs %s, training until +%.0f s" % (",".join(procs), deadline - T0))
    hard_stop = deadline + 60
    while any(p.poll() is None for p in procs.values()) and time.time() < hard_stop:
        time.sleep(1)
    for name, p in procs.items():
        if p.poll() is None:
            log("run %s still running at the hard stop: killed" % name)
            p.kill()
            p.wait()
    results = {}
    for name, p in procs.items():
        path = os.path.join(args.work, "runs", name)
        if p.returncode == 0 and os.path.exists(os.path.join(path, "result.json")):
            results[name] = json.load(open(os.path.join(path, "result.json")))
        else:
            log("run %s failed (exit %s)" % (name, p.returncode))
    report["runs_exit_codes"] = {n: p.returncode for n, p in procs.items()}
    return results


def plot(results, chosen, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5), dpi=100)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, r) in enumerate(sorted(results.items())):
        c = colors[i % len(colors)]
        bold = name == chosen
        run = r["run"]
        label = "run %s: dropout %.1f, %d epochs, lr %.0e%s" % (
            name, run["dropout"], run["epochs"], run["lr"], " (shipped)" if bold else "")
        epochs = [t["tokens"] / r["train_tokens"] for t in r["train_log"]]
        ax.plot(epochs, [t["loss"] for t in r["train_log"]], color=c, lw=1.6 if bold else 0.7,
                alpha=1.0 if bold else 0.5, label=label + " train")
        ve = [v["tokens"] / r["train_tokens"] for v in r["val_log"]]
        ax.plot(ve, [v["loss"] for v in r["val_log"]], color=c, lw=2.2 if bold else 0.9, ls="--",
                marker="o" if bold else None, ms=2.5, alpha=1.0 if bold else 0.6, label=label + " val")
    r = results[chosen]
    best = [v for v in r["val_log"] if v["step"] == r["best_step"]]
    if best:
        ax.plot([best[0]["tokens"] / r["train_tokens"]], [best[0]["loss"]], marker="*", ms=14, color="black",
                ls="none", label="shipped checkpoint (lowest val loss)")
    ax.set_xlabel("epochs over the training text")
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    lo = min(min(t["loss"] for t in r["train_log"]) for r in results.values())
    ax.set_ylim(max(0.0, lo - 0.2), 7.5)
    ax.legend(fontsize=6.5, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def finish(args, tok, meta, results, report):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    chosen = min(results, key=lambda n: results[n]["best_val_loss"])
    r = results[chosen]
    report["chosen_run"] = chosen
    log("shipping run %s (best val %.4f at step %d of %d)" % (chosen, r["best_val_loss"], r["best_step"], r["steps"]))
    state = torch.load(os.path.join(args.work, "runs", chosen, "best.pt"))
    folder = os.path.join(args.work, ARCH_NAMES[args.arch])
    model, written_config = export_and_reload(args, state, meta, folder)
    report["config_json"] = written_config
    report["n_params"] = sum(p.numel() for p in model.parameters())
    report["files"] = {n: os.path.getsize(os.path.join(folder, n)) for n in sorted(os.listdir(folder))}

    data = np.load(os.path.join(args.work, "data.npz"))
    ppl = {}
    for part in ("val", "test"):
        windows = [list(map(int, w)) for w in np.split(data[part + "_flat"], data[part + "_splits"])]
        batches = window_batches(windows, meta["bos_id"], meta["eos_id"], 16, "cuda")
        nll, count = mean_nll(model, batches, autocast=False)
        ppl[part] = {"nll_per_token": nll, "perplexity": math.exp(nll), "tokens": count,
                     "windows": len(windows), "bits_per_char": nll * count / math.log(2) / meta[part + "_chars"]}
        log("%s: %d tokens, perplexity %.2f, %.3f bits/char" % (part, count, math.exp(nll),
                                                               ppl[part]["bits_per_char"]))
    report["perplexity"] = ppl

    hf_tok, kind = load_hf_tokenizer(folder)
    cases = []
    for text in PROMPTS:
        ids = tok.encode(text, add_special_tokens=True).ids
        hf_ids = hf_tok(text, add_special_tokens=True)["input_ids"]
        tokens, margins = greedy(model, ids, N_GREEDY)
        out_text = tok.decode(tokens, skip_special_tokens=False)
        hf_text = hf_tok.decode(tokens, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        with torch.no_grad():
            inp = torch.tensor([ids], device="cuda")
            gen = model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=N_GREEDY,
                                 do_sample=False, pad_token_id=meta["eos_id"])[0, len(ids):].tolist()
        upto = tokens.index(meta["eos_id"]) + 1 if meta["eos_id"] in tokens else len(tokens)
        case = {"prompt": text, "prompt_ids": ids, "tokens": tokens, "margins": margins, "text": out_text,
                "hf_tokenizer_prompt_ids_equal": hf_ids == ids, "hf_tokenizer_text_equal": hf_text == out_text,
                "cached_generate_agrees": gen[:upto] == tokens[:upto],
                "min_margin": min(margins), "steps_margin_over_0_05": sum(m > 0.05 for m in margins)}
        cases.append(case)
        log("greedy %r -> %r (min margin %.3f, cached agrees %s)" % (text, out_text, min(margins),
                                                                   case["cached_generate_agrees"]))
    fixture = {
        "description": "Greedy continuations of models/demo by Hugging Face transformers, the reference "
                       "for tests/model/demo_model_test.cpp. Made by tools/train_demo_model.py.",
        "model_dir": "models/" + ARCH_NAMES[args.arch],
        "n_tokens": N_GREEDY,
        "margin_threshold": 0.05,
        "compute": "from_pretrained(models/demo, dtype=float32, attn_implementation=eager) on CUDA, TF32 off; "
                   "a loop of full forward passes without a cache, argmax of the last position; eos is not a stop; "
                   "margins are top1 - top2 logits; prompt ids from the tokenizers library on tokenizer.json "
                   "with add_special_tokens=True; text is tokenizers' decode(tokens, skip_special_tokens=False)",
        "versions": report["versions"],
        "cases": cases,
    }
    report["hf_tokenizer"] = kind

    samples = []
    for i, text in enumerate(SAMPLE_PROMPTS):
        torch.manual_seed(100 + i)
        ids = tok.encode(text, add_special_tokens=True).ids
        inp = torch.tensor([ids], device="cuda")
        with torch.no_grad():
            out = model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=N_SAMPLE,
                                 do_sample=True, temperature=0.8, top_k=50, pad_token_id=meta["eos_id"])
        samples.append({"prompt": text, "seed": 100 + i, "temperature": 0.8, "top_k": 50,
                        "text": tok.decode(out[0, len(ids):].tolist(), skip_special_tokens=False)})
        log("sample %r -> %r" % (text, samples[-1]["text"]))
    report["samples"] = samples
    report["chat_template_rendered"] = render_chat(hf_tok)

    title = "%s model (%.1fM parameters): test perplexity %.1f" % (ARCH_NAMES[args.arch], report["n_params"] / 1e6,
                                                                   ppl["test"]["perplexity"])
    png = os.path.join(folder, "loss_curve.png")
    try:
        plot(results, chosen, png, title)
        shutil.copy(png, os.path.join(args.out, "loss_curve.png"))
    except Exception:  # noqa: BLE001
        report["plot_error"] = traceback.format_exc()
        log("plot failed:\n" + report["plot_error"])
    return folder, fixture


def main_process(args):
    report = {"status": "started", "args": vars(args)}
    out = args.out
    os.makedirs(out, exist_ok=True)
    if os.path.exists(args.work):
        shutil.rmtree(args.work)
    os.makedirs(args.work)
    results = {}

    def write_reports():
        report["seconds_total"] = time.time() - T0
        with open(os.path.join(out, "report.json"), "w") as f:
            json.dump(report, f, indent=1)
        if results:
            with open(os.path.join(out, "runs.json"), "w") as f:
                json.dump(results, f)

    try:
        tok, meta = prepare(args, report)
        write_reports()
        smoke_checks(args, tok, meta, report)
        write_reports()
        deadline = T0 + args.train_until
        if deadline - time.time() < 30:
            raise RuntimeError("less than 30 s left for training")
        results.update(run_workers(args, deadline, report))
        report["runs"] = {n: {k: v for k, v in r.items() if k not in ("train_log", "val_log")}
                          for n, r in results.items()}
        write_reports()
        if not results:
            raise RuntimeError("every training run failed")
        folder, fixture = finish(args, tok, meta, results, report)
        with open(os.path.join(out, "reference.json"), "w") as f:
            json.dump(fixture, f, indent=1)
        name = ARCH_NAMES[args.arch]
        with tarfile.open(os.path.join(out, name.replace("-", "_") + "_model.tar"), "w") as tar:
            tar.add(folder, arcname=name)
        report["status"] = "ok"
    except Exception:  # noqa: BLE001
        report["status"] = "failed"
        report["error"] = traceback.format_exc()
        log("FAILED:\n" + report["error"])
    finally:
        write_reports()
    log("status %s, %.1f s" % (report["status"], time.time() - T0))
    return 0 if report["status"] == "ok" else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="folder with train.txt, val.txt, test.txt, meta.json")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--work", default="/tmp/demo_work", help="scratch folder (emptied first)")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--runs", default=",".join(RUNS), help="comma-separated subset of " + ",".join(RUNS))
    ap.add_argument("--train-until", type=float, default=300.0,
                    help="seconds after the start at which every run stops training")
    ap.add_argument("--arch", choices=sorted(ARCH_NAMES), default="demo",
                    help="demo: the demo model's shape; draft: DRAFT_ARCH, the draft model of speculative decoding "
                         "(needs --tokenizer models/demo)")
    ap.add_argument("--tokenizer", default=None,
                    help="folder whose tokenizer.json and tokenizer_config.json are reused instead of training one")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in args.runs.split(","):
        if name not in RUNS:
            ap.error("unknown run %r" % name)
    if args.arch == "draft" and not args.tokenizer:
        ap.error("--arch draft: give --tokenizer models/demo (the draft must have the demo's token ids)")
    if args.tokenizer and not os.path.exists(os.path.join(args.tokenizer, "tokenizer.json")):
        ap.error("--tokenizer %s: no tokenizer.json there" % args.tokenizer)
    if args.arch == "draft":
        ARCH.clear()
        ARCH.update(DRAFT_ARCH)
    if args.worker:
        train_one(args, args.worker, args.deadline, save_dir=os.path.join(args.work, "runs", args.worker))
        return 0
    return main_process(args)


if __name__ == "__main__":
    sys.exit(main())
