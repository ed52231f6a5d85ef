"""The static engine of bench/server.py: a production engine's shape.

A hand-written Llama forward over the loaded weights (plain tensors from the
safetensors file, named as transformers names them), a KV-cache pool that
takes the GPU memory left as a serving engine's does, and decode steps replayed
from a CUDA graph captured at start. Imported by server.py's torch backend
only (this module imports torch).

The math is transformers' LlamaForCausalLM's (RMSNorm in float32, rotary
embeddings of the default kind, grouped-query attention, SiLU MLP, untied
lm_head); `server.py --self-test` checks it against transformers and the
graph's tokens against the same decode run eagerly.

The pool: one allocation, [layers, 2 (k, v), slots, kv_heads, max_seq_len,
head_dim] bf16, slots = how many max_seq_len sequences fit the budget. The
server is single-request: slot 0 is its static KV cache, the others are held
as an engine holds them. Slot 0 is zeroed at the start of every request, so
no answer depends on what the pool held before it (after a restore with the
pool marked as scratch, nothing did survive).
"""
import math
import time

import torch
import torch.nn.functional as F

MIB = 1 << 20
# The caching allocator gives a request of 10 MiB or more a segment of its own
# rounded to 2 MiB; the pool is padded to that, and to at least 20 MiB, so no
# other tensor ever shares its memory (which is marked scratch as a whole).
POOL_ROUND = 2 * MIB
POOL_MIN = 20 * MIB


def rms_norm(x, w, eps):
    """transformers' LlamaRMSNorm: in float32, the weight applied in the input's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rotate_half(x):
    d = x.shape[-1] // 2
    return torch.cat((-x[..., d:], x[..., :d]), dim=-1)


def rope_theta(cfg, default=10000.0):
    """The rotary base of a LlamaConfig: an attribute before transformers 5,
    in rope_parameters from it."""
    v = getattr(cfg, "rope_theta", None)
    if v is None:
        v = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
    return float(v if v is not None else default)


def _sdpa_decode_context():
    """Decode attention on the memory-efficient kernel (math as the fallback),
    chosen the same way eagerly and under capture; a no-op on a torch without
    torch.nn.attention."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    except ImportError:
        import contextlib
        return contextlib.nullcontext()


class StaticLlama:
    """A Llama decoder over a state dict of transformers' names.

    prefill(ids) runs eagerly over the prompt; decode_step() is one token at
    the position in self.pos, input self.tok, and leaves the greedy next token
    in self.tok (and its logits in self.logits) with self.pos one on: static
    shapes and no host synchronisation, so it can be captured."""

    def __init__(self, sd, preset, device, max_seq_len, theta, eps):
        self.dev = torch.device(device)
        p = preset
        self.h, self.n_layers = p["hidden_size"], p["num_hidden_layers"]
        self.heads, self.kvh = p["num_attention_heads"], p["num_key_value_heads"]
        self.hd = self.h // self.heads
        self.n_rep = self.heads // self.kvh
        self.vocab = p["vocab_size"]
        self.eps = eps
        self.S = max_seq_len
        self.embed = sd["model.embed_tokens.weight"]
        self.norm = sd["model.norm.weight"]
        self.lm_head = sd["lm_head.weight"]
        self.layers = []
        for i in range(self.n_layers):
            pre = f"model.layers.{i}."
            self.layers.append({
                "q": sd[pre + "self_attn.q_proj.weight"], "k": sd[pre + "self_attn.k_proj.weight"],
                "v": sd[pre + "self_attn.v_proj.weight"], "o": sd[pre + "self_attn.o_proj.weight"],
                "gate": sd[pre + "mlp.gate_proj.weight"], "up": sd[pre + "mlp.up_proj.weight"],
                "down": sd[pre + "mlp.down_proj.weight"], "ln1": sd[pre + "input_layernorm.weight"],
                "ln2": sd[pre + "post_attention_layernorm.weight"]})
        dt = self.embed.dtype
        with torch.no_grad():
            # transformers' default rotary embedding: float32 angles, cos/sin cast to the activations' dtype.
            inv_freq = 1.0 / (theta ** (torch.arange(0, self.hd, 2, dtype=torch.int64, device=self.dev).float()
                                        / self.hd))
            t = torch.arange(self.S, dtype=torch.float32, device=self.dev)
            emb = torch.cat([torch.outer(t, inv_freq)] * 2, dim=-1)
            self.cos, self.sin = emb.cos().to(dt), emb.sin().to(dt)   # [S, head_dim]
            self.positions = torch.arange(self.S, dtype=torch.long, device=self.dev)
            self.tok = torch.zeros(1, dtype=torch.long, device=self.dev)
            self.pos = torch.zeros(1, dtype=torch.long, device=self.dev)
            self.logits = torch.zeros(1, self.vocab, dtype=dt, device=self.dev)
        self.pool = None        # [layers, 2, slots, kv_heads, S, head_dim]
        self.pool_buf = None    # the allocation behind it (padded)
        self.graph = None

    # ---- the KV-cache pool

    def slot_bytes(self):
        return self.n_layers * 2 * self.kvh * self.S * self.hd * self.embed.element_size()

    def alloc_pool(self, slots):
        """The pool: one zeroed allocation for `slots` sequences of S tokens."""
        shape = (self.n_layers, 2, slots, self.kvh, self.S, self.hd)
        numel = math.prod(shape)
        esz = self.embed.element_size()
        padded = max(POOL_MIN, -(-numel * esz // POOL_ROUND) * POOL_ROUND)
        self.pool_buf = torch.zeros(padded // esz, dtype=self.embed.dtype, device=self.dev)
        self.pool = self.pool_buf[:numel].view(shape)
        return self.pool_buf

    def clear_slot(self):
        self.pool[:, :, 0].zero_()

    def kv(self, layer):
        """Layer's static K and V caches: [kv_heads, S, head_dim] each (slot 0)."""
        return self.pool[layer, 0, 0], self.pool[layer, 1, 0]

    # ---- the forward

    def _qkv(self, x, lw, cos, sin):
        T = x.shape[0]
        q = F.linear(x, lw["q"]).view(T, self.heads, self.hd).transpose(0, 1)   # [heads, T, hd]
        k = F.linear(x, lw["k"]).view(T, self.kvh, self.hd).transpose(0, 1)     # [kv_heads, T, hd]
        v = F.linear(x, lw["v"]).view(T, self.kvh, self.hd).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return q, k, v

    def _mlp_residual(self, x, lw):
        hs = rms_norm(x, lw["ln2"], self.eps)
        return x + F.linear(F.silu(F.linear(hs, lw["gate"])) * F.linear(hs, lw["up"]), lw["down"])

    def _logits(self, x):
        return F.linear(rms_norm(x, self.norm, self.eps), self.lm_head)

    @torch.no_grad()
    def prefill(self, ids):
        """The prompt (a LongTensor [T] on the device) from position 0: its K/V
        written to the cache, the last position's logits returned ([1, vocab])."""
        T = ids.shape[0]
        x = F.embedding(ids, self.embed)                     # [T, h]
        cos, sin = self.cos[:T], self.sin[:T]
        for i, lw in enumerate(self.layers):
            q, k, v = self._qkv(rms_norm(x, lw["ln1"], self.eps), lw, cos, sin)
            kc, vc = self.kv(i)
            kc[:, :T].copy_(k)
            vc[:, :T].copy_(v)
            kk = k.repeat_interleave(self.n_rep, dim=0)      # query head j reads kv head j // n_rep
            vv = v.repeat_interleave(self.n_rep, dim=0)
            a = F.scaled_dot_product_attention(q[None], kk[None], vv[None], is_causal=True)[0]
            x = x + F.linear(a.transpose(0, 1).reshape(T, self.h), lw["o"])
            x = self._mlp_residual(x, lw)
        return self._logits(x[-1:])

    @torch.no_grad()
    def decode_step(self):
        """One token: input self.tok at position self.pos; the next token (greedy)
        into self.tok, its logits into self.logits, self.pos one on."""
        x = F.embedding(self.tok, self.embed)               # [1, h]
        cos = self.cos.index_select(0, self.pos)            # [1, hd]
        sin = self.sin.index_select(0, self.pos)
        mask = (self.positions <= self.pos).view(1, 1, 1, self.S)   # True: attend
        with _sdpa_decode_context():
            for i, lw in enumerate(self.layers):
                q, k, v = self._qkv(rms_norm(x, lw["ln1"], self.eps), lw, cos, sin)
                kc, vc = self.kv(i)
                kc.index_copy_(1, self.pos, k)
                vc.index_copy_(1, self.pos, v)
                # The n_rep query heads sharing a kv head attend as n_rep queries of it.
                qg = q.reshape(self.kvh, self.n_rep, self.hd)
                a = F.scaled_dot_product_attention(qg[None], kc[None], vc[None], attn_mask=mask)[0]
                x = x + F.linear(a.reshape(1, self.h), lw["o"])
                x = self._mlp_residual(x, lw)
        logits = self._logits(x)
        self.logits.copy_(logits)
        self.tok.copy_(torch.argmax(logits, dim=-1))
        self.pos.add_(1)

    # ---- CUDA graph

    @torch.no_grad()
    def capture(self, warmup=3):
        """Captures decode_step as a CUDA graph, after warm-up steps on a side
        stream (cuBLAS handles and workspaces, the attention kernel's choice)."""
        self.clear_slot()
        self.tok.zero_()
        self.pos.zero_()
        cur = torch.cuda.current_stream(self.dev)
        side = torch.cuda.Stream(device=self.dev)
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            for _ in range(warmup):
                self.decode_step()
        cur.wait_stream(side)
        torch.cuda.synchronize(self.dev)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.decode_step()
        torch.cuda.synchronize(self.dev)
        self.graph = g

    # ---- generation

    @torch.no_grad()
    def generate(self, ids, n, on_token=None, use_graph=True, record=None):
        """n greedy tokens after the prompt ids (a list). use_graph=False runs
        the same decode eagerly; record, a list, gets each token's logits
        (float32, on the device)."""
        if len(ids) + n > self.S:
            raise ValueError(f"prompt ({len(ids)}) + max_new_tokens ({n}) exceeds max_seq_len {self.S}")
        if use_graph and self.graph is None:
            raise RuntimeError("no CUDA graph captured")
        self.clear_slot()
        logits = self.prefill(torch.tensor(ids, dtype=torch.long, device=self.dev))
        if record is not None:
            record.append(logits[0].float())
        self.tok.copy_(torch.argmax(logits, dim=-1))
        self.pos.fill_(len(ids))
        out = []
        for i in range(n):
            if i:
                if use_graph:
                    self.graph.replay()
                else:
                    self.decode_step()
                if record is not None:
                    record.append(self.logits[0].float())
            out.append(int(self.tok.item()))
            if on_token:
                on_token(out[-1])
        return out


def self_test_model(engine, model, ids, n, say):
    """The checks of `server.py --self-test` for one model (engine captured,
    model transformers' LlamaForCausalLM around the same weights). Returns
    {check: (ok, detail)}."""
    res = {}
    t = time.time()
    graph_tokens = engine.generate(ids, n)
    torch.cuda.synchronize()
    t_graph = time.time() - t
    rec = []
    t = time.time()
    eager_tokens = engine.generate(ids, n, use_graph=False, record=rec)
    torch.cuda.synchronize()
    t_eager = time.time() - t
    first = next((i for i, (a, b) in enumerate(zip(graph_tokens, eager_tokens)) if a != b), None)
    res["graph-vs-eager"] = (graph_tokens == eager_tokens,
                             f"{n} tokens, first difference at {first}; graph {t_graph * 1e3:.0f} ms, "
                             f"eager {t_eager * 1e3:.0f} ms\n  graph: {graph_tokens}\n  eager: {eager_tokens}")
    # The pool's contents must not matter (a restore with it marked scratch brings none back).
    engine.pool_buf.fill_(float("nan"))
    again = engine.generate(ids, n)
    res["nan-pool-repeat"] = (again == graph_tokens, "the pool filled with NaN, then the graph again: "
                              + ("same tokens" if again == graph_tokens else f"{again}"))
    # Against transformers: its forward over prompt + our tokens (teacher forcing),
    # position by position against our eager decode's logits.
    x = torch.tensor([ids + eager_tokens[:-1]], dtype=torch.long, device=engine.dev)
    with torch.no_grad():
        ref = model(input_ids=x).logits[0, len(ids) - 1:].float()   # [n, vocab]
    ours = torch.stack(rec)
    cos = F.cosine_similarity(ours, ref, dim=-1)
    top = ref.argmax(-1)
    agree = int((top.cpu() == torch.tensor(eager_tokens)).sum())
    tol = 0.2 * ref.std(dim=-1)
    near = ref.gather(1, torch.tensor(eager_tokens, device=ref.device)[:, None])[:, 0] >= ref.max(-1).values - tol
    ok = bool(cos.min() >= 0.98) and bool(near.all())
    res["vs-transformers"] = (ok, f"logits cosine min {float(cos.min()):.5f} mean {float(cos.mean()):.5f}; "
                              f"greedy token = transformers' argmax at {agree}/{n} positions, within "
                              f"0.2 std of its max at {int(near.sum())}/{n}; max |diff| "
                              f"{float((ours - ref).abs().max()):.4f} (logit std {float(ref.std()):.3f})")
    say(f"decode: graph {t_graph / max(1, n - 1) * 1e3:.2f} ms/token, eager {t_eager / max(1, n - 1) * 1e3:.2f} "
        "ms/token (with the prefill)")
    return res
