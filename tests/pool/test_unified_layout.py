"""Page size of the unified pool: one KV block (K and V, every layer, block_size tokens)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dataplane.pool.errors import LayoutError
from dataplane.pool.page_demand import FactorShape, adapter_page_demand
from dataplane.pool.unified import unified_layout


def test_llama_8b_page_is_one_kv_block() -> None:
    # Llama-3-8B: 32 layers, 8 KV heads of 128, bf16; 16-token blocks = 2 MiB
    layout = unified_layout(1000, num_layers=32, block_size=16, num_kv_heads=8, head_dim=128,
                            widest_row=14336, elem_bytes=2)
    assert layout.geometry.page_elems == 1_048_576 == layout.kv_block_elems
    assert layout.geometry.page_bytes == layout.kv_block_bytes == 2 * 1024 * 1024
    # one buffer: the pages plus one spare page (the KV cache's trash block)
    assert layout.device_bytes() == {"pages": 1000 << 21, "spare": 1 << 21}
    # a rank-16 all-linear adapter: 73 rows of 14336 fit a page, 256 of 4096, 1024 of 1024
    mods = {"q_proj": (4096, 4096), "k_proj": (1024, 4096), "v_proj": (1024, 4096),
            "o_proj": (4096, 4096), "gate_proj": (14336, 4096), "up_proj": (14336, 4096),
            "down_proj": (4096, 14336)}
    shapes = [FactorShape(layer, m, 16, d_in, d_out, 16, Fraction(2))
              for layer in range(32) for m, (d_out, d_in) in mods.items()]
    logical = sum(16 * (d_in + d_out) for d_out, d_in in mods.values()) * 32
    pages = adapter_page_demand(shapes, layout.geometry)
    assert logical / 1_048_576 <= pages <= logical / 1_048_576 * 1.01 + 1


def test_a_row_wider_than_a_kv_block_sets_the_page() -> None:
    layout = unified_layout(8, num_layers=1, block_size=1, num_kv_heads=1, head_dim=4,
                            widest_row=64, elem_bytes=4)
    assert (layout.kv_block_elems, layout.geometry.page_elems) == (8, 64)


@pytest.mark.parametrize("pages", [0, -1, True])
def test_bad_sizes_are_refused(pages: int) -> None:
    with pytest.raises(LayoutError):
        unified_layout(pages, num_layers=1, block_size=1, num_kv_heads=1, head_dim=1,
                       widest_row=1, elem_bytes=2)
