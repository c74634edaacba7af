"""FedDRA's inputs as the authors' (issue 31, item 4): the report sections by MIT-LCP's rules, the retrieval pool
under ``paper`` = MGCA's "valid" split (official validate + test), and A_I / A_T initialised as the Hugging Face
layers the code builds them from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from fedrepro.config import load_project
from fedrepro.data.datasets.chest import report_caption
from fedrepro.data.partition import make_split
from fedrepro.data.report_sections import report_sections

REPO = Path(__file__).resolve().parents[1]
TITLE = "                                 FINAL REPORT\n"


# --------------------------------------------------------------------------------------------
# report sections: MIT-LCP/mimic-cxr txt/section_parser.py (section_text, normalize_section_names) and
# txt/create_section_files.py (the last section of a name; hand-sectioned studies left out), as MGCA's
# mgca/preprocess/utils.py::extract_mimic_text runs them for FedDRA

def test_conclusion_and_findings_and_impression_count_as_the_impression():
    report = (TITLE + " EXAMINATION:  CHEST (PA AND LAT)\n \n INDICATION:  Cough.\n \n FINDINGS:  \n \n"
              " Heart size is normal.\n \n CONCLUSION:  No acute process.\n")
    sections = report_sections(report)
    assert sections["impression"] == "No acute process." and sections["findings"] == "Heart size is normal."
    assert sections["examination"] == "CHEST (PA AND LAT)" and sections["indication"] == "Cough."
    merged = TITLE + " INDICATION:  Fever.\n \n FINDINGS AND IMPRESSION:  Lungs are clear.\n"
    assert report_sections(merged)["impression"] == "Lungs are clear." and "findings" not in report_sections(merged)
    assert report_caption(merged) == "lungs are clear"


def test_misspelled_view_and_compound_headings_are_normalised():
    report = (TITLE + " PA AND LATERAL VIEWS OF THE CHEST:  The lungs are clear.\n \n IMPRESSON:  Normal chest.\n"
              " \n COMPARISONS:  None.\n \n RECENT HISTORY OF FALLS:  Falls.\n")
    sections = report_sections(report)
    # a heading naming a view is the findings; a misspelled impression, the plural comparison and a heading that
    # contains a main section's name are that section
    assert sections["findings"] == "The lungs are clear." and sections["impression"] == "Normal chest."
    assert sections["comparison"] == "None." and sections["history"] == "Falls."


def test_headings_need_their_indent_and_the_last_section_of_a_name_wins():
    # MIMIC-CXR indents every line by one space: "FINDINGS:" at a line's start without it is no heading
    assert "findings" not in report_sections("FINDINGS: Lungs clear.\nIMPRESSION: Normal.\n")
    assert report_caption("FINDINGS: Lungs clear.\nIMPRESSION: Normal.\n") == ""
    report = TITLE + " IMPRESSION:  First reading.\n \n ADDENDUM:  Seen.\n \n IMPRESSION:  Revised reading.\n"
    assert report_sections(report)["impression"] == "Revised reading."
    # an empty findings section is dropped (the impression of the same report stays)
    empty = TITLE + " FINDINGS:  \n \n IMPRESSION:  Stable chest.\n"
    assert "findings" not in report_sections(empty) and report_caption(empty) == "stable chest"


def test_the_search_for_the_next_heading_starts_after_the_line_a_section_starts_on():
    # "Left: ..." on the heading's own line is no heading (not indented); the next line's heading is found
    report = TITLE + " FINDINGS: Small effusion. RIGHT SIDE: clear.\n IMPRESSION: Effusion.\n"
    sections = report_sections(report)
    assert sections["findings"] == "Small effusion. RIGHT SIDE: clear." and sections["impression"] == "Effusion."


def test_a_report_without_impression_or_findings_has_a_last_paragraph_and_no_caption():
    report = TITLE + " INDICATION:  Pain.\n \n COMPARISON:  Prior.\n \n Lungs are clear.\n \n No effusion.\n"
    sections = report_sections(report)
    assert sections["comparison"] == "Prior." and sections["last_paragraph"] == "Lungs are clear.\n \n No effusion."
    # MGCA drops a study with neither impression nor findings (preprocess/mimic_cxr.py: dropna(how="all"))
    assert report_caption(report) == ""
    plain = "Heart size normal.\n"
    assert report_sections(plain) == {"full report": "Heart size normal."} and report_caption(plain) == ""


def test_studies_mit_lcp_sections_by_hand_have_no_text():
    # create_section_files.py's custom rules (e.g. s50525523: a slice; s50913680: another section's name): such a
    # study has no row in mimic_cxr_sectioned.csv, so MGCA / FedDRA have no impression or findings for it
    report = TITLE + " FINDINGS:  Lungs clear.\n \n IMPRESSION:  Normal chest.\n"
    assert report_caption(report, 50525523) == "" and report_caption(report, 50913680) == ""
    assert report_caption(report, 50414267) == "normal chest lungs clear"


def test_the_mimic_preparer_reads_the_sections_by_those_rules(tmp_path):
    """The real layout's reports (tests/real_layouts.py) through the preparer: a CONCLUSION is the impression."""
    import zipfile

    from fedrepro.data.prepare import prepare_dataset
    from fedrepro.registry import dataset
    from real_layouts import mimic_cxr_files

    mimic_cxr_files(tmp_path)
    base = tmp_path / "mimic_cxr"
    zipfile.ZipFile(base / "downloads" / "mimic-cxr-reports.zip").extractall(base)   # what the download unpacks
    frame = prepare_dataset(dataset("mimic_cxr"), tmp_path, tmp_path / "manifests")
    captions = dict(zip(frame["study_id"], frame["caption"]))
    assert captions[57375967] == "no acute cardiopulmonary process lungs are clear no acute process"
    assert captions[50414267] == "edema improved mild pulmonary edema no effusion"


# --------------------------------------------------------------------------------------------
# the retrieval pool: HKU-MedAI/MGCA mgca/preprocess/mimic_cxr.py::main merges MIMIC-CXR's validate and test rows
# into "valid", which FedDRA's DataModule.val_dataloader reads (BioMed-AI-Lab-U-Michgan/TMLR_FedDRA
# mgca/datasets/data_module.py, split="valid") and its retrieval scores

def mimic_manifest(n: int = 600, seed: int = 0) -> pd.DataFrame:
    gen = np.random.default_rng(seed)
    labels = gen.integers(0, 32, n)
    return pd.DataFrame({"path": [f"mimic_cxr/files/p10/p{i}/s{i}/{i}.jpg" for i in range(n)], "label": labels,
                         "class_name": [f"c{c}" for c in labels], "source": "",
                         "split": gen.choice(["train", "val", "test"], n, p=[0.8, 0.1, 0.1])})


@pytest.mark.parametrize("setting", ["mimic_a1", "mimic_a5", "mimic_a1_c2"])
def test_paper_retrieval_pool_is_mgca_valid_validate_and_test(setting):
    project = load_project([REPO / "config/config.yaml"], {"papers": ["feddra"], "protocols": ["clean", "paper"]}, root=REPO)
    manifest = mimic_manifest()
    official = manifest["split"].to_numpy()
    splits = {p: make_split(manifest, project.resolver.split_spec("feddra", setting, 0, p),
                            project.resolver.split_seed("feddra", setting, 0, p)) for p in ("clean", "paper")}
    for name, clean in splits["clean"].clients.items():
        paper = splits["paper"].clients[name]
        assert sorted(np.concatenate(list(paper.values()))) == sorted(np.concatenate(list(clean.values())))
        assert set(official[clean["val"]]) <= {"val"} and set(official[clean["test"]]) <= {"test"}
        assert paper["val"].tolist() == sorted(np.concatenate([clean["val"], clean["test"]]).tolist())  # file order
        assert len(paper["test"]) == 0 and paper["train"].tolist() == clean["train"].tolist()
    run = project.resolver.run_config(project.resolver.run_key("feddra", setting, "feddra_convirt", 0, "paper"))
    assert run["train"]["model"]["retrieval"]["split"] == "val"       # the pool the paper protocol reports


# --------------------------------------------------------------------------------------------
# A_I and A_T: BioMed-AI-Lab-U-Michgan/TMLR_FedDRA mgca/models/mgca/SLIA_module.py::FedDRA.__init__ builds them as
# ViTModel(ViTConfig).encoder.layer[-1] and BertModel(BertConfig).encoder.layer[-1]: Hugging Face's initialisation

def hf_layers(dim: int, heads: int):
    from transformers import BertConfig, BertModel, ViTConfig, ViTModel

    torch.manual_seed(0)
    text = BertModel(BertConfig(hidden_size=dim, num_attention_heads=heads, intermediate_size=4 * dim,
                                num_hidden_layers=1, vocab_size=64)).encoder.layer[-1]
    vit = ViTModel(ViTConfig(hidden_size=dim, num_attention_heads=heads, intermediate_size=4 * dim,
                             num_hidden_layers=1, image_size=8, patch_size=4))
    image = (vit.encoder.layer if hasattr(vit, "encoder") else vit.layers)[-1]    # transformers 4 / 5 names
    return text.eval(), image.eval()


def linear_weights(block) -> list[torch.Tensor]:
    return [block.attn.in_proj_weight, block.attn.out_proj.weight, block.mlp[0].weight, block.mlp[2].weight]


def test_alignment_modules_start_as_the_hugging_face_layers():
    import test_feddra

    m, _ = test_feddra.make_method(load_project([REPO / "config/config.yaml", REPO / "config/demo.yaml"],
                                                {"papers": ["feddra"]}, root=REPO), "feddra")
    text_hf, image_hf = hf_layers(32, 2)
    hf_std = float(torch.cat([text_hf.attention.self.query.weight.detach().flatten(),
                              text_hf.output.dense.weight.detach().flatten()]).std())
    for block in (m.work.image_align, m.work.text_align):
        assert block.norm1.eps == block.norm2.eps == 1e-12 == text_hf.output.LayerNorm.eps == image_hf.layernorm_before.eps
        weights = torch.cat([w.detach().flatten() for w in linear_weights(block)])
        assert abs(float(weights.std()) - 0.02) < 0.002 and abs(float(weights.mean())) < 0.002
        assert abs(float(weights.std()) - hf_std) < 0.003
        biases = [block.attn.in_proj_bias, block.attn.out_proj.bias, block.mlp[0].bias, block.mlp[2].bias]
        assert all(float(b.abs().max()) == 0.0 for b in biases)
        assert all(float((n.weight - 1).abs().max()) == 0.0 and float(n.bias.abs().max()) == 0.0
                   for n in (block.norm1, block.norm2))
    pytorch = test_feddra.make_method(load_project([REPO / "config/config.yaml", REPO / "config/demo.yaml"],
                                                   {"papers": ["feddra"]}, root=REPO), "feddra",
                                      train={"model": {"alignment": {"init": "pytorch"}}})[0]
    assert pytorch.work.image_align.norm1.eps == 1e-6 and float(pytorch.work.image_align.mlp[0].bias.abs().max()) > 0


def copy_bert_layer(block, layer) -> None:
    att = layer.attention
    with torch.no_grad():
        block.attn.in_proj_weight.copy_(torch.cat([att.self.query.weight, att.self.key.weight, att.self.value.weight]))
        block.attn.in_proj_bias.copy_(torch.cat([att.self.query.bias, att.self.key.bias, att.self.value.bias]))
        block.attn.out_proj.weight.copy_(att.output.dense.weight)
        block.attn.out_proj.bias.copy_(att.output.dense.bias)
        block.norm1.load_state_dict(att.output.LayerNorm.state_dict())
        block.mlp[0].load_state_dict(layer.intermediate.dense.state_dict())
        block.mlp[2].load_state_dict(layer.output.dense.state_dict())
        block.norm2.load_state_dict(layer.output.LayerNorm.state_dict())


def vit_parts(layer) -> tuple[list, nn.Module, nn.Module, nn.Module]:
    """([q, k, v], attention output, MLP in, MLP out) of a ViTLayer, under transformers 4's names or 5's."""
    att = layer.attention
    if hasattr(att, "q_proj"):
        return [att.q_proj, att.k_proj, att.v_proj], att.o_proj, layer.mlp.fc1, layer.mlp.fc2
    inner = att.attention
    return [inner.query, inner.key, inner.value], att.output.dense, layer.intermediate.dense, layer.output.dense


def copy_vit_layer(block, layer) -> None:
    qkv, out, fc1, fc2 = vit_parts(layer)
    with torch.no_grad():
        block.attn.in_proj_weight.copy_(torch.cat([m.weight for m in qkv]))
        block.attn.in_proj_bias.copy_(torch.cat([m.bias for m in qkv]))
        block.attn.out_proj.load_state_dict(out.state_dict())
        block.norm1.load_state_dict(layer.layernorm_before.state_dict())
        block.mlp[0].load_state_dict(fc1.state_dict())
        block.mlp[2].load_state_dict(fc2.state_dict())
        block.norm2.load_state_dict(layer.layernorm_after.state_dict())


def test_alignment_blocks_compute_what_the_hugging_face_layers_compute():
    """With the Hugging Face layer's weights, A_T is BertLayer (post-norm) and A_I is ViTLayer (pre-norm)."""
    from fedrepro.models.vlp import HF_LAYER_NORM_EPS, AlignmentBlock

    text_hf, image_hf = hf_layers(32, 2)
    x = torch.randn(3, 7, 32, generator=torch.Generator().manual_seed(1))
    out = lambda result: result[0] if isinstance(result, tuple) else result  # noqa: E731
    text = AlignmentBlock(32, 2, norm_first=False, eps=HF_LAYER_NORM_EPS, init="huggingface").eval()
    copy_bert_layer(text, text_hf)
    image = AlignmentBlock(32, 2, norm_first=True, eps=HF_LAYER_NORM_EPS, init="huggingface").eval()
    copy_vit_layer(image, image_hf)
    with torch.no_grad():
        assert torch.allclose(text(x)[0], out(text_hf(x)), atol=1e-5)
        assert torch.allclose(image(x)[0], out(image_hf(x)), atol=1e-5)
