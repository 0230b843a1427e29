import torch
from oled_hf.modeling.commit import choose_tokens, commit_dinfer, commit_official, transfer_schedule

NEG = float("-inf")


def test_schedule_spreads_remainder_first():
    s = transfer_schedule(torch.tensor([10, 3, 0]), 4)
    assert s.tolist() == [[3, 3, 2, 2], [1, 1, 1, 0], [0, 0, 0, 0]]


def test_official_rule_threshold_else_top_n():
    conf = torch.tensor([[0.99, 0.2, 0.97, NEG], [0.5, 0.6, 0.1, 0.3]])
    out = commit_official(conf, torch.tensor([1, 2]), threshold=0.95)
    assert out.tolist() == [[True, False, True, False], [True, True, False, False]]
    # strict inequality: exactly the threshold is not "above"
    out = commit_official(torch.tensor([[0.95, 0.1]]), torch.tensor([1]), 0.95)
    assert out.tolist() == [[True, False]]  # falls back to top-1, which is the same position


def test_official_rule_never_commits_zero_or_unmasked():
    conf = torch.tensor([[NEG, 0.1, 0.2]])
    out = commit_official(conf, torch.tensor([0]), threshold=1.0)
    assert out.tolist() == [[False, False, True]]


def test_dinfer_rule_commits_best_and_ties():
    conf = torch.tensor([[0.3, 0.3, 0.1, NEG], [0.95, 0.9, 0.2, 0.91]])
    assert commit_dinfer(conf, 0.9).tolist() == [[True, True, False, False], [True, True, False, True]]


def test_mask_token_never_chosen():
    logits = torch.zeros(1, 3, 8)
    logits[..., 7] = 50.0  # the mask id dominates everywhere
    ids, p = choose_tokens(logits, mask_token_id=7)
    assert (ids != 7).all() and (p < 0.01).all()
    g = torch.Generator().manual_seed(0)
    ids, _ = choose_tokens(logits, 7, do_sample=True, temperature=1.0, generator=g)
    assert (ids != 7).all()


def test_sampling_is_seeded_and_filters():
    logits = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(1))
    a = choose_tokens(logits, 15, do_sample=True, temperature=0.8, top_k=3, generator=torch.Generator().manual_seed(5))
    b = choose_tokens(logits, 15, do_sample=True, temperature=0.8, top_k=3, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a[0], b[0])
    top3 = logits[..., :15].topk(3, -1).indices  # the mask id (15) is excluded before top-k
    assert (top3 == a[0].unsqueeze(-1)).any(-1).all()
    ids, p = choose_tokens(logits, 15, do_sample=True, top_p=1e-6, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ids, logits[..., :15].argmax(-1)) and torch.allclose(p, torch.ones_like(p))
