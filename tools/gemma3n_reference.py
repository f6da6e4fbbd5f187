#!/usr/bin/python3
"""gemma3n_reference.py: a pure-Python (float64, no NumPy) reference for
Gemma 3n text (gemma3n_text), written from transformers' modeling_gemma3n.py
(Gemma3nTextModel, Gemma3nTextDecoderLayer, Gemma3nTextAltUp,
Gemma3nTextLaurelBlock, Gemma3nTextMLP._gaussian_topk, Gemma3nTextAttention):
AltUp streams, LAuReL, per-layer inputs, KV sharing, activation sparsity,
final soft-cap. Files and the attention maths come from gemma4_reference.py.
Not run by CI.

    /usr/bin/python3 tools/gemma3n_reference.py check FIXTURE_DIR
        the max |logit diff| against a transformers fixture's logits.npy
    /usr/bin/python3 tools/gemma3n_reference.py make --out DIR [--seed N]
        a new random model of a shape the shared fixture does not have (see
        SHAPE), 40-token prompt and 40 new tokens, bf16 weights, float64 oracle
"""
import math
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemma4_reference import act, attend, cli, inv_freq, matvec, rms, rope, write_fixture  # noqa: E402


class Model:
    def __init__(self, cfg, w):
        c = self.c = cfg
        self.w, self.memo = w, {}
        self.L, self.Hd, self.eps = c["num_hidden_layers"], c["hidden_size"], c["rms_norm_eps"]
        self.types = c["layer_types"]
        n_shared = c.get("num_kv_shared_layers") or 0
        first = self.L - n_shared
        self.src = {il: max(j for j in range(first) if self.types[j] == self.types[il]) for il in range(first, self.L)}
        rp = c["rope_parameters"]
        self.inv = {t: inv_freq(rp[t], c["head_dim"]) for t in ("sliding_attention", "full_attention")}
        self.N, self.A = c["altup_num_inputs"], c["altup_active_idx"]
        sp = c["activation_sparsity_pattern"]
        self.mult = [statistics.NormalDist().inv_cdf(p) if p > 0 else None for p in sp]
        self.cache = [([], []) for _ in range(self.L)]

    def g(self, name):
        if name not in self.memo:
            shape, vals = self.w["model." + name]
            cols = shape[-1]
            self.memo[name] = vals if len(shape) == 1 else [vals[r * cols:(r + 1) * cols] for r in range(len(vals) // cols)]
        return self.memo[name]

    def modalities(self, p, x):
        r = [v / self.Hd for v in rms(x, self.g(p + "altup.router_norm.weight"), self.eps)]
        return [math.tanh(v) for v in matvec(self.g(p + "altup.modality_router.weight"), r)]

    def rescaled(self, v, target):
        mag = math.sqrt(max(sum(a * a for a in v) / len(v), 1e-5))
        return [a * target / mag for a in v]

    def step(self, pos, tok):
        c, g, eps, H, N, A = self.c, self.g, self.eps, self.Hd, self.N, self.A
        an, nh, D = c["hidden_activation"], c["num_attention_heads"], c["head_dim"]
        x0 = [v * math.sqrt(H) for v in g("embed_tokens.weight")[tok]]
        P = c["hidden_size_per_layer_input"]
        pe = g("embed_tokens_per_layer.weight")[tok if tok < c["vocab_size_per_layer_input"] else 0]
        proj = [v / math.sqrt(H) for v in matvec(g("per_layer_model_projection.weight"), x0)]
        pli = [[(a + b * math.sqrt(P)) / math.sqrt(2) for a, b in
                zip(rms(proj[il * P:(il + 1) * P], g("per_layer_projection_norm.weight"), eps), pe[il * P:(il + 1) * P])]
               for il in range(self.L)]
        target = math.sqrt(sum(v * v for v in x0) / H)
        s = [x0] + [self.rescaled(matvec(g(f"altup_projections.{i - 1}.weight"), x0), target) for i in range(1, N)]
        for il in range(self.L):
            p = f"layers.{il}."
            full = self.types[il] == "full_attention"
            inv = self.inv[self.types[il]]
            m = self.modalities(p, s[A])
            cf = matvec(g(p + "altup.prediction_coefs.weight"), m)
            pr = [[s[j][h] + sum(cf[j * N + i] * s[i][h] for i in range(N)) for h in range(H)] for j in range(N)]
            a = pr[A]
            n1 = rms(a, g(p + "input_layernorm.weight"), eps)
            lr = rms(matvec(g(p + "laurel.linear_right.weight"), matvec(g(p + "laurel.linear_left.weight"), n1)),
                     g(p + "laurel.post_laurel_norm.weight"), eps)
            lr = [u + v for u, v in zip(n1, lr)]
            q = matvec(g(p + "self_attn.q_proj.weight"), n1)
            qs = [rope(rms(q[i * D:(i + 1) * D], g(p + "self_attn.q_norm.weight"), eps), inv, pos) for i in range(nh)]
            if il in self.src:
                K, V = self.cache[self.src[il]]
            else:
                kv = c["num_key_value_heads"]
                k = matvec(g(p + "self_attn.k_proj.weight"), n1)
                v = matvec(g(p + "self_attn.v_proj.weight"), n1)
                self.cache[il][0].append([rope(rms(k[i * D:(i + 1) * D], g(p + "self_attn.k_norm.weight"), eps), inv, pos)
                                          for i in range(kv)])
                self.cache[il][1].append([rms(v[i * D:(i + 1) * D], None, eps) for i in range(kv)])
                K, V = self.cache[il]
            att = attend(qs, K, V, 0 if full else max(0, pos - c["sliding_window"] + 1), pos)
            at = rms(matvec(g(p + "self_attn.o_proj.weight"), att), g(p + "post_attention_layernorm.weight"), eps)
            h = [(u + v + w) / math.sqrt(2) for u, v, w in zip(a, at, lr)]
            n2 = rms(h, g(p + "pre_feedforward_layernorm.weight"), eps)
            gt = matvec(g(p + "mlp.gate_proj.weight"), n2)
            if self.mult[il] is not None:
                mean = sum(gt) / len(gt)
                std = math.sqrt(sum((v - mean) ** 2 for v in gt) / len(gt))
                gt = [max(v - (mean + std * self.mult[il]), 0.0) for v in gt]
            up = matvec(g(p + "mlp.up_proj.weight"), n2)
            f = matvec(g(p + "mlp.down_proj.weight"), [act(an, u) * v for u, v in zip(gt, up)])
            y = [u + v for u, v in zip(h, rms(f, g(p + "post_feedforward_layernorm.weight"), eps))]
            m = self.modalities(p, y)
            clip = c.get("altup_coef_clip")
            W = [[min(max(v, -clip), clip) if clip else v for v in row] for row in g(p + "altup.correction_coefs.weight")]
            cc = [v + 1.0 for v in matvec(W, m)]
            s = [[pr[j][hh] + (y[hh] - pr[A][hh]) * cc[j] for hh in range(H)] for j in range(N)]
            first = s[A]
            if c.get("altup_correct_scale", True):
                first = [u * v for u, v in zip(first, g(p + "altup.correct_output_scale"))]
            gg = [act(an, u) * v for u, v in zip(matvec(g(p + "per_layer_input_gate.weight"), first), pli[il])]
            d = rms(matvec(g(p + "per_layer_projection.weight"), gg), g(p + "post_per_layer_input_norm.weight"), eps)
            for j in range(1, N):
                s[j] = [u + v for u, v in zip(s[j], d)]
        target = math.sqrt(sum(v * v for v in s[0]) / H)
        acc = list(s[0])
        for i in range(1, N):
            u = self.rescaled(matvec(g(f"altup_unembed_projections.{i - 1}.weight"), s[i]), target)
            acc = [a + b for a, b in zip(acc, u)]
        hN = rms([v / N for v in acc], g("norm.weight"), eps)
        lg = matvec(g("embed_tokens.weight"), hN)
        cap = c.get("final_logit_softcapping")
        return [cap * math.tanh(v / cap) for v in lg] if cap else lg


# 3 AltUp streams with the middle one active, LAuReL rank 4, per-layer MLP widths and sparsities,
# 5 layers with 2 KV-shared, 6 heads over 2 KV heads, PLE 8, vocabulary 640
SHAPE = dict(hidden_size=96, num_hidden_layers=5, num_attention_heads=6, num_key_value_heads=2, head_dim=16,
             intermediate_size=[96, 64, 80, 64, 96], activation_sparsity_pattern=[0.95, 0.9, 0.0, 0.0, 0.0],
             altup_num_inputs=3, altup_active_idx=1, laurel_rank=4, hidden_size_per_layer_input=8, num_kv_shared_layers=2,
             layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"])


def make(out, seed):
    V = 640
    cfg = {"architectures": ["Gemma3nForCausalLM"], "model_type": "gemma3n_text", "altup_coef_clip": 120.0,
           "altup_correct_scale": True, "attention_bias": False, "final_logit_softcapping": 30.0,
           "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
           "sliding_window": 8, "tie_word_embeddings": True, "vocab_size": V, "vocab_size_per_layer_input": V,
           "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "dtype": "bfloat16",
           "rope_parameters": {"full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
                               "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}}
    cfg.update(SHAPE)
    rng = random.Random(seed)
    H, L, N, P, D = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["altup_num_inputs"], cfg["hidden_size_per_layer_input"], cfg["head_dim"]
    w = {}

    def mat(name, rows, cols, std=0.3):
        w[name] = ([rows, cols], [rng.gauss(0, std) for _ in range(rows * cols)])

    def vec(name, n, mean=1.0):
        w[name] = ([n], [mean + rng.gauss(0, 0.1) for _ in range(n)])

    mat("model.embed_tokens.weight", V, H, 0.1)
    vec("model.norm.weight", H)
    mat("model.embed_tokens_per_layer.weight", V, L * P)
    mat("model.per_layer_model_projection.weight", L * P, H, 0.1)
    vec("model.per_layer_projection_norm.weight", P)
    for i in range(N - 1):
        mat(f"model.altup_projections.{i}.weight", H, H, 0.1)
        mat(f"model.altup_unembed_projections.{i}.weight", H, H, 0.1)
    shared = Model(dict(cfg), {}).src
    for il in range(L):
        p = f"model.layers.{il}."
        nh, kv, F = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"][il]
        mat(p + "self_attn.q_proj.weight", nh * D, H, 0.1)
        vec(p + "self_attn.q_norm.weight", D)
        mat(p + "self_attn.o_proj.weight", H, nh * D, 0.1)
        if il not in shared:
            mat(p + "self_attn.k_proj.weight", kv * D, H, 0.1)
            mat(p + "self_attn.v_proj.weight", kv * D, H, 0.1)
            vec(p + "self_attn.k_norm.weight", D)
        mat(p + "mlp.gate_proj.weight", F, H, 0.1)
        mat(p + "mlp.up_proj.weight", F, H, 0.1)
        mat(p + "mlp.down_proj.weight", H, F, 0.1)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm",
                  "post_per_layer_input_norm", "laurel.post_laurel_norm", "altup.router_norm"):
            vec(p + n + ".weight", H)
        vec(p + "altup.correct_output_scale", H, 0.0)
        mat(p + "altup.correction_coefs.weight", N, N)
        mat(p + "altup.prediction_coefs.weight", N * N, N)
        mat(p + "altup.modality_router.weight", N, H)
        mat(p + "laurel.linear_left.weight", cfg["laurel_rank"], H, 0.1)
        mat(p + "laurel.linear_right.weight", H, cfg["laurel_rank"], 0.1)
        mat(p + "per_layer_input_gate.weight", P, H, 0.1)
        mat(p + "per_layer_projection.weight", H, P, 0.1)
    write_fixture(out, cfg, w, Model, "Gemma 3n of an unseen shape (see tools/gemma3n_reference.py SHAPE)",
                  f"tools/gemma3n_reference.py make --seed {seed}", rng)


def main():
    cli(Model, lambda o: make(o["--out"], int(o.get("--seed", 1))), __doc__)


if __name__ == "__main__":
    main()
