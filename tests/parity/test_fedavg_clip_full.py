"""FedAvg on a fully fine-tuned CLIP (FACMIC Table 2 / FAA-CLIP Tables III-IX baseline), one round.

Specification (FACMIC/FAA-CLIP code, FedAVG baseline): every client copies the global CLIP, trains both
encoders and CLIP's temperature with Adam on the B x B image-text contrastive loss - row j's positive is
the prompt of sample j's class, other samples' prompts (same-class duplicates included) are negatives,
both directions averaged, logits scaled by exp(logit_scale) - and the server replaces every weight by
the client-size-weighted mean.
"""

import copy

import torch
import torch.nn.functional as F

from .harness import (assert_close, client_batches, drive, image_federation, initial_server, paper_run,
                      seed_client, train_sizes)


def contrastive(clip, tokens, x, y):
    image = F.normalize(clip.encode_image(x).float(), dim=-1)
    text = F.normalize(clip.encode_text(tokens[y]).float(), dim=-1)   # one prompt per sample
    logits = clip.logit_scale.exp() * image @ text.t()
    target = torch.arange(len(y))
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))


def reference_round(run, fed, start, tokens):
    opt = run["train"]["optimizer"]
    states = []
    for client in fed.clients:
        model = copy.deepcopy(start).train()
        adam = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=opt["lr"],
                                betas=tuple(opt["betas"]), eps=opt["eps"], weight_decay=opt["weight_decay"])
        seed_client(run, 0, client)
        for batch in client_batches(run, client, 0):
            loss = contrastive(model, tokens, batch["x"], batch["y"])
            adam.zero_grad()
            loss.backward()
            adam.step()
        states.append(model.state_dict())
    w = torch.tensor(train_sizes(fed), dtype=torch.float64)
    w = w / w.sum()
    return {k: sum(wi * s[k].double() for wi, s in zip(w, states)) for k in states[0] if states[0][k].is_floating_point()}


def test_fedavg_full_clip_round_matches_the_specification(tmp_path):
    run = paper_run("facmic", "fedavg", train={"rounds": 1, "local": {"steps": 2}, "batch_size": 4})
    fed = image_federation(size=64, classes=4, sizes=(6, 8, 10), class_names=["glioma", "meningioma", "none", "pituitary"])
    start = initial_server(run, fed)
    driven = drive(run, fed, tmp_path)
    tokens = driven.method.family.tokens
    expected = reference_round(run, fed, start, tokens)
    assert_close(driven.method.server.state_dict(), expected, "server after one round")
