"""Copying a DISK tensor to a device does not keep the file's pages in the process: loading a model's weights would
otherwise hold the file resident beside the copy (twice the memory)."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

from xgrad import Tensor


def _rss_file_mib() -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssFile in /proc/self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads RssFile from /proc")
def test_copying_a_file_tensor_leaves_its_pages_out_of_rss(tmp_path: pathlib.Path) -> None:
    data = np.random.default_rng(0).integers(0, 256, 48 << 20, dtype=np.uint8)
    path = tmp_path / "weights.bin"
    path.write_bytes(data.tobytes())
    before = _rss_file_mib()
    on_disk = Tensor(path)
    halves = [on_disk[: 24 << 20].to("CPU").realize(), on_disk[24 << 20 :].to("CPU").realize()]
    assert _rss_file_mib() - before < 8  # the 48 MiB read is not resident (a page or so at each end may be)
    np.testing.assert_array_equal(np.concatenate([h.numpy() for h in halves]), data)
    np.testing.assert_array_equal(on_disk[1000:1010].numpy(), data[1000:1010])  # read again: faulted back in
