from flows.cli_docs import PATH, render


def test_docs_cli_md_is_generated_from_the_parser_and_the_config_models():
    assert PATH.read_text() == render(), "run `python -m flows.cli_docs`"


def test_it_holds_every_command_and_every_stage_setting():
    from stages.registry import STAGES
    text = render()
    for name, stage in STAGES.items():
        assert f"### `nkb run {name}`" in text
        assert all(field in text for field in stage.config.model_fields), name
    assert "usage: nkb server [-h] [--port PORT]" in text and "## `nkb export`" in text
