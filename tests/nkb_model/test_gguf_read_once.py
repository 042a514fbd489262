"""A GGUF file parsed once per load (`nkb_model.checkpoint.gguf_read_once`), on a small file written here."""

import gguf
import numpy as np
import pytest

from nkb_model.checkpoint import gguf_read_once


@pytest.fixture
def small_gguf(tmp_path):
    path = tmp_path / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("small")
    writer.add_token_list([f"t{i}" for i in range(50)])
    writer.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_inside_a_file_is_parsed_once_and_reads_as_it_does_outside(small_gguf):
    outside = gguf.GGUFReader(small_gguf)
    with gguf_read_once():
        first = gguf.GGUFReader(small_gguf)
        assert gguf.GGUFReader(str(small_gguf)) is first  # a str or a Path, the same file
        assert gguf.GGUFReader(small_gguf, "r") is first
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    assert first.fields["general.name"].contents() == outside.fields["general.name"].contents() == "small"
    assert len(first.fields["tokenizer.ggml.tokens"].contents()) == 50
    np.testing.assert_array_equal(first.tensors[0].data, outside.tensors[0].data)
    assert gguf.GGUFReader(small_gguf) is not first  # outside, each open parses again


def test_gguf_s_own_names_come_back_even_when_the_load_fails(small_gguf):
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with pytest.raises(RuntimeError, match="stopped"), gguf_read_once():
        gguf.GGUFReader(small_gguf)
        raise RuntimeError("stopped")
    assert gguf.GGUFReader is reader and gguf.get_tensor_name_map is name_map
