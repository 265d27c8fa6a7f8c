"""The end-to-end stage's capture of a target's launcher calls (autokernel/target/capture.py): the first call of each
launcher and a random tenth of the rest are kept with their own arguments and outputs, the draw is made only after
the call returned (the candidate cannot tell, while it runs, whether the call will be judged), and the baseline's job
counts without keeping. A kernel wrong only after many calls is judged with probability 1 - 0.9^k over k such calls:
these tests pin the rate and the order the claim rests on."""
import torch

from autokernel.target import capture


def _doubled(events: list | None = None):
    def launch(x):
        if events is not None:
            events.append("call")
        return x * 2
    return launch


def test_later_calls_are_kept_at_the_declared_rate_with_their_own_arguments():
    cap = capture.Capture({"launch": None})
    launch = cap.wrap("launch", _doubled())
    n = 2000
    for i in range(n):
        launch(torch.full((3,), float(i)))
    assert cap.calls == {"launch": n}
    kept = [int(before["x"][0]) for _, before, _ in cap.kept]
    assert kept[0] == 0  # the first call, always
    # 1 + Binomial(1999, 0.1): mean ~201, sd ~13.4; outside (120, 300) with probability below 1e-8
    assert 120 < len(kept) < 300, len(kept)
    assert max(kept) > n // 2  # late calls too, not only the first ones
    for name, before, after in cap.kept:  # each kept call's own arguments and outputs, to judge against the reference
        assert name == "launch" and torch.equal(after[0], before["x"] * 2)


def test_the_draw_is_made_after_the_call_returns():
    events: list[str] = []

    class Recorder:
        def random(self):
            events.append("draw")
            return 1.0  # never keep past the first

    cap = capture.Capture({"launch": None})
    cap._rng = Recorder()
    launch = cap.wrap("launch", _doubled(events))
    for _ in range(5):
        launch(torch.ones(2))
    assert events == ["call"] + ["call", "draw"] * 4, events  # the first call is kept without a draw
    assert len(cap.kept) == 1


def test_the_baseline_counts_and_keeps_nothing():
    cap = capture.Capture({"launch": None}, keep=False)
    launch = cap.wrap("launch", _doubled())
    for _ in range(50):
        launch(torch.ones(2))
    assert cap.calls == {"launch": 50} and cap.kept == []
