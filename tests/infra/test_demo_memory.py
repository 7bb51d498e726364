"""The demo reports its own peak resident memory (issue 20, item 7): `demo.peak_rss_gib`."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = ("from primekit.demo import peak_rss_gib\n"
          "before = peak_rss_gib()\n"
          # The block is sized past the peak inherited from the parent (Linux keeps a forked
          # child's ru_maxrss across exec: under pytest it starts at pytest's own peak).
          "block = b'\\x01' * (int(before * 2**30) + {mib} * 2**20)  # every page written\n"
          "print(before, peak_rss_gib())\n")


def _peaks(mib: int) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(mib=mib)], capture_output=True,
                         text=True, check=True, timeout=120).stdout.split()
    return float(out[0]), float(out[1])


def test_peak_rss_counts_an_allocation():
    # A fresh process: its peak after touching 512 MiB is at least 0.45 GiB above the peak
    # before (512 MiB = 0.5 GiB; a little slack for pages the allocator already held). The block
    # is filled with ones: a zero-filled one may be calloc'ed as untouched zero pages, which never
    # count as resident (CI saw the peak unchanged).
    before, after = _peaks(512)
    assert 0.01 < before < 4.0  # the interpreter with primekit.demo imported
    assert after - before >= 0.45
