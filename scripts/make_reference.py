#!/usr/bin/env python3
"""Writes llama.cpp reference fixtures for SmolLM2-135M-Instruct (run by scripts/make-reference).

llama.cpp, driven through llama-cpp-python, is the oracle: tandem's tokenizer, chat template
rendering and forward pass are checked against what it produces here. Every fixture records
the exact llama-cpp-python / llama.cpp versions and the context settings that affect numerics
(KV cache type, flash attention, batch sizes, threads), because logits differ across them.

Outputs (in --out):
  smollm2-tokenize.json  ids for each standard vocab test string (no BOS, no special parsing)
  smollm2-greedy.json    three plain prompts, 32 greedy tokens each, with top-5 logits
  smollm2-chat.json      the model's own chat template rendered for one question, 32 greedy tokens
  synth-<arch>.json      for tiny models written by `tandem synth` (llama, qwen2, qwen3): the
                         exact synth command and the file's SHA-256, a prompt's ids, the top-10
                         logits after the prompt and at each of 16 greedy steps. These check
                         that llama.cpp loads our synthetic files and computes what we compute.
                         --only-synth writes just these (no SmolLM2 model needed).
"""

import argparse
import contextlib
import ctypes
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile

import numpy as np

import llama_cpp
import llama_cpp.llama_cpp as llama_bindings
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

N_CTX = 512
N_THREADS = 2
N_BATCH = 512
SEED = 1234
N_GENERATE = 32
TOP_K_LOGITS = 5

GREEDY_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
CHAT_QUESTION = "What is the capital of France?"

# Synthetic models: small enough that tests re-synthesize them in about a second each, and
# shaped so that no tensor falls back to another type (K-quants need rows of 256). One per
# architecture, each with its own type; qwen2 is tied (no output.weight) as Qwen2.5's small
# models are. Options are the `tandem synth` flags, in order; the vocab path is relative to
# the repo root. The test re-parses exactly these flags.
SYNTH_N_CTX = 256
SYNTH_N_GENERATE = 16
SYNTH_TOP_K = 10
SYNTH_MODELS = [
    {"arch": "llama", "prompt": "Once upon a time, there was a little",
     "args": ["--arch", "llama", "--dim", "256", "--layers", "2", "--heads", "4", "--kv-heads", "2",
              "--ffn", "512", "--context", str(SYNTH_N_CTX),
              "--vocab-from", "tests/data/vocab/ggml-vocab-llama-spm.gguf", "--type", "q4_k",
              "--seed", "101"]},
    {"arch": "qwen2", "prompt": "def fibonacci(n):\n    if n < 2:\n        return n",
     "args": ["--arch", "qwen2", "--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2",
              "--ffn", "128", "--context", str(SYNTH_N_CTX), "--tied",
              "--vocab-from", "tests/data/vocab/ggml-vocab-qwen2.5-coder.gguf", "--type", "q8_0",
              "--seed", "102"]},
    {"arch": "qwen3", "prompt": "def fibonacci(n):\n    if n < 2:\n        return n",
     "args": ["--arch", "qwen3", "--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2",
              "--head-dim", "32", "--ffn", "128", "--context", str(SYNTH_N_CTX),
              "--vocab-from", "tests/data/vocab/ggml-vocab-qwen2.5-coder.gguf", "--type", "q5_0",
              "--seed", "103"]},
]


def llama_cpp_build_info():
    """Version strings that identify the llama.cpp build inside llama-cpp-python."""
    info = {"llama_cpp_python": llama_cpp.__version__}
    # llama_print_system_info lists the CPU features ggml was compiled with (AVX2, F16C ...).
    try:
        info["system_info"] = llama_cpp.llama_print_system_info().decode().strip()
    except Exception:  # older/newer bindings may lack it; the version pin still identifies it
        pass
    # ggml records the llama.cpp commit it was built from (ggml_commit); llama-cpp-python
    # vendors llama.cpp as a submodule, so this identifies the exact engine.
    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    try:
        ggml = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"))
        for sym in ("ggml_commit", "ggml_version"):
            fn = getattr(ggml, sym)
            fn.restype = ctypes.c_char_p
            info[sym] = fn().decode()
    except (OSError, AttributeError):
        pass  # older builds lack these symbols; the pinned version still identifies them
    return info


def read_vocab_inputs(path):
    """Test strings of a llama.cpp ggml-vocab-*.gguf.inp file (separator-terminated records)."""
    with open(path, "rb") as f:
        text = f.read().decode("utf-8")
    records = text.split("\n__ggml_vocab_test__\n")
    if records and records[-1] == "":
        records.pop()  # the file ends with a separator
    return records


def top_k(logits, k):
    idx = np.argsort(-logits, kind="stable")[:k]
    return [(int(i), float(logits[i])) for i in idx]


def piece(llm, tok):
    return llm.detokenize([tok]).decode("utf-8", errors="replace")


def context_settings(llm):
    cp = llm.context_params
    settings = {
        "n_ctx": llm.n_ctx(),
        "n_batch": cp.n_batch,
        "n_ubatch": cp.n_ubatch,
        "n_threads": cp.n_threads,
        "n_threads_batch": cp.n_threads_batch,
        "seed": SEED,
        # ggml_type 1 is F16: llama.cpp's default KV cache element type.
        "type_k": int(cp.type_k),
        "type_v": int(cp.type_v),
        "logits_all": True,
    }
    for name in ("flash_attn", "flash_attn_type"):
        if hasattr(cp, name):
            settings[name] = int(getattr(cp, name))
    return settings


def greedy(llm, prompt_ids, n_generate=N_GENERATE, k=TOP_K_LOGITS, stop_at_eos=True):
    """Greedy decoding by explicit argmax over llama.cpp's logits, one token per step.

    An explicit loop (rather than a sampler chain) keeps the fixture independent of sampler
    defaults; ties are broken towards the lower id (numpy argmax), as tandem's greedy does.
    """
    llm.reset()
    llm.eval(prompt_ids)
    n_vocab = llm.n_vocab()
    scores = np.asarray(llm.scores[: llm.n_tokens, :n_vocab], dtype=np.float32)
    prompt_top = [top_k(scores[i], k) for i in range(len(prompt_ids))]
    generated, steps_top = [], []
    logits = scores[len(prompt_ids) - 1]
    eos = llm.token_eos()
    for _ in range(n_generate):
        steps_top.append(top_k(logits, k))
        tok = int(np.argmax(logits))
        generated.append(tok)
        if stop_at_eos and tok == eos:
            break
        llm.eval([tok])
        logits = np.asarray(llm.scores[llm.n_tokens - 1, :n_vocab], dtype=np.float32)
    first_logits_head = [float(x) for x in scores[len(prompt_ids) - 1][:10]]
    return generated, prompt_top, steps_top, first_logits_head


def with_pieces(llm, pairs):
    return [[tok, round(logit, 6), piece(llm, tok)] for tok, logit in pairs]


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {path}", file=sys.stderr)


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def without_repacked_weights():
    """Loads models with use_extra_bufts = false, i.e. without llama.cpp's CPU "repack" buffers.

    On x86 llama.cpp repacks Q4_0, Q4_K and IQ4_NL matrices into interleaved 8x8 blocks and
    multiplies them with GEMM kernels whose float rounding differs from its plain dot products
    by an ulp or so. Behind 8-bit activation quantization such an ulp can flip a rounding, and
    the flip shows up as a logit change of ~1% (on synth-llama, Q4_K: 2.3e-2 between llama.cpp's
    own two paths from prompt position 6 on). tandem follows the plain dot products, so the
    fixture uses them; llama-cpp-python has no argument for this, hence the patched defaults.
    """
    original = llama_bindings.llama_model_default_params

    def params():
        p = original()
        p.use_extra_bufts = False
        return p

    llama_bindings.llama_model_default_params = params
    try:
        yield
    finally:
        llama_bindings.llama_model_default_params = original


def write_synth_fixtures(args, produced_by):
    """synth-<arch>.json: llama.cpp's view of models written by our `tandem synth`.

    If llama.cpp refuses a file, that is a bug in tandem's synth (the file claims to be in
    llama.cpp's layout), so the error propagates and no fixture is written for it.
    """
    tandem = os.path.abspath(args.tandem)
    if not os.access(tandem, os.X_OK):
        sys.exit(f"make_reference: tandem binary not found: {tandem} (build it, or give --tandem)")
    with tempfile.TemporaryDirectory(prefix="tandem-synth-ref-") as tmp:
        for spec in SYNTH_MODELS:
            arch = spec["arch"]
            file_name = f"synth-{arch}.gguf"
            path = os.path.join(tmp, file_name)
            # Run from the repo root so the recorded relative vocab path is the one used.
            argv = [tandem, "synth", *spec["args"], path]
            subprocess.run(argv, cwd=args.repo_root, check=True)
            command = shlex.join(["build/bin/tandem", "synth", *spec["args"], file_name])

            with without_repacked_weights():
                llm = llama_cpp.Llama(model_path=path, n_ctx=SYNTH_N_CTX, n_batch=N_BATCH,
                                      n_threads=N_THREADS, n_threads_batch=N_THREADS, seed=SEED,
                                      logits_all=True, verbose=False, flash_attn=True)
            assert not llm.model_params.use_extra_bufts
            prompt = spec["prompt"]
            # add_bos=True applies the vocabulary's own BOS rule (llama yes, qwen no).
            prompt_ids = [int(t) for t in llm.tokenize(prompt.encode("utf-8"), add_bos=True,
                                                       special=False)]
            # No EOS stop: exactly SYNTH_N_GENERATE tokens, whatever a random model emits.
            gen, _, steps_top, _ = greedy(llm, prompt_ids, n_generate=SYNTH_N_GENERATE,
                                          k=SYNTH_TOP_K, stop_at_eos=False)
            write_json(os.path.join(args.out, f"synth-{arch}.json"), {
                "model": file_name,
                "model_sha256": file_sha256(path),
                "model_bytes": os.path.getsize(path),
                "synth_command": command,
                "synth_args": spec["args"],
                "produced_by": produced_by,
                "context": {**context_settings(llm), "use_extra_bufts": False},
                "sampling": "greedy: argmax of the logits at each step; no EOS stop",
                "prompt": prompt,
                "prompt_ids": prompt_ids,
                "n_generate": SYNTH_N_GENERATE,
                "generated_ids": gen,
                "notes": "top10 are the logits after the whole prompt (predicting generated_ids[0]); "
                         "generated_steps_top10[j] are the logits that chose generated_ids[j] "
                         "(so generated_steps_top10[0] == top10). use_extra_bufts false: "
                         "llama.cpp's plain CPU dot products, not its repacked Q4_0/Q4_K GEMMs "
                         "(see without_repacked_weights in scripts/make_reference.py)",
                "top10": [[tok, round(logit, 6)] for tok, logit in steps_top[0]],
                "generated_steps_top10": [[[tok, round(logit, 6)] for tok, logit in step]
                                          for step in steps_top],
            })
            del llm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="SmolLM2 GGUF (not needed with --only-synth)")
    ap.add_argument("--inputs", help="ggml-vocab-*.gguf.inp with test strings")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repo-root", default=os.path.join(os.path.dirname(__file__), ".."),
                    help="paths recorded in the fixtures are relative to this")
    ap.add_argument("--command", default="scripts/make-reference")
    ap.add_argument("--tandem", default=os.environ.get("TANDEM_BIN"),
                    help="tandem binary for the synth fixtures (default $TANDEM_BIN or "
                         "<repo-root>/build/bin/tandem)")
    ap.add_argument("--only-synth", action="store_true",
                    help="write only the synth-<arch>.json fixtures")
    args = ap.parse_args()
    if args.tandem is None:
        args.tandem = os.path.join(args.repo_root, "build", "bin", "tandem")
    if not args.only_synth and (args.model is None or args.inputs is None):
        ap.error("--model and --inputs are required unless --only-synth is given")

    produced_by = {
        "command": args.command,
        **llama_cpp_build_info(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    if not args.only_synth:
        write_smollm2_fixtures(args, produced_by)
    write_synth_fixtures(args, produced_by)


def write_smollm2_fixtures(args, produced_by):
    model_name = os.path.basename(args.model)
    with open(args.model, "rb") as f:
        model_sha256 = hashlib.sha256(f.read()).hexdigest()

    # Tokenizer fixture: vocab only, no BOS, special tokens treated as plain text.
    vocab = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    inputs = read_vocab_inputs(args.inputs)
    cases = []
    for text in inputs:
        ids = vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        cases.append({"text": text, "ids": [int(t) for t in ids]})
    write_json(os.path.join(args.out, "smollm2-tokenize.json"), {
        "model": model_name,
        "model_sha256": model_sha256,
        "produced_by": produced_by,
        "inputs": os.path.relpath(args.inputs, args.repo_root),
        "add_bos": False,
        "parse_special": False,
        "cases": cases,
    })
    metadata = dict(vocab.metadata)
    del vocab

    llm = llama_cpp.Llama(model_path=args.model, n_ctx=N_CTX, n_batch=N_BATCH,
                          n_threads=N_THREADS, n_threads_batch=N_THREADS, seed=SEED,
                          logits_all=True, verbose=False,
                          # Newer llama.cpp enables flash attention on the CPU by default
                          # (flash_attn auto), as in the stories260K fixture; this pinned
                          # version defaults to off, so ask for it to compare like with like.
                          flash_attn=True)
    settings = context_settings(llm)
    add_bos = metadata.get("tokenizer.ggml.add_bos_token", "true") == "true"

    runs = []
    for prompt in GREEDY_PROMPTS:
        # add_special=True applies the model's own BOS rule (tokenizer.ggml.add_bos_token).
        prompt_ids = [int(t) for t in llm.tokenize(prompt.encode("utf-8"), add_bos=True,
                                                   special=False)]
        gen, prompt_top, steps_top, head = greedy(llm, prompt_ids)
        runs.append({
            "prompt": prompt,
            "prompt_ids": prompt_ids,
            "generated_ids": gen,
            "generated_text": llm.detokenize(gen).decode("utf-8", errors="replace"),
            "first_position_logits_ids_0_to_9": [round(x, 6) for x in head],
            "first_position_top5": with_pieces(llm, steps_top[0]),
            "prompt_positions_top5": [with_pieces(llm, p) for p in prompt_top],
            "generated_steps_top5": [with_pieces(llm, s) for s in steps_top],
        })
    write_json(os.path.join(args.out, "smollm2-greedy.json"), {
        "model": model_name,
        "model_sha256": model_sha256,
        "produced_by": produced_by,
        "context": settings,
        "sampling": "greedy: argmax of the logits at each step (temperature 0 / top-k 1); "
                    "stops early only at EOS",
        "add_bos_token": add_bos,
        "n_generate": N_GENERATE,
        "notes": "first_position_* are the logits after the whole prompt (predicting the first "
                 "generated token); prompt_positions_top5[i] are the logits at prompt position i; "
                 "generated_steps_top5[j] are the logits that chose generated_ids[j]",
        "runs": runs,
    })

    # Chat fixture: the model's own Jinja template, rendered the way HF / llama-cpp-python do.
    template = metadata["tokenizer.chat_template"]
    eos_id, bos_id = llm.token_eos(), llm.token_bos()
    formatter = Jinja2ChatFormatter(template=template,
                                    eos_token=piece(llm, eos_id),
                                    bos_token=piece(llm, bos_id),
                                    add_generation_prompt=True)
    messages = [{"role": "user", "content": CHAT_QUESTION}]
    rendered = formatter(messages=messages).prompt
    prompt_ids = [int(t) for t in llm.tokenize(rendered.encode("utf-8"), add_bos=True,
                                               special=True)]
    gen, _, steps_top, _ = greedy(llm, prompt_ids)
    write_json(os.path.join(args.out, "smollm2-chat.json"), {
        "model": model_name,
        "model_sha256": model_sha256,
        "produced_by": produced_by,
        "context": settings,
        "sampling": "greedy: argmax of the logits at each step; stops early only at EOS",
        "chat_template": template,
        "messages": messages,
        "add_generation_prompt": True,
        "prompt": rendered,
        "tokenize": {"add_special": True, "parse_special": True, "add_bos_token": add_bos},
        "prompt_ids": prompt_ids,
        "eos_id": int(eos_id),
        "n_generate": N_GENERATE,
        "generated_ids": gen,
        "generated_text": llm.detokenize(gen).decode("utf-8", errors="replace"),
        "first_position_top5": with_pieces(llm, steps_top[0]),
    })


if __name__ == "__main__":
    main()
