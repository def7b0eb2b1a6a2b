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


@pytest.mark.parametrize("text", [0.5, "0.5", 0.33])
def test_a_bare_number_below_one_is_refused_with_the_two_ways_to_say_it(text):
    """torch.compile's activation_memory_budget=0.5 means a half; here a bare number is bytes, so one below
    1 is refused, saying how to write a share and a size."""
    with pytest.raises(ValueError, match=r"write '(50|33)%'.*give its unit"):
        parse_budget(text, unconstrained_peak=1000)


def test_a_share_above_the_whole_peak_warns_and_keeps_its_bytes():
    with pytest.warns(UserWarning, match="above the unconstrained peak"):
        assert parse_budget("150%", unconstrained_peak=1000) == 1500



@pytest.mark.parametrize("text", ["50%act", "50% activations", "50 %act"])
def test_a_share_of_activation_memory_is_of_the_peak_above_the_floor(text):
    assert parse_budget(text, unconstrained_peak=1000, floor=200) == 600
    with pytest.raises(ValueError, match="known once the model is traced"):
        parse_budget(text, unconstrained_peak=1000)


def test_solve_takes_a_share_of_activation_memory_and_inspect_shows_it(tmp_path, capsys):
    import torch

    import monet
    from monet.cli import main
    from monet.models import MLP

    torch.manual_seed(0)
    schedule = monet.solve(MLP(64, 256, 8), (2048, 64), "80%act", cost_model="analytic", time_limit=5)
    traced = monet.profile(MLP(64, 256, 8), (2048, 64), cost_model="analytic").problem
    floor, peak = traced.floor, schedule.predicted.unconstrained_peak
    assert schedule.budget == floor + int(0.8 * (peak - floor))
    assert schedule.predicted.peak <= schedule.budget
    assert schedule.predicted.floor == floor
    share = (schedule.predicted.peak - floor) / (peak - floor)
    assert schedule.predicted.activation_share == pytest.approx(share) and share <= 0.8
    assert main(["inspect", str(schedule.save(tmp_path / "s.json"))]) == 0
    shown = capsys.readouterr().out
    assert "activation memory" in shown and f"{share:.0%} of keeping everything's" in shown
