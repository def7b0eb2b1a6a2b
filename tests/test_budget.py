import pytest

from monet.budget import parse_budget


@pytest.mark.parametrize("text, expected", [
    ("4GiB", 4 << 30), ("4 GiB", 4 << 30), ("1.5G", int(1.5 * (1 << 30))), ("512MB", 512 * 10**6),
    ("512mib", 512 << 20), ("100", 100), (2048, 2048), ("60%", 600), ("12.5%", 125),
])
def test_sizes_and_percentages(text, expected):
    assert parse_budget(text, unconstrained_peak=1000) == expected


@pytest.mark.parametrize("text", ["", "lots", "4 parsecs", "-3GB", "0%", "0"])
def test_nonsense_is_refused_with_the_forms_that_work(text):
    with pytest.raises(ValueError, match="budget"):
        parse_budget(text, unconstrained_peak=1000)
