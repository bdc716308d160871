import subprocess
import sys

from gguf.constants import GGML_QUANT_SIZES

from moetune.kinds import EngineKind
from moetune.model.quants import by_id, by_name, quant_types

MIB = 1 << 20


def test_every_type_id_in_either_table_has_a_size() -> None:
    for qt in GGML_QUANT_SIZES:
        assert int(qt) in quant_types()
    for t in quant_types().values():
        assert t.block_size > 0 and t.type_size > 0, t
        assert t.engines <= {EngineKind.MAINLINE, EngineKind.IK} and t.engines


def test_mainline_sizes_come_from_gguf() -> None:
    for qt, (block, size) in GGML_QUANT_SIZES.items():
        t = by_id(int(qt))
        assert (t.block_size, t.type_size, t.row_meta_bytes) == (block, size, 0)


def test_glm51_reference_expert_sizes() -> None:
    # ../shared/reference/000: GLM-5.1 IQ3_KS, per MoE layer gate/up 1225 MiB, down 1638 MiB
    gate = by_name("iq3_ks").tensor_bytes((6144, 2048, 256))
    down = by_name("iq4_ks").tensor_bytes((2048, 6144, 256))
    assert round(gate / MIB) == 1225
    assert round(down / MIB) == 1638


def test_ik_row_meta_counts_per_row() -> None:
    t = by_name("IQ4_KS")
    assert t.row_bytes(256) == 4 + 136
    assert t.tensor_bytes((256, 10)) == 10 * 140
    assert EngineKind.IK in t.engines and EngineKind.MAINLINE not in t.engines


def test_names_are_case_insensitive() -> None:
    assert by_name("q8_0") is by_name("Q8_0")


def test_reading_the_table_imports_neither_numpy_nor_the_gguf_package() -> None:
    code = (
        "import sys; from moetune.model.quants import by_id, gguf_constants; by_id(8)\n"
        "assert 'numpy' not in sys.modules and 'gguf' not in sys.modules, sorted(sys.modules)\n"
        "import gguf.constants\n"
        "assert {int(t): t.name for t in gguf.constants.GGMLQuantizationType} == "
        "{int(t): t.name for t in gguf_constants().GGMLQuantizationType}\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
