"""Node-side (stdlib; pyarrow and transformers when the node has them): token lengths of the training prompts.

Run as `python -c SOURCE '{"files": [...], "model": "...", "prompt_key": "prompt", "limit": 512}'`; prints one
MARK line (see runners.remote_python). Also imported locally by `plan --data`.

verl (0.9, RLHFDataset + the agent loop) turns a row's chat messages into the prompt with the tokenizer's chat
template (add_generation_prompt=True) and tokenizes that text without adding special tokens; this does the same on
a sample of rows: all of them when the files are small, SAMPLE spread evenly over the files otherwise. Without a
tokenizer on the node the length is estimated from characters, with the ratio stated in the result.
"""

import json
import math
import os
import sys
import time

MARK = "@@VC-JSON@@"
SAMPLE = 4096
# Without a tokenizer: BPE tokenizers of current LLMs average ~3.5-4.5 characters per token on English prose and
# fewer on math/LaTeX; 3.0 errs long (the safe side for memory). A chat template adds role markers per message
# and, for models like Qwen2.5, a default system prompt.
CHARS_PER_TOKEN = 3.0
TEMPLATE_TOKENS_PER_MESSAGE = 8
TEMPLATE_TOKENS_BASE = 24
SPREAD_GROUPS = 32  # a large file is read in at least this many row groups, evenly spaced
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}


def sample_prompts(files, key, sample=SAMPLE):
    """(prompts as chat messages, rows in all files, per-file errors). Rows are taken at an even stride, so a
    sample of a file sorted by length or topic still spans it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    opened, errors = [], {}
    for path in files:
        try:
            pf = pq.ParquetFile(os.path.expanduser(path))
        except Exception as e:  # noqa: BLE001 - a missing or broken file is reported, the others still count
            errors[path] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            continue
        if key not in pf.schema_arrow.names:
            errors[path] = f"no column `{key}` (columns: {', '.join(pf.schema_arrow.names)})"
            continue
        opened.append((path, pf, pf.metadata.num_rows))
    total = sum(n for _, _, n in opened)
    out = []
    for path, pf, n in opened:
        take = n if total <= sample else max(1, sample * n // total)
        groups, rows = spread_row_groups(pf, take)
        stride = max(1, rows // take)
        picked = start = 0
        for batch in pf.iter_batches(columns=[key], batch_size=8192, row_groups=groups):
            first = -(-start // stride) * stride
            want = [i - start for i in range(first, start + batch.num_rows, stride)][:take - picked]
            if want:
                col = batch.column(0).take(pa.array(want, type=pa.int64()))
                out.extend(as_messages(v) for v in col.to_pylist())
                picked += len(want)
            start += batch.num_rows
            if picked >= take:
                break
    return out, total, errors


def spread_row_groups(pf, take):
    """(row groups to read, their rows): all of them, or for a file much larger than the sample every k-th, so a
    big file is not read whole and the sample still spans it."""
    g = pf.num_row_groups
    sizes = [pf.metadata.row_group(i).num_rows for i in range(g)]
    n = sum(sizes)
    if g <= 1 or n <= 4 * take:
        return list(range(g)), n
    count = min(g, max(SPREAD_GROUPS, math.ceil(2 * take * g / n)))  # about twice the sample's rows, spread out
    chosen = sorted({round(i * (g - 1) / (count - 1)) for i in range(count)})
    return chosen, sum(sizes[i] for i in chosen)


def as_messages(value):
    """verl's prompt column: chat messages ([{role, content}]); a plain string is one user message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    msgs = []
    for m in value or []:
        if isinstance(m, dict):
            content = m.get("content")
            if isinstance(content, list):  # content parts: the text ones
                content = "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
            msgs.append({"role": str(m.get("role") or "user"), "content": "" if content is None else str(content)})
    return msgs


def load_tokenizer(model):
    """(tokenizer or None, why not). Offline: only files already on this node are read."""
    if not model:
        return None, "the job names no model"
    # offline while loading (never a download), then the caller's environment as it was (plan runs this in-process)
    saved = {k: os.environ.get(k) for k in OFFLINE_ENV}
    os.environ.update(OFFLINE_ENV)
    try:
        try:
            from transformers import AutoTokenizer
        except Exception as e:  # noqa: BLE001 - not installed, or broken: estimate instead
            return None, f"transformers does not import here ({type(e).__name__})"
        try:
            return AutoTokenizer.from_pretrained(os.path.expanduser(model), local_files_only=True), ""
        except Exception as e:  # noqa: BLE001 - not on this node: estimate instead
            first = str(e).splitlines()[0] if str(e) else ""
            if isinstance(e, OSError) and not os.path.isdir(os.path.expanduser(model)):
                first = "not in this machine's Hugging Face cache"
            return None, f"no tokenizer for {model} here ({first[:160]})"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def token_lengths(tok, prompts, template_kwargs):
    """(lengths, how): the chat template applied as verl does, then the tokenizer without special tokens."""
    if getattr(tok, "chat_template", None):
        texts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False, **template_kwargs)
                 for m in prompts]
        how = "chat template applied"
    else:
        texts = ["\n".join(x["content"] for x in m) for m in prompts]
        how = "no chat template in the tokenizer: message contents joined"
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    return [len(x) for x in ids], how


def char_lengths(prompts):
    return [math.ceil(sum(len(x["content"]) for x in m) / CHARS_PER_TOKEN) + TEMPLATE_TOKENS_PER_MESSAGE * len(m)
            + TEMPLATE_TOKENS_BASE for m in prompts]


def stats(lengths, limit):
    s = sorted(lengths)
    n = len(s)

    def pct(q):
        return s[min(n - 1, max(0, math.ceil(q * n) - 1))]  # nearest rank

    kept = [x for x in s if x <= limit]
    return {"sampled": n, "mean": sum(s) / n, "p50": pct(0.5), "p95": pct(0.95), "max": s[-1], "min": s[0],
            "over_limit": n - len(kept), "limit": limit,
            "mean_kept": (sum(kept) / len(kept)) if kept else 0.0,
            "mean_truncated": sum(min(x, limit) for x in s) / n}


def measure(files, model=None, prompt_key="prompt", limit=512, sample=SAMPLE, template_kwargs=None):
    """The prompt-length document: stats over the sample, how they were measured, and per-file errors."""
    t0 = time.monotonic()
    out = {"files": list(files), "prompt_key": prompt_key}
    try:
        prompts, rows, errors = sample_prompts(files, prompt_key, sample)
    except ImportError:
        return {**out, "error": "pyarrow is not installed here"}
    out.update(rows=rows, errors=errors)
    if not prompts:
        return {**out, "error": "; ".join(f"{k}: {v}" for k, v in errors.items()) or "no rows"}
    tok, why = load_tokenizer(model)
    if tok is not None:
        try:
            lengths, how = token_lengths(tok, prompts, template_kwargs or {})
            out.update(method="tokenizer", tokenizer=model, how=how)
        except Exception as e:  # noqa: BLE001 - a template that fails on these rows: estimate, and say why
            tok, why = None, f"the tokenizer of {model} failed on these rows ({type(e).__name__}: {str(e)[:160]})"
    if tok is None:
        lengths = char_lengths(prompts)
        out.update(method="characters", tokenizer="", how=why, chars_per_token=CHARS_PER_TOKEN,
                   template_tokens=f"{TEMPLATE_TOKENS_PER_MESSAGE} per message + {TEMPLATE_TOKENS_BASE}")
    out.update(stats(lengths, limit))
    out["elapsed_s"] = round(time.monotonic() - t0, 2)
    return out


def main(arg):
    req = json.loads(arg)
    doc = measure(req.get("files") or [], req.get("model"), req.get("prompt_key") or "prompt",
                  int(req.get("limit") or 512), int(req.get("sample") or SAMPLE), req.get("template_kwargs") or {})
    print(MARK + json.dumps(doc), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
