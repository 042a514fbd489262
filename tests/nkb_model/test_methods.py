"""The method records are the one list of methods: every list the stages and the CLI show is read from them."""

import pytest

from nkb_model.methods import METHODS, of_kind, variants


def test_every_method_has_its_row_its_report_setting_and_its_place():
    from stages.configs import REPORT_ROWS, ReportConfig
    rows = {r.key: r for r in REPORT_ROWS}
    for method in METHODS.values():
        row = rows[method.row_key]
        assert (row.label, row.field, row.later, row.named_only) == (method.label, method.field, method.later,
                                                                     method.named_only)
        assert method.field in ReportConfig.model_fields
    orders = [r.order for r in REPORT_ROWS]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)


def test_an_inject_method_is_a_variant_a_route_and_a_model_card_line(tmp_path):
    from stages.configs import ROUTES, RUN_SETTINGS, InjectConfig
    from stages.model_card import model_card
    from stages.registry import experiment_settings
    from warehouse import Warehouse
    wh = Warehouse(tmp_path / "wh")
    for method in of_kind("inject"):
        assert InjectConfig(variant=method.trained_by).variant == method.trained_by
        assert variants()[method.trained_by].trains is not None
        assert ROUTES[method.name].inject_settings["variant"] == method.trained_by
        assert dict(method.planned).items() <= ROUTES[method.name].inject_settings.items()
        if method.settings_key:
            assert RUN_SETTINGS[method.settings_key][0] == "inject" and method.settings_key in experiment_settings()
    for variant, method in variants().items():  # a model's info names the variant that trained it
        card = model_card(wh, {"name": f"base+{variant}", "kind": variant, "arch": "t5"}, [])
        assert method.summary in card
    assert set(variants()) == {m.trained_by for m in of_kind("inject")}


def test_each_saved_folder_has_one_loader_and_they_load_maps_adapters_slots_then_kformer():
    from nkb_model import checkpoint
    loaders = {m.folder: m.load for m in METHODS.values() if m.folder}
    assert all(loaders.values()) and checkpoint.INFO not in loaders
    slot_folders = {m.folder for m in METHODS.values() if m.slots}
    assert len(slot_folders) == 1
    order = [m.folder for m in sorted(METHODS.values(), key=lambda m: m.load_order) if m.folder]
    assert order.index("blocks") < order.index("lora") < order.index("nkb") < order.index("kformer")
    assert order.index("dora") < order.index("nkb")


def test_a_finetune_method_is_a_knowledge_mode_and_a_prompt_method_asks_documents():
    from stages.configs import FinetuneConfig
    for method in of_kind("finetune"):
        assert FinetuneConfig(knowledge=method.name).knowledge == method.name
    assert all(m.documents > 0 for m in of_kind("prompt"))
    with pytest.raises(ValueError, match="knowledge"):
        FinetuneConfig(knowledge="no-such-method")
