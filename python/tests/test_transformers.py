"""flashattn as a transformers attention implementation, on tiny random-weight models
(no downloads): logits, gradients and greedy generation against the same model with
attn_implementation="sdpa". Skipped when transformers is not installed.

Accuracy rule (the project's): the flashattn model's error against a float64 copy
of the model must stay within 2x the sdpa model's error in the same precision, plus
a small atol. Runs on CPU; with FLASHATTN_TEST_DEVICE=cuda on the GPU (bfloat16).
"""

import copy
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flashattn.integrations.transformers as fa_hf  # noqa: E402

DEVICE = os.environ.get("FLASHATTN_TEST_DEVICE", "cpu")
DTYPE = torch.float32 if DEVICE == "cpu" else torch.bfloat16
ATOL = 1e-5 if DTYPE == torch.float32 else 1e-2
VOCAB = 101


def tiny_config(kind="llama"):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2, attention_dropout=0.0)
    if kind == "mistral":  # a sliding window shorter than the sequences
        return transformers.MistralConfig(sliding_window=5, **common)
    if kind == "gpt_oss":  # attention sinks; a sliding and a full layer; a small MoE
        if not hasattr(transformers, "GptOssConfig"):
            pytest.skip("this transformers has no gpt-oss")
        config = transformers.GptOssConfig(
            head_dim=16, sliding_window=5, num_local_experts=4, num_experts_per_tok=2,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common)
        if hasattr(config, "_experts_implementation"):
            config._experts_implementation = "eager"  # the grouped one has no float64
        return config
    return transformers.LlamaConfig(**common)


def models(kind="llama"):
    """(flashattn model, baseline model, float64 baseline model), one set of random
    weights; the baseline is transformers' sdpa implementation (eager for gpt-oss, whose
    sinks only eager attention applies)."""
    torch.manual_seed(0)
    config = tiny_config(kind)
    cls = transformers.AutoModelForCausalLM
    baseline = "eager" if kind == "gpt_oss" else "sdpa"
    base = cls.from_config(config, attn_implementation=baseline)
    with torch.no_grad():  # weights large enough that attention is not near-uniform
        for p in base.parameters():
            p.normal_(0.0, 0.2)

    def copy_as(impl, dtype):
        m = copy.deepcopy(base).to(device=DEVICE, dtype=dtype)
        m.set_attn_implementation(impl)
        return m

    return copy_as(fa_hf.NAME, DTYPE), copy_as(baseline, DTYPE), copy_as(baseline, torch.float64)


def batch(lengths, seqlen, seed=1, left_pad=True):
    """input_ids (batch, seqlen) of random tokens and the padding mask for `lengths`."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (len(lengths), seqlen), generator=g)
    mask = torch.zeros(len(lengths), seqlen, dtype=torch.long)
    for i, n in enumerate(lengths):
        if left_pad:
            mask[i, seqlen - n:] = 1
        else:
            mask[i, :n] = 1
    ids[mask == 0] = 0
    return ids.to(DEVICE), mask.to(DEVICE)


def assert_within_rule(got, base, ref, what):
    """|got - ref| <= 2 |base - ref| + atol elementwise in the max norm, no NaN."""
    got, base, ref = got.double(), base.double(), ref.double()
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    err = (got - ref).abs().max().item()
    base_err = (base - ref).abs().max().item()
    assert err <= 2 * base_err + ATOL * max(1.0, ref.abs().max().item()), (
        f"{what}: flashattn error {err:.3e} vs sdpa error {base_err:.3e}")


def test_registered():
    assert fa_hf.NAME in transformers.AttentionInterface._global_mapping
    fa, _, _ = models()
    assert fa.config._attn_implementation == fa_hf.NAME


@pytest.mark.parametrize("kind", ["llama", "mistral"])
@pytest.mark.parametrize("lengths", [[23], [23, 7, 1], [23, 16]])
def test_forward_logits(kind, lengths):
    fa, sdpa, ref = models(kind)
    ids, mask = batch(lengths, seqlen=23)
    with torch.no_grad():
        out = [m(input_ids=ids, attention_mask=mask).logits for m in (fa, sdpa, ref)]
    real = mask.bool()  # padded positions have no defined output
    assert_within_rule(out[0][real], out[1][real], out[2][real], f"{kind} logits {lengths}")


def test_right_padding():
    fa, sdpa, ref = models()
    ids, mask = batch([13, 5], seqlen=13, left_pad=False)
    with torch.no_grad():
        out = [m(input_ids=ids, attention_mask=mask).logits for m in (fa, sdpa, ref)]
    real = mask.bool()
    assert_within_rule(out[0][real], out[1][real], out[2][real], "right-padded logits")


def loss_and_grads(model, ids, mask):
    model.zero_grad()
    # A token is a label only if the token before it is real too: the first real
    # token of a left-padded row would be predicted from a padded position, whose
    # output no implementation defines.
    scored = mask.bool()
    scored[:, 1:] &= mask[:, :-1].bool()
    labels = ids.masked_fill(~scored, -100)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kind,lengths", [("llama", [19, 19]), ("llama", [19, 11, 4]),
                                          ("gpt_oss", [19, 19]), ("gpt_oss", [19, 11, 4])])
def test_backward_gradients(kind, lengths):
    """Loss and every parameter's gradient (gpt-oss: the sinks' too) within the rule."""
    fa, sdpa, ref = models(kind)
    for m in (fa, sdpa, ref):
        m.train()
    ids, mask = batch(lengths, seqlen=19)
    (lf, gf), (ls, gs), (lr, gr) = (loss_and_grads(m, ids, mask) for m in (fa, sdpa, ref))
    assert_within_rule(lf, ls, lr, "loss")
    assert gf.keys() == gr.keys()
    for name in gr:
        assert gf[name].abs().max() > 0 or gr[name].abs().max() == 0, name
        assert_within_rule(gf[name], gs[name], gr[name], f"grad {name}")


def assert_same_greedy_run(runs, prompt_len):
    """Generated tokens equal the float64 model's, and their logits pass the rule,
    up to the first step where a model picks another token; that is allowed only
    where the float64 logits of the two tokens are within the rule's tolerance (a
    near tie that rounding may break either way), and ends the comparison (the
    sequences differ from there on)."""
    fa, sdpa, ref = runs
    for step, (lf, ls, lr) in enumerate(zip(fa.logits, sdpa.logits, ref.logits)):
        assert_within_rule(lf, ls, lr, f"logits of generated token {step}")
        col = prompt_len + step
        tokens = [r.sequences[:, col:col + 1] for r in runs]
        if all(torch.equal(t, tokens[2]) for t in tokens):
            continue
        tol = 2 * (ls.double() - lr.double()).abs().max() + ATOL * lr.abs().max()
        for t in tokens[:2]:
            gap = lr.double().gather(1, tokens[2]) - lr.double().gather(1, t)
            assert (gap <= tol).all(), f"token {step}: {t.tolist()} vs {tokens[2].tolist()}"
        return
    assert torch.equal(fa.sequences, ref.sequences)


@pytest.mark.parametrize("lengths", [[9], [9, 4, 6]])
def test_greedy_generation(lengths):
    fa, sdpa, ref = models()
    ids, mask = batch(lengths, seqlen=9)
    kw = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, min_new_tokens=12,
              output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        runs = [m.generate(ids, **kw) for m in (fa, sdpa, ref)]
    assert runs[0].sequences.shape == (len(lengths), 9 + 12)
    assert_same_greedy_run(runs, prompt_len=9)


def test_packed_sequences_match_separate_ones():
    """Two sequences packed in one row (position_ids restart at 0) give the logits
    of each sequence run alone."""
    fa, sdpa, ref = models()
    ids, _ = batch([17], seqlen=17)
    first, second = ids[:, :10], ids[:, 10:]
    position_ids = torch.cat([torch.arange(10), torch.arange(7)]).unsqueeze(0).to(DEVICE)

    def alone(m):
        return torch.cat([m(input_ids=first).logits, m(input_ids=second).logits], dim=1)

    with torch.no_grad():
        packed = fa(input_ids=ids, position_ids=position_ids).logits
        out_sdpa, out_ref = alone(sdpa), alone(ref)
    assert_within_rule(packed, out_sdpa, out_ref, "packed logits")


def test_gpt_oss_forward_logits_with_sinks():
    """gpt-oss's per-head sink logits (s_aux) go to the library's sinks=: logits within the
    rule against eager attention, padded batch included; sinks that matter (large) are set
    so the test fails if they were dropped."""
    fa, eager, ref = models("gpt_oss")
    for m in (fa, eager, ref):
        for layer in m.model.layers:
            layer.self_attn.sinks.data.copy_(torch.linspace(-1.0, 3.0, layer.self_attn.sinks.numel()))
    ids, mask = batch([23, 7], seqlen=23)
    with torch.no_grad():
        out = [m(input_ids=ids, attention_mask=mask).logits for m in (fa, eager, ref)]
        for layer in ref.model.layers:
            layer.self_attn.sinks.data.fill_(-1e4)
        no_sinks = ref(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    assert (no_sinks[real] - out[2][real]).abs().max() > 1e-2  # the sinks change the logits
    assert_within_rule(out[0][real], out[1][real], out[2][real], "gpt-oss logits")


def test_dropout_in_training():
    """attention_dropout in training is the library's dropout: a step is reproducible under
    torch.manual_seed and differs between seeds; the gradients are finite and nonzero;
    in eval mode (dropout 0) the logits are those of the model without dropout."""
    fa, sdpa, ref = models()
    ids, mask = batch([11, 6], seqlen=11)
    with torch.no_grad():
        plain = fa(input_ids=ids, attention_mask=mask).logits
    for layer in fa.model.layers:
        layer.self_attn.attention_dropout = 0.25
    fa.train()

    def step(seed):
        torch.manual_seed(seed)
        return loss_and_grads(fa, ids, mask)

    (l1, g1), (l2, g2), (l3, _) = step(5), step(5), step(6)
    assert torch.equal(l1, l2) and all(torch.equal(g1[n], g2[n]) for n in g1)
    assert not torch.equal(l1, l3)
    assert all(torch.isfinite(g).all() for g in g1.values())
    assert g1["model.layers.0.self_attn.q_proj.weight"].abs().max() > 0
    fa.eval()
    with torch.no_grad():
        assert torch.equal(fa(input_ids=ids, attention_mask=mask).logits, plain)
