"""SPEC section 3: the load-time estimate."""

import pytest

from channels_app.scheduling.load_estimates import estimate_load_seconds


@pytest.mark.parametrize(
    ("recent", "size_bytes", "mbps", "expected"),
    [
        ((), 0, 200, 15.0),
        ((), 2_000_000_000, 200, 2_000_000_000 / 200_000_000 + 15),
        ((), 4_000_000_000, 100, 55.0),
        ((12.0,), 4_000_000_000, 100, 12.0),
        ((10.0, 20.0), 4_000_000_000, 100, 15.0),
        # Only the last five successful loads count (newest first).
        ((1.0, 2.0, 3.0, 4.0, 5.0, 100.0, 100.0), 0, 200, 3.0),
    ],
    ids=["empty file", "2 GB at 200 MB/s", "4 GB at 100 MB/s", "one load", "two loads", "last five only"],
)
def test_estimate(recent, size_bytes, mbps, expected):
    assert estimate_load_seconds(recent_load_seconds=recent, size_bytes=size_bytes, disk_read_mbps=mbps) == (
        pytest.approx(expected)
    )
