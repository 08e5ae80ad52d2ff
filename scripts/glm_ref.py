#!/usr/bin/python3
"""glm_ref.py - an independent float64 forward pass for GLM checkpoints, to test wick against.

    scripts/glm_ref.py MODEL_DIR --tokens 1,2,3 [--all-positions]
    scripts/glm_ref.py MODEL_DIR --tokens 1,2,3 --mtp [--chain K] [--from Q]

Prints what `wick logits` prints: {"vocab": V, "positions": [...], "logits": [[...], ...]}
for the last position or, with --all-positions, every one. With --mtp it prints the MTP
layer's logits instead, {"vocab": V, "positions": [q, ...], "logits": [[...], ...],
"chain": [[[...] x (K-1)], ...]}, for rows q = Q..T-2 (row q predicts token q + 2): "logits"
the MTP logits of row q, "chain" the logits of K-1 greedy drafts chained from row q (see
mtp()). Needs only numpy (Debian's python3-numpy, importable from /usr/bin/python3).

Written from the published model code, not from wick's engine (see
../shared/reference/glm.md for every fact and its source):
  - GlmMoeDsaForCausalLM (GLM-5): transformers `glm_moe_dsa` (modular, which inherits
    DeepSeek-V3.2 and DeepSeek-V3 modules): MLA in its explicit, non-absorbed form; the DSA
    lightning indexer with exact top-k; the sigmoid noaux_tc MoE with shared experts.
  - Glm4MoeForCausalLM (GLM-4.5/4.6/4.7): transformers `glm4_moe`: GQA with q/k/v bias,
    optional per-head qk RMSNorm, partial half-split RoPE, the same MoE.
Everything is computed in float64 from the weights as stored: BF16/F16/F32 exactly, FP8
e4m3fn through a 256-entry table, multiplied by its 128x128 block `_scale_inv`.

Choices where implementations disagree (glm.md flags these; the current transformers code wins):
  - RoPE: interleaved pairs (2i, 2i+1) for both the MLA rope slice and the indexer
    (rope_interleave / indexer_rope_interleave, transformers' current modular). transformers
    de-interleaves before a half-split rotation; that permutes q and k alike, so every dot
    product, and therefore the output, is the same as rotating the pairs in place.
  - q_a_layernorm / kv_a_layernorm use eps 1e-6: transformers builds them without passing
    rms_norm_eps (vLLM/SGLang pass 1e-5). Every other RMSNorm uses rms_norm_eps.
  - The indexer uses ReLU and the (rope 64 | nope 64) split of the current modular.
  - Router: the group step fills dropped experts' choice scores with 0.0, as transformers
    does (the DeepSeek reference uses -inf; the two agree whenever choice scores are positive).
  - Indexer top-k ties go to the lower position (torch.topk leaves ties unspecified).
The MTP layer (num_nextn_predict_layers; layer index L = num_hidden_layers) takes no part in the
main logits; --mtp runs it as vLLM's DeepSeek / GLM-4 MoE MTP does (glm.md 3.6):
  - row q (q = 0..T-2, at position q) gets eh_proj(concat[enorm(embed(t_{q+1})), hnorm(h_q)]),
    h_q the main hidden state after model.norm; the embedding of row 0 is zeroed, as vLLM masks
    position 0. Then a full decoder layer (GLM-5: MLA with its own indexer, which selects for
    itself; MoE feed-forward), causal over the MTP rows; shared_head.norm; the main lm_head.
    The layer's own embed_tokens and shared_head.head are not read.
  - a chained draft row c from row q takes the argmax d_c of the previous row's logits (lowest
    id on ties) and that row's MTP hidden state (before shared_head.norm), at position q + c,
    attending over real MTP rows 0..q and the chained rows before it.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

# ---- safetensors ------------------------------------------------------------------------------


def e4m3_table():
    """float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; S.1111.111 is NaN."""
    t = np.empty(256, dtype=np.float64)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        exp, man = (b >> 3) & 0xF, b & 7
        if exp == 15 and man == 7:
            t[b] = math.nan
        elif exp == 0:
            t[b] = sign * man * 2.0 ** -9  # subnormal: man/8 * 2^(1-7)
        else:
            t[b] = sign * (1 + man / 8.0) * 2.0 ** (exp - 7)
    return t


E4M3 = e4m3_table()


class Weights:
    """Tensors by name across model.safetensors or the shards of model.safetensors.index.json."""

    def __init__(self, d):
        index = os.path.join(d, "model.safetensors.index.json")
        if os.path.exists(index):
            files = sorted(set(json.load(open(index))["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        self.where = {}
        for f in files:
            path = os.path.join(d, f)
            with open(path, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            for name, info in header.items():
                if name != "__metadata__":
                    self.where[name] = (path, 8 + n, info)
        self.cache = {}

    def has(self, name):
        return name in self.where

    def raw(self, name):
        path, base, info = self.where[name]
        b, e = info["data_offsets"]
        with open(path, "rb") as fh:
            fh.seek(base + b)
            buf = fh.read(e - b)
        dt, shape = info["dtype"], info["shape"]
        if dt == "F32":
            a = np.frombuffer(buf, dtype="<f4").astype(np.float64)
        elif dt == "F16":
            a = np.frombuffer(buf, dtype="<f2").astype(np.float64)
        elif dt == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            a = a.astype(np.float64)
        elif dt == "F8_E4M3":
            a = E4M3[np.frombuffer(buf, dtype=np.uint8)]
        else:
            raise SystemExit(f"glm_ref: {name}: dtype {dt} is not handled")
        return a.reshape(shape), dt

    def get(self, name):
        """The tensor as float64; an FP8 weight is multiplied by its 128x128 block scales."""
        if name in self.cache:
            return self.cache[name]
        if name not in self.where:
            raise SystemExit(f"glm_ref: tensor {name} is missing")
        a, dt = self.raw(name)
        if dt == "F8_E4M3":
            s, _ = self.raw(name + "_scale_inv")
            rows, cols = a.shape
            if s.shape != ((rows + 127) // 128, (cols + 127) // 128):
                raise SystemExit(f"glm_ref: {name}_scale_inv has shape {s.shape}")
            full = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[:rows, :cols]
            a = a * full
        self.cache[name] = a
        return a


# ---- building blocks --------------------------------------------------------------------------


def rms_norm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def layer_norm(x, w, b, eps):
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def inv_freq(dim, theta):
    """Default RoPE frequencies: theta^(-2i/dim), i = 0..dim/2-1."""
    return 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def rope_interleaved(x, pos, freq):
    """Rotates pairs (2i, 2i+1) by pos*freq[i]. x: [T, ..., dim]."""
    ang = pos[:, None] * freq[None, :]  # [T, dim/2]
    shape = (len(pos),) + (1,) * (x.ndim - 2) + (len(freq),)
    c, s = np.cos(ang).reshape(shape), np.sin(ang).reshape(shape)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def rope_half(x, pos, freq):
    """Half-split (NeoX) rotation: pairs (i, i + dim/2). x: [T, ..., dim]."""
    ang = pos[:, None] * freq[None, :]
    shape = (len(pos),) + (1,) * (x.ndim - 2) + (len(freq),)
    c, s = np.cos(ang).reshape(shape), np.sin(ang).reshape(shape)
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def softmax_masked(scores, allowed):
    """Softmax over the last axis, keys where allowed is False get probability 0."""
    s = np.where(allowed, scores, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    e = np.where(allowed, np.exp(s - m), 0.0)
    return e / np.sum(e, axis=-1, keepdims=True)


def mlp(W, pre, x):
    g = x @ W.get(pre + ".gate_proj.weight").T
    u = x @ W.get(pre + ".up_proj.weight").T
    return (silu(g) * u) @ W.get(pre + ".down_proj.weight").T


# ---- MoE (both families; transformers DeepseekV3TopkRouter / Glm4MoeTopkRouter) ----------------


def route(cfg, logits, bias):
    """One token's router: returns (expert ids, gate weights). logits: [E]."""
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    ng, tg = cfg.get("n_group", 1) or 1, cfg.get("topk_group", 1) or 1
    scores = sigmoid(logits)
    choice = scores + bias  # the bias only chooses; the gate values come from `scores`
    per = E // ng
    groups = choice.reshape(ng, per)
    gscore = np.sort(groups, axis=1)[:, -2:].sum(axis=1)  # sum of each group's top 2
    keep = np.argsort(-gscore, kind="stable")[:tg]
    mask = np.zeros(ng, dtype=bool)
    mask[keep] = True
    choice = np.where(np.repeat(mask, per), choice, 0.0)  # transformers fills with 0.0
    idx = np.argsort(-choice, kind="stable")[:k]
    w = scores[idx]
    if cfg.get("norm_topk_prob", True):
        w = w / (w.sum() + 1e-20)
    return idx, w * cfg["routed_scaling_factor"]


def moe(cfg, W, pre, x):
    gate = W.get(pre + ".gate.weight")
    bias = W.get(pre + ".gate.e_score_correction_bias")
    shared = mlp(W, pre + ".shared_experts", x)
    out = np.zeros_like(x)
    logits = x @ gate.T
    for t in range(x.shape[0]):
        idx, w = route(cfg, logits[t], bias)
        for e, g in zip(idx, w):
            out[t] += g * mlp(W, f"{pre}.experts.{e}", x[t : t + 1])[0]
    return out + shared


def is_moe_layer(cfg, i):
    types = cfg.get("mlp_layer_types")
    if types:
        return types[i] == "sparse"
    return i >= cfg.get("first_k_dense_replace", 0)


# ---- GLM-5: MLA + DSA ----------------------------------------------------------------------


def rope_theta(cfg):
    rp = cfg.get("rope_parameters") or {}
    rs = cfg.get("rope_scaling") or {}
    kind = rp.get("rope_type", rs.get("rope_type", rs.get("type", "default")))
    if kind != "default":
        raise SystemExit(f"glm_ref: rope_type {kind} is not handled")
    return float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def indexer_types(cfg):
    """Per layer "full" (runs its indexer) or "shared" (reuses the previous top-k), as the
    transformers config derives it; GLM-5 has none of these keys, so every layer is full."""
    if cfg.get("indexer_types"):
        return cfg["indexer_types"]
    pat = cfg.get("index_topk_pattern")
    if pat is not None:
        return [{"F": "full", "S": "shared"}[c] for c in pat] if isinstance(pat, str) else pat
    freq = max(cfg.get("index_topk_freq", 1), 1)
    off = cfg.get("index_skip_topk_offset", 2)
    return ["full" if max(i - off + 1, 0) % freq == 0 else "shared"
            for i in range(cfg["num_hidden_layers"])]


def dsa_select(cfg, W, pre, h, qc, pos, freq):
    """The lightning indexer: a [T, T] bool matrix, True where query s attends key t."""
    T = h.shape[0]
    nh, hd, rope = cfg["index_n_heads"], cfg["index_head_dim"], cfg["qk_rope_head_dim"]
    q = (qc @ W.get(pre + ".wq_b.weight").T).reshape(T, nh, hd)
    k = layer_norm(h @ W.get(pre + ".wk.weight").T, W.get(pre + ".k_norm.weight"),
                   W.get(pre + ".k_norm.bias"), 1e-6)  # [T, hd]
    rot = rope_interleaved if cfg.get("indexer_rope_interleave", True) else rope_half
    q = np.concatenate([rot(q[..., :rope], pos, freq), q[..., rope:]], axis=-1)
    k = np.concatenate([rot(k[:, :rope], pos, freq), k[:, rope:]], axis=-1)
    w = (h @ W.get(pre + ".weights_proj.weight").T) * nh ** -0.5  # [T, nh]
    s = np.maximum(np.einsum("shd,td->sht", q, k) * hd ** -0.5, 0.0)  # ReLU
    score = np.einsum("sh,sht->st", w, s)
    topk = min(cfg["index_topk"], T)
    sel = np.zeros((T, T), dtype=bool)
    for i in range(T):
        # exact top-k among causal keys; ties go to the lower position (stable sort)
        order = np.argsort(-score[i, : i + 1], kind="stable")[:topk]
        sel[i, order] = True
    return sel


def glm5_attention(cfg, W, i, h, pos, freq, shared, prev_sel):
    pre = f"model.layers.{i}.self_attn"
    T = h.shape[0]
    nh = cfg["num_attention_heads"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kvr = cfg["kv_lora_rank"]
    if cfg.get("q_lora_rank") is None:
        raise SystemExit("glm_ref: q_lora_rank null (a plain q_proj) is not handled")
    qc = rms_norm(h @ W.get(pre + ".q_a_proj.weight").T, W.get(pre + ".q_a_layernorm.weight"), 1e-6)
    q = (qc @ W.get(pre + ".q_b_proj.weight").T).reshape(T, nh, nope + rope)
    q_nope, q_pe = q[..., :nope], q[..., nope:]
    kva = h @ W.get(pre + ".kv_a_proj_with_mqa.weight").T
    ckv = rms_norm(kva[:, :kvr], W.get(pre + ".kv_a_layernorm.weight"), 1e-6)
    k_pe = kva[:, kvr:]  # one rope key shared by all heads
    kv = (ckv @ W.get(pre + ".kv_b_proj.weight").T).reshape(T, nh, nope + vd)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    rot = rope_interleaved if cfg.get("rope_interleave", True) else rope_half
    q_pe = rot(q_pe, pos, freq)
    k_pe = rot(k_pe, pos, freq)

    if shared:
        if prev_sel is None:
            raise SystemExit(f"glm_ref: layer {i} shares the top-k of no earlier layer")
        sel = prev_sel
    else:
        sel = dsa_select(cfg, W, pre + ".indexer", h, qc, pos, freq)
    allowed = np.tril(np.ones((T, T), dtype=bool)) & sel

    scale = (nope + rope) ** -0.5
    sc = (np.einsum("shd,thd->hst", q_nope, k_nope) + np.einsum("shd,td->hst", q_pe, k_pe)) * scale
    p = softmax_masked(sc, allowed[None])
    o = np.einsum("hst,thd->shd", p, v).reshape(T, nh * vd)
    return o @ W.get(pre + ".o_proj.weight").T, sel


# ---- GLM-4.5: GQA ---------------------------------------------------------------------------


def glm4_attention(cfg, W, i, h, pos, freq):
    pre = f"model.layers.{i}.self_attn"
    T = h.shape[0]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
    eps = cfg["rms_norm_eps"]

    def proj(n, heads):
        y = h @ W.get(f"{pre}.{n}_proj.weight").T
        if W.has(f"{pre}.{n}_proj.bias"):
            y = y + W.get(f"{pre}.{n}_proj.bias")
        return y.reshape(T, heads, hd)

    q, k, v = proj("q", nh), proj("k", nkv), proj("v", nkv)
    if cfg.get("use_qk_norm", False):  # per head, before RoPE
        q = rms_norm(q, W.get(pre + ".q_norm.weight"), eps)
        k = rms_norm(k, W.get(pre + ".k_norm.weight"), eps)
    rd = len(freq) * 2
    q = np.concatenate([rope_half(q[..., :rd], pos, freq), q[..., rd:]], axis=-1)
    k = np.concatenate([rope_half(k[..., :rd], pos, freq), k[..., rd:]], axis=-1)
    rep = nh // nkv
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)  # head j uses kv head j // rep
    sc = np.einsum("shd,thd->hst", q, k) * hd ** -0.5
    p = softmax_masked(sc, np.tril(np.ones((T, T), dtype=bool))[None])
    o = np.einsum("hst,thd->shd", p, v).reshape(T, nh * hd)
    return o @ W.get(pre + ".o_proj.weight").T


# ---- the model --------------------------------------------------------------------------------


def check_config(cfg):
    if cfg.get("scoring_func", "sigmoid") != "sigmoid":
        raise SystemExit(f"glm_ref: scoring_func {cfg['scoring_func']} is not handled")
    if cfg.get("topk_method", "noaux_tc") != "noaux_tc":
        raise SystemExit(f"glm_ref: topk_method {cfg['topk_method']} is not handled")
    if cfg.get("moe_layer_freq", 1) != 1:
        raise SystemExit("glm_ref: moe_layer_freq other than 1 is not handled")
    if cfg.get("hidden_act", "silu") != "silu":
        raise SystemExit(f"glm_ref: hidden_act {cfg['hidden_act']} is not handled")
    if cfg.get("tie_word_embeddings", False):
        raise SystemExit("glm_ref: tied embeddings are not GLM")


def load(d):
    """The config, the weights and what every layer needs: (cfg, arch, W, freq, itypes)."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    arch = (cfg.get("architectures") or [None])[0]
    if arch not in ("GlmMoeDsaForCausalLM", "Glm4MoeForCausalLM"):
        raise SystemExit(f"glm_ref: architecture {arch} is not GLM-5 or GLM-4.5")
    check_config(cfg)
    W = Weights(d)
    theta = rope_theta(cfg)
    itypes = None
    if arch == "GlmMoeDsaForCausalLM":
        freq = inv_freq(cfg["qk_rope_head_dim"], theta)
        itypes = indexer_types(cfg)
    else:
        hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        freq = inv_freq(int(hd * cfg.get("partial_rotary_factor", 1.0)), theta)
    return cfg, arch, W, freq, itypes


def decoder_layer(m, i, x, pos, shared, prev_sel, sparse):
    """Layer i on the residual stream x [T, H] at positions pos: returns (x, the DSA selection
    (GLM-5; None for GLM-4.5)). shared: reuse prev_sel instead of running layer i's indexer;
    sparse: an MoE feed-forward rather than a dense MLP."""
    cfg, arch, W, freq, _ = m
    eps = cfg["rms_norm_eps"]
    pre = f"model.layers.{i}"
    h = rms_norm(x, W.get(pre + ".input_layernorm.weight"), eps)
    sel = None
    if arch == "GlmMoeDsaForCausalLM":
        a, sel = glm5_attention(cfg, W, i, h, pos, freq, shared, prev_sel)
    else:
        a = glm4_attention(cfg, W, i, h, pos, freq)
    x = x + a
    h = rms_norm(x, W.get(pre + ".post_attention_layernorm.weight"), eps)
    x = x + (moe(cfg, W, pre + ".mlp", h) if sparse else mlp(W, pre + ".mlp", h))
    return x, sel


def check_tokens(cfg, tokens):
    if any(t < 0 or t >= cfg["vocab_size"] for t in tokens):
        raise SystemExit("glm_ref: a token id is outside the vocabulary")


def hidden(m, tokens):
    """The main model's final hidden states, after model.norm: [T, H]."""
    cfg, arch, W, _, itypes = m
    check_tokens(cfg, tokens)
    pos = np.arange(len(tokens), dtype=np.float64)
    x = W.get("model.embed_tokens.weight")[tokens]
    sel = None
    for i in range(cfg["num_hidden_layers"]):
        shared = itypes is not None and itypes[i] == "shared"
        x, sel = decoder_layer(m, i, x, pos, shared, sel, is_moe_layer(cfg, i))
    return rms_norm(x, W.get("model.norm.weight"), cfg["rms_norm_eps"])


def forward(d, tokens):
    m = load(d)
    cfg, W = m[0], m[2]
    return cfg["vocab_size"], hidden(m, tokens) @ W.get("lm_head.weight").T


# ---- the MTP layer (DeepSeek-V3 layout, as vLLM's DeepSeek / GLM-4 MoE MTP runs it) -----------


def mtp_layer_index(m):
    """The MTP layer's index L = num_hidden_layers, after checking it is there."""
    cfg, W = m[0], m[2]
    if not cfg.get("num_nextn_predict_layers"):
        raise SystemExit("glm_ref: the config has no MTP layer "
                         "(num_nextn_predict_layers is 0 or missing)")
    L = cfg["num_hidden_layers"]
    for n in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
              "input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate.weight"):
        if not W.has(f"model.layers.{L}.{n}"):
            raise SystemExit(f"glm_ref: the MTP tensor model.layers.{L}.{n} is missing")
    return L


def mtp_input(m, L, emb, h):
    """eh_proj(concat[enorm(emb), hnorm(h)]): the embedding half first. emb, h: [R, H]."""
    cfg, W = m[0], m[2]
    eps, pre = cfg["rms_norm_eps"], f"model.layers.{L}"
    e = rms_norm(emb, W.get(pre + ".enorm.weight"), eps)
    g = rms_norm(h, W.get(pre + ".hnorm.weight"), eps)
    return np.concatenate([e, g], axis=-1) @ W.get(pre + ".eh_proj.weight").T


def mtp_layer(m, L, x):
    """The MTP decoder layer over rows x [R, H] at positions 0..R-1, causal: a full (indexer)
    layer that selects for itself, with an MoE feed-forward. Returns the hidden states [R, H]."""
    pos = np.arange(x.shape[0], dtype=np.float64)
    return decoder_layer(m, L, x, pos, False, None, True)[0]


def mtp_logits(m, L, h):
    """shared_head.norm, then the main model's lm_head (shared_head.head is not read)."""
    cfg, W = m[0], m[2]
    h = rms_norm(h, W.get(f"model.layers.{L}.shared_head.norm.weight"), cfg["rms_norm_eps"])
    return h @ W.get("lm_head.weight").T


def mtp(d, tokens, chain=1, start=0):
    """MTP logits for rows q = start..T-2 (each predicts token q + 2) and, per row, the logits of
    chain - 1 greedy chained drafts. Returns (V, rows, [R, V] logits, [R][chain-1] logits)."""
    m = load(d)
    cfg, W = m[0], m[2]
    L = mtp_layer_index(m)
    T = len(tokens)
    if T < 2:
        raise SystemExit("glm_ref: --mtp needs at least 2 tokens")
    if chain < 1:
        raise SystemExit("glm_ref: --chain must be at least 1")
    if not 0 <= start <= T - 2:
        raise SystemExit(f"glm_ref: --from must be in 0..{T - 2}")
    h = hidden(m, tokens)
    E = W.get("model.embed_tokens.weight")
    emb = E[tokens[1:]]  # row q sees token q + 1 (a copy: fancy indexing)
    emb[0] = 0.0  # vLLM zeroes the embedding at position 0
    x = mtp_input(m, L, emb, h[:-1])  # [T-1, H]
    mh = mtp_layer(m, L, x)
    logits = mtp_logits(m, L, mh)
    rows, chains = list(range(start, T - 1)), []
    for q in rows:
        # chained rows continue the MTP sequence after real row q; the layer is causal, so
        # rerunning it over rows 0..q plus the chained rows reproduces rows 0..q exactly
        xs, prev, lg, out = x[: q + 1], mh[q], logits[q], []
        for _ in range(chain - 1):
            draft = int(np.argmax(lg))  # first maximum: the lowest id on ties
            xs = np.concatenate([xs, mtp_input(m, L, E[[draft]], prev[None])])
            prev = mtp_layer(m, L, xs)[-1]
            lg = mtp_logits(m, L, prev[None])[0]
            out.append(lg)
        chains.append(out)
    return cfg["vocab_size"], rows, logits[start:], chains


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--all-positions", action="store_true")
    ap.add_argument("--mtp", action="store_true", help="the MTP layer's logits instead")
    ap.add_argument("--chain", type=int, default=None,
                    help="with --mtp: K drafts per row (default 1)")
    ap.add_argument("--from", dest="start", type=int, default=None,
                    help="with --mtp: the first row Q (default 0)")
    a = ap.parse_args()
    try:
        tokens = [int(t) for t in a.tokens.split(",")]
    except ValueError:
        ap.error("--tokens wants comma-separated integers")
    if a.mtp:
        if a.all_positions:
            ap.error("--mtp prints every row from --from on; --all-positions does not apply")
        chain = 1 if a.chain is None else a.chain
        V, rows, logits, chains = mtp(a.model, tokens, chain, a.start or 0)
        out = {"vocab": V, "positions": rows,
               "logits": [[float(v) for v in r] for r in logits],
               "chain": [[[float(v) for v in r] for r in c] for c in chains]}
    else:
        if a.chain is not None or a.start is not None:
            ap.error("--chain and --from need --mtp")
        V, logits = forward(a.model, tokens)
        rows = range(len(tokens)) if a.all_positions else [len(tokens) - 1]
        out = {"vocab": V, "positions": list(rows),
               "logits": [[float(v) for v in logits[r]] for r in rows]}
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
