"""DoRA as a method: trained on the slots' blocks of a tiny Llama-style model through PEFT, saved as PEFT's folder,
loaded back merged into a plain model, and known to every list of methods."""

from types import SimpleNamespace

import torch

from nkb_model.methods import METHODS, variants
from tests.nkb_model.test_architectures import tiny, tokens
from tests.nkb_model.test_causal import tokenizer  # noqa: F401  (a fixture)

LAYERS = ["decoder.-1"]


def test_dora_trains_its_magnitudes_and_directions_and_loads_back_merged_into_a_plain_model(tmp_path, tokenizer):
    from nkb_model.adapters import slot_parameters
    from nkb_model.checkpoint import load_model
    torch.manual_seed(0)
    model = tiny("llama")
    model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    before = model(input_ids=tokens()).logits.detach()
    made = variants()["dora"].trains(model, SimpleNamespace(layers=LAYERS, slots=None, seed=0, lora_rank=None), None)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    assert any("lora_magnitude_vector" in n for n in trained)  # DoRA's, which plain LoRA has not
    assert abs(made.count - slot_parameters(model, LAYERS, None)) < 0.05 * made.count
    assert torch.allclose(model(input_ids=tokens()).logits, before, atol=1e-5)  # B starts at zero: the base's
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    expected = model(input_ids=tokens()).logits.detach()
    made.save(model, tokenizer, tmp_path / "model", {"name": "base+dora", "kind": "dora",
                                                       "base_folder": "../base"})
    assert (tmp_path / "model" / "dora" / "adapter_config.json").exists()
    loaded = load_model(tmp_path / "model")[0]
    assert type(loaded).__name__ == "LlamaForCausalLM" and not any("lora_" in n for n, _ in loaded.named_parameters())
    assert torch.allclose(loaded(input_ids=tokens()).logits, expected, atol=1e-4)


def test_dora_is_a_variant_a_route_a_row_and_a_setting_of_its_own():
    from stages.configs import REPORT_ROWS, ROUTES, RUN_SETTINGS, InjectConfig, ReportConfig
    assert METHODS["dora"].row_key == "base+dora" and InjectConfig(variant="dora").model_name() == "base+dora"
    assert ROUTES["dora"].inject_settings == {"variant": "dora"} and RUN_SETTINGS["dora"][0] == "inject"
    assert "dora" in ReportConfig.model_fields and ReportConfig().dora is None  # off in old reports unless named
    assert [r.key for r in REPORT_ROWS].index("base+dora") == [r.key for r in REPORT_ROWS].index("base+lora-8") + 1
