#!/usr/bin/env python3
"""A small LLM inference server for gpusnap's benchmark.

A Llama-architecture model with seeded random bf16 weights kept in a
safetensors file and loaded from it at every start, so that a cold start pays
what a real one pays: Python and library imports, CUDA init, reading the
weights and copying them to the GPU, building the model, a warm-up generate.
Two engines (--engine):

    static  (default) as a production engine starts: a hand-written Llama
            forward over the loaded tensors (static_engine.py), a KV-cache
            pool taking --gpu-memory-utilization of the GPU's memory (or
            --kv-cache-gib), marked as scratch when gpusnap's gpushare shim
            offers it, and decode steps replayed from a CUDA graph captured
            at start; prefill eager
    eager   transformers' LlamaForCausalLM and its generate(), nothing else

It then answers greedy generations of one fixed prompt (fixed token ids, no
tokenizer) over HTTP on 127.0.0.1, one request per connection:

    GET  /health    200 "ok" (the port is only opened once the model is warm)
    GET  /info      the server's phase timestamps, model, identity
    POST /generate  {"tokens": [...], "seconds": t, ...}   (GET works too;
                    optional ?max_new_tokens=N or a JSON body of the same;
                    with ?stream=1 or {"stream": true}: one {"token": id} line
                    per token as it is made, then that answer as the last line)

It prints one line per phase of its start on stdout: `PHASE <name> <unix time>`.

Built to be checkpointed: a single thread serves, no connection outlives its
request (HTTP/1.0, Connection: close), nothing talks to the outside.

    python3 server.py --model 8b --weights-dir /tmp/gpusnap-weights --prepare   # write the weights once
    python3 server.py --model 8b --weights-dir /tmp/gpusnap-weights --port 18080
    python3 server.py --self-test --weights-dir DIR    # GPU: the static engine's checks, PASS/FAIL

Only the standard library is imported at module level: argument parsing, the
prompt and the HTTP protocol work (and are tested) without torch. `--backend
fake` serves the same protocol from a CPU-only stand-in (a block of seeded
bytes as "weights", tokens derived from a hash of them) so the benchmark's
orchestration can be tested with CRIU on a machine without a GPU.
"""
import argparse
import hashlib
import http.server
import json
import os
import random
import socketserver
import sys
import time
import urllib.parse

T_START = time.time()

# Model shapes. 1b is Llama-3.2-1B's shape and 8b Llama-3.1-8B's; both with
# untied embeddings (an lm_head of its own), bf16, random weights.
PRESETS = {
    "tiny": dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=512, vocab_size=32000),
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=8192, vocab_size=128256),
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=14336, vocab_size=128256),
}
WEIGHT_SEED = 1234
WEIGHT_STD = 0.02
PROMPT_SEED = 4321
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MARKER_FILE = "gpusnap-bench.json"   # written last: its presence means the directory is complete
FAKE_WEIGHTS_FILE = "fake-weights.bin"

ENGINES = ("static", "eager")
DEFAULT_ENGINE = "static"
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_MAX_SEQ_LEN = 4096
RMS_NORM_EPS = 1e-5
SELF_TEST_MODELS = "tiny,1b"
SELF_TEST_KV_GIB = 1.0
# The gpushare shim's export that marks device memory as scratch (its bytes
# need not survive a checkpoint: not saved, mapped again empty on restore):
#   int NAME(uint64_t device_ptr, size_t bytes), 0 on success.
SCRATCH_SYMBOL = "gpusnap_gpushare_mark_scratch"


def phase(name, t):
    """One line per phase of the start, for the benchmark to read."""
    print(f"PHASE {name} {t:.6f}", flush=True)


def info(**kw):
    print("INFO " + json.dumps(kw, sort_keys=True), flush=True)


def param_count(p):
    """Parameters of a preset (untied embeddings, no biases)."""
    h, layers, heads, kv, inter, vocab = (p["hidden_size"], p["num_hidden_layers"], p["num_attention_heads"],
                                          p["num_key_value_heads"], p["intermediate_size"], p["vocab_size"])
    head_dim = h // heads
    attn = h * h * 2 + h * kv * head_dim * 2          # q, o; k, v
    mlp = 3 * h * inter                                # gate, up, down
    per_layer = attn + mlp + 2 * h                     # two RMSNorms
    return 2 * vocab * h + layers * per_layer + h      # embed, lm_head, final norm


def prompt_ids(n, vocab, seed=PROMPT_SEED):
    """The fixed prompt: n token ids from a seeded generator (no tokenizer)."""
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def kv_slot_bytes(p, max_seq_len, elem=2):
    """Bytes of one sequence of max_seq_len tokens in the KV cache, all layers, k and v."""
    head_dim = p["hidden_size"] // p["num_attention_heads"]
    return p["num_hidden_layers"] * 2 * p["num_key_value_heads"] * max_seq_len * head_dim * elem


def kv_budget_bytes(total, free, utilization, kv_cache_gib=None):
    """The KV-cache pool's budget, as a serving engine sizes it: kv_cache_gib
    if given, else utilization × the GPU's memory minus what is in use
    already (weights, context, other processes)."""
    if kv_cache_gib is not None:
        return int(kv_cache_gib * (1 << 30))
    return int(utilization * total) - (total - free)


def kv_plan(p, max_seq_len, budget):
    """How many max_seq_len sequences (slots) the budget holds, and the pool's
    shape. ValueError when not even one fits."""
    per = kv_slot_bytes(p, max_seq_len)
    slots = budget // per if budget > 0 else 0
    if slots < 1:
        raise ValueError(f"the KV-cache budget ({budget / (1 << 30):.2f} GiB) holds no sequence of "
                         f"{max_seq_len} tokens ({per / (1 << 30):.3f} GiB): lower --max-seq-len, raise "
                         "--gpu-memory-utilization or pass --kv-cache-gib")
    head_dim = p["hidden_size"] // p["num_attention_heads"]
    return {"slots": slots, "slot_bytes": per, "bytes": slots * per, "tokens": slots * max_seq_len,
            "shape": [p["num_hidden_layers"], 2, slots, p["num_key_value_heads"], max_seq_len, head_dim]}


def mark_scratch(regions, lib=None):
    """Marks device memory regions [(ptr, bytes)] as scratch through the
    gpushare shim's SCRATCH_SYMBOL, when the process has it (the shim
    preloaded). Returns "marked", "absent" (no shim, or one without the
    function: nothing done) or "failed: ..." (it refused one); never raises."""
    import ctypes
    try:
        fn = getattr(lib if lib is not None else ctypes.CDLL(None), SCRATCH_SYMBOL)
    except (OSError, AttributeError):
        return "absent"
    try:
        fn.argtypes = [ctypes.c_uint64, ctypes.c_size_t]
        fn.restype = ctypes.c_int
        for ptr, n in regions:
            rc = fn(ptr, n)
            if rc != 0:
                return f"failed: {SCRATCH_SYMBOL}({ptr:#x}, {n}) returned {rc}"
    except Exception as e:  # noqa: BLE001 - reported, never fatal
        return f"failed: {e!r}"
    return "marked"


def weights_spec(args):
    """What the weight files must have been made from; stored in the marker."""
    spec = {"model": args.model, "seed": args.weight_seed, "std": WEIGHT_STD, "dtype": "bfloat16", "tied": False,
            "format": 1}
    if args.backend == "fake":
        spec = {"model": "fake", "seed": args.weight_seed, "fake_mb": args.fake_mb, "format": 1}
    else:
        spec.update(PRESETS[args.model])
    return spec


def model_dir(args):
    sub = f"fake-{args.fake_mb}mb" if args.backend == "fake" else args.model
    if args.weight_seed != WEIGHT_SEED:
        sub += f"-seed{args.weight_seed}"
    return os.path.join(args.weights_dir, sub)


def weights_present(args):
    try:
        with open(os.path.join(model_dir(args), MARKER_FILE)) as f:
            return json.load(f) == weights_spec(args)
    except (OSError, ValueError):
        return False


def write_atomically(path, write):
    tmp = f"{path}.tmp-{os.getpid()}"
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_text(path, text):
    with open(path, "w") as f:
        f.write(text)


def write_marker(args):
    d = model_dir(args)

    write_atomically(os.path.join(d, MARKER_FILE),
                     lambda p: write_text(p, json.dumps(weights_spec(args), indent=1, sort_keys=True)))


# --------------------------------------------------------------------------
# Backends: each has prepare(args), load(args) -> model, generate(model, ids, n)


class FakeBackend:
    """CPU stand-in with the torch backend's shape: a weights file read at
    start, state in memory, deterministic tokens that depend on that state."""

    name = "fake"

    def __init__(self, args):
        self.args = args
        self.vocab = PRESETS[args.model]["vocab_size"]

    def imports(self):
        pass

    def prepare(self):
        d = model_dir(self.args)
        os.makedirs(d, exist_ok=True)
        rng = random.Random(self.args.weight_seed)
        n = self.args.fake_mb << 20

        def w(p):
            with open(p, "wb") as f:
                f.write(rng.randbytes(n))

        write_atomically(os.path.join(d, FAKE_WEIGHTS_FILE), w)
        write_marker(self.args)

    def describe(self):
        return {"backend": "fake", "fake_mb": self.args.fake_mb}

    def init_device(self):
        pass

    def load(self):
        with open(os.path.join(model_dir(self.args), FAKE_WEIGHTS_FILE), "rb") as f:
            self.weights = bytearray(f.read())
        return self.weights

    def build(self, weights):
        return weights

    def generate(self, model, ids, n, on_token=None):
        state = hashlib.sha256(bytes(model)).digest()
        state = hashlib.sha256(state + json.dumps(ids).encode()).digest()
        out = []
        for _ in range(n):
            state = hashlib.sha256(state).digest()
            out.append(int.from_bytes(state[:4], "little") % self.vocab)
            if on_token:
                on_token(out[-1])
        return out

    def pinned(self, mb):
        return None

    def release(self):
        pass

    # The static engine's steps: the phases are marked, nothing is done (the
    # stand-in has no GPU); the flag is accepted so tests cover both rows.
    def alloc_kv(self, model):
        pass

    def capture(self, model):
        pass

    def token_limit(self):
        return None

    def engine_info(self):
        return {"engine": self.args.engine, "kv_pool_bytes": 0, "kv_scratch": "none", "kv_scratch_marked": False,
                "cuda_graphs": 0}

    def pinned_check(self, buf):
        return None


class TorchBackend:
    name = "torch"

    def __init__(self, args):
        self.args = args
        self.preset = PRESETS[args.model]
        self.kv = {}            # the static engine's pool: what /info reports
        self.graphs = 0
        self.capture_s = None

    def imports(self):
        global torch, transformers, safetensors_torch, static_engine
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import safetensors.torch as safetensors_torch  # noqa: F401
        # transformers imports its model code lazily: pay for it here, not in a later phase.
        from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM  # noqa: F401
        here = os.path.dirname(os.path.abspath(__file__))
        if here not in sys.path:
            sys.path.insert(0, here)
        import static_engine  # noqa: F401
        self.how = None

    def config(self):
        from transformers import LlamaConfig
        cfg = LlamaConfig(**self.preset, max_position_embeddings=8192, rms_norm_eps=1e-5,
                          tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=0,
                          use_cache=True)
        try:
            cfg._attn_implementation = self.args.attn
        except Exception:  # a transformers without the setter: keep its default
            pass
        return cfg

    def describe(self):
        d = {"backend": "torch", "engine": self.args.engine, "torch": torch.__version__,
             "transformers": transformers.__version__, "params": param_count(self.preset),
             "weights_bytes": 2 * param_count(self.preset)}
        if torch.cuda.is_available() and self.args.device.startswith("cuda"):
            d["gpu"] = torch.cuda.get_device_name(torch.device(self.args.device))
        return d

    def meta_model(self, cfg):
        from transformers import LlamaForCausalLM
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device("meta"):
                return LlamaForCausalLM(cfg)
        finally:
            torch.set_default_dtype(old)

    def prepare(self):
        """Seeded random weights (normal, std 0.02; norms 1), written once."""
        d = model_dir(self.args)
        os.makedirs(d, exist_ok=True)
        cfg = self.config()
        shapes = [(n, tuple(p.shape)) for n, p in self.meta_model(cfg).named_parameters()]
        torch.manual_seed(self.args.weight_seed)
        gen_dev = self.args.device if torch.cuda.is_available() and self.args.device.startswith("cuda") else "cpu"
        g = torch.Generator(device=gen_dev)
        g.manual_seed(self.args.weight_seed)
        sd = {}
        for name, shape in shapes:
            if name.endswith("norm.weight"):
                t = torch.ones(shape, dtype=torch.bfloat16)
            else:
                t = torch.empty(shape, dtype=torch.bfloat16, device=gen_dev).normal_(0.0, WEIGHT_STD, generator=g)
            sd[name] = t.cpu().contiguous()
        write_atomically(os.path.join(d, WEIGHTS_FILE),
                         lambda p: safetensors_torch.save_file(sd, p, metadata={"format": "pt"}))
        write_atomically(os.path.join(d, CONFIG_FILE), lambda p: write_text(p, cfg.to_json_string()))
        write_marker(self.args)

    def init_device(self):
        if self.args.device.startswith("cuda"):
            torch.cuda.init()
            torch.empty(1, device=self.args.device)  # creates the context

    def load(self):
        return safetensors_torch.load_file(os.path.join(model_dir(self.args), WEIGHTS_FILE), device=self.args.device)

    def build(self, sd):
        return self.build_static(sd) if self.args.engine == "static" else self.build_eager(sd)

    def build_static(self, sd):
        """The static engine over the loaded tensors as they are (no copy)."""
        cfg = self.config()
        eng = static_engine.StaticLlama(sd, self.preset, self.args.device, self.args.max_seq_len,
                                        static_engine.rope_theta(cfg), getattr(cfg, "rms_norm_eps", RMS_NORM_EPS))
        self.how = "static"
        info(build="static")
        return eng

    def alloc_kv(self, eng):
        """The KV-cache pool, sized as a serving engine sizes it, in one
        allocation; marked as scratch where the gpushare shim offers it."""
        dev = torch.device(self.args.device)
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()   # what the load left cached is free memory, not in use
        free, total = torch.cuda.mem_get_info(dev)
        budget = kv_budget_bytes(total, free, self.args.gpu_memory_utilization, self.args.kv_cache_gib)
        plan = kv_plan(self.preset, self.args.max_seq_len, budget)
        buf = eng.alloc_pool(plan["slots"])
        nbytes = buf.numel() * buf.element_size()
        torch.cuda.synchronize(dev)
        status = mark_scratch([(buf.data_ptr(), nbytes)])
        self.kv = {"kv_pool_bytes": nbytes, "kv_pool_slots": plan["slots"], "kv_pool_tokens": plan["tokens"],
                   "kv_pool_shape": plan["shape"], "kv_budget_bytes": budget, "kv_pool_ptr": f"{buf.data_ptr():#x}",
                   "gpu_total_bytes": total, "gpu_free_before_kv_bytes": free, "kv_scratch": status,
                   "kv_scratch_marked": status == "marked"}
        info(**self.kv)
        print(f"KV-cache pool: {nbytes / (1 << 30):.2f} GiB, {plan['slots']} x {self.args.max_seq_len} tokens; "
              f"scratch: {status}", flush=True)

    def compile(self, eng):
        """The prompt's forward through torch.compile (inductor, Triton kernels),
        compiled now on a prompt of the served length: what a cold start pays
        unless TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR already hold it."""
        t = time.time()
        eng.prefill = torch.compile(eng.prefill, dynamic=False)
        vocab = self.preset["vocab_size"]
        ids = torch.tensor(prompt_ids(self.args.prompt_len, vocab), device=torch.device(self.args.device))
        eng.prefill(ids)
        torch.cuda.synchronize()
        self.compile_s = time.time() - t
        info(compile_s=round(self.compile_s, 6), inductor_cache=os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""),
             triton_cache=os.environ.get("TRITON_CACHE_DIR", ""))

    def capture(self, eng):
        t = time.time()
        eng.capture()
        self.capture_s = time.time() - t
        self.graphs = 1
        info(cuda_graphs=self.graphs, capture_s=round(self.capture_s, 6))

    def token_limit(self):
        return self.args.max_seq_len - self.args.prompt_len if self.args.engine == "static" else None

    def engine_info(self):
        d = {"engine": self.args.engine, "cuda_graphs": self.graphs}
        if self.args.engine == "static":
            d.update(self.kv, max_seq_len=self.args.max_seq_len, capture_s=self.capture_s)
        else:
            d.update(kv_pool_bytes=0, kv_scratch="none", kv_scratch_marked=False)
        return d

    def build_eager(self, sd):
        """The model around the loaded tensors: built on the meta device and
        given the tensors as they are (no second copy, no random init). Falls
        back to a plain build + copy if this transformers version leaves
        anything on meta (checked, and by a forward pass of two tokens)."""
        cfg = self.config()
        dev = torch.device(self.args.device)
        how = "meta"
        try:
            model = self.meta_model(cfg)
            model.load_state_dict(sd, strict=True, assign=True)
            self._rebuild_meta_buffers(model, cfg, dev)
            left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
            if left:
                raise RuntimeError(f"left on meta: {left[:3]}")
            model.eval()
            with torch.inference_mode():
                model(input_ids=torch.tensor([[1, 2]], dtype=torch.long, device=dev))
        except Exception as e:  # noqa: BLE001
            print(f"meta-device build failed ({e!r}); building plainly", flush=True)
            model = None
            from transformers import LlamaForCausalLM
            how = "plain"
            old = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)
            try:
                with dev:
                    model = LlamaForCausalLM(cfg)
            finally:
                torch.set_default_dtype(old)
            model.load_state_dict(sd, strict=True)
        self.how = how
        info(build=how)
        model.eval()
        return model

    def release(self):
        """After a plain build the loaded tensors were copied and dropped: give
        their GPU memory back rather than keep it cached (and checkpointed)."""
        if self.how == "plain" and torch.cuda.is_available():
            import gc
            gc.collect()
            torch.cuda.empty_cache()

    @staticmethod
    def _rebuild_meta_buffers(model, cfg, dev):
        """Non-persistent buffers (the rotary embedding's inv_freq) are not in
        the state dict: re-create the modules that own them on the device."""
        for mod_name, mod in list(model.named_modules()):
            if not any(b.is_meta for b in mod.buffers(recurse=False)):
                continue
            if not type(mod).__name__.endswith("RotaryEmbedding"):
                raise RuntimeError(f"module {mod_name} ({type(mod).__name__}) has meta buffers")
            fresh = type(mod)(config=getattr(mod, "config", cfg), device=dev)
            parent_name, _, attr = mod_name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, attr, fresh)

    def generate(self, model, ids, n, on_token=None):
        if self.args.engine == "static":
            return model.generate(ids, n, on_token)
        from transformers import GenerationConfig
        from transformers.generation.streamers import BaseStreamer

        class Streamer(BaseStreamer):
            """Hands each new token on as generate() makes it (its first put is the prompt)."""

            def __init__(self):
                self.prompt_seen = False

            def put(self, value):
                if not self.prompt_seen:
                    self.prompt_seen = True
                    return
                for t in value.reshape(-1).tolist():
                    on_token(t)

            def end(self):
                pass

        gc = GenerationConfig(max_new_tokens=n, do_sample=False, num_beams=1, pad_token_id=0,
                              eos_token_id=None, bos_token_id=None)
        dev = torch.device(self.args.device)
        x = torch.tensor([ids], dtype=torch.long, device=dev)
        with torch.inference_mode():
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=gc,
                                 streamer=Streamer() if on_token else None)
        return out[0, len(ids):].tolist()

    def pinned(self, mb):
        """A pinned host buffer filled with a seeded pattern (checkpoint and
        restore must bring pinned memory back, mapped and intact)."""
        if mb <= 0:
            return None
        n = mb << 20
        buf = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        g = torch.Generator(device=self.args.device)
        g.manual_seed(WEIGHT_SEED + 1)
        buf.copy_(torch.randint(0, 256, (n,), dtype=torch.uint8, device=self.args.device, generator=g))
        torch.cuda.synchronize()
        return buf

    def pinned_check(self, buf):
        """Checksums of the pinned buffer read by the CPU (a page per 4 KiB)
        and by the GPU (the whole buffer, copied host to device)."""
        if buf is None:
            return None
        cpu = int(buf[::4096].sum(dtype=torch.int64))
        gpu = int(buf.to(self.args.device, non_blocking=True).sum(dtype=torch.int64))
        return {"cpu": cpu, "gpu": gpu}


# --------------------------------------------------------------------------
# HTTP


class Server(http.server.HTTPServer):
    """http.server's HTTPServer without its reverse DNS lookup of the host at
    bind (getfqdn can stall for seconds on a machine with no resolver)."""

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class State:
    def __init__(self, backend, model, args, phases, extra):
        self.backend, self.model, self.args = backend, model, args
        self.prompt = prompt_ids(args.prompt_len, PRESETS[args.model]["vocab_size"])
        self.phases = phases
        self.extra = extra
        self.served = 0
        self.pinned = None
        self.pinned_ref = None

    def generate(self, n, on_token=None):
        t = time.time()
        tokens = self.backend.generate(self.model, self.prompt, n, on_token)
        seconds = time.time() - t
        self.served += 1
        ans = {"tokens": tokens, "seconds": round(seconds, 6), "served": self.served, "pid": os.getpid(),
               "started": self.phases.get("start"), "model": self.args.model, "backend": self.backend.name,
               "engine": self.args.engine}
        if self.pinned is not None:
            check = self.backend.pinned_check(self.pinned)
            ans["pinned_mb"] = self.args.pinned_mb
            ans["pinned_ok"] = check == self.pinned_ref
            ans["pinned_check"] = check
        return ans

    def info(self):
        return {"phases": self.phases, "model": self.args.model, "backend": self.backend.name,
                **self.backend.engine_info(), "prompt": self.prompt, "max_new_tokens": self.args.max_new_tokens, "served": self.served,
                "pid": os.getpid(), "pinned_mb": self.args.pinned_mb, **self.extra}


def parse_max_new_tokens(path, body, default):
    """max_new_tokens from the query (?max_new_tokens=N) or a JSON body
    ({"max_new_tokens": N}); the default otherwise. ValueError if invalid."""
    q = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
    n = default
    if "max_new_tokens" in q:
        n = int(q["max_new_tokens"][0])
    if body:
        try:
            doc = json.loads(body)
        except ValueError:
            raise ValueError("body is not JSON")
        if not isinstance(doc, dict):
            raise ValueError("body is not a JSON object")
        if "max_new_tokens" in doc:
            n = doc["max_new_tokens"]
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 4096:
        raise ValueError("max_new_tokens must be an integer in 1..4096")
    return n


def wants_stream(path, body):
    """A streamed answer asked for: ?stream=1, or {"stream": true} in the body."""
    q = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
    if q.get("stream", ["0"])[0] in ("1", "true"):
        return True
    try:
        doc = json.loads(body) if body else {}
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("stream") is True


def make_handler(state):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"
        server_version = "gpusnap-bench/1"

        def reply(self, code, body, ctype="application/json"):
            data = body if isinstance(body, bytes) else (json.dumps(body) + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True

        def route(self, body):
            path = urllib.parse.urlsplit(self.path).path
            if path == "/health":
                return self.reply(200, b"ok\n", "text/plain")
            if path == "/info":
                return self.reply(200, state.info())
            if path == "/generate":
                try:
                    n = parse_max_new_tokens(self.path, body, state.args.max_new_tokens)
                except ValueError as e:
                    return self.reply(400, {"error": str(e)})
                limit = state.backend.token_limit()
                if limit is not None and n > limit:
                    return self.reply(400, {"error": f"max_new_tokens {n} exceeds {limit} (--max-seq-len "
                                                     f"{state.args.max_seq_len} less the prompt)"})
                if wants_stream(self.path, body):
                    return self.stream(n)
                try:
                    ans = state.generate(n)
                except Exception as e:  # noqa: BLE001 - report it, keep serving
                    print(f"generate failed: {e!r}", flush=True)
                    return self.reply(500, {"error": repr(e)})
                print(f"REQ generate {n} tokens {ans['seconds']:.3f} s served={ans['served']}", flush=True)
                return self.reply(200, ans)
            return self.reply(404, {"error": f"no such path {path}"})

        def stream(self, n):
            """One JSON line per token as it is made ({"token": id}), then the
            whole answer as the last line (as /generate answers unstreamed)."""
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

            def on_token(t):
                self.wfile.write((json.dumps({"token": t}) + "\n").encode())
                self.wfile.flush()

            try:
                ans = state.generate(n, on_token)
            except Exception as e:  # noqa: BLE001 - report it, keep serving
                print(f"generate failed: {e!r}", flush=True)
                self.wfile.write((json.dumps({"error": repr(e)}) + "\n").encode())
                return
            print(f"REQ generate {n} tokens {ans['seconds']:.3f} s served={ans['served']} (streamed)", flush=True)
            self.wfile.write((json.dumps(ans) + "\n").encode())

        def do_GET(self):
            self.route(b"")

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            self.route(self.rfile.read(length) if length > 0 else b"")

        def log_message(self, fmt, *a):  # requests are logged by route(); errors only here
            pass

        def log_error(self, fmt, *a):
            print("HTTP error: " + fmt % a, flush=True)

    return Handler


# --------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Llama-shaped inference server for gpusnap's benchmark")
    p.add_argument("--model", choices=sorted(PRESETS), default="8b")
    p.add_argument("--weights-dir", default="/tmp/gpusnap-weights",
                   help="where the weights live: <dir>/<model>/model.safetensors (+ config.json)")
    p.add_argument("--prepare", action="store_true", help="write the weights if missing, then exit")
    p.add_argument("--weight-seed", type=int, default=WEIGHT_SEED,
                   help="seed of the random weights: another seed, another model of the same shape "
                        "(its weights in <dir>/<model>-seed<N>)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=18080)
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 32 (64 with --self-test)")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--pinned-mb", type=int, default=0, help="also hold a pinned host buffer of this size")
    p.add_argument("--device", default="cuda")
    p.add_argument("--attn", default="sdpa", help="attention implementation (transformers' name)")
    p.add_argument("--backend", choices=["torch", "fake"], default="torch",
                   help="fake: a CPU stand-in with the same protocol, for tests without a GPU")
    p.add_argument("--fake-mb", type=int, default=64, help="fake backend: size of its 'weights'")
    p.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE,
                   help="static: KV-cache pool + CUDA-graph decode (hand-written forward); eager: transformers' "
                        "generate (the fake backend accepts both)")
    p.add_argument("--compile", action="store_true",
                   help="static engine: the prompt's forward through torch.compile (its inductor and Triton caches "
                        "where TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR say)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help=f"static: the share of the GPU's memory the server may hold, the KV-cache pool taking "
                        f"what weights and context leave of it (default {DEFAULT_GPU_MEMORY_UTILIZATION})")
    p.add_argument("--kv-cache-gib", type=float, default=None,
                   help="static: a KV-cache pool of this size instead")
    p.add_argument("--max-seq-len", type=int, default=DEFAULT_MAX_SEQ_LEN,
                   help="static: tokens of one sequence in the cache (prompt + new tokens)")
    p.add_argument("--self-test", action="store_true",
                   help="GPU: check the static engine (graph replay against the same decode run eagerly, and "
                        "against transformers) for --self-test-models; PASS/FAIL, exit 0/1")
    p.add_argument("--self-test-models", default=SELF_TEST_MODELS, help="comma-separated presets")
    a = p.parse_args(argv)
    if a.max_new_tokens is None:
        a.max_new_tokens = 64 if a.self_test else 32
    if a.port < 0 or a.port > 65535:
        p.error("--port out of range")
    if a.max_new_tokens < 1 or a.prompt_len < 1 or a.pinned_mb < 0 or a.fake_mb < 1:
        p.error("--max-new-tokens, --prompt-len and --fake-mb must be positive, --pinned-mb not negative")
    if a.gpu_memory_utilization is not None and a.kv_cache_gib is not None:
        p.error("--gpu-memory-utilization and --kv-cache-gib exclude each other")
    a.kv_sized = a.kv_cache_gib is not None or a.gpu_memory_utilization is not None   # given, not defaulted
    if a.kv_cache_gib is None and a.gpu_memory_utilization is None:
        a.gpu_memory_utilization = DEFAULT_GPU_MEMORY_UTILIZATION
    if a.gpu_memory_utilization is not None and not 0 < a.gpu_memory_utilization <= 1:
        p.error("--gpu-memory-utilization must be in (0, 1]")
    if a.kv_cache_gib is not None and not a.kv_cache_gib > 0:
        p.error("--kv-cache-gib must be positive")
    if a.max_seq_len < 16 or a.max_seq_len % 16:
        p.error("--max-seq-len must be a positive multiple of 16")
    if a.engine == "static" and a.prompt_len + a.max_new_tokens > a.max_seq_len:
        p.error("--prompt-len + --max-new-tokens exceed --max-seq-len")
    models = a.self_test_models.split(",")
    if any(m not in PRESETS for m in models):
        p.error(f"--self-test-models: each of {', '.join(sorted(PRESETS))}")
    a.self_test_models = models
    if a.self_test and a.backend != "torch":
        p.error("--self-test needs the torch backend")
    return a


def self_test(args):
    """The static engine's checks on the GPU, per model of --self-test-models:
    graph replay == the same decode run eagerly (token for token), the same
    tokens again with the pool filled with NaN first, and its logits against
    transformers' LlamaForCausalLM over the same weights. Prints
    `SELFTEST <model> <check> PASS|FAIL: detail`, then `SELFTEST PASS` or
    `SELFTEST FAIL`; returns the exit status."""
    import copy
    import gc
    import traceback
    failed = []
    for m in args.self_test_models:
        a = copy.copy(args)
        a.model, a.engine = m, "static"
        if not args.kv_sized:
            a.kv_cache_gib, a.gpu_memory_utilization = SELF_TEST_KV_GIB, None   # quick; the 8b check sizes it
        b = TorchBackend(a)
        eng = model = sd = None
        try:
            b.imports()
            if not weights_present(a):
                print(f"SELFTEST {m}: preparing the weights in {model_dir(a)}", flush=True)
                b.prepare()
            b.init_device()
            sd = b.load()
            eng = b.build_static(sd)
            b.alloc_kv(eng)
            b.capture(eng)
            model = b.build_eager(sd)
            vocab = PRESETS[m]["vocab_size"]
            res = static_engine.self_test_model(eng, model, prompt_ids(a.prompt_len, vocab), a.max_new_tokens,
                                                lambda line: print(f"SELFTEST {m} {line}", flush=True))
            for check, (ok, detail) in res.items():
                print(f"SELFTEST {m} {check} {'PASS' if ok else 'FAIL'}: {detail}", flush=True)
                if not ok:
                    failed.append(f"{m} {check}")
            print(f"SELFTEST {m} {'PASS' if not any(f.startswith(m + ' ') for f in failed) else 'FAIL'} "
                  f"(capture {b.capture_s:.3f} s, pool {b.kv['kv_pool_bytes'] / (1 << 30):.2f} GiB, "
                  f"scratch {b.kv['kv_scratch']})", flush=True)
        except Exception:  # noqa: BLE001 - reported as a failure of this model
            traceback.print_exc()
            print(f"SELFTEST {m} FAIL: an exception (above)", flush=True)
            failed.append(f"{m} exception")
        finally:
            del eng, model, sd
            gc.collect()
            if "torch" in globals() and torch.cuda.is_available():
                torch.cuda.empty_cache()
    print("SELFTEST " + ("PASS" if not failed else "FAIL: " + ", ".join(failed)), flush=True)
    return 0 if not failed else 1


def main(argv=None):
    args = parse_args(argv)
    phases = {}

    def mark(name):
        phases[name] = T_START if name == "start" else time.time()
        phase(name, phases[name])

    mark("start")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.self_test:
        return self_test(args)
    backend = (FakeBackend if args.backend == "fake" else TorchBackend)(args)
    backend.imports()
    mark("imports")
    if args.prepare or not weights_present(args):
        if not args.prepare:
            print(f"weights missing in {model_dir(args)}: preparing them (not part of a real cold start)",
                  flush=True)
        if not weights_present(args):
            backend.prepare()
        info(weights_dir=model_dir(args), **backend.describe())
        mark("prepared")
        if args.prepare:
            return 0
    backend.init_device()
    mark("device")
    sd = backend.load()
    mark("weights")
    model = backend.build(sd)
    del sd
    backend.release()
    mark("model")
    if args.engine == "static":
        backend.alloc_kv(model)
        mark("kvcache")
        if args.compile and hasattr(backend, "compile"):   # the fake backend has nothing to compile
            backend.compile(model)
            mark("compile")
        backend.capture(model)
        mark("capture")
    state = State(backend, model, args, phases, {})
    state.pinned = backend.pinned(args.pinned_mb)
    state.pinned_ref = backend.pinned_check(state.pinned)
    if state.pinned is not None:
        mark("pinned")
    warm = backend.generate(model, state.prompt, args.max_new_tokens)
    state.extra["warmup_tokens"] = warm
    mark("warmup")
    httpd = Server((args.host, args.port), make_handler(state))
    state.extra["port"] = httpd.server_address[1]
    info(**{**backend.describe(), **backend.engine_info(), "port": httpd.server_address[1]})
    mark("ready")
    httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
